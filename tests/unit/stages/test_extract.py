import numpy as np
import pandas as pd
import pytest

from attnclust.config import JobConfig
from attnclust.layout import RunLayout
from attnclust.maps.stats import stat_columns
from attnclust.pipeline import run_job
from attnclust.stages import SerialExecutor
from attnclust.stages.extract import plan_features, prepare_inputs
from attnclust.store import open_attention_store


def run_extract(tmp_path, tiny_bert_dir, small_squad, name="out", **extract):
    """The extract stage (and QA scoring) in-process, through the stage runner."""
    cfg = JobConfig.from_dict({"name": "t", "data": {"path": str(small_squad)},
                               "model": {"name": str(tiny_bert_dir)},
                               "extract": {"batch_size": 3, "features_per_task": 3, **extract}})
    layout = RunLayout(tmp_path / name)
    run_job(cfg, layout.root, stages=("extract", "qa"), executor=SerialExecutor(), progress=False)
    return cfg, layout, prepare_inputs(cfg)


@pytest.fixture
def extracted(tmp_path, tiny_bert_dir, small_squad):
    return run_extract(tmp_path, tiny_bert_dir, small_squad)


def test_uint8_store_is_within_one_step_of_float16(tmp_path, tiny_bert_dir, small_squad):
    import attnclust

    _, f16, _ = run_extract(tmp_path, tiny_bert_dir, small_squad, "f16")
    _, u8, _ = run_extract(tmp_path, tiny_bert_dir, small_squad, "u8", store_dtype="uint8")
    a = open_attention_store(f16.attention)
    b = open_attention_store(u8.attention)
    assert b.attention.dtype == np.uint8 and b.attrs["quantization"]["scale"] == pytest.approx(1 / 255)
    diff = np.abs(a.read_block(0, a.n_features) - b.read_block(0, b.n_features))
    assert diff.max() <= 1 / 510 + 1e-3          # rounding to 1/255 plus float16's own error
    np.testing.assert_allclose(b.read_map(2, 1, 3), a.read_map(2, 1, 3), atol=1 / 510 + 1e-3)
    xr = attnclust.open_output(u8.root).attention
    np.testing.assert_allclose(xr.isel(feature=2, layer=1, head=3).values[:4, :4],
                               b.read_map(2, 1, 3)[:4, :4], rtol=1e-6)


def test_maps_are_cropped_zero_padded_and_row_stochastic(extracted):
    cfg, out, inputs = extracted
    store = open_attention_store(out.root / "attention.zarr")
    feats = inputs["features"]
    assert store.n_features == len(feats) == 8
    assert store.attention.shape[1:3] == (2, 4)
    assert store.width == feats["seq_len"].max()
    a = np.asarray(store.attention[:], np.float32)
    for f, n in enumerate(store.seq_len):
        np.testing.assert_allclose(a[f, :, :, :n, :n].sum(-1), 1.0, atol=3e-3)
        assert not a[f, :, :, n:, :].any() and not a[f, :, :, :, n:].any()
    assert len(store.blocks()) == 3 and not list(out.block_markers("extract").glob("*.done"))  # gone with the parts


def test_maps_equal_an_unbatched_forward(extracted, tiny_bert_dir):
    import torch
    from transformers import AutoModelForQuestionAnswering

    cfg, out, inputs = extracted
    model = AutoModelForQuestionAnswering.from_pretrained(tiny_bert_dir, attn_implementation="eager").eval()
    store = open_attention_store(out.root / "attention.zarr")
    row = inputs["features"].iloc[-1]           # the longest feature, padded least
    first = inputs["features"].iloc[0]          # the shortest, padded most in its batch
    for feat in (row, first):
        ids = torch.tensor([list(feat["input_ids"])])
        with torch.inference_mode():
            att = model(input_ids=ids, token_type_ids=torch.tensor([list(feat["segment_ids"])]),
                        output_attentions=True).attentions
        ref = torch.stack(att, 1)[0].numpy()
        n = int(feat["seq_len"])
        got = np.asarray(store.attention[int(feat["feature_id"]), :, :, :n, :n], np.float32)
        np.testing.assert_allclose(got, ref, atol=2e-3)


def test_statistics_and_predictions_have_one_row_per_map_and_feature(extracted):
    cfg, out, inputs = extracted
    stats = pd.read_parquet(out.root / "map_stats.parquet")
    assert len(stats) == 8 * 2 * 4
    assert not stats.duplicated(["feature_id", "layer", "head"]).any()
    assert set(stat_columns()) <= set(stats.columns)
    assert stats["to_cls"].between(0, 1).all() and stats["entropy_norm"].between(0, 1.0001).all()
    qa = pd.read_parquet(out.root / "qa.parquet")
    feats = inputs["features"].set_index("feature_id")
    assert sorted(qa["feature_id"]) == list(range(8))
    for r in qa.itertuples():
        n = int(feats.loc[r.feature_id, "seq_len"])
        assert len(r.start_logits) == len(r.end_logits) == n


