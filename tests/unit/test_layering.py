"""The package's layers are its folders: a module imports modules of its own folder or of a folder below it, never of
one above; the folders import each other round no circle, and neither do the modules.

:data:`LAYERS` is the order, bottom to top, one entry per top-level folder of ``attnclust/`` or module at its root
(``models`` is ``attnclust/models/``, ``errors`` is ``attnclust/errors.py``); ``__init__`` is the root package's
own ``attnclust/__init__.py``, the front door, at the top. No module has a place of its own: a module that belongs
to another layer moves to that layer's folder. ``docs/design.md`` draws the same order (checked here).

What counts as an import (read from the source with :mod:`ast`, nothing is imported):

- every ``import attnclust...``, ``from attnclust... import ...`` and relative ``from . import ...`` anywhere in a
  module: at the top, inside a function or a method, under ``try``, and under ``if TYPE_CHECKING:`` as well. A
  type-only import does not run, but the annotation still names the higher module's type: the design depends on it
  all the same, so it counts;
- ``from pkg import name`` imports the submodule ``pkg.name`` when there is one, else ``pkg`` itself (its
  ``__init__``);
- importing ``a.b.c`` also runs the ``__init__`` of ``a`` and ``a.b`` and what they import: the importer depends on
  them too. Among folders that is an edge to ``a``'s folder, whose ``__init__`` files are its own; among modules,
  an edge to each of those packages that is not one of the importer's own (its own are running already). The root
  package's ``__init__`` runs before any of them and is not counted (it is the top);
- ``importlib.import_module("...")`` with a string is not seen (attnclust uses it only for a packaged model's own
  package, never for one of its modules).

An import written inside a function is *lazy*: it is kept only where importing at the top would load a heavy or
optional third-party package that the command line's start-up, ``import attnclust`` or a Dask worker does not need
(``--help`` starts fast; matplotlib and jinja2 come with the report, scikit-learn with the CPU KMeans). Each says so on
its line or the line above (``# lazy: ...``), and they are fewer than :data:`MAX_LAZY_SHARE` of all the imports of
attnclust's own modules. Never to dodge a circle: there are none.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

import attnclust

PACKAGE_DIR = Path(attnclust.__file__).parent
DESIGN = PACKAGE_DIR.parent / "docs" / "design.md"

LAYERS: tuple[tuple[str, str], ...] = (
    ("errors", "AttnclustError and the few subclasses every layer raises"),
    ("safeio", "bounded reads, atomic writes, links refused"),
    ("cachedir", "folders in attnclust's cache, each written whole and checked against its manifest"),
    ("threads", "independent pieces of torch work in a pool of threads, each on one torch thread"),
    ("argtypes", "the command lines' argument types"),
    ("_settings", "how a setting is declared, and its errors told"),
    ("maps", "what a map is: tokens and token masks, per-map statistics, the profile, the stores' encodings"),
    ("featurize", "the featurizers and their registry (each declares its settings)"),
    ("data", "reading the user's data (SQuAD files, Hugging Face forms, text, the key-value task), tokenising it"),
    ("config", "the job: its sections, validated; assembled with the plugins' sections once they are loaded"),
    ("layout", "the names of a run's files, its lock and marker"),
    ("store", "the stores' contract: schema, the opened store, tables, integrity, the storage plan"),
    ("backend", "cpu | gpu | auto, and the estimators' factories (the only importer of cupy, cuml, dask-cuda)"),
    ("runtime", "the Dask cluster: start, environment, workers"),
    ("executors", "the one task runner of the stages and of the work inside them, on Dask or in-process"),
    ("models", "loading and running models; the model kinds, and a decoder's prompts and chat templates"),
    ("qa", "the task: answers from logits or generated text, the official metric, fine-tuning, calibration"),
    ("cluster", "fit, stability and k, placement"),
    ("analysis", "one module per analysis, each registered with its settings, outputs, fingerprint and section"),
    ("plugins", "installed extensions loaded, then the job's sections assembled"),
    ("report", "the HTML report: one module per section, its figures and views"),
    ("stages", "the pipeline's stages, in order, each a plan of blocks on an executor"),
    ("pipeline", "running a whole job"),
    ("api", "the Python API over a job and its outputs"),
    ("recompute", "a map recomputed exactly on demand"),
    ("explore", "the explorer's server"),
    ("export", "figures of a finished run"),
    ("compare", "two runs compared"),
    ("service", "the job service: submit, driver, TLS"),
    ("synthetic", "planted stores and runs for tests and benchmarks"),
    ("cli", "the command line: parse, load the job, call the library, map errors to exit codes"),
    ("__init__", "the package's public names (attnclust/__init__.py)"),
)
"""Bottom to top: each folder (or root module) with what it holds. A module imports from its own folder and the
folders listed before it."""

MAX_LAZY_SHARE = 0.15
"""The most imports of attnclust's own modules that may be written inside functions, as a share of all of them."""
LAZY_REASON = re.compile(r"#\s*lazy:\s*\S")


