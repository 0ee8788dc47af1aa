"""tests/unit mirrors the package: a test module of a subpackage's code lives in the folder of that subpackage's
name, and test modules share code through tests/helpers.py only, never by importing one another."""

from __future__ import annotations

import ast
from pathlib import Path

import attnclust

UNIT = Path(__file__).resolve().parent
PACKAGE = Path(attnclust.__file__).parent


def test_every_folder_of_tests_unit_is_a_subpackage_of_attnclust():
    folders = sorted(p.name for p in UNIT.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders and all((PACKAGE / name / "__init__.py").is_file() for name in folders), folders


def test_no_test_module_imports_another():
    modules = {p.stem for p in UNIT.parent.rglob("test_*.py")}
    found = []
    for path in UNIT.parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.relative_to(UNIT.parent)}: {n}" for n in names if n.split(".")[0] in modules]
    assert found == []


def _names_a_shared_run(path: Path, shared: tuple[str, ...]) -> bool:
    """Whether a function of ``path`` (a test or a fixture) takes one of the ``shared`` fixtures as a parameter."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if {a.arg for a in node.args.args + node.args.kwonlyargs} & set(shared):
                return True
    return False


def test_the_modules_that_read_a_shared_run_are_one_xdist_group_and_the_others_one_each(request):
    """The README's ``pytest -n 2 --dist loadgroup`` makes the demo run and the executed tutorial once only if every
    module whose tests take one of them runs in one worker (tests/conftest.py's scheduler groups)."""
    conftest = request.config.pluginmanager.get_plugin(str(UNIT.parent / "conftest.py"))
    root = UNIT.parents[1]
    groups = {}
    for path in sorted(UNIT.parent.rglob("test_*.py")):
        module = path.relative_to(root).as_posix()
        groups[module] = conftest.module_group(module)
        want = next((group for group, names in conftest.SHARED_GROUPS.items() if _names_a_shared_run(path, names)),
                    module)
        assert groups[module] == want, module
    shared = [m for m, g in groups.items() if g == "shared-runs"]
    assert "tests/integration/test_demo.py" in shared and "tests/docs/test_docs.py" in shared
    assert "tests/browser/test_explore_in_browser.py" in shared and "tests/unit/test_threads.py" not in shared
    tiny = [m for m, g in groups.items() if g == "tiny-reference"]
    assert tiny == ["tests/integration/test_pipeline.py", "tests/integration/test_storage_faults.py"]
