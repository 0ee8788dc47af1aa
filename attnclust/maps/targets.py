"""What a cluster of maps is named after: the targets of a row that sees every key (an encoder's) and of a row that
sees only the keys up to its query (a decoder's, causal).

A model kind holds one of the two (:attr:`attnclust.models.kinds.ModelKind.targets`), and the cluster names
(:mod:`attnclust.analysis.naming`) ask it instead of asking which kind the model is:

- which statistics are the vertical targets (fixed key positions), the diagonal ones (keys chosen by their offset or
  their text) and the ones that tell two alike clusters apart, each with its name in a description;
- what the thresholds read: an encoder's shares as they are; for causal rows, each target's lift over what the
  causal uniform row scores on it, ``(x - chance) / (1 - chance)`` (:meth:`CausalRowTargets.judged`), because a
  causal uniform row already puts ``H_n / n`` on the first token;
- how a local band is described (``±2 tokens``, or ``the 2 tokens before``: a causal query sees no later token).

Here, with the statistics they name, so that the kinds (``models/``) and the names (``analysis/``) read one table.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pandas as pd

from .stats import causal_uniform_scores

__all__ = ["CAUSAL_ROWS", "CAUSAL_TARGETS", "DIAGONAL_TARGETS", "FULL_ROWS", "SEPARATING", "VERTICAL_TARGETS",
           "CausalRowTargets", "FullRowTargets", "finite"]

Targets = tuple[tuple[str, str], ...]
"""``(statistic, its name in a description)`` pairs."""

VERTICAL_TARGETS: Targets = (("to_cls", "[CLS]"), ("to_sep", "[SEP]"), ("to_punct", "punctuation"))
"""Fixed key positions: the statistics whose sum is a cluster's vertical mass, and their names in descriptions."""
DIAGONAL_TARGETS: Targets = (("to_prev", "previous token"), ("to_self", "itself"), ("to_next", "next token"))
"""Offsets -1, 0, +1: the statistics whose sum is a cluster's diagonal mass, and their names."""
SEPARATING: Targets = (("to_cls", "[CLS]"), ("to_sep", "[SEP]"), ("to_punct", "punctuation"),
                       ("to_prev", "previous token"), ("to_self", "itself"), ("to_next", "next token"),
                       ("to_local", "nearby tokens"), ("own_segment", "own segment"), ("entropy_norm", "spread"),
                       ("confidence", "peak weight"))
"""Statistics (all in 0..1) that tell two clusters with the same description apart, and their names."""
CAUSAL_TARGETS: dict[str, Targets] = {
    "vertical": (("to_cls", "first-token sink"), ("to_punct", "punctuation")),
    "diagonal": (("to_prev", "previous token"), ("to_self", "itself"), ("to_induction", "induction-like"),
                 ("to_duplicate", "duplicate token")),
    "separating": (("to_cls", "first-token sink"), ("to_punct", "punctuation"), ("to_prev", "previous token"),
                   ("to_self", "itself"), ("to_induction", "induction-like"), ("to_duplicate", "duplicate token"),
                   ("to_local", "nearby tokens"), ("own_segment", "own segment"), ("entropy_norm", "spread"),
                   ("confidence", "peak weight")),
}
"""A causal model's targets and their names: fixed key positions (``vertical``), the tokens chosen by their place or
their text (``diagonal``: the previous token, the token itself, and the stripes a repeated text draws, induction and
duplicate token, Kovaleva et al.'s diagonal shifted by the repeat), and the statistics that tell alike clusters
apart. The next token and [SEP] are left out: no causal row sees a later token, and a decoder's prompt has no
separator token."""

_NOT_LIFTED = ("own_segment", "entropy_norm", "confidence")
"""Separating statistics that are not a share of mass on a target: never read as a lift over chance."""


def finite(x) -> bool:
    """``x`` is a number, neither ``None`` nor NaN nor infinite (a statistic a description can quote)."""
    return x is not None and bool(np.isfinite(x))


