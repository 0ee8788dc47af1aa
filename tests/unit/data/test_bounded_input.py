"""Bounded readers of user input: nesting depth, integer size, file type and size are each refused in one line
(exit 2), before anything is written, for the data file, the job YAML, ``--set`` values and predictions."""

from __future__ import annotations

import json
import os
import re

import pytest

from attnclust.cli import main
from attnclust.config import apply_overrides, load_job
from attnclust.data import read_squad
from attnclust.errors import ConfigError, DataError
from attnclust.qa.evaluate import read_predictions
from attnclust.safeio import MAX_INPUT_BYTES, read_user_bytes

DEEP = "[" * 3000 + "]" * 3000
RECORD = {"id": "q1", "question": "What rang?", "context": "The bell rang.", "answers": [{"text": "The bell",
                                                                                          "answer_start": 0}]}


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def run_cli(data, out, tiny_bert_dir, *more) -> int:
    return main(["extract", "--data", str(data), "--out", str(out), "--set", f"model.name={tiny_bert_dir}",
                 "--quiet", *more])


@pytest.mark.parametrize("layout", ["json", "jsonl"])
def test_data_nested_thousands_deep_is_one_line(tmp_path, layout):
    path = tmp_path / f"deep.{layout}"
    if layout == "json":
        path.write_text(json.dumps([RECORD])[:-1] + ", " + DEEP + "]")
        where = rf"data file {re.escape(str(path))}"
    else:
        path.write_text(json.dumps(RECORD) + "\n" + '{"id": "q2", "x": ' + DEEP + "}\n")
        where = rf"data file {re.escape(str(path))} line 2"
    with pytest.raises(DataError, match=rf"^{where}: is nested too deeply \(.*\); no input of attnclust nests more "
                                        r"than a few levels: fix the file$"):
        read_squad(path)


def test_an_integer_of_thousands_of_digits_is_one_line(tmp_path):
    path = tmp_path / "long.json"
    path.write_text(json.dumps([{**RECORD, "score": 1}]).replace('"score": 1', '"score": ' + "7" * 5000))
    with pytest.raises(DataError, match=r"holds an integer of 5,000 digits \(more than 1,000\); no field takes such "
                                        r"a number: fix or remove it$"):
        read_squad(path)


def test_an_extra_field_beyond_64_bits_is_refused_before_anything_is_written(tmp_path, tiny_bert_dir, capsys):
    path = tmp_path / "big.json"
    path.write_text(json.dumps([RECORD, {**RECORD, "id": "q2", "difficulty": 10**30}]))
    out = tmp_path / "out"
    assert run_cli(path, out, tiny_bert_dir) == 2
    line = one_error_line(capsys)
    assert line == (f"attnclust: error: data file {path}: record 1 ('q2'): field 'difficulty' "
                    f"{10**30!r} is outside the 64-bit integer range (-2**63 .. 2**63-1); write it as a string "
                    f"(in quotes) or drop the field")
    assert not out.exists()
    path.write_text(json.dumps([RECORD, {**RECORD, "id": "q2", "difficulty": 2**63 - 1}]))
    assert [dict(e.extra) for e in read_squad(path)] == [{}, {"difficulty": 2**63 - 1}]


@pytest.mark.parametrize("special", ["device", "fifo"])
def test_data_that_is_not_a_regular_file_is_refused_without_reading(tmp_path, tiny_bert_dir, capsys, special):
    if special == "device":
        path, kind = "/dev/zero", "a character device"
    else:
        path, kind = tmp_path / "pipe", "a FIFO (named pipe)"
        os.mkfifo(path)  # nobody writes to it: opening it for reading would block
    out = tmp_path / "out"
    assert run_cli(path, out, tiny_bert_dir) == 2
    assert one_error_line(capsys) == (f"attnclust: error: data file {path}: is {kind}, not a regular file; "
                                      f"attnclust reads input only from regular files: save the content to a file "
                                      f"and give its path")
    assert not out.exists()


def test_a_file_over_the_size_cap_is_refused_without_reading(tmp_path):
    path = tmp_path / "huge.json"
    with open(path, "wb") as fh:
        fh.truncate(MAX_INPUT_BYTES + 1)  # sparse: nothing is stored, and nothing may be read
    with pytest.raises(DataError, match=r"^data file .*huge\.json: is 4\.0 GiB, over the 4\.0 GiB "
                                        r"attnclust reads; use a smaller file$"):
        read_squad(path)
    small = tmp_path / "small.txt"
    small.write_bytes(b"x" * 11)
    with pytest.raises(ConfigError, match=r"^f: is 11 bytes, over the 10 bytes attnclust reads"):
        read_user_bytes(small, "f", limit=10, error=ConfigError)
    assert read_user_bytes(small, "f", limit=11) == b"x" * 11


@pytest.mark.parametrize("content, message", [
    ("name: t\ncluster: " + DEEP + "\n", r"is nested too deeply \(.*\); a job file nests two levels: fix the file$"),
    ("name: t\ncluster:\n  k: " + "9" * 5000 + "\n",
     r"line 3: an integer of 5,000 digits \(more than 1,000\); no setting takes such a number: fix it$"),
])
def test_job_yaml_nesting_and_long_integers_are_one_line(tmp_path, capsys, content, message):
    job = tmp_path / "job.yaml"
    job.write_text(content)
    with pytest.raises(ConfigError, match=rf"^job file {re.escape(str(job))}: {message}"):
        load_job(job)
    assert main(["extract", str(job), "--out", str(tmp_path / "out")]) == 2
    assert one_error_line(capsys).startswith(f"attnclust: error: job file {job}: ")
    assert not (tmp_path / "out").exists()


def test_job_file_must_be_a_small_regular_file(tmp_path):
    with pytest.raises(ConfigError, match=r"^job file /dev/zero: is a character device, not a regular file"):
        load_job("/dev/zero")
    big = tmp_path / "big.yaml"
    big.write_text("name: t\n" + "#" * (1 << 20) + "\n")
    with pytest.raises(ConfigError, match=r"^job file .*big\.yaml: is 1\.0 MiB, over the 1\.0 MiB"):
        load_job(big)


def test_a_set_value_of_thousands_of_digits_is_shown_shortened():
    from attnclust.config import JobConfig

    with pytest.raises(ConfigError, match=r"^config cluster\.k: got '9{76}\.\.\.; allowed: an integer >= 2 or "
                                          r"'auto'") as info:
        JobConfig.from_dict(apply_overrides({}, ["cluster.k=" + "9" * 5000]))
    assert len(str(info.value)) < 300


def test_predictions_nesting_and_long_integers_are_one_line(tmp_path):
    path = tmp_path / "pred.json"
    path.write_text('{"q1": ' + DEEP + "}")
    with pytest.raises(DataError, match=r"^predictions file .*pred\.json: is nested too deeply"):
        read_predictions(path)
    path.write_text('{"q1": ' + "1" * 4400 + "}")
    with pytest.raises(DataError, match=r"^predictions file .*: holds an integer of 4,400 digits"):
        read_predictions(path)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(DataError, match=r"^predictions file .*fifo: is a FIFO \(named pipe\), not a regular file"):
        read_predictions(tmp_path / "fifo")
