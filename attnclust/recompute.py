"""A compact run's exact maps, recomputed on demand by one forward of the run's model (for ``attnclust explore``).

A compact store (``extract.store: compact``) keeps only each query row's largest weights, and the exact float16 maps
of its exact sample (:attr:`attnclust.store.AttentionStore.exact_features`). For any other feature,
:class:`ExactOnDemand` runs the run's own model once over that feature, every layer and head in the one forward
(on the CPU), and returns its maps cast to float16 as a full store holds them: exact, not the compact
approximation. The last :data:`CACHED_FEATURES` features' maps are kept in memory.

Only the run's model is used: the one its extract stage recorded in ``_state/extract.json`` (``model.name``,
``model.revision``; a decoder's kind and ``model.gguf_file``), and only while its identity
(:func:`attnclust.models.model_identity`: weights, configuration, tokenizer files) is still the recorded
``model_weights``, so the maps recomputed are those the run would have stored. Whether it can is decided when the
object is made (the identity hashes the model's files, once per version of each:
:func:`attnclust.models.sources.file_digest`), and asked again when the model is loaded, on the first feature that
needs it, so weights swapped after the explorer started are not used. When it cannot, :attr:`ExactOnDemand.reason`
says why in one line, and a model that fails to load on that first feature turns it off with its reason then: the
maps are then the compact ones, and every answer says so.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from .config import ModelConfig
from .errors import StoreError
from .layout import RunLayout
from .models import runner
from .models.kinds import kind_of
from .models.sources import file_version, model_identity

__all__ = ["CACHED_BYTES", "CACHED_FEATURES", "FORWARD_COLUMNS", "ExactOnDemand"]

CACHED_FEATURES = 8
"""Features whose recomputed maps are kept in memory (the least recently read goes first)."""
FORWARD_COLUMNS = ("feature_id", "seq_len", "input_ids", "segment_ids")
"""The columns of ``features.parquet`` a forward with attentions reads (:func:`attnclust.models.runner.batch_inputs`,
:func:`attnclust.models.decoder.causal_forward`), and the length the store is checked against."""

CACHED_BYTES = 2 * 1024 ** 3
"""At most this many bytes of recomputed maps are kept (float16); the newest feature's maps are kept whatever
their size."""


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class ExactOnDemand:
    """The exact maps of a compact run's features outside its exact sample, by one forward of the run's model.

    Parameters
    ----------
    layout : RunLayout
        The run directory.
    store : attnclust.store.AttentionStore
        Its attention store, opened.
    enabled : bool
        ``False`` turns recomputing off (the reason then says so).
    note : callable, optional
        Called with one line: when the object is made for a compact store (whether maps are recomputed, and if not
        why), and when the model fails to load on the first feature that needs it.

    Attributes
    ----------
    status : bool or None
        ``True`` when maps outside the exact sample are recomputed, ``False`` when they are not (:attr:`reason`
        says why), ``None`` for a store that holds every map exactly (a full store: nothing to recompute).
    reason : str or None
        Why maps are not recomputed (``status`` is ``False``), in one line.
    model_name : str or None
        The run's recorded ``model.name``.
    """

    def __init__(self, layout: RunLayout, store, *, enabled: bool = True,
                 note: Callable[[str], None] | None = None):
        self.layout = layout
        self.store = store
        self._note = note
        self._lock = threading.Lock()
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self._loaded = None
        self._features = None  # (file signature, ParquetFile, row groups' feature id ranges) of features.parquet
        self.model_name: str | None = None
        self._cfg = None
        self._recorded: str | None = None
        self.reason: str | None = None
        if store.mode != "compact":
            self.status: bool | None = None
            return
        if enabled:
            self._cfg, self.reason = self._run_model()
        else:
            self.reason = "turned off by the caller (exact_on_demand=False)"
        self.status = self._cfg is not None
        self._tell(self.line())

    # -- deciding, cheaply ---------------------------------------------------------------------------
    def _run_model(self):
        """``(model config, None)`` when the run's recorded model is here with its recorded identity, else
        ``(None, reason)``."""

        path = self.layout.stage_record("extract")
        try:
            parts = json.loads(path.read_text())["parts"]
            keys, identity = dict(parts["keys"]), dict(parts["identity"])
        except (OSError, ValueError, KeyError, TypeError):
            return None, (f"the run has no readable record of its extract stage (_state/{path.name}: a store written "
                          f"by another tool?), so the model it was extracted with is not known")
        name, recorded = keys.get("model.name"), identity.get("model_weights")
        if not isinstance(name, str) or not isinstance(recorded, str):
            return None, f"_state/{path.name} records no model name and weights identity"
        self.model_name = name
        try:
            # the kind the store records (a decoder's store says so: ModelKind.store_attrs)
            cfg = ModelConfig(name=name, revision=keys.get("model.revision"), kind=kind_of(self.store).name,
                              gguf_file=identity.get("model.gguf_file"))
            now = model_identity(cfg)
        except (ValueError, OSError) as exc:  # ModelError, ConfigError (ValueErrors) or an unreadable file
            return None, f"the run's model {name!r} is not available here ({_line(exc)})"
        self._recorded = recorded
        if now != recorded:
            return None, self._changed()
        return cfg, None

    def _changed(self) -> str:
        return (f"the run's model {self.model_name!r} changed since the run was extracted (its weights, configuration "
                f"or tokenizer files differ), so it would not give this run's maps")

    def _load(self) -> str | None:
        """Load the run's model for the first map that needs it; ``None``, or why it cannot be used.

        Its identity is asked again right before and right after the load (the files may have changed since the
        explorer started, or while they were read), so the weights loaded are the run's.
        """

        try:
            if model_identity(self._cfg) != self._recorded:
                return self._changed()
            loaded = runner.get_model(self._cfg, device="cpu")
            if model_identity(self._cfg) != self._recorded:
                return self._changed()
        except (ValueError, OSError) as exc:  # ModelError (a ValueError) or a file that went away
            return f"the run's model {self.model_name!r} did not load ({_line(exc)})"
        self._loaded = loaded
        return None

    def line(self) -> str | None:
        """The note for people: whether maps outside the exact sample are recomputed, and if not why; ``None`` for a
        store that holds every map exactly."""
        if self.status is None:
            return None
        if self.status:
            return (f"explore: maps outside the exact sample of this compact store are exact, recomputed on demand by "
                    f"one forward of the run's model {self.model_name!r} on the CPU (loaded on the first such map)")
        return (f"explore: maps outside the exact sample of this compact store are compact (approximate, with the "
                f"share of the row mass they keep), not recomputed: {self.reason}")

    def _tell(self, line: str | None) -> None:
        if line and self._note is not None:
            self._note(line)

    # -- recomputing ---------------------------------------------------------------------------------
    def maps(self, feature: int) -> np.ndarray | None:
        """The exact maps of ``feature``, recomputed by one forward of the run's model (or from the cache).

        Parameters
        ----------
        feature : int
            A feature id of the store.

        Returns
        -------
        numpy.ndarray of float16, shape (layer, head, query, key), or None
            At the feature's true length, cast to float16 as a full store holds them; ``None`` when maps are not
            recomputed (:attr:`status` is not ``True``; a model that fails to load here turns it off, with the
            reason in :attr:`reason` and the note).

        Raises
        ------
        attnclust.errors.StoreError
            The forward does not fit the store (another number of layers or heads, or a shorter feature).
        """
        with self._lock:
            if not self.status:
                return None
            cached = self._cache.get(feature)
            if cached is not None:
                self._cache.move_to_end(feature)
                return cached
            if self._loaded is None:
                why = self._load()
                if why is not None:
                    self.status, self.reason = False, why
                    self._tell(self.line())
                    return None
            maps = self.forward(feature)
            self._cache[feature] = maps
            held = sum(m.nbytes for m in self._cache.values())
            while len(self._cache) > 1 and (len(self._cache) > CACHED_FEATURES or held > CACHED_BYTES):
                held -= self._cache.popitem(last=False)[1].nbytes
            return maps

    def _feature_rows(self, feature: int):
        """The :data:`FORWARD_COLUMNS` of ``feature``'s row(s) of ``features.parquet``, read from the row groups
        whose statistics hold its id (the file's footer is read once per version of the file,
        :func:`~attnclust.models.sources.file_version`; a run rewritten under the explorer is read afresh)."""
        import pyarrow.parquet as pq

        path = self.layout.features
        signature = file_version(path)
        if self._features is None or self._features[0] != signature:
            file = pq.ParquetFile(path)
            column = file.schema_arrow.get_field_index("feature_id")
            ranges = []
            for g in range(file.metadata.num_row_groups):
                stats = file.metadata.row_group(g).column(column).statistics
                ranges.append((stats.min, stats.max) if stats is not None and stats.has_min_max else None)
            self._features = (signature, file, ranges)
        _, file, ranges = self._features
        groups = [g for g, r in enumerate(ranges) if r is None or r[0] <= feature <= r[1]]
        table = file.read_row_groups(groups, columns=list(FORWARD_COLUMNS)).to_pandas()
        return table[table["feature_id"] == feature].reset_index(drop=True)

    def forward(self, feature: int) -> np.ndarray:
        """One forward of the loaded model over ``feature``'s row of ``features.parquet``: its maps, every layer and
        head, float16 (layer, head, query, key) at its true length (no cache; :meth:`maps` caches)."""
        import torch

        loaded, store = self._loaded, self.store
        rows = self._feature_rows(int(feature))
        n = int(store.seq_len[feature])
        if len(rows) != 1 or int(rows["seq_len"].iloc[0]) != n:
            raise StoreError(f"{self.layout.features}: holds {len(rows)} row(s) of feature {feature} where the store "
                             f"has one of {n} tokens; the run changed under the explorer: reload the page")
        if (loaded.num_layers, loaded.num_heads) != (store.n_layers, store.n_heads):
            raise StoreError(f"model {self.model_name!r}: {loaded.num_layers} layers x {loaded.num_heads} heads where "
                             f"the store holds {store.n_layers} x {store.n_heads}; its maps cannot be this run's")
        attn = kind_of(loaded).forward(loaded, rows, device="cpu", attentions=True).attentions  # (1, L, H, q, k)
        if attn.shape[-1] < n:
            raise StoreError(f"model {self.model_name!r}: its forward gave maps of {attn.shape[-1]} keys for feature "
                             f"{feature} of {n} tokens")
        return attn[0, :, :, :n, :n].to(torch.float16).cpu().numpy()  # the cast a full store's shard makes
