"""``attnclust explore`` as a real process: the report in Chromium over HTTP, the map API from the page, the
loopback-only binding, and traversal attempts over raw HTTP. (Route-by-route checks of the server in-process are in
tests/unit/test_explore.py.)"""

from __future__ import annotations

import http.client
import ipaddress
import os
import re
import signal
import socket
import subprocess
import sys

import pytest

from browsing import read_table

pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the test extra)")
from playwright.sync_api import expect  # noqa: E402

SECRET = "attnclust-browser-secret-9d27e1"


@pytest.fixture(scope="module")
def secret_link(demo_run):
    """A secret file beside the run directory and a link inside the run pointing at it (removed afterwards)."""
    secret = demo_run.parent / "secret.txt"
    with open(secret, "x") as fh:  # never overwrites a file of the same name
        fh.write(SECRET)
    link = demo_run / "leak.txt"
    link.symlink_to(secret)
    try:
        yield link
    finally:
        link.unlink()
        secret.unlink()


@pytest.fixture(scope="module")
def server(demo_run, secret_link):
    """``attnclust explore RUN --port 0`` in its own process group: ``(host, port)`` read from its first line."""
    proc = subprocess.Popen([sys.executable, "-m", "attnclust.cli", "explore", str(demo_run), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        line = proc.stdout.readline()  # printed once the socket listens; EOF if the process died
        found = re.search(r"at http://([\d.]+):(\d+)/", line)
        if not found:
            proc.kill()
            pytest.fail(f"explore did not start: {line!r} {proc.stderr.read()[-2000:]}")
        yield found.group(1), int(found.group(2))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()


def raw_get(host: str, port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request("GET", path)  # the path goes out as written: no normalisation of ".." as browsers do
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_report_loads_over_http_without_errors(page, server):
    host, port = server
    origin = f"http://{host}:{port}"
    page.goto(origin + "/", wait_until="load")
    page.wait_for_load_state("networkidle")
    assert page.title()
    elsewhere = [u for u in page.watch.requests if not u.startswith((origin + "/", "data:", "blob:"))]
    assert elsewhere == []
    assert page.watch.errors == []


def test_map_api_from_the_page_returns_the_longest_feature_whole(page, server, demo_run):
    features = read_table(demo_run, "features")
    f = int(features["seq_len"].idxmax())
    row = features.loc[f]
    host, port = server
    page.goto(f"http://{host}:{port}/", wait_until="load")
    data = page.evaluate("async (url) => { const r = await fetch(url); return {status: r.status, "
                         "body: await r.json()}; }", f"/api/map?feature={int(row['feature_id'])}&layer=5&head=11")
    assert data["status"] == 200
    body = data["body"]
    assert body["seq_len"] == row["seq_len"] == len(body["tokens"]) == len(body["weights"])
    assert body["tokens"] == list(row["tokens"])
    assert all(len(w) == row["seq_len"] for w in body["weights"])


def other_addresses() -> list[str]:
    """This machine's IPv4 addresses other than 127.0.0.1 (the host name's and those of ``ip -4 addr``)."""
    found = set()
    try:
        found.add(socket.gethostbyname(socket.gethostname()))
    except OSError:
        pass
    try:
        out = subprocess.run(["ip", "-4", "-o", "addr"], check=False, capture_output=True, text=True,
                             timeout=10).stdout
        found.update(re.findall(r"inet (\d+\.\d+\.\d+\.\d+)", out))
    except (OSError, subprocess.SubprocessError):
        pass
    return sorted(a for a in found if ipaddress.ip_address(a) != ipaddress.ip_address("127.0.0.1"))


def test_server_is_not_reachable_on_other_addresses(server):
    host, port = server
    assert host == "127.0.0.1"
    with socket.create_connection((host, port), timeout=10):
        pass  # reachable where it should be
    addresses = other_addresses()
    if not addresses:
        pytest.skip("this machine has no IPv4 address but 127.0.0.1 to try")
    for address in addresses:
        with pytest.raises(OSError):
            socket.create_connection((address, port), timeout=5).close()


@pytest.mark.parametrize("path", ["/../secret.txt", "/%2e%2e/secret.txt", "/%2E%2E%2Fsecret.txt",
                                  "/..%5csecret.txt", "/leak.txt", "/../run/report.html"])
def test_traversal_attempts_are_refused(server, path):
    status, body = raw_get(*server, path)
    assert status in (403, 404), (status, body[:200])
    assert SECRET.encode() not in body


def test_head_panel_loads_the_longest_feature_at_full_length(page, server, demo_run):
    features = read_table(demo_run, "features")
    longest = features.loc[features["seq_len"].idxmax()]
    n = int(longest["seq_len"])
    assert n == len(longest["tokens"]) == 384  # the demo's longest question fills the model's width
    host, port = server
    page.set_viewport_size({"width": 420, "height": 800})
    page.goto(f"http://{host}:{port}/", wait_until="load")
    page.locator("#grid [data-layer='2'][data-head='7']").first.click()
    assert page.locator("#head-panel-title").inner_text().startswith("L2H7")
    page.locator("#panel-longest").click()
    view = page.locator(".hp-any .map-view")
    view.wait_for()
    assert f"Feature {int(longest['feature_id'])} " in view.locator("figcaption").inner_text()
    labels = view.locator(".tok").all_text_contents()
    assert len(labels) == n and labels == [str(t) for t in longest["tokens"]]
    a, b = int(longest.get("answer_start_token", -1)), int(longest.get("answer_end_token", -1))
    assert view.locator(".tok.answer").count() == (b - a + 1 if 0 <= a <= b else 0)
    box = view.locator(".mv-box")
    widths = box.evaluate("b => [b.scrollWidth, b.clientWidth]")
    assert widths[0] > widths[1]  # the 384-token map scrolls inside its own box ...
    assert page.evaluate("document.documentElement.scrollWidth") <= 420  # ... and does not widen the page
    page.locator("#panel-search").fill(str(longest["example_id"]))
    page.locator(f"#panel-results .hp-feature[data-feature='{int(longest['feature_id'])}']").first.wait_for()
    assert page.watch.errors == []


def test_file_page_has_no_server_controls_and_makes_no_request(page, demo_run):
    page.goto((demo_run / "report.html").as_uri(), wait_until="load")
    page.locator("#grid [data-layer][data-head]").first.click()
    assert page.locator("#panel-longest").count() == 0 and page.locator("#panel-search").count() == 0
    assert "attnclust explore DIR" in page.locator(".hp-any").inner_text()
    assert [u for u in page.watch.requests if not u.startswith(("file:", "data:", "blob:"))] == []
    assert page.watch.errors == []


def test_the_map_toggles_to_the_norm_weighted_map_the_server_computes(page, server, demo_run):
    """The demo's MiniLM store holds each key's value norm: the panel's map gets a weights / norm-weighted toggle;
    'Norm-weighted' asks /api/map once with weighting=norm and paints its rows' shares of the moved norm, which the
    hover reads out; 'Weights' goes back without asking again."""
    features = read_table(demo_run, "features")
    longest = features.loc[features["seq_len"].idxmax()]
    host, port = server
    page.goto(f"http://{host}:{port}/", wait_until="load")
    page.locator("#grid [data-layer='0'][data-head='0']").first.click()
    page.locator("#panel-longest").click()
    view = page.locator(".hp-any .map-view")
    view.wait_for()
    by_norm = view.get_by_role("button", name="Norm-weighted")
    expect(view.get_by_role("button", name="Weights")).to_have_attribute("aria-pressed", "true")
    url = f"/api/map?feature={int(longest['feature_id'])}&layer=0&head=0"
    asked = lambda: [u for u in page.watch.requests if u.endswith(url + "&weighting=norm")]  # noqa: E731
    assert asked() == []
    by_norm.click()
    expect(view).to_have_attribute("data-weighting", "norm")
    expect(by_norm).to_have_attribute("aria-pressed", "true")
    moved = page.evaluate("async (u) => (await (await fetch(u)).json()).weights", url + "&weighting=norm")
    canvas = view.locator("canvas.mv-canvas")
    box, n = canvas.bounding_box(), len(moved)
    canvas.hover(position={"x": 0.5 * box["width"] / n, "y": (n - 0.5) * box["height"] / n})  # last query, key 0
    readout = view.locator(".mv-readout")
    expect(readout).to_contain_text("→ key 0 ")
    value = round(255 * moved[n - 1][0]) / 255
    expect(readout).to_contain_text(f": {value:.3f} of the row's moved norm")
    view.get_by_role("button", name="Weights").click()
    expect(view).to_have_attribute("data-weighting", "weights")
    assert len(asked()) == 2  # the toggle's one request, and this test's own fetch
    assert page.watch.errors == []
