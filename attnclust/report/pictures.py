"""How the report's figures become PNG data URIs: drawn here (:func:`png_data_uri`), or, while a report is written
on a cluster, beside it (:func:`drawn_beside`).

Making and drawing the figures is most of the time of writing a report's HTML (the figures' text above all: each
tick label is an object to make, lay out and draw), and it is one core's work. Within :func:`drawn_beside` each
figure is sent to the executor's workers (:meth:`attnclust.executors.DaskExecutor.start`) while the sections go
on: :func:`picture` sends the function that makes it and its arguments, so the figure is made where it is drawn;
:func:`png_data_uri` pickles a figure already made. Either returns a placeholder, and :meth:`Pictures.fill` puts
each PNG in its place once the page is rendered. The PNG is the one drawn here: a figure made or unpickled
elsewhere draws the same pixels.
"""

from __future__ import annotations

import base64
import io
import pickle
import re
import secrets
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import cloudpickle
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.transforms import Bbox
from PIL import Image  # matplotlib's own PNG writer

__all__ = ["DPI", "MARGIN_INCHES", "PAD_INCHES", "Pictures", "drawn_beside", "picture", "png_data_uri"]

DPI = 100
"""Resolution of every PNG."""
PAD_INCHES = 0.1
"""Margin around what a figure shows (matplotlib's ``savefig.pad_inches``)."""
MARGIN_INCHES = 0.5
"""How far past a figure's edges :func:`png_data_uri`'s one draw keeps what is drawn."""
MISSING_GLYPHS = r"Glyph .* missing"
"""The warning a token's character without a glyph in the font gives (the report leaves it out)."""
_PREFIX = "data:image/png;base64,"
_BESIDE: ContextVar[Pictures | None] = ContextVar("attnclust_pictures", default=None)


def png_data_uri(fig: Figure) -> str:
    """Draw ``fig`` with Agg as a PNG cropped to what it shows and return it as a ``data:image/png;base64,`` URI;
    the figure is cleared.

    The picture is that of ``fig.savefig(format="png", dpi=DPI, bbox_inches="tight")`` (the box of what the figure
    shows, padded by :data:`PAD_INCHES`), from one draw instead of two. ``savefig`` draws once without output to
    measure the box, then again to render it. Here the figure is drawn once on a canvas :data:`MARGIN_INCHES`
    larger on every side (what is drawn past the figure's edges, such as a label that overhangs, is kept), the box
    is measured after that draw and cut out of the pixels. A box larger than that canvas is drawn by ``savefig`` as
    before. The pixels can differ from ``savefig``'s by the fraction of a pixel by which ``savefig`` shifts the
    drawing to the box's corner.

    Within :func:`drawn_beside`, the figure is sent to be drawn elsewhere and a placeholder is returned
    (:meth:`Pictures.add`).

    Parameters
    ----------
    fig : matplotlib.figure.Figure

    Returns
    -------
    str
    """
    pictures = _BESIDE.get()
    if pictures is not None:
        return pictures.add(fig)
    return _draw(fig)


def picture(make: Callable[..., Figure], /, *args, **kwargs) -> str:
    """The PNG data URI of the figure ``make(*args, **kwargs)`` returns, drawn as :func:`png_data_uri` draws it.

    Within :func:`drawn_beside` the figure is made where it is drawn: ``make`` and its arguments are sent (they
    must pickle: a function, data), so this process neither makes nor pickles the figure, and a placeholder is
    returned (:meth:`Pictures.add_made`).

    Parameters
    ----------
    make
        Returns a :class:`~matplotlib.figure.Figure` (:mod:`attnclust.report.figures`).
    *args, **kwargs
        Its arguments.

    Returns
    -------
    str
    """
    pictures = _BESIDE.get()
    if pictures is not None:
        return pictures.add_made(make, args, kwargs)
    return _draw(make(*args, **kwargs))


def _draw(fig: Figure) -> str:
    FigureCanvasAgg(fig)
    width, height = fig.get_size_inches()
    canvas = Bbox.from_extents(-MARGIN_INCHES, -MARGIN_INCHES, width + MARGIN_INCHES, height + MARGIN_INCHES)
    cols, rows = int(canvas.width * DPI), int(canvas.height * DPI)
    raw = io.BytesIO()
    fig.savefig(raw, format="rgba", dpi=DPI, bbox_inches=canvas)  # one draw, no measuring
    box = fig.get_tightbbox(fig.canvas.get_renderer()).padded(PAD_INCHES)  # inches from the figure's bottom left
    buf = io.BytesIO()
    if len(raw.getvalue()) != rows * cols * 4 or not (box.x0 >= canvas.x0 and box.y0 >= canvas.y0
                                                       and box.x1 <= canvas.x1 and box.y1 <= canvas.y1):
        fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", pad_inches=PAD_INCHES,
                    metadata={"Software": None})
    else:
        pixels = np.frombuffer(raw.getvalue(), np.uint8).reshape(rows, cols, 4)  # rows from the top
        # savefig's size (the box's, truncated to whole pixels), from its bottom-left corner
        left, bottom = round((box.x0 - canvas.x0) * DPI), round((canvas.y1 - box.y0) * DPI)
        cut = pixels[bottom - int(box.height * DPI):bottom, left:left + int(box.width * DPI)]
        Image.fromarray(cut).save(buf, format="png", dpi=(DPI, DPI))
    fig.clear()
    return _PREFIX + base64.b64encode(buf.getvalue()).decode("ascii")


