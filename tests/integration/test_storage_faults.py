"""Storage and OS faults through the CLI: each ends with exit 2, one stderr line naming the path and the fix, and
nothing half-written that a later run would take as complete; a run stopped by a full disk resumes to the outputs
of an undisturbed run once space is freed."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from runs import ROOT, assert_same_outputs, cli, one_error_line, reference_args


@contextlib.contextmanager
def tmpfs(path: Path, options: str):
    """A tmpfs mounted at ``path`` for the test (skips where mounting is not allowed)."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True,
                       check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}); needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def command_args(command: str, model_dir: Path, out: Path) -> list[str]:
    """The arguments of the tiny reference's ``run`` for another command on the same job (``--data`` only where it
    exists)."""
    args = reference_args(model_dir, out)
    if command not in ("run", "extract"):
        i = args.index("--data")
        del args[i:i + 2]
    return [command, *args[1:]]


def stage_done(out: Path, stage: str) -> bool:
    return (out / "_state" / f"{stage}.json").exists()


def corrupt_shard(out: Path, shard: int) -> None:
    """Flip bytes inside one shard of the attention store (its data and its checksummed index), and in the chunk
    of ``profile`` vectors of the same features (which the featurize stage reads instead of the maps)."""
    shard_file = out / "attention.zarr" / "attention" / "c" / str(shard) / "0" / "0" / "0" / "0"
    for path in (shard_file, profile_chunk(out, shard)):
        raw = bytearray(path.read_bytes())
        for i in (len(raw) - 5, len(raw) - 6):  # inside the shard index / chunk checksum (crc32c)
            raw[i] ^= 0xFF
        path.write_bytes(bytes(raw))


def profile_chunk(out: Path, shard: int) -> Path:
    return out / "attention.zarr" / "profile" / "c" / str(shard) / "0" / "0" / "0"


def shard_path(out: Path, shard: int) -> Path:
    return out / "attention.zarr" / "attention" / "c" / str(shard) / "0" / "0" / "0" / "0"


