"""The ``syntax`` analysis wired into the report stage, on the planted store of ``test_syntax.py`` (head (1, 1)
always attends to the gold dependency head): ``syntax.parquet``, the ``syntax_best_*`` columns of ``heads.parquet``
and the "Syntax" section when ``syntax.conllu`` is set; off by default with one line saying why; a malformed
CoNLL-U file refused in one line before anything is written."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from attnclust.analysis.syntax import HEAD_BEST_COLUMNS, SYNTAX_COLUMNS, SYNTAX_SKIPPED
from attnclust.cli import main
from attnclust.errors import DataError

from helpers import run_report_stages as _run


def _section(report: str, name: str) -> str:
    start = report.index(f'<section id="{name}">')
    end = report.find("\n<section id=", start + 1)
    return report[start:end if end > 0 else None]


def test_syntax_writes_its_table_the_head_columns_and_the_report_section(planted_syntax, capsys):  # noqa: F811
    layout, _, _, conllu = planted_syntax
    _run(layout, f"syntax.conllu={conllu}", progress=True)
    assert re.search(r"syntax: \d+ parsed sentence\(s\) found in the contexts, [\d,]+ arcs over 6 features",
                     capsys.readouterr().out)
    table = pd.read_parquet(layout.table("syntax"))
    assert list(table.columns) == list(SYNTAX_COLUMNS)
    assert set(table["relation"]) == {"prev", "next", "far", "punct"}
    heads = pd.read_parquet(layout.table("heads")).set_index(["layer", "head"])
    assert set(HEAD_BEST_COLUMNS) <= set(heads.columns)
    gold = heads.loc[(1, 1)]
    assert gold["syntax_best_accuracy"] == 1.0 and gold["syntax_best_direction"] == "dep->head"
    assert gold["syntax_best_gain"] == pytest.approx(1.0 - gold["syntax_best_baseline"])
    assert gold["syntax_best_gain"] == heads["syntax_best_gain"].max()  # no head beats the baseline by more
    row = table[(table["relation"] == gold["syntax_best_relation"]) & (table["direction"] == "dep->head")
                & (table["layer"] == 1) & (table["head"] == 1)]
    assert row["baseline"].iloc[0] == gold["syntax_best_baseline"] and row["n"].iloc[0] == gold["syntax_best_n"]
    report = layout.report.read_text()
    section = _section(report, "syntax")
    assert "<h2>Syntax</h2>" in section or ">Syntax<" in section
    assert "L1H1" in section and "gold CoNLL-U gold.conllu" in section
    assert len(re.findall(r'<img\b[^>]*src="data:image/png;base64,', section)) == 3  # the 3 commonest relations
    record = layout.stage_record("report").read_text()
    assert '"syntax"' in record


def test_syntax_is_off_by_default_with_one_line_saying_why(planted_syntax, capsys):  # noqa: F811
    layout = planted_syntax[0]
    _run(layout, "syntax.conllu=null", progress=True)  # the demo job (the base here) enables it
    assert SYNTAX_SKIPPED in capsys.readouterr().out.splitlines()
    assert not layout.table("syntax").exists()
    assert not any(c.startswith("syntax_best") for c in pd.read_parquet(layout.table("heads")).columns)
    assert '<section id="syntax">' not in layout.report.read_text()


def test_bundled_parses_with_another_data_file_are_skipped_with_one_line(planted_syntax, tmp_path, capsys):  # noqa: F811
    layout = planted_syntax[0]
    data = tmp_path / "mine.json"
    _run(layout, "syntax.conllu=bundled", f"data.path={data}", progress=True)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("syntax: skipped")]
    # decided by the run's contexts, not by the command's data.path: 'report' alone decides the same as 'run'
    assert lines == ["syntax: skipped (syntax.conllu: bundled parses sentences of the bundled sample, and none of "
                     "them is in this run's contexts; set syntax.conllu to a CoNLL-U file of your contexts, or "
                     "syntax.spacy_model; with the bundled sample and data.max_examples, keep more of it)"]
    assert not layout.table("syntax").exists()


def test_bundled_parses_matching_no_context_are_skipped_with_one_line(planted_syntax, capsys):  # noqa: F811
    layout = planted_syntax[0]  # planted contexts: none of the bundled sample's sentences
    _run(layout, "syntax.conllu=bundled", progress=True)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("syntax: skipped")]
    assert lines == ["syntax: skipped (syntax.conllu: bundled parses sentences of the bundled sample, and none of "
                     "them is in this run's contexts; set syntax.conllu to a CoNLL-U file of your contexts, or "
                     "syntax.spacy_model; with the bundled sample and data.max_examples, keep more of it)"]
    assert not layout.table("syntax").exists()


def test_a_malformed_conllu_is_refused_in_one_line_before_any_work(planted_syntax, tmp_path, capsys):  # noqa: F811
    layout = planted_syntax[0]
    bad = tmp_path / "bad.conllu"
    bad.write_text("1\tThe\tthe\tDET\t_\t_\t2\tdet\t_\t_\n2\tking\tking\tNOUN\t_\t_\t0\n")
    with pytest.raises(DataError, match=r"bad\.conllu: line 2: 7 tab-separated field\(s\)"):
        _run(layout, f"syntax.conllu={bad}")
    assert not layout.table("heads").exists() and not layout.stage_record("featurize").exists()
    missing = tmp_path / "missing.conllu"
    assert main(["report", "--out", str(layout.root), "--quiet", "--set", f"syntax.conllu={missing}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnclust: error: conllu file") and "not found" in err and "\n" not in err
