"""Where the extract stage's conversion spends its time beside the forward, per (feature, layer), and whether doing
one layer of several features in one call would be cheaper (it is not, on a CPU).

The extract stage converts each layer of each feature inside the forward
(``attnclust.stages.extract_writers.ShardFiller``): one pass of row sums gives the ``profile`` vectors and the
per-map statistics (``profile_and_statistics``), then a compact store encodes each row's largest weights
(``compact_maps``) and measures each map's error (``error_spread``). Here the packaged MiniLM's exact maps of
generated SQuAD-v2 features (``bench/common/squadgen.py``) go through those same functions on one thread, as in a
Dask worker, and each part is timed per (feature, layer) beside the forward that made the maps (one feature a
forward: the model's own cost per layer, as the stage's one-thread workers pay it, without the batch's padding).

Batching: the issue's suggested next step was one call per layer for all features of a batch. The row sums'
functions already take the maps of several features of one length (a token context with one row per feature),
so ``batched_over_single`` times ``profile_tensor`` on ``F`` copies of one layer's maps in one call against one
call per copy: a ratio near 1 means the cost is in the elements (the passes over the weights), not in each call's
fixed cost, and batching cannot help.

    .venv/bin/python -m bench.studies.conversion_cost [--examples 40] [--features 12] [--keys 13] [--reps 5]

Prints one line per figure (``name value unit``); nothing here is a test.
"""

from __future__ import annotations

import argparse
import functools
import time

import numpy as np
import pandas as pd

__all__ = ["batching_ratio", "conversion_parts", "main"]


def _ms(fn, reps: int) -> float:
    """Median milliseconds of ``reps`` calls of ``fn`` after one untimed call."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * float(np.median(times))


def conversion_parts(examples: int, features: int, keys: int, reps: int) -> dict[str, float]:
    """Milliseconds per (feature, layer), averaged over up to ``features`` generated features: the forward (over
    the model's layers), and each part of a compact store's conversion at ``keys`` keys a row."""
    import torch

    from attnclust.config import ModelConfig
    from attnclust.models.runner import get_model, run_forward
    from attnclust.stages.extract_writers import FeatureTokens, profile_and_statistics
    from attnclust.store import compact_maps

    from ..common.squadgen import generated_feature_maps

    parts: dict[str, list[float]] = {"forward": [], "profile_and_statistics": [], "compact_rows": [],
                                     "compact_rows_and_error": [], "tokens": []}
    loaded = get_model(ModelConfig(), threads=1, device="cpu")
    for row, maps in generated_feature_maps(examples, features):
        layers, heads = maps.shape[:2]
        forward = functools.partial(run_forward, loaded, pd.DataFrame([row]), attentions=False)
        parts["forward"].append(_ms(forward, reps) / layers)
        parts["tokens"].append(int(row.seq_len))
        feature = FeatureTokens(row.tokens, row.segment_ids, 1, heads, "cpu")
        calls = {"profile_and_statistics": functools.partial(profile_and_statistics, tokens=row.tokens,
                                                             segment_ids=row.segment_ids, feature=feature),
                 "compact_rows": functools.partial(compact_maps, mass=0.95, max_keys=keys, with_kept=True),
                 "compact_rows_and_error": functools.partial(compact_maps, mass=0.95, max_keys=keys, with_kept=True,
                                                             error_spread="keys")}
        with torch.inference_mode():
            for name, call in calls.items():
                parts[name].append(float(np.mean([_ms(functools.partial(call, maps[i:i + 1]), reps)
                                                  for i in range(layers)])))
    return {name: float(np.mean(v)) for name, v in parts.items()}


def batching_ratio(n: int, heads: int, copies: int, reps: int) -> float:
    """``profile_tensor``'s milliseconds for ``copies`` features' maps of one layer (``heads`` maps of ``n``
    tokens each) in one call, over ``copies`` calls of one feature's: planted maps, one thread."""
    import torch

    from attnclust.featurize import TokenContext
    from attnclust.maps.profile import ProfilePlan, profile_tensor
    from attnclust.synthetic import HEAD_TYPES, planted_head_map, planted_tokens

    rng = np.random.default_rng(0)
    seq = planted_tokens(n, rng=rng)
    one = np.stack([planted_head_map(HEAD_TYPES[h % len(HEAD_TYPES)], seq, rng=rng, noise=0.2)
                    for h in range(heads)]).astype(np.float32)
    single = torch.from_numpy(one)
    batched = torch.from_numpy(np.concatenate([one] * copies))

    def plan(k: int) -> ProfilePlan:
        ctx = TokenContext.from_tokens([seq.tokens] * k, [seq.segment_ids] * k, maps_per_row=heads)
        return ProfilePlan(ctx, k * heads, n, "cpu")

    plan_one, plan_all = plan(1), plan(copies)
    with torch.inference_mode():
        each = _ms(lambda: [profile_tensor(single, return_rows=True, plan=plan_one) for _ in range(copies)], reps)
        together = _ms(lambda: profile_tensor(batched, return_rows=True, plan=plan_all), reps)
    return together / each


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=40)
    parser.add_argument("--features", type=int, default=12)
    parser.add_argument("--keys", type=int, default=13, help="keys a compact row (dev's budget: 13)")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)  # a Dask worker's one thread
    parts = conversion_parts(args.examples, args.features, args.keys, args.reps)
    print(f"# MiniLM, {args.features} generated dense features, mean {parts.pop('tokens'):.0f} tokens, one thread; "
          f"ms per (feature, layer)", flush=True)
    for name, value in parts.items():
        print(f"conversion_{name}_ms {value:.3f} ms", flush=True)
    convert = parts["profile_and_statistics"] + parts["compact_rows_and_error"]
    print(f"conversion_over_forward {convert / parts['forward']:.3f} ratio", flush=True)
    for n in (150, 384):
        for copies in (4, 8):
            print(f"batched_over_single_n{n}_f{copies} {batching_ratio(n, 12, copies, args.reps):.3f} ratio",
                  flush=True)


if __name__ == "__main__":
    main()
