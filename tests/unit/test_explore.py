"""``attnclust explore``: the local server over a small planted run, checked over real HTTP on 127.0.0.1; and over a
tiny model's compact run, whose maps outside the exact sample are recomputed by one forward of the run's model (or,
when that model changed, is gone or does not load, served compact with the reason)."""

from __future__ import annotations

import http.client
import json
import os
import shutil
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
                                          ("feature=0&layer=%EF%BC%90&head=0", "layer"),  # a full-width 0
                                          ("feature=0&layer=0&head=0&weighting=value", "weighting"),
                                          # a planted store holds no value norms: said, not served as weights
                                          ("feature=0&layer=0&head=0&weighting=norm", "holds no value norms")])
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


# --- a compact run: maps outside the exact sample recomputed by one forward of the run's model ----------------

def _job(model, **extract):
    from attnclust.config import JobConfig
    from attnclust.data import sample_path

    return JobConfig.from_dict({"name": "t", "data": {"path": str(sample_path()), "max_examples": 3},
                                "model": {"name": str(model)},
                                "extract": {"batch_size": 4, "features_per_task": 4, **extract},
                                "featurize": {"method": "pooled", "grid": 4},
                                "cluster": {"umap": False, "k": 2, "stability_resamples": 2}})


def _compact_run(base, tiny_model):
    """A finished compact run (exact sample: one feature) of a tiny random BERT saved in ``base/model`` over three
    questions of the bundled sample."""
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    model = tiny_model(base / "model")
    run_job(_job(model, store="compact", exact_sample=1), base / "run", executor=SerialExecutor(), progress=False)
    return base / "run", model


@pytest.fixture(scope="module")
def compact_run(tmp_path_factory, tiny_model):
    """The compact run, and the full store of an extraction of the same data by the same model."""
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor

    base = tmp_path_factory.mktemp("compact-run")
    root, model = _compact_run(base, tiny_model)
    run_job(_job(model, store="full"), base / "full", stages=("extract",), executor=SerialExecutor(), progress=False)
    return root, open_attention_store(RunLayout(base / "full").attention)


def _count(monkeypatch) -> dict:
    """Count the model loads and the forwards (with the features of each) the explorer makes."""
    from attnclust.models import runner
    from attnclust.models.kinds import EncoderKind

    calls = {"loads": 0, "forwards": []}
    forward, get_model = EncoderKind.forward, runner.get_model

    def counted_forward(self, loaded, rows, **kwargs):
        calls["forwards"].append(rows["feature_id"].tolist())
        return forward(self, loaded, rows, **kwargs)

    def counted_load(*args, **kwargs):
        calls["loads"] += 1
        return get_model(*args, **kwargs)

    monkeypatch.setattr(EncoderKind, "forward", counted_forward)
    monkeypatch.setattr(runner, "get_model", counted_load)
    return calls


def _outside(store) -> list[int]:
    return [f for f in range(store.n_features) if f not in set(store.exact_features.tolist())]