@dataclass(frozen=True)
class Import:
    """One import of a module of the package, where it is written."""

    source: str
    target: str
    path: Path
    line: int
    end_line: int
    lazy: bool


def module_names(package_dir: Path) -> dict[str, Path]:
    """Every module of the package in ``package_dir``, by dotted name (a package by its own name)."""
    root = package_dir.parent
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def folder_of(name: str) -> str:
    """The layer of module ``name``: its top-level folder or root module (``__init__`` for the root package)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def packages_run(target: str) -> list[str]:
    """The packages whose ``__init__`` importing ``target`` runs, the root's left out: ``a.b.c`` -> ``a.b``."""
    parts = target.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts))]


def imports_in(name: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    """The imports of modules in ``modules`` written anywhere in module ``name`` (rules: the module docstring)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top = name.split(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    in_function = {id(node) for func in ast.walk(tree) if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for node in ast.walk(func)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules else module
                       for alias in node.names]
        else:
            continue
        for target in dict.fromkeys(targets):
            if target.split(".")[0] != top:
                continue
            while target and target not in modules:  # `import pkg.sub.name`: the module that holds the name
                target = target.rpartition(".")[0]
            if target and target != name:
                found.append(Import(name, target, path, node.lineno, node.end_lineno, id(node) in in_function))
    return found


def all_imports(package_dir: Path) -> list[Import]:
    modules = module_names(package_dir)
    return [imp for name, path in modules.items() for imp in imports_in(name, path, modules)]


def layering_problems(package_dir: Path, layers=LAYERS) -> list[str]:
    """One line per folder in no layer and per import of a higher folder (itself, or a package ``__init__`` that
    importing it runs): ``path:line: source (folder) imports target (folder), a higher layer``."""
    order = {folder: i for i, (folder, _) in enumerate(layers)}
    modules = module_names(package_dir)
    root = package_dir.parent
    problems = [f"{path.relative_to(root)}: folder {folder_of(name)!r} is in no layer; give it one in LAYERS "
                f"(tests/unit/test_layering.py) and docs/design.md" for name, path in modules.items()
                if folder_of(name) not in order and name.count(".") <= 1]
    for imp in all_imports(package_dir):
        low = order.get(folder_of(imp.source))
        for target in (imp.target, *packages_run(imp.target)):
            high = order.get(folder_of(target))
            if low is not None and high is not None and high > low:
                problems.append(f"{imp.path.relative_to(root)}:{imp.line}: {imp.source} ({layers[low][0]}) imports "
                                f"{target} ({layers[high][0]}), a higher layer")
    return problems


def _circles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node, each sorted (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for start in graph:
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            nexts = graph.get(node, [])
            if i < len(nexts):
                work.append((node, i + 1))
                nxt = nexts[i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    circles.append(sorted(group))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return sorted(circles)


def import_circles(package_dir: Path) -> list[list[str]]:
    """Groups of modules that import each other, directly or round a circle, counting the package ``__init__``
    files an import runs that are not the importer's own."""
    graph: dict[str, set[str]] = {name: set() for name in module_names(package_dir)}
    for imp in all_imports(package_dir):
        graph[imp.source].add(imp.target)
        graph[imp.source].update(p for p in packages_run(imp.target)
                                 if p != imp.source and not imp.source.startswith(p + "."))
    return _circles({name: sorted(targets) for name, targets in graph.items()})


def folder_circles(package_dir: Path) -> list[list[str]]:
    """Groups of top-level folders (and root modules) that import each other, directly or round a circle."""
    graph: dict[str, set[str]] = {}
    for imp in all_imports(package_dir):
        source = folder_of(imp.source)
        graph.setdefault(source, set()).update(
            folder_of(t) for t in (imp.target, *packages_run(imp.target)) if folder_of(t) != source)
    return _circles({folder: sorted(targets) for folder, targets in graph.items()})


def lazy_problems(package_dir: Path, max_share: float = MAX_LAZY_SHARE) -> list[str]:
    """One line per import inside a function without its reason (``# lazy: ...`` on its line or the line above),
    and one when such imports are ``max_share`` of all or more."""
    root = package_dir.parent
    imports = all_imports(package_dir)
    lazy = [imp for imp in imports if imp.lazy]
    problems = []
    texts: dict[Path, list[str]] = {}
    for imp in lazy:
        lines = texts.setdefault(imp.path, imp.path.read_text(encoding="utf-8").splitlines())
        own = lines[imp.line - 1:imp.end_line]
        above = lines[imp.line - 2].strip() if imp.line > 1 else ""
        if not any(LAZY_REASON.search(text) for text in own) and not (above.startswith("#")
                                                                       and LAZY_REASON.search(above)):
            problems.append(f"{imp.path.relative_to(root)}:{imp.line}: {imp.source} imports {imp.target} inside a "
                            f"function without its reason; import it at the top, or say why not on its line "
                            f"(# lazy: the heavy third-party package it loads)")
    if imports and len(lazy) >= max_share * len(imports):
        problems.append(f"{len(lazy)} of the {len(imports)} imports of attnclust's modules are inside functions "
                        f"({len(lazy) / len(imports):.1%}); at most {max_share:.0%}: import at the top")
    return problems


def test_no_module_imports_a_higher_folder():
    problems = layering_problems(PACKAGE_DIR)
    assert not problems, "\n".join(problems)


def test_no_folders_import_each_other_round_a_circle():
    circles = folder_circles(PACKAGE_DIR)
    assert not circles, "folders importing each other: " + "; ".join(" <-> ".join(c) for c in circles)


def test_no_import_circles():
    circles = import_circles(PACKAGE_DIR)
    assert not circles, "modules importing each other: " + "; ".join(" <-> ".join(c) for c in circles)


def test_imports_inside_functions_are_few_and_each_says_why():
    problems = lazy_problems(PACKAGE_DIR)
    assert not problems, "\n".join(problems)


def test_every_layer_is_a_folder_or_root_module():
    folders = {folder_of(name) for name in module_names(PACKAGE_DIR)}
    stale = [folder for folder, _ in LAYERS if folder not in folders]
    assert not stale, f"LAYERS names folders that do not exist: {stale}"


def test_the_design_notes_draw_the_same_layers():
    """docs/design.md draws the layers top to bottom in a fenced block after the line ``<!-- layers -->``, one line
    per folder: its name (``models/``, ``errors.py``) and what it holds."""
    text = DESIGN.read_text(encoding="utf-8")
    block = text.split("<!-- layers -->", 1)[1].split("```", 2)[1]
    drawn = [line.split()[0] for line in block.splitlines()[1:] if line.strip()]
    names = [f"{folder}/" if (PACKAGE_DIR / folder).is_dir() else f"{folder}.py" for folder, _ in reversed(LAYERS)]
    assert drawn == names


# -- the checks themselves, on a tiny package written here --------------------------------------------------------

def _write_package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / "toy" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / "toy"


TOY_LAYERS = (("low", ""), ("sub", ""), ("high", ""), ("__init__", ""))


@pytest.mark.parametrize("spelling", [
    "def helper():\n    from .high import thing\n    return thing\n",
    "import typing\n\nif typing.TYPE_CHECKING:\n    from toy.high import thing\n",
    "from . import high\n",
    "import toy.high.thing_holder\n",
    "try:\n    import toy.high as h\nexcept ImportError:\n    h = None\n",
])
def test_an_upward_import_is_named_with_its_line_and_layers(tmp_path, spelling):
    package = _write_package(tmp_path, {"__init__.py": "", "high.py": "from .low import VALUE\nthing = VALUE\n",
                                        "low.py": f"VALUE = 1\n\n\n{spelling}", "sub/__init__.py": ""})
    line = 4 + spelling.splitlines().index(next(s for s in spelling.splitlines() if "high" in s))
    assert layering_problems(package, TOY_LAYERS) == [
        f"toy/low.py:{line}: toy.low (low) imports toy.high (high), a higher layer"]


def test_the_package_init_an_import_runs_counts(tmp_path):
    """``low`` imports ``toy.high.leaf``: that runs ``high/__init__.py`` as well, a higher layer either way; and
    ``sub/leaf.py`` below ``high/__init__`` imports nothing upward by its own name but through ``high``'s."""
    package = _write_package(tmp_path, {"__init__.py": "", "low.py": "from .high.leaf import X\n",
                                        "high/__init__.py": "", "high/leaf.py": "X = 1\n", "sub/__init__.py": ""})
    assert layering_problems(package, TOY_LAYERS) == [
        "toy/low.py:1: toy.low (low) imports toy.high.leaf (high), a higher layer",
        "toy/low.py:1: toy.low (low) imports toy.high (high), a higher layer"]


def test_imports_downward_and_within_a_folder_pass(tmp_path):
    package = _write_package(tmp_path, {"__init__.py": "from .high import thing\n",
                                        "high.py": "from .low import VALUE\nfrom . import sub\nthing = VALUE\n",
                                        "low.py": "VALUE = 2\n",
                                        "sub/__init__.py": "from .part import part\n",
                                        "sub/part.py": "from ..low import VALUE\npart = VALUE\n"})
    assert layering_problems(package, TOY_LAYERS) == []
    assert import_circles(package) == []
    assert folder_circles(package) == []


def test_a_folder_in_no_layer_is_named(tmp_path):
    package = _write_package(tmp_path, {"__init__.py": "", "low.py": "", "high.py": "", "extra.py": "",
                                        "sub/__init__.py": "", "more/__init__.py": "", "more/inner.py": ""})
    assert layering_problems(package, TOY_LAYERS) == [
        "toy/extra.py: folder 'extra' is in no layer; give it one in LAYERS (tests/unit/test_layering.py) and "
        "docs/design.md",
        "toy/more/__init__.py: folder 'more' is in no layer; give it one in LAYERS (tests/unit/test_layering.py) "
        "and docs/design.md"]


def test_a_module_is_in_its_top_level_folder():
    assert [folder_of(n) for n in ("toy", "toy.low", "toy.sub", "toy.sub.leaf", "toy.sub.deep.leaf")] == \
        ["__init__", "low", "sub", "sub", "sub"]


def test_circles_are_found_also_through_a_package_init_and_inside_functions(tmp_path):
    package = _write_package(tmp_path, {
        "__init__.py": "",
        "low.py": "def f():\n    from .high import thing\n",
        "high.py": "from .low import f\nthing = 1\n",
        "sub/__init__.py": "from . import leaf\nREGISTRY = {}\n",
        "sub/leaf.py": "def register():\n    from . import REGISTRY\n",  # a submodule importing its package
        "pkg/__init__.py": "from ..a import A\n",  # runs when b imports pkg.leaf: b -> pkg -> a -> b
        "pkg/leaf.py": "",
        "a.py": "from .b import B\nA = B\n",
        "b.py": "from .pkg.leaf import *\nB = 1\n",
    })
    assert import_circles(package) == [["toy.a", "toy.b", "toy.pkg"], ["toy.high", "toy.low"],
                                       ["toy.sub", "toy.sub.leaf"]]
    assert folder_circles(package) == [["a", "b", "pkg"], ["high", "low"]]


def test_lazy_imports_need_their_reason_and_stay_few(tmp_path):
    package = _write_package(tmp_path, {
        "__init__.py": "",
        "low.py": "X = 1\n",
        "high.py": ("from .low import X\n\n\ndef f():\n    from .low import X  # lazy: pulls a heavy package\n\n\n"
                    "def g():\n    # lazy: pulls a heavy package\n    from .low import X\n\n\n"
                    "def h():\n    from .low import X\n"),
    })
    assert lazy_problems(package, max_share=0.9) == [
        "toy/high.py:14: toy.high imports toy.low inside a function without its reason; import it at the top, or "
        "say why not on its line (# lazy: the heavy third-party package it loads)"]
    assert lazy_problems(package, max_share=0.5)[-1] == \
        "3 of the 4 imports of attnclust's modules are inside functions (75.0%); at most 50%: import at the top"
