"""The decoder protocols' parts that read only the model, kept between runs (issue 49).

Gu et al.'s sink rate on random and repeated tokens, the induction, previous-token and duplicate-token detectors
on ARENA's repeated random halves, and the induction diagnostic (:mod:`.induction`) feed the model sequences drawn
from its vocabulary by a fixed seed: they depend on the model and the protocol's settings, never on the run's
questions. The needle-in-a-haystack test (:mod:`.needle`) reads the run's distinct contexts as its haystack, so it
depends on them as well. Each such part is measured once per key and kept under ``$ATTNCLUST_CACHE/protocols``
(:func:`attnclust.cachedir.cache_home`); a later run whose key is the same reads it instead of running the model,
and the run's ``decoder_protocols.json`` and the extract stage's record say which parts were reused.

A part's key (:meth:`ProtocolReuse.fetch`) holds everything its numbers depend on: the model's identity (weights,
tokenizer, chat template: :func:`attnclust.models.model_identity`), the device and the weights' dtype, the
versions of torch and transformers and of this cache, the protocols' version, and the part's own settings (for the
needle test, the SHA-256 of the run's distinct contexts, the longest test and the lengths). The natural-text sink
rate (windows of the run's contexts, 20 short forwards) is measured every time.

Not reused: a hub model named without ``model.revision`` (its identity is ``<id>@main``, which the hub may move:
:func:`attnclust.models.sources.identity.pinned_identity`),
and everything when the job sets ``extract.reuse_protocols: false``. An entry is written whole into a temporary
folder and renamed into place with a manifest of its files' hashes, and used only while it matches that manifest
(:mod:`attnclust.cachedir`): one that does not is moved aside, said in a warning, and measured again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..cachedir import cache_home, discard_folder, store_folder, verify_folder
from ..models.runner import get_model
from ..models.sources.identity import pinned_identity

__all__ = ["REUSE_VERSION", "ProtocolReuse", "contexts_digest", "protocol_reuse", "reuse_root", "shared_reuse"]

REUSE_VERSION = 1
"""Bumped when what an entry holds changes."""
_TABLE, _SUMMARY = "table.parquet", "summary.json"

Part = tuple[pd.DataFrame, dict]


def reuse_root() -> Path:
    """``$ATTNCLUST_CACHE/protocols``, by default ``~/.cache/attnclust/protocols``."""
    return cache_home() / "protocols"


def contexts_digest(contexts) -> str:
    """SHA-256 of the run's distinct non-empty contexts in their order (what the needle test's haystack is cut
    from: :func:`~.needle.haystack_tokens`)."""
    digest = hashlib.sha256()
    for text in dict.fromkeys(t for t in contexts if isinstance(t, str) and t.strip()):
        digest.update(text.encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
    return digest.hexdigest()


def _discard(entry: Path, reason: str) -> Path | None:
    return discard_folder(entry, reason, label="protocol cache", rebuilt="measured the protocol again",
                          without="the protocol is measured without the cache")


def _write(folder: Path, part: Part) -> None:
    table, summary = part
    table.to_parquet(folder / _TABLE, index=False)
    (folder / _SUMMARY).write_text(json.dumps(summary, sort_keys=True, default=str))


@dataclass(frozen=True)
class ProtocolReuse:
    """Where one model's protocol parts are kept between runs.

    Attributes
    ----------
    model : dict or None
        What every part's key holds about the model and the software (identity, device, dtype, versions); None
        when nothing is reused.
    why_not : str or None
        Why nothing is reused, in a few words (None when parts are).
    """

    model: dict | None
    why_not: str | None = None

    def fetch(self, part: str, settings: dict, measure: Callable[[], Part]) -> tuple[Part, bool]:
        """``measure()``'s table and summary for ``part`` under ``settings``, read from an earlier run's entry when
        there is one that matches, else measured and kept.

        Parameters
        ----------
        part
            The part's name (``sink_random``, ``detectors``, ``needle``, ``induction`` ...).
        settings
            JSON-serialisable settings of the part beyond the model (sizes, seed, digest of the data it reads).
        measure
            Runs the part: returns a table and a JSON-serialisable summary.

        Returns
        -------
        ((pandas.DataFrame, dict), bool)
            The part, and whether it was reused. A reused summary is the JSON of the measured one (tuples read
            back as lists).
        """
        if self.model is None:
            return measure(), False
        header = {"reuse_version": REUSE_VERSION, "part": part,
                  "key": json.loads(json.dumps({**self.model, **settings}, sort_keys=True, default=str))}
        name = hashlib.sha256(json.dumps(header, sort_keys=True).encode()).hexdigest()[:24]
        entry = reuse_root() / f"{name}-{part}"
        if entry.exists() or entry.is_symlink():
            reason = verify_folder(entry, header)
            if reason is None:
                try:
                    return (pd.read_parquet(entry / _TABLE), json.loads((entry / _SUMMARY).read_text())), True
                except (OSError, ValueError) as exc:
                    reason = f"does not read ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0]})"
            _discard(entry, reason if reason.startswith("does not") else
                     f"did not match what it records ({reason})")
        measured = measure()
        store_folder(entry, header, lambda folder: _write(folder, measured), discard=_discard)
        return measured, False


def protocol_reuse(model_cfg: Any, identity: str, loaded: Any, *, device: str, enabled: bool = True) \
        -> ProtocolReuse:
    """The reuse of one model's protocol parts (see the module docstring).

    Parameters
    ----------
    model_cfg : attnclust.config.ModelConfig
        The job's model settings (``revision``).
    identity
        :func:`attnclust.models.model_identity` of the model.
    loaded : attnclust.models.LoadedModel
        The loaded model (its weights' dtype).
    device
        ``cpu`` or ``cuda``.
    enabled
        ``extract.reuse_protocols``.
    """
    import torch
    import transformers

    if not enabled:
        return ProtocolReuse(None, "extract.reuse_protocols is false")
    if not pinned_identity(identity, model_cfg.revision):
        return ProtocolReuse(None, f"{identity} names no model.revision, so the hub may change it under its name")
    dtype = next((str(p.dtype) for p in loaded.model.parameters()), "none")
    return ProtocolReuse({"model": identity, "device": str(device), "dtype": dtype, "torch": torch.__version__,
                          "transformers": transformers.__version__})


def shared_reuse(ctx: Any) -> ProtocolReuse:
    """The reuse of the run's model in the extract stage's finalize (``ctx``: an
    :class:`~attnclust.analysis.extraction.ModelContext`), made once and shared by the per-model analyses that keep
    parts between runs (the induction diagnostic, the protocols)."""
    return ctx.shared("protocol_reuse", lambda c: protocol_reuse(
        c.cfg.model, c.identity, get_model(c.cfg.model, device=c.device, identity=c.identity), device=c.device,
        enabled=c.cfg.extract.reuse_protocols))
