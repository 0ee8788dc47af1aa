"""``extract.store: auto`` and a compact store's exact sample: the choice against ``extract.store_budget_gb``
(pre-flight line, store, fingerprint), the sample (deterministic, evenly spread, the exact maps bit for bit), the
analyses that need exact maps reading only the sample on a compact store whose compact maps are a decoy, the map
source each analysis states, and bad settings."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
from scipy.spatial.distance import jensenshannon

from attnclust.cli import main
from attnclust.config import JobConfig
from attnclust.errors import ConfigError, StoreError
from attnclust.layout import RunLayout
from attnclust.pipeline import run_job
from attnclust.stages import SerialExecutor
from attnclust.stages.report import map_source_note
from attnclust.store import (
    create_attention_store,
    exact_sample_ids,
    mark_store_complete,
    open_attention_store,
    read_features,
)
from attnclust.store.plan import (
    ROW_BYTES_ONE_KEY,
    ROW_KEYS_EXPONENT,
    compact_rows_bytes,
    fit_max_keys,
    plan_store,
)
from attnclust.synthetic import write_compact_decoy, write_planted_qa_store, write_planted_store


def _cfg(data, model, **extract) -> JobConfig:
    return JobConfig.from_dict({"name": "t", "data": {"path": str(data)}, "model": {"name": str(model)},
                                "extract": {"batch_size": 3, "features_per_task": 3, **extract}})


def _extract(cfg, out, progress: bool = False, **kwargs):
    return run_job(cfg, out, stages=("extract",), executor=SerialExecutor(), progress=progress, **kwargs)


# --- the sample ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n, size", [(10, 3), (10, 10), (7, 20), (1000, 256), (257, 256), (5, 1), (5, 0), (0, 4)])
def test_exact_sample_is_evenly_spread_from_the_first_feature_to_the_last(n, size):
    ids = exact_sample_ids(n, size)
    assert np.array_equal(ids, exact_sample_ids(n, size))              # the same data, the same sample
    want = min(n, size)
    assert len(ids) == want and ids.dtype == np.int64
    if want == 0:
        return
    assert len(set(ids.tolist())) == want and all(0 <= i < n for i in ids)
    assert all(a < b for a, b in zip(ids[:-1], ids[1:]))
    if want >= 2:
        assert ids[0] == 0 and ids[-1] == n - 1
        gaps = [b - a for a, b in zip(ids[:-1], ids[1:])]
        assert max(gaps) - min(gaps) <= 1                              # evenly spaced: no cluster, no hole
        for k, f in enumerate(ids):                                    # each within half a step of its quantile
            assert abs(f - k * (n - 1) / (want - 1)) <= 0.5


# --- the choice ------------------------------------------------------------------------------------------------

def test_auto_keeps_full_up_to_the_budget_and_compact_above():
    seq = np.array([10, 20, 30])
    cfg = JobConfig.from_dict({"extract": {"store_budget_gb": 1.0, "exact_sample": 2}})
    at = plan_store(cfg, seq, num_layers=2, num_heads=3, full_bytes=10**9, compact_bytes=123)
    above = plan_store(cfg, seq, num_layers=2, num_heads=3, full_bytes=10**9 + 1, compact_bytes=123)
    assert (at.mode, above.mode) == ("full", "compact")
    assert at.projected == 10**9 and len(at.sample) == 0
    assert above.sample.tolist() == [0, 2]
    assert above.sample_bytes == 2 * 3 * 2 * (10 * 10 + 30 * 30)    # float16 true-length maps of features 0, 2
    assert above.projected == 123 + above.sample_bytes
    assert "store auto -> full: up to 1.0 GB" in at.describe("float16", 0.95)
    assert "within extract.store_budget_gb = 1 (1.0 GB)" in at.describe("float16", 0.95)
    line = above.describe("float16", 0.95)
    assert line.startswith("store auto -> compact: a full store would take up to 1.0 GB (float16, true-length maps")
    assert "more than extract.store_budget_gb = 1 (1.0 GB)" in line and "exact float16 maps of 2 features" in line
    for setting in ("full", "compact"):                                # an explicit store is never overruled
        cfg = JobConfig.from_dict({"extract": {"store": setting, "store_budget_gb": 1.0}})
        assert plan_store(cfg, seq, num_layers=2, num_heads=3, full_bytes=10**12, compact_bytes=1).mode == setting
        assert plan_store(cfg, seq, num_layers=2, num_heads=3, full_bytes=1, compact_bytes=1).mode == setting


def _brute_rows_bytes(lengths, maps: int, cap: int) -> float:
    """The compact rows' estimate written as a loop: every query row of every map keeps min(cap, length) keys."""
    total = 0.0
    for n in lengths:
        for _ in range(maps * int(n)):
            total += ROW_BYTES_ONE_KEY * min(cap, int(n)) ** ROW_KEYS_EXPONENT
    return total


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fit_max_keys_is_the_largest_cap_whose_rows_fit(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 60, size=9)
    maps = 6
    whole = _brute_rows_bytes(lengths, maps, int(lengths.max()))
    five = _brute_rows_bytes(lengths, maps, 5) * (1 + 1e-12)  # the two sums may round apart by an ulp
    for room in [*rng.uniform(0, 1.2 * whole, size=12), whole * (1 + 1e-9), five]:
        fits = [k for k in range(1, int(lengths.max()) + 1) if _brute_rows_bytes(lengths, maps, k) <= room]
        want = None if _brute_rows_bytes(lengths, maps, int(lengths.max())) <= room else max(fits, default=0)
        assert fit_max_keys(lengths, maps, room) == want, (room, want)
        assert compact_rows_bytes(lengths, maps, 7) == pytest.approx(_brute_rows_bytes(lengths, maps, 7), rel=1e-9)
    assert fit_max_keys(lengths, maps, _brute_rows_bytes(lengths, maps, 5) * (1 + 1e-9)) == 5


