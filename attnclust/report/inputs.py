"""What the report shows: :class:`ReportInputs`, checked on construction."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..analysis.plugins import ANALYSES
from ..errors import DataError
from ..models.kinds import ENCODER, ModelKind

__all__ = ["CLUSTER_COLUMNS", "HEAD_COLUMNS", "MAP_COLUMNS", "PREDICTION_COLUMNS", "ReportInputs"]

MAP_COLUMNS = ("feature_id", "example_id", "layer", "head", "cluster", "umap_x", "umap_y")
"""Columns the maps table must have."""
HEAD_COLUMNS = ("layer", "head", "dominant_cluster", "purity")
"""Columns the heads table must have."""
CLUSTER_COLUMNS = ("cluster", "size", "share", "description", "top_heads")
"""Columns the clusters table must have."""
PREDICTION_COLUMNS = ("example_id", "question", "prediction", "gold_answers", "is_impossible", "null_odds",
                      "exact", "f1")
"""Columns the predictions table must have."""


@dataclass(frozen=True, kw_only=True)
class ReportInputs:
    """Everything the report of one run shows; checked on construction.

    Parameters
    ----------
    title : str
        Heading of the report.
    maps : pandas.DataFrame
        One row per (feature, layer, head): ``feature_id``, ``example_id``, ``layer``, ``head``, ``cluster``,
        ``umap_x``, ``umap_y`` (all NaN when UMAP was off) and usually a column per registered statistic
        (:func:`attnclust.maps.stats.stat_columns`).
    heads : pandas.DataFrame
        One row per (layer, head): ``layer``, ``head``, ``dominant_cluster``, ``purity`` (0..1), the statistics'
        means and the columns of the registered head analyses (:data:`attnclust.analysis.heads.HEAD_ANALYSES`).
    clusters : pandas.DataFrame
        One row per cluster: ``cluster`` (the ids ``0 .. n_clusters-1``), ``size``, ``share``, ``description``,
        ``top_heads``; optionally ``medoid_feature_id``, ``medoid_layer``, ``medoid_head``, ``mean_layer``, the
        registered statistics (means over the cluster), ``pattern_type`` (shown on the cards), the length view
        (``len_lt64`` ... ``len_ge256``, ``seq_len_median``, ``length_warning``) and ``stability`` / ``stable``
        (clusters with ``stable`` false are flagged "unstable: not a finding" and listed last).
    mean_maps : numpy.ndarray, shape (cluster, query, key) = (n_clusters, G, G)
        Each cluster's average row-normalised map, indexed by cluster id.
    medoids : dict of int to (numpy.ndarray, list of str)
        Cluster id -> (medoid map of shape (query, key) = (n, n), its n tokens). Clusters may be missing.
    settings : dict
        The resolved job configuration (nested) plus timings etc.; shown as YAML.
    notes : tuple of str, optional
        Warnings shown prominently at the top.
    k_scores : dict of int to float, optional
        The score of each candidate k when k was chosen automatically.
    k_score_name : str, optional
        What ``k_scores`` measure (``split-half stability (median ARI)``, or ``silhouette`` for a run whose
        clustering record holds no stability per k).
    max_tokens_shown : int, optional
        Medoid maps are cropped to their first this many tokens.
    qa : dict, optional
        ``qa_scores.json`` of the run: ``head_trained``, ``scores`` (official SQuAD 2.0 fields), ``settings``
        (``null_threshold`` ...), ``note`` and optionally ``threshold_search`` (``best_*`` over the best spans).
    predictions : pandas.DataFrame, optional
        ``predictions.parquet``: ``example_id``, ``question``, ``prediction``, ``gold_answers``,
        ``is_impossible``, ``null_odds``, ``exact``, ``f1``.
    analyses : dict of str to object, optional
        The results of the analysis plugins by name (:func:`attnclust.analysis.plugins.run_analyses`), each read
        by its report section and checked by its plugin's ``validate``: ``head_distances`` (``head_layout.parquet``,
        :func:`attnclust.analysis.distances.head_layout_table`: ``layer``, ``head``, ``x``, ``y`` ...; the head
        map), ``importance`` (``{"importance": ..., "pruning": pruning.parquet}``: ``fraction``, ``n_removed``,
        ``order``, ``seed``, ``f1``, ``exact``), ``syntax`` (``syntax.parquet``,
        :func:`attnclust.analysis.syntax.syntax_table`), ``probe`` (``probes.parquet``,
        :func:`attnclust.analysis.probes.probe_table`, its summary in ``attrs["summary"]``). An analysis missing
        here has no result this run.
    explorer : dict, optional
        The interactive page's sampled maps (:func:`attnclust.report.interactive.build_explorer`): the head
        panels' example maps, the UMAP sample and the per-question view; without it the grid's head panels show
        the heads table only and the question view is left out.
    kind : attnclust.models.kinds.ModelKind, optional
        The run's model kind: a decoder's leaves the statistics it cannot show as behaviour (the next token, [SEP]:
        :meth:`~attnclust.models.kinds.ModelKind.shown_statistics`) out of the cluster cards and tables.
    kv_heads : int, optional
        Key/value heads per layer of a model with grouped key/value heads (fewer than its query heads, a divisor
        of them): the grid can also be drawn by key/value group. ``None``: one per query head.

    Raises
    ------
    attnclust.errors.DataError
        A table lacks a column, ``mean_maps`` does not match the clusters table, a medoid's map and tokens
        disagree, or ``max_tokens_shown`` is not a positive integer.
    """

    title: str
    maps: pd.DataFrame
    heads: pd.DataFrame
    clusters: pd.DataFrame
    mean_maps: np.ndarray
    medoids: dict[int, tuple[np.ndarray, list[str]]]
    settings: dict
    notes: tuple[str, ...] = ()
    k_scores: dict[int, float] | None = None
    k_score_name: str = "silhouette"
    max_tokens_shown: int = 64
    qa: dict | None = None
    predictions: pd.DataFrame | None = None
    analyses: dict[str, Any] = field(default_factory=dict)
    explorer: dict | None = None
    kind: ModelKind = ENCODER
    kv_heads: int | None = None

    def __post_init__(self) -> None:
        for name, table, cols in (("maps", self.maps, MAP_COLUMNS), ("heads", self.heads, HEAD_COLUMNS),
                                  ("clusters", self.clusters, CLUSTER_COLUMNS)):
            if not isinstance(table, pd.DataFrame):
                raise DataError(f"report input {name}: expected a pandas DataFrame, got {type(table).__name__}")
            missing = [c for c in cols if c not in table.columns]
            if missing:
                raise DataError(f"report input {name}: missing column(s) {', '.join(missing)}; "
                                f"required: {', '.join(cols)}")
        mm = np.asarray(self.mean_maps)
        if mm.ndim != 3 or mm.shape[1] != mm.shape[2]:
            raise DataError(f"report input mean_maps: shape {mm.shape}; expected (n_clusters, G, G), one square "
                            "map per cluster")
        k = len(self.clusters)
        if mm.shape[0] != k:
            raise DataError(f"report input mean_maps holds {mm.shape[0]} maps but the clusters table has {k} "
                            "rows; pass one mean map per cluster, indexed by cluster id")
        ids = self.clusters["cluster"].to_numpy()
        if sorted(ids.tolist()) != list(range(k)):
            raise DataError(f"report input clusters.cluster: got ids {sorted(ids.tolist())[:10]}; expected each of "
                            f"0..{k - 1} once (mean_maps is indexed by cluster id)")
        if self.heads.duplicated(["layer", "head"]).any():
            dup = self.heads.loc[self.heads.duplicated(["layer", "head"]), ["layer", "head"]].iloc[0]
            raise DataError(f"report input heads: (layer {dup['layer']}, head {dup['head']}) appears more than "
                            "once; expected one row per (layer, head)")
        for cid, value in self.medoids.items():
            if not (isinstance(value, tuple) and len(value) == 2):
                raise DataError(f"report input medoids[{cid!r}]: expected a (map, tokens) pair")
            if cid not in set(ids.tolist()):
                raise DataError(f"report input medoids: cluster {cid!r} is not in the clusters table (0..{k - 1})")
            m = np.asarray(value[0])
            if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] != len(value[1]):
                raise DataError(f"report input medoids[{cid}]: map shape {m.shape} with {len(value[1])} tokens; "
                                "expected an (n, n) map and n tokens")
        if self.kv_heads is not None and (isinstance(self.kv_heads, bool) or not isinstance(self.kv_heads, int)
                                          or self.kv_heads < 1):
            raise DataError(f"report input kv_heads: got {self.kv_heads!r}; expected a positive integer (key/value "
                            f"heads per layer) or None")
        if self.qa is not None and not {"head_trained", "scores", "note"} <= set(self.qa):
            raise DataError("report input qa: expected the qa_scores.json mapping with head_trained, scores, note")
        if self.predictions is not None:
            missing = [c for c in PREDICTION_COLUMNS if c not in self.predictions.columns]
            if missing:
                raise DataError(f"report input predictions: missing column(s) {', '.join(missing)}; "
                                f"required: {', '.join(PREDICTION_COLUMNS)}")
        if not isinstance(self.analyses, dict):
            raise DataError(f"report input analyses: expected a dict of analysis name -> result, got "
                            f"{type(self.analyses).__name__}")

        for name, result in self.analyses.items():  # each analysis checks what its section reads
            plugin = ANALYSES.get(name)
            if plugin is not None and plugin.validate is not None and result is not None:
                plugin.validate(result)
        if self.explorer is not None and not (isinstance(self.explorer, dict)
                                              and {"questions", "head_examples", "umap"} <= set(self.explorer)):
            raise DataError("report input explorer: expected the mapping of attnclust.report.interactive."
                            "build_explorer (questions, head_examples, umap)")
        if isinstance(self.notes, str):
            raise DataError("report input notes: got a single string; pass a tuple of strings, e.g. (note,)")
        if isinstance(self.max_tokens_shown, bool) or not isinstance(self.max_tokens_shown, (int, np.integer)) \
                or self.max_tokens_shown < 1:
            raise DataError(f"report input max_tokens_shown: got {self.max_tokens_shown!r}; allowed: an integer >= 1")
