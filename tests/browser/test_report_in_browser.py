"""report.html of a real demo run, opened from file:// in Chromium: the interactive report's DOM contract
(grid, head panel, per-question view, colour switch), offline loading, overflow and text contrast."""

from __future__ import annotations

import re

import pytest

from browsing import LOCAL_SCHEMES, contrast_failures, normalise, open_report, read_table, wordpiece_text

pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the test extra)")
from playwright.sync_api import expect

CELL = '#grid [data-layer="{l}"][data-head="{h}"]'


def tok_texts(locator) -> list[str]:
    return [t.strip() for t in locator.locator(".tok").all_inner_texts()]


def key_label_count(texts: list[str]) -> int:
    """Key labels of one map view: its ``.tok`` labels, or half of them when the query labels repeat the keys."""
    n = len(texts)
    return n // 2 if n and n % 2 == 0 and texts[: n // 2] == texts[n // 2:] else n


def labels_match(texts: list[str], tokens: list[str]) -> bool:
    """``texts`` (key labels, possibly shortened with an ellipsis) spell ``tokens`` one for one."""
    n = key_label_count(texts)
    return n == len(tokens) and all(tok.startswith(t.rstrip("…").strip()) for t, tok in zip(texts[:n], tokens))


def test_report_loads_offline_without_errors(page, demo_run):
    open_report(page, demo_run)
    page.wait_for_load_state("networkidle")
    outside = [url for url in page.watch.requests if not url.startswith(LOCAL_SCHEMES)]
    assert outside == [], f"requests leaving file://: {outside[:5]}"
    assert page.watch.errors == []


def test_grid_cell_opens_the_head_panel_by_click_and_keyboard(page, demo_run):
    open_report(page, demo_run)
    panel = page.locator("#head-panel")
    expect(panel).to_be_hidden()
    page.locator(CELL.format(l=3, h=5)).click()
    expect(panel).to_be_visible()
    expect(page.locator("#head-panel-title")).to_have_text(re.compile(r"^\s*L3H5"))

    other = page.locator(CELL.format(l=0, h=1))
    other.focus()
    page.keyboard.press("Enter")
    expect(page.locator("#head-panel-title")).to_have_text(re.compile(r"^\s*L0H1"))
    page.keyboard.press("Escape")
    expect(panel).to_be_hidden()

    page.locator(CELL.format(l=5, h=11)).click()
    expect(page.locator("#head-panel-title")).to_have_text(re.compile(r"^\s*L5H11"))
    page.locator("#head-panel-close").click()
    expect(panel).to_be_hidden()
    assert page.watch.errors == []


def test_every_head_has_a_focusable_grid_cell(page, demo_run):
    heads = read_table(demo_run, "heads")
    open_report(page, demo_run)
    cells = page.locator("#grid [data-layer][data-head]")
    found = set(zip(map(int, cells.evaluate_all("els => els.map(e => e.dataset.layer)")),
                    map(int, cells.evaluate_all("els => els.map(e => e.dataset.head)"))))
    assert found == set(zip(heads["layer"], heads["head"]))
    focusable = cells.evaluate_all("els => els.every(e => e.tagName === 'BUTTON' || "
                                   "(e.tabIndex >= 0 && e.getAttribute('role') === 'button'))")
    assert focusable


def test_head_panel_maps_are_at_full_length_with_token_labels(page, demo_run):
    features = read_table(demo_run, "features")
    token_lists = [list(t) for t in features["tokens"]]
    longest = int(features["seq_len"].max())
    open_report(page, demo_run)
    page.locator(CELL.format(l=3, h=5)).click()
    views = page.locator("#head-panel .map-view")
    expect(views.first).to_be_visible()
    for i in range(views.count()):
        texts = tok_texts(views.nth(i))
        assert texts, f"map view {i} of L3H5 has no .tok labels"
        assert any(labels_match(texts, tokens) for tokens in token_lists), \
            f"map view {i} of L3H5: its {len(texts)} labels spell no feature's full token list (cropped?)"

    # a map of a longest feature is shown at its full length in some head's panel
    cells = page.locator("#grid [data-layer][data-head]")
    seen = []
    for i in range(cells.count()):
        cells.nth(i).click()
        counts = [key_label_count(tok_texts(v)) for v in page.locator("#head-panel .map-view").all()]
        seen.extend(counts)
        if longest in counts:
            break
    assert longest in seen, f"no head panel shows a {longest}-token map; longest shown: {max(seen, default=0)}"


def test_head_panel_never_widens_a_narrow_page(browser, demo_run):
    context = browser.new_context(viewport={"width": 420, "height": 900}, device_scale_factor=1)
    try:
        page = context.new_page()
        open_report(page, demo_run)
        page.locator(CELL.format(l=3, h=5)).click()
        expect(page.locator("#head-panel")).to_be_visible()
        assert page.evaluate("document.documentElement.scrollWidth") <= 420
    finally:
        context.close()


