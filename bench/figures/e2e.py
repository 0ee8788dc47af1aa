"""End-to-end figures: the seed pipeline against attnclust (ResNet-50 like the seed, and the default job)."""

from __future__ import annotations

import time

from attnclust.stages.extract import plan_features

from ..common.inproc import features_near_median, job_config, run_all, select_features
from ..common.seed import SEED_K, SeedPipeline, seed_resnet50
from ..common.timing import median

__all__ = ["bench_e2e", "warm_umap"]


def warm_umap() -> float:
    """Pay umap-learn's numba compilation (or its load from the on-disk cache) outside any timed arm; seconds.

    Both paths umap-learn compiles separately (:func:`bench.figures.numba_cache.umap_workload`): the cluster
    stage's exact graph, and NN-descent + ``transform``.
    """
    from .numba_cache import WORKLOADS, umap_workload

    t0 = time.perf_counter()
    for which in WORKLOADS:
        umap_workload(which)
    return time.perf_counter() - t0


def bench_e2e(ctx, *, n_seed_features: int, maps_timed: int | None, n_default_examples: int,
              default_reps: int = 1) -> None:
    """``e2e_vs_seed_same_featurizer`` and ``e2e_vs_seed_defaults_n400``, arms interleaved per repetition.

    Repetition r: the seed pipeline on feature r (one feature), attnclust with ResNet-50 on feature r (extract ->
    featurize resnet50 at 224 px -> cluster with k = min(35, maps), no UMAP, as the seed had none), and (for the
    first ``default_reps`` repetitions) attnclust with the demo job's settings on the first ``n_default_examples``
    questions (profile featurizer, k auto, UMAP). The seed is far too slow to run on those questions here (7-18 s
    per feature): its time on them is its measured median seconds per feature times their number of
    features (every seed feature is padded to 384 tokens, so its cost does not depend on the feature).
    Everything in-process; the ResNet-50s are randomly initialised.
    """
    import torch

    from attnclust.backend import torch_device
    from attnclust.featurize.resnet import resolve_batch_size, resolve_precision

    device = torch_device(ctx.backend)
    info = ctx.inputs["model_info"]
    maps_per_feature = info["num_layers"] * info["num_heads"]
    feats = features_near_median(ctx.inputs["features"], n_seed_features)
    seed_net = seed_resnet50()
    ctx.state["seed_net"] = seed_net
    seed = SeedPipeline(ctx.model, ctx.tmp / "seed", net=seed_net, maps_timed=maps_timed,
                        pad_id=int(getattr(ctx.model.config, "pad_token_id", 0) or 0))
    k_same = min(SEED_K, maps_per_feature)
    cfg_r50 = job_config(ctx.data_path, backend=ctx.backend,
                         featurize={"method": "resnet", "arch": "resnet50", "weights": "none", "image_size": 224},
                         cluster={"k": k_same, "umap": False})
    example_ids = ctx.inputs["examples"]["id"]
    if len(example_ids) < n_default_examples:
        raise ValueError(f"bench e2e: default_examples {n_default_examples} > dataset_examples {len(example_ids)}; "
                         f"raise --size dataset_examples")
    default_feats = select_features(ctx.inputs["features"], example_ids[:n_default_examples])
    warm_feats = select_features(ctx.inputs["features"], example_ids[:8])
    cfg_def = ctx.demo_cfg

    def one(r):  # feature r alone, re-planned (feature_id 0); the warm-up (r = -1) uses feature 0
        return plan_features(feats.iloc[[max(r, 0) % len(feats)]].drop(columns="feature_id"))
    seed_parts, r50_parts, def_parts = [], [], []

    def arm_seed(r):
        rec = seed.run(one(r), f"r{r}")
        seed_parts.append(rec)
        return rec["total"]

    def arm_r50(r):
        from attnclust.featurize.resnet import load_resnet

        load_resnet("resnet50", "none", device)  # the per-process model cache, as on a worker
        rec = run_all(ctx.tmp / "ours_r50", one(r), cfg_r50, info)
        r50_parts.append(rec)
        return rec["total"]

    def arm_default(r):  # the warm-up (r = -1) on 8 questions only: it pays first calls, not the work
        rec = run_all(ctx.tmp / "ours_default", warm_feats if r < 0 else default_feats, cfg_def, info)
        def_parts.append(rec)
        return rec["total"]

    # warm-ups (untimed): umap's numba compilation, each net's first call
    umap_compile = ctx.state.get("umap_compile_s")
    if umap_compile is None:
        umap_compile = ctx.state["umap_compile_s"] = warm_umap()
    with torch.inference_mode():  # at the seed's shape: the first call of a shape builds oneDNN primitives
        seed.net(torch.zeros(1, 3, 384, 384, device=device))
    arm_r50(-1)
    arm_default(-1)
    seed_parts.clear(), r50_parts.clear(), def_parts.clear()
    times: dict[str, list[float]] = {"seed": [], "ours_resnet50": [], "ours_default_n": []}
    for r in range(max(n_seed_features, default_reps)):
        if r < n_seed_features:
            times["seed"].append(arm_seed(r))
            times["ours_resnet50"].append(arm_r50(r))
        if r < default_reps:
            times["ours_default_n"].append(arm_default(r))
    s_seed, s_r50, s_def = (median(times[k]) for k in ("seed", "ours_resnet50", "ours_default_n"))
    n_def = len(default_feats)
    seed_n = s_seed * n_def

    def parts(recs, keys):
        return {k: round(median([r[k] for r in recs]), 3) for k in keys}

    seed_note = ("seed: batch 1 padded to 384, per-column MinMaxScaler 0-255, 3 channels, unnormalised ResNet-50 "
                 "at 384 px, random init (seed: Barlow Twins), batch 1 per map, CSV append, sklearn KMeans "
                 "k=min(35, maps) on the CSV read back")
    timed_note = (f"seed featurizer timed on {maps_timed} of {maps_per_feature} maps per feature and scaled "
                  f"x{maps_per_feature / maps_timed:.1f} (every seed map is 384x384 at batch 1: same cost per map)"
                  if maps_timed else "seed featurizer timed on every map")
    common = {"seed_seconds_per_feature": round(s_seed, 2), "seed_parts_median_s": parts(
        seed_parts, ("forward", "featurize", "csv", "cluster")), "seed_features_timed": len(feats),
        "seed_feature_seq_len": feats["seq_len"].tolist(), "seed_maps_timed_per_feature": maps_timed or
        maps_per_feature, "repetitions": n_seed_features, "seed": seed_note, "seed_timing": timed_note,
        "model": ctx.cfg.model.name, "torch_threads": torch.get_num_threads(),
        "seconds": {k: [round(x, 3) for x in v] for k, v in times.items()}}
    ctx.figure("e2e_vs_seed_same_featurizer", s_seed / s_r50, ">=", 2.6, {
        **common, "ours_seconds_per_feature": round(s_r50, 2),
        "ours_parts_median_s": parts(r50_parts, ("extract", "featurize", "cluster")),
        "ours_precision": f"featurize.precision {cfg_r50.featurize.precision} -> "
                          f"{resolve_precision(cfg_r50.featurize.precision, device)} (the seed arm: float32)",
        "ours": f"in-process extract -> featurize resnet50 (weights none = random init) 224 px, "
                f"batch {resolve_batch_size(cfg_r50.featurize.batch_size, device)} -> "
                f"cluster k={k_same}, PCA 50, no UMAP; one feature per repetition (the seed's features)"})
    ctx.figure(f"e2e_vs_seed_defaults_n{n_default_examples}", seed_n / s_def, ">=", 150.0, {
        **common, "questions": n_default_examples, "features": n_def, "maps": n_def * maps_per_feature,
        "ours_seconds": round(s_def, 2), "ours_repetitions": default_reps,
        "seed_seconds_scaled": round(seed_n, 1),
        "seed_scaling": f"NOT run on the {n_default_examples} questions (about {seed_n / 3600:.1f} h here): seed "
                        f"seconds per feature (median of {n_seed_features} features near the median length) x "
                        f"{n_def} features; its KMeans on the CSV read back is scaled linearly too",
        "ours_parts_median_s": parts(def_parts, ("extract", "featurize", "cluster", "total")),
        "ours_k": [r.get("k") for r in def_parts],
        "umap_numba_compile_s_excluded": round(umap_compile, 1),
        "ours": "the demo job's defaults (profile featurizer, k auto by stability, PCA, UMAP, kNN placement), "
                f"in-process, on the first {n_default_examples} generated questions, all stages run for real; "
                "umap-learn's numba compilation (or its load from the numba cache) is paid before timing"})
