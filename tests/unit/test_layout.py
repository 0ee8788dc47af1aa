"""The run directory's ownership: attnclust writes only into new, empty or marked directories and removes only what
it recorded as its own; the run lock."""

from __future__ import annotations

import json
import os

import pytest

from attnclust.errors import JobLocked, StoreError
from attnclust.layout import MARKER, ModelDirLayout, RunLayout


def test_new_and_empty_directories_are_claimed_marker_first(tmp_path):
    for root in (tmp_path / "new" / "deeper", tmp_path / "empty"):
        if root.name == "empty":
            root.mkdir()
        layout = RunLayout(root)
        layout.claim()
        marker = json.loads((root / MARKER).read_text())
        assert marker["schema"] == "attnclust.run" and marker["schema_version"] == 1
        assert layout.is_run() and layout.state.is_dir()


def test_a_directory_holding_anything_else_is_refused_and_left_untouched(tmp_path):
    root = tmp_path / "mine"
    root.mkdir()
    (root / "notes.txt").write_text("my notes")
    with pytest.raises(StoreError, match=r"holds files attnclust did not write \(notes\.txt\).*new or empty --out"):
        RunLayout(root).claim()
    assert sorted(p.name for p in root.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("case, match", [
    ("file", "exists and is a file"),
    ("readonly", "read-only"),
    ("link", "is a symbolic link"),
    ("link_inside", "parts is a symbolic link"),
    ("other_version", "another attnclust version"),
])
def test_unusable_output_directories_are_refused_in_one_line(tmp_path, case, match):
    root = tmp_path / "out"
    if case == "file":
        root.write_text("x")
    elif case == "readonly":
        if os.geteuid() == 0:
            pytest.skip("root writes into read-only directories")
        root.mkdir(mode=0o500)
    elif case == "link":
        (tmp_path / "real").mkdir()
        root.symlink_to(tmp_path / "real")
    elif case == "link_inside":
        RunLayout(root).claim()
        (tmp_path / "elsewhere").mkdir()
        (root / "parts").symlink_to(tmp_path / "elsewhere")
    else:
        root.mkdir()
        (root / MARKER).write_text(json.dumps({"schema": "attnclust.run", "schema_version": 99}))
    with pytest.raises(StoreError, match=match) as info:
        RunLayout(root).check_writable()
    assert "\n" not in str(info.value)


def test_record_refuses_a_user_file_at_a_name_attnclust_uses_and_remove_spares_it(tmp_path):
    layout = RunLayout(tmp_path / "run")
    layout.claim()
    layout.report.write_text("the user's own page")
    with pytest.raises(StoreError, match="report.html exists but attnclust did not write it"):
        layout.record(layout.report)
    layout.remove(layout.report)
    assert layout.report.read_text() == "the user's own page"
    layout.record(layout.table("maps"))
    layout.table("maps").write_text("ours")
    layout.remove(layout.table("maps"), layout.report)
    assert not layout.table("maps").exists() and layout.report.exists()


def test_a_store_written_by_another_tool_is_adopted_as_input_never_owned(tmp_path):
    root = tmp_path / "foreign"
    root.mkdir()
    (root / "attention.zarr").mkdir()
    (root / "features.parquet").write_text("x")
    with pytest.raises(StoreError, match="did not write"):
        RunLayout(root).check_writable()
    layout = RunLayout(root)
    layout.claim(adopt=("attention.zarr", "features.parquet"))
    layout.remove(layout.attention, layout.features)
    assert layout.attention.exists() and layout.features.exists()


def test_second_lock_is_refused_and_released(tmp_path):
    layout = RunLayout(tmp_path / "out")
    with layout.locked(), pytest.raises(JobLocked, match="in use by another attnclust run"):
        with RunLayout(tmp_path / "out").locked():
            pass
    with layout.locked():
        pass


def test_model_dir_layout_tells_a_finished_fine_tuning_from_an_unfinished_one(tmp_path):
    folder = ModelDirLayout(tmp_path / "model")
    assert not folder.is_finetune_dir() and not folder.unfinished()
    folder.state.mkdir(parents=True)
    folder.stage_started("finetune").write_text("abc")
    assert folder.is_finetune_dir() and folder.unfinished()
    folder.stage_record("finetune").write_text("{}")
    assert not folder.unfinished()
    for step, complete in ((5, True), (40, True), (100, False)):  # checkpoint-100 has no trainer state yet
        (folder.checkpoints / f"checkpoint-{step}").mkdir(parents=True)
        if complete:
            (folder.checkpoints / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    (folder.checkpoints / "checkpoint-x").mkdir()
    assert sorted(folder.checkpoint_steps()) == [5, 40]
    assert folder.eval.qa_scores.parent == folder.root / "eval"
