"""The moved-norm statistics the extract stage stores (issue 52): for each feature and layer, what a plain forward of
that feature alone gives (its attention and its value norms, each checked against the paper elsewhere) read by
:func:`attnclust.analysis.moved.moved_statistics`; a family whose value projection is unknown is extracted without
them; the report shows the weight beside the moved norm."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnclust.analysis.moved import MOVED_COLUMNS, moved_statistics
from attnclust.config import ModelConfig
from attnclust.layout import RunLayout
from attnclust.maps.tokens import token_masks
from attnclust.models import get_model
from attnclust.models.value_norms import capture_value_norms


def extract(data, out, model, *more) -> None:
    from attnclust.cli import main

    assert main(["extract", "--data", str(data), "--out", str(out), "--set", f"model.name={model}",
                 "--set", "extract.batch_size=3", "--quiet", *more]) == 0


def expected(loaded, rows: pd.DataFrame) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """(layer, head) per moved statistic of one feature (``rows``: its one row) from its own forward, as the model's
    kind builds it (token types, positions), without padding; and its norms (layer, head, key)."""
    from attnclust.models.kinds import kind_of

    row = next(rows.itertuples())
    with capture_value_norms(loaded.model, loaded.num_layers, loaded.num_heads) as norms:
        attn = kind_of(loaded).forward(loaded, rows, attentions=True).attentions[0]  # (layer, head, query, key)
    sep, punct, _ = token_masks(list(row.tokens), list(row.segment_ids))
    per_layer = [moved_statistics(attn[layer], norms[layer][0], sep=sep, punct=punct)
                 for layer in range(loaded.num_layers)]
    stacked = np.stack([norms[layer][0].float().numpy() for layer in range(loaded.num_layers)])
    return {c: np.stack([p[c] for p in per_layer]) for c in MOVED_COLUMNS}, stacked


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["bert", "roberta", "gpt2", "llama"])
def test_stored_moved_statistics_and_norms_are_a_plain_forwards(tmp_path, tiny_bert_dir, family_model, small_squad,
                                                                 arch):
    from attnclust.store import open_attention_store

    from helpers import save_tiny_causal

    model = {"bert": lambda: tiny_bert_dir, "roberta": lambda: family_model("roberta"),
             "gpt2": lambda: save_tiny_causal(tmp_path / "gpt2", arch="gpt2"),
             "llama": lambda: save_tiny_causal(tmp_path / "llama")}[arch]()
    out = tmp_path / "run"
    more = ["--set", "extract.max_new_tokens=3", "--set", "extract.needle_lengths=0"] if arch in ("gpt2", "llama") \
        else []  # the needle test: test_needle_retrieval's
    extract(small_squad, out, model, *more)
    layout = RunLayout(out)
    stats = pd.read_parquet(layout.map_stats)
    assert set(MOVED_COLUMNS) <= set(stats.columns)
    features = pd.read_parquet(layout.features)
    store = open_attention_store(layout.attention)
    loaded = get_model(ModelConfig(name=str(model)))
    ordered = features.sort_values("seq_len")
    tolerance = store.norm_code.relative_error
    for i in (0, len(ordered) - 1):  # the shortest and the longest feature, each padded in its batch
        rows = ordered.iloc[[i]]
        feature = int(rows["feature_id"].iloc[0])
        want, norms = expected(loaded, rows)
        got = stats[stats["feature_id"] == feature].sort_values(["layer", "head"])
        for c in MOVED_COLUMNS:
            np.testing.assert_allclose(got[c].to_numpy().reshape(want[c].shape), want[c], rtol=2e-4, atol=2e-5,
                                       err_msg=c)
        # the stored norms: the forward's, each within the code's relative error (none of these is below its floor)
        assert norms.min() > 0
        for layer in range(loaded.num_layers):
            for head in range(loaded.num_heads):
                stored = store.read_value_norms(feature, layer, head)
                assert stored.shape == (int(rows["seq_len"].iloc[0]),)
                np.testing.assert_allclose(stored, norms[layer, head], rtol=tolerance * 1.01 + 1e-3)


@pytest.mark.slow
def test_a_family_without_a_known_value_projection_is_extracted_without_them(tmp_path, family_model, small_squad):
    out = tmp_path / "run"
    extract(small_squad, out, family_model("deberta-v2"))
    stats = pd.read_parquet(RunLayout(out).map_stats)
    assert not set(MOVED_COLUMNS) & set(stats.columns) and "to_cls" in stats.columns
    from attnclust.store import open_attention_store

    store = open_attention_store(RunLayout(out).attention)
    assert store.value_norm is None and store.read_value_norms(0, 0, 0) is None