def test_a_compact_store_is_fitted_to_its_budget(small_squad, tiny_bert_dir, tmp_path, capsys):
    """``compact_max_keys: null``: the cap is the most keys a row that the budget holds beside the exact sample
    and the profile vectors; the store keeps at most that many, says so, records it, and stays in the budget."""
    from attnclust.maps.profile import PROFILE_COMPONENTS

    first = tmp_path / "first"
    _extract(_cfg(small_squad, tiny_bert_dir, store="compact", exact_sample=0), first)
    assert open_attention_store(RunLayout(first).attention).attrs["compact"]["max_keys"] is None  # 5 GB: no cap
    lengths = read_features(first)["seq_len"].to_numpy()
    maps = 2 * 4
    fixed = maps * len(lengths) * (len(PROFILE_COMPONENTS) + 2) * 4    # the profile vectors, kept mass and error
    budget = (fixed + _brute_rows_bytes(lengths, maps, 3)) * (1 + 1e-9) / 1e9   # not 4 keys: brute(4) is far more
    out = tmp_path / "fitted"
    record = _extract(_cfg(small_squad, tiny_bert_dir, store="compact", exact_sample=0, store_budget_gb=budget), out,
                      progress=True)
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("extract: ")][-1]
    assert "at most 3 keys a row (the most that extract.store_budget_gb holds beside the exact sample" in line
    assert record.stages["extract"]["parts"]["keys"]["extract.compact_max_keys"] == 3
    store = open_attention_store(RunLayout(out).attention)
    assert store.attrs["compact"]["max_keys"] == 3
    for f in range(store.n_features):
        for layer in range(2):
            for head in range(4):
                n = int(store.seq_len[f])  # the rows' codes: the keys each keeps
                assert (np.count_nonzero(store.attention[f, layer, head, :n, :n], axis=-1) <= 3).all()
    held = sum(p.stat().st_size for p in RunLayout(out).attention.rglob("*") if p.is_file())
    assert held <= budget * 1e9, (held, budget * 1e9)
    # the data or the budget changes the cap: the fingerprint says so rather than serve the old store
    with pytest.raises(StoreError, match=r"extract\.compact_max_keys: 3 -> "):
        _extract(_cfg(small_squad, tiny_bert_dir, store="compact", exact_sample=0, store_budget_gb=2 * budget), out)


