"""Inline notebook views (attnclust/report/views.py) in Chromium, from file://: several on one page as a notebook
shows them (a small planted run), and the tutorial notebook executed (slow): each view draws, the page makes no
request beyond file:// and logs no error, a map cell's hover reads out its tokens and weight, and a view's
controls act on that view only."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import attnclust

from browsing import LOCAL_SCHEMES

pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the test extra)")
from playwright.sync_api import expect

READOUT = re.compile(r"^query (\d+) “(.*)” → key (\d+) “(.*)”: (\d\.\d{3})$")


def notebook_page(path: Path, outputs: list[str]) -> Path:
    """A page laid out as a notebook shows outputs: each HTML output in its own cell, after a table and a heading
    of the page's own, styled by the page."""
    cells = "\n".join(f'<div class="cell"><div class="output">{o}</div></div>' for o in outputs)
    path.write_text('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>notebook</title>'
                    '<link rel="icon" href="data:,">'  # no favicon request
                    "<style>body{font-family:serif;margin:2em}td{padding:9px}h3{color:rgb(200, 0, 0)}</style></head>"
                    '<body><h3 id="page-h3">notebook</h3><table><tr><td id="page-td">page</td></tr></table>'
                    f"{cells}</body></html>", encoding="utf-8")
    return path


def no_requests_or_errors(page) -> None:
    page.wait_for_load_state("networkidle")
    outside = [url for url in page.watch.requests if not url.startswith(LOCAL_SCHEMES)]
    assert outside == [], f"requests leaving file://: {outside[:5]}"
    assert page.watch.errors == []


def hover_cell(view, row: int, col: int) -> str:
    """Hover the centre of map cell (row, col) of a map view; the readout's text once it names that cell."""
    canvas = view.locator("canvas.mv-canvas")
    n = int(canvas.get_attribute("width"))
    box = canvas.bounding_box()
    canvas.hover(position={"x": (col + 0.5) * box["width"] / n, "y": (row + 0.5) * box["height"] / n})
    readout = view.locator(".mv-readout")
    expect(readout).to_have_text(re.compile(rf"^query {row} .* key {col} "))
    return readout.inner_text()


def expected_readout(weights: np.ndarray, tokens, row: int, col: int) -> str:
    """What the report's map view writes: the embedded weight is round(255 * w), shown to 3 decimals."""
    weight = round(255 * float(weights[row, col])) / 255
    return f"query {row} “{tokens[row]}” → key {col} “{tokens[col]}”: {weight:.3f}"


@pytest.fixture(scope="module")
def planted(small_planted_run):
    return attnclust.open_output(small_planted_run("browser_views"))


def test_views_on_one_page_draw_without_requests_or_errors(page, planted, tmp_path):
    views = [planted.grid_view(), planted.head_view(1, 0), planted.map_view(5, 0, 0), planted.map_view(5, 0, 0),
             planted.map_view(2, 1, 1)]
    page.goto(notebook_page(tmp_path / "nb.html", [v._repr_html_() for v in views]).as_uri(), wait_until="load")
    maps = page.locator('.attnclust-view[data-view="map"]')
    expect(maps).to_have_count(3)
    for i, view in enumerate(views[2:]):
        expect(maps.nth(i).locator("canvas.mv-canvas")).to_have_attribute("width", str(len(view.tokens)))
        expect(maps.nth(i).locator("figcaption")).to_contain_text(view.caption)
        expect(maps.nth(i).locator(".mv-keys .tok")).to_have_count(len(view.tokens))
    head = page.locator('.attnclust-view[data-view="head"]')
    expect(head.locator("h3")).to_have_text(re.compile(r"^L1H0 · cluster \d+ \(100% of its maps\)$"))
    expect(head.locator("canvas.mv-canvas")).to_have_count(1)
    expect(head.locator(".hp-roles")).to_have_text("Roles: self")
    grid = page.locator('.attnclust-view[data-view="grid"]')
    expect(grid.locator("td.gcell[data-layer][data-head]")).to_have_count(len(planted.heads))
    expect(grid.locator(".head-panel")).to_be_hidden()
    # the views' style sheets style the views only: the page's own table and heading keep the page's style
    expect(page.locator("#page-td")).to_have_css("padding", "9px")
    expect(page.locator("#page-h3")).to_have_css("color", "rgb(200, 0, 0)")
    expect(page.locator("body")).to_have_css("margin", "32px")
    expect(grid.locator("td.gcell").first).to_have_css("padding", "1px")  # report.css's grid cell, in the view
    no_requests_or_errors(page)


