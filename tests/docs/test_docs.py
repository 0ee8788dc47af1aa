"""The documentation site builds with warnings as errors, with the executed tutorial notebook, and its generated
references hold every job key and every registered statistic (marker ``docs``: one Sphinx build, plus the
notebook's execution, which is the session's ``executed_tutorial`` shared with the browser tests)."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import attnclust_docs as ad  # noqa: E402

pytestmark = pytest.mark.docs


def _text(page: Path) -> str:
    """The visible text of a built page (tags dropped, entities decoded, whitespace collapsed)."""
    raw = re.sub(r"<(script|style)\b.*?</\1>", " ", page.read_text(), flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", raw)))


@pytest.fixture(scope="module")
def site(tmp_path_factory, executed_tutorial) -> Path:
    """``sphinx-build -W --keep-going -b html docs OUT``; the HTML folder. The tutorial's outputs are the session's
    execution of it (``executed_tutorial``, shared with the browser tests), handed to myst-nb through a jupyter-cache
    that the build reads (``nb_execution_mode=cache``) instead of executing the notebook a second time."""
    pytest.importorskip("sphinx", reason="the docs extra is not installed: pip install -e '.[docs]'")
    from jupyter_cache import get_cache

    executed, _ = executed_tutorial
    base = tmp_path_factory.mktemp("site")
    cache = get_cache(str(base / "jupyter_cache"))
    cache.cache_notebook_file(str(executed), uri=str(ROOT / "docs" / "tutorial" / "atlas.ipynb"))
    out = base / "html"
    r = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-q",
                        "-D", "nb_execution_mode=cache", "-D", f"nb_execution_cache_path={base / 'jupyter_cache'}",
                        str(ROOT / "docs"), str(out)], capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert r.returncode == 0, f"sphinx-build failed:\n{r.stdout[-4000:]}\n{r.stderr[-8000:]}"
    # the build took the shared execution's outputs: myst-nb adds a notebook to the cache's project only to execute it
    assert cache.list_project_records() == [] and len(cache.list_cache_records()) == 1
    return out


def test_site_builds_with_warnings_as_errors_and_every_page_is_there(site):
    for page in ("index", "getting-started", "guide/index", "guide/notebook", "guide/patterns", "guide/heads",
                 "guide/importance", "guide/compare", "guide/scale", "guide/datasets", "guide/models",
                 "reference/jobs", "reference/outputs", "reference/store", "reference/cli", "reference/api", "methods",
                 "design", "extending", "tutorial/atlas"):
        assert (site / f"{page}.html").is_file(), page


def test_tutorial_notebook_was_executed(site):
    page = (site / "tutorial" / "atlas.html").read_text()
    assert page.count('class="cell_output') >= 10
    assert len(re.findall(r'<img[^>]+src="[^"]*\.png"', page)) >= 2  # the map and the change heatmap
    assert re.findall(r'<div class="attnclust-view" id="[^"]+" data-view="(\w+)"', page) == ["grid", "head", "map"]
    text = _text(site / "tutorial" / "atlas.html")
    assert "Traceback" not in text and "Error" not in text


def test_job_reference_page_lists_every_job_key(site):
    text = _text(site / "reference" / "jobs.html")
    for key in ad.job_keys():
        if not key.section:
            assert key.key in text, key.key


def test_output_reference_page_lists_every_statistic_and_head_analysis_column(site):
    text = _text(site / "reference" / "outputs.html")
    for name, _, description in ad.statistics():
        assert f"{name} " in text and description in text, name
    for _, columns, _, _ in ad.head_analyses():
        assert ", ".join(columns) in text
    for name, columns, _, description in ad.head_detectors():  # the decoder protocols' head detectors
        assert ", ".join(columns) in text and description in text, name
    for name, _, _, writes, _ in ad.extraction_analyses():
        assert f"{name} " in text and writes in text, name


def test_cli_reference_page_shows_every_command(site):
    text = _text(site / "reference" / "cli.html")
    for name, _, _ in ad.command_help():
        assert f"usage: attnclust {name}" in text, name


def test_api_reference_documents_the_public_names(site):
    import attnclust

    page = (site / "reference" / "api.html").read_text()
    for name in attnclust.__all__:
        assert f'id="attnclust.{name}"' in page, name
