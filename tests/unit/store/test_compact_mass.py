"""What a compact store's rows hold against the exact maps: decoded rows sum to at most 1 and stay near the exact
rows on long diffuse maps (Dirichlet rows, softmax of small logits, a random BERT's 384-token features), every
reader (``read_map``, ``open_output(...).attention``, the explorer) serves the same weights, and the share of the
row mass the rows keep is measured at extraction and stated by the notes instead of the setting."""

import json
import re

import numpy as np
import pandas as pd
import pytest

from attnclust.config import JobConfig
from attnclust.errors import StoreError
from attnclust.layout import RunLayout
from attnclust.pipeline import run_job
from attnclust.stages import COMMANDS, SerialExecutor
from attnclust.stages.extract import prepare_inputs
from attnclust.store import compact_maps, create_attention_store, open_attention_store

WIDTH = 384
PROSE = ("The scheduler assigns each task to the worker whose queue holds the fewest pending bytes, then records "
         "the assignment in a journal that survives a restart. When a worker stops answering heartbeats, its "
         "tasks return to the pool and their partial outputs are discarded, because a shard written halfway "
         "cannot be told apart from a finished one without its checksum. Compression runs before the checksum, "
         "so a corrupted block fails verification instead of decompressing into plausible garbage. ")


def _rows(kind: str, rng: np.random.Generator, shape=(2, 3, WIDTH)) -> np.ndarray:
    """(layer, head, query, key) float32 maps whose every row is a distribution over ``WIDTH`` keys."""
    if kind == "dirichlet":
        return rng.dirichlet(np.ones(WIDTH), size=shape).astype(np.float32)
    scale = {"small logits": 0.5, "peaked": 6.0}[kind]
    logits = rng.normal(size=(*shape, WIDTH)) * scale
    maps = np.exp(logits - logits.max(-1, keepdims=True))
    return (maps / maps.sum(-1, keepdims=True)).astype(np.float32)


def _kept_share(exact: np.ndarray, mass: float, cap: int | None) -> np.ndarray:
    """Per row: the exact mass of the fewest largest weights reaching ``mass`` of the row (at most ``cap``), over
    the row's sum, by a sort in float64 (independent of the store's code)."""
    ordered = -np.sort(-exact.astype(np.float64), axis=-1)
    total = ordered.sum(-1, keepdims=True)
    count = (np.cumsum(ordered, -1) < mass * total).sum(-1) + 1
    count = np.minimum(count, exact.shape[-1] if cap is None else cap)
    top = np.take_along_axis(np.cumsum(ordered, -1), count[..., None] - 1, -1)
    return (top / total)[..., 0]


@pytest.mark.parametrize("kind", ["dirichlet", "small logits", "peaked"])
def test_compact_rows_sum_to_at_most_one_and_stay_near_the_exact_rows(tmp_path, kind):
    """Rows of 384 keys through a compact store and back: every decoded row sums to at most 1, the mean row L1
    distance to the exact rows is what the dropped 5% and the rounding cost (under 0.1; a byte that gave every kept
    key at least 1/255 inflated a diffuse row to 1.2-1.4), and each kept weight reads back within
    sqrt(w) / 255 of the exact one."""
    import torch

    exact = _rows(kind, np.random.default_rng(0))
    store = create_attention_store(tmp_path / "c.zarr", seq_len=np.array([WIDTH], np.int32), num_layers=2,
                                   num_heads=3, features_per_task=1, attrs={}, mode="compact")
    store.attention[0] = compact_maps(torch.from_numpy(exact), mass=0.95).numpy()
    opened = open_attention_store(store.path, require_complete=False)
    for layer in range(2):
        for head in range(3):
            read, want = opened.read_map(0, layer, head).astype(np.float64), exact[layer, head].astype(np.float64)
            assert read.sum(-1).max() <= 1 + 1e-6, read.sum(-1).max()
            assert np.abs(read - want).sum(-1).mean() < 0.1, np.abs(read - want).sum(-1).mean()
            kept = read > 0
            assert (np.abs(read - want)[kept] <= np.sqrt(want[kept]) / 255 + 1e-5).all()
            np.testing.assert_allclose(read.sum(-1), _kept_share(want, 0.95, None), atol=0.02)


