"""What a model's weights are, beyond their name (:func:`model_identity`, :func:`gguf_identity`), from the digests
of its files, each read once per version of the file (:func:`file_digest`, kept under :func:`cache_home`)."""

from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path

from ...cachedir import cache_home
from ...config import ModelConfig
from ...layout import ModelDirLayout
from ...safeio import atomic_write_json
from .gguf import PACKAGED_CAUSAL, gguf_location, gguf_name
from .resolve import PACKAGED, resolve_model_path

__all__ = ["DIGEST_CACHE_VERSION", "cache_home", "file_digest", "file_version", "gguf_identity", "model_identity",
           "pinned_identity"]

_FILE_DIGESTS: dict[tuple, str] = {}  # file_version(path) -> content hash, once per process and version
DIGEST_CACHE_VERSION = 1
"""Bumped when the on-disk digest cache's entries change form."""


def file_version(path: Path) -> tuple:
    """What tells one version of a file from another without reading it: its resolved path, device, inode, size,
    modification time and change time (ns).

    The change time is set by the kernel on every write, rename into place or ``touch``, and no tool can set it
    back (``cp -p``, ``rsync -a``, ``tar x`` and ``touch -r`` keep or set the modification time only), so weights
    replaced by others of the same size under a kept modification time are a new version.
    """
    st = path.stat()
    return (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def file_digest(path: Path) -> str:
    """SHA-256 of a file's content, read once per version of the file (:func:`file_version`).

    The identity is asked at every model lookup and a model's weights are hundreds of megabytes, so each digest is
    kept in memory for the process and on disk under :func:`cache_home` ``/digests`` for later runs (a cache that
    cannot be written is skipped: the file is then read again by the next process).
    """
    key = file_version(path)
    if key in _FILE_DIGESTS:
        return _FILE_DIGESTS[key]
    name = hashlib.sha256(repr((DIGEST_CACHE_VERSION, key)).encode()).hexdigest()[:32]
    record = cache_home() / "digests" / name
    try:
        kept = json.loads(record.read_text()) if record.is_file() and not record.is_symlink() else None
    except (OSError, ValueError):
        kept = None
    if isinstance(kept, dict) and kept.get("key") == list(key) and isinstance(kept.get("sha256"), str):
        _FILE_DIGESTS[key] = kept["sha256"]
        return kept["sha256"]
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    if file_version(path) != key:  # written to while it was read: not kept, the next lookup reads it again
        return digest.hexdigest()
    _FILE_DIGESTS[key] = digest.hexdigest()
    try:
        atomic_write_json(record, {"key": list(key), "sha256": digest.hexdigest()})
    except OSError:
        pass
    return digest.hexdigest()


def _hash_text_files(digest, folder: Path) -> None:
    """Add the contents of a model directory's tokenizer, chat-template and generation files to ``digest``.

    They decide the token ids, the prompt and where decoding stops, so an edited ``tokenizer_config.json`` or
    ``chat_template.jinja`` is a different model for every stage that reads tokens.
    """
    for path in ModelDirLayout(folder).text_files():
        digest.update(f"{path.relative_to(folder).as_posix()}:{file_digest(path)}".encode())


def _weight_files(folder: ModelDirLayout) -> list[Path]:
    """The weight files of a model directory: those of :data:`~attnclust.layout.WEIGHT_FILES` present, and the
    shards a ``*.index.json`` among them lists (by name, inside the directory), in a fixed order."""
    found = [f for f in folder.weights() if f.is_file()]
    shards: set[str] = set()
    for index in (f for f in found if f.name.endswith(".index.json")):
        try:
            weight_map = json.loads(index.read_text()).get("weight_map", {})
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(weight_map, dict):
            shards |= {name for name in weight_map.values() if isinstance(name, str) and Path(name).name == name}
    return found + [folder.root / name for name in sorted(shards) if (folder.root / name).is_file()]


def gguf_identity(cfg: ModelConfig) -> str | None:
    """The weights' identity of a GGUF source (``smollm2==<version>``, or a hash of the file's name and content
    with its folder's tokenizer and template files); ``None`` for an ordinary checkpoint or a hub repository (whose
    revision pins it)."""
    name = cfg.name.strip()
    folder = gguf_location(cfg)
    if folder is None:
        return None
    if name in PACKAGED_CAUSAL:
        return f"{name}=={metadata.version(PACKAGED_CAUSAL[name][0].replace('_', '-'))}"
    file = Path(folder) / gguf_name(cfg)
    if not file.is_file():
        return None
    digest = hashlib.sha256(f"{file.name}:{file_digest(file)}".encode())
    _hash_text_files(digest, Path(folder))
    return digest.hexdigest()[:16]


def model_identity(cfg: ModelConfig) -> str:
    """What the weights are, beyond their name: a re-fine-tuned local directory gets a new identity.

    Parameters
    ----------
    cfg
        Model settings.

    Returns
    -------
    str
        Local directory: a hash of ``config.json`` and the contents of each weight file (the shards an index
        lists included) and of the tokenizer, chat-template and generation files
        (:data:`~attnclust.layout.TOKENIZER_FILES`); each file is read once per version (:func:`file_digest`).
        A GGUF file: a hash of its name and content, and those text files beside it.
        Packaged model: ``minilm==<package version>``. Hub id: ``<id>@<revision>`` (the hub's revisions pin the
        content).
    """
    source = resolve_model_path(cfg)
    path = Path(source)
    gguf = gguf_identity(cfg)
    if gguf is not None:
        return gguf
    if cfg.name.strip() in PACKAGED:
        return f"{cfg.name}=={metadata.version(PACKAGED[cfg.name.strip()].replace('_', '-'))}"
    if not path.is_dir():
        return f"{source}@{cfg.revision or 'main'}"
    folder = ModelDirLayout(path)
    digest = hashlib.sha256(folder.config.read_bytes())
    for weights in _weight_files(folder):
        digest.update(f"{weights.name}:{file_digest(weights)}".encode())
    _hash_text_files(digest, path)
    return digest.hexdigest()[:16]


def pinned_identity(identity: str, revision: str | None) -> bool:
    """Whether the files :func:`model_identity` names stay the same under it, so that what was measured of them may
    be kept between runs: a local directory, a GGUF file and a packaged model are known by their content or
    version; a hub id (``<id>@<revision>``) only when the job names ``model.revision`` (without it the identity is
    ``<id>@main``, which the hub may move).

    Parameters
    ----------
    identity
        :func:`model_identity` of the model.
    revision
        The job's ``model.revision`` (None when it names none).
    """
    return "@" not in identity or bool(revision)