@pytest.mark.slow
def test_the_norm_weighted_map_is_each_rows_share_of_the_norm_it_moves(compact_run):
    """``weighting=norm``: each weight times its key's stored value norm, over the row's sum (a loop over the cells,
    Kobayashi et al.'s ``||alpha_ij f(x_j)||`` as a share); the stored norms are the extraction's (within the norm
    code's error of the plain forward's, tests/unit/stages/test_moved_extraction.py); the weights default."""
    root, _ = compact_run
    srv = make_server(root, port=0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        store = srv.app.store
        f = int(store.exact_features[0])  # exact maps: the norm-weighted map of the exact weights
        n = int(store.seq_len[f])
        for layer, head in ((0, 0), (store.n_layers - 1, store.n_heads - 1)):
            _, _, body = get(srv, f"/api/map?feature={f}&layer={layer}&head={head}")
            plain = json.loads(body)
            assert plain["weighting"] == "weights" and plain["value_norms"] is True
            status, _, body = get(srv, f"/api/map?feature={f}&layer={layer}&head={head}&weighting=norm")
            got = json.loads(body)
            assert status == 200 and got["weighting"] == "norm"
            weights, norms = store.read_exact(f)[layer, head].astype(np.float64), store.read_value_norms(f, layer, head)
            assert norms.shape == (n,) and norms.min() > 0
            want = np.zeros((n, n))
            for i in range(n):
                total = sum(weights[i, j] * norms[j] for j in range(n))
                for j in range(n):
                    want[i, j] = weights[i, j] * norms[j] / total
            np.testing.assert_allclose(np.asarray(got["weights"]), want, atol=2e-4)
            np.testing.assert_allclose(np.asarray(plain["weights"]), weights, atol=2e-4)
            assert not np.allclose(want, weights, rtol=0.05, atol=0)  # the norms do change the map
            status, ctype, body = get(srv, f"/api/map?feature={f}&layer={layer}&head={head}&weighting=norm&format=png")
            assert status == 200 and body.startswith(b"\x89PNG")
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.slow
def test_a_compact_run_serves_exact_maps_recomputed_by_one_forward_of_its_model(compact_run, monkeypatch):
    """Outside the exact sample every map of a feature is exact (as the full store of the same data and model holds
    it, within float16's rounding, where the compact map is not), from one forward of that feature; the model loads
    on the first such map, not at start-up, and the start-up line says maps are recomputed."""
    root, full = compact_run
    calls, lines = _count(monkeypatch), []
    srv = make_server(root, port=0, note=lines.append)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        app = srv.app
        store = app.store
        assert store.mode == "compact" and np.array_equal(store.seq_len, full.seq_len)
        assert len(lines) == 1 and "recomputed on demand by one forward of the run's model" in lines[0], lines
        assert calls == {"loads": 0, "forwards": []}
        outside = _outside(store)
        assert len(outside) == 2
        for f in outside:
            for layer in range(store.n_layers):
                for head in range(store.n_heads):
                    status, _, body = get(srv, f"/api/map?feature={f}&layer={layer}&head={head}")
                    got, want = json.loads(body), full.read_map(f, layer, head)
                    assert status == 200 and got["source"] == "recomputed", got.get("error") or got.get("source")
                    assert got["kept_mass"] is None and got["map_error"] is None and got["exact_on_demand"] is True
                    assert got["exact_on_demand_reason"] is None
                    # float16's rounding (one step: 2^-11 of a weight) and the JSON's 5 decimals apart, no more
                    np.testing.assert_allclose(np.asarray(got["weights"]), want, rtol=2e-3, atol=1e-5)
                    # while the compact map is not: the check tells the two apart
                    assert not np.allclose(store.read_map(f, layer, head), want, rtol=2e-3, atol=1e-5)
        assert calls == {"loads": 1, "forwards": [[f] for f in outside]}  # one forward a feature, every head in it
        sample = int(store.exact_features[0])
        assert app.map_json(sample, 0, 0)["source"] == "exact sample" and len(calls["forwards"]) == 2
        status, ctype, body = get(srv, f"/api/map?feature={outside[0]}&layer=1&head=2&format=png")
        assert status == 200 and ctype == "image/png" and body.startswith(b"\x89PNG\r\n\x1a\n")
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join()
    assert lines[1:] == []  # nothing else to say


@pytest.mark.slow
def test_a_recomputed_feature_is_kept_and_not_computed_again(compact_run, monkeypatch):
    """A second map of the same feature (another head) is read from the cache, no forward; past the cache's size the
    least recently read feature is dropped and computed again when asked."""
    from attnclust import recompute
    from attnclust.explore import ExploreApp

    root, full = compact_run
    calls = _count(monkeypatch)
    app = ExploreApp(root)
    first, second = _outside(app.store)
    for layer, head in ((0, 0), (1, 3), (0, 0)):
        np.testing.assert_allclose(app.read_map(first, layer, head)[0], full.read_map(first, layer, head), atol=1e-3)
        assert app.map_source(first) == "recomputed"
    assert calls["forwards"] == [[first]]
    monkeypatch.setattr(recompute, "CACHED_FEATURES", 1)
    for f in (second, second, first):
        assert app.map_json(f, 1, 1)["source"] == "recomputed"
    assert calls["forwards"] == [[first], [second], [first]] and calls["loads"] == 1


@pytest.mark.slow
def test_a_features_file_rewritten_under_the_explorer_is_read_afresh(tmp_path, tiny_model):
    """The recomputing forward reads a feature's row of ``features.parquet`` as the file is now (its footer is kept
    only for one version of the file): rewritten after a first map (one feature's length changed), the next
    feature's forward sees the new row and says the run changed under the explorer."""
    from attnclust.errors import StoreError
    from attnclust.recompute import ExactOnDemand

    root, _ = _compact_run(tmp_path, tiny_model)
    layout = RunLayout(root)
    store = open_attention_store(layout.attention)
    first, second = _outside(store)
    exact = ExactOnDemand(layout, store)
    assert exact.maps(first) is not None
    features = pd.read_parquet(layout.features)
    features.loc[features["feature_id"] == second, "seq_len"] -= 1
    features.to_parquet(tmp_path / "features.parquet", index=False)
    os.replace(tmp_path / "features.parquet", layout.features)  # as attnclust writes it: a new file in its place
    with pytest.raises(StoreError, match="changed under the explorer"):
        exact.maps(second)


def test_a_changed_missing_or_unloadable_model_serves_the_compact_map_and_says_why(tmp_path, tiny_model,
                                                                                   monkeypatch):
    """The run's model rewritten with other weights after the run, removed, or failing to load: the compact map and
    its kept mass are served, the start-up line (or, for a failed load, the line then) and every answer say why,
    and no forward runs."""
    from attnclust.errors import ModelError
    from attnclust.explore import ExploreApp
    from attnclust.models import runner

    root, model = _compact_run(tmp_path, tiny_model)
    calls = _count(monkeypatch)
    f = _outside(open_attention_store(RunLayout(root).attention))[0]

    def served_compact(app, why: str) -> None:
        got, store = app.map_json(f, 1, 2), app.store
        assert got["source"] == "compact" and got["exact_on_demand"] is False, got["source"]
        assert why in got["exact_on_demand_reason"] and "\n" not in got["exact_on_demand_reason"]
        np.testing.assert_allclose(np.asarray(got["weights"]), store.read_map(f, 1, 2), atol=1e-5)
        assert got["kept_mass"] == round(store.read_kept_mass(f, 1, 2), 4) and 0 < got["kept_mass"] <= 1
        error = store.read_map_error(f, 1, 2)  # measured at extraction, beside the kept mass
        assert got["map_error"] == (round(error, 4) if np.isfinite(error) else None)

    def failing(*args, **kwargs):
        raise ModelError(f"model.name {str(model)!r}: model.safetensors is unreadable")

    with monkeypatch.context() as patch:  # the model's identity is the run's, but it does not load
        patch.setattr(runner, "get_model", failing)
        lines = []
        app = ExploreApp(root, note=lines.append)
        assert app.exact_on_demand.status is True and len(lines) == 1
        served_compact(app, "did not load (model.name")
        assert len(lines) == 2 and "not recomputed: the run's model" in lines[1] and "did not load" in lines[1]
        served_compact(app, "model.safetensors is unreadable")
        assert len(lines) == 2  # said once
    tiny_model(model, seed=1)  # other weights in the same folder: another identity
    lines = []
    served_compact(ExploreApp(root, note=lines.append), "changed since the run was extracted")
    assert len(lines) == 1 and "not recomputed: the run's model" in lines[0] and "changed" in lines[0]
    shutil.rmtree(model)
    lines = []
    served_compact(ExploreApp(root, note=lines.append), "is not available here (model.name")
    assert len(lines) == 1 and "no such directory" in lines[0]
    served_compact(ExploreApp(root, exact_on_demand=False), "turned off")
    assert calls["forwards"] == []


def test_a_store_without_an_extract_record_says_its_model_is_not_known(small_planted_run, server):
    """A compact store another tool wrote (no extract record): compact maps, and the reason; a full store has
    nothing to recompute (``exact_on_demand`` is null)."""
    from attnclust.explore import ExploreApp
    from attnclust.synthetic import write_compact_decoy

    status, _, body = get(server, "/api/map?feature=0&layer=0&head=0")
    assert status == 200 and json.loads(body)["exact_on_demand"] is None and json.loads(body)["source"] == "full"
    root = small_planted_run("explore-decoy")
    write_compact_decoy(root, [0])
    lines = []
    got = ExploreApp(root, note=lines.append).map_json(3, 0, 0)
    assert got["source"] == "compact" and got["exact_on_demand"] is False
    assert "no readable record of its extract stage" in got["exact_on_demand_reason"] and len(lines) == 1


@pytest.mark.slow
def test_weights_swapped_after_the_explorer_started_are_not_used(tmp_path, tiny_model, monkeypatch):
    """Issue 51, finding 2: the identity is asked again when the model is loaded for the first recomputed map, so
    weights of the same size with a kept modification time, put in place after start-up, serve the compact map with
    the reason, and no forward runs."""
    import os

    from attnclust.explore import ExploreApp
    from attnclust.models.sources import identity

    monkeypatch.setenv("ATTNCLUST_CACHE", str(tmp_path / "cache"))
    root, model = _compact_run(tmp_path, tiny_model)
    calls = _count(monkeypatch)
    f = _outside(open_attention_store(RunLayout(root).attention))[0]
    lines = []
    app = ExploreApp(root, note=lines.append)
    assert app.exact_on_demand.status is True and len(lines) == 1
    weights = model / "model.safetensors"
    st = weights.stat()
    other = tiny_model(tmp_path / "other", seed=1) / "model.safetensors"
    assert other.stat().st_size == st.st_size
    weights.write_bytes(other.read_bytes())
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    monkeypatch.setattr(identity, "_FILE_DIGESTS", {})  # not needed (the change time differs), but a new process
    got = app.map_json(f, 1, 2)
    assert got["source"] == "compact" and got["exact_on_demand"] is False
    assert "changed since the run was extracted" in got["exact_on_demand_reason"]
    assert calls["forwards"] == [] and calls["loads"] == 0
    assert len(lines) == 2 and "changed" in lines[1]
