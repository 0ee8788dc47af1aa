"""Analyses that run at extraction, with the model, beside each batch's forward: the "extraction" phase of the
analysis protocol (the report-time analyses are :mod:`.plugins`, the per-head ones :mod:`.heads`).

An extraction analysis needs what only the forward has (the hidden states, a projection's output) and the model's
weights, so it cannot run later from the store. It declares beside its code (:func:`extraction_analysis`):

- ``name`` and ``version``: ``{name: version}`` of every analysis that measured the run is part of the extract
  stage's fingerprint (``extraction_analyses``), so a new definition extracts again;
- ``columns``: the per-map statistics it adds to ``map_stats.parquet`` (and so to ``maps.parquet``, the per-head and
  per-cluster means), documented in the outputs reference like every column;
- ``applies(model) -> bool``: whether it can measure this model, read from the run's resolved model
  (:class:`attnclust.models.resolved.ResolvedModel`: kind, heads, whether its value norms are measured), so the
  driver decides without loading the model again; the workers run the driver's list (a family it cannot read is
  extracted without it, and the record says so);
- ``block(store, start, stop, n_layers, n_heads) -> BlockWork``: its work on one extract task's features, made on
  the worker: ``capture(loaded)``, a context manager around each batch's forward that yields what the forward left
  (layer -> tensor (feature, head, key)), ``map(j, row, layer, maps, captured)`` for each feature's maps of one
  layer, returning ``{column: (head,) array}``, and ``finish()`` after the task's last batch (its own store arrays
  written there).

The extract stage runs every registered analysis that applies (:func:`applicable`) instead of naming any; the
conformance suite (``tests/conformance``) checks each: its version in the fingerprint, its columns on a tiny model's
extraction, and nothing of it on a model it does not apply to. The first is what heads move (:mod:`.moved`).

**Per model** (:func:`model_analysis`): an analysis that runs the model on sequences of its own once per run, on the
driver, in the extract stage's finalize (a decoder's induction diagnostic, :mod:`.induction`, and the papers'
protocols, :mod:`.protocols`). It declares its ``name`` and ``version`` (``{name: version}`` join the extract
stage's fingerprint at its top level, with the settings ``identity(cfg)`` adds), ``applies(kind) -> bool`` on the
model's :class:`~attnclust.models.kinds.ModelKind`, the files it writes (``outputs(layout)``: the extract stage's
outputs, removed when it does not apply) and ``run(ctx: ModelContext) -> dict``, the fields it adds to the stage's
record (lists of the same field are joined in run order). The finalize runs every one that applies
(:func:`run_model_analyses`), in registration order, and names none.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

__all__ = ["EXTRACTION_ANALYSES", "MODEL_ANALYSES", "BlockWork", "ExtractionAnalysis", "ModelAnalysis", "ModelContext",
           "applicable", "extraction_analysis", "extraction_versions", "model_analyses", "model_analysis",
           "model_fingerprint", "run_model_analyses"]


class BlockWork(Protocol):
    """One extraction analysis' work on one extract task (see the module docstring)."""

    def capture(self, loaded: Any):  # -> contextlib.AbstractContextManager[dict]
        """Around one batch's forward: yields layer -> tensor (feature, head, key) filled by that forward."""

    def map(self, j: int, row: Any, layer: int, maps: Any, captured: Any) -> dict[str, np.ndarray]:
        """One feature's maps of one layer (``maps`` (head, query, key) at its true length ``n``; ``captured``
        (head, key) padded: crop to ``n``); ``j`` the feature's place in the task, ``row`` its
        ``features.parquet`` row. Returns one (head,) float32 array per declared column."""

    def finish(self) -> None:
        """After the task's last batch."""


@dataclass(frozen=True)
class ExtractionAnalysis:
    """A registered extraction analysis (:func:`extraction_analysis` builds one; the module docstring says what each
    field is for)."""

    name: str
    version: int
    columns: tuple[str, ...]
    description: str
    applies: Callable[[Any], bool]
    block: Callable[..., BlockWork]


EXTRACTION_ANALYSES: dict[str, ExtractionAnalysis] = {}
"""Registered extraction analyses by name, in registration order (the column order of the outputs)."""


def extraction_analysis(name: str, *, version: int, columns: tuple[str, ...], description: str,
                        applies: Callable[[Any], bool]) -> Callable:
    """Decorator registering ``block(store, start, stop, n_layers, n_heads) -> BlockWork`` as the extraction
    analysis ``name``. Registering a name again replaces it.

    Raises
    ------
    ValueError
        A name that is not a lower-case identifier, a version that is not a positive integer, no columns, or a
        column another registered extraction analysis declares.
    """
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(f"extraction analysis name {name!r}: allowed: a lower-case name (letters, digits, '_')")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"extraction analysis {name!r}: version={version!r}; declare a positive integer")
    if not columns:
        raise ValueError(f"extraction analysis {name!r}: declare the map_stats.parquet columns it adds")
    taken = {c: other.name for other in EXTRACTION_ANALYSES.values() if other.name != name for c in other.columns}
    clash = [c for c in columns if c in taken]
    if clash:
        raise ValueError(f"extraction analysis {name!r}: column {clash[0]!r} is declared by {taken[clash[0]]!r}")

    def register(block: Callable[..., BlockWork]) -> Callable[..., BlockWork]:
        EXTRACTION_ANALYSES[name] = ExtractionAnalysis(name=name, version=version, columns=tuple(columns),
                                                       description=description, applies=applies, block=block)
        return block

    return register


def applicable(model: Any) -> tuple[ExtractionAnalysis, ...]:
    """The registered extraction analyses that can measure ``model`` (the run's
    :class:`~attnclust.models.resolved.ResolvedModel`), in registration order."""
    return tuple(a for a in EXTRACTION_ANALYSES.values() if a.applies(model))