def flip_middle(out: Path, shard: int) -> None:
    """Flip 64 bytes in the middle of one shard (inside its inner chunks, each checksummed), and of the chunk of
    ``profile`` vectors of the same features."""
    for path in (shard_path(out, shard), profile_chunk(out, shard)):
        raw = bytearray(path.read_bytes())
        half = min(32, len(raw) // 4)
        for i in range(len(raw) // 2 - half, len(raw) // 2 + half):
            raw[i] ^= 0xFF
        path.write_bytes(bytes(raw))


def drop_feature_rows(out: Path, n: int) -> None:
    features = pd.read_parquet(out / "features.parquet")
    features.iloc[:-n].to_parquet(out / "features.parquet", index=False)


CASES = {
    # name: (setup(tmp_path, tiny_reference) -> out, command, expected pattern, check_after(out))
    "out is a file": ("file", "run", r"exists and is a file"),
    "read-only location": ("readonly", "run", r"ro/out: cannot be created \(.*ro is not writable\)"),
    "corrupted chunk, featurize": ("corrupt", "featurize", r"store .*attention\.zarr: features 2\.\.3 \(shard 1\) "
                                   r"unreadable \(ValueError: Stored and computed checksum do not match.*"
                                   r"extract --force"),
    "corrupted chunk, report": ("corrupt", "report", r"features 2\.\.3 \(shard 1\) unreadable.*extract --force"),
    "64 flipped bytes mid-shard, featurize": ("flip", "featurize", r"store .*attention\.zarr: features 2\.\.3 "
                                              r"\(shard 1\) unreadable \(ValueError: Stored and computed checksum "
                                              r"do not match\); the store is damaged: re-run 'attnclust extract "
                                              r"--force'"),
    "deleted shard, featurize": ("delete", "featurize", r"stage 'extract' finished but its output attention\.zarr/"
                                 r"attention/c/1/0/0/0/0 \(features 2\.\.3\) is missing; re-run 'attnclust extract' "
                                 r"\(or 'attnclust run'\)"),
    "deleted shard, report": ("delete", "report", r"attention\.zarr/attention/c/1/0/0/0/0 \(features 2\.\.3\) is "
                              r"missing; re-run 'attnclust extract'"),
    "truncated head-outputs chunk, report": ("truncate", "report", r"store .*head_outputs\.zarr: head outputs of \d+ "
                                             r"features \(\d+\.\.\d+\) unreadable \(ValueError: .*\); the store is "
                                             r"damaged: re-run 'attnclust extract --force'"),
    "features.parquet short": ("short", "featurize", r"features\.parquet: \d+ rows but the store .* holds \d+ "
                               r"features.*extract --force"),
    "features.parquet short, report": ("short", "report", r"features\.parquet: \d+ rows but the store"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_storage_faults_exit_2_with_one_line_and_leave_nothing_taken_as_complete(case, tmp_path, tiny_reference,
                                                                                tiny_bert_dir):
    setup, command, pattern = CASES[case]
    out = tmp_path / "out"
    before = None
    with contextlib.ExitStack() as stack:
        if setup == "file":
            out.write_text("my notes")
        elif setup == "readonly":
            stack.enter_context(tmpfs(tmp_path / "ro", "ro,size=1m"))
            out = tmp_path / "ro" / "out"
        else:
            shutil.copytree(tiny_reference, out, symlinks=True)
            if setup == "corrupt":
                corrupt_shard(out, 1)
            elif setup == "flip":
                flip_middle(out, 1)
            elif setup == "delete":
                shard_path(out, 1).unlink()
            elif setup == "truncate":
                chunk = out / "head_outputs.zarr" / "last_cls" / "c" / "0" / "0"
                chunk.write_bytes(chunk.read_bytes()[: chunk.stat().st_size // 2])
            else:
                drop_feature_rows(out, 2)
            before = {p: p.stat().st_mtime_ns for p in (out / "_state").glob("*.json")}
        r = cli(*command_args(command, tiny_bert_dir, out), "--force")
        assert r.returncode == 2, r.stderr[-3000:]
        assert re.search(pattern, one_error_line(r)), r.stderr
        if setup == "file":
            assert out.read_text() == "my notes"
        elif setup == "readonly":
            assert not out.exists()
        elif setup in ("corrupt", "flip", "truncate"):
            # the stage that met the damage and every later one are unfinished, their outputs gone
            later = {"featurize": ("featurize", "cluster", "report"), "report": ("report",)}[command]
            assert not any(stage_done(out, s) for s in later)
            assert not (out / "report.html").exists()
            assert stage_done(out, "extract")
        else:  # detected before any work: nothing was touched
            assert before == {p: p.stat().st_mtime_ns for p in (out / "_state").glob("*.json")}
            assert (out / "report.html").exists()


def fill(folder: Path) -> Path:
    """Write a ballast file into ``folder`` until its file system is full."""
    ballast = folder / "ballast"
    with contextlib.suppress(OSError), ballast.open("wb", buffering=0) as f:  # unbuffered: closing cannot fail
        while True:
            f.write(b"\0" * 65536)
    return ballast


def test_a_disk_that_fills_up_ends_in_one_line_and_the_run_resumes_to_equal_outputs(tmp_path, tiny_reference,
                                                                                    tiny_bert_dir, slow_extract):
    """Another process fills the disk during extraction (after the pre-flight check passed)."""
    mount = tmp_path / "small"
    with tmpfs(mount, f"size={du(tiny_reference) * 4 + (16 << 20)}"):
        out = mount / "out"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", **slow_extract(tmp_path, 0.5)}
        proc = subprocess.Popen([sys.executable, "-m", "attnclust.cli", *map(str, reference_args(tiny_bert_dir, out))],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        markers = out / "_state" / "extract"
        deadline = time.monotonic() + 120
        while not list(markers.glob("*.done")) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        ballast = fill(mount)
        _, stderr = proc.communicate(timeout=300)
        r = subprocess.CompletedProcess(proc.args, proc.returncode, "", stderr)
        assert r.returncode == 2, stderr[-3000:]
        line = one_error_line(r)
        assert re.search(r"no space left on the device; free space .* re-run the same command", line), line
        assert str(mount) in line
        assert not stage_done(out, "extract") and not (out / "report.html").exists()
        assert not list(out.rglob(".*.tmp")), "a half-written file was left behind"
        ballast.unlink()
        r = cli(*reference_args(tiny_bert_dir, out))
        assert r.returncode == 0, r.stderr[-3000:]
        assert json.loads((out / "_state" / "extract.json").read_text())["blocks_resumed"] >= 1
        assert_same_outputs(out, tiny_reference)


def test_a_deleted_shard_is_one_line_in_compare_never_zero_maps(tmp_path, tiny_reference):
    out = tmp_path / "out"
    shutil.copytree(tiny_reference, out, symlinks=True)
    shard_path(out, 1).unlink()
    r = cli("compare", tiny_reference, out, "--out", tmp_path / "cmp", "--quiet")
    assert r.returncode == 2, r.stderr[-3000:]
    assert re.search(r"attention\.zarr: array 'attention', features 2\.\.3 \(chunk attention/c/1/0/0/0/0\) is "
                     r"missing; the store is damaged: re-run 'attnclust extract --force'", one_error_line(r))


@pytest.mark.parametrize("command", ["report", "run"])
def test_a_deleted_output_is_rebuilt_by_the_command_that_wrote_it(command, tmp_path, tiny_reference,
                                                                  tiny_bert_dir):
    out = tmp_path / "out"
    shutil.copytree(tiny_reference, out, symlinks=True)
    (out / "heads.parquet").unlink()
    clusters = out / "clusters.parquet"
    clusters.write_bytes(clusters.read_bytes()[:-64])  # a truncated footer
    r = cli(*command_args(command, tiny_bert_dir, out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"^\s*report\s+[\d.]+ s$", r.stdout, re.MULTILINE), r.stdout  # ran, not "already complete"
    for table in ("heads", "clusters"):
        before = pd.read_parquet(tiny_reference / f"{table}.parquet")
        pd.testing.assert_frame_equal(pd.read_parquet(out / f"{table}.parquet")[before.columns], before)
