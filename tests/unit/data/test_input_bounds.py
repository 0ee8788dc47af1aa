"""Hostile inputs that are small on disk (issue 51): a table that decompresses to gigabytes is refused from its
footer or message headers before it is decoded, a context longer than the run can use before it is tokenised, a
``save_to_disk`` folder of too many shards before any is opened, and a link inside an input folder without
reading, or quoting, what it points to. Reading a file never reserves memory for the size limit itself."""

from __future__ import annotations

import json
import os
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from attnclust.data import data_fingerprint, read_squad
from attnclust.data.limits import InputBound
from attnclust.errors import DataError
from attnclust.safeio import read_user_bytes

ANSWERS = pa.struct([("text", pa.list_(pa.string())), ("answer_start", pa.list_(pa.int32()))])
BOUND = InputBound(8, 1)
"""One window of 8 tokens: 800 characters of a context, 3,200 + 1 MiB bytes of a table row."""
SECRET = "root:x:0:0:root:/root:/bin/bash\n"


def table(contexts: list[str], **extra) -> pa.Table:
    """Unanswerable questions about ``contexts``, in the hub's SQuAD v2 columns (and ``extra`` columns)."""
    n = len(contexts)
    return pa.table({"id": [f"q{i}" for i in range(n)], "title": ["t"] * n, "context": contexts,
                     "question": ["What?"] * n, "answers": pa.array([{"text": [], "answer_start": []}] * n, ANSWERS),
                     **extra})


def write_arrow(path, data: pa.Table, *, stream: bool = True, compression: str | None = None):
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.OSFile(str(path), "wb") as sink, (pa.ipc.new_stream if stream else pa.ipc.new_file)(
            sink, data.schema, options=options) as writer:
        writer.write_table(data)
    return path


def write_saved(folder, data: pa.Table, names: list[str] | None = None):
    """A ``Dataset.save_to_disk`` folder of one shard."""
    folder.mkdir(parents=True)
    write_arrow(folder / "data-00000-of-00001.arrow", data)
    names = names if names is not None else ["data-00000-of-00001.arrow"]
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": n} for n in names],
                                                   "_split": "validation"}))
    (folder / "dataset_info.json").write_text(json.dumps({"description": ""}))
    return folder


def no_decoding(monkeypatch):
    def decoded(*args, **kwargs):
        raise AssertionError("a row group was decoded")

    monkeypatch.setattr(pq.ParquetFile, "read", decoded)
    monkeypatch.setattr(pq.ParquetFile, "read_row_group", decoded)


# -- tables that decompress to more than a run can use --------------------------------------------------------------

def test_a_parquet_row_group_over_the_bound_is_refused_from_its_footer(tmp_path, monkeypatch):
    path = tmp_path / "bomb.parquet"
    pq.write_table(table(["x" * (4 << 20)]), path, compression="zstd", compression_level=19)
    assert path.stat().st_size < 10_000
    assert len(read_squad(path)[0].context) == 4 << 20  # no bound: the file is read
    no_decoding(monkeypatch)
    with pytest.raises(DataError, match=rf"^data file {re.escape(str(path))}: row group 0 takes 4,19\d,\d{{3}} "
                                        r"bytes for 1 row once decompressed, more than data\.max_features_per_example "
                                        r"= 1 windows of extract\.max_seq_len = 8 tokens can use \(1,051,776 bytes a "
                                        r"row at most\); cut the long texts, or raise data\.max_features_per_example "
                                        r"\(null keeps every window\)$"):
        read_squad(path, bound=BOUND)


def test_a_parquet_file_over_the_input_limit_once_decompressed_is_refused_without_a_bound(tmp_path, monkeypatch):
    path = tmp_path / "bomb.parquet"
    pq.write_table(table(["x" * (2 << 20)]), path, compression="zstd")
    monkeypatch.setattr("attnclust.data.hf.tables.MAX_INPUT_BYTES", 1 << 20)
    no_decoding(monkeypatch)
    with pytest.raises(DataError, match=r"bomb\.parquet: takes 2,09\d,\d{3} bytes once decompressed, more than the "
                                        r"1,048,576 attnclust reads; keep fewer rows \(Dataset\.select\) and write it "
                                        r"again$"):
        read_squad(path)


def test_a_dictionary_entry_used_by_every_row_is_counted_for_each(tmp_path, monkeypatch):
    """Parquet's dictionary pages: 200 rows of one 20 kB context are 20 kB on the footer and 4 MB of records."""
    path = tmp_path / "dict.parquet"
    pq.write_table(table(["y" * 20_000] * 200), path)
    assert pq.ParquetFile(path).metadata.row_group(0).total_byte_size < 100_000
    monkeypatch.setattr("attnclust.data.hf.tables.MAX_INPUT_BYTES", 1 << 20)
    with pytest.raises(DataError, match=r"dict\.parquet: takes 4,0\d\d,\d{3} bytes once decompressed \(each "
                                        r"dictionary entry counted where it is used\), more than the 1,048,576 "
                                        r"attnclust reads"):
        read_squad(path)
    monkeypatch.undo()
    examples = read_squad(path)
    assert len(examples) == 200 and all(e.context == "y" * 20_000 for e in examples)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "file"])
