"""``attnclust compare A B --out C``: what changed between two runs over the same examples (e.g. a pre-trained and
a fine-tuned model, two checkpoints), head by head and layer by layer (Kovaleva et al. 2019).

The two runs must hold the same features: the same example ids, spans, tokens (and input ids and segment ids
where both tables have them) and true lengths, and stores with the same layers and heads; otherwise the
comparison is refused in one line (:class:`~attnclust.errors.DataError`) before anything is written.

For every feature and (layer, head), the two maps are compared at the feature's true length:

- ``change``: the mean over query rows of the Jensen-Shannon distance (base 2, 0..1) between the two maps' rows,
  smoothed as in Clark et al. (``0.999 * A + 0.001 / n``; :func:`attnclust.analysis.distances.js_between_maps`);
- ``cosine``: the cosine similarity of the two flattened maps (Kovaleva et al.: 1 = unchanged).

Outputs in ``C`` (names in :class:`attnclust.layout.CompareLayout`; C follows the ownership rules of a run
directory: new, empty or already attnclust's; a file attnclust did not write is never replaced):

- ``compare.parquet``: one row per (layer, head): ``change`` and ``change_std`` (mean and standard deviation over
  the features), ``cosine``, ``rank`` (1 = changed most), ``n_features``; when both runs' ``heads.parquet`` have a
  ``roles`` column also ``roles_a``, ``roles_b``, ``roles_gained``, ``roles_lost`` (comma-separated role names);
- ``compare_layers.parquet``: one row per layer: ``change`` (mean over its heads), ``change_max``, ``cosine``,
  ``n_heads``;
- ``compare.html``: a self-contained report (layer x head heatmap of ``change``, per-layer bars, the heads that
  changed most, roles gained and lost).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from .analysis.distances import js_between_maps
from .errors import DataError
from .executors import StepBars
from .layout import CompareLayout, RunLayout
from .report.figures import head_heatmap_figure, head_matrix, layer_bars_figure, png_data_uri
from .report.pictures import MISSING_GLYPHS
from .report.registry import environment
from .store.contract import (
    atomic_write_bytes,
    atomic_write_parquet,
    check_store_tables,
    open_attention_store,
    read_features,
)

__all__ = ["HEAD_COLUMNS", "LAYER_COLUMNS", "Comparison", "check_same_features", "compare_maps", "compare_runs",
           "render_comparison", "role_changes", "run_compare", "write_comparison"]

HEAD_COLUMNS = ("layer", "head", "change", "change_std", "cosine", "rank", "n_features")
"""Columns of ``compare.parquet`` (plus ``roles_a``, ``roles_b``, ``roles_gained``, ``roles_lost`` with roles)."""
LAYER_COLUMNS = ("layer", "change", "change_max", "cosine", "n_heads")
"""Columns of ``compare_layers.parquet``."""
TOP_HEADS_SHOWN = 12
"""Heads listed in the report's table of the most changed heads."""
_SAME_TOKENS = ("example_id", "span", "seq_len", "tokens", "input_ids", "segment_ids")
_FIX = ("compare needs two runs over the same examples tokenised the same way (same data file, tokenizer, "
        "max_seq_len and doc_stride)")


@dataclass(frozen=True)
class Comparison:
    """The result of :func:`compare_runs`.

    Attributes
    ----------
    heads : pandas.DataFrame
        ``compare.parquet``: one row per (layer, head), :data:`HEAD_COLUMNS` (and the role columns).
    layers : pandas.DataFrame
        ``compare_layers.parquet``: one row per layer, :data:`LAYER_COLUMNS`.
    a, b : pathlib.Path
        The two run directories.
    notes : tuple of str
        What was skipped and why (e.g. roles).
    seconds : float
        Time taken by the map comparison.
    files : dict of str to pathlib.Path
        What :func:`run_compare` wrote (``compare``, ``compare_layers``, ``compare_report``); empty before.
    """

    heads: pd.DataFrame
    layers: pd.DataFrame
    a: Path
    b: Path
    notes: tuple[str, ...] = ()
    seconds: float = 0.0
    files: dict = field(default_factory=dict)


