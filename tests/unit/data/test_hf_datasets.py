"""Hugging Face forms of SQuAD v2 as ``data.path`` (:mod:`attnclust.data.hf`): parquet and Arrow files and
``save_to_disk`` folders read as the equivalent JSON, their records and columns checked in one line, their content in
the run's fingerprint; a hub id through ``datasets`` (faked here: the tests need neither it nor the network), and
offline or without ``datasets`` one line with the fix. The folders are written with pyarrow in the layout
``Dataset.save_to_disk`` writes (Arrow streaming shards, ``state.json``, ``dataset_info.json``; a ``DatasetDict``:
``dataset_dict.json`` and a folder per split)."""

from __future__ import annotations

import hashlib
import json
import re
import sys
import types

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from attnclust.cli import main
from attnclust.config import load_job
from attnclust.data import read_gold, read_squad
from attnclust.data.hf import data_fingerprint, resolve_source
from attnclust.errors import AttnclustError, ConfigError, DataError, StoreError
from attnclust.layout import RunLayout
from attnclust.pipeline import run_job
from attnclust.stages import SerialExecutor

ANSWERS = pa.struct([("text", pa.list_(pa.string())), ("answer_start", pa.list_(pa.int32()))])
HUB_SCHEMA = pa.schema([("id", pa.string()), ("title", pa.string()), ("context", pa.string()),
                        ("question", pa.string()), ("answers", ANSWERS)])
"""The columns of ``rajpurkar/squad_v2`` on the hub (its parquet files and ``datasets``' Arrow tables)."""

TINY = ["cluster.k=2", "cluster.umap=false", "cluster.stability_resamples=2", "probe.enabled=false",
        "extract.features_per_task=4"]


def hub_rows(examples) -> dict[str, list]:
    """Validated examples as the hub's columns (an unanswerable question: both answer lists empty)."""
    return {"id": [e.id for e in examples], "title": [e.title for e in examples],
            "context": [e.context for e in examples], "question": [e.question for e in examples],
            "answers": [{"text": [a.text for a in e.answers], "answer_start": [a.answer_start for a in e.answers]}
                        for e in examples]}


def hub_table(examples, schema: pa.Schema = HUB_SCHEMA) -> pa.Table:
    return pa.Table.from_pydict(hub_rows(examples), schema=schema)


def write_parquet(path, table: pa.Table):
    pq.write_table(table, path)
    return path


def write_arrow(path, table: pa.Table, *, stream: bool = True):
    """An Arrow IPC stream (what ``datasets`` writes) or an IPC file."""
    with pa.OSFile(str(path), "wb") as sink, (pa.ipc.new_stream if stream else pa.ipc.new_file)(
            sink, table.schema) as writer:
        writer.write_table(table)
    return path


def write_saved_dataset(folder, table: pa.Table, *, split: str | None = "validation", shards: int = 2):
    """A folder in ``Dataset.save_to_disk``'s layout: ``data-0000i-of-0000n.arrow`` streams, ``state.json``,
    ``dataset_info.json``."""
    folder.mkdir(parents=True)
    names = [f"data-{i:05d}-of-{shards:05d}.arrow" for i in range(shards)]
    step = -(-table.num_rows // shards)
    for i, name in enumerate(names):
        write_arrow(folder / name, table.slice(i * step, step))
    (folder / "state.json").write_text(json.dumps({
        "_data_files": [{"filename": n} for n in names], "_fingerprint": "0123456789abcdef",
        "_format_columns": None, "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False,
        "_split": split}, indent=2))
    (folder / "dataset_info.json").write_text(json.dumps({"citation": "", "description": "", "features": {
        name: {"dtype": "string", "_type": "Value"} for name in ("id", "title", "context", "question")},
        "homepage": "", "license": ""}, indent=2))
    return folder


def write_saved_dict(folder, splits: dict[str, pa.Table]):
    """A folder in ``DatasetDict.save_to_disk``'s layout: ``dataset_dict.json`` and one Dataset folder per split."""
    folder.mkdir(parents=True)
    (folder / "dataset_dict.json").write_text(json.dumps({"splits": list(splits)}))
    for name, table in splits.items():
        write_saved_dataset(folder / name, table, split=name, shards=1)
    return folder


def one_line(exc_info) -> str:
    text = str(exc_info.value)
    assert "\n" not in text, text
    return text


@pytest.fixture
def examples(small_squad):
    return read_squad(small_squad)


# -- reading -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("form", ["parquet", "arrow stream", "arrow file", "arrow without suffix", "saved dataset",
                                  "saved dict"])
