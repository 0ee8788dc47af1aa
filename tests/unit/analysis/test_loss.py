"""What goes with the model's loss (issue 50, item 3): the window loss against a loop over a plain forward, the rank
association against scipy's Kruskal-Wallis H, and planted windows where one head's mode sets the loss and where
none does."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import kruskal

from attnclust.analysis.loss import LOSS_COLUMNS, loss_association, loss_table, window_losses


def test_window_loss_is_the_mean_negative_log_probability_after_the_first_token():
    rng = np.random.default_rng(0)
    logp = [np.r_[0.0, -rng.exponential(2.0, n - 1)].astype(np.float32) for n in (5, 9, 1)]
    hits = [np.r_[0.0, rng.integers(0, 2, n - 1)].astype(np.float32) for n in (5, 9, 1)]
    qa = pd.DataFrame({"feature_id": [2, 0, 1], "token_logprobs": logp, "token_top1": hits})
    features = pd.DataFrame({"feature_id": [0, 1, 2], "example_id": ["a", "a", "b"], "span": [0, 1, 0]})
    out = window_losses(qa, features)
    assert out["feature_id"].tolist() == [0, 2]  # feature 1 has one token: nothing to score
    for row in out.itertuples():
        i = [2, 0, 1].index(row.feature_id)
        total, hit = 0.0, 0.0
        for t in range(1, len(logp[i])):  # a loop over the scored tokens
            total -= float(logp[i][t])
            hit += float(hits[i][t])
        assert row.tokens == len(logp[i]) - 1
        assert row.loss == pytest.approx(total / row.tokens) and row.top1 == pytest.approx(hit / row.tokens)
    assert window_losses(qa.drop(columns="token_top1"), features)["top1"].isna().all()  # an older run


@pytest.mark.parametrize("k", [2, 3, 4])
def test_the_association_is_kruskal_wallis_h_over_n_minus_1(k):
    rng = np.random.default_rng(k)
    n = 60
    modes = rng.integers(0, k, n)
    loss = rng.normal(size=n) + 0.5 * modes
    ranks = pd.Series(loss).rank().to_numpy()
    h = kruskal(*[loss[modes == m] for m in range(k)]).statistic
    assert loss_association(modes, ranks[None])[0] ** 2 == pytest.approx(h / (n - 1), rel=1e-9)
    assert loss_association(np.zeros(n, np.int64), ranks[None])[0] == pytest.approx(0.0, abs=1e-9)


def planted(determines: bool, n: int = 80, seed: int = 0):
    """Two heads' window vectors in two well separated modes; with ``determines`` head (0, 1)'s mode sets the
    loss (low in mode 0, high in mode 1), otherwise the loss is independent of every mode."""
    rng = np.random.default_rng(seed)
    vectors = np.empty((n, 1, 2, 3))
    loss = rng.normal(3.0, 0.3, n)
    for head in range(2):
        mode = rng.integers(0, 2, n)
        vectors[:, 0, head] = mode[:, None] * 5.0 + rng.normal(0, 0.2, (n, 3))
        if determines and head == 1:
            loss = np.where(mode == 1, loss + 1.5, loss)
    return vectors, loss


def test_a_head_whose_mode_sets_the_loss_is_found_and_only_it():
    vectors, loss = planted(True)
    table = loss_table(vectors, loss, permutations=499)
    assert list(table.columns) == ["layer", "head", *LOSS_COLUMNS]
    found = table[table["loss_q"] < 0.05]
    assert found[["layer", "head"]].values.tolist() == [[0, 1]]
    row = found.iloc[0]
    assert row["loss_mode_k"] == 2 and row["loss_rho"] > 0.7 and row["loss_high"] - row["loss_low"] > 1.0


def test_no_head_is_found_when_no_mode_sets_the_loss():
    vectors, loss = planted(False)
    table = loss_table(vectors, loss, permutations=499)
    assert (table["loss_q"] >= 0.05).all() and (table["loss_rho"] < 0.4).all()