def _values(df: pd.DataFrame, column: str) -> list:
    return [np.asarray(v).tolist() if isinstance(v, (np.ndarray, list, tuple)) else v for v in df[column]]


def check_same_features(a: Path, b: Path):
    """Open both runs and refuse them unless they hold the same features and the same model shape.

    Parameters
    ----------
    a, b : pathlib.Path
        Run directories (or any directories holding a contract store: ``attention.zarr`` + ``features.parquet``).

    Returns
    -------
    features : pandas.DataFrame
        ``features.parquet`` of ``a`` (equal to ``b``'s on the compared columns).
    store_a, store_b : attnclust.store.AttentionStore

    Raises
    ------
    attnclust.errors.DataError
        One line naming the first difference (feature count, a feature's example id, span, length, tokens, input
        ids or segment ids, or the number of layers or heads).
    attnclust.errors.StoreError
        A run's store or features table is missing or damaged.
    """

    a, b = Path(a), Path(b)
    for root in (a, b):
        check_store_tables(root)
    fa, fb = read_features(a), read_features(b)
    store_a = open_attention_store(RunLayout(a).attention)
    store_b = open_attention_store(RunLayout(b).attention)
    head = f"runs {a} and {b} differ:"
    if len(fa) != len(fb):
        raise DataError(f"{head} {len(fa)} features in A, {len(fb)} in B; {_FIX}")
    for column in _SAME_TOKENS:
        if column not in fa.columns or column not in fb.columns:
            continue
        va, vb = _values(fa, column), _values(fb, column)
        for i, (x, y) in enumerate(zip(va, vb)):
            if x != y:
                ex = fa["example_id"].iloc[i]
                raise DataError(f"{head} feature {i} (example {ex!r}) has other {column} in A than in B; {_FIX}")
    if (store_a.n_layers, store_a.n_heads) != (store_b.n_layers, store_b.n_heads):
        raise DataError(f"{head} A has {store_a.n_layers} layers x {store_a.n_heads} heads, B "
                        f"{store_b.n_layers} x {store_b.n_heads}; compare needs models with the same heads")
    return fa, store_a, store_b