@pytest.mark.parametrize("cap", [None, 2])
def test_compact_maps_give_the_exact_share_of_each_row_they_keep(cap):
    import torch

    exact = _rows("dirichlet", np.random.default_rng(1), shape=(2, 2, 50))
    codes, kept = compact_maps(torch.from_numpy(exact), mass=0.9, max_keys=cap, with_kept=True)
    assert kept.shape == exact.shape[:-1] and kept.dtype == torch.float32
    on = codes.numpy() > 0
    np.testing.assert_allclose(kept.numpy(), (exact * on).sum(-1) / exact.sum(-1), atol=1e-6)
    np.testing.assert_allclose(kept.numpy(), _kept_share(exact, 0.9, cap), atol=1e-6)


def _spread_loop(weights: np.ndarray, codes: np.ndarray, causal: bool, lengths) -> np.ndarray:
    """The dropped mass back, row by row from its definition: ``1 - sum(row)`` in equal shares over the keys the
    row sees (up to its query when causal, below the feature's length) and did not keep (code 0)."""
    out = weights.astype(np.float64).copy()
    for index in np.ndindex(*weights.shape[:-1]):
        n = weights.shape[-1] if lengths is None else int(lengths[index[0]])
        row, code = out[index], codes[index]
        seen = [k for k in range(n) if not causal or k <= index[-1]]
        free = [k for k in seen if code[k] == 0]
        if not code.any():
            continue
        if not free:  # every key it sees kept: rescaled to 1
            row /= row.sum()
            continue
        dropped = max(0.0, 1.0 - row.sum())
        for k in free:
            row[k] += dropped / len(free)
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_the_dropped_mass_is_spread_as_a_loop_over_each_row_spreads_it(causal):
    """:func:`spread_dropped` against a row-by-row loop, on a padded block of three features of lengths 7, 5 and 3
    (padding rows and keys get nothing); with ``lengths=None`` every key is real."""
    import torch

    from attnclust.store import decode_compact, spread_dropped

    rng = np.random.default_rng(3)
    lengths = np.array([7, 5, 3])
    exact = np.zeros((3, 2, 2, 7, 7), np.float32)
    for f, n in enumerate(lengths):
        logits = rng.normal(size=(2, 2, n, n)) * 2
        if causal:
            logits[..., np.triu_indices(n, 1)[0], np.triu_indices(n, 1)[1]] = -np.inf
        e = np.exp(logits - logits.max(-1, keepdims=True))
        exact[f, :, :, :n, :n] = e / e.sum(-1, keepdims=True)
    codes = np.zeros(exact.shape, np.uint8)
    for f, n in enumerate(lengths):
        codes[f, :, :, :n, :n] = compact_maps(torch.from_numpy(exact[f, :, :, :n, :n]), mass=0.6, max_keys=2).numpy()
    plain = decode_compact(codes)
    want = _spread_loop(plain, codes, causal, lengths)
    got = spread_dropped(plain.copy(), codes, causal=causal, lengths=lengths)
    np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(decode_compact(codes, spread="prefix" if causal else "keys", lengths=lengths), want,
                               atol=1e-6)
    for f, n in enumerate(lengths):  # real rows sum to 1; padding stays 0
        np.testing.assert_allclose(got[f, :, :, :n, :n].sum(-1), 1, atol=1e-5)
        assert not got[f, :, :, n:].any() and not got[f, :, :, :, n:].any()
        if causal:
            assert not np.triu(got[f, :, :, :n, :n], 1).any()
    # one feature at its true length: no lengths needed
    np.testing.assert_allclose(spread_dropped(plain[1, :, :, :5, :5].copy(), codes[1, :, :, :5, :5], causal=causal),
                               want[1, :, :, :5, :5], atol=1e-6)


