"""The GPU check (bench/gpu): every module it imports is in the GPU machine's image or among the prepared wheels, its
pins are pyproject.toml's, and its two pieces of logic that can run without a GPU (the backend switch, the exit
without a CUDA device) do what they say.

The import walk is static (``ast``): from ``bench/gpu/check.py`` it follows every import of the check's own modules
(``bench.gpu``, whose functions choose what the check runs) and the module-level imports of every attnclust and bench
module reached that way; it records each third-party import (at any level) of every module reached.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from bench.gpu import check as gpu_check
from bench.gpu.manifest import (
    FROM_IMAGE,
    NOT_CARRIED,
    OWN_PINS,
    REQUIREMENTS,
    distribution_of,
    normalize,
    read_requirements,
)

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = ("attnclust", "bench")
ENTRY = "bench.gpu.check"
IMAGE_NAMED = {"torch", "transformers", "numpy", "pandas", "pyarrow", "scikit-learn", "cupy", "numba"}


def module_file(name: str) -> Path | None:
    path = ROOT.joinpath(*name.split("."))
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(name: str) -> list[tuple[str, bool]]:
    """``(absolute module, at module level)`` for every import statement of module ``name``; ``from pkg import x``
    also yields ``pkg.x`` where that is a first-party module. ``if TYPE_CHECKING:`` blocks never run: skipped."""
    path = module_file(name)
    is_package = path.name == "__init__.py"
    found: list[tuple[str, bool]] = []

    def resolve(node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module
        base = name.split(".") if is_package else name.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def visit(nodes, top: bool) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.extend((alias.name, top) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                module = resolve(node)
                found.append((module, top))
                if module.split(".")[0] in FIRST_PARTY:
                    found.extend((f"{module}.{a.name}", top) for a in node.names
                                 if module_file(f"{module}.{a.name}") is not None)
            elif isinstance(node, ast.If) and _is_type_checking(node):
                visit(node.orelse, top)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(ast.iter_child_nodes(node), False)
            else:  # class bodies, if/try/with blocks run at import when their parent does
                visit(ast.iter_child_nodes(node), top)

    visit(ast.parse(path.read_text()).body, True)
    return found


def walk(entry: str = ENTRY) -> tuple[set[str], dict[str, list[tuple[str, bool]]]]:
    """The first-party modules the check reaches, and its third-party imports: top-level name ->
    ``[(importing module, at module level)]``."""
    reached: set[str] = set()
    third: dict[str, list[tuple[str, bool]]] = {}
    todo = [entry]
    while todo:
        name = todo.pop()
        if name in reached or module_file(name) is None:
            continue
        reached.add(name)
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # importing a.b.c runs a and a.b
        own = name.startswith("bench.gpu")
        for module, top in imports_of(name):
            root = module.split(".")[0]
            if root in FIRST_PARTY:
                if top or own:
                    todo.append(module)
            elif root not in sys.stdlib_module_names:
                third.setdefault(root, []).append((name, top))
    return reached, third


def requirement_names() -> set[str]:
    return {r.name for r in read_requirements()}


def pyproject_dependencies() -> dict[str, str]:
    """pyproject.toml's dependencies: normalised name (extras dropped) -> specifier text."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    out = {}
    for line in deps:
        name, _extras, spec = re.match(r"\s*([A-Za-z0-9._-]+)\s*(\[[^\]]*\])?\s*([^;]*)", line).groups()
        out[normalize(name)] = spec.replace(" ", "")
    return out


def _spec_set(spec: str) -> set[str]:
    return {part for part in spec.replace(" ", "").split(",") if part}


# ------------------------------------------------------------------------------------------------ the import walk
def test_the_walk_reaches_the_code_the_check_runs():
    reached, third = walk()
    for name in ("bench.figures.extraction", "bench.figures.featurizer", "bench.common.inproc", "bench.run",
                 "attnclust.pipeline", "attnclust.stages.extract", "attnclust.stages.featurize",
                 "attnclust.featurize.resnet", "attnclust.models.runner", "attnclust.store.contract"):
        assert name in reached, f"{name} is run by the GPU check but the walk did not reach it"
    for module in ("torch", "zarr", "pydantic", "yaml", "torchvision", "transformers"):
        assert module in third, f"the walk missed the check's import of {module}"


