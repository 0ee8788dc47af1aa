"""Nothing is written through a symbolic link: the one atomic write refuses a link in the place of the file or of
its folder (dangling or not), and leaves what the link points to untouched."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from attnclust.errors import StoreError
from attnclust.safeio import atomic_write
from attnclust.stages import SerialExecutor


def write(path: Path, data: bytes = b"new", **kw) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(data), **kw)


@pytest.mark.parametrize("dangling", [True, False])
def test_a_link_in_the_place_of_the_file_is_refused(tmp_path, dangling):
    target = tmp_path / "target"
    if not dangling:
        target.write_bytes(b"user's")
    (tmp_path / "out.json").symlink_to(target)
    with pytest.raises(StoreError, match=rf"^{tmp_path}/out\.json: this file is a symbolic link \(to {target}\); "
                                         r"attnclust never writes through links: remove the link \(or replace it by "
                                         r"a real file\) and re-run$"):
        write(tmp_path / "out.json")
    assert target.exists() is not dangling and (dangling or target.read_bytes() == b"user's")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out.json"] + ([] if dangling else ["target"]))


def test_a_link_in_the_place_of_the_folder_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "exports").symlink_to(real, target_is_directory=True)
    with pytest.raises(StoreError, match=r"exports: this folder is a symbolic link"):
        write(tmp_path / "exports" / "figure.png")
    assert list(real.iterdir()) == []


def test_a_file_is_replaced_with_the_mode_asked(tmp_path):
    path = tmp_path / "key.pem"
    path.write_bytes(b"old")
    write(path, b"secret", mode=0o600)
    assert path.read_bytes() == b"secret" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["key.pem"]  # no temporary file left


def test_appending_refuses_a_link(tmp_path):
    from attnclust.safeio import append_text

    target = tmp_path / "target"
    target.write_text("user's\n")
    (tmp_path / "service.log").symlink_to(target)
    with pytest.raises(StoreError, match=r"service\.log: this file is a symbolic link"):
        append_text(tmp_path / "service.log", "a line\n")
    assert target.read_text() == "user's\n"
    append_text(tmp_path / "own.log", "one\n")
    append_text(tmp_path / "own.log", "two\n")
    assert (tmp_path / "own.log").read_text() == "one\ntwo\n"


@pytest.mark.parametrize("where", ["root", "entry"])
def test_finetune_refuses_a_model_dir_with_links_before_writing(tmp_path, tiny_bert_dir, small_squad, where):
    from attnclust.config import JobConfig
    from attnclust.errors import ConfigError
    from attnclust.qa import finetune_model

    real = tmp_path / "real"
    real.mkdir()
    out = tmp_path / "model"
    if where == "root":
        out.symlink_to(real, target_is_directory=True)
        message = r"--out .*model: is a symbolic link; attnclust never writes through links: give the real directory"
    else:
        out.mkdir()
        (out / "_state").mkdir()
        (out / "_state" / "finetune.started").write_text("0123456789abcdef")  # a fine-tuning began here
        (out / ".final.tmp").symlink_to(real, target_is_directory=True)
        message = r"--out .*model: \.final\.tmp is a symbolic link; attnclust never writes through links"
    cfg = JobConfig.from_dict({"name": "t", "model": {"name": str(tiny_bert_dir)}, "data": {"path": str(small_squad)},
                               "backend": "cpu", "finetune": {"max_steps": 1}})
    with pytest.raises(ConfigError, match=message):
        finetune_model(cfg, out, progress=False)
    assert list(real.iterdir()) == []


def test_the_run_files_written_atomically_refuse_links_too(tmp_path):
    from attnclust.store import atomic_write_json

    target = tmp_path / "user.json"
    target.write_text("{}")
    (tmp_path / "job.json").symlink_to(target)
    with pytest.raises(StoreError, match=r"job\.json: this file is a symbolic link"):
        atomic_write_json(tmp_path / "job.json", {"job_id": "x"})
    assert target.read_text() == "{}"


def test_a_head_output_part_is_written_atomically_and_never_through_a_link(tmp_path):
    import numpy as np

    from attnclust.analysis.probes import save_head_output_part
    from attnclust.models import HeadOutputs

    rng = np.random.default_rng(0)
    out = HeadOutputs(cls=rng.random((2, 1, 2, 4), np.float32), context_mean=rng.random((2, 1, 2, 4), np.float32),
                      last_cls=rng.random((2, 8), np.float32))
    part = tmp_path / "parts" / "head_outputs-000000.npz"
    save_head_output_part(part, np.array([5, 6]), [out])
    with np.load(part) as saved:
        assert list(saved["feature_id"]) == [5, 6] and saved["cls"].shape == (2, 1, 2, 4)
    assert sorted(p.name for p in part.parent.iterdir()) == [part.name]  # no temporary file left
    target = tmp_path / "user.npz"
    target.write_bytes(b"user's")
    link = part.with_name("head_outputs-000001.npz")
    link.symlink_to(target)
    with pytest.raises(StoreError, match=r"this file is a symbolic link"):
        save_head_output_part(link, np.array([5, 6]), [out])
    assert target.read_bytes() == b"user's"


class StopAfterBlock(SerialExecutor):
    """Runs extraction blocks in-process and stops (as a kill would) once ``last`` has finished."""

    def __init__(self, last: int):
        self.last = last

    def map(self, fn, items, **kwargs):
        out = []
        for item in items:
            if item[2] == "extract" and item[4] > self.last:  # run_block(task, root, stage, fingerprint, block, args)
                raise KeyboardInterrupt
            out.append(fn(*item))
        return out


@pytest.mark.slow
def test_a_link_planted_inside_a_store_of_an_interrupted_run_is_refused(tmp_path, tiny_bert_dir, small_squad,
                                                                        capsys):
    from attnclust.cli import main
    from attnclust.config import load_job
    from attnclust.pipeline import run_job

    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    settings = [f"data.path={small_squad}", f"model.name={tiny_bert_dir}", "extract.features_per_task=1"]
    with pytest.raises(KeyboardInterrupt):
        run_job(load_job(None, settings), out, stages=("extract",), executor=StopAfterBlock(0), progress=False)
    chunks = out / "attention.zarr" / "attention" / "c"
    assert (chunks / "0").is_dir() and not (chunks / "1").exists()
    elsewhere.mkdir()
    (elsewhere / "mine.txt").write_text("the user's")
    (chunks / "1").symlink_to(elsewhere, target_is_directory=True)
    assert main(["extract", "--out", str(out), "--quiet", *(a for s in settings for a in ("--set", s))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"attnclust: error: output dir {out}: {chunks / '1'} is a symbolic link (to {elsewhere}); "
                   f"attnclust never writes through links: remove the link (the files it stands for are re-written "
                   f"by re-running the same command) or choose a new --out"]
    assert [p.name for p in elsewhere.iterdir()] == ["mine.txt"]
    (chunks / "1").unlink()
    assert main(["extract", "--out", str(out), "--quiet", *(a for s in settings for a in ("--set", s))]) == 0
    assert (chunks / "1").is_dir() and [p.name for p in elsewhere.iterdir()] == ["mine.txt"]


def test_the_writable_store_refuses_a_link_on_a_chunk_path(tmp_path):
    import numpy as np

    from attnclust.store.integrity import open_writable_group

    group = open_writable_group(tmp_path / "s.zarr", mode="w", zarr_format=3)
    array = group.create_array("a", shape=(4, 2), chunks=(1, 2), dtype="float32")
    array[0] = 1.0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "s.zarr" / "a" / "c" / "1").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(StoreError, match=rf"^store {tmp_path / 's.zarr'}: {tmp_path / 's.zarr' / 'a' / 'c' / '1'} "
                                         rf"is a symbolic link \(to {elsewhere}\); attnclust never writes"):
        array[1] = np.full(2, 2.0, dtype="float32")
    assert list(elsewhere.iterdir()) == []
    array[2] = 3.0                                            # other chunks still write
    assert float(array[2, 0]) == 3.0
