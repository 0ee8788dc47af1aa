"""Inline notebook views (attnclust/report/views.py) on a small planted run: self-contained HTML, ids that do not
clash, the embedded map equal to the store's, the report's grid and head panel, errors naming the range, figures."""

from __future__ import annotations

import base64
import json
import re
import zlib

import numpy as np
import pytest
from matplotlib.figure import Figure

import attnclust
from attnclust.report.views import GridView, HeadView, MapView, scoped_css
from attnclust.store import quantize_uint8

PLANTED = {(0, 0): "previous", (0, 1): "cls", (1, 0): "self", (1, 1): "next"}
"""The roles write_planted_store plants in a 2 x 2 store (attrs["planted_heads"])."""


@pytest.fixture(scope="module")
def out(small_planted_run):
    return attnclust.open_output(small_planted_run("inline_views"))


def root_id(html: str) -> str:
    return re.match(r'\s*<div class="attnclust-view" id="([^"]+)"', html).group(1)


def page_data(html: str) -> dict:
    """The JSON the view's script reads."""
    root = root_id(html)
    found = re.findall(rf'<script type="application/json" id="{root}-attnclust-data">(.*?)</script>', html, re.DOTALL)
    assert len(found) == 1
    return json.loads(found[0])


def unpack(b64: str, shape) -> np.ndarray:
    return np.frombuffer(zlib.decompress(base64.b64decode(b64)), dtype=np.uint8).reshape(shape)


def store_map(out, f: int, layer: int, head: int) -> np.ndarray:
    n = int(out.attention.seq_len[f])
    return out.attention.isel(feature=f, layer=layer, head=head, query=slice(0, n), key=slice(0, n)).values


def all_views(out) -> list:
    return [out.grid_view(), out.head_view(1, 0), out.map_view(2, 0, 0)]


def test_views_are_self_contained_html(out):
    for view in all_views(out):
        html = view._repr_html_()
        assert html.lstrip().startswith('<div class="attnclust-view"') and html.rstrip().endswith("</div>")
        assert not re.search(r"""\b(src|href|action)\s*=\s*["']?\s*(https?:)?//""", html, re.IGNORECASE), type(view)
        assert "http://" not in html and "https://" not in html
        assert not re.search(r"<(link|iframe|img|object|embed)\b", html, re.IGNORECASE)
        css = re.search(r"<style>(.*?)</style>", html, re.DOTALL).group(1)
        assert "@import" not in css and "url(" not in css
        # its scripts: its JSON data and the report's script, inline, bound to this view's root
        scripts = re.findall(r"<script\b[^>]*>", html)
        root = root_id(html)
        assert scripts == [f'<script type="application/json" id="{root}-attnclust-data">', "<script>"]
        assert '<script>(function (ATTNCLUST_VIEW) {\n/* attnclust report' in html
        assert f'}}("{root}"));</script>' in html


def test_ids_are_unique_across_views_and_each_drawing_gets_fresh_ones(out):
    view = out.map_view(2, 0, 0)
    htmls = [*(v._repr_html_() for v in all_views(out)), view._repr_html_(), view._repr_html_()]
    roots = [root_id(h) for h in htmls]
    assert len(set(roots)) == len(roots)  # the same view drawn twice gets two roots
    page = "\n".join(htmls)
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids)), [i for i in ids if ids.count(i) > 1][:5]
    for html, root in zip(htmls, roots):
        # every id inside a view, and every reference to one, starts with the view's root id
        inside = re.findall(r'\bid="([^"]+)"', html)
        assert inside and all(i == root or i.startswith(f"{root}-") for i in inside), inside[:5]
        refs = re.findall(r'\b(?:for|aria-labelledby|aria-controls)="([^"]+)"', html)
        assert all(r in inside for r in refs), refs
        # every style rule is scoped to this root: nothing styles the notebook around it
        css = re.search(r"<style>(.*?)</style>", html, re.DOTALL).group(1)
        selectors = [s.strip() for rule in re.findall(r"([^{}]+)\{", css) for s in rule.split(",")]
        assert selectors and all(s == f"#{root}" or s.startswith(f"#{root} ") for s in selectors), selectors[:5]


