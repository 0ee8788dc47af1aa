"""Natural text as data (``data.format: text``): reading, windows checked against a brute-force count, whole runs of
a tiny random BERT and a tiny random Llama through every stage, and bad files refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnclust.data.text import read_texts, text_windows
from attnclust.errors import DataError, StoreError

# three texts: one long enough for several windows, control-token strings of both tokenizers inside the text
SENTENCES = ("The ferry left the harbour at dawn, and the gulls followed it past the breakwater.",
             "Mara kept the bakery open through the winter storms [SEP] while the lane outside froze.",
             "Ivo wrote every loan in a ledger <|im_start|> and knew which atlas had been out for months.",
             "Snow covered the moor, the river ran fast under the stone bridge, and the mill stood silent.")


def _write_texts(path: Path) -> list[str]:
    rng = np.random.default_rng(0)
    paragraphs = [" ".join(SENTENCES[i % 4] for i in rng.integers(0, 4, size=n)) for n in (9, 2, 4)]
    path.write_text("\n\n".join(paragraphs[:2]) + "\n \t\n\n" + paragraphs[2] + "\n", encoding="utf-8")
    return paragraphs


def _brute_force_windows(n: int, width: int, stride: int) -> list[tuple[int, int]]:
    """The fewest windows of ``width`` tokens, each starting ``width - stride`` after the one before, that reach the
    end of ``n`` tokens: found by trying every count."""
    step = width - stride
    count = next(k for k in range(1, n + 2) if (k - 1) * step + width >= n)
    return [(i * step, min(i * step + width, n)) for i in range(count)]


# --- windows --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("width", "stride"), [(1, 0), (5, 0), (5, 2), (5, 4), (16, 7)])
def test_windows_match_the_brute_force_count_overlap_and_cover_every_token(width, stride):
    for n in range(1, 60):
        windows = text_windows(n, width, stride)
        assert windows == _brute_force_windows(n, width, stride), (n, width, stride)
        covered = np.zeros(n, int)
        for a, b in windows:
            covered[a:b] += 1
        assert covered.min() == 1
        assert all(b - a == width for a, b in windows[:-1]) and windows[-1][1] == n
        assert all(prev[1] - nxt[0] == stride for prev, nxt in zip(windows, windows[1:]))


def test_a_stride_that_does_not_advance_is_refused():
    from attnclust.errors import ConfigError

    with pytest.raises(ConfigError, match=r"extract.doc_stride: got 5; allowed: less than the 5 text tokens"):
        text_windows(20, 5, 5)


# --- reading --------------------------------------------------------------------------------------------------

def test_paragraphs_are_split_at_blank_lines_and_a_whole_file_is_one_text(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(b"\xef\xbb\xbfFirst line\r\nstill first.\r\n\r\n  \r\nSecond.\n\t\nThird\n")
    texts = read_texts(path)
    assert [(t.id, t.context) for t in texts] == [("paragraph-1", "First line\nstill first."),
                                                  ("paragraph-2", "Second."), ("paragraph-3", "Third")]
    assert not any(t.question or t.answers for t in texts)
    whole = read_texts(path, unit="file")
    assert [t.id for t in whole] == ["text"] and whole[0].context.startswith("First line") and "Third" in \
        whole[0].context
    assert [t.id for t in read_texts(path, max_examples=2)] == ["paragraph-1", "paragraph-2"]


def test_jsonl_lines_are_texts_under_the_text_key(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"text": " one ", "source": "a"}\n\n{"text": "two"}\n', encoding="utf-8")
    assert [(t.id, t.context) for t in read_texts(path)] == [("line-1", "one"), ("line-3", "two")]


@pytest.mark.parametrize(("name", "content", "message"), [
    ("empty.txt", b"", r"data file .*empty\.txt: is empty \(no text\)"),
    ("blank.txt", b" \n\t\n", r"blank\.txt: is empty \(no text\)"),
    ("nul.txt", b"text\x00\x01\x02", r"nul\.txt: holds a NUL byte at offset 4, so it is binary"),
    ("latin.txt", "caf\u00e9".encode("latin-1"), r"latin\.txt: is not UTF-8 text \(byte 0xe9 at offset 3\)"),
    ("nokey.jsonl", b'{"text": "a"}\n{"body": "b"}\n', r"nokey\.jsonl line 2: has no 'text' key \(keys: 'body'\)"),
    ("list.jsonl", b'["a"]\n', r"list\.jsonl line 1: is a list; expected one JSON object per line"),
    ("number.jsonl", b'{"text": 3}\n', r"number\.jsonl line 1: 'text' 3 is a number; make it a string"),
    ("emptytext.jsonl", b'{"text": "  "}\n', r"emptytext\.jsonl line 1: 'text' is empty"),
    ("broken.jsonl", b'{"text": "a"\n', r"broken\.jsonl line 1: malformed JSON at column"),
    ("surrogate.jsonl", b'{"text": "a\\ud800"}\n', r"surrogate\.jsonl line 1: 'text' holds a lone surrogate"),
])
def test_bad_text_files_are_one_line_data_errors(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DataError, match=message) as caught:
        read_texts(path)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("name", "content", "message"), [
    ("empty.txt", b"", "is empty (no text)"),
    ("nokey.jsonl", b'{"title": "x"}\n', "line 1: has no 'text' key"),
    ("binary.txt", bytes(range(256)), "holds a NUL byte at offset 0"),
    (None, None, "config data.path: got None; allowed: a .txt or .jsonl file when data.format is text"),
])
def test_the_command_refuses_bad_text_input_in_one_line_exit_2_writing_nothing(tmp_path, capsys, name, content,
                                                                                message):
    from attnclust.cli import main

    data = []
    if name is not None:
        (tmp_path / name).write_bytes(content)
        data = ["--data", str(tmp_path / name)]
    out = tmp_path / "run"
    assert main(["run", "--set", "data.format=text", *data, "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("attnclust: error: ") and err.count("\n") == 1
    assert not out.exists()


# --- whole runs ---------------------------------------------------------------------------------------------------

MAX_SEQ_LEN, STRIDE = 40, 12


@pytest.fixture(scope="module")
def text_runs(tmp_path_factory, tiny_bert_dir):
    """Every stage of a tiny random BERT's and a tiny random Llama's run over the same text file, in-process:
    ``{"bert": (run, model), "llama": (run, model)}`` and the file with its paragraphs."""
    from attnclust.config import load_job
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    from helpers import save_tiny_causal

    base = tmp_path_factory.mktemp("text_runs")
    path = base / "prose.txt"
    paragraphs = _write_texts(path)
    llama = save_tiny_causal(base / "llama_model")
    runs = {}
    for name, model in (("bert", tiny_bert_dir), ("llama", llama)):
        cfg = load_job(None, ["data.format=text", f"data.path={path}", f"model.name={model}",
                              f"extract.max_seq_len={MAX_SEQ_LEN}", "extract.max_query_len=8",
                              f"extract.doc_stride={STRIDE}", "extract.features_per_task=8",
                              "data.max_features_per_example=null", "cluster.k=3", "cluster.umap=false",
                              "cluster.stability_resamples=2", "importance.enabled=true"])
        run_job(cfg, base / name, executor=SerialExecutor(), progress=False)
        runs[name] = (base / name, Path(model), cfg)
    return runs, path, paragraphs


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "llama"])
def test_each_text_is_cut_into_the_brute_force_windows(text_runs, name):
    from transformers import AutoTokenizer

    runs, _, paragraphs = text_runs
    run, model, _ = runs[name]
    tok = AutoTokenizer.from_pretrained(model)
    specials = ([tok.cls_token_id], [tok.sep_token_id]) if name == "bert" else ([], [])  # BERT's one sequence
    width = MAX_SEQ_LEN - len(specials[0]) - len(specials[1])
    features = pd.read_parquet(run / "features.parquet")
    examples = pd.read_parquet(run / "examples.parquet")
    assert list(examples["id"]) == ["paragraph-1", "paragraph-2", "paragraph-3"]
    assert list(examples["context"]) == paragraphs and examples["question"].eq("").all()
    several = total = 0
    for k, text in enumerate(paragraphs):
        enc = tok(text, add_special_tokens=False, split_special_tokens=True, return_offsets_mapping=True)
        ids = enc["input_ids"]
        expected = _brute_force_windows(len(ids), width, STRIDE)
        mine = features[features["example_id"] == f"paragraph-{k + 1}"].sort_values("span")
        assert list(mine["span"]) == list(range(len(expected)))
        several += len(expected) > 1
        for row, (a, b) in zip(mine.itertuples(index=False), expected):
            assert list(row.input_ids) == specials[0] + ids[a:b] + specials[1]
            assert row.seq_len == len(row.input_ids) <= MAX_SEQ_LEN and set(row.segment_ids) == {0}
            assert (row.context_start, row.context_end) == (len(specials[0]), len(specials[0]) + b - a - 1)
            inside = [tuple(o) for o in row.offsets[row.context_start:row.context_end + 1]]
            for (x, y), (raw_x, raw_y) in zip(inside, enc["offset_mapping"][a:b]):
                assert raw_x <= x <= y <= raw_y  # the token's characters, without whitespace
            assert row.answer_start_token == row.answer_end_token == -1
        total += len(expected)
    assert several >= 2  # the first and the last paragraph take several windows
    assert len(features) == total


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "llama"])
def test_control_token_strings_in_the_text_stay_text(text_runs, name):
    from transformers import AutoTokenizer

    from attnclust.data.features import special_ids

    runs, _, _ = text_runs
    run, model, _ = runs[name]
    controls = special_ids(AutoTokenizer.from_pretrained(model))
    features = pd.read_parquet(run / "features.parquet")
    for row in features.itertuples(index=False):
        text_ids = list(row.input_ids)[row.context_start:row.context_end + 1]
        assert not controls & set(text_ids)
    record = json.loads((run / "job.json").read_text())["stages"]["extract"]
    expected = {"bert": "[SEP]", "llama": "<|im_start|>"}[name]
    assert expected in record["control_strings"]["strings"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "llama"])
def test_a_text_run_goes_through_every_stage_without_qa(text_runs, name):
    from attnclust.stages.report import TEXT_NOTE
    from attnclust.store import open_attention_store

    runs, _, _ = text_runs
    run, _, _ = runs[name]
    stages = json.loads((run / "job.json").read_text())["stages"]
    assert set(stages) == {"extract", "qa", "featurize", "cluster", "importance", "report"}
    assert stages["extract"]["data_format"] == "text"
    assert stages["qa"]["skipped_reason"] == "natural text: no questions"
    assert "natural text" in stages["importance"]["skipped_reason"]
    for absent in ("predictions.parquet", "qa_scores.json", "importance.parquet", "probes.parquet",
                   "head_outputs.zarr"):
        assert not (run / absent).exists(), absent
    features = pd.read_parquet(run / "features.parquet")
    store = open_attention_store(run / "attention.zarr")
    assert store.n_features == len(features)
    assert len(pd.read_parquet(run / "maps.parquet")) == len(features) * store.n_layers * store.n_heads
    assert pd.read_parquet(run / "cluster_labels.parquet")["cluster"].nunique() == 3
    html = (run / "report.html").read_text()
    assert TEXT_NOTE in html
    for section in ("qa", "modes", "probes", "importance"):
        assert f'<section id="{section}">' not in html, section
    decoder = name == "llama"
    assert (run / "induction.parquet").exists() == decoder and (run / "decoder_protocols.json").exists() == decoder


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "llama"])
def test_the_stored_maps_are_the_models_own_over_each_window(text_runs, name):
    import torch
    from transformers import AutoModel

    from attnclust.store import open_attention_store

    runs, _, _ = text_runs
    run, model_dir, _ = runs[name]
    features = pd.read_parquet(run / "features.parquet")
    row = features.iloc[-1]  # the longest window
    model = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        kwargs = {"token_type_ids": torch.zeros((1, row.seq_len), dtype=torch.long)} if name == "bert" else {}
        out = model(input_ids=torch.tensor([list(row.input_ids)]), output_attentions=True, **kwargs)
    expected = torch.stack(out.attentions, dim=1)[0].numpy()
    stored = open_attention_store(run / "attention.zarr").read_exact(int(row.feature_id))
    np.testing.assert_allclose(stored, expected, atol=2e-3)


@pytest.mark.slow
def test_a_changed_text_file_or_text_unit_is_another_extraction(text_runs, tmp_path):
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    runs, path, _ = text_runs
    _, _, cfg = runs["bert"]
    data = tmp_path / "prose.txt"
    data.write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    cfg = cfg.replace(data=cfg.data.replace(path=str(data)))
    out = tmp_path / "run"

    def extract(job):
        return run_job(job, out, stages=("extract", "qa"), executor=SerialExecutor(), progress=False)

    extract(cfg)
    assert extract(cfg).stages["extract"].get("skipped")  # the same file: served from the run
    with pytest.raises(StoreError, match=r"data\.text_unit: 'paragraph' -> 'file'"):
        extract(cfg.replace(data=cfg.data.replace(text_unit="file")))
    data.write_text(data.read_text(encoding="utf-8") + "\nA fourth paragraph.\n", encoding="utf-8")
    with pytest.raises(StoreError, match=r"stage 'extract' was run with other settings \(data file content changed\)"):
        extract(cfg)


@pytest.mark.slow
def test_a_text_run_of_a_decoder_writes_window_loss_and_the_report_section(text_runs):
    """The tiny Llama's text run: ``window_loss.parquet`` holds each window's loss as a plain forward of the
    model gives it (a loop over the tokens), ``heads.parquet`` the loss columns, the report its section; the BERT
    run over the same text has neither."""
    import torch

    from attnclust.analysis.loss import LOSS_COLUMNS
    from attnclust.config import ModelConfig
    from attnclust.layout import RunLayout
    from attnclust.models import get_model

    runs, _, _ = text_runs
    root, model, _ = runs["llama"]
    layout = RunLayout(root)
    windows = pd.read_parquet(layout.window_loss)
    features = pd.read_parquet(layout.features, columns=["feature_id", "input_ids"]).set_index("feature_id")
    loaded = get_model(ModelConfig(name=str(model)))
    for row in windows.head(3).itertuples():
        ids = list(features.loc[row.feature_id, "input_ids"])
        with torch.no_grad():
            logits = loaded.model(torch.tensor([ids])).logits[0]
        total = sum(-float(torch.log_softmax(logits[t - 1], -1)[ids[t]]) for t in range(1, len(ids)))
        top1 = sum(int(logits[t - 1].argmax()) == ids[t] for t in range(1, len(ids)))
        assert row.loss == pytest.approx(total / (len(ids) - 1), rel=1e-4)
        assert row.top1 == pytest.approx(top1 / (len(ids) - 1))
    heads = pd.read_parquet(root / "heads.parquet")
    assert set(LOSS_COLUMNS) <= set(heads.columns) and np.isfinite(heads["loss_p"]).all()
    assert "What goes with the model" in layout.report.read_text()
    bert = RunLayout(runs["bert"][0])
    assert not bert.window_loss.exists() and "loss_p" not in pd.read_parquet(bert.root / "heads.parquet").columns


# --- bounded by what the windows can use (issue 51, finding 5) ------------------------------------------------------

def test_a_text_longer_than_its_windows_can_use_is_refused_before_tokenising(tmp_path, monkeypatch):
    """One 50 MB line with ``max_features_per_example`` 16 windows of 384 tokens (at most 614,400 characters): one
    line, before any tokenizer runs (a tokenizer that is called fails the test)."""
    from attnclust.data.limits import InputBound
    from attnclust.data.text import read_texts
    from attnclust.errors import DataError

    big = tmp_path / "one-line.txt"
    big.write_text("word " * 10_000_000)
    with pytest.raises(DataError, match=r"text 'paragraph-1' holds 49,999,999 characters, more than "
                                        r"data.max_features_per_example = 16 windows of extract.max_seq_len = 384 "
                                        r"tokens can use \(614,400 at most"):
        read_texts(big, bound=InputBound(384, 16))
    assert len(read_texts(big, bound=InputBound(384, None))[0].context) == 49_999_999  # no bound: kept whole


def test_only_the_kept_texts_are_bounded(tmp_path):
    from attnclust.data.limits import InputBound
    from attnclust.data.text import read_texts

    path = tmp_path / "t.txt"
    path.write_text("short text\n\n" + "x " * 5000)
    assert [e.id for e in read_texts(path, max_examples=1, bound=InputBound(16, 1))] == ["paragraph-1"]


def test_the_command_refuses_an_over_long_text_in_one_line_exit_2_before_any_stage(tmp_path, capsys, monkeypatch):
    from attnclust.cli import main
    from attnclust.stages import extract

    def no_tokenizer(*args, **kwargs):
        raise AssertionError("the tokenizer was loaded")

    monkeypatch.setattr(extract, "get_tokenizer", no_tokenizer)
    path = tmp_path / "book.txt"
    path.write_text("word " * 2000)
    out = tmp_path / "run"
    assert main(["run", "--data", str(path), "--out", str(out), "--set", "data.format=text", "--set",
                 "data.max_features_per_example=1", "--set", "extract.max_seq_len=16", "--set",
                 "extract.max_query_len=4", "--set", "extract.doc_stride=2", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds 9,999 characters, more than data.max_features_per_example = 1" in err
    assert "raise data.max_features_per_example" in err and not out.exists()
