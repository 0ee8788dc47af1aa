"""Featurizer figures: the ResNet stage against a bare forward, and clustering quality on planted patterns."""

from __future__ import annotations

import time

import numpy as np

from ..common.inproc import features_near_median, run_extract, run_featurize
from ..common.timing import interleave, median

__all__ = ["bench_cluster_quality", "bench_featurize_resnet"]


def bench_featurize_resnet(ctx, n_features: int, reps: int) -> None:
    """``featurize_resnet_vs_bare``: featurize_block (method resnet, weights none) over a store vs the bare net.

    The bare arm feeds the same network object (``load_resnet``: channels_last, eval) pre-made
    (n_maps, 3, S, S) channels_last tensors on the run's device in the same batch size, under inference_mode, at
    the precision the stage resolves ``featurize.precision`` to there (the default ``auto``: bf16 autocast on a CPU
    with native bf16, float16 on a GPU).
    """
    import torch

    from attnclust.backend import torch_device
    from attnclust.config import JobConfig
    from attnclust.featurize.resnet import autocast_for, load_resnet, resolve_batch_size, resolve_precision

    from .extraction import sync_device

    feats = features_near_median(ctx.inputs["features"], n_features)
    cfg = JobConfig.from_dict({**ctx.cfg.to_dict(), "featurize": {"method": "resnet", "arch": "resnet18",
                                                                  "weights": "none", "image_size": 224}})
    out = ctx.tmp / "featurize_resnet"
    run_extract(out, feats, cfg, ctx.inputs["model_info"])
    n_maps = len(feats) * ctx.inputs["model_info"]["num_layers"] * ctx.inputs["model_info"]["num_heads"]
    fc = cfg.featurize
    device = torch_device(ctx.backend)
    net = load_resnet(fc.arch, fc.weights, device)
    precision = resolve_precision(fc.precision, device)  # what the stage runs at on this backend
    x = torch.rand(n_maps, 3, fc.image_size, fc.image_size, device=device).contiguous(
        memory_format=torch.channels_last)
    bs = resolve_batch_size(fc.batch_size, device)  # the stage's batch on this backend
    batches = [x[b0:b0 + bs] for b0 in range(0, n_maps, bs)]

    def bare(r):
        t0 = time.perf_counter()
        with torch.inference_mode(), autocast_for(precision, device):
            for b in batches:
                net(b).float()
        sync_device(device)
        return time.perf_counter() - t0

    times = interleave({"featurize_stage": lambda r: run_featurize(out, cfg)["seconds"], "bare": bare}, reps)
    tp = {k: n_maps / median(v) for k, v in times.items()}
    ctx.figure("featurize_resnet_vs_bare", tp["featurize_stage"] / tp["bare"], ">=", 0.9, {
        "arch": fc.arch, "weights": "none (random init: no pretrained weights on this machine; same cost)",
        "image_size": fc.image_size, "batch_size": f"{fc.batch_size} -> {bs}",
        "precision": f"{fc.precision} -> {precision}",
        "maps": n_maps, "features": len(feats),
        "seq_len": feats["seq_len"].tolist(), "repetitions": reps, "torch_threads": torch.get_num_threads(),
        "seconds": {k: [round(v, 3) for v in vs] for k, vs in times.items()},
        "maps_per_second": {k: round(v, 2) for k, v in tp.items()},
        "note": "featurize_block (read store, crop, scale per map, resize, normalise, net, write embedding.zarr) "
                "vs the same net on pre-made channels_last tensors, both at the resolved precision"})


def bench_cluster_quality(ctx, n_per_type: int, lengths: tuple[int, int]) -> None:
    """``cluster_quality_defaults_vs_seed``: ARI against the planted head types, the default featurizer
    (``profile``) over the seed's (ResNet-50 on 384-padded maps); the other featurizers beside it.

    Maps from ``attnclust.synthetic.planted_head_maps``: the eight head types (previous, next, self, [CLS], [SEP],
    punctuation, block, broad), each map on its own token sequence of a random length in ``lengths``, noise 0.2.
    Ours see each map at its true length through the registered featurizers (``profile`` with its token masks,
    ``pooled`` 32 x 32, ``resnet`` = ResNet-18 with ``weights: none`` at 224 px); the seed's featurizer sees each
    zero-padded to 384 x 384 (as the seed's maps were). The SAME clustering follows every arm: scikit-learn KMeans
    with k = 8 (n_init 20, random_state 0) on the raw vectors. Both ResNets are randomly initialised (no weights can
    be downloaded here): their ARI is a floor for pretrained weights, their cost is the same.
    """
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score

    from attnclust.config import load_job
    from attnclust.featurize import TokenContext, embed_with_context, get_featurizer
    from attnclust.featurize.resnet import resolve_precision
    from attnclust.synthetic import HEAD_TYPES, planted_head_maps

    from ..common.seed import SEED_SIZE, seed_featurize_maps, seed_resnet50

    rng = np.random.default_rng(0)
    maps, labels, seqs = planted_head_maps(n_per_type, lengths=lengths, rng=rng, noise=0.2)
    arms = {}
    for method in ("profile", "pooled", "resnet"):
        cfg = load_job(None, [f"featurize.method={method}", "featurize.weights=none"]).featurize
        featurizer = get_featurizer(method)
        t0 = time.perf_counter()
        vecs = [embed_with_context(featurizer, m[None], cfg,
                                   context=TokenContext.from_tokens([q.tokens], [q.segment_ids]))
                for m, q in zip(maps, seqs)]
        arms[method] = (np.concatenate(vecs), time.perf_counter() - t0)
    padded = np.zeros((len(maps), SEED_SIZE, SEED_SIZE), dtype=np.float32)
    for i, m in enumerate(maps):
        padded[i, :len(m), :len(m)] = m
    net = ctx.state.get("seed_net") or seed_resnet50()
    t0 = time.perf_counter()
    arms["seed"] = (seed_featurize_maps(net, padded), time.perf_counter() - t0)

    def ari(x):
        km = KMeans(n_clusters=len(HEAD_TYPES), n_init=20, random_state=0)
        return float(adjusted_rand_score(labels, km.fit_predict(x)))

    scores = {name: ari(x) for name, (x, _) in arms.items()}
    a_ours, a_seed = scores["profile"], scores["seed"]
    value = a_ours / a_seed if a_seed > 1e-3 else float("inf") if a_ours > 1e-3 else float("nan")
    ctx.figure("cluster_quality_defaults_vs_seed", value, ">=", 1.0, {
        "ari": {name: round(v, 4) for name, v in scores.items()}, "maps": len(maps), "types": list(HEAD_TYPES),
        "per_type": n_per_type, "lengths": list(lengths), "noise": 0.2,
        "ours": "profile (the default) at true length with token masks; pooled 32x32; resnet = ResNet-18, "
                f"weights none, 224 px, precision auto -> {resolve_precision('auto', 'cpu')}",
        "seed": "384-padded, per-column MinMaxScaler 0-255, 3 channels, ResNet-50 at 384 px, random init (the seed "
                "used Barlow Twins weights)",
        "clustering": "sklearn KMeans k=8, n_init=20, random_state=0 on every arm",
        "featurize_seconds": {name: round(t, 3) for name, (_, t) in arms.items()}})
    print("#   ARI vs the 8 planted types: " + ", ".join(f"{k} {v:.3f}" for k, v in scores.items()), flush=True)