def _brute_sample_bytes(lengths, ids, maps: int) -> int:
    return sum(maps * 2 * int(lengths[f]) ** 2 for f in ids)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_fitted_budget_gives_the_exact_sample_at_most_a_third(seed):
    """``compact_max_keys: null``: the sample is the most features, up to ``exact_sample``, whose float16 maps fit
    a third of the budget; a set cap leaves ``exact_sample`` as it is."""
    rng = np.random.default_rng(seed)
    lengths = np.sort(rng.integers(20, 300, size=40))
    maps, size = 12, 16
    full = sum(_brute_sample_bytes(lengths, [f], maps) for f in range(40))
    for budget in rng.uniform(0.02, 1.5, size=8) * full:
        cfg = JobConfig.from_dict({"extract": {"store": "compact", "exact_sample": size,
                                               "store_budget_gb": budget / 1e9}})
        want = max(m for m in range(size + 1)
                   if _brute_sample_bytes(lengths, exact_sample_ids(40, m), maps) <= budget / 3)
        try:
            plan = plan_store(cfg, lengths, num_layers=3, num_heads=4, full_bytes=10**12, compact_bytes=10**11)
        except ConfigError:                                              # the rows do not fit the rest
            continue
        assert len(plan.sample) == want and plan.sample_cut == (want < size)
        assert plan.sample_bytes == _brute_sample_bytes(lengths, plan.sample, maps) <= budget / 3
        line = plan.describe("float16", 0.95)
        assert ("a third of the budget" in line) == plan.sample_cut
        assert ("and no exact maps (extract.exact_sample = 16" in line) == (want == 0)
        set_cap = JobConfig.from_dict({"extract": {"store": "compact", "exact_sample": size,
                                                   "store_budget_gb": budget / 1e9, "compact_max_keys": 4}})
        kept = plan_store(set_cap, lengths, num_layers=3, num_heads=4, full_bytes=10**12, compact_bytes=10**11)
        assert len(kept.sample) == size and not kept.sample_cut and kept.max_keys == 4 and not kept.fitted


def test_a_budget_too_small_for_a_compact_store_is_one_line_and_exit_2(small_squad, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["extract", "--data", str(small_squad), "--out", str(out), "--set", "extract.store=compact",
                 "--set", "extract.store_budget_gb=1e-6"])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1, err
    assert re.fullmatch(r"attnclust: error: extract: a compact store of these [\d,]+ features needs about .* even "
                        r"at one key a row \(the exact float16 maps of [\d,]+ features: .*\), more than "
                        r"extract\.store_budget_gb = 1e-06 \(1\.0 kB\); raise extract\.store_budget_gb, lower "
                        r"extract\.exact_sample, or set extract\.compact_max_keys", err[0]), err[0]
    assert not RunLayout(out).attention.exists() and not RunLayout(out).features.exists()


def test_auto_within_the_budget_is_the_full_extraction(small_squad, tiny_bert_dir, tmp_path, capsys):
    out = tmp_path / "run"
    run_job(_cfg(small_squad, tiny_bert_dir), out, stages=("extract",), executor=SerialExecutor(), progress=True)
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("extract: ")]
    assert len(line) == 1 and ", store auto -> full: up to " in line[0]
    assert line[0].endswith("within extract.store_budget_gb = 5 (5.0 GB)")
    store = open_attention_store(RunLayout(out).attention)
    assert store.mode == "full" and store.exact is None and store.profile is not None and store.exact_source == "full"
    assert "exact_sample" not in store.attrs
    assert json.loads(RunLayout(out).job.read_text())["stages"]["extract"]["store"] == "full"
    result = _extract(_cfg(small_squad, tiny_bert_dir, store="full"), out)     # the same fingerprint
    assert result.stages["extract"]["skipped"] is True