def test_question_view_marks_the_gold_answer_and_gives_a_consistent_verdict(page, demo_run):
    examples = read_table(demo_run, "examples").set_index("id")
    predictions = read_table(demo_run, "predictions").set_index("example_id")
    open_report(page, demo_run)
    options = page.locator("#question-select option").evaluate_all("els => els.map(e => e.value)")
    answerable = [ex for ex in options if ex in examples.index and len(examples.loc[ex, "answer_texts"])]
    assert answerable, f"none of the {len(options)} questions of #question-select has a gold answer"
    example = answerable[0]
    page.locator("#question-select").select_option(example)
    page.locator("#qv-layer").select_option("3")
    page.locator("#qv-head").select_option("5")
    view = page.locator("#question-view")
    expect(view.locator(".answer").first).to_be_visible()
    assert view.locator(".tok").count() > 0, "no .tok labels in #question-view"

    answer_tokens = [t.strip() for t in view.locator(".answer").all_inner_texts()]
    n = key_label_count(answer_tokens)  # a matrix may mark the answer on both axes
    golds = {normalise(a) for a in examples.loc[example, "answer_texts"]}
    assert wordpiece_text(answer_tokens[:n]) in golds, (answer_tokens, golds)

    row = predictions.loc[example]
    verdict = page.locator("#qv-verdict").inner_text().lower()
    assert any(word in verdict for word in ("right", "wrong", "no answer")), verdict
    if row["exact"] == 1:
        assert "right" in verdict and "wrong" not in verdict, (verdict, row["prediction"])
    elif row["f1"] == 0:
        assert "right" not in verdict, (verdict, row["prediction"], row["gold_answers"])
    if row["prediction"]:
        assert normalise(row["prediction"]) in normalise(page.locator("#qv-prediction").inner_text())
    assert page.watch.errors == []


def test_grid_colour_switch_recolours_the_cells(page, demo_run):
    heads = read_table(demo_run, "heads")
    open_report(page, demo_run)
    switch = page.locator("#grid-color")
    values = switch.locator("option").evaluate_all("els => els.map(e => e.value)")
    has_importance = "importance" in heads.columns and heads["importance"].notna().any()
    has_moved = "moved_to_cls" in heads.columns and heads["moved_to_cls"].notna().any()
    assert set(values) == {"cluster", "role"} | ({"importance"} if has_importance else set()) | \
        ({"moved"} if has_moved else set())
    cells = page.locator("#grid [data-layer][data-head]")
    colours = "els => els.map(e => getComputedStyle(e).backgroundColor)"
    switch.select_option("cluster")
    by_cluster = cells.evaluate_all(colours)
    switch.select_option("role")
    by_role = cells.evaluate_all(colours)
    assert by_role != by_cluster
    if has_moved:  # the share of the moved norm on [CLS] differs between heads: the colours do too
        switch.select_option("moved")
        by_moved = cells.evaluate_all(colours)
        assert by_moved != by_cluster and len(set(by_moved)) > 1
    switch.select_option("cluster")
    assert cells.evaluate_all(colours) == by_cluster
    assert page.watch.errors == []


@pytest.mark.parametrize("width", [420, 1440])
def test_no_horizontal_overflow(browser, demo_run, width):
    context = browser.new_context(viewport={"width": width, "height": 900}, device_scale_factor=1)
    try:
        page = context.new_page()
        open_report(page, demo_run)
        scroll = page.evaluate("document.documentElement.scrollWidth")
        wide = page.evaluate(f"""Array.from(document.body.querySelectorAll('*'))
            .filter(e => e.getBoundingClientRect().right > {width} + 0.5)
            .slice(0, 5).map(e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + '.' + e.className)""")
        assert scroll <= width, f"page is {scroll} px wide at {width} px; elements past the edge: {wide}"
    finally:
        context.close()


def test_all_visible_text_has_enough_contrast(page, demo_run):
    open_report(page, demo_run)
    result = contrast_failures(page)
    assert result["checked"] > 20
    assert result["failures"] == [], f"{len(result['failures'])} texts below 4.5:1, e.g. {result['failures'][:6]}"
    assert result["skipped"] == [], f"texts over background images cannot be checked: {result['skipped'][:6]}"
    page.locator(CELL.format(l=3, h=5)).click()
    expect(page.locator("#head-panel")).to_be_visible()
    result = contrast_failures(page)
    assert result["failures"] == [], f"head panel open: {result['failures'][:6]}"


@pytest.mark.parametrize("width", [420, 1440])
def test_the_statistics_table_breaks_no_number_or_name_inside_a_word(browser, demo_run, width):
    """Each number of the per-cluster statistics is on one line and each header breaks only after an underscore;
    the table scrolls inside its box instead (the page's text may break anywhere, tables not)."""
    context = browser.new_context(viewport={"width": width, "height": 900}, device_scale_factor=1)
    try:
        page = context.new_page()
        open_report(page, demo_run)
        broken = page.evaluate("""() => {
            const lines = (node, start, end) => {
                const r = document.createRange(); r.setStart(node, start); r.setEnd(node, end);
                return new Set(Array.from(r.getClientRects()).map(b => Math.round(b.top))).size; };
            const out = [];
            document.querySelectorAll('#stats table th, #stats table td:not(.txt)').forEach(cell => {
                cell.childNodes.forEach(n => {
                    if (n.nodeType !== 3) { return; }
                    for (const m of n.textContent.matchAll(/\\S+/g)) {   // each word of the text on one line
                        if (lines(n, m.index, m.index + m[0].length) > 1) { out.push(m[0]); }
                    }
                });
            });
            return out; }""")
        cells = page.locator("#stats table td:not(.txt)").count()
        assert cells > 50 and broken == [], f"broken inside a word at {width} px: {broken[:8]}"
        assert page.evaluate("document.documentElement.scrollWidth") <= width
    finally:
        context.close()