@pytest.mark.parametrize("f,layer,head", [(2, 0, 0), (2, 1, 1), (5, 0, 1), (0, 1, 0)])
def test_map_view_data_is_the_stores_map(out, f, layer, head):
    view = out.map_view(f, layer, head)
    expected = store_map(out, f, layer, head)
    n = int(out.features.set_index("feature_id").at[f, "seq_len"])
    assert view.weights.shape == expected.shape == (n, n)
    np.testing.assert_array_equal(view.weights, expected.astype(np.float32))
    assert list(view.tokens) == [str(t) for t in out.features.set_index("feature_id").at[f, "tokens"]]
    # the page embeds exactly round(255 * weight) of that map, for that (layer, head), with those tokens
    data = page_data(view._repr_html_())
    (q,) = data["explorer"]["questions"]
    assert q["pairs"] == [[layer, head]] and q["n"] == n and q["tokens"] == list(view.tokens)
    assert data["show"]["map"] == {"question": 0, "layer": layer, "head": head, "caption": view.caption}
    np.testing.assert_array_equal(unpack(q["maps"], (n, n)), quantize_uint8(expected))
    maps = out.maps.set_index(["feature_id", "layer", "head"])
    assert view.cluster == int(maps.at[(f, layer, head), "cluster"])


def small_first_key(n: int) -> np.ndarray:
    """Planted value norms: the first key (a [CLS] / first-token sink) moves a tenth of what the others move."""
    return np.r_[0.1, np.ones(n - 1)]


@pytest.fixture(scope="module")
def normed(small_planted_run):
    """A planted run whose store holds value norms (planted as another tool would write them), and those norms."""
    from helpers import plant_value_norms

    root = small_planted_run("inline_views_norms")
    norms = plant_value_norms(root, small_first_key)
    return attnclust.open_output(root), norms


@pytest.mark.parametrize("f,layer,head", [(5, 0, 1), (2, 1, 0)])
def test_a_map_view_with_value_norms_carries_the_norm_weighted_map_and_shows_what_it_is_asked(normed, f, layer, head):
    """Beside the weights, each row's shares of the norm it moves (a loop over the cells from the planted norms);
    the page embeds both for its toggle and starts on the asked weighting; ``figure()`` draws that one."""
    out, norms = normed
    view = out.map_view(f, layer, head)
    n = len(view.tokens)
    weights = store_map(out, f, layer, head).astype(np.float64)
    want = np.zeros((n, n))
    for i in range(n):
        total = sum(weights[i, j] * norms[f, j] for j in range(n))
        for j in range(n):
            want[i, j] = weights[i, j] * norms[f, j] / total
    np.testing.assert_array_equal(view.weights, weights.astype(np.float32))
    np.testing.assert_allclose(view.moved, want, atol=1e-6)
    if head == 1 and layer == 0:  # the planted [CLS] head: most of its weight, a tenth as much of its moved norm
        assert weights[:, 0].mean() > 0.5 and want[:, 0].mean() < 0.5 * weights[:, 0].mean()
    (q,) = page_data(view._repr_html_())["explorer"]["questions"]
    assert q["weighting"] == "weights"
    np.testing.assert_array_equal(unpack(q["moved"], (n, n)), quantize_uint8(view.moved))
    shown = out.map_view(f, layer, head, weighting="norm")
    assert page_data(shown._repr_html_())["explorer"]["questions"][0]["weighting"] == "norm"
    assert "norm-weighted" in shown.caption and "norm-weighted" not in view.caption
    image = shown.figure().axes[0].images[0].get_array()
    np.testing.assert_allclose(np.asarray(image), view.moved[:image.shape[0], :image.shape[1]], atol=1e-6)


def test_without_value_norms_a_map_view_has_no_toggle_and_norm_is_refused_in_one_line(out):
    view = out.map_view(2, 0, 0)
    assert view.moved is None and "moved" not in page_data(view._repr_html_())["explorer"]["questions"][0]
    with pytest.raises(attnclust.AttnclustError, match="holds no value norms") as info:
        out.map_view(2, 0, 0, weighting="norm")
    assert "\n" not in str(info.value)
    with pytest.raises(attnclust.AttnclustError, match="^weighting 'value': expected one of 'weights', 'norm'$"):
        out.map_view(2, 0, 0, weighting="value")