def test_each_form_reads_as_the_equivalent_json(small_squad, examples, tmp_path, form):
    assert any(e.is_impossible for e in examples) and any(not e.is_impossible for e in examples)
    table = hub_table(examples)
    split = None
    if form == "parquet":
        path = write_parquet(tmp_path / "squad.parquet", table)
    elif form == "arrow stream":
        path = write_arrow(tmp_path / "squad.arrow", table)
    elif form == "arrow file":
        path = write_arrow(tmp_path / "squad.arrow", table, stream=False)
    elif form == "arrow without suffix":
        path = write_arrow(tmp_path / "data-00000-of-00001", table)
    elif form == "saved dataset":
        path = write_saved_dataset(tmp_path / "saved", table)
    else:
        path, split = write_saved_dict(tmp_path / "saved", {"train": table.slice(0, 2), "validation": table}), \
            "validation"
    assert read_squad(path, split=split) == examples
    assert read_squad(str(path), split=split, max_examples=3) == examples[:3]
    assert read_gold(write_parquet(tmp_path / "gold.parquet", table)) == read_gold(small_squad)


def test_other_column_types_and_layouts_are_read(examples, tmp_path):
    """large_string and large_list (pandas and polars write them), answers as a list of objects, an
    ``is_impossible`` column, and extra columns kept as the records' labels, as in JSON."""
    large = pa.schema([(f.name, pa.large_string()) for f in HUB_SCHEMA if f.name != "answers"]
                      + [("answers", pa.struct([("text", pa.large_list(pa.large_string())),
                                                ("answer_start", pa.large_list(pa.int64()))]))])
    assert read_squad(write_parquet(tmp_path / "large.parquet", hub_table(examples, large))) == examples
    rows = hub_rows(examples)
    rows["answers"] = [[{"text": t, "answer_start": s} for t, s in zip(a["text"], a["answer_start"])]
                       for a in rows["answers"]]
    rows["is_impossible"] = [e.is_impossible for e in examples]
    rows["difficulty"] = list(range(len(examples)))
    got = read_squad(write_parquet(tmp_path / "objects.parquet", pa.Table.from_pydict(rows)))
    assert [(e.id, e.answers, e.is_impossible) for e in got] == [(e.id, e.answers, e.is_impossible) for e in examples]
    assert [dict(e.extra) for e in got] == [{"difficulty": i} for i in range(len(examples))]


# -- one line per problem ------------------------------------------------------------------------------------------

def test_a_bad_record_is_named_by_row_id_and_field(examples, tmp_path):
    rows = hub_rows(examples)
    rows["answers"][3] = {"text": ["tin"], "answer_start": [999]}
    path = write_parquet(tmp_path / "bad.parquet", pa.Table.from_pydict(rows, schema=HUB_SCHEMA))
    with pytest.raises(DataError, match=rf"^data file {re.escape(str(path))}: record 3 \('{examples[3].id}'\): "
                                        r"answers\.answer_start\[0\] 999 is past the end of the context") as info:
        read_squad(path)
    one_line(info)
    rows = hub_rows(examples)
    rows["question"][1] = None
    folder = write_saved_dataset(tmp_path / "saved", pa.Table.from_pydict(rows, schema=HUB_SCHEMA))
    with pytest.raises(DataError, match=rf"^data folder {re.escape(str(folder))}: record 1 \('{examples[1].id}'\): "
                                        r"question is missing"):
        read_squad(folder)
    rows = hub_rows(examples)
    rows["id"][5] = rows["id"][0]
    with pytest.raises(DataError, match=rf"record 5 \('{examples[0].id}'\): id '{examples[0].id}' repeats record 0"):
        read_squad(write_arrow(tmp_path / "dup.arrow", pa.Table.from_pydict(rows, schema=HUB_SCHEMA)))