class FullRowTargets:
    """The targets of rows that see every key (an encoder's maps): :data:`VERTICAL_TARGETS`,
    :data:`DIAGONAL_TARGETS`, :data:`SEPARATING`; the thresholds read the means as they are."""

    vertical: ClassVar[Targets] = VERTICAL_TARGETS
    diagonal: ClassVar[Targets] = DIAGONAL_TARGETS
    separating: ClassVar[Targets] = SEPARATING
    local_window: ClassVar[str] = "±2 tokens"
    """The band a ``local`` cluster's description names."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def chances(self, features: pd.DataFrame) -> pd.DataFrame | None:
        """Per feature, the baseline of each share statistic that the names read a lift over: none (a row that sees
        every key puts on a target the share of the keys it holds, and the thresholds are set on shares)."""
        return None

    def complete(self, means):
        """``means`` (a cluster's Series, or a DataFrame of clusters) with what the names read: as they are."""
        return means

    def complete_clusters(self, means: pd.DataFrame, clusters: list[int]) -> pd.DataFrame:
        """:meth:`complete` for a run's non-empty ``clusters`` (rows of ``means``): as they are."""
        return means

    def judged(self, means: pd.Series) -> pd.Series:
        """The values the names' thresholds read for one cluster: ``means`` itself."""
        return means

    def judged_table(self, means: pd.DataFrame) -> pd.DataFrame:
        """:meth:`judged` of every row of ``means``: ``means`` itself."""
        return means

    def shares(self, means: pd.Series) -> pd.Series | None:
        """The shares a description prints beside its named targets when they differ from what was judged: none
        (the judged values are the shares)."""
        return None


class CausalRowTargets(FullRowTargets):
    """The targets of rows that see only the keys up to their query (a decoder's maps): :data:`CAUSAL_TARGETS`;
    the thresholds read each target's lift over its ``<statistic>_chance`` baseline where the means carry one."""

    vertical: ClassVar[Targets] = CAUSAL_TARGETS["vertical"]
    diagonal: ClassVar[Targets] = CAUSAL_TARGETS["diagonal"]
    separating: ClassVar[Targets] = CAUSAL_TARGETS["separating"]
    local_window: ClassVar[str] = "the 2 tokens before"

    def chances(self, features: pd.DataFrame) -> pd.DataFrame | None:
        """Per feature, what the causal uniform map scores on each share statistic
        (:func:`attnclust.maps.stats.causal_uniform_scores`): the baselines of a causal model's cluster names.

        Parameters
        ----------
        features : pandas.DataFrame
            ``feature_id``, ``tokens`` and optionally ``segment_ids``.

        Returns
        -------
        pandas.DataFrame or None
            float64 indexed by ``feature_id``, one column per statistic; None when ``features`` has no ``tokens``.
        """
        if "tokens" not in features.columns:
            return None
        segments = features["segment_ids"] if "segment_ids" in features.columns else [None] * len(features)
        rows = [causal_uniform_scores(list(t), s) for t, s in zip(features["tokens"], segments)]
        return pd.DataFrame(rows, index=features["feature_id"].to_numpy(np.int64), dtype=np.float64)

    def complete(self, means):
        """A copy of ``means`` with every target it lacks as 0 (the means of a run before the induction and
        duplicate-token statistics)."""
        targets = [c for c, _ in self.separating]
        have = means.index if isinstance(means, pd.Series) else means.columns
        missing = [c for c in targets if c not in have]
        if not missing:
            return means.copy()
        if isinstance(means, pd.Series):
            return pd.concat([means, pd.Series(0.0, index=missing)])
        return means.assign(**dict.fromkeys(missing, 0.0))

    def complete_clusters(self, means: pd.DataFrame, clusters: list[int]) -> pd.DataFrame:
        """:meth:`complete`, and the induction and duplicate-token means of ``clusters`` that are NaN as 0: a
        cluster none of whose maps has a repeated token puts no mass there."""
        means = self.complete(means)
        for col in ("to_induction", "to_duplicate"):
            if col in means.columns:
                means.loc[clusters, col] = means.loc[clusters, col].fillna(0.0)
        return means

    def judged(self, means: pd.Series) -> pd.Series:
        """A copy of ``means`` (:meth:`complete`) with each share target's lift over its baseline, ``(x - chance) /
        (1 - chance)`` clipped to 0..1, where ``means`` has ``<statistic>_chance``; a target's NaN (no map of the
        cluster had one, e.g. no repeated token) read as 0."""
        out = self.complete(means)
        for c, _ in self.separating:
            if c in _NOT_LIFTED:
                continue
            x = float(out[c]) if finite(out[c]) else 0.0
            chance = out.get(f"{c}_chance", np.nan)
            if finite(chance) and chance < 1.0:
                x = min(1.0, max(0.0, (x - float(chance)) / (1.0 - float(chance))))
            out[c] = x
        return out

    def judged_table(self, means: pd.DataFrame) -> pd.DataFrame:
        """:meth:`judged` of every row of ``means``."""
        return pd.DataFrame([self.judged(means.loc[c]) for c in means.index], index=means.index)

    def shares(self, means: pd.Series) -> pd.Series:
        """The shares beside the judged lifts: ``means`` with NaN as 0."""
        return means.fillna(0.0)


FULL_ROWS = FullRowTargets()
"""An encoder's targets."""
CAUSAL_ROWS = CausalRowTargets()
"""A decoder's targets."""