def test_stored_logits_equal_an_unbatched_forward(extracted, tiny_bert_dir):
    import torch
    from transformers import AutoModelForQuestionAnswering

    cfg, out, inputs = extracted
    model = AutoModelForQuestionAnswering.from_pretrained(tiny_bert_dir, attn_implementation="eager").eval()
    qa = pd.read_parquet(out.root / "qa.parquet").set_index("feature_id")
    for _, feat in inputs["features"].iloc[[0, -1]].iterrows():
        with torch.inference_mode():
            res = model(input_ids=torch.tensor([list(feat["input_ids"])]),
                        token_type_ids=torch.tensor([list(feat["segment_ids"])]))
        fid = int(feat["feature_id"])
        np.testing.assert_allclose(qa.at[fid, "start_logits"], res.start_logits[0].numpy(), atol=1e-4)
        np.testing.assert_allclose(qa.at[fid, "end_logits"], res.end_logits[0].numpy(), atol=1e-4)


def test_plan_features_orders_by_length_and_keeps_ties_in_dataset_order():
    df = pd.DataFrame({"example_id": list("abcd"), "span": [0, 0, 1, 0], "seq_len": [9, 4, 9, 4]})
    planned = plan_features(df)
    assert list(planned["example_id"]) == ["b", "d", "a", "c"]
    assert list(planned["feature_id"]) == [0, 1, 2, 3]


def test_overlapped_and_sequential_conversion_write_the_same_store(tmp_path, tiny_bert_dir, small_squad):
    _, seq, _ = run_extract(tmp_path, tiny_bert_dir, small_squad, "seq", overlap=False, batch_size=2)
    _, ovl, _ = run_extract(tmp_path, tiny_bert_dir, small_squad, "ovl", overlap=True, batch_size=2)
    a, b = open_attention_store(seq.attention), open_attention_store(ovl.attention)
    assert a.n_features == b.n_features == 8 and len(a.blocks()) > 1
    np.testing.assert_array_equal(np.asarray(b.attention[:]), np.asarray(a.attention[:]))
    pd.testing.assert_frame_equal(pd.read_parquet(ovl.map_stats), pd.read_parquet(seq.map_stats))
    qa_a, qa_b = pd.read_parquet(seq.qa_logits), pd.read_parquet(ovl.qa_logits)
    assert list(qa_a["feature_id"]) == list(qa_b["feature_id"]) == list(range(8))


def test_the_finalize_runs_the_registered_per_model_analyses_that_apply(tmp_path, tiny_bert_dir, small_squad):
    """The extract stage names no per-model analysis: one registered for encoders runs in its finalize with the
    model the driver resolved, its file is one of the stage's outputs, its record's fields and its version join the
    stage's record and fingerprint; a decoder's (the induction diagnostic, the protocols) leave nothing on this run."""
    import json

    from attnclust.analysis.extraction import MODEL_ANALYSES, model_analysis
    from attnclust.models import get_model

    from helpers import restored

    seen = {}
    with restored(MODEL_ANALYSES):
        @model_analysis("layer_count", version=3, description="the model's layers, counted once per run",
                        applies=lambda kind: not kind.is_decoder, outputs=lambda layout: (layout.table("layer_count"),))
        def layer_count(ctx):
            seen["identity"] = ctx.identity
            loaded = get_model(ctx.cfg.model, device=ctx.device, identity=ctx.identity)
            pd.DataFrame({"layers": [loaded.num_layers]}).to_parquet(ctx.layout.table("layer_count"))
            return {"layer_count_runs": [1]}

        _, layout, inputs = run_extract(tmp_path, tiny_bert_dir, small_squad)
    record = json.loads(layout.stage_record("extract").read_text())
    assert record["layer_count_runs"] == [1] and record["parts"]["identity"]["layer_count"] == 3
    assert "layer_count.parquet" in record["outputs"]
    assert pd.read_parquet(layout.table("layer_count"))["layers"].tolist() == [2]
    assert seen["identity"] == inputs["model_info"]["identity"]
    assert not {"induction", "decoder_protocols"} & set(record["parts"]["identity"])
    assert not {"induction_seconds", "protocols_seconds", "protocols_reused"} & set(record)
    assert not layout.induction.exists() and not layout.decoder_protocols.exists()
