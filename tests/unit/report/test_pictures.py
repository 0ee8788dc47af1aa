"""The report's PNGs (:mod:`attnclust.report.pictures`): from one draw, against matplotlib's own
``savefig(bbox_inches="tight")``, which measures the figure with a draw of its own before drawing it; and drawn in
other processes while the sections go on, against the page drawn in one process."""

import base64
import io
import multiprocessing
import re
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image

from attnclust.report import write_report
from attnclust.report.figures import (
    DPI,
    MARGIN_INCHES,
    head_heatmap_figure,
    mean_map_figure,
    medoid_figure,
    png_data_uri,
)
from attnclust.report.pictures import drawn_beside, picture

from helpers import synthetic_report_inputs


def _savefig_tight(fig) -> np.ndarray:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return np.asarray(Image.open(buf).convert("RGB")).astype(int)


def _decoded(uri: str) -> np.ndarray:
    assert uri.startswith("data:image/png;base64,")
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))).convert("RGB")).astype(int)


def _ink_box(pixels: np.ndarray) -> tuple[int, int, int, int]:
    """Rows and columns of the first and last pixel that is not the white background."""
    rows, cols = np.nonzero((pixels < 250).any(-1))
    return rows.min(), rows.max(), cols.min(), cols.max()


def _overhanging(inches: float):
    def build():
        fig = Figure(figsize=(3.0, 2.0))
        ax = fig.subplots()
        ax.plot([0, 1], [1, 0])
        fig.text(-inches / 3.0, 0.5, "overhangs the left edge", fontsize=9)  # figure fraction: 3 in wide
        return fig
    return build


_RNG = np.random.default_rng(3)
FIGURES = {
    "mean map": lambda: mean_map_figure(_RNG.random((32, 32)), 1),
    "medoid": lambda: medoid_figure(_RNG.random((50, 50)), [f"tok{i}" for i in range(50)], 40, 2),
    "heatmap": lambda: head_heatmap_figure(np.arange(6), np.arange(12), _RNG.random((6, 12)), column="accuracy",
                                           unit="", annotate=True),
    "overhang within the margin": _overhanging(MARGIN_INCHES / 2),
    "overhang past the margin": _overhanging(3 * MARGIN_INCHES),
}