def test_map_view_shows_the_planted_pattern_the_right_way_round(out):
    """Rows are queries and columns keys: a planted previous-token head puts its mass just below the diagonal."""
    f = int(out.features.loc[out.features["seq_len"].idxmax(), "feature_id"])
    prev = out.map_view(f, 0, 0).weights
    nxt = out.map_view(f, 1, 1).weights
    assert PLANTED[(0, 0)] == "previous" and PLANTED[(1, 1)] == "next"
    rows = np.arange(2, len(prev) - 2)
    assert np.mean(prev[rows, rows - 1]) > 0.5 > np.mean(prev[rows, rows + 1])
    assert np.mean(nxt[rows, rows + 1]) > 0.5 > np.mean(nxt[rows, rows - 1])


def test_head_view_is_the_reports_panel_with_the_heads_map_nearest_its_cluster_centre(out):
    view = out.head_view(1, 0, examples=2)
    row = out.heads.set_index(["layer", "head"]).loc[(1, 0)]
    assert view.panel["dominant"] == int(row["dominant_cluster"])
    assert view.panel["purity"] == pytest.approx(float(row["purity"]))
    assert view.panel["roles"] == [r for r in str(row["roles"]).split(",") if r]
    shares = {c: s for c, s in view.panel["shares"]}
    assert shares == {c: pytest.approx(float(row[f"share_{c}"])) for c in shares}
    maps = out.maps
    maps = maps[(maps["layer"] == 1) & (maps["head"] == 0) & (maps["cluster"] == row["dominant_cluster"])]
    nearest = maps.sort_values(["centroid_dist", "feature_id"])["feature_id"].head(2).tolist()
    assert [m.feature_id for m in view.examples] == nearest
    data = page_data(view._repr_html_())
    assert data["show"] == {"head": [1, 0]} and data["heads"] == [view.panel]
    assert data["explorer"]["head_examples"] == [0, 1]
    for m, q in zip(view.examples, data["explorer"]["questions"]):
        assert q["pairs"] == [[1, 0]] and q["feature"] == m.feature_id
        np.testing.assert_array_equal(unpack(q["maps"], (q["n"], q["n"])),
                                      quantize_uint8(store_map(out, m.feature_id, 1, 0)))
    assert out.head_view(1, 0, examples=0).examples == ()


def test_grid_view_draws_the_reports_grid_cells(out):
    """Every head's cell, with the same colours, title and data as the report's grid (the same section code)."""
    html = out.grid_view()._repr_html_()
    root = root_id(html)
    cell = re.compile(r'<td class="gcell"[^>]*data-layer="(\d+)" data-head="(\d+)"[^>]*style="([^"]+)" title="([^"]+)"')
    cells = {(int(m[0]), int(m[1])): m[2:] for m in cell.findall(html)}
    report = (out.path / "report.html").read_text()
    assert cells == {(int(m[0]), int(m[1])): m[2:] for m in cell.findall(report)}
    assert set(cells) == set(zip(out.heads["layer"], out.heads["head"]))
    assert f'id="{root}-grid-color"' in html and f'id="{root}-head-panel"' in html
    data = page_data(html)
    report_data = json.loads(re.search(r'id="attnclust-data">(.*?)</script>', report, re.DOTALL).group(1))
    assert data["heads"] == report_data["heads"] and data["descr"] == report_data["descr"]
    (q,) = data["explorer"]["questions"]  # one sampled question with every head's map, as the report embeds them
    n_maps = out.attention.sizes["layer"] * out.attention.sizes["head"]
    blocks = unpack(q["maps"], (n_maps, q["n"], q["n"]))
    for i, (layer, head) in enumerate(np.ndindex(2, 2)):
        np.testing.assert_array_equal(blocks[i], quantize_uint8(store_map(out, q["feature"], layer, head)))
    assert page_data(out.grid_view(examples=0)._repr_html_())["explorer"] is None


@pytest.mark.parametrize("call,match", [
    (lambda o: o.map_view(6, 0, 0), r"^feature_id 6: expected an integer in 0\.\.5 \(the run's 6 features"),
    (lambda o: o.map_view(-1, 0, 0), r"^feature_id -1: expected an integer in 0\.\.5"),
    (lambda o: o.map_view(0, 2, 0), r"^layer 2: expected an integer in 0\.\.1 \(this run has 2 layers x 2 heads"),
    (lambda o: o.map_view(0, 0, 2.0), r"^head 2\.0: expected an integer in 0\.\.1"),
    (lambda o: o.head_view(0, -1), r"^head -1: expected an integer in 0\.\.1 \(this run has 2 layers x 2 heads"),
    (lambda o: o.head_view(True, 0), r"^layer True: expected an integer in 0\.\.1"),
    (lambda o: o.head_view(0, 0, examples=-1), r"^examples -1: expected an integer in 0\.\.999"),
    (lambda o: o.grid_view(examples="2"), r"^examples '2': expected an integer in 0\.\.999"),
])
def test_a_bad_index_is_one_line_naming_the_allowed_range(out, call, match):
    with pytest.raises(attnclust.AttnclustError, match=match) as info:
        call(out)
    assert isinstance(info.value, ValueError) and "\n" not in str(info.value)