@pytest.mark.parametrize("compression", ["zstd", "lz4"])
def test_a_compressed_arrow_batch_over_the_bound_is_refused_from_its_header(tmp_path, stream, compression):
    path = write_arrow(tmp_path / "bomb.arrow", table(["z" * (4 << 20)]), stream=stream, compression=compression)
    assert path.stat().st_size < 100_000
    with pytest.raises(DataError, match=r"bomb\.arrow: record batch 0 takes 4,19\d,\d{3} bytes for 1 row once "
                                        r"decompressed, more than data\.max_features_per_example = 1 windows"):
        read_squad(path, bound=BOUND)
    small = write_arrow(tmp_path / "small.arrow", table(["a context"] * 3), stream=stream, compression=compression)
    assert [e.id for e in read_squad(small, bound=BOUND)] == ["q0", "q1", "q2"]


@pytest.mark.parametrize("layout", ["dictionary", "views"])
def test_arrow_values_shared_by_many_rows_are_counted_for_each(tmp_path, monkeypatch, layout):
    """An extra column whose rows all use one 20 kB value (a dictionary entry, or views of one buffer)."""
    n, value = 200, b"v" * 20_000
    if layout == "dictionary":
        topic = pa.array([value.decode()] * n).dictionary_encode()
    else:
        view = (len(value)).to_bytes(4, "little") + value[:4] + bytes(8)  # length, prefix, buffer 0, offset 0
        topic = pa.Array.from_buffers(pa.string_view(), n, [None, pa.py_buffer(view * n), pa.py_buffer(value)])
    path = write_arrow(tmp_path / "shared.arrow", table(["a context"] * n, topic=topic))
    assert path.stat().st_size < 100_000
    monkeypatch.setattr("attnclust.data.hf.tables.MAX_INPUT_BYTES", 1 << 20)
    with pytest.raises(DataError, match=r"shared\.arrow: takes 4,0\d\d,\d{3} bytes once decompressed \(each "
                                        r"dictionary entry counted where it is used\)"):
        read_squad(path)
    monkeypatch.undo()
    assert {dict(e.extra)["topic"] for e in read_squad(path)} == {value.decode()}


def test_arrow_offsets_out_of_order_are_one_line(tmp_path):
    """Offsets that go back would make rows overlap (one buffer read over and over); pyarrow reads them as given."""
    offsets = pa.py_buffer(b"".join(n.to_bytes(4, "little") for n in (0, 8, 2)))
    contexts = pa.Array.from_buffers(pa.string(), 2, [None, offsets, pa.py_buffer(b"abcdefghij")])
    path = write_arrow(tmp_path / "bad.arrow", table(["", ""]).set_column(2, "context", contexts))
    with pytest.raises(DataError, match=r"bad\.arrow: is not an Arrow IPC file or stream pyarrow can read \(.*"
                                        r"non-monotonic offset.*\); write it with pyarrow or datasets"):
        read_squad(path)


# -- contexts longer than the run can use ---------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["flat", "nested", "parquet"])
def test_a_context_longer_than_the_windows_can_hold_is_refused_before_tokenisation(tmp_path, layout):
    context = "w" * (BOUND.chars + 1)
    data = table(["short", context])
    if layout == "parquet":
        path, loc = tmp_path / "data.parquet", ""
        pq.write_table(data, path)
    elif layout == "flat":
        path, loc = tmp_path / "data.json", ""
        path.write_text(json.dumps(data.to_pylist()))
    else:
        path, loc = tmp_path / "data.json", " at data[1].paragraphs[0].qas[0]"
        path.write_text(json.dumps({"data": [{"title": "t", "paragraphs": [
            {"context": c, "qas": [{"id": f"q{i}", "question": "What?", "answers": []}]}]}
            for i, c in enumerate(["short", context])]}))
    line = BOUND.refusal(f"data file {path}", f"record 1 ('q1'){loc} context", 801)
    with pytest.raises(DataError, match=f"^{re.escape(line)}$"):
        read_squad(path, bound=BOUND)
    assert len(read_squad(path, bound=InputBound(8, None))) == 2  # null keeps every window: no bound


# -- save_to_disk folders: the number of shards, links -------------------------------------------------------------

