"""The interactive report's payload (attnclust.report.interactive): sampling caps, answer-span token marks, the
compact map encoding, the grid's attributes and colours in the rendered page."""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import zlib

import numpy as np
import pandas as pd
import pytest

from attnclust.errors import DataError
from attnclust.report import render_report
from attnclust.report.interactive import (
    build_explorer,
    char_span_tokens,
    predicted_token_span,
    text_color,
    verdict,
)

from helpers import N_HEADS, N_LAYERS
from helpers import synthetic_report_inputs as _synthetic_inputs

L, H = 2, 3


class _Store:
    """A stand-in for AttentionStore: planted maps, a row-stochastic (query, key) map per (feature, layer, head)."""

    def __init__(self, lengths: list[int], seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.n_layers, self.n_heads = L, H
        self.maps = []
        for n in lengths:
            m = rng.random((L, H, n, n)) ** 4
            self.maps.append(m / m.sum(-1, keepdims=True))
        self.reads = 0

    def read_block(self, start: int, stop: int) -> np.ndarray:
        assert stop == start + 1
        self.reads += 1
        return self.maps[start][None].astype(np.float32)


def _tables(lengths: list[int], *, umap: bool = True) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    n_feat = len(lengths)
    features = pd.DataFrame({
        "feature_id": np.arange(n_feat), "example_id": [f"q{f}" for f in range(n_feat)],
        "span": np.zeros(n_feat, np.int32), "seq_len": np.array(lengths, np.int32),
        "tokens": [[f"t{i}" for i in range(n)] for n in lengths],
        "offsets": [[[-1, -1]] * 3 + [[4 * i, 4 * i + 3] for i in range(n - 3)] for n in lengths],
        "answer_start_token": np.full(n_feat, 4, np.int32), "answer_end_token": np.full(n_feat, 5, np.int32),
    })
    rows = [(f, f"q{f}", la, h) for f in range(n_feat) for la in range(L) for h in range(H)]
    maps = pd.DataFrame(rows, columns=["feature_id", "example_id", "layer", "head"])
    rng = np.random.default_rng(1)
    maps["cluster"] = rng.integers(0, 3, len(maps))
    maps["umap_x"] = rng.normal(size=len(maps)) if umap else np.nan
    maps["umap_y"] = rng.normal(size=len(maps)) if umap else np.nan
    predictions = pd.DataFrame({
        "example_id": [f"q{f}" for f in range(n_feat)], "question": [f"question {f}?" for f in range(n_feat)],
        "prediction": ["t3x t4x" if f % 2 else "" for f in range(n_feat)],
        "gold_answers": [["t1x t2x"] for _ in range(n_feat)], "is_impossible": False,
        "exact": [f % 4 == 1 for f in range(n_feat)], "f1": 0.5,
    })
    # context: token t_i of the context covers characters [4i, 4i+3) = "t{i}x"
    examples = pd.DataFrame({"id": [f"q{f}" for f in range(n_feat)],
                             "question": [f"question {f}?" for f in range(n_feat)],
                             "context": [" ".join(f"t{i}x" for i in range(n - 3)) for n in lengths]})
    return features, maps, predictions, examples


def _unpack(text: str) -> np.ndarray:
    return np.frombuffer(zlib.decompress(base64.b64decode(text)), dtype=np.uint8)


def test_char_span_tokens_on_a_hand_built_example() -> None:
    # "the cat sat" -> [CLS] q [SEP] the cat sat [SEP]
    offsets = [(-1, -1), (-1, -1), (-1, -1), (0, 3), (4, 7), (8, 11), (-1, -1)]
    assert char_span_tokens(offsets, 4, 7) == (4, 4)
    assert char_span_tokens(offsets, 4, 11) == (4, 5)
    assert char_span_tokens(offsets, 5, 9) == (4, 5)  # partial overlap of both words
    assert char_span_tokens(offsets, 20, 25) is None
    context = "the cat sat"
    assert predicted_token_span(context, "cat sat", offsets) == (4, 5)
    assert predicted_token_span(context, "", offsets) is None
    assert predicted_token_span(context, "dog", offsets) is None
    # a repeated phrase is placed at its first occurrence inside the feature's tokens
    assert predicted_token_span("ab ab", "ab", [(-1, -1), (3, 5)]) == (1, 1)


def test_verdict_words() -> None:
    assert verdict({"prediction": "x", "exact": 1, "f1": 1.0, "is_impossible": False}).startswith("right")
    assert verdict({"prediction": "x", "exact": 0, "f1": 0.4, "is_impossible": False}) == "wrong (F1 0.40)"
    assert verdict({"prediction": "", "exact": 1, "f1": 1.0, "is_impossible": True}).startswith("no answer")
    assert "right" not in verdict({"prediction": "", "exact": 0, "f1": 0.0, "is_impossible": False})


def test_explorer_caps_marks_and_maps_round_trip() -> None:
    lengths = [12, 20, 9, 30, 15, 11, 25, 10]
    store = _Store(lengths)
    features, maps, predictions, examples = _tables(lengths)
    payload = build_explorer(store, features, maps, predictions=predictions, examples=examples, n_questions=3,
                             n_head_examples=2, n_points=4 * L * H, thumb_grid=4)
    json.dumps(payload, allow_nan=False)  # JSON-able
    qs = payload["questions"]
    assert len(qs) == 3 and len({q["id"] for q in qs}) == 3
    assert len(payload["head_examples"]) == 2
    assert [qs[i]["n"] for i in payload["head_examples"]] == sorted((q["n"] for q in qs), reverse=True)[:2]
    for q in qs:
        f = int(q["id"][1:])
        assert q["n"] == lengths[f] and q["tokens"] == [f"t{i}" for i in range(lengths[f])]
        assert q["answer"] == [4, 5]
        # "t3x t4x" covers context characters 12..19 = context tokens 3 and 4 = feature tokens 6 and 7
        assert q["pred"] == ([6, 7] if f % 2 else None)
        assert q["prediction"] == ("t3x t4x" if f % 2 else "")
        got = _unpack(q["maps"]).reshape(L, H, q["n"], q["n"])
        for la in range(L):
            for h in range(H):
                for i in range(q["n"]):  # brute force: every weight within half a quantisation step
                    assert np.abs(got[la, h, i] / 255 - store.maps[f][la, h, i]).max() <= 0.5 / 255 + 1e-6
    # a right and a not-right question when predictions allow
    right = {f"q{f}" for f in range(len(lengths)) if f % 4 == 1}
    assert {q["id"] in right for q in qs} == {True, False}
    u = payload["umap"]
    assert len(u["x"]) == 4 * L * H and u["features"] == 4
    assert [u["question"].count(i) for i in range(len(qs))] == [L * H] * len(qs)  # the questions are in the sample
    assert all(qs[qi]["id"] == u["example_ids"][e] for e, qi in zip(u["example"], u["question"]) if qi >= 0)
    thumbs = _unpack(u["thumbs"]).reshape(-1, 4, 4)
    assert len(thumbs) == len(u["x"]) and thumbs.max() == 255
    assert store.reads == u["features"]  # each feature read once: a question's maps with its thumbnails


def test_explorer_map_budget_and_umap_off() -> None:
    lengths = [40, 40, 10, 10, 10]
    store = _Store(lengths)
    features, maps, predictions, examples = _tables(lengths, umap=False)
    budget = 40 * 40 * L * H + 10 * 10 * L * H
    payload = build_explorer(store, features, maps, predictions=predictions, examples=examples, n_questions=5,
                             max_map_bytes=budget)
    used = sum(q["n"] ** 2 * L * H for q in payload["questions"])
    assert used <= budget and 1 <= len(payload["questions"]) < 5
    assert payload["umap"] is None
    assert store.reads == len(payload["questions"])  # only the embedded questions were read


def test_text_color_contrast_is_at_least_4_5() -> None:
    def lum(c):  # WCAG 2 relative luminance, written out independently
        out = []
        for v in c:
            out.append(v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4)
        return 0.2126 * out[0] + 0.7152 * out[1] + 0.0722 * out[2]

    rng = np.random.default_rng(0)
    for bg in rng.random((500, 3)).tolist() + [[0.5, 0.5, 0.5], [0.46, 0.46, 0.46], [0.0, 0.5, 0.0]]:
        fg = (0.0, 0.0, 0.0) if text_color(bg) == "#000000" else (1.0, 1.0, 1.0)
        hi, lo = sorted((lum(fg), lum(bg)), reverse=True)
        assert (hi + 0.05) / (lo + 0.05) >= 4.5


def _hex_rgb(h: str) -> tuple[float, ...]:
    return tuple(int(h[i:i + 2], 16) / 255 for i in (1, 3, 5))


def test_rendered_grid_cells_switch_and_contrast() -> None:
    inputs = _synthetic_inputs()
    heads = inputs.heads.assign(roles=["cls" if i % 2 else "" for i in range(len(inputs.heads))])
    report = render_report(dataclasses.replace(inputs, heads=heads))
    cells = re.findall(r'<td class="gcell" tabindex="0" role="button" data-layer="(\d+)" data-head="(\d+)"([^>]*)>',
                       report)
    assert sorted((int(a), int(b)) for a, b, _ in cells) == [(la, h) for la in range(N_LAYERS) for h in range(N_HEADS)]
    options = re.search(r'<select id="grid-color">(.*?)</select>', report, flags=re.DOTALL).group(1)
    assert re.findall(r'value="(\w+)"', options) == ["cluster", "role"]  # no importance in this run
    for _, _, attrs in cells:
        for mode in ("cluster", "role"):
            bg = _hex_rgb(re.search(rf'data-{mode}-bg="(#[0-9a-f]{{6}})"', attrs).group(1))
            fg = re.search(rf'data-{mode}-fg="(#[0-9a-f]{{6}})"', attrs).group(1)
            assert fg == text_color(bg)
    with_imp = render_report(dataclasses.replace(inputs, heads=heads.assign(importance=np.linspace(0, 1, len(heads)))))
    assert 'value="importance"' in with_imp and with_imp.count("data-importance-bg=") == N_LAYERS * N_HEADS
    # the panel is in the page, hidden; no question view without embedded maps
    assert re.search(r'<div id="head-panel"[^>]*hidden>', report) and 'id="head-panel-title"' in report
    assert 'id="question-view"' not in report


def test_rendered_question_view_and_cards() -> None:
    inputs = _synthetic_inputs()
    lengths = [12, 20, 9]
    features, maps, predictions, examples = _tables(lengths)
    payload = build_explorer(_Store(lengths), features, maps, predictions=predictions, examples=examples)
    report = render_report(dataclasses.replace(inputs, explorer=payload))
    select = re.search(r'<select id="question-select">(.*?)</select>', report, flags=re.DOTALL).group(1)
    assert re.findall(r'<option value="([^"]+)">', select) == [q["id"] for q in payload["questions"]]
    for name in ("qv-layer", "qv-head", "qv-prediction", "qv-verdict"):
        assert f'id="{name}"' in report
    assert len(re.findall(r'class="card cluster-card[^"]*" id="cluster-\d+" data-cluster="\d+"', report)) == len(
        inputs.clusters)
    data = json.loads(re.search(r'<script type="application/json" id="attnclust-data">(.*?)</script>', report,
                                flags=re.DOTALL).group(1))
    assert data["explorer"]["questions"][0]["maps"] == payload["questions"][0]["maps"]


def test_explorer_input_is_checked() -> None:
    with pytest.raises(DataError, match="report input explorer"):
        dataclasses.replace(_synthetic_inputs(), explorer={"questions": []})
