"""The dev rehearsal's arithmetic (bench/figures/squad_dev.py): the p95 latency and the per-feature growth ratio, each
against a loop written from its definition."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bench.figures.squad_dev import growth_ratio, p95


def p95_by_definition(values) -> float:
    """The smallest observed value with at least 95% of the values at or below it."""
    for candidate in sorted(values):
        at_or_below = sum(1 for v in values if v <= candidate)
        if at_or_below >= 0.95 * len(values):
            return candidate
    raise AssertionError("unreachable")


@pytest.mark.parametrize("n", [1, 2, 19, 20, 21, 99, 100, 101, 250])
def test_p95_is_the_nearest_rank_percentile(n):
    rng = np.random.default_rng(n)
    values = list(rng.lognormal(3.0, 1.0, size=n))
    assert p95(values) == p95_by_definition(values)
    ties = list(rng.integers(0, 4, size=n).astype(float))
    assert p95(ties) == p95_by_definition(ties)


def test_p95_of_100_requests_ignores_the_five_slowest():
    values = [10.0] * 95 + [1000.0] * 5
    assert p95(values) == 10.0
    assert p95([*values[:-1], 10.0, 1000.0][::-1]) == 10.0  # order does not matter


def test_p95_of_nothing_is_refused():
    with pytest.raises(ValueError, match="no values"):
        p95([])


def test_growth_ratio_against_a_loop():
    rng = np.random.default_rng(0)
    features = [1000, 4000, 12000]
    for _ in range(20):
        seconds = list(rng.uniform(1, 500, size=3))
        worst, ratios = growth_ratio(seconds, features)
        expected = []
        for s, f in zip(seconds[1:], features[1:]):
            expected.append((s / f) / (seconds[0] / features[0]))
        assert ratios == pytest.approx(expected)
        assert worst == pytest.approx(max(expected))


def test_growth_ratio_of_planted_costs():
    features = [1000, 4000, 12000]
    linear = [0.5 * f for f in features]
    assert growth_ratio(linear, features)[0] == pytest.approx(1.0)
    fixed = [20 + 0.5 * f for f in features]  # a fixed cost spread over more features: below 1
    assert growth_ratio(fixed, features)[0] < 1
    quadratic = [1e-4 * f * f for f in features]  # per-feature cost growing with the features: 12x at 12k
    worst, ratios = growth_ratio(quadratic, features)
    assert worst == pytest.approx(12.0)
    assert ratios == pytest.approx([4.0, 12.0])


def test_growth_ratio_needs_two_arms():
    with pytest.raises(ValueError, match="at least two arms"):
        growth_ratio([1.0], [10])


def test_stage_peak_is_the_largest_sample_inside_else_the_nearest():
    from bench.common.memory import TreeRSS

    sampler = TreeRSS(pid=0)
    sampler.samples = [(0.0, 5), (1.0, 9), (2.0, 7), (3.0, 4), (10.0, 8)]
    assert sampler.peak() == 9
    assert sampler.peak(1.5, 3.5) == 7
    assert sampler.peak(5.0, 6.0) == 4  # nothing inside: the nearest sample (t = 3.0)
    assert sampler.peak(8.5, 9.0) == 8
    assert TreeRSS(pid=0).peak(0.0, 1.0) == 0


def test_bertbase_store_projection_is_the_mode_auto_chose_at_dev_size(monkeypatch, tmp_path):
    """Planted bytes per feature (BERT-base full 1000, compact without its sample 100) and a dev arm that auto
    made compact: the judged figure is compact's bytes x dev's features plus the exact sample at full's bytes per
    feature, and the extract-only run in the other mode is compact without an exact sample."""
    import types

    import bench.common.squadgen
    import bench.figures.squad_dev as sd

    stages = {name: {"seconds": s, "peak_rss": 1e9, "bytes": 1} for name, s in (("extract", 10.0), ("report", 5.0))}
    seen = []

    def fake_run_cli(ctx, out, data, sets, *, command="run"):
        seen.append(list(sets))
        bert = any(s.startswith("model.name=") for s in sets)
        compact = "extract.store=compact" in sets
        features = 20
        per_feature = 100 if compact else (1000 if bert else 500)
        return {"wall_s": 20.0, "peak_rss": 1e9, "peak_pss": None, "stages": stages, "features": features,
                "examples": 20, "maps": features * (144 if bert else 72), "disk_bytes": per_feature * features,
                "store": "compact" if compact else "full/float16", "store_setting": "auto",
                "store_bytes": per_feature * features}

    run = tmp_path / "dev_run"
    run.mkdir()
    pd.DataFrame({"seq_len": np.full(12_000, 160, np.int32)}).to_parquet(run / "features.parquet")
    dev = {"questions": sd.DEV_QUESTIONS, "features": 12_000, "examples": sd.DEV_QUESTIONS, "maps": 12_000 * 72,
           "run": str(run), "compact_max_keys": 11,
           "wall_s": 100.0, "peak_rss": 1e9, "peak_pss": None, "stages": stages, "disk_bytes": 1, "store_bytes": 1,
           "store": "compact", "store_setting": "auto", "report_bytes": 1,
           "report": {"interactive_s": 1.0}, "explore": {"map_p95_ms": 1.0, "search_p95_ms": 1.0}}
    dense = {**dev, "wall_s": 300.0, "peak_rss": 2e9, "disk_bytes": 3e9, "features": 13_000, "dense": True}
    monkeypatch.setattr(sd, "_arm", lambda ctx, q, **kw: dense if kw.get("dense") else dev)
    monkeypatch.setattr(sd, "_forward_arm", lambda arm: {"wall_s": 50.0 if arm is dev else 120.0})
    monkeypatch.setattr(sd, "run_cli", fake_run_cli)
    monkeypatch.setattr(sd, "write_bert_base", lambda folder: {"checked": True})
    monkeypatch.setattr(bench.common.squadgen, "write_squad", lambda path, n, seed=0, dense=False: path)
    figures = {}
    ctx = types.SimpleNamespace(tmp=tmp_path, state={},
                                figure=lambda name, value, op, goal, settings: figures.update({name: value}))
    sd.bench_squad_dev(ctx, [sd.DEV_QUESTIONS], 20, [sd.DEV_QUESTIONS])
    dev_features = sd.DEV_QUESTIONS * dev["features"] / dev["examples"]
    # the dense arm and both against the bare forward of their own features
    assert figures["squad_dev_e2e_vs_forward"] == pytest.approx(100.0 / 50.0)
    assert figures["squad_dev_dense_e2e_vs_forward"] == pytest.approx(300.0 / 120.0)
    assert figures["squad_dev_dense_e2e_min"] == pytest.approx(5.0)
    assert (figures["squad_dev_dense_peak_rss_gb"], figures["squad_dev_dense_disk_gb"]) == (2.0, 3.0)
    # BERT-base (12 x 12) at dev's size, fitted to the default budget as the extract stage's pre-flight would
    from attnclust.config import JobConfig
    from attnclust.stages.extract import compact_store_bytes, store_bytes
    from attnclust.store.plan import plan_store

    seq = np.full(12_000, 160)
    plan = plan_store(JobConfig.from_dict({"extract": {"store": "compact"}}), seq, num_layers=12, num_heads=12,
                      full_bytes=store_bytes(seq, num_layers=12, num_heads=12, dtype="float16"),
                      compact_bytes=compact_store_bytes(seq, num_layers=12, num_heads=12))
    assert plan.fitted and plan.sample_cut and 0 < len(plan.sample) < 256
    want = (100 * dev_features + len(plan.sample) * 1000) / 1e9
    assert figures["squad_dev_bertbase_store_gb"] == pytest.approx(want)
    assert figures["squad_dev_bertbase_other_store_gb"] == pytest.approx(1000 * dev_features / 1e9)
    assert ["extract.store=compact", "extract.exact_sample=0", f"extract.compact_max_keys={plan.max_keys}"] == \
        seen[-1][1:]


@pytest.mark.slow
def test_bare_forward_covers_the_runs_features_on_one_process_per_worker(tmp_path, tiny_bert_dir, small_squad):
    """The physical-limit arm: every feature of the run's features.parquet goes through a forward once, the
    extract stage's batches dealt over the processes; the wall is the slowest process."""
    from attnclust.config import JobConfig
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor
    from attnclust.stages.extract import CPU_BATCH_SIDE, batch_ranges
    from bench.figures.squad_dev import bare_forward_workers

    cfg = JobConfig.from_dict({"name": "t", "data": {"path": str(small_squad)}, "model": {"name": str(tiny_bert_dir)}})
    run_job(cfg, tmp_path / "run", stages=("extract",), executor=SerialExecutor(), progress=False)
    seq_len = pd.read_parquet(tmp_path / "run" / "features.parquet").sort_values("feature_id")["seq_len"].to_numpy()
    got = bare_forward_workers(tmp_path / "run", workers=2, model=str(tiny_bert_dir))
    assert got["features"] == len(seq_len) and got["tokens"] == int(seq_len.sum())
    assert got["batches"] == len(batch_ranges(seq_len, 8, pairs=8 * CPU_BATCH_SIDE ** 2))
    assert len(got["worker_s"]) == 2 and got["wall_s"] == max(got["worker_s"]) > 0
