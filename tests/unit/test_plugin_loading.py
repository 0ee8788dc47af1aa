"""Installed extensions (the ``attnclust.plugins`` entry-point group) are imported with attnclust, in name order;
one that fails to import is one line naming it, its module and the fix."""

from __future__ import annotations

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


def test_a_plugin_that_fails_to_import_is_one_line(monkeypatch, tmp_path):
    fake_group(monkeypatch, tmp_path, {"broken_plugin": "raise RuntimeError('needs a GPU library')\n"})
    with pytest.raises(plugins.PluginError, match=r"^attnclust plugin 'broken_plugin' \(broken_plugin\) failed to "
                                                 r"import \(RuntimeError: needs a GPU library\); fix it or "
                                                 r"uninstall the package that declares it$"):
        plugins.load_plugins()
    sys.modules.pop("broken_plugin", None)