@pytest.mark.parametrize(("change", "pattern"), [
    ("drop question", (r"has no column 'question' \(columns: id, title, context, answers\); expected the Hugging "
                       r"Face SQuAD v2 schema: id, title, context, question: string; answers: struct<text: "
                       r"list<string>, answer_start: list<int32>>")),
    ("answers as text", (r"column 'answers' is string, expected struct<text: list<string>, answer_start: "
                         r"list<int32>>; the Hugging Face SQuAD v2 schema is id, title")),
    ("offsets as text", (r"column 'answers' is struct<text: list<string>, answer_start: list<string>>, "
                         r"expected struct<text: list<string>, answer_start: list<int32>>")),
    ("numeric id", r"column 'id' is int64, expected string; the Hugging Face SQuAD v2 schema is"),
])
def test_a_missing_or_mistyped_column_is_one_line_naming_file_column_and_schema(examples, tmp_path, change,
                                                                                 pattern):
    table = hub_table(examples)
    if change == "drop question":
        table = table.drop_columns(["question"])
    elif change == "answers as text":
        table = table.set_column(4, "answers", pa.array([json.dumps(a) for a in hub_rows(examples)["answers"]]))
    elif change == "offsets as text":
        offsets = pa.struct([("text", pa.list_(pa.string())), ("answer_start", pa.list_(pa.string()))])
        table = table.set_column(4, "answers", pa.array(
            [{"text": a["text"], "answer_start": [str(s) for s in a["answer_start"]]}
             for a in hub_rows(examples)["answers"]], offsets))
    else:
        table = table.set_column(0, "id", pa.array(range(len(examples)), pa.int64()))
    for path in (write_parquet(tmp_path / "bad.parquet", table), write_arrow(tmp_path / "bad.arrow", table)):
        with pytest.raises(DataError, match=rf"^data file {re.escape(str(path))}: {pattern}") as info:
            read_squad(path)
        one_line(info)
    folder = write_saved_dataset(tmp_path / "saved", table, shards=1)
    with pytest.raises(DataError, match=rf"^data folder {re.escape(str(folder))}: data-00000-of-00001\.arrow: "
                                        rf"{pattern}"):
        read_squad(folder)


def test_files_and_folders_that_are_not_what_they_claim_are_one_line(examples, tmp_path):
    garbage = tmp_path / "broken.parquet"
    garbage.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(DataError, match=r"broken\.parquet: is not a parquet file pyarrow can read \(") as info:
        read_squad(garbage)
    one_line(info)
    with pytest.raises(DataError, match=r"is not an Arrow IPC file or stream pyarrow can read"):
        read_squad(write_parquet(tmp_path / "really_parquet.arrow", hub_table(examples)))
    with pytest.raises(DataError, match=r"is a directory but not a folder written by Dataset\.save_to_disk \(no "
                                        r"state\.json or dataset_dict\.json\)"):
        read_squad(tmp_path)
    folder = write_saved_dataset(tmp_path / "saved", hub_table(examples))
    (folder / "data-00001-of-00002.arrow").unlink()
    with pytest.raises(DataError, match=r"the Arrow file data-00001-of-00002\.arrow listed in state\.json is "
                                        r"missing; write the folder again with save_to_disk"):
        read_squad(folder)


def test_the_split_is_required_where_there_are_several_and_refused_for_a_file(examples, tmp_path):
    table = hub_table(examples)
    both = write_saved_dict(tmp_path / "both", {"train": table.slice(0, 2), "validation": table})
    with pytest.raises(ConfigError, match=r"^data\.split: not set, but data folder .*both holds the splits train, "
                                          r"validation; set data\.split to one of them \(--set data\.split=train\)$"):
        read_squad(both)
    with pytest.raises(ConfigError, match=r"^data\.split: got 'test', which data folder .*both does not hold; "
                                          r"allowed: train \| validation$"):
        read_squad(both, split="test")
    assert len(read_squad(both, split="train")) == 2
    only = write_saved_dict(tmp_path / "only", {"validation": table})
    assert read_squad(only) == examples  # the one split
    saved = write_saved_dataset(tmp_path / "saved", table, split="validation")
    assert read_squad(saved, split="validation") == examples
    with pytest.raises(ConfigError, match=r"data\.split: got 'train', but data folder .*saved holds the one split "
                                          r"'validation'; set data\.split=validation or null"):
        read_squad(saved, split="train")
    parquet = write_parquet(tmp_path / "squad.parquet", table)
    with pytest.raises(ConfigError, match=r"^data\.split: got 'validation', but data file .*squad\.parquet is a "
                                          r"single file \(one split\); allowed: null for a file"):
        read_squad(parquet, split="validation")
    with pytest.raises(ConfigError, match=r"data\.split: got 'val idation'"):
        load_job(None, ["data.split=val idation"])
    assert load_job(None, ["data.split=validation"]).data.split == "validation"


# -- hub ids -------------------------------------------------------------------------------------------------------

