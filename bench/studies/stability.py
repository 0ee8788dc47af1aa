"""Cluster stability on a finished run (issue 12): the cost of choosing k by split-half stability and of the final
fit, the k chosen, every candidate's stability, each cluster's bootstrap stability, and whether seeds agree.

::

    .venv/bin/attnclust run --out /tmp/stab_demo          # once: the demo job (jobs/demo.yaml), about a minute
    .venv/bin/python -m bench.studies.stability --out /tmp/stab_demo [--seeds 0 1 2] [--set cluster.stability_splits=6]

The fit is the package's (:func:`attnclust.cluster.fit_from_store`, the job's cluster settings from
``jobs/demo.yaml`` with ``--set`` overrides, UMAP off: it does not touch k or the labels), once per seed
(``cluster.random_state``). Every figure comes from this one run: times are wall seconds of each part of the fit
(``timings_``) with the 1-minute load average beside them; the labels of every map under each seed are compared
pairwise by ARI. For contrast, the selection this issue replaced is measured on the same maps: the silhouette's
pick (computed anyway, for reference) and the final KMeans with the old 4 restarts, seeds against each other.
Last, the split design: the same ``random_state`` with other ``cluster.stability_seed`` values (``--split-seeds``),
to show how much the chosen k depends on which examples fall in which half.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

__all__ = ["main"]


def _load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def main(argv: list[str] | None = None) -> int:
    """Run the stability bench; print one block of figures; return the exit status."""
    from sklearn.metrics import adjusted_rand_score

    from attnclust import backend as bk
    from attnclust.cluster import fit_from_store
    from attnclust.config import default_job_path, load_job
    from attnclust.stages.cluster import model_record
    from attnclust.stages.featurize import open_embedding

    parser = argparse.ArgumentParser(prog="python -m bench.studies.stability", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="/tmp/stab_demo", help="a finished run of the demo job")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--split-seeds", type=int, nargs="*", default=[0, 1, 2],
                        help="cluster.stability_seed values to compare (random_state = the first seed)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)

    cfg = load_job(default_job_path(), ["cluster.umap=false", *args.overrides]).cluster
    x_all = open_embedding(Path(args.out))["embedding"][:]
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    print(f"run {args.out}: {x_all.shape[0]} maps x {x_all.shape[1]} dims; k {cfg.k_min}..{cfg.k_max}, "
          f"n_init {cfg.n_init}, {cfg.stability_splits} splits, {cfg.stability_resamples} resamples, "
          f"tolerance {cfg.stability_tolerance}; OMP_NUM_THREADS={threads}, {os.cpu_count()} CPUs")

    fits, labels, records = {}, {}, {}
    for seed in args.seeds:
        load = _load()
        t0 = time.perf_counter()
        fitted = fit_from_store(args.out, cfg.replace(random_state=seed))
        total = time.perf_counter() - t0
        fits[seed], records[seed] = fitted, model_record(fitted, cfg.replace(random_state=seed))
        labels[seed] = bk.to_numpy(fitted.kmeans_.predict(fitted.reduce(x_all)))
        t = fitted.timings_
        silhouette_pick = max(fitted.k_scores_, key=fitted.k_scores_.get) if fitted.k_scores_ else None
        print(f"\nseed {seed}: k = {fitted.k_} (silhouette would pick {silhouette_pick}); load {load}")
        print(f"  time: k selection {t.get('choose_k', 0):.1f} s ({len(fitted.k_stability_)} candidates x "
              f"{cfg.stability_splits} splits x 2 fits), silhouette for reference {t.get('silhouette', 0):.1f} s, "
              f"final KMeans {t['kmeans']:.2f} s, per-cluster stability {t.get('bootstrap', 0):.1f} s, "
              f"whole fit {total:.1f} s")
        print("  split-half ARI per k (median / mean +- std [min, max]):")
        for k, rec in records[seed]["k_stability"].items():
            mark = "  <- chosen" if int(k) == fitted.k_ else ""
            print(f"    k={int(k):2d}  {rec['median']:.3f} / {rec['mean']:.3f} +- {rec['std']:.3f} "
                  f"[{rec['min']:.3f}, {rec['max']:.3f}]{mark}")
        sizes = np.bincount(labels[seed], minlength=fitted.k_)
        print("  per-cluster bootstrap Jaccard (size): " + ", ".join(
            f"{c}: {s:.2f} ({n})" for c, (s, n) in enumerate(zip(fitted.cluster_stability_, sizes, strict=True)))
            if fitted.cluster_stability_ is not None else "  per-cluster stability off")
        print(f"  unstable (< {cfg.min_stability}): {records[seed]['unstable_clusters']}")

    pairs = list(itertools.combinations(args.seeds, 2))
    ari = {f"{a}-{b}": float(adjusted_rand_score(labels[a], labels[b])) for a, b in pairs}
    ks = {seed: fits[seed].k_ for seed in args.seeds}
    print(f"\nseeds {args.seeds}: chosen k {ks} (same: {len(set(ks.values())) == 1}); pairwise ARI of the labels "
          + ", ".join(f"{p} {v:.3f}" for p, v in ari.items()) + f" (min {min(ari.values()):.3f}, goal >= 0.95)")

    # the replaced selection, on the same maps: the old final fit (4 restarts) at the chosen k, seeds against each other
    k0 = fits[args.seeds[0]].k_
    z = fits[args.seeds[0]].reduce(x_all)
    old = {}
    t0 = time.perf_counter()
    for seed in args.seeds:
        old[seed] = bk.to_numpy(bk.make_kmeans("cpu", n_clusters=k0, random_state=seed, n_init=4).fit_predict(z))
    old_fit = (time.perf_counter() - t0) / len(args.seeds)
    old_ari = {f"{a}-{b}": float(adjusted_rand_score(old[a], old[b])) for a, b in pairs}
    print(f"before (KMeans n_init 4 at k={k0}, {old_fit:.2f} s a fit): pairwise ARI "
          + ", ".join(f"{p} {v:.3f}" for p, v in old_ari.items()))
    choose = [fits[s].timings_.get("choose_k", 0) for s in args.seeds]
    sil = [fits[s].timings_.get("silhouette", 0) for s in args.seeds]
    final = [fits[s].timings_["kmeans"] for s in args.seeds]
    if all(sil):
        print(f"ratios (medians over seeds): k selection / old silhouette selection "
              f"{np.median(choose) / np.median(sil):.1f}x; final fit n_init {cfg.n_init} / n_init 4 "
              f"{np.median(final) / old_fit:.1f}x")
    # the split design: the same random_state, other stability_seed values (the larger source of noise)
    designs = {}
    for split_seed in args.split_seeds:
        c = cfg.replace(random_state=args.seeds[0], stability_seed=split_seed)
        if c == cfg.replace(random_state=args.seeds[0]):
            designs[split_seed] = fits[args.seeds[0]]
        else:
            designs[split_seed] = fit_from_store(args.out, c.replace(stability_resamples=None))
    if designs:
        print(f"split designs (random_state {args.seeds[0]}): " + "; ".join(
            f"stability_seed {d}: k = {f.k_} (" + ", ".join(
                f"{k}: {np.median(v):.3f}" for k, v in f.k_stability_.items() if np.median(v) >= 0.9) + ")"
            for d, f in designs.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "settings": cfg.to_dict(), "omp_num_threads": threads, "chosen_k": ks, "pairwise_ari": ari,
            "pairwise_ari_n_init_4": old_ari, "timings": {s: fits[s].timings_ for s in args.seeds},
            "k_stability": {s: records[s]["k_stability"] for s in args.seeds},
            "cluster_stability": {s: records[s]["cluster_stability"] for s in args.seeds},
            "k_by_stability_seed": {d: f.k_ for d, f in designs.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