def test_hovering_a_map_cell_reads_out_its_tokens_and_weight(page, planted, tmp_path):
    same = planted.map_view(5, 0, 0)  # a previous-token head: query i puts most weight on key i - 1
    other = planted.map_view(5, 1, 1)
    page.goto(notebook_page(tmp_path / "nb.html", [same._repr_html_(), same._repr_html_(), other._repr_html_()])
              .as_uri(), wait_until="load")
    views = page.locator('.attnclust-view[data-view="map"]')
    first, second, third = views.nth(0), views.nth(1), views.nth(2)
    for row, col in ((10, 9), (10, 11), (0, 0), (len(same.tokens) - 1, 3)):
        text = hover_cell(second, row, col)
        assert text == expected_readout(same.weights, same.tokens, row, col)
    assert float(READOUT.match(hover_cell(second, 10, 9)).group(5)) > 0.5
    # the other drawing of the same map did not move: each view's script reads its own canvas
    expect(first.locator(".mv-readout")).to_have_text(f"{len(same.tokens)} tokens; hover the map for a weight.")
    assert hover_cell(third, 10, 11) == expected_readout(other.weights, other.tokens, 10, 11)
    # zoom acts on its own view
    before = second.locator("canvas.mv-canvas").bounding_box()["width"]
    second.get_by_role("button", name="Zoom in").click()
    assert second.locator("canvas.mv-canvas").bounding_box()["width"] > before
    assert first.locator("canvas.mv-canvas").bounding_box()["width"] == before
    no_requests_or_errors(page)


def test_a_grid_cell_opens_its_own_views_panel(page, planted, tmp_path):
    grids = [planted.grid_view(), planted.grid_view()]
    page.goto(notebook_page(tmp_path / "nb.html", [g._repr_html_() for g in grids]).as_uri(), wait_until="load")
    first, second = (page.locator('.attnclust-view[data-view="grid"]').nth(i) for i in (0, 1))
    second.locator('td.gcell[data-layer="0"][data-head="1"]').click()
    expect(second.locator(".head-panel")).to_be_visible()
    expect(second.locator(".head-panel h3")).to_have_text(re.compile(r"^L0H1 · cluster "))
    expect(second.locator(".head-panel canvas.mv-canvas")).to_have_count(1)  # the embedded question's map
    expect(first.locator(".head-panel")).to_be_hidden()
    # the colour switch recolours its own grid only
    cell = '[data-layer="1"][data-head="1"]'
    before = first.locator(cell).evaluate("e => e.style.background")
    second.locator("select").select_option("role")
    role_bg = second.locator(cell).get_attribute("data-role-bg")
    expect(second.locator(cell)).to_have_css("background-color", rgb(role_bg))
    assert first.locator(cell).evaluate("e => e.style.background") == before
    # Escape closes a panel only from inside its view (Jupyter uses Escape for itself)
    page.locator("body").click(position={"x": 2, "y": 2})
    page.keyboard.press("Escape")
    expect(second.locator(".head-panel")).to_be_visible()
    second.get_by_role("button", name="Close the head panel").focus()
    page.keyboard.press("Escape")
    expect(second.locator(".head-panel")).to_be_hidden()
    no_requests_or_errors(page)


def test_served_over_http_a_view_asks_nothing_of_the_server(page, planted, tmp_path):
    """Jupyter serves its pages over http: a view still requests nothing (the report, served by `attnclust
    explore`, asks the server for any map; a view never does)."""
    import functools
    import http.server
    import threading

    path = notebook_page(tmp_path / "nb.html", [planted.grid_view()._repr_html_(), planted.head_view(0, 1)
                                                ._repr_html_(), planted.map_view(1, 0, 0)._repr_html_()])
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/{path.name}"
        page.goto(url, wait_until="load")
        views = page.locator(".attnclust-view")
        expect(views.nth(1).locator("canvas.mv-canvas")).to_have_count(1)
        expect(views.nth(2).locator("canvas.mv-canvas")).to_have_count(1)
        views.nth(0).locator('td.gcell[data-layer="1"][data-head="1"]').click()
        expect(views.nth(0).locator(".head-panel .hp-any")).to_contain_text("out.map_view(feature_id, layer, head)")
        page.wait_for_load_state("networkidle")
        assert [u for u in page.watch.requests if not u.startswith(("data:", "blob:"))] == [url]
        assert page.watch.errors == []
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def rgb(hex_colour: str) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


# -- the tutorial notebook, executed --------------------------------------------------------------------------

