"""How far a compact map is from its exact map, by the key cap: the mean row L1 error of compact rows read three
ways, and the bytes a row each cap costs.

For each key cap, every map of the packaged MiniLM on generated SQuAD-v2 features (``bench/common/squadgen.py``,
the dense arm's lengths unless ``--plain``) is encoded as a compact store encodes it (``compact_mass`` 0.95, the
cap) and read back:

- ``zeros``: the keys a row did not keep read 0 (the store without a spread);
- ``even``: the dropped mass spread evenly over them (``compact.spread: keys``, what the store does);
- ``oracle``: spread in proportion to each key's true dropped weight summed over the map's rows (a per-map key
  profile: what storing one more number per key and map could give at best, for comparison only).

The error of each is ``mean over rows of sum over keys |read - exact|`` (the store's ``map_error``), averaged over
maps; the bytes a row are the storage plan's estimate for the cap (``attnclust.store.plan``), so the cap the
default budget allows can be read against the error it gives.

    .venv/bin/python -m bench.studies.compact_error [--examples 20] [--keys 7 13 24 32 48 64] [--plain]
"""

from __future__ import annotations

import argparse

import numpy as np

__all__ = ["compact_error_by_keys"]


def compact_error_by_keys(examples: int, keys: list[int], *, dense: bool = True, features: int = 10) -> dict:
    """``{cap: {"zeros", "even", "oracle", "row_bytes"}}``: mean row L1 errors over the maps of up to ``features``
    features spread over the generated data's lengths, and the estimated bytes a row."""
    from attnclust.store import compact_maps, decode_compact
    from attnclust.store.plan import ROW_BYTES_ONE_KEY, ROW_KEYS_EXPONENT

    from ..common.squadgen import generated_feature_maps

    errors: dict[int, dict[str, list[float]]] = {k: {"zeros": [], "even": [], "oracle": []} for k in keys}
    for _, maps in generated_feature_maps(examples, features, dense=dense):
        exact = maps.numpy()
        for k in keys:
            codes = compact_maps(maps, mass=0.95, max_keys=k).numpy()
            zeros = decode_compact(codes)
            free = codes == 0
            dropped = np.maximum(1 - zeros.sum(-1, keepdims=True), 0)
            profile = np.where(free, exact, 0).sum(-2, keepdims=True) * free  # (.., row, key): the map's key profile
            oracle = zeros + dropped * profile / np.maximum(profile.sum(-1, keepdims=True), 1e-12)
            for name, read in (("zeros", zeros), ("even", decode_compact(codes, spread="keys")), ("oracle", oracle)):
                errors[k][name].append(float(np.abs(read - exact).sum(-1).mean()))
    return {k: {**{name: round(float(np.mean(v)), 3) for name, v in e.items()},
                "row_bytes": round(ROW_BYTES_ONE_KEY * k ** ROW_KEYS_EXPONENT, 1)} for k, e in errors.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=20)
    parser.add_argument("--keys", type=int, nargs="+", default=[7, 13, 24, 32, 48, 64])
    parser.add_argument("--plain", action="store_true", help="the generator's plain lengths, not the dense arm's")
    args = parser.parse_args()
    result = compact_error_by_keys(args.examples, args.keys, dense=not args.plain)
    print(f"{'keys':>5s} {'zeros':>7s} {'even':>7s} {'oracle':>7s} {'bytes a row':>12s}")
    for k, r in result.items():
        print(f"{k:5d} {r['zeros']:7.3f} {r['even']:7.3f} {r['oracle']:7.3f} {r['row_bytes']:12.1f}")


if __name__ == "__main__":
    main()