def test_every_module_the_check_imports_is_in_the_image_or_a_prepared_wheel():
    _, third = walk()
    carried = requirement_names()
    problems = []
    for module, where in sorted(third.items()):
        dist = distribution_of(module)
        importers = sorted({m for m, _ in where})
        if dist in FROM_IMAGE or dist in carried:
            continue
        at_import = sorted({m for m, top in where if top})
        if dist in NOT_CARRIED and not at_import:
            continue  # imported only inside functions the check never calls, for the reason NOT_CARRIED gives
        if dist in NOT_CARRIED:
            problems.append(f"{module} ({dist}) is imported at module level by {', '.join(at_import)} but is not "
                            f"carried ({NOT_CARRIED[dist][:80]}): import it inside the function that needs it")
        else:
            problems.append(f"{module} ({dist}), imported by {', '.join(importers[:3])}: neither in the GPU image "
                            f"(bench/gpu/manifest.py FROM_IMAGE) nor in bench/gpu/requirements.txt; add it to "
                            f"requirements.txt (then re-run python -m bench.gpu.prepare) or to NOT_CARRIED with why")
    assert not problems, "\n".join(problems)


def test_the_walk_sees_a_module_missing_from_both_lists(tmp_path, monkeypatch):
    """The gate can fail: a module of the check importing an unlisted package is reported, with its level."""
    real = module_file
    (tmp_path / "probe.py").write_text("import polars\n\n\ndef f():\n    import matplotlib\n")
    monkeypatch.setitem(globals(), "module_file",
                        lambda name: tmp_path / "probe.py" if name == "bench.gpu.probe" else real(name))
    _, third = walk("bench.gpu.probe")
    assert third["polars"] == [("bench.gpu.probe", True)]
    assert third["matplotlib"] == [("bench.gpu.probe", False)]
    assert distribution_of("polars") not in set(FROM_IMAGE) | requirement_names() | set(NOT_CARRIED)


# ------------------------------------------------------------------------------------------------------ the pins
def test_the_image_list_names_what_the_machine_has():
    assert IMAGE_NAMED <= set(FROM_IMAGE)
    assert not IMAGE_NAMED & requirement_names(), "a package of the image is downloaded as well"


def test_requirement_pins_are_pyprojects():
    deps = pyproject_dependencies()
    checked = []
    for req in read_requirements():
        if req.name not in deps:
            continue
        checked.append(req.name)
        if req.name in OWN_PINS:
            assert _spec_set(req.spec) != _spec_set(deps[req.name]), f"{req.name}: OWN_PINS says its pin differs"
            continue
        assert _spec_set(req.spec) == _spec_set(deps[req.name]), (
            f"bench/gpu/requirements.txt {req.line!r} vs pyproject.toml {req.name}{deps[req.name]}: use "
            f"pyproject's pin, or say why not in bench/gpu/manifest.py OWN_PINS")
    assert {"dask", "distributed", "zarr", "pydantic", "torchvision"} <= set(checked)


def test_every_dependency_of_attnclust_is_carried_from_the_image_or_left_out_with_a_reason():
    deps = set(pyproject_dependencies())
    carried, image, left = requirement_names(), set(FROM_IMAGE), set(NOT_CARRIED)
    assert not carried & image and not carried & left and not image & left
    unaccounted = deps - carried - image - left
    assert not unaccounted, (f"pyproject.toml's {sorted(unaccounted)}: put each in bench/gpu/requirements.txt, "
                             f"FROM_IMAGE or NOT_CARRIED (bench/gpu/manifest.py)")
    assert all(reason.strip() for reason in (*NOT_CARRIED.values(), *OWN_PINS.values()))


def test_the_pinned_versions_are_exact_where_pyproject_pins_them():
    reqs = {r.name: r for r in read_requirements()}
    assert reqs["dask"].spec == "==2026.7.1" and reqs["distributed"].spec == "==2026.7.1"
    assert _spec_set(reqs["zarr"].spec) == {">=3.1", "<3.2"}
    assert reqs["torchvision"].spec == "==0.26.0" and reqs["torchvision"].no_deps