class FakeDataset:
    """What the reader uses of a ``datasets.Dataset``: ``with_format("arrow")[:]``, ``split``, ``_fingerprint``."""

    def __init__(self, table: pa.Table, split: str, fingerprint: str):
        self.table, self.split, self._fingerprint = table, split, fingerprint

    def with_format(self, kind):
        assert kind == "arrow"
        return self

    def __getitem__(self, key):
        return self.table


@pytest.fixture
def fake_datasets(monkeypatch):
    """Install a ``datasets`` module whose ``load_dataset`` serves ``hub`` ({id: {split: FakeDataset}})."""
    hub: dict[str, dict[str, FakeDataset]] = {}
    calls = []

    def load_dataset(name, split=None):
        calls.append((name, split))
        if name not in hub:
            raise type("DatasetNotFoundError", (FileNotFoundError,), {})(f"Dataset '{name}' doesn't exist on the Hub")
        if split is None:
            return dict(hub[name])  # a DatasetDict is a dict of splits
        if split not in hub[name]:
            raise ValueError(f'Unknown split "{split}". Should be one of {list(hub[name])}.')
        return hub[name][split]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    return hub, calls


def test_a_hub_id_is_read_through_datasets_with_its_fingerprint(examples, fake_datasets):
    hub, calls = fake_datasets
    table = hub_table(examples)
    hub["me/squad"] = {"train": FakeDataset(table.slice(0, 2), "train", "aaaa"),
                       "validation": FakeDataset(table, "validation", "bbbb")}
    assert resolve_source("me/squad", "validation").kind == "hub"
    assert read_squad("me/squad", split="validation") == examples
    assert data_fingerprint("me/squad", "validation") == "hub me/squad split validation fingerprint bbbb"
    assert calls == [("me/squad", "validation")]  # the fingerprint of what was just read: not loaded again
    hub["me/squad"]["validation"]._fingerprint = "cccc"  # a new revision
    read_squad("me/squad", split="validation")
    assert data_fingerprint("me/squad", "validation").endswith("fingerprint cccc")
    with pytest.raises(ConfigError, match=r"^data\.split: not set, but hub dataset me/squad holds the splits train, "
                                          r"validation; set data\.split"):
        read_squad("me/squad")
    with pytest.raises(ConfigError, match=r"^data\.split: got 'test', which hub dataset me/squad \(split 'test'\) "
                                          r"does not hold \(Unknown split"):
        read_squad("me/squad", split="test")
    with pytest.raises(DataError, match=r"^hub dataset me/nothing: no such local file or folder, nor a dataset on "
                                        r"the Hugging Face hub \(Dataset 'me/nothing' doesn't exist on the Hub\)"):
        read_squad("me/nothing")


