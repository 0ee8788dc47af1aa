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