def test_auto_above_the_budget_writes_compact_with_the_exact_maps_of_the_sample(small_squad, tiny_bert_dir,
                                                                                  tmp_path, capsys):
    _extract(_cfg(small_squad, tiny_bert_dir, store="full"), tmp_path / "full")
    out = tmp_path / "auto"
    # a budget this small holds no compact store either: its key cap is set here, not fitted to the budget
    cfg = _cfg(small_squad, tiny_bert_dir, store_budget_gb=1e-6, exact_sample=3, compact_max_keys=64)
    run_job(cfg, out, stages=("extract",), executor=SerialExecutor(), progress=True)
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("extract: ")][0]
    assert ", store auto -> compact: a full store would take up to " in line
    assert "more than extract.store_budget_gb = 1e-06 (1.0 kB); the compact store takes up to " in line
    assert line.endswith(")") and "plus the exact float16 maps of 3 features" in line
    full = open_attention_store(RunLayout(tmp_path / "full").attention)
    store = open_attention_store(RunLayout(out).attention)
    assert store.mode == "compact" and store.attrs["exact_sample"] == {"features": 3}
    assert store.exact_source == "exact sample" and store.exact.dtype == np.float16
    assert store.exact_features.tolist() == exact_sample_ids(store.n_features, 3).tolist()
    assert store.exact_ids().tolist() == store.exact_features.tolist()
    for f in range(store.n_features):
        n = int(store.seq_len[f])
        exact = full.attention[f, :, :, :n, :n]                        # the full store's float16, bit for bit
        if f in store.exact_features:
            np.testing.assert_array_equal(store.read_exact(f), np.asarray(exact, np.float32))
        else:
            with pytest.raises(StoreError, match=rf"feature {f} is not in the exact sample"):
                store.read_exact(f)
    # an auto run that resolves to compact is the same extraction as store: compact with that sample
    assert _extract(_cfg(small_squad, tiny_bert_dir, store="compact", exact_sample=3, compact_max_keys=64),
                    out).stages["extract"]["skipped"] is True
    with pytest.raises(StoreError, match=r"other settings \(extract\.exact_sample: 3 -> 2\)"):
        _extract(_cfg(small_squad, tiny_bert_dir, store="compact", exact_sample=2, compact_max_keys=64), out)


def test_no_exact_sample_leaves_the_compact_maps_and_says_so(small_squad, tiny_bert_dir, tmp_path):
    out = tmp_path / "run"
    _extract(_cfg(small_squad, tiny_bert_dir, store="compact", exact_sample=0), out)
    store = open_attention_store(RunLayout(out).attention)
    assert store.exact is None and "exact_sample" not in store.attrs and store.exact_source == "compact"
    assert store.exact_ids().tolist() == list(range(store.n_features))
    n = int(store.seq_len[2])
    np.testing.assert_array_equal(store.read_exact(2)[1, 0], store.read_map(2, 1, 0))
    assert store.read_exact(2).shape == (2, 4, n, n)


@pytest.mark.parametrize("setting, match", [
    ("extract.store=everything", r"extract\.store: got 'everything'; allowed: auto \| full \| compact"),
    ("extract.store_budget_gb=0", r"extract\.store_budget_gb: got 0(\.0)?; allowed: a number > 0 \(GB\)"),
    ("extract.store_budget_gb=lots", r"extract\.store_budget_gb: got 'lots'"),
    ("extract.exact_sample=-1", r"extract\.exact_sample: got -1; allowed: an integer >= 0"),
])
def test_bad_settings_are_one_line_and_exit_2(small_squad, tmp_path, capsys, setting, match):
    out = tmp_path / "out"
    code = main(["run", "--data", str(small_squad), "--out", str(out), "--set", setting])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1, err
    assert re.search(match, err[0]), err[0]
    assert not out.exists()


# --- analyses on a compact store with an exact sample ------------------------------------------------------------