def _blocks(pixels: np.ndarray, side: int = 8) -> np.ndarray:
    """Means over squares of ``side`` pixels: a picture drawn a fraction of a pixel apart gives nearly the same."""
    h, w = (pixels.shape[0] // side) * side, (pixels.shape[1] // side) * side
    return pixels[:h, :w].reshape(h // side, side, w // side, side, 3).mean((1, 3))


@pytest.mark.parametrize("name", list(FIGURES))
def test_one_draw_gives_the_tight_picture_of_savefig(name):
    seed = _RNG.bit_generator.state
    expected = _savefig_tight(FIGURES[name]())
    _RNG.bit_generator.state = seed  # the same data again
    fig = FIGURES[name]()
    draws = []
    fig.draw = lambda renderer, draw=fig.draw: draws.append(1) or draw(renderer)
    got = _decoded(png_data_uri(fig))
    assert got.shape == expected.shape
    assert np.abs(np.subtract(_ink_box(got), _ink_box(expected))).max() <= 1
    # savefig shifts the drawing by a fraction of a pixel to the box's corner; a crop a few pixels off, or a label
    # left out, moves these means by 4 or more (measured: 4.6 to 14 for a 3-pixel shift of these figures)
    assert np.abs(_blocks(got) - _blocks(expected)).mean() < 4
    if name == "overhang past the margin":  # measured larger than the one draw's canvas: savefig's own picture
        np.testing.assert_array_equal(got, expected)
        assert len(draws) == 3
    else:
        assert len(draws) == 1


def test_a_report_drawn_in_other_processes_is_the_report_drawn_here(tmp_path):
    inputs = synthetic_report_inputs()
    here = write_report(tmp_path / "here.html", inputs).read_bytes()
    keys = []
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        def start(fn, *args, key):
            keys.append(key)
            return pool.submit(fn, *args)

        beside = write_report(tmp_path / "beside.html", inputs, start=start).read_bytes()
    pictures = re.findall(rb"data:image/png;base64,[A-Za-z0-9+/=]+", here)
    assert len(keys) == len(pictures) >= 5 and len(set(keys)) == len(keys)  # every figure sent, each its own task
    assert beside == here
    assert re.search(rb"attnclust[0-9a-f]{16}picture[0-9]+end", beside) is None  # no placeholder left


class _Sent:
    """Work sent elsewhere that comes in only after ``ready`` pictures were asked for (never, with None); records
    whether it was given up."""

    def __init__(self, fn, args, asked: list, ready: int | None):
        self.fn, self.args, self.asked, self.ready, self.cancelled = fn, args, asked, ready, False

    def done(self) -> bool:
        self.asked.append(1)
        return self.ready is not None and len(self.asked) > self.ready

    def cancel(self) -> None:
        self.cancelled = True

    def result(self):
        assert not self.cancelled, "waited for a picture that was given up"
        return self.fn(*self.args)


@pytest.mark.parametrize("ready", [None, 0, 6])
def test_pictures_not_in_when_the_page_is_filled_are_drawn_here_from_the_last(tmp_path, ready):
    """None: nothing comes in, every picture is drawn here (each given up where it was sent); 0: everything is in,
    nothing is drawn here; 6: the first few come in while the last ones are drawn here. The page is the same."""
    inputs = synthetic_report_inputs()
    here = write_report(tmp_path / "here.html", inputs).read_bytes()
    sent, asked = [], []

    def start(fn, *args, key):
        sent.append(_Sent(fn, args, asked, ready))
        return sent[-1]

    assert write_report(tmp_path / "beside.html", inputs, start=start, draw_here=True).read_bytes() == here
    given_up = [s.cancelled for s in sent]
    assert len(sent) >= 5
    if ready is None:
        assert all(given_up)
    elif ready == 0:
        assert not any(given_up)
    else:  # given up: a run at the end, after the ones that came in
        assert 0 < sum(given_up) < len(sent) and given_up == sorted(given_up) and not given_up[0]
    # not drawn here: each waited for in turn (nothing given up)
    sent.clear()
    asked.clear()
    assert write_report(tmp_path / "waited.html", inputs, start=start).read_bytes() == here
    assert sent and not any(s.cancelled for s in sent)


def test_outside_drawn_beside_and_with_no_start_figures_are_drawn_here():
    sent = []
    with drawn_beside(None) as pictures:
        assert pictures is None
        uri = png_data_uri(FIGURES["mean map"]())
    assert _decoded(uri).shape[0] > 100
    with drawn_beside(lambda *a, key: sent.append(key)) as pictures:
        placeholder = png_data_uri(FIGURES["mean map"]())
    assert len(sent) == 1 and len(pictures) == 1 and placeholder.startswith("data:image/png;base64,")
    assert _decoded(png_data_uri(FIGURES["mean map"]())).shape == _decoded(uri).shape  # the block has ended


_MADE: list[int] = []


def _counted_mean_map(seed: int, cluster: int):
    _MADE.append(1)
    return mean_map_figure(np.random.default_rng(seed).random((32, 32)), cluster)


def test_a_picture_beside_is_made_where_it_is_drawn_and_equals_the_one_made_here():
    """``picture`` sends what makes the figure, not the figure: this process does not make it; the worker's task,
    run from its pickled bytes, gives the PNG that making and drawing it here gives."""
    sent = []
    _MADE.clear()
    with drawn_beside(lambda fn, *args, key: sent.append((fn, args))):
        placeholder = picture(_counted_mean_map, 7, cluster=2)
    assert placeholder.startswith("data:image/png;base64,") and len(sent) == 1 and not _MADE
    fn, args = sent[0]
    here = png_data_uri(mean_map_figure(np.random.default_rng(7).random((32, 32)), 2))
    assert fn(*args) == here == picture(_counted_mean_map, 7, cluster=2)  # the last: outside the block, drawn here
    assert len(_MADE) == 2
    assert picture(_counted_mean_map, 8, cluster=2) != here


def test_a_function_defined_here_is_sent_by_value_to_a_process_that_cannot_import_it():
    """A section's figure function defined in a notebook or inside a function (no module a worker could import it
    from) is made and drawn in another process all the same: the same PNG as here."""
    def local_mean_map(seed: int):
        return mean_map_figure(np.random.default_rng(seed).random((32, 32)), 3)

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        with drawn_beside(lambda fn, *args, key: pool.submit(fn, *args)) as pictures:
            page = f"<img src='{picture(local_mean_map, 11)}'>"
        filled = pictures.fill(page)
    assert filled == f"<img src='{png_data_uri(local_mean_map(11))}'>"