@pytest.mark.parametrize("installed", [False, True])
def test_a_hub_id_offline_is_one_line_with_the_fix(small_squad, tiny_bert_dir, tmp_path, monkeypatch, capsys,
                                                   installed):
    def offline(name, split=None):
        raise ConnectionError(f"Couldn't reach '{name}' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline) if installed else None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "out"
    assert main(["extract", "--data", "rajpurkar/squad_v2", "--set", "data.split=validation", "--out", str(out),
                 "--set", f"model.name={tiny_bert_dir}", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("attnclust: error: hub dataset rajpurkar/squad_v2 (split 'validation'): ")
    assert "cannot be downloaded offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set)" in err[0]
    assert ("datasets.load_dataset('rajpurkar/squad_v2', split='validation').save_to_disk(DIR) (or .to_parquet(FILE))"
            in err[0]) and "point data.path at DIR or FILE" in err[0]
    assert not (out / "attention.zarr").exists()


def test_a_hub_id_without_datasets_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets fails
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    with pytest.raises(DataError, match=r"^hub dataset rajpurkar/squad_v2 \(split 'validation'\): no such local file "
                                        r"or folder, and reading a Hugging Face hub dataset needs the datasets "
                                        r"package: pip install datasets") as info:
        read_squad("rajpurkar/squad_v2", split="validation")
    one_line(info)


# -- the fingerprint -----------------------------------------------------------------------------------------------

def test_the_fingerprint_covers_each_form(examples, small_squad, tmp_path):
    table = hub_table(examples)
    assert data_fingerprint(small_squad) == hashlib.sha256(small_squad.read_bytes()).hexdigest()
    parquet = write_parquet(tmp_path / "squad.parquet", table)
    assert data_fingerprint(parquet) == hashlib.sha256(parquet.read_bytes()).hexdigest()
    folder = write_saved_dict(tmp_path / "saved", {"train": table.slice(0, 2), "validation": table})
    before = {split: data_fingerprint(folder, split) for split in ("train", "validation")}
    assert before["train"] != before["validation"]
    info = folder / "validation" / "dataset_info.json"
    info.write_text(info.read_text().replace('"license": ""', '"license": "cc-by-sa-4.0"'))
    assert data_fingerprint(folder, "validation") != before["validation"]
    assert data_fingerprint(folder, "train") == before["train"]
    write_arrow(folder / "train" / "data-00000-of-00001.arrow", table.slice(0, 1))
    assert data_fingerprint(folder, "train") != before["train"]


@pytest.mark.slow
def test_extract_on_a_parquet_file_and_a_changed_file_is_not_served(examples, small_squad, tiny_bert_dir, tmp_path,
                                                                    capsys):
    """``attnclust extract --data x.parquet`` runs; after the file changes, a later ``report`` refuses as with JSON,
    and ``run`` names the changed content."""
    parquet = write_parquet(tmp_path / "squad.parquet", hub_table(examples))
    out = tmp_path / "run"
    sets = [arg for s in [f"model.name={tiny_bert_dir}", *TINY] for arg in ("--set", s)]
    assert main(["extract", "--data", str(parquet), "--out", str(out), "--quiet", "--workers", "1", *sets]) == 0, \
        capsys.readouterr().err
    job = json.loads((out / "job.json").read_text())
    assert job["config"]["data"]["path"] == str(parquet)
    import pandas as pd

    assert list(pd.read_parquet(out / "examples.parquet")["id"]) == [e.id for e in examples]
    cfg = load_job(None, [f"model.name={tiny_bert_dir}", f"data.path={parquet}", *TINY])
    assert run_job(cfg, out, stages=("extract", "qa"), executor=SerialExecutor(), progress=False) \
        .stages["extract"]["skipped"]

    rows = hub_rows(examples)
    rows["question"][0] = "When was it built?"
    write_parquet(parquet, pa.Table.from_pydict(rows, schema=HUB_SCHEMA))
    with pytest.raises(StoreError, match=rf"the data file {re.escape(str(parquet))} changed since the run's stage "
                                         r"'extract' read it"):
        run_job(cfg, out, stages=("report",), executor=SerialExecutor(), progress=False)
    with pytest.raises(AttnclustError, match=r"stage 'extract' was run with other settings \(data file content "
                                             r"changed\)"):
        run_job(cfg, out, stages=("extract", "qa"), executor=SerialExecutor(), progress=False)


def test_a_changed_save_to_disk_folder_is_not_served(examples, tiny_bert_dir, tmp_path):
    table = hub_table(examples)
    folder = write_saved_dict(tmp_path / "saved", {"train": table.slice(0, 2), "validation": table.slice(2)})
    out = tmp_path / "run"
    cfg = load_job(None, [f"model.name={tiny_bert_dir}", f"data.path={folder}", "data.split=train", *TINY])
    run_job(cfg, out, stages=("extract", "qa"), executor=SerialExecutor(), progress=False)
    record = json.loads(RunLayout(out).stage_record("extract").read_text())
    assert record["parts"]["keys"]["data.split"] == "train"
    with pytest.raises(AttnclustError, match=r"stage 'extract' was run with other settings \(data\.split: 'train' -> "
                                             r"'validation'"):
        run_job(cfg.replace(data=cfg.data.replace(split="validation")), out, stages=("extract", "qa"),
                executor=SerialExecutor(), progress=False)
    write_arrow(folder / "train" / "data-00000-of-00001.arrow", table.slice(0, 1))
    with pytest.raises(StoreError, match=r"the data file .*saved changed since the run's stage 'extract' read it"):
        run_job(cfg, out, stages=("featurize",), executor=SerialExecutor(), progress=False)


def test_finetune_fingerprints_a_folder_by_split_and_content(examples, tmp_path):
    from attnclust.qa.finetune import _fingerprint

    table = hub_table(examples)
    folder = write_saved_dict(tmp_path / "saved", {"train": table.slice(0, 2), "validation": table})
    train = load_job(None, [f"data.path={folder}", "data.split=train"])
    before = _fingerprint(train, str(folder))
    assert before != _fingerprint(train.replace(data=train.data.replace(split="validation")), str(folder))
    write_arrow(folder / "train" / "data-00000-of-00001.arrow", table.slice(0, 1))
    assert _fingerprint(train, str(folder)) != before
