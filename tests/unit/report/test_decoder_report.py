"""The report of a decoder: the grid by key/value group of a model with grouped key/value heads, cluster tables
without the statistics a causal map cannot show."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnclust.models.kinds import DECODER
from attnclust.report import ReportInputs
from attnclust.report.sections.common import cluster_stats
from attnclust.report.sections.grid import grid, kv_group_table

from helpers import synthetic_report_inputs


def heads_table(layers: int, n_heads: int, k: int, rng) -> pd.DataFrame:
    rows = []
    for layer in range(layers):
        for head in range(n_heads):
            shares = rng.dirichlet(np.full(k, 0.3))
            rows.append({"layer": layer, "head": head, "n_maps": int(rng.integers(1, 30)),
                         "dominant_cluster": int(shares.argmax()), "purity": float(shares.max()),
                         **{f"share_{c}": float(s) for c, s in enumerate(shares)}})
    return pd.DataFrame(rows)


def test_kv_groups_sum_the_maps_of_their_query_heads():
    rng = np.random.default_rng(0)
    heads = heads_table(3, 6, 4, rng)
    table = kv_group_table(heads, 2).set_index(["layer", "group"])
    assert len(table) == 3 * 2
    for layer in range(3):
        for group in range(2):
            members = heads[(heads["layer"] == layer) & (heads["head"] // 3 == group)]
            counts = np.zeros(4)
            for r in members.itertuples():  # brute force: each head's maps in each cluster
                counts += np.array([getattr(r, f"share_{c}") for c in range(4)]) * r.n_maps
            row = table.loc[(layer, group)]
            assert row["dominant_cluster"] == counts.argmax()
            assert row["purity"] == pytest.approx(counts.max() / counts.sum())
            assert (row["first_head"], row["last_head"]) == (3 * group, 3 * group + 2)


@pytest.mark.parametrize("kv", [None, 6, 4, 12])
def test_no_kv_groups_without_grouped_heads(kv):
    heads = heads_table(2, 6, 3, np.random.default_rng(1))
    assert kv_group_table(heads, kv) is None  # none given, one per query head, not a divisor, more than heads


def test_the_grid_draws_the_kv_groups_only_for_grouped_heads():
    from attnclust.report.registry import environment

    base = synthetic_report_inputs()  # 2 layers x 4 heads
    plain = grid(base)
    assert plain["kv"] is None
    grouped = ReportInputs(**{**base.__dict__, "kv_heads": 2})
    context = grid(grouped)
    kv = context["kv"]
    assert kv["groups"] == [0, 1] and kv["size"] == 2 and len(kv["rows"]) == 2
    html = environment().get_template("grid.html.j2").render(context)
    assert html.count('class="gcell kvcell"') == 4 and "By key/value group: 2 query heads share each" in html
    assert "kv-grid" not in environment().get_template("grid.html.j2").render(plain)
    with pytest.raises(Exception, match="kv_heads: got 0; expected a positive integer"):
        ReportInputs(**{**base.__dict__, "kv_heads": 0})


def test_a_decoders_cluster_tables_leave_out_the_next_token_and_sep():
    base = synthetic_report_inputs()
    clusters = base.clusters
    encoder = [s["name"] for s in cluster_stats(clusters)]
    decoder = [s["name"] for s in cluster_stats(clusters, DECODER)]
    assert {"to_next", "to_sep"} <= set(encoder)
    assert not {"to_next", "to_sep"} & set(decoder) and set(decoder) < set(encoder)
    from attnclust.report.sections.stats import stats_table

    causal = ReportInputs(**{**base.__dict__, "kind": DECODER})
    assert "to_next" in stats_table(base)["columns"] and "to_next" not in stats_table(causal)["columns"]
