"""``attnclust explore``: the local server over a small planted run, checked over real HTTP on 127.0.0.1."""

from __future__ import annotations

import http.client
import json
import threading

import numpy as np
import pandas as pd
import pytest

from attnclust.cli import main
from attnclust.explore import finished_run, is_loopback, make_server
from attnclust.layout import RunLayout
from attnclust.store import open_attention_store, read_features

SECRET = "attnclust-test-secret-4f1c9b"
QUESTION = "Which planted head attends to the previous token?"


@pytest.fixture(scope="module")
def run_dir(small_planted_run):
    root = small_planted_run("explore")
    ids = read_features(root)["example_id"].unique()
    questions = [QUESTION if i == 3 else f"Question number {i}?" for i in range(len(ids))]
    pd.DataFrame({"id": ids, "question": questions}).to_parquet(RunLayout(root).examples)
    return root


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    path = tmp_path_factory.mktemp("outside") / "secret.txt"
    path.write_text(SECRET)
    return path


@pytest.fixture(scope="module")
def server(run_dir, outside):
    # links planted inside the run directory, pointing outside it
    (run_dir / "leak.txt").symlink_to(outside)
    (run_dir / "exports").mkdir()
    (run_dir / "exports" / "leak.png").symlink_to(outside)
    srv = make_server(run_dir, port=0)  # bound and listening on return: no waiting needed
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join()


def get(server, path, headers=None):
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port)
    try:
        conn.request("GET", path, headers=headers or {})  # sent as written: no client-side normalisation
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type"), resp.read()
    finally:
        conn.close()


def test_binds_to_loopback_by_default(server):
    assert server.server_address[0] == "127.0.0.1"
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.10")


def test_root_serves_the_report(server, run_dir):
    status, ctype, body = get(server, "/")
    assert status == 200 and ctype.startswith("text/html")
    assert body == RunLayout(run_dir).report.read_bytes()


def test_favicon_is_no_content_not_an_error(server):
    assert get(server, "/favicon.ico")[::2] == (204, b"")  # a 404 shows as a console error in the browser


def test_map_api_returns_the_full_length_map_of_the_store(server, run_dir):
    store = open_attention_store(RunLayout(run_dir).attention)
    features = read_features(run_dir)
    f = int(np.argmax(store.seq_len))  # the longest feature: its map is not cropped
    status, ctype, body = get(server, f"/api/map?feature={f}&layer=1&head=0")
    assert status == 200 and ctype == "application/json"
    data = json.loads(body)
    expected = store.read_map(f, 1, 0)
    weights = np.asarray(data["weights"])
    assert weights.shape == expected.shape == (store.seq_len[f], store.seq_len[f]) == (40, 40)
    np.testing.assert_allclose(weights, expected, atol=1e-5)
    assert data["tokens"] == list(features.loc[f, "tokens"])
    status, ctype, body = get(server, f"/api/map?feature={f}&layer=1&head=0&format=png")
    assert status == 200 and ctype == "image/png" and body.startswith(b"\x89PNG\r\n\x1a\n")


def test_heads_api_is_the_heads_table(server, run_dir):
    status, _, body = get(server, "/api/heads")
    heads = pd.read_parquet(RunLayout(run_dir).table("heads"))
    data = json.loads(body)
    assert status == 200 and len(data) == len(heads)
    assert {(r["layer"], r["head"]) for r in data} == set(zip(heads["layer"], heads["head"]))


def test_search_finds_a_question_by_text_and_by_id(server):
    status, _, body = get(server, "/api/search?q=previous%20TOKEN")
    results = json.loads(body)["results"]
    assert status == 200 and [r["question"] for r in results] == [QUESTION]
    assert results[0]["features"] and all("feature_id" in f for f in results[0]["features"])
    status, _, body = get(server, "/api/search?q=" + results[0]["example_id"])
    assert status == 200 and QUESTION in [r["question"] for r in json.loads(body)["results"]]


@pytest.mark.parametrize("path", ["/../x", "/%2e%2e/x", "/..%2fx", "/%2E%2E/%2e%2e/secret.txt", "/%252e%252e/x",
                                  "/leak.txt", "/exports/leak.png", "/exports/..%2f..%2fsecret.txt",
                                  "/..\\secret.txt", "/unknown", "/features.parquet", "/attention.zarr/zarr.json"])
def test_traversal_links_and_unknown_paths_are_refused(server, outside, path):
    status, _, body = get(server, path)
    assert status in (403, 404)
    assert SECRET.encode() not in body
    assert "error" in json.loads(body)


def test_absolute_paths_are_refused(server, outside):
    for path in (str(outside), "/" + str(outside), "/" + str(outside).replace("/", "%2f")):
        status, _, body = get(server, path if path.startswith("/") else "/" + path)
        assert status in (400, 403, 404) and SECRET.encode() not in body