def test_requirement_lines_are_read_with_their_markers(tmp_path):
    path = tmp_path / "req.txt"
    path.write_text("# comment\n\ndask[array] == 2026.7.1\nzarr>=3.1,<3.2  # why\ntorchvision==0.26.0  # no-deps\n"
                    "Pydantic_Core\n")
    reqs = read_requirements(path)
    assert [(r.name, r.spec, r.no_deps) for r in reqs] == [
        ("dask", "==2026.7.1", False), ("zarr", ">=3.1,<3.2", False), ("torchvision", "==0.26.0", True),
        ("pydantic-core", "", False)]
    assert reqs[0].line == "dask[array]==2026.7.1"
    path.write_text("-e .\n")
    with pytest.raises(ValueError, match=r"req.txt:1: '-e \.' is not 'name specifiers"):
        read_requirements(path)


def test_the_machine_reads_the_same_lists():
    """run.sh asks ``python -m bench.gpu.manifest`` (standard library only) for the pip lines."""
    def lines(which):
        r = subprocess.run([sys.executable, "-m", "bench.gpu.manifest", which], cwd=ROOT, capture_output=True,
                           text=True, check=True)
        return r.stdout.split()

    reqs = read_requirements()
    assert lines("deps") == [r.line for r in reqs if not r.no_deps]
    assert lines("no-deps") == [r.line for r in reqs if r.no_deps] == ["torchvision==0.26.0"]
    assert "bench.gpu.manifest deps" in (ROOT / "bench" / "gpu" / "run.sh").read_text()
    tree = ast.parse((ROOT / "bench" / "gpu" / "manifest.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names)


def test_the_wheel_folder_is_ignored_by_git():
    r = subprocess.run(["git", "check-ignore", "-q", "bench/gpu/wheels/x-1.0-py3-none-any.whl"], cwd=ROOT)
    assert r.returncode == 0, "add bench/gpu/wheels/ to .gitignore: the prepared wheels are carried, not committed"
    assert REQUIREMENTS.parent == ROOT / "bench" / "gpu"


# ------------------------------------------------------------------------------------------ the backend switch
def test_gpu_backend_resolves_by_torch_inside_the_check_only(monkeypatch):
    import torch

    from attnclust import backend as bk
    from attnclust.errors import BackendUnavailable

    real = bk.resolve_backend
    monkeypatch.setattr(bk, "gpu_status", lambda: (False, "cuml is not installed"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with gpu_check.torch_gpu_backend():
        assert bk.resolve_backend("gpu") == "gpu"
        assert bk.resolve_backend("cpu") == "cpu"
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        with pytest.raises(BackendUnavailable, match="torch finds no CUDA device"):
            bk.resolve_backend("gpu")
        with pytest.raises(BackendUnavailable, match="cuml"):  # the cluster stage's factories still want cuML
            bk.make_kmeans("gpu", n_clusters=2, random_state=0)
    assert bk.resolve_backend is real
    with pytest.raises(BackendUnavailable, match="cuml is not installed"):
        real("gpu", probe=lambda: (False, "cuml is not installed"))


def test_the_pipeline_resolves_through_the_module_attribute_the_check_replaces():
    tree = ast.parse((ROOT / "attnclust" / "pipeline.py").read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == "resolve_backend"]
    assert calls and all(isinstance(c.func.value, ast.Name) and c.func.value.id == "bk" for c in calls), (
        "attnclust.pipeline no longer calls bk.resolve_backend: bench/gpu/check.py torch_gpu_backend must follow")


# ---------------------------------------------------------------------------------------- without a CUDA device
def test_without_cuda_the_check_writes_why_and_exits_2(tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--out", str(out)]) == 2
    doc = json.loads(out.read_text())
    assert doc["status"] == "no-cuda" and doc["figures"] == []
    assert doc["environment"]["cuda_available"] is False and "torch" in doc["environment"]["versions"]
    assert "cuML" in doc["clustering"]
    skipped = {s["figure"]: s["reason"] for s in doc["skipped"] if s["figure"]}
    assert "cuML" in skipped["cluster_100k_gpu (quick) / cluster_1m_gpu"]
    assert not {"extract_vs_forward_gpu", "featurize_resnet_vs_bare_gpu"} & set(skipped)
    assert doc["carried"] == [r.line for r in read_requirements()]
    assert "no CUDA device" in capsys.readouterr().out


def test_check_sizes_are_refused_when_unknown(tmp_path):
    with pytest.raises(SystemExit):
        gpu_check.main(["--out", str(tmp_path / "x.json"), "--size", "extract_reps=many"])