@pytest.mark.parametrize("kind", ["dirichlet", "small logits", "peaked"])
def test_spread_rows_sum_to_one_are_closer_and_the_store_states_each_maps_error(tmp_path, kind):
    """Rows of 384 keys capped at 11 keys (dev's budget) through a compact store that spreads the dropped mass: every
    row reads back summing to 1; where the dropped tail is diffuse (Dirichlet rows, small logits) the mean row L1
    distance to the exact rows is below the distance with the dropped keys at zero (the dropped mass), and where it
    is concentrated just below the cut (peaked logits) it is at most that plus the dropped mass (the bound of
    adding it anywhere); the per-map error the writer records equals the L1 distance measured here between the map
    read back and the exact map."""
    import torch

    from attnclust.store import decode_compact, map_error_summary

    exact = _rows(kind, np.random.default_rng(0))
    store = create_attention_store(tmp_path / "c.zarr", seq_len=np.array([WIDTH], np.int32), num_layers=2,
                                   num_heads=3, features_per_task=1, attrs={}, mode="compact", compact_spread="keys")
    codes, error = compact_maps(torch.from_numpy(exact), mass=0.95, max_keys=11, error_spread=store.spread)
    store.attention[0] = codes.numpy()
    store.map_error[0] = error.mean(-1).numpy()  # as the extract stage's writer records it
    opened = open_attention_store(store.path, require_complete=False)
    assert opened.spread == "keys"
    for layer in range(2):
        for head in range(3):
            read, want = opened.read_map(0, layer, head).astype(np.float64), exact[layer, head].astype(np.float64)
            np.testing.assert_allclose(read.sum(-1), 1, atol=1e-5)
            zeroed = decode_compact(codes.numpy()[layer, head]).astype(np.float64)
            l1, l1_zeroed = np.abs(read - want).sum(-1).mean(), np.abs(zeroed - want).sum(-1).mean()
            dropped = (1 - zeroed.sum(-1)).mean()
            assert l1 <= l1_zeroed + dropped + 1e-4, (l1, l1_zeroed, dropped)
            if kind != "peaked":
                assert l1 < l1_zeroed, (l1, l1_zeroed)
            assert opened.read_map_error(0, layer, head) == pytest.approx(l1, abs=1e-5)
    summary = map_error_summary(opened)
    assert summary["max"] == pytest.approx(float(np.asarray(opened.map_error[0]).max()), rel=1e-3)


