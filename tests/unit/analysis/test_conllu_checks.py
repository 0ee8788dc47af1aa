"""CoNLL-U input: every sentence must be a tree (one root, no self-heads, no cycles, heads in range, ASCII
numbers), the file a bounded regular file; a file whose sentences are not in the data is refused before any stage
runs, and ``report --force`` keeps the existing report outputs when it refuses."""

from __future__ import annotations

import os

import pytest

from attnclust.analysis.parses import read_conllu
from attnclust.cli import main
from attnclust.errors import DataError

from helpers import REPORT_BASE as BASE
from helpers import run_report_stages as _run


def conllu(*sentences: list[tuple[str, str]]) -> str:
    """CoNLL-U text: each sentence a list of (FORM, HEAD) in word order; DEPREL ``dep`` (``root`` for HEAD 0)."""
    lines = []
    for sent in sentences:
        lines += [f"{i}\t{form}\t_\t_\t_\t_\t{head}\t{'root' if head == '0' else 'dep'}\t_\t_"
                  for i, (form, head) in enumerate(sent, start=1)] + [""]
    return "\n".join(lines) + "\n"


GOOD = [("The", "2"), ("king", "3"), ("slept", "0")]


@pytest.mark.parametrize("sentence, message", [
    ([("The", "2"), ("king", "0"), ("slept", "0")],
     r"sentence at line 5: 2 roots \(HEAD 0: 2 \('king', line 6\), 3 \('slept', line 7\)\); a dependency tree has "
     r"exactly one root: fix the parse$"),
    ([("The", "2"), ("king", "3"), ("slept", "2")], r"sentence at line 5: 0 roots \(HEAD 0: no word\)"),
    ([("The", "1"), ("king", "3"), ("slept", "0")],
     r"sentence at line 5: word 1 \('The', line 5\) is its own head; fix the parse$"),
    ([("The", "2"), ("king", "1"), ("slept", "0")],
     r"sentence at line 5: the heads of words 1 -> 2 -> 1 form a cycle \(line 5\); every word's chain of heads must "
     r"reach the root: fix the parse$"),
    ([("A", "2"), ("b", "3"), ("c", "1"), ("d", "0")],
     r"sentence at line 5: the heads of words 1 -> 2 -> 3 -> 1 form a cycle"),
    ([("The", "٢"), ("king", "3"), ("slept", "0")], r"line 5: HEAD '٢' of word 'The' is not 0 or a word id"),
    ([("The", "2"), ("king", "3"), ("slept", "4")], r"line 7: HEAD '4' of word 'slept' is not 0 or a word id of its "
                                                    r"sentence \(1\.\.3\)"),
])
def test_a_sentence_that_is_not_a_tree_is_refused_in_one_line(tmp_path, sentence, message):
    path = tmp_path / "parses.conllu"
    path.write_text(conllu(GOOD, sentence))
    with pytest.raises(DataError, match=rf"^conllu file {path}: {message}"):
        read_conllu(path)
    path.write_text(conllu(GOOD, GOOD))
    assert [s.heads for s in read_conllu(path)] == [(2, 3, 0)] * 2


def test_non_ascii_word_ids_and_special_files_are_refused(tmp_path):
    path = tmp_path / "ids.conllu"
    path.write_text(conllu(GOOD).replace("1\tThe", "١\tThe"))
    with pytest.raises(DataError, match=r"line 1: ID '١'; expected 1"):
        read_conllu(path)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(DataError, match=r"fifo: is a FIFO \(named pipe\), not a regular file"):
        read_conllu(tmp_path / "fifo")


def test_sentences_not_in_the_data_are_refused_before_any_stage(planted_syntax, tmp_path):  # noqa: F811
    layout = planted_syntax[0]
    foreign = tmp_path / "foreign.conllu"
    foreign.write_text(conllu([("Nowhere", "2"), ("found", "0")]))
    with pytest.raises(DataError, match=rf"^conllu file {foreign}: none of its 1 sentence\(s\) is found in the "
                                        r"run's 6 context\(s\)"):
        _run(layout, f"syntax.conllu={foreign}")
    assert not layout.stage_record("featurize").exists() and not layout.embedding.exists()


def test_report_force_keeps_the_report_when_the_new_parses_are_refused(planted_syntax, tmp_path, capsys):  # noqa: F811
    layout, _, _, gold = planted_syntax
    _run(layout, f"syntax.conllu={gold}")
    kept = {p: p.read_bytes() for p in (layout.report, layout.table("heads"), layout.table("syntax"), layout.parses)}
    foreign = tmp_path / "foreign.conllu"
    foreign.write_text(conllu([("Nowhere", "2"), ("found", "0")]))
    args = ["report", "--out", str(layout.root), "--quiet", "--force", "--set", f"syntax.conllu={foreign}",
            *(f"--set={o}" for o in BASE)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "none of its 1 sentence(s) is found" in err[0]
    assert {p: p.read_bytes() for p in kept if p.exists()} == kept
