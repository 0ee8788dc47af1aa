"""The package's layers: a module imports modules of its own layer or of a lower one, never of a higher one, and no
modules import each other round a circle.

What counts as an import (read from the source with :mod:`ast`, nothing is imported):

- every ``import attnclust...``, ``from attnclust... import ...`` and relative ``from . import ...`` anywhere in a
  module: at the top, inside a function or a method, under ``try``, and under ``if TYPE_CHECKING:`` as well. A
  type-only import does not run, but the annotation still names the higher module's type: the design depends on
  it all the same, so it counts (none is needed today);
- ``from pkg import name`` imports the submodule ``pkg.name`` when there is one, else ``pkg`` itself (its
  ``__init__``);
- importing ``a.b.c`` also runs the ``__init__`` of ``a`` and ``a.b``: Python's doing, not the module's, so that
  is not counted;
- a package's ``__init__`` is the package's front door: it may import its own submodules (to re-export their
  names, or to register them, as :mod:`attnclust.featurize` does), and no submodule imports it back (a submodule
  imports the sibling that defines the name, e.g. ``featurize/base.py``): the circle check refuses
  ``__init__ -> sub -> __init__``;
- ``importlib.import_module("...")`` with a string is not seen (attnclust uses it only for a packaged model's
  own package, never for one of its modules).

A new module needs a place in :data:`LAYERS`; the check says so when it has none.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

import attnclust

PACKAGE_DIR = Path(attnclust.__file__).parent

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # errors every layer raises
    ("errors", ("attnclust.errors",)),
    # no knowledge of jobs or runs: bounded reads and atomic writes, chunk checksums, argparse types, the parts of
    # a transformers model that are hooked, the clustering algorithms' small pieces; how a setting is declared and
    # its errors told (_settings: the featurizers declare their settings with it)
    ("foundations", ("attnclust.plugins", "attnclust.safeio", "attnclust.cachedir", "attnclust.store.integrity",
                     "attnclust.argtypes", "attnclust.models.hooks", "attnclust.cluster.placement",
                     "attnclust._settings")),
    # what a map is, no files, no models: its tokens and token masks, its per-map statistics, its profile, and the
    # encodings a store keeps it in (the compact code, the value norms' code)
    ("maps", ("attnclust.maps",)),
    # the featurizers and their registry, which the job's validation needs (their array maths is a map's)
    ("kernels", ("attnclust.featurize",)),
    # reading the user's data: SQuAD files and the Hugging Face forms (data.hf), tokenisation into features
    ("data", ("attnclust.data", "attnclust.data.hf")),
    # the job: its sections, validated (against the featurizer registry, whose featurizers declare their own
    # settings); the analyses add theirs from above (attnclust.analysis.plugins)
    ("config", ("attnclust.config",)),
    # the names of a run's files, and the run's lock and marker
    ("layout", ("attnclust.layout",)),
    # the attention and embedding stores' contract, and reading a run's tables
    ("stores", ("attnclust.store",)),
    # where a model's files come from (packaged, a directory, the hub, a GGUF file), what a load returns
    ("model sources", ("attnclust.models.sources", "attnclust.models.gguf_cache")),
    # loading and running models (decoders in causal, below the runner that dispatches to it), the CPU/GPU
    # backends, the Dask runtime, and the one task runner of the stages and of the work inside them (executors)
    ("compute", ("attnclust.models.decoder", "attnclust.models", "attnclust.backend", "attnclust.runtime",
                 "attnclust.executors")),
    # the task the models are measured on: question answering (answers, scoring, fine-tuning, prompting), and the
    # model kinds, whose features are the task's (a decoder's are its prompts and answers: models.kinds)
    ("task", ("attnclust.qa", "attnclust.models.kinds")),
    # methods on a run: clustering and the per-head analyses that read stores and models
    ("methods", ("attnclust.cluster", "attnclust.analysis")),
    # the HTML report and its figures
    ("report", ("attnclust.report",)),
    # the pipeline's stages, each a plan of blocks on an executor
    ("stages", ("attnclust.stages",)),
    # running a whole job, and the Python API over it and its outputs
    ("pipeline", ("attnclust.pipeline", "attnclust.api")),
    # tools on finished runs and on the job service (the explorer's exact maps recomputed on demand); planted stores
    # for tests and benchmarks
    ("applications", ("attnclust.compare", "attnclust.explore", "attnclust.export", "attnclust.recompute",
                      "attnclust.service", "attnclust.synthetic")),
    # entry points: the command line and the package's public names
    ("entry points", ("attnclust.cli", "attnclust")),
)
"""Bottom to top. An entry names a module, or a package with every submodule not named more precisely (the
longest entry wins; the root package's entry covers the root ``__init__`` alone)."""


@dataclass(frozen=True)
class Import:
    """One import of a module of the package, where it is written."""

    source: str
    target: str
    path: Path
    line: int


def module_names(package_dir: Path) -> dict[str, Path]:
    """Every module of the package in ``package_dir``, by dotted name (a package by its own name)."""
    root = package_dir.parent
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports_in(name: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    """The imports of modules in ``modules`` written anywhere in module ``name`` (rules: the module docstring)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top = name.split(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
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
                found.append(Import(name, target, path, node.lineno))
    return found


def layer_of(name: str, layers=LAYERS) -> int | None:
    """Index in ``layers`` of the longest entry naming ``name`` (see :data:`LAYERS`); ``None`` when unplaced."""
    best, level = -1, None
    for i, (_, entries) in enumerate(layers):
        for entry in entries:
            covers = name == entry or ("." in entry and name.startswith(entry + "."))
            if covers and len(entry) > best:
                best, level = len(entry), i
    return level


def layering_problems(package_dir: Path, layers=LAYERS) -> list[str]:
    """One line per module in no layer and per import of a higher layer:
    ``path:line: source (layer) imports target (higher layer)``."""
    modules = module_names(package_dir)
    root = package_dir.parent
    problems = [f"{path.relative_to(root)}: module {name} is in no layer; give it one in LAYERS "
                f"(tests/unit/test_layering.py)" for name, path in modules.items() if layer_of(name, layers) is None]
    for name, path in modules.items():
        for imp in imports_in(name, path, modules):
            low, high = layer_of(imp.source, layers), layer_of(imp.target, layers)
            if low is not None and high is not None and high > low:
                problems.append(f"{imp.path.relative_to(root)}:{imp.line}: {imp.source} ({layers[low][0]}) imports "
                                f"{imp.target} ({layers[high][0]}), a higher layer")
    return problems


def import_circles(package_dir: Path) -> list[list[str]]:
    """Groups of modules that import each other, directly or round a circle (strongly connected components of
    more than one module), each sorted."""
    modules = module_names(package_dir)
    graph = {name: sorted({imp.target for imp in imports_in(name, path, modules)}) for name, path in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for start in graph:  # Tarjan's algorithm, iterative
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if i < len(graph[node]):
                work.append((node, i + 1))
                nxt = graph[node][i]
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


def test_no_module_imports_a_higher_layer():
    problems = layering_problems(PACKAGE_DIR)
    assert not problems, "\n".join(problems)


def test_no_import_circles():
    circles = import_circles(PACKAGE_DIR)
    assert not circles, "modules importing each other: " + "; ".join(" <-> ".join(c) for c in circles)


def test_every_layer_entry_names_a_module():
    modules = module_names(PACKAGE_DIR)
    stale = [entry for _, entries in LAYERS for entry in entries if entry not in modules]
    assert not stale, f"LAYERS names modules that do not exist: {stale}"


# -- the checks themselves, on a tiny package written here --------------------------------------------------------

def _write_package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / "toy" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / "toy"


TOY_LAYERS = (("low", ("toy.low", "toy.sub")), ("high", ("toy.high", "toy")))


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


def test_imports_downward_and_within_a_layer_pass(tmp_path):
    package = _write_package(tmp_path, {"__init__.py": "from .high import thing\n",
                                        "high.py": "from .low import VALUE\nfrom . import sub\nthing = VALUE\n",
                                        "low.py": "from .sub import part\nVALUE = part\n",
                                        "sub/__init__.py": "part = 2\n"})
    assert layering_problems(package, TOY_LAYERS) == []
    assert import_circles(package) == []


def test_a_module_in_no_layer_is_named(tmp_path):
    package = _write_package(tmp_path, {"__init__.py": "", "low.py": "", "high.py": "", "extra.py": "",
                                        "sub/__init__.py": ""})
    assert layering_problems(package, TOY_LAYERS) == [
        "toy/extra.py: module toy.extra is in no layer; give it one in LAYERS (tests/unit/test_layering.py)"]


def test_a_package_entry_covers_its_submodules_unless_named_more_precisely():
    layers = (("a", ("toy.pkg.leaf",)), ("b", ("toy.pkg",)), ("c", ("toy",)))
    assert [layer_of(n, layers) for n in ("toy.pkg.leaf", "toy.pkg.other", "toy.pkg", "toy", "toy.loose")] == \
        [0, 1, 1, 2, None]


def test_circles_are_found_also_through_a_package_init_and_inside_functions(tmp_path):
    package = _write_package(tmp_path, {
        "__init__.py": "",
        "low.py": "def f():\n    from .high import thing\n",
        "high.py": "from .low import f\nthing = 1\n",
        "sub/__init__.py": "from . import leaf\nREGISTRY = {}\n",
        "sub/leaf.py": "def register():\n    from . import REGISTRY\n",  # a submodule importing its package
    })
    assert import_circles(package) == [["toy.high", "toy.low"], ["toy.sub", "toy.sub.leaf"]]