def test_figures_draw_the_same_picture(out):
    view = out.map_view(5, 0, 0)
    fig = view.figure(max_tokens=20)
    assert isinstance(fig, Figure)
    np.testing.assert_array_equal(fig.axes[0].images[0].get_array(), view.weights[:20, :20])
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == list(view.tokens[:20])
    assert view.figure(max_tokens=None).axes[0].images[0].get_array().shape == view.weights.shape

    head = out.head_view(0, 1)
    fig = head.figure()
    assert isinstance(fig, Figure)
    bars = fig.axes[0].patches
    assert [round(b.get_width(), 6) for b in bars] == [round(100 * s, 6) for _, s in head.panel["shares"]]
    np.testing.assert_array_equal(fig.axes[1].images[0].get_array(), head.examples[0].weights)

    grid = out.grid_view(examples=0)
    fig = grid.figure()
    assert isinstance(fig, Figure)
    image = fig.axes[0].images[0].get_array()
    html = grid._repr_html_()
    for layer, head_, bg in re.findall(r'data-layer="(\d+)" data-head="(\d+)"[^>]*data-cluster-bg="(#[0-9a-f]{6})"',
                                       html):
        rgb = np.round(np.asarray(image[int(layer), int(head_)]) * 255).astype(int)
        assert "#" + "".join(f"{v:02x}" for v in rgb) == bg


def test_repr_names_what_is_shown(out):
    assert repr(out.map_view(2, 0, 1)) == "<MapView feature 2, L0H1: 24 tokens>"
    assert repr(out.grid_view(examples=0)) == "<GridView 2 layers x 2 heads, 2 clusters>"
    assert repr(out.head_view(1, 1, examples=0)).startswith("<HeadView L1H1: cluster ")
    assert isinstance(out.grid_view(examples=0), GridView) and isinstance(out.head_view(0, 0), HeadView)
    assert isinstance(out.map_view(0, 0, 0), MapView)


def test_scoped_css_scopes_every_selector_and_refuses_at_rules():
    css = "body{margin:0}\n/* a comment */ h1, .a b:hover{color:red}\ntable.grid td{x:1}"
    assert scoped_css(css, "#v").splitlines() == ["#v{margin:0}", "#v h1,#v .a b:hover{color:red}",
                                                  "#v table.grid td{x:1}"]
    with pytest.raises(ValueError, match="cannot be scoped"):
        scoped_css("@media print{a{color:red}}", "#v")


def test_the_report_page_keeps_its_own_ids(out):
    """The report's grid renders its ids without a prefix, and its script finds them (no ATTNCLUST_VIEW)."""
    report = (out.path / "report.html").read_text()
    for name in ("grid-color", "head-panel", "head-panel-title", "head-panel-close", "head-panel-body",
                 "attnclust-data"):
        assert f'id="{name}"' in report, name
    assert "(function (ATTNCLUST_VIEW)" not in report


def test_a_grid_view_embeds_only_features_whose_maps_fit_its_budget(out, monkeypatch):
    from attnclust.report import views

    heads = out.attention.sizes["layer"] * out.attention.sizes["head"]
    monkeypatch.setattr(views, "VIEW_MAP_BYTES", heads * 20 ** 2)
    (q,) = page_data(out.grid_view()._repr_html_())["explorer"]["questions"]
    assert q["n"] <= 20 and q["n"] == int(out.attention.seq_len[q["feature"]])
    monkeypatch.setattr(views, "VIEW_MAP_BYTES", heads * 7 ** 2)  # shorter than every feature (8..40 tokens)
    assert page_data(out.grid_view()._repr_html_())["explorer"] is None


def test_a_damaged_maps_table_is_one_line(small_planted_run):
    run = small_planted_run("inline_views_damaged")
    (run / "maps.parquet").write_bytes(b"not parquet")
    with pytest.raises(attnclust.StoreError, match=r"maps\.parquet: does not open as a parquet table .*re-run"):
        attnclust.open_output(run).map_view(0, 0, 0)