@pytest.mark.parametrize("query, match", [("feature=-1&layer=0&head=0", "feature"),
                                          ("feature=abc&layer=0&head=0", "feature"),
                                          ("feature=0&layer=9&head=0", "layer"),
                                          ("feature=0&layer=0", "head"),
                                          ("feature=0&layer=0&head=0&format=gif", "format"),
                                          ("feature=%D9%A0&layer=0&head=0", "feature"),  # an Arabic-Indic 0
                                          ("feature=0&layer=%EF%BC%90&head=0", "layer")])  # a full-width 0
def test_bad_map_parameters_are_400_with_one_line(server, query, match):
    status, ctype, body = get(server, "/api/map?" + query)
    assert status == 400 and ctype == "application/json"
    assert body.count(b"\n") == 1 and match in json.loads(body)["error"]


def test_a_request_for_another_host_is_refused(server):
    status, _, body = get(server, "/", headers={"Host": "attacker.example"})
    assert status == 403 and b"<html" not in body


@pytest.mark.parametrize("host", ["127.0.0.1:{port}.evil.com", "localhost:{port}.evil.com", "127.0.0.1:{port}:1",
                                  "127.0.0.1:8²", "[::1]x:{port}", "127.0.0.1 evil.com", "localhost:"])
def test_a_host_header_that_only_begins_with_a_loopback_name_is_refused(server, host):
    header = host.format(port=server.server_address[1])
    status, _, body = get(server, "/", headers={"Host": header})
    assert status == 403, header
    assert json.loads(body)["error"].startswith(f"Host {header!r}: refused")


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "localhost", "[::1]:{port}", "127.0.0.2"])
def test_a_loopback_host_header_is_served(server, host):
    status, ctype, _ = get(server, "/", headers={"Host": host.format(port=server.server_address[1])})
    assert status == 200 and ctype.startswith("text/html")


def test_a_directory_that_is_not_a_finished_run_is_refused(tmp_path, capsys):
    with pytest.raises(ValueError, match="not an attnclust run"):
        finished_run(tmp_path)
    assert main(["explore", str(tmp_path), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnclust: error: run dir") and err.count("\n") == 1


def test_a_link_to_a_file_outside_is_refused_as_a_link(server):
    status, _, body = get(server, "/exports/leak.png")
    assert status == 403 and "symbolic link" in json.loads(body)["error"]


def test_features_api_lists_the_longest_feature_first(server, run_dir):
    features = read_features(run_dir)
    status, ctype, body = get(server, "/api/features?sort=longest&limit=3")
    data = json.loads(body)
    assert status == 200 and ctype == "application/json" and data["total"] == len(features)
    lengths = [len(t) for t in features["tokens"]]  # counted from the tokens, not the seq_len column
    longest = max(range(len(features)), key=lambda i: (lengths[i], -int(features["feature_id"].iloc[i])))
    first = data["results"][0]
    assert len(data["results"]) == 3
    assert first["feature_id"] == int(features["feature_id"].iloc[longest]) and first["seq_len"] == max(lengths)
    assert [r["seq_len"] for r in data["results"]] == sorted((r["seq_len"] for r in data["results"]), reverse=True)
    example = str(features["example_id"].iloc[longest])
    expected_question = QUESTION if example == str(features["example_id"].unique()[3]) else \
        f"Question number {list(map(str, features['example_id'].unique())).index(example)}?"
    assert first["example_id"] == example and first["question"] == expected_question
    status, _, body = get(server, "/api/features?sort=id&limit=200")
    assert status == 200 and [r["feature_id"] for r in json.loads(body)["results"]] == \
        sorted(int(f) for f in features["feature_id"])[:200]


def test_map_api_gives_the_question_and_the_answer_span(server, run_dir):
    features = read_features(run_dir)
    status, _, body = get(server, "/api/map?feature=0&layer=0&head=0")
    data = json.loads(body)
    assert status == 200 and {"feature", "layer", "head", "example_id", "seq_len", "tokens", "segment_ids",
                              "weights", "question", "answer"} <= set(data)
    row = features.set_index("feature_id").loc[0]
    a, b = (int(row["answer_start_token"]), int(row["answer_end_token"])) if "answer_start_token" in row else (-1, -1)
    assert data["answer"] == ([a, b] if a >= 0 else None)
    assert data["question"].startswith(("Question number", QUESTION))


@pytest.mark.parametrize("query, match", [("sort=shortest", "sort"), ("limit=0", "limit"), ("limit=201", "limit"),
                                          ("sort=longest&limit=x", "limit"), ("limit=-1", "limit")])
def test_bad_features_parameters_are_400_with_one_line(server, query, match):
    status, ctype, body = get(server, "/api/features?" + query)
    assert status == 400 and ctype == "application/json"
    assert body.count(b"\n") == 1 and match in json.loads(body)["error"]
