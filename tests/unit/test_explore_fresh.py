"""``attnclust explore`` never serves a stale run: a re-run into the same directory is noticed per request (the
new run is served once it has finished, 409 while it runs), and no answer mixes two runs."""

from __future__ import annotations

import http.client
import json
import shutil
import threading

import numpy as np
import pandas as pd
import pytest

from attnclust.explore import make_server
from attnclust.layout import RunLayout
from attnclust.store import atomic_write_json, read_features

MAP = "/api/map?feature=0&layer=0&head=0"


@pytest.fixture(scope="module")
def planted(small_planted_run):
    root = small_planted_run("explore-fresh")
    ids = read_features(root)["example_id"].unique()
    pd.DataFrame({"id": ids, "question": [f"Old question {i}?" for i in range(len(ids))]}).to_parquet(
        RunLayout(root).examples)
    return root


@pytest.fixture
def served(planted, tmp_path):
    root = tmp_path / "run"
    shutil.copytree(planted, root)
    srv = make_server(root, port=0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield root, srv
    srv.shutdown()
    srv.server_close()
    thread.join()


def get(server, path):
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def rerun(root) -> np.ndarray:
    """What ``attnclust run --force`` with edited questions leaves behind: new questions, new tokens, new maps,
    and the stage records rewritten at the end. Returns the new map of feature 0, layer 0, head 0."""
    import zarr

    layout = RunLayout(root)
    examples = pd.read_parquet(layout.examples)
    examples["question"] = examples["question"].str.replace("Old", "New")
    examples.to_parquet(layout.examples)
    features = pd.read_parquet(layout.features)
    features["tokens"] = [[t.upper() + "!" for t in tokens] for tokens in features["tokens"]]
    features.to_parquet(layout.features)
    n = int(features.loc[features["feature_id"] == 0, "seq_len"].iloc[0])
    attention = zarr.open_group(str(layout.attention), mode="r+")["attention"].with_config({"write_empty_chunks": True})
    block = np.asarray(attention[0:1])
    block[0, 0, 0, :n, :n] = np.float16(1.0 / n)  # uniform: unlike any planted head
    attention[0:1] = block
    for record in layout.state.glob("*.json"):
        atomic_write_json(record, json.loads(record.read_text()))  # a new file, as each stage's end writes it
    return block[0, 0, 0, :n, :n].astype(np.float32)


def test_a_rerun_into_the_same_directory_is_served_with_its_own_tokens_questions_and_weights(served):
    root, server = served
    status, before = get(server, MAP)
    assert status == 200 and before["question"].startswith("Old question")
    new_map = rerun(root)
    status, after = get(server, MAP)
    assert status == 200
    assert after["question"] == before["question"].replace("Old", "New")
    assert after["tokens"] == [t.upper() + "!" for t in before["tokens"]]
    np.testing.assert_allclose(after["weights"], new_map, atol=1e-4)
    assert not np.allclose(before["weights"], new_map, atol=1e-3)
    status, search = get(server, "/api/search?q=new+question")
    assert status == 200 and search["total"] == len(read_features(root)["example_id"].unique())


def test_while_a_rerun_is_in_progress_requests_are_refused_409_in_one_line(served):
    root, server = served
    layout = RunLayout(root)
    assert get(server, "/api/heads")[0] == 200
    record = layout.stage_record("report")
    saved = record.read_text()
    record.unlink()  # a re-run removes the records of the stages it re-runs first
    status, body = get(server, "/api/heads")
    assert status == 409
    assert "\n" not in body["error"]
    assert body["error"].endswith("not a finished run (the report stage's record missing); run 'attnclust run' (or "
                                  "'attnclust report') with --out " + str(root) + " first; the run changed on disk "
                                  "since explore started (a re-run?): reload the page when it has finished")
    record.write_text(saved)
    assert get(server, "/api/heads")[0] == 200


def test_an_answer_read_while_the_run_changed_is_never_sent(served):
    root, server = served
    app = server.RequestHandlerClass.app
    original = app.read_map

    def read_during_a_rerun(*args):
        weights, tokens = original(*args)
        rerun(root)  # the run on disk changes between reading the map and answering
        return weights, tokens

    app.read_map = read_during_a_rerun
    status, body = get(server, MAP)
    assert status == 409
    assert body["error"].endswith("the run changed on disk while this answer was read (a re-run?); reload the page")
    app.read_map = original
    status, body = get(server, MAP)  # the next request is answered from the new run alone
    assert status == 200 and body["question"].startswith("New question")


@pytest.mark.parametrize("command", ["explore", "export"])
def test_a_truncated_heads_table_is_one_line_and_exit_2(command, planted, tmp_path, capsys):
    from attnclust.cli import main

    root = tmp_path / "run"
    shutil.copytree(planted, root)
    heads = root / "heads.parquet"
    heads.write_bytes(heads.read_bytes()[:-40])
    args = [str(root), "--port", "0"] if command == "explore" else [str(root), "--figure", "grid",
                                                                     "--out", str(tmp_path / "grid.png")]
    assert main([command, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert err.startswith("attnclust: error: ") and "heads.parquet" in err and "re-run 'attnclust" in err
    assert not (tmp_path / "grid.png").exists()


def test_a_deleted_shard_is_a_one_line_error_never_an_all_zero_map(served):
    root, server = served
    shard = root / "attention.zarr" / "attention" / "c" / "0" / "0" / "0" / "0" / "0"
    shard.unlink()
    status, body = get(server, MAP)
    assert status == 500
    assert "\n" not in body["error"] and "weights" not in body
    assert body["error"].endswith("array 'attention', features 0..2 (chunk attention/c/0/0/0/0/0) is missing; the "
                                  "store is damaged: re-run 'attnclust extract --force' for this output dir to "
                                  "rewrite it")
