"""Bidirectional control characters in the data's questions (a right-to-left override makes "txt.exe" read
"exe.txt") are left out wherever the report and the explorer show the text."""

from __future__ import annotations

import pandas as pd
import pytest

from attnclust.config import load_job
from attnclust.explore import ExploreApp
from attnclust.layout import RunLayout
from attnclust.pipeline import run_job
from attnclust.report.formatting import BIDI_CONTROLS, plain_text, short
from attnclust.stages import SerialExecutor
from attnclust.store import atomic_write_parquet, read_features

RLO, PDF = "\u202e", "\u202c"


def test_plain_text_drops_every_bidi_control_and_nothing_else():
    text = f"Is {RLO}exe.txt{PDF} safe? \u2067ok\u2069 \u200fأ\u200e ✓"
    assert plain_text(text) == "Is exe.txt safe? ok أ ✓"
    assert not set(plain_text(BIDI_CONTROLS))
    assert short(f"{RLO}abcdef", 4) == "abc…"


@pytest.mark.slow
def test_the_report_and_the_explorer_show_questions_without_them(small_planted_run):
    run = small_planted_run("bidi")
    layout = RunLayout(run)
    ids = pd.unique(read_features(run)["example_id"].astype(str))
    questions = [f"Which file is {RLO}exe.txt{PDF} number {i}?" for i in range(len(ids))]
    layout.record(layout.examples)
    atomic_write_parquet(pd.DataFrame({"id": ids, "question": questions}), layout.examples)
    results = ExploreApp(run).search("", limit=50)["results"]
    assert sorted(r["question"] for r in results) == sorted(plain_text(q) for q in questions)
    assert ExploreApp(run).search("exe.txt number 0")["total"] == 1
    cfg = load_job(None, ["cluster.umap=false", "cluster.k=2", "cluster.stability_resamples=2"])
    run_job(cfg, run, stages=("report",), force_named=True, executor=SerialExecutor(), progress=False)
    html = layout.report.read_text(encoding="utf-8")
    assert "Which file is exe.txt number 0?" in html
    assert not any(c in html for c in BIDI_CONTROLS) and "\\u202e" not in html.lower()
