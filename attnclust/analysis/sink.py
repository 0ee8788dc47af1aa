"""The attention sink: heads that park their attention on the first token (Xiao et al. 2023, StreamingLLM).

A head's ``sink_mass`` is its mean first-token mass over all its maps (the ``to_cls`` statistic: the mean over
query rows of the weight on token 0, [CLS] in an encoder, the first prompt token in a decoder); the head is a
``sink`` when that mass exceeds :data:`SINK_THRESHOLD` (0.3), the threshold of Gu et al. (2025), whose *sink
rate* is the share of a model's heads that are sinks (70% for GPT-2 XL to 91% for Llama-3-8B on random tokens).
A threshold, not a test: a uniform causal row already puts ``1 / (i + 1)`` on the first token, so on short maps a
uniform decoder head is near it (mean ``H_n / n``, 0.17 at 20 tokens, 0.02 at 400); the ``cls`` role
(:mod:`attnclust.analysis.roles`) tests the lift over that null. Gu et al.'s sink rate under their own protocol
(64-token natural, random and repeated sequences) is a diagnostic of the extract stage:
:mod:`attnclust.analysis.protocols`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..errors import DataError
from .heads import HeadContext, head_analysis

__all__ = ["SINK_THRESHOLD", "sink_table"]

SINK_THRESHOLD = 0.3
"""A head is a sink when its mean first-token mass exceeds this (Gu et al. 2025)."""


def sink_table(maps: pd.DataFrame, *, threshold: float = SINK_THRESHOLD) -> pd.DataFrame:
    """Each head's mean first-token mass and whether it is a sink.

    Parameters
    ----------
    maps : pandas.DataFrame
        One row per (feature, layer, head) with ``to_cls`` (the first token's mass, averaged over query rows).
    threshold
        :data:`SINK_THRESHOLD`.

    Returns
    -------
    pandas.DataFrame
        One row per (``layer``, ``head``): ``sink_mass`` (float64, the mean of ``to_cls`` over the head's maps)
        and ``sink`` (bool, ``sink_mass > threshold``).

    Raises
    ------
    attnclust.errors.DataError
        ``maps`` lacks ``to_cls``.
    """
    missing = [c for c in ("layer", "head", "to_cls") if c not in maps.columns]
    if missing:
        raise DataError(f"sink: the maps table lacks column(s) {', '.join(missing)}; re-run the report stage with "
                        f"--force")
    out = maps.groupby(["layer", "head"], sort=True)["to_cls"].mean().astype(np.float64).rename("sink_mass")
    out = out.reset_index()
    out["sink"] = out["sink_mass"].to_numpy() > threshold
    return out


@head_analysis("sink", columns=("sink_mass", "sink"), unit="share",
               description=f"mean attention mass on the first token over the head's maps; sink = above "
                           f"{SINK_THRESHOLD:g} (Gu et al. 2025; the attention sink of Xiao et al. 2023)")
def _sink(ctx: HeadContext) -> pd.DataFrame:
    return sink_table(ctx.maps)