def _planted_maps(rng: np.random.Generator, n: int, kind: str, causal: bool) -> np.ndarray:
    """(2, n, n) float32 attention rows: softmax of logits at one of three spreads, or rows with a run of equal
    weights at the top (ties at the cut); causal rows see keys 0..query only (the others exactly 0)."""
    if kind == "ties":
        maps = np.full((2, n, n), 1.0)
        maps[..., : max(1, n // 3)] = 4.0
    else:
        maps = np.exp(rng.normal(size=(2, n, n)) * {"diffuse": 0.3, "mixed": 3.0, "peaked": 9.0}[kind])
    if causal:
        maps = np.where(np.tri(n, dtype=bool), maps, 0.0)
    return (maps / maps.sum(-1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("causal", [False, True])
def test_each_rows_error_equals_the_distance_of_the_row_decoded_with_its_spread(causal):
    """The row error ``compact_maps`` measures from each row's sort equals, to float32 rounding, the L1 distance
    measured the long way: the codes decoded with the store's spread (every key, or a causal row's prefix) minus
    the exact row, summed over the keys; for rows that keep some keys, every key they see (divided by their sum),
    ties at the cut, and rows of 1 to 40 keys."""
    import torch

    from attnclust.store import decode_compact

    rng, spread = np.random.default_rng(5), "prefix" if causal else "keys"
    checked = 0
    for n in (1, 2, 7, 40):
        for kind in ("diffuse", "mixed", "peaked", "ties"):
            exact = _planted_maps(rng, n, kind, causal)
            for mass, cap in ((0.5, None), (0.95, 3), (0.95, 11), (1.0, None)):
                codes, error = compact_maps(torch.from_numpy(exact), mass=mass, max_keys=cap, error_spread=spread)
                read = decode_compact(codes.numpy(), spread=spread).astype(np.float64)
                want = np.abs(read - exact.astype(np.float64)).sum(-1)
                np.testing.assert_allclose(error.numpy(), want, atol=2e-6, err_msg=f"{n} {kind} {mass} {cap}")
                checked += want.size
    assert checked == 1600  # rows of 2 maps: 2 (1 + 2 + 7 + 40) rows x 4 kinds x 4 settings
    with pytest.raises(ValueError, match="compact error spread"):
        compact_maps(torch.from_numpy(exact), mass=0.9, error_spread="rows")


@pytest.mark.parametrize("causal", [False, True])
def test_the_cpu_row_errors_equal_the_torch_steps_they_replace(causal):
    """On a CPU the row errors are computed in NumPy (:func:`_row_errors_cpu`); the device path keeps the torch
    steps (:func:`_row_errors`). Both, on the same rows (diffuse, peaked, ties at the cut, rows that keep every key,
    causal prefixes, rows over 1), give the same numbers to float64 rounding, and what ``compact_maps`` returns on a
    CPU is the NumPy one."""
    import torch

    from attnclust.maps.compact_code import _compact_cpu, _row_errors, _row_errors_cpu, _visible

    rng, spread = np.random.default_rng(11), "prefix" if causal else "keys"
    for n in (1, 3, 40, 130):
        for kind in ("diffuse", "mixed", "peaked", "ties"):
            exact = torch.from_numpy(_planted_maps(rng, n, kind, causal))
            flat = exact.reshape(-1, n)
            for mass, cap in ((0.5, None), (0.95, 3), (0.95, 11), (1.0, None)):
                _, _, largest, count = _compact_cpu(flat, mass, cap)
                visible = _visible(exact.shape, spread, exact.device)
                want = _row_errors(torch.from_numpy(largest), flat, torch.from_numpy(count), visible).numpy()
                got = _row_errors_cpu(largest, flat.numpy(), count, visible.numpy())
                np.testing.assert_allclose(got, want, rtol=0, atol=1e-12, err_msg=f"{n} {kind} {mass} {cap}")
                _, returned = compact_maps(exact, mass=mass, max_keys=cap, error_spread=spread)
                np.testing.assert_array_equal(returned.numpy().reshape(-1), got)


@pytest.fixture
def prose_squad(tmp_path):
    """Two long contexts of technical prose, two questions each: every question spans two windows of 300-384
    tokens."""
    data = []
    for i, start in enumerate(("The scheduler", "Compression")):
        context = PROSE * 6
        qas = [{"id": f"p{i}{j}", "question": question,
                "answers": [{"text": answer, "answer_start": context.index(answer)}], "is_impossible": False}
               for j, (question, answer) in enumerate((("What runs before the checksum?", "Compression"),
                                                       ("Where is the assignment recorded?", "in a journal")))]
        data.append({"title": start, "paragraphs": [{"context": context, "qas": qas}]})
    path = tmp_path / "prose.json"
    path.write_text(json.dumps({"version": "v2.0", "data": data}))
    return path


def _run(tmp_path, model_dir, data, name, stages=("extract",), **extract):
    cfg = JobConfig.from_dict({"name": "t", "data": {"path": str(data)}, "model": {"name": str(model_dir)},
                               "extract": {"batch_size": 2, "features_per_task": 2, "store": "compact", **extract},
                               "featurize": {"method": "pooled", "grid": 4},
                               "cluster": {"umap": False, "k": 2, "stability_resamples": 2}})
    layout = RunLayout(tmp_path / name)
    run_job(cfg, layout.root, stages=stages, executor=SerialExecutor(), progress=False)
    return cfg, layout


def _fresh_maps(cfg, model_dir) -> dict[int, np.ndarray]:
    """Each feature's exact maps from an unbatched forward of the model: {feature_id: (layer, head, q, k)}."""
    import torch
    from transformers import AutoModelForQuestionAnswering

    model = AutoModelForQuestionAnswering.from_pretrained(model_dir, attn_implementation="eager").eval()
    out = {}
    for _, feat in prepare_inputs(cfg)["features"].iterrows():
        with torch.inference_mode():
            att = model(input_ids=torch.tensor([list(feat["input_ids"])]),
                        token_type_ids=torch.tensor([list(feat["segment_ids"])]), output_attentions=True).attentions
        out[int(feat["feature_id"])] = torch.stack(att, 1)[0].numpy()
    return out


@pytest.mark.slow
def test_every_reader_of_a_compact_run_gets_rows_near_a_fresh_forward(tmp_path, tiny_bert_dir, prose_squad):
    """A random BERT's 384-token maps are diffuse: outside the exact sample, ``read_map``, ``open_output(...)
    .attention`` and the explorer's ``/api/map`` serve the same rows, each summing to 1 (the dropped mass spread
    back), within a mean row L1 of 0.1 of the exact maps, the error the store states per map; the store measured
    the share of the row mass its rows keep, and the extract stage's fingerprint names the encoding."""
    from attnclust.api import open_output
    from attnclust.explore import ExploreApp

    cfg, layout = _run(tmp_path, tiny_bert_dir, prose_squad, "c", stages=COMMANDS["run"], exact_sample=1)
    store = open_attention_store(layout.attention)
    fresh = _fresh_maps(cfg, tiny_bert_dir)
    assert store.n_features == 8 and store.seq_len.min() > 300 and store.seq_len.max() == WIDTH
    attention, app = open_output(layout.root).attention, ExploreApp(layout.root, exact_on_demand=False)
    outside = [f for f in range(store.n_features) if f not in set(store.exact_features.tolist())]
    shares = {f: _kept_share(fresh[f], cfg.extract.compact_mass, None).mean(-1) for f in fresh}  # (layer, head)
    for f in outside:
        for layer, head in ((0, 0), (1, 3)):
            read = store.read_map(f, layer, head).astype(np.float64)
            np.testing.assert_allclose(read.sum(-1), 1, atol=1e-5)
            error = np.abs(read - fresh[f][layer, head]).sum(-1).mean()
            assert error < 0.1 and store.read_map_error(f, layer, head) == pytest.approx(error, abs=1e-4)
            n = int(store.seq_len[f])
            np.testing.assert_array_equal(np.asarray(attention[f, layer, head, :n, :n]), read.astype(np.float32))
            served = app.map_json(f, layer, head)
            assert served["source"] == "compact"
            np.testing.assert_allclose(np.asarray(served["weights"]), read, atol=1e-4)
            assert served["kept_mass"] == pytest.approx(shares[f][layer, head], abs=1e-4)
    for f in range(store.n_features):
        np.testing.assert_allclose(np.asarray(store.kept_mass[f]), shares[f], atol=1e-4)
    every = np.stack([shares[f] for f in range(store.n_features)])
    rows = store.seq_len[:, None, None] * np.ones_like(every)      # a map's mean weighs as many rows as it has
    kept = store.attrs["compact"]["kept"]
    assert kept["mean"] == pytest.approx((every * rows).sum() / rows.sum(), rel=1e-3)
    assert kept["min"] == pytest.approx(every.min(), rel=1e-3) and 0.9 < kept["mean"] < 1
    record = json.loads(layout.stage_record("extract").read_text())
    assert record["parts"]["keys"]["compact_encoding"] == store.attrs["compact"]["encoding"]


@pytest.mark.slow
def test_notes_state_the_measured_kept_mass_not_the_setting(tmp_path, tiny_bert_dir, prose_squad, capsys):
    """Two keys a row of diffuse 384-key rows keep a few percent of each row, not extract.compact_mass's 0.95:
    the featurize note and the report's note give the share measured against a fresh forward, and the mean row
    error of the maps as read back; the exported medoid maps (all compact here) print their own kept mass and
    error."""
    from attnclust.export import build_figure
    from attnclust.stages.base import RunContext
    from attnclust.stages.featurize import FeaturizeStage
    from attnclust.stages.report import map_source_note

    cfg, layout = _run(tmp_path, tiny_bert_dir, prose_squad, "capped", stages=COMMANDS["run"], exact_sample=0,
                       compact_max_keys=2)
    fresh = _fresh_maps(cfg, tiny_bert_dir)
    mean = np.mean([_kept_share(maps, cfg.extract.compact_mass, 2).mean() for maps in fresh.values()])
    assert mean < 0.5
    ctx = RunContext(layout=layout, cfg=cfg, job_id="t", backend="cpu", executor=None, progress=True)
    FeaturizeStage().check(ctx)
    note = [line for line in capsys.readouterr().out.splitlines() if line.startswith("featurize: ")]
    report = map_source_note(open_attention_store(layout.attention), {})
    for text in (*note, report):
        said = re.search(r"at most 2 keys a row; measured: ([0-9.e-]+) of a row's mass on average", text)
        assert said and float(said[1]) == pytest.approx(mean, rel=0.01) and "0.95" not in text, text
    assert len(note) == 1
    store = open_attention_store(layout.attention)
    every = [(f, layer, head) for f in range(store.n_features) for layer in range(2) for head in range(4)]
    errors = {where: np.abs(store.read_map(*where) - fresh[where[0]][where[1:]]).sum(-1).mean() for where in every}
    rows = np.array([store.seq_len[f] for f, _, _ in every], float)
    said = re.search(r"each row read back within L1 ([0-9.e-]+) of the exact row on average", report)
    assert said and float(said[1]) == pytest.approx((np.array(list(errors.values())) * rows).sum() / rows.sum(),
                                                    rel=0.01), report
    clusters = pd.read_parquet(layout.table("clusters"))
    titles = [ax.get_title() for ax in build_figure(layout.root, "cluster_maps").axes if "medoid" in ax.get_title()]
    assert len(titles) == len(clusters) > 0
    for title, row in zip(titles, clusters.sort_values("cluster").itertuples(), strict=True):
        where = (int(row.medoid_feature_id), int(row.medoid_layer), int(row.medoid_head))
        assert f"compact map: keeps {store.read_kept_mass(*where):.2f} of its mass, row L1 {errors[where]:.2f} " \
               f"from exact" in title, title


def test_a_compact_store_in_another_encoding_is_refused_in_one_line(tmp_path):
    import zarr

    store = create_attention_store(tmp_path / "c.zarr", seq_len=np.array([3], np.int32), num_layers=1,
                                   num_heads=1, features_per_task=1, attrs={}, mode="compact")
    group = zarr.open_group(str(store.path), mode="r+")
    group.attrs["compact"] = {"mass": 0.95, "max_keys": None}     # as a store of a linear byte code records it
    with pytest.raises(StoreError, match=r"^store .*c\.zarr: compact maps in encoding 'linear-uint8', not "
                                         r"'sqrt-uint8' .*re-run 'attnclust extract --force' for this output dir "
                                         r"to rewrite them$"):
        open_attention_store(store.path, require_complete=False)


def test_decoding_codes_of_another_dtype_is_one_line():
    from attnclust.store import decode_compact

    with pytest.raises(ValueError, match=r"^compact codes of dtype float32: expected uint8 \(a compact store's "
                                         r"attention\)$"):
        decode_compact(np.zeros((2, 2), np.float32))