def extraction_versions(names) -> dict[str, int]:
    """Name -> version of the named extraction analyses (those that measured a run): part of the extract stage's
    fingerprint."""
    return {name: EXTRACTION_ANALYSES[name].version for name in names}


# -- per model, on the driver -----------------------------------------------------------------------------------

@dataclass
class ModelContext:
    """What a per-model extraction analysis may use (in the extract stage's finalize, on the driver).

    Attributes
    ----------
    layout : attnclust.layout.RunLayout
        The run's files.
    cfg : attnclust.config.JobConfig
        The job.
    device : str
        ``cpu`` or ``cuda``.
    identity : str
        The model's identity as the driver resolved it (the key of the process's model cache:
        ``get_model(cfg.model, identity=identity)``).
    examples : pandas.DataFrame
        ``examples.parquet`` as the stage read it (``context``: the run's natural text).
    note : callable
        Tells the user one line.
    extra : dict
        What the analyses share (:meth:`shared`).
    """

    layout: Any
    cfg: Any
    device: str
    identity: str
    examples: Any
    note: Callable[[str], None] = print
    extra: dict = field(default_factory=dict)

    def shared(self, key: str, compute: Callable[[ModelContext], Any]) -> Any:
        """``compute(self)`` once per context, kept under ``key``: analyses that share one object (the protocols'
        reuse between runs) call it with the same key."""
        if key not in self.extra:
            self.extra[key] = compute(self)
        return self.extra[key]


@dataclass(frozen=True)
class ModelAnalysis:
    """A registered per-model extraction analysis (:func:`model_analysis` builds one; the module docstring says what
    each field is for). ``version`` is an int or a function giving the current one (a version made of a registry's,
    as the protocols' is of their head detectors'): :meth:`current_version`."""

    name: str
    version: int | Callable[[], Any]
    description: str
    applies: Callable[[Any], bool]
    outputs: Callable[[Any], tuple]
    run: Callable[[ModelContext], dict]
    identity: Callable[[Any], dict]

    def current_version(self) -> Any:
        """The version now (``version()`` when it is a function)."""
        return self.version() if callable(self.version) else self.version


MODEL_ANALYSES: dict[str, ModelAnalysis] = {}
"""Registered per-model extraction analyses by name, in registration order (the order the finalize runs them)."""


def model_analysis(name: str, *, version: int | Callable[[], Any], description: str, applies: Callable[[Any], bool],
                   outputs: Callable[[Any], tuple], identity: Callable[[Any], dict] | None = None) -> Callable:
    """Decorator registering ``run(ctx: ModelContext) -> dict`` as the per-model extraction analysis ``name``.
    Registering a name again replaces it.

    Parameters
    ----------
    name
        A lower-case identifier: its key in the extract stage's fingerprint.
    version
        A positive integer, or a function giving the current version (bump it when the files' numbers change).
    description
        What it measures, in a sentence.
    applies
        ``applies(kind) -> bool`` on the model's :class:`~attnclust.models.kinds.ModelKind`.
    outputs
        ``outputs(layout) -> tuple of paths``: the files it writes (none of another's).
    identity
        ``identity(cfg) -> dict``: settings of the job it reads, added to the fingerprint where it applies (leave
        a default out, so that runs before the setting keep their fingerprint).

    Raises
    ------
    ValueError
        A name that is not a lower-case identifier or is a per-block analysis', an int version that is not
        positive, no description.
    """
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", name) or name in EXTRACTION_ANALYSES:
        raise ValueError(f"extraction analysis name {name!r}: allowed: a lower-case name (letters, digits, '_') that "
                         f"no other extraction analysis has")
    if not callable(version) and (isinstance(version, bool) or not isinstance(version, int) or version < 1):
        raise ValueError(f"extraction analysis {name!r}: version={version!r}; declare a positive integer")
    if not isinstance(description, str) or not description.strip():
        raise ValueError(f"extraction analysis {name!r}: declare a description")

    def register(run: Callable[[ModelContext], dict]) -> Callable[[ModelContext], dict]:
        MODEL_ANALYSES[name] = ModelAnalysis(name=name, version=version, description=description.strip(),
                                             applies=applies, outputs=outputs, run=run,
                                             identity=identity or (lambda cfg: {}))
        return run

    return register


def model_analyses(kind: Any) -> tuple[ModelAnalysis, ...]:
    """The registered per-model analyses that apply to a model of this kind, in registration order."""
    return tuple(a for a in MODEL_ANALYSES.values() if a.applies(kind))


def model_fingerprint(kind: Any, cfg: Any) -> dict:
    """What the per-model analyses that apply add to the extract stage's fingerprint: ``{name: version}`` of each
    and the settings each reads (its ``identity(cfg)``)."""
    out: dict = {}
    for analysis in model_analyses(kind):
        out[analysis.name] = analysis.current_version()
        out.update(analysis.identity(cfg))
    return out


def run_model_analyses(ctx: ModelContext, kind: Any) -> dict:
    """Run every per-model analysis that applies, in registration order, and remove the files of those that do not
    (a run extracted before with another model).

    Returns
    -------
    dict
        The fields the analyses add to the extract stage's record; a list field several give is joined in run order.
    """
    record: dict = {}
    for analysis in MODEL_ANALYSES.values():
        if not analysis.applies(kind):
            ctx.layout.remove(*analysis.outputs(ctx.layout))
            continue
        for key, value in (analysis.run(ctx) or {}).items():
            record[key] = [*record.get(key, []), *value] if isinstance(value, list) else value
    return record