def outputs_html(nb: dict) -> list[str]:
    """Each output of an executed notebook as a notebook front end shows it: HTML as it is, images inline, text
    escaped (what nbconvert's HTML export does, without its page template and its CDN scripts)."""
    out = []
    for cell in nb["cells"]:
        for o in cell.get("outputs", []):
            data = o.get("data", {})
            if "text/html" in data:
                out.append("".join(data["text/html"]))
            elif "image/png" in data:
                out.append(f'<img alt="figure" src="data:image/png;base64,{"".join(data["image/png"]).strip()}">')
            elif "text/plain" in data or "text" in o:
                out.append(f"<pre>{html.escape(''.join(data.get('text/plain', o.get('text', ''))))}</pre>")
    return out


@pytest.fixture(scope="module")
def tutorial(executed_tutorial):
    """The tutorial notebook as executed once per session (``executed_tutorial``, tests/conftest.py): (the
    notebook page of its outputs, the folder its runs landed in)."""
    executed, work = executed_tutorial
    return notebook_page(work / "atlas.html", outputs_html(json.loads(executed.read_text()))), work


@pytest.mark.slow
def test_the_tutorials_views_draw_and_respond(tutorial, page):
    path, work = tutorial
    page.goto(path.as_uri(), wait_until="load")
    views = page.locator(".attnclust-view")
    assert views.evaluate_all("els => els.map(e => e.dataset.view)") == ["grid", "head", "map"]
    grid, head, map_ = views.nth(0), views.nth(1), views.nth(2)
    heads = pd.read_parquet(work / "runs" / "minilm" / "heads.parquet")
    expect(grid.locator("td.gcell[data-layer][data-head]")).to_have_count(len(heads))
    expect(head.locator("h3")).to_have_text(re.compile(r"^L\d+H\d+ · cluster \d+"))
    expect(head.locator("canvas.mv-canvas")).to_have_count(1)
    expect(map_.locator("canvas.mv-canvas")).to_have_count(1)

    atlas = attnclust.open_output(work / "runs" / "minilm")
    caption = map_.locator("figcaption").inner_text()
    f, layer, head_ = (int(v) for v in re.search(r"^L(\d+)H(\d+) .*\(feature (\d+),", caption).group(3, 1, 2))
    view = atlas.map_view(f, layer, head_)
    for row, col in ((5, 4), (12, 0), (len(view.tokens) - 1, len(view.tokens) - 2)):
        assert hover_cell(map_, row, col) == expected_readout(view.weights, view.tokens, row, col)

    grid.locator("td.gcell[data-layer='2'][data-head='3']").click()
    expect(grid.locator(".head-panel h3")).to_have_text(re.compile(r"^L2H3 · cluster "))
    expect(grid.locator(".head-panel canvas.mv-canvas")).to_have_count(1)
    no_requests_or_errors(page)


def test_a_map_view_with_value_norms_toggles_between_weights_and_norm_shares(page, small_planted_run, tmp_path):
    """A store with value norms (planted: the first key moves a tenth of the others): the view's toggle repaints its
    own map with the rows' shares of the moved norm, from file:// with no request, and the hover reads them out."""
    from helpers import plant_value_norms

    root = small_planted_run("browser_views_norms")
    plant_value_norms(root, lambda n: np.r_[0.1, np.ones(n - 1)])
    out = attnclust.open_output(root)
    view = out.map_view(5, 0, 1)  # the planted [CLS] head
    page.goto(notebook_page(tmp_path / "nb.html", [view._repr_html_(), view._repr_html_()]).as_uri(),
              wait_until="load")
    views = page.locator('.attnclust-view[data-view="map"]')
    first, second = views.nth(0), views.nth(1)
    assert hover_cell(second, 6, 0) == expected_readout(view.weights, view.tokens, 6, 0)
    second.get_by_role("button", name="Norm-weighted").click()
    expect(second.locator("figure.map-view")).to_have_attribute("data-weighting", "norm")
    share = round(255 * float(view.moved[6, 0])) / 255
    assert share < round(255 * float(view.weights[6, 0])) / 255  # the sink moves less than it weighs
    assert hover_cell(second, 6, 0).endswith(f": {share:.3f} of the row's moved norm")
    expect(first.locator("figure.map-view")).to_have_attribute("data-weighting", "weights")  # its own view only
    second.get_by_role("button", name="Weights").click()
    assert hover_cell(second, 6, 0) == expected_readout(view.weights, view.tokens, 6, 0)
    no_requests_or_errors(page)