def _brute_head_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Clark et al.'s distance of two maps written from the definition: per query row, smooth both rows
    (0.999 row/rowsum + 0.001/n), Jensen-Shannon distance in bits (scipy), mean over the rows."""
    n = a.shape[-1]
    rows = []
    for p, q in zip(a.astype(np.float64), b.astype(np.float64)):
        rows.append(jensenshannon(0.999 * p / p.sum() + 0.001 / n, 0.999 * q / q.sum() + 0.001 / n, base=2))
    return float(np.mean(rows))


def test_head_distances_read_only_the_exact_sample(tmp_path):
    from attnclust.analysis.distances import compute_head_layout, head_distances

    planted = write_planted_store(tmp_path / "run", rng=np.random.default_rng(4), n_features=6, n_layers=2,
                                  n_heads=2, lengths=(8, 30), kinds=("previous", "next", "cls", "broad"),
                                  shuffle_heads=False)
    before = open_attention_store(RunLayout(planted.root).attention)
    sample = [1, 4]
    exact = {f: np.asarray(before.read_block(f, f + 1)[0, :, :, :before.seq_len[f], :before.seq_len[f]])
             for f in sample}
    assert compute_head_layout(before, n_features=None).attrs["map_source"] == {"head_distances": "full"}
    write_compact_decoy(planted.root, sample)
    store = open_attention_store(RunLayout(planted.root).attention)
    result = head_distances(store, n_features=None, max_rows=None)
    assert result.features.tolist() == sample and result.source == "exact sample"
    heads = [(layer, head) for layer in range(2) for head in range(2)]
    want = np.zeros((4, 4))
    for i, (la, ha) in enumerate(heads):
        for j, (lb, hb) in enumerate(heads):
            want[i, j] = np.mean([_brute_head_distance(exact[f][la, ha], exact[f][lb, hb]) for f in sample])
    np.testing.assert_allclose(result.distances, want, atol=1e-5)
    assert want[0, 1] > 0.3                      # planted previous vs next: the decoy (uniform) would give 0
    table = compute_head_layout(store, n_features=None, max_rows=None)
    assert table.attrs["map_source"] == {"head_distances": "exact sample"} and table.attrs["n_features"] == 2


@pytest.fixture
def planted_qa(tmp_path):
    types = np.array([["answer", "uniform"], ["cls", "previous"]])
    store = write_planted_qa_store(tmp_path / "run", rng=np.random.default_rng(1), head_types=types, n_features=12,
                                   lengths=(16, 64), unanswerable=0.25)
    return store, pd.read_parquet(store.root / "features.parquet")


def test_answer_attention_reads_the_exact_sample_of_a_compact_store(planted_qa):
    from attnclust.analysis.answer import answer_table

    store, features = planted_qa
    layout = RunLayout(store.root)
    before = answer_table(layout, features)
    sample = exact_sample_ids(len(features), 5)
    write_compact_decoy(store.root, sample)
    after = answer_table(layout, features)
    assert set(after["feature_id"]) == set(sample) & set(before["feature_id"])
    mine = before[before["feature_id"].isin(sample)].reset_index(drop=True)
    pd.testing.assert_frame_equal(after.reset_index(drop=True), mine)    # the exact maps, not the decoy
    answerable = after[after["kind"] == "answerable"]
    lift = answerable.groupby(["layer", "head"])["answer_lift"].mean()
    assert lift[(0, 0)] > 3 * lift.drop((0, 0)).max()                  # the planted answer head


def test_the_report_states_each_analysis_map_source(planted_qa):
    store, _ = planted_qa
    layout = RunLayout(store.root)
    write_compact_decoy(store.root, exact_sample_ids(12, 5))
    from attnclust.config import load_job

    cfg = load_job(None, ["cluster.umap=false", "cluster.k=2", "cluster.stability_resamples=2"])
    run_job(cfg, store.root, stages=("featurize", "cluster", "report"), executor=SerialExecutor(), progress=False)
    heads = pd.read_parquet(layout.table("heads"))
    sources = heads.attrs["map_source"]
    from attnclust.analysis.heads import HEAD_ANALYSES

    assert set(sources) == set(HEAD_ANALYSES)
    assert sources["answer_attention"] == sources["unanswerable_attention"] == "exact sample"
    assert sources["retrieval"] == "exact sample"
    assert sources["roles"] == sources["sink"] == "full"                  # statistics of the exact maps
    assert pd.read_parquet(layout.head_layout).attrs["map_source"] == {"head_distances": "exact sample"}
    html = layout.report.read_text()
    assert "The attention store is compact" in html and "exact maps of the store&#39;s sample of 5 features" in html
    assert "computed from every exact map at extraction: clustering, " in html     # profile: the stored vectors
    maps, clusters = pd.read_parquet(layout.table("maps")), pd.read_parquet(layout.table("clusters"))
    sample = maps["feature_id"].isin(exact_sample_ids(12, 5))
    assert set(maps.loc[sample, "cluster"]) == {0, 1}                          # each cluster has sampled maps ...
    for c in (0, 1):                                                          # ... so its medoid is one of them
        nearest = maps[sample & (maps["cluster"] == c)].nsmallest(1, "centroid_dist").iloc[0]
        assert clusters.loc[c, "medoid_feature_id"] == nearest["feature_id"]
    exact_part = html.split("exact maps of the store&#39;s sample of 5 features: ")[1].split("; from")[0]
    assert "cluster mean maps" in exact_part and "medoid maps" in exact_part
    from attnclust.store import open_embedding

    assert open_embedding(store.root).attrs["map_source"] == "full"


def test_a_full_run_states_full_everywhere(small_planted_run):
    root = small_planted_run("sources")
    layout = RunLayout(root)
    assert set(pd.read_parquet(layout.table("heads")).attrs["map_source"].values()) == {"full"}
    assert pd.read_parquet(layout.head_layout).attrs["map_source"] == {"head_distances": "full"}
    assert "The attention store is compact" not in layout.report.read_text()


def test_explore_shows_the_exact_map_of_a_sample_feature_and_says_which(small_planted_run):
    from attnclust.explore import ExploreApp

    root = small_planted_run("explore_compact")
    before = open_attention_store(RunLayout(root).attention)
    planted = {f: before.read_map(f, 1, 0) for f in range(before.n_features)}
    write_compact_decoy(root, [0, 5])
    app = ExploreApp(root)
    for f in range(before.n_features):
        got = app.map_json(f, 1, 0)
        weights = np.asarray(got["weights"])
        if f in (0, 5):
            assert got["source"] == "exact sample"
            np.testing.assert_allclose(weights, planted[f], atol=1e-5)
        else:
            n = int(before.seq_len[f])
            assert got["source"] == "compact"
            uniform = (round(255 * (1 / n) ** 0.5) / 255) ** 2              # the decoy's square-root code of 1/n
            np.testing.assert_allclose(weights, np.full((n, n), uniform / max(1, n * uniform)), atol=1e-5)
            assert got["kept_mass"] == 1.0 and (weights.sum(-1) <= 1 + 1e-6).all()
    assert json.loads(json.dumps(app.map_json(0, 0, 0)))["source"] == "exact sample"
    assert read_features(root)["feature_id"].tolist() == list(range(before.n_features))


def test_features_table_is_in_small_row_groups_so_a_task_reads_only_its_range(tmp_path):
    import pyarrow.parquet as pq

    from attnclust.stages.extract import FEATURE_ROW_GROUP, prepare_store

    n = 3 * FEATURE_ROW_GROUP + 5
    rng = np.random.default_rng(0)
    features = pd.DataFrame({"feature_id": np.arange(n), "seq_len": rng.integers(5, 12, n),
                             "tokens": [["t"] * 3 for _ in range(n)]})
    layout = RunLayout(tmp_path / "run")
    cfg = JobConfig.from_dict({"name": "t", "extract": {"store": "full", "features_per_task": 10}})
    prepare_store(layout, features, cfg=cfg, model_info={"num_layers": 2, "num_heads": 2, "source": "m",
                                                            "identity": "m", "head_trained": False}, done=set())
    meta = pq.ParquetFile(layout.features).metadata
    sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert sizes == [FEATURE_ROW_GROUP] * 3 + [5]
    # a task's range (features 60..69) spans at most two groups; the read gives exactly its rows
    got = pd.read_parquet(layout.features, filters=[("feature_id", ">=", 60), ("feature_id", "<", 70)])
    assert got["feature_id"].tolist() == list(range(60, 70))


def test_the_parts_are_removed_once_consolidated_and_a_run_stopped_after_that_extracts_again(small_squad,
                                                                                             tiny_bert_dir, tmp_path):
    out = tmp_path / "run"
    cfg = _cfg(small_squad, tiny_bert_dir)
    first = _extract(cfg, out).stages["extract"]
    layout = RunLayout(out)
    assert first["blocks"] >= 2 and not layout.parts.exists() and "parts" not in first["outputs"]
    stats, qa = pd.read_parquet(layout.map_stats), pd.read_parquet(layout.qa_logits)
    assert len(stats) == len(read_features(out)) * 2 * 4
    assert not list(layout.block_markers("extract").glob("*.done"))
    layout.stage_record("extract").unlink()                  # stopped after the parts went, before the record
    again = _extract(cfg, out).stages["extract"]
    assert again["blocks_resumed"] == 0 and not again.get("skipped")
    pd.testing.assert_frame_equal(pd.read_parquet(layout.map_stats), stats)
    pd.testing.assert_frame_equal(pd.read_parquet(layout.qa_logits), qa)


def test_cluster_mean_maps_read_the_exact_sample_of_a_compact_store(tmp_path):
    """A cluster with maps of the sample's features averages those, exact (the decoy's compact maps are uniform);
    one without any averages its compact maps and says so."""
    from attnclust.analysis.atlas import cluster_mean_maps

    planted = write_planted_store(tmp_path / "run", rng=np.random.default_rng(2), n_features=8, n_layers=1,
                                  n_heads=2, lengths=(10, 30), kinds=("previous", "cls"), shuffle_heads=False)
    layout = RunLayout(planted.root)
    sample = [1, 4, 6]
    rows = pd.DataFrame([(f, 0, h) for f in range(8) for h in range(2)], columns=["feature_id", "layer", "head"])
    rows["cluster"] = rows["head"]                                     # cluster 0: previous, cluster 1: cls
    rows.loc[(rows["head"] == 1) & ~rows["feature_id"].isin(sample), "cluster"] = 2   # cluster 2: none sampled
    exact = cluster_mean_maps(layout, rows[rows["feature_id"].isin(sample)], 3, grid=8)   # the full store's maps
    write_compact_decoy(planted.root, sample)
    sources: dict[int, str] = {}
    means = cluster_mean_maps(layout, rows, 3, grid=8, sources=sources)
    assert sources == {0: "exact sample", 1: "exact sample", 2: "compact"}
    np.testing.assert_allclose(means[:2], exact[:2], atol=1e-3)        # float16 exact maps, as the full store held
    assert not np.allclose(means[0], 1 / 8) and np.allclose(means[2], 1 / 8)  # planted vs the uniform decoy
    note = map_source_note(open_attention_store(layout.attention), {}, mean_maps=sources)
    assert "from exact maps of the store's sample of 3 features: the mean maps of 2 clusters" in note
    assert "compact maps: the mean maps of 1 cluster without maps in the sample, medoid maps" in note


def test_medoid_maps_read_the_exact_sample_of_a_compact_store(tmp_path):
    """A medoid of the sample's features is read exact (the full store's map), any other from the decoy's compact
    maps (uniform); the note says which."""
    from attnclust.analysis.atlas import medoid_maps

    planted = write_planted_store(tmp_path / "run", rng=np.random.default_rng(3), n_features=6, n_layers=1,
                                  n_heads=2, lengths=(10, 30), kinds=("previous", "cls"), shuffle_heads=False)
    layout = RunLayout(planted.root)
    seq_len = open_attention_store(layout.attention).seq_len
    features = pd.DataFrame({"feature_id": range(6), "tokens": [[f"t{i}" for i in range(int(n))] for n in seq_len]})
    clusters = pd.DataFrame({"cluster": [0, 1, 2], "medoid_feature_id": [1, 4, 2], "medoid_layer": 0,
                             "medoid_head": [0, 1, 1]})
    full = medoid_maps(layout, clusters, features)
    write_compact_decoy(planted.root, [1, 4])
    sources: dict[int, str] = {}
    got = medoid_maps(layout, clusters, features, sources=sources)
    assert sources == {0: "exact sample", 1: "exact sample", 2: "compact"}
    for c in (0, 1):
        np.testing.assert_array_equal(got[c][0], full[c][0])             # the planted maps, float16 as stored
        assert got[c][1] == full[c][1]
    n = int(seq_len[2])
    np.testing.assert_allclose(got[2][0], np.full((n, n), 1 / n), atol=1 / 255)   # the decoy
    assert not np.allclose(full[2][0], 1 / n)
    note = map_source_note(open_attention_store(layout.attention), {}, medoids=sources)
    assert "the medoids of 2 clusters" in note.split("; from compact maps")[0]
    assert "compact maps: cluster mean maps, the medoids of 1 cluster without maps in the sample" in note


def test_the_note_names_the_key_cap_and_the_measured_kept_mass(tmp_path):
    """The note states the share of the row mass the rows keep as the store measured it, not the setting."""
    seq = np.array([4, 8], np.int32)
    store = create_attention_store(tmp_path / "attention.zarr", seq_len=seq, num_layers=1, num_heads=2,
                                   features_per_task=2, attrs={}, mode="compact", compact_mass=0.95,
                                   compact_max_keys=11)
    store.kept_mass[:] = np.array([[[0.2, 0.4]], [[0.5, 0.7]]], np.float32)
    mark_store_complete(store.path)
    note = map_source_note(open_attention_store(store.path), {"roles": "full"})
    mean = (4 * (0.2 + 0.4) + 8 * (0.5 + 0.7)) / (2 * 12)                # each map's mean weighted by its rows
    assert note.startswith(f"The attention store is compact: each query row keeps only its largest weights (at "
                           f"most 11 keys a row; measured: {mean:.3g} of a row's mass on average, under "
                           f"{np.percentile([0.2, 0.4, 0.5, 0.7], 5):.3g} in 5% of maps, 0.2 in the least; the "
                           f"rest of the row is dropped), so maps drawn from it are approximate.")
    assert "0.95" not in note and "compact maps: cluster mean maps, medoid maps" in note


def test_read_exact_map_is_one_head_of_read_exact(tmp_path):
    planted = write_planted_store(tmp_path / "run", rng=np.random.default_rng(5), n_features=5, n_layers=2,
                                  n_heads=3, lengths=(6, 20))
    full = open_attention_store(RunLayout(planted.root).attention)
    for f in range(5):                                                  # a full store: its own maps
        np.testing.assert_array_equal(full.read_exact_map(f, 1, 2), full.read_map(f, 1, 2))
    write_compact_decoy(planted.root, [0, 3])
    store = open_attention_store(RunLayout(planted.root).attention)
    for f in (0, 3):
        for layer in range(2):
            for head in range(3):
                np.testing.assert_array_equal(store.read_exact_map(f, layer, head), store.read_exact(f)[layer, head])
    with pytest.raises(StoreError, match=r"feature 2 is not in the exact sample"):
        store.read_exact_map(2, 0, 0)


@pytest.mark.parametrize("sample", [None, [0, 3], []], ids=["full", "exact sample", "compact, no sample"])
def test_read_exact_part_is_that_part_of_read_exact(tmp_path, sample):
    planted = write_planted_store(tmp_path / "run", rng=np.random.default_rng(7), n_features=5, n_layers=2,
                                  n_heads=3, lengths=(6, 20))
    if sample is not None:
        write_compact_decoy(planted.root, sample)
    store = open_attention_store(RunLayout(planted.root).attention)
    for f in store.exact_ids():
        f, n = int(f), int(store.seq_len[f])
        # read_exact is read_exact_part of everything: the whole maps, read another way (the block, or the exact
        # sample's float16 weights as they are stored)
        whole = np.asarray(store.exact[list(store.exact_features).index(f), :, :, :n, :n], np.float32) \
            if store.exact is not None else store.read_block(f, f + 1)[0, :, :, :n, :n]
        np.testing.assert_array_equal(store.read_exact(f), whole)
        np.testing.assert_array_equal(store.read_exact_part(f), whole)
        for rows, keys in ((slice(1, n - 1), slice(1, n - 1)), (slice(n - 2, n), slice(0, n)),
                           (slice(0, 3), None), (np.array([0, 2, n - 1]), None), (np.array([1, 3]), slice(2, 5))):
            picked = whole[:, :, rows] if isinstance(rows, slice) else whole[:, :, np.asarray(rows)]
            picked = picked[..., keys] if isinstance(keys, slice) else picked
            np.testing.assert_array_equal(store.read_exact_part(f, rows, keys), picked)
    n0 = int(store.seq_len[0])
    for rows, match in ((slice(2, 2), "rows 2:2"), (slice(0, n0 + 1), f"rows 0:{n0 + 1}"),
                        (np.array([3, 1]), r"rows \[3, 1\]"), (slice(0, 4, 2), "rows 0:4:2"),
                        (np.array([n0]), rf"rows \[{n0}\]"), (slice(-1, n0), f"rows -1:{n0}")):
        with pytest.raises(ValueError, match=match + r".* of feature 0, whose true length is"):
            store.read_exact_part(0, rows)
