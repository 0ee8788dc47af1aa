"""The model of a run, resolved once on the driver: where it loads from (its source, hub revision and GGUF file), its
identity, its kind, its heads and whether its QA head is trained.

:func:`resolve_model` runs the pre-flight check (:func:`attnclust.models.describe_model`) and returns a frozen
:class:`ResolvedModel`; the stages read it instead of resolving the model again, and hand its identity to the
workers, whose model cache it keys (:func:`attnclust.models.get_model`). It is recorded as ``model_info`` in
``job.json`` (:meth:`ResolvedModel.to_dict`, the same keys as before) and read back from there
(:meth:`ResolvedModel.from_dict`); the attention store carries its heads and kind (:attr:`ResolvedModel.store_attrs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..config import ModelConfig
from .kinds import HeadLayout, ModelKind, kind_of
from .runner import describe_model
from .sources import gguf_name

__all__ = ["ResolvedModel", "resolve_model"]


@dataclass(frozen=True)
class ResolvedModel:
    """What the model of a run is.

    Attributes
    ----------
    source : str
        What ``from_pretrained`` loads (:func:`attnclust.models.resolve_model_path`).
    identity : str
        Its files' identity (:func:`attnclust.models.model_identity`): the key of a worker's model cache, the
        extraction's fingerprint.
    kind : attnclust.models.kinds.ModelKind
        An encoder or a decoder (:func:`attnclust.models.kinds.kind_of`).
    layout : attnclust.models.kinds.HeadLayout
        Its layers, query heads and key/value heads.
    head_trained : bool
        The checkpoint provides its QA head (:attr:`attnclust.models.LoadedModel.head_trained`).
    value_norms : bool
        Its value vectors' norms are measured (:func:`attnclust.models.value_norms.measures_moved_norm`).
    revision : str or None
        The hub revision it loads at (``model.revision``), None for the default branch or a local model.
    gguf_file : str or None
        The GGUF file it loads (:func:`attnclust.models.sources.gguf_name`: the packaged SmolLM2's, a ``.gguf``
        path's name or ``model.gguf_file``), None for an ordinary checkpoint.
    """

    source: str
    identity: str
    kind: ModelKind
    layout: HeadLayout
    head_trained: bool
    value_norms: bool
    revision: str | None = None
    gguf_file: str | None = None

    @classmethod
    def from_dict(cls, info: Mapping) -> ResolvedModel:
        """From ``model_info`` (:func:`attnclust.models.describe_model`, ``job.json``); a record without ``kind``
        or ``value_norms`` (an older attnclust's) is an encoder's without value norms; one without ``revision`` or
        ``gguf_file`` loads without them."""
        heads = int(info["num_heads"])
        return cls(source=str(info["source"]), identity=str(info["identity"]), kind=kind_of(info),
                   layout=HeadLayout(layers=int(info["num_layers"]), heads=heads,
                                     kv_heads=int(info.get("kv_heads", heads))),
                   head_trained=bool(info["head_trained"]), value_norms=bool(info.get("value_norms", False)),
                   revision=_text(info.get("revision")), gguf_file=_text(info.get("gguf_file")))

    def to_dict(self) -> dict:
        """``model_info``: ``source``, ``identity``, ``num_layers``, ``num_heads``, ``head_trained``, ``kind``,
        ``value_norms``, for grouped key/value heads ``kv_heads``, and ``revision`` and ``gguf_file`` where they are
        set."""
        loads = {k: v for k, v in (("revision", self.revision), ("gguf_file", self.gguf_file)) if v is not None}
        return {"source": self.source, "identity": self.identity, "num_layers": self.layout.layers,
                "num_heads": self.layout.heads, "head_trained": self.head_trained, "kind": self.kind.name,
                "value_norms": self.value_norms, **self._grouped("kv_heads"), **loads}

    @property
    def store_attrs(self) -> dict:
        """What the attention store says of the model: ``num_layers``, ``num_heads``, the kind's
        (:attr:`~attnclust.models.kinds.ModelKind.store_attrs`) and, for grouped key/value heads,
        ``num_key_value_heads``."""
        return {"num_layers": self.layout.layers, "num_heads": self.layout.heads, **self.kind.store_attrs,
                **self._grouped("num_key_value_heads")}

    def _grouped(self, name: str) -> dict:
        kv = self.layout.kv_heads
        return {name: kv} if 0 < kv < self.layout.heads else {}


def resolve_model(cfg: ModelConfig) -> ResolvedModel:
    """The model of ``cfg``, checked and described once (:func:`attnclust.models.describe_model`).

    Raises
    ------
    ModelError
        The model cannot be found or loaded, or is of no registered family of attention modules.
    """
    return ResolvedModel.from_dict({**describe_model(cfg), "revision": cfg.revision, "gguf_file": gguf_name(cfg)})


def _text(value) -> str | None:
    return None if value is None else str(value)
