"""Installed extensions (the ``attnclust.plugins`` entry-point group) are imported with attnclust, in name order;
one that fails to import is one line naming it, its module and the fix. The job's model is assembled once they are
loaded, with what they registered; importing a module never changes it."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest

from attnclust import plugins


def fake_group(monkeypatch, tmp_path, modules: dict[str, str]) -> None:
    for name, code in modules.items():
        (tmp_path / f"{name}.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    entries = [metadata.EntryPoint(name=name, value=name, group=plugins.GROUP) for name in modules]
    monkeypatch.setattr(plugins.metadata, "entry_points",
                        lambda group: [e for e in entries if e.group == group])


def test_installed_plugins_are_imported_in_name_order(monkeypatch, tmp_path):
    fake_group(monkeypatch, tmp_path, {
        "zz_stat": "import order; order.seen.append('zz_stat')\n",
        "aa_stat": "import order; order.seen.append('aa_stat')\n",
        "order": "seen = []\n"})
    loaded = plugins.load_plugins()
    assert loaded == ["aa_stat", "order", "zz_stat"]
    assert sys.modules["order"].seen == ["aa_stat", "zz_stat"]
    for name in ("aa_stat", "order", "zz_stat"):
        sys.modules.pop(name, None)


def test_a_plugins_section_joins_the_job_when_the_plugins_are_loaded(monkeypatch, tmp_path):
    from attnclust.analysis.plugins import unregister_analysis
    from attnclust.config import JobConfig

    fake_group(monkeypatch, tmp_path, {"knob_plugin": (
        "from attnclust._settings import _int, _Model\n"
        "from attnclust.analysis.plugins import register_analysis\n\n\n"
        "class KnobConfig(_Model):\n"
        "    \"\"\"A knob.\n\n    Parameters\n    ----------\n    turns\n        How far.\n    \"\"\"\n\n"
        "    SECTION = 'knob'\n"
        "    turns: int = _int(3, 1)\n\n\n"
        "register_analysis('knob', settings=KnobConfig)(lambda ctx: None)\n")})
    try:
        assert plugins.load_plugins() == ["knob_plugin"]
        assert JobConfig().to_dict()["knob"] == {"turns": 3}
    finally:
        unregister_analysis("knob")
        plugins.assemble_job_config()
        sys.modules.pop("knob_plugin", None)
    assert "knob" not in JobConfig.SECTIONS


IMPORT_EVERYTHING = """
import importlib, pkgutil
import attnclust
from attnclust.config import FeaturizeConfig, JobConfig

def shape():
    return (tuple(JobConfig.SECTIONS), tuple(JobConfig.model_fields), tuple(FeaturizeConfig.model_fields),
            tuple(JobConfig().to_dict()))

before = shape()
for module in pkgutil.walk_packages(attnclust.__path__, "attnclust."):
    importlib.import_module(module.name)
for name in ("attnclust.analysis.syntax", "attnclust.analysis.probes", "attnclust.featurize.pooled"):
    importlib.reload(importlib.import_module(name))  # registers its analysis or featurizer again
assert shape() == before, (before, shape())
print("unchanged", len(before[0]))
"""


@pytest.mark.slow
def test_importing_any_module_leaves_the_job_as_assembled():
    """Every module of the package imported, and modules that register an analysis or a featurizer imported again:
    the job's sections and settings are those assembled when attnclust was imported."""
    proc = subprocess.run([sys.executable, "-c", IMPORT_EVERYTHING], capture_output=True, text=True, check=True)
    assert proc.stdout.startswith("unchanged")


def test_registering_changes_the_job_only_when_it_is_assembled():
    from attnclust._settings import _int, _Model
    from attnclust.analysis.plugins import register_analysis, unregister_analysis
    from attnclust.config import JobConfig

    class DialConfig(_Model):
        """A dial.

        Parameters
        ----------
        notches
            How many.
        """

        SECTION = "dial"
        notches: int = _int(5, 1)

    before = JobConfig().to_dict()
    register_analysis("dial", settings=DialConfig)(lambda ctx: None)
    try:
        assert JobConfig().to_dict() == before and "dial" not in JobConfig.SECTIONS
        plugins.assemble_job_config()
        assert JobConfig().to_dict() == {**before, "dial": {"notches": 5}}
    finally:
        unregister_analysis("dial")
        plugins.assemble_job_config()
    assert JobConfig().to_dict() == before


def test_a_plugin_that_fails_to_import_is_one_line(monkeypatch, tmp_path):
    fake_group(monkeypatch, tmp_path, {"broken_plugin": "raise RuntimeError('needs a GPU library')\n"})
    with pytest.raises(plugins.PluginError, match=r"^attnclust plugin 'broken_plugin' \(broken_plugin\) failed to "
                                                 r"import \(RuntimeError: needs a GPU library\); fix it or "
                                                 r"uninstall the package that declares it$"):
        plugins.load_plugins()
    sys.modules.pop("broken_plugin", None)