def _draw_pickled(blob: bytes) -> str:
    """A worker's task: the PNG data URI of a pickled figure, or of the figure a pickled ``(make, args, kwargs)``
    makes (:func:`picture`)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=MISSING_GLYPHS, category=UserWarning)
        sent = pickle.loads(blob)
        return _draw(sent if isinstance(sent, Figure) else sent[0](*sent[1], **sent[2]))


class Pictures:
    """The figures of one report sent to be drawn beside it; made by :func:`drawn_beside`.

    Parameters
    ----------
    start
        ``start(fn, *args, key=...)``: runs ``fn(*args)`` elsewhere and returns an object with ``result()`` (waits
        for it), ``done()`` and ``cancel()``, as a ``concurrent.futures.Future``
        (:meth:`attnclust.executors.DaskExecutor.start`).
    draw_here
        While :meth:`fill` waits, this process draws the pictures not yet in (where it has a core of its own).
    """

    def __init__(self, start: Callable, *, draw_here: bool = False):
        self._start, self._draw_here = start, draw_here
        self._mark = f"{_PREFIX}attnclust{secrets.token_hex(8)}picture"  # no page holds it by chance
        self._pending: list = []
        self._blobs: list[bytes] = []  # what was sent (a figure, or what makes one), with draw_here

    def add(self, fig: Figure) -> str:
        """Send ``fig`` to be drawn and clear it; returns the placeholder that :meth:`fill` replaces."""
        blob = pickle.dumps(fig)
        fig.clear()
        return self._send(blob)

    def add_made(self, make: Callable[..., Figure], args: tuple, kwargs: dict) -> str:
        """Send ``make(*args, **kwargs)`` to be made and drawn (:func:`picture`); returns the placeholder that
        :meth:`fill` replaces. Pickled by cloudpickle (Dask's): a function the workers cannot import (one defined in
        a notebook or a script) travels by value."""
        return self._send(cloudpickle.dumps((make, args, kwargs)))

    def _send(self, blob: bytes) -> str:
        i = len(self._pending)
        self._pending.append(self._start(_draw_pickled, blob, key=f"report-picture-{i:05d}"))
        self._blobs.append(blob if self._draw_here else b"")  # kept only to be drawn here
        return f"{self._mark}{i}end"

    def __len__(self) -> int:
        return len(self._pending)

    def fill(self, text: str, *, on_step: Callable[[str, int, int, str], None] | None = None) -> str:
        """``text`` with every placeholder replaced by its PNG data URI.

        The pictures come in from the first on, as they were sent (and as the workers draw them). With
        ``draw_here``, this process meanwhile draws them from the last back, each one not yet in given up where it
        was sent, until the two meet; a figure drawn here is the one drawn there, byte for byte
        (``tests/unit/report/test_pictures.py``).

        Parameters
        ----------
        text
            The page (or any text holding the placeholders).
        on_step
            Told ``on_step("pictures", done, total, "pictures")`` as they come in.
        """
        total = len(self._pending)
        uris: list[str | None] = [None] * total
        first, last = 0, total - 1
        while first <= last:
            if on_step is not None:
                on_step("pictures", total - (last - first + 1), total, "pictures")
            if not self._draw_here or self._pending[first].done():
                uris[first] = self._pending[first].result()
                first += 1
            elif self._pending[last].done():
                uris[last] = self._pending[last].result()
                last -= 1
            else:
                self._pending[last].cancel()
                uris[last] = _draw_pickled(self._blobs[last])
                last -= 1
        if on_step is not None and total:
            on_step("pictures", total, total, "pictures")
        placeholder = re.compile(re.escape(self._mark) + r"(\d+)end")
        return placeholder.sub(lambda m: uris[int(m.group(1))], text)


@contextmanager
def drawn_beside(start: Callable | None, *, draw_here: bool = False) -> Iterator[Pictures | None]:
    """Within this block :func:`png_data_uri` sends each figure to be drawn by ``start`` (see :class:`Pictures`,
    with ``draw_here``); ``None``: drawn here, as outside it (the block yields ``None``).

    Yields
    ------
    Pictures or None
        Call :meth:`Pictures.fill` on the text that holds the placeholders.
    """
    if start is None:
        yield None
        return
    pictures = Pictures(start, draw_here=draw_here)
    token = _BESIDE.set(pictures)
    try:
        yield pictures
    finally:
        _BESIDE.reset(token)
