"""``attnclust generate kv``: writes a file that read_squad reads, replaces only its own files, and refuses bad
arguments in one line with exit code 2 (no model is loaded: calibration is refused before it would start)."""

from __future__ import annotations

import json
import re

import pytest

from attnclust.cli import main
from attnclust.data import read_squad


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_generate_writes_a_file_read_squad_reads_and_may_rewrite_it(tmp_path, capsys):
    out = tmp_path / "kv.json"
    assert main(["generate", "kv", "--out", str(out), "--questions", "30", "--pairs", "9", "--similarity", "0.75",
                 "--seed", "4"]) == 0
    assert f"wrote 30 key-value questions (ask value, pairs 9, similarity 0.75, seed 4) to {out}" in \
        capsys.readouterr().out
    examples = read_squad(out)
    assert len(examples) == 30 and all(len(ex.context.split("\n")) == 9 for ex in examples)
    assert all(ex.context[a.answer_start:].startswith(a.text) for ex in examples for a in ex.answers)
    first = out.read_text()
    assert main(["generate", "kv", "--out", str(out), "--questions", "30", "--pairs", "9", "--similarity", "0.75",
                 "--seed", "4"]) == 0
    assert out.read_text() == first                                   # deterministic, and its own file replaced
    assert json.loads(first)["settings"]["pairs"] == 9
    reverse = tmp_path / "reverse.json"
    assert main(["generate", "kv", "--out", str(reverse), "--questions", "5", "--ask", "key", "--quiet"]) == 0
    assert all(ex.question.startswith("Which key has the value v") for ex in read_squad(reverse))


@pytest.mark.parametrize("args, match", [
    (["--pairs", "0"], r"^attnclust: error: kv pairs 0: must be an integer from 1 to 1000"),
    (["--similarity", "2"], r"^attnclust: error: kv similarity 2.0: must be a number from 0 to 1"),
    (["--questions", "0"], r"^attnclust: error: kv questions 0: must be an integer from 1"),
    (["--target", "0.4"], r"^attnclust: error: --target: applies only with --calibrate"),
    (["--set", "model.name=smollm2"], r"^attnclust: error: --set: applies only with --calibrate"),
    (["--calibrate", "--pairs", "5"], r"^attnclust: error: --pairs 5 with --calibrate: calibration chooses"),
    (["--calibrate", "--target", "0.9"], r"^attnclust: error: --target 0.9: must lie in the band 0.35-0.65"),
    (["--calibrate"], r"^attnclust: error: model.name 'minilm': is an encoder; calibration prompts a causal model"),
])
def test_bad_arguments_are_refused_in_one_line_with_exit_2(tmp_path, capsys, args, match):
    out = tmp_path / "kv.json"
    assert main(["generate", "kv", "--out", str(out), *args]) == 2
    line = _error_line(capsys)
    assert re.search(match, line), line
    assert not out.exists()


@pytest.mark.parametrize("calibrate", [[], ["--calibrate", "--set", "model.name=smollm2"]])
def test_a_file_attnclust_did_not_write_is_never_overwritten(tmp_path, capsys, calibrate):
    mine = tmp_path / "mine.json"
    mine.write_text("my data")
    assert main(["generate", "kv", "--out", str(mine), *calibrate]) == 2
    assert "mine.json: exists and is not a file attnclust generate wrote; remove it" in _error_line(capsys)
    assert mine.read_text() == "my data"