def compare_maps(store_a, store_b, *, features: np.ndarray | None = None,
                 on_step: Callable[[str, int, int, str], None] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per feature and head: the JS change and the cosine similarity between corresponding maps of two stores.

    Parameters
    ----------
    store_a, store_b : attnclust.store.AttentionStore
        Stores with the same features, layers and heads (:func:`check_same_features`).
    features : numpy.ndarray of int, optional
        Feature ids to compare (default: all), read shard by shard.
    on_step : callable, optional
        Told ``on_step("maps", done, total, "features")`` (a progress bar).

    Returns
    -------
    change : numpy.ndarray of float64, shape (feature, layer, head)
        Mean over query rows of the rows' Jensen-Shannon distance (base 2) after smoothing; 0 = the same map.
    cosine : numpy.ndarray of float64, shape (feature, layer, head)
        Cosine similarity of the flattened maps (1 = the same map up to scale).
    """
    import torch

    ids = np.arange(store_a.n_features) if features is None else np.sort(np.asarray(features, np.int64))
    change = np.zeros((len(ids), store_a.n_layers, store_a.n_heads))
    cosine = np.zeros_like(change)
    step = store_a.features_per_task
    groups = [ids[(ids >= s) & (ids < s + step)] for s in range(0, store_a.n_features, step)]
    done = 0
    if on_step is not None:
        on_step("maps", 0, len(ids), "features")
    for group in groups:
        if not len(group):
            continue
        lo, hi = int(group[0]), int(group[-1]) + 1
        block_a, block_b = store_a.read_block(lo, hi), store_b.read_block(lo, hi)
        for f in group:
            n = int(store_a.seq_len[f])
            a = torch.from_numpy(np.ascontiguousarray(block_a[f - lo, :, :, :n, :n]))
            b = torch.from_numpy(np.ascontiguousarray(block_b[f - lo, :, :, :n, :n]))
            change[done] = js_between_maps(a, b)
            fa, fb = a.float().flatten(-2), b.float().flatten(-2)
            norm = torch.linalg.vector_norm(fa, dim=-1) * torch.linalg.vector_norm(fb, dim=-1)
            cosine[done] = (torch.einsum("lhk,lhk->lh", fa, fb) / norm.clamp_min(1e-30)).double().numpy()
            done += 1
            if on_step is not None:
                on_step("maps", done, len(ids), "features")
    return change, cosine


def _role_set(value) -> set[str]:
    return {r.strip() for r in value.split(",") if r.strip()} if isinstance(value, str) else set()


def role_changes(heads_a: pd.DataFrame | None, heads_b: pd.DataFrame | None) -> tuple[pd.DataFrame | None, str | None]:
    """Roles each head has in A and B, and the ones gained and lost, from both runs' ``heads.parquet``.

    Parameters
    ----------
    heads_a, heads_b : pandas.DataFrame or None
        The runs' heads tables; ``roles`` is a string of comma-separated role names ("" = none).

    Returns
    -------
    table : pandas.DataFrame or None
        ``layer``, ``head``, ``roles_a``, ``roles_b``, ``roles_gained``, ``roles_lost`` (sorted, comma-separated);
        ``None`` when a run has no heads table or no ``roles`` column.
    note : str or None
        Why the roles were skipped (``None`` when they were compared).
    """
    for name, heads in (("A", heads_a), ("B", heads_b)):
        if heads is None:
            return None, f"roles not compared: run {name} has no heads.parquet (run its report stage first)"
        if "roles" not in heads.columns:
            return None, f"roles not compared: heads.parquet of run {name} has no 'roles' column"
    merged = heads_a[["layer", "head", "roles"]].merge(heads_b[["layer", "head", "roles"]], on=["layer", "head"],
                                                       how="outer", suffixes=("_a", "_b"))
    sa, sb = [_role_set(v) for v in merged["roles_a"]], [_role_set(v) for v in merged["roles_b"]]
    table = pd.DataFrame({
        "layer": merged["layer"].astype(np.int16), "head": merged["head"].astype(np.int16),
        "roles_a": [",".join(sorted(x)) for x in sa], "roles_b": [",".join(sorted(y)) for y in sb],
        "roles_gained": [",".join(sorted(y - x)) for x, y in zip(sa, sb)],
        "roles_lost": [",".join(sorted(x - y)) for x, y in zip(sa, sb)],
    })
    return table, None


def _read_heads(root: Path) -> pd.DataFrame | None:
    path = RunLayout(root).table("heads")
    try:
        return pd.read_parquet(path) if path.exists() else None
    except (OSError, ValueError):  # unreadable: roles are optional, say so instead of failing the comparison
        return None


def compare_runs(a: str | Path, b: str | Path, *, max_features: int | None = None, random_state: int = 0,
                 progress: bool = True) -> Comparison:
    """Compare two runs over the same examples map by map (nothing is written; see :func:`write_comparison`).

    Parameters
    ----------
    a, b : str or pathlib.Path
        The two run directories (A: before, e.g. pre-trained; B: after, e.g. fine-tuned).
    max_features : int, optional
        Compare a seeded sample of this many features (default: every feature).
    random_state : int, optional
        Seed of that sample.
    progress : bool, optional
        Show a progress bar over the features.

    Returns
    -------
    Comparison

    Raises
    ------
    attnclust.errors.DataError
        The runs hold other examples or tokenisations, or other layers/heads (:func:`check_same_features`), or
        ``max_features`` is not a positive integer.
    attnclust.errors.StoreError
        A run's store is missing or damaged.
    """

    a, b = Path(a), Path(b)
    if max_features is not None and (isinstance(max_features, bool) or not isinstance(max_features, (int, np.integer))
                                     or max_features < 1):
        raise DataError(f"compare: --max-features {max_features!r}; allowed: an integer >= 1 (default: all)")
    _, store_a, store_b = check_same_features(a, b)
    n = store_a.n_features
    ids = None
    if max_features is not None and max_features < n:
        ids = np.sort(np.random.default_rng(random_state).choice(n, int(max_features), replace=False))
    t0 = time.perf_counter()
    with StepBars("compare", progress=progress) as bars:
        change, cosine = compare_maps(store_a, store_b, features=ids, on_step=bars)
    seconds = time.perf_counter() - t0
    n_layers, n_heads = store_a.n_layers, store_a.n_heads
    mean = change.mean(0).reshape(-1)
    order = np.argsort(-mean, kind="stable")
    rank = np.empty(len(mean), np.int64)
    rank[order] = np.arange(1, len(mean) + 1)
    heads = pd.DataFrame({
        "layer": np.repeat(np.arange(n_layers), n_heads).astype(np.int16),
        "head": np.tile(np.arange(n_heads), n_layers).astype(np.int16),
        "change": mean, "change_std": change.std(0).reshape(-1), "cosine": cosine.mean(0).reshape(-1),
        "rank": rank, "n_features": np.full(len(mean), change.shape[0], np.int64),
    })
    roles, note = role_changes(_read_heads(a), _read_heads(b))
    notes = tuple(n for n in (storage_note(store_a, store_b), note) if n)
    if roles is not None:
        heads = heads.merge(roles, on=["layer", "head"], how="left", validate="one_to_one")
    per_layer = heads.groupby("layer", sort=True)
    layers = pd.DataFrame({
        "layer": per_layer["change"].mean().index.to_numpy().astype(np.int16),
        "change": per_layer["change"].mean().to_numpy(), "change_max": per_layer["change"].max().to_numpy(),
        "cosine": per_layer["cosine"].mean().to_numpy(), "n_heads": per_layer.size().to_numpy().astype(np.int64),
    })
    return Comparison(heads=heads, layers=layers, a=a, b=b, notes=notes, seconds=seconds)


def storage_note(store_a, store_b) -> str | None:
    """A note when the two runs store their maps differently (``float16`` vs ``uint8``, full vs compact): then part
    of every head's change is the storage's rounding or truncation, not the model; ``None`` when they store alike.
    """
    kinds = [f"{store.mode} {store.attention.dtype}" for store in (store_a, store_b)]
    if kinds[0] == kinds[1]:
        return None
    return (f"the runs store their maps differently (A: {kinds[0]}, B: {kinds[1]}): uint8 keeps each weight only "
            f"to within 1/510 and a compact store only each row's largest weights, so part of every head's change "
            f"is quantisation, not the model; compare runs extracted with the same extract.store_dtype and "
            f"extract.store")


def render_comparison(comparison: Comparison) -> str:
    """The self-contained HTML report of a comparison (``compare.html.j2``; figures inline as PNG).

    Parameters
    ----------
    comparison : Comparison

    Returns
    -------
    str
        One HTML document with no script and no external resource.
    """
    import warnings

    heads, layers = comparison.heads, comparison.layers
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=MISSING_GLYPHS, category=UserWarning)
        lay, hs, values = head_matrix(heads, "change")
        annotate = len(lay) <= 16 and len(hs) <= 16
        heatmap = png_data_uri(head_heatmap_figure(lay, hs, values, column="change (mean JS distance, A vs B)",
                                                   unit="JS distance", annotate=annotate))
        per_layer = heads.groupby("layer")["change"].std(ddof=0).reindex(layers["layer"]).to_numpy()
        bars = png_data_uri(layer_bars_figure(layers["layer"].to_numpy(), layers["change"].to_numpy(),
                                              label="mean change (JS distance)", errors=per_layer))
    top = heads.sort_values("rank").head(TOP_HEADS_SHOWN)
    has_roles = "roles_gained" in heads.columns
    top_rows = [{"head": f"L{r['layer']} H{r['head']}", "rank": int(r["rank"]), "change": f"{r['change']:.3f}",
                 "std": f"{r['change_std']:.3f}", "cosine": f"{r['cosine']:.3f}",
                 "gained": r.get("roles_gained") or "", "lost": r.get("roles_lost") or ""}
                for r in top.to_dict("records")]
    role_rows = []
    if has_roles:
        moved = heads[(heads["roles_gained"] != "") | (heads["roles_lost"] != "")].sort_values(["layer", "head"])
        role_rows = [{"head": f"L{r['layer']} H{r['head']}", "a": r["roles_a"] or "–", "b": r["roles_b"] or "–",
                      "gained": r["roles_gained"] or "–", "lost": r["roles_lost"] or "–",
                      "change": f"{r['change']:.3f}"} for r in moved.to_dict("records")]
    layer_rows = [{"layer": int(r["layer"]), "change": f"{r['change']:.3f}", "max": f"{r['change_max']:.3f}",
                   "cosine": f"{r['cosine']:.3f}"} for r in layers.to_dict("records")]
    n_features = int(heads["n_features"].iloc[0]) if len(heads) else 0
    return environment().get_template("compare.html.j2").render(
        title=f"attnclust compare: {comparison.a.name} vs {comparison.b.name}", a=str(comparison.a),
        b=str(comparison.b), n_features=n_features, n_layers=len(layers),
        n_heads=int(heads.groupby("layer").size().max()) if len(heads) else 0, heatmap=heatmap, bars=bars,
        top=top_rows, has_roles=has_roles, role_rows=role_rows, layer_rows=layer_rows, notes=list(comparison.notes))


def write_comparison(comparison: Comparison, out: str | Path) -> dict[str, Path]:
    """Write ``compare.parquet``, ``compare_layers.parquet`` and ``compare.html`` into ``out``, atomically.

    ``out`` follows the ownership rules of a run directory (:class:`~attnclust.layout.CompareLayout`): it must be
    new, empty or attnclust's; the files are recorded as attnclust's before they are written, and a file of the
    same name that attnclust did not write is refused, never replaced.

    Parameters
    ----------
    comparison : Comparison
    out : str or pathlib.Path
        The output directory (``--out``).

    Returns
    -------
    dict of str to pathlib.Path
        ``compare``, ``compare_layers`` and ``compare_report`` -> the written paths.

    Raises
    ------
    attnclust.errors.StoreError
        ``out`` may not be written (foreign files, a user's file at one of the names, read-only, in use).
    """

    layout = CompareLayout(out)
    layout.check_writable()
    html = render_comparison(comparison)  # before claiming: a failure here leaves no marker behind
    layout.claim()
    with layout.locked():
        layout.record(*layout.compare_files())
        atomic_write_parquet(comparison.heads, layout.compare)
        atomic_write_parquet(comparison.layers, layout.compare_layers)
        atomic_write_bytes(layout.compare_report, html.encode("utf-8"))
    return {"compare": layout.compare, "compare_layers": layout.compare_layers,
            "compare_report": layout.compare_report}


def run_compare(a: str | Path, b: str | Path, out: str | Path, *, max_features: int | None = None,
                random_state: int = 0, progress: bool = True) -> Comparison:
    """``attnclust compare A B --out C``: check ``out`` is writable, compare the runs, write the outputs.

    Parameters
    ----------
    a, b : str or pathlib.Path
        The two run directories.
    out : str or pathlib.Path
        The output directory, checked before the comparison starts (so a refusal costs nothing): new, empty or
        attnclust's, with no file at compare's names that attnclust did not write.
    max_features, random_state, progress
        As in :func:`compare_runs`.

    Returns
    -------
    Comparison
        With ``files``: what was written.

    Raises
    ------
    attnclust.errors.DataError, attnclust.errors.StoreError
        As :func:`compare_runs` and :func:`write_comparison`.
    """
    layout = CompareLayout(out)
    layout.check_writable()
    if layout.is_run():  # refuse a user's file at one of compare's names before any work, not after it
        layout.record(*layout.compare_files())
    comparison = compare_runs(a, b, max_features=max_features, random_state=random_state, progress=progress)
    files = write_comparison(comparison, out)
    return Comparison(heads=comparison.heads, layers=comparison.layers, a=comparison.a, b=comparison.b,
                      notes=comparison.notes, seconds=comparison.seconds, files=files)
