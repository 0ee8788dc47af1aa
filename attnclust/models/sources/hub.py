"""The hub's rules: a hub id loads from the local cache only when the hub is offline or does not answer a ~2 s probe
(:func:`_cache_only_reason`, :func:`_from_hub`); a load that fails is told in one line (:func:`_load_failure`)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pickle
import threading
from collections.abc import Iterator
from pathlib import Path

from ...config import ModelConfig
from .gguf import gguf_name

__all__ = ["HUB_PROBE_SECONDS", "TOKENIZER_PACKAGES", "quiet_transformers"]

TOKENIZER_PACKAGES = (("sentencepiece", "pip install sentencepiece protobuf"),
                      ("tiktoken", "pip install tiktoken"), ("protobuf", "pip install protobuf"))
"""Packages a tokenizer may need to be converted from its original files (ALBERT's and DeBERTa's SentencePiece
models, tiktoken vocabularies), with the pip command that installs them."""
HUB_PROBE_SECONDS = 2.0  # how long the hub may take to answer before a hub id loads from the local cache only
_HUB_PROBES: dict[str, str | None] = {}  # endpoint -> why it did not answer (None: it did), once per process
_PROBE_LOCK = threading.Lock()  # not models' load lock: get_model holds that one while it loads
_OFFLINE_LOCK = threading.Lock()  # serialises the loads that switch huggingface_hub to offline mode
_TRUE = frozenset({"1", "ON", "YES", "TRUE"})  # huggingface_hub's spellings of true


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
