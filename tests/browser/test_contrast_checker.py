"""The contrast checker the report test relies on (:file:`contrast.js`), on a hand-written page with known ratios."""

from __future__ import annotations

import pytest

from browsing import contrast_failures

PAGE = """<!doctype html><html><body style="background: #fff; margin: 0">
<p id="dark">#767676 on white: 4.54, passes</p>
<p id="light" style="color: #777">#777 on white: 4.48, fails</p>
<div style="background: rgba(0, 0, 0, 0.5)">
  <span id="white-on-grey" style="color: #fff">white on black at half alpha over white: 3.98, fails</span>
  <span id="black-on-grey" style="color: #000">black on the same: 5.28, passes</span>
</div>
<p id="hidden" style="display: none; color: #eee">hidden: ignored</p>
<p id="faded" style="color: rgba(0, 0, 0, 0.3)">black at 30% alpha on white: fails</p>
</body></html>"""


def wcag_ratio(fg: tuple[float, float, float], bg: tuple[float, float, float]) -> float:
    """WCAG 2.x contrast ratio, written out from the definition (relative luminance of sRGB)."""
    def lum(rgb):
        lin = [(c / 255 / 12.92) if c / 255 <= 0.04045 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in rgb]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    hi, lo = sorted((lum(fg), lum(bg)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_contrast_checker_passes_and_fails_the_right_elements(page):
    page.set_content(PAGE)
    result = contrast_failures(page)
    failed = {f["id"]: f["ratio"] for f in result["failures"]}
    assert set(failed) == {"light", "white-on-grey", "faded"}
    assert result["checked"] == 5 and result["skipped"] == []
    assert failed["light"] == pytest.approx(wcag_ratio((0x77,) * 3, (255,) * 3), abs=1e-3)
    grey = 255 * 0.5  # half-transparent black composited over the white page
    assert failed["white-on-grey"] == pytest.approx(wcag_ratio((255,) * 3, (grey,) * 3), abs=0.02)
    faded = 255 * 0.7
    assert failed["faded"] == pytest.approx(wcag_ratio((faded,) * 3, (255,) * 3), abs=0.02)
    assert wcag_ratio((0x76,) * 3, (255,) * 3) >= 4.5 > wcag_ratio((0x77,) * 3, (255,) * 3)


def test_contrast_checker_reports_text_over_images_as_skipped(page):
    page.set_content('<div style="background-image: linear-gradient(#000, #fff)"><b id="g">over a gradient</b>'
                     '</div>')
    result = contrast_failures(page)
    assert result["failures"] == [] and [s["id"] for s in result["skipped"]] == ["g"]
