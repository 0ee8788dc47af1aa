"""End-to-end figures: the seed pipeline against attnclust (ResNet-50 like the seed, and the default job)."""

from __future__ import annotations

import time

import numpy as np

from attnclust.stages.extract import plan_features

from .inproc import features_near_median, job_config, run_all, select_features
from .seed import SEED_K, SeedPipeline, seed_resnet50
from .timing import interleave, median

__all__ = ["bench_e2e", "warm_umap"]


def warm_umap() -> float:
    """Pay umap-learn's one-time numba compilation (per process) outside any timed arm; returns seconds.

    Two fits: below 4,096 rows umap-learn takes exact nearest neighbours, above it NN-descent (pynndescent);
    each path compiles its own functions on first use.
    """
    from attnclust.backend import make_umap

    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for n in (200, 4200):
        x = rng.normal(size=(n, 8)).astype(np.float32)
        u = make_umap("cpu", n_neighbors=15, min_dist=0.1, random_state=0)
        u.n_epochs = 10  # the compiled code is the same; fewer epochs only shorten the warm-up's own work
        u.fit(x)
        u.transform(x[:20] + 0.01)
    return time.perf_counter() - t0


def bench_e2e(ctx, *, n_seed_features: int, maps_timed: int | None, n_default_examples: int) -> None:
    """``e2e_vs_seed_same_featurizer`` and ``e2e_vs_seed_defaults``, arms interleaved per repetition.

    Repetition r: the seed pipeline on feature r (one feature), attnclust with ResNet-50 on feature r (extract ->
    featurize resnet50 at 224 px -> cluster with k = min(35, maps), no UMAP, as the seed had none), and
    attnclust with the demo job's settings on ``n_default_examples`` examples (pooled 32x32, k auto, PCA, UMAP).
    Everything in-process; the ResNet-50s are randomly initialised.
    """
    import torch

    info = ctx.inputs["model_info"]
    maps_per_feature = info["num_layers"] * info["num_heads"]
    feats = features_near_median(ctx.inputs["features"], n_seed_features)
    seed_net = seed_resnet50()
    ctx.state["seed_net"] = seed_net
    seed = SeedPipeline(ctx.model, ctx.tmp / "seed", net=seed_net, maps_timed=maps_timed,
                        pad_id=int(getattr(ctx.model.config, "pad_token_id", 0) or 0))
    k_same = min(SEED_K, maps_per_feature)
    cfg_r50 = job_config(ctx.data_path,
                         featurize={"method": "resnet", "arch": "resnet50", "weights": "none", "image_size": 224,
                                    "batch_size": 64},
                         cluster={"k": k_same, "umap": False})
    default_feats = select_features(ctx.inputs["features"], ctx.inputs["examples"]["id"][:n_default_examples])
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

        load_resnet("resnet50", "none", "cpu")  # the per-process model cache, as on a worker
        rec = run_all(ctx.tmp / "ours_r50", one(r), cfg_r50, info)
        r50_parts.append(rec)
        return rec["total"]

    def arm_default(r):
        rec = run_all(ctx.tmp / "ours_default", default_feats, cfg_def, info)
        def_parts.append(rec)
        return rec["total"] / len(default_feats)

    # warm-ups (untimed): umap's numba compilation, each net's first call
    umap_compile = ctx.state.get("umap_compile_s")
    if umap_compile is None:
        umap_compile = ctx.state["umap_compile_s"] = warm_umap()
    with torch.inference_mode():  # at the seed's shape: the first call of a shape builds oneDNN primitives
        seed_net(torch.zeros(1, 3, 384, 384))
    arm_r50(-1)
    arm_default(-1)
    seed_parts.clear(), r50_parts.clear(), def_parts.clear()
    times = interleave({"seed": arm_seed, "ours_resnet50": arm_r50, "ours_default": arm_default},
                       n_seed_features, warmup=False)
    s_seed, s_r50, s_def = (median(times[k]) for k in ("seed", "ours_resnet50", "ours_default"))

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
    ctx.figure("e2e_vs_seed_same_featurizer", s_seed / s_r50, ">=", 5.0, {
        **common, "ours_seconds_per_feature": round(s_r50, 2),
        "ours_parts_median_s": parts(r50_parts, ("extract", "featurize", "cluster")),
        "ours": f"in-process extract -> featurize resnet50 (weights none = random init) 224 px batch 64 -> "
                f"cluster k={k_same}, PCA 50, no UMAP; one feature per repetition (the seed's features)"})
    ctx.figure("e2e_vs_seed_defaults", s_seed / s_def, ">=", 100.0, {
        **common, "ours_seconds_per_feature": round(s_def, 4), "ours_features": len(default_feats),
        "ours_examples": n_default_examples,
        "ours_parts_median_s": parts(def_parts, ("extract", "featurize", "cluster", "total")),
        "ours_k": [r.get("k") for r in def_parts],
        "umap_numba_compile_s_excluded": round(umap_compile, 1),
        "ours": "jobs/demo.yaml settings (pooled 32x32, k auto 6..16 by silhouette, PCA 50, UMAP on), in-process, "
                "on the first examples of the generated set; per feature = stage total / features; umap-learn's "
                "one-time numba compilation per process is paid before timing and excluded"})
