"""``attnclust export``: the report's figures as PNG, SVG and PDF files, never over a user's file."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from attnclust.cli import main
from attnclust.errors import DataError
from attnclust.export import build_figure, figure_names
from attnclust.layout import RunLayout

MAGIC = {"png": lambda b: b.startswith(b"\x89PNG\r\n\x1a\n"),
         "pdf": lambda b: b.startswith(b"%PDF-"),
         "svg": lambda b: ET.fromstring(b).tag == "{http://www.w3.org/2000/svg}svg"}


@pytest.fixture(scope="module")
def run_dir(small_planted_run):
    return small_planted_run("export")


@pytest.mark.parametrize("fmt", ["png", "svg", "pdf"])
def test_each_format_is_a_valid_file(run_dir, tmp_path, fmt):
    out = tmp_path / f"grid.{fmt}"
    assert main(["export", str(run_dir), "--figure", "grid", "--format", fmt, "--out", str(out)]) == 0
    assert MAGIC[fmt](out.read_bytes())


def test_default_output_goes_to_exports_and_is_replaced_by_a_new_export(run_dir, capsys):
    target = RunLayout(run_dir).export("head_layout", "svg")
    for _ in range(2):  # the second export replaces the file attnclust wrote
        assert main(["export", str(run_dir), "--figure", "head_layout", "--format", "svg"]) == 0
        assert MAGIC["svg"](target.read_bytes())
    assert "exports/head_layout.svg" in RunLayout(run_dir).written()
    assert str(target) in capsys.readouterr().out


def test_unknown_figure_is_one_line_listing_the_names(run_dir, capsys):
    assert main(["export", str(run_dir), "--figure", "nope", "--format", "png"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'nope'" in err
    assert all(name in err for name in figure_names())


def test_list_prints_every_figure(run_dir, capsys):
    assert main(["export", str(run_dir), "--figure", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == figure_names()


def test_an_existing_user_file_is_never_overwritten(run_dir, tmp_path, capsys):
    mine = tmp_path / "figure.png"
    mine.write_bytes(b"my own figure")
    assert main(["export", str(run_dir), "--figure", "grid", "--out", str(mine)]) == 2
    assert mine.read_bytes() == b"my own figure"
    assert "exists" in capsys.readouterr().err
    layout = RunLayout(run_dir)
    theirs = layout.export("entropy", "png")  # put in exports/ by the user, not recorded by attnclust
    theirs.parent.mkdir(exist_ok=True)
    theirs.write_bytes(b"user's entropy plot")
    assert main(["export", str(run_dir), "--figure", "entropy", "--format", "png"]) == 2
    assert theirs.read_bytes() == b"user's entropy plot"
    assert main(["export", str(run_dir), "--figure", "grid", "--out", str(layout.table("heads").with_suffix(".png"))
                 ]) == 2  # inside the run, only exports/ is written
    assert not layout.table("heads").with_suffix(".png").exists()
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "did not write it" in err and "exports/" in err


def test_format_and_suffix_must_agree(run_dir, tmp_path, capsys):
    assert main(["export", str(run_dir), "--figure", "grid", "--format", "pdf", "--out", str(tmp_path / "a.png")]) == 2
    assert not (tmp_path / "a.png").exists() and "disagrees" in capsys.readouterr().err


def test_not_a_run_and_missing_data_are_one_line_errors(run_dir, tmp_path, capsys):
    assert main(["export", str(tmp_path), "--figure", "grid"]) == 2
    assert main(["export", str(run_dir), "--figure", "umap"]) == 2  # cluster.umap was off
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "not an attnclust run" in err[0] and "UMAP" in err[1]


@pytest.mark.parametrize("name", figure_names())
def test_every_figure_draws_or_says_what_the_run_lacks(run_dir, name):
    try:
        fig = build_figure(run_dir, name)
    except DataError as exc:
        assert name in str(exc) and "\n" not in str(exc)
    else:
        assert fig.axes


def test_nothing_is_written_into_a_folder_a_symlinked_exports_points_to(small_planted_run, tmp_path, capsys):
    run = small_planted_run("export-link")
    layout = RunLayout(run)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    layout.exports.symlink_to(elsewhere, target_is_directory=True)
    for more in ([], ["--out", str(layout.exports / "grid.png")], ["--out", str(elsewhere / "grid.png")]):
        assert main(["export", str(run), "--figure", "grid", "--format", "png", *more]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"attnclust: error: run dir {layout.root.resolve()}: exports is a symbolic link; attnclust "
                       f"does not write through links inside a run directory: remove it"]
    assert list(elsewhere.iterdir()) == []
    assert "exports/grid.png" not in layout.written()


def test_the_moved_figure_plots_each_heads_weight_share_against_its_moved_share(small_planted_run, tmp_path):
    """On a run whose heads table has the moved-norm columns (planted here), the figure's points are each head's
    (weight share, moved share) per target; the file is written like every figure."""
    import numpy as np
    import pandas as pd

    from attnclust.analysis.moved import MOVED_COLUMNS

    run = small_planted_run("export-moved")
    path = RunLayout(run).table("heads")
    heads = pd.read_parquet(path)
    rng = np.random.default_rng(3)
    for column in MOVED_COLUMNS:
        heads[column] = rng.uniform(0, 1, len(heads)).astype(np.float32)
    heads.to_parquet(path, index=False)
    fig = build_figure(run, "moved")
    points = [c.get_offsets() for c in fig.axes[0].collections]
    assert len(points) == 3  # [CLS], [SEP], punctuation: an encoder's targets
    for offsets, stat in zip(points, ("to_cls", "to_sep", "to_punct")):
        np.testing.assert_allclose(offsets, heads[[stat, f"moved_{stat}"]].to_numpy(), rtol=1e-6)
    out = tmp_path / "moved.svg"
    assert main(["export", str(run), "--figure", "moved", "--out", str(out)]) == 0
    assert MAGIC["svg"](out.read_bytes())