def test_a_folder_listing_too_many_shards_is_refused_before_any_is_opened(tmp_path, monkeypatch):
    folder = write_saved(tmp_path / "saved", table(["a context"]),
                         names=[f"data-{i:05d}-of-20001.arrow" for i in range(20_001)])
    with pytest.raises(DataError, match=r"^data folder .*saved: state\.json lists 20,001 Arrow files, more than the "
                                        r"10,000 attnclust reads from a folder; save the dataset again in fewer "
                                        r"shards \(save_to_disk\(num_shards=\.\.\.\)\)$"):
        read_squad(folder)
    monkeypatch.setattr("attnclust.data.hf.resolve.MAX_SHARDS", 2)
    (folder / "state.json").write_text("{}")  # no list: the folder's .arrow files
    for i in (1, 2):
        write_arrow(folder / f"more-{i}.arrow", table(["a context"]))
    with pytest.raises(DataError, match=r"saved: holds 3 Arrow files, more than the 2 attnclust reads"):
        read_squad(folder)


def test_reading_a_file_reserves_its_size_not_the_limit(tmp_path):
    path = tmp_path / "small.json"
    path.write_bytes(b"[1, 2]")
    assert read_user_bytes(path, "f", limit=2**62) == b"[1, 2]"


@pytest.mark.skipif(not os.path.isfile("/proc/self/status"), reason="needs Linux's /proc")
def test_a_file_longer_than_its_size_is_read_to_the_limit():
    """/proc files say they are empty: what is read past the size seen (a file that grew) still counts."""
    assert os.stat("/proc/self/status").st_size == 0
    assert b"Name:" in read_user_bytes("/proc/self/status", "f", limit=2**62)
    with pytest.raises(DataError, match=r"^f: is over the 10 bytes attnclust reads; use a smaller file$"):
        read_user_bytes("/proc/self/status", "f", limit=10)


@pytest.fixture
def outside(tmp_path):
    """A file outside the data folder that a link in it points to."""
    target = tmp_path / "elsewhere" / "passwd"
    target.parent.mkdir()
    target.write_text(SECRET)
    return target


def quotes_nothing_of(message: str, target) -> bool:
    return not any(s in message for s in (str(target), "passwd", "elsewhere", SECRET.strip(), "/bin/bash"))


def test_a_link_is_refused_unread_where_links_are_not_followed(tmp_path, outside):
    (tmp_path / "state.json").symlink_to(outside)
    with pytest.raises(DataError, match=r"^f: is a symbolic link; attnclust reads only regular files here: copy the "
                                        r"file in its place$"):
        read_user_bytes(tmp_path / "state.json", "f", follow_links=False)
    assert read_user_bytes(tmp_path / "state.json", "f") == SECRET.encode()  # a path the user gave: followed


@pytest.mark.parametrize("entry", ["data-00000-of-00001.arrow", "state.json", "dataset_info.json"])
def test_a_file_linked_out_of_a_saved_folder_is_refused_unread(tmp_path, outside, entry):
    folder = write_saved(tmp_path / "saved", table(["a context"]))
    if entry != "data-00000-of-00001.arrow":  # a target that reads as the file would
        outside.write_bytes((folder / entry).read_bytes())
    (folder / entry).unlink()
    (folder / entry).symlink_to(outside)
    line = (rf"^data folder {re.escape(str(folder))}: {re.escape(entry)} is a symbolic link; attnclust reads only "
            r"regular files and folders inside the folder: put a copy of the file in its place$")
    for read in (read_squad, data_fingerprint):
        with pytest.raises(DataError, match=line) as info:
            read(folder)
        assert quotes_nothing_of(str(info.value), outside)


def test_a_split_folder_linked_out_of_a_saved_dict_is_refused(tmp_path):
    real = write_saved(tmp_path / "elsewhere" / "validation", table(["a context"]))
    folder = tmp_path / "saved"
    folder.mkdir()
    (folder / "dataset_dict.json").write_text(json.dumps({"splits": ["validation", "../elsewhere"]}))
    (folder / "validation").symlink_to(real, target_is_directory=True)
    with pytest.raises(DataError, match=r"^data folder .*saved: validation is a symbolic link; attnclust reads only "
                                        r"regular files and folders inside the folder: put a copy of the folder in "
                                        r"its place$") as info:
        read_squad(folder, split="validation")
    assert quotes_nothing_of(str(info.value), real)
    with pytest.raises(DataError, match=r"^data folder .*saved: \.\./elsewhere lies outside the folder; "):
        read_squad(folder, split="../elsewhere")


def test_the_folder_given_may_itself_be_a_link(tmp_path, monkeypatch):
    folder = write_saved(tmp_path / "saved", table(["a context"]))
    (tmp_path / "link").symlink_to(folder, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    assert [e.id for e in read_squad("link")] == ["q0"]
    assert data_fingerprint("link") == data_fingerprint("saved") == data_fingerprint(folder)
