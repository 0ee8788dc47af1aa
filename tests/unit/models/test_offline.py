"""Hub ids without a reachable hub: one probe, the local hub cache only, one line when the model is not there.

The hub is a closed port on 127.0.0.1 (or a local HTTP server that answers 404), the cache an empty ``tmp_path``;
every HTTP request huggingface_hub makes goes through a client that counts them, so "no retries" is a count.
"""

import http.server
import socket
import threading

import pytest

from attnclust.cli import main
from attnclust.config import ModelConfig
from attnclust.errors import ModelError
from attnclust.models import describe_model, get_tokenizer
from attnclust.models import runner as models
from attnclust.models.sources import hub as modeling

MISSING = "someorg/some-model"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def use_hub(monkeypatch, tmp_path, endpoint: str) -> list[str]:
    """Point huggingface_hub at ``endpoint`` and an empty cache under ``tmp_path``; return its request log."""
    from huggingface_hub import constants
    from huggingface_hub.utils import _http

    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)    # read at import, as is the download URL template
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(modeling, "_HUB_PROBES", {})
    monkeypatch.setattr(models, "_CACHE", {})
    requests: list[str] = []

    def counting_client():
        client = _http.default_client_factory()
        client.event_hooks["request"].append(lambda request: requests.append(f"{request.method} {request.url}"))
        return client

    monkeypatch.setattr(_http, "_GLOBAL_CLIENT_FACTORY", counting_client)
    monkeypatch.setattr(_http, "_GLOBAL_CLIENT", None)
    return requests


@pytest.fixture
def closed_port():
    """A TCP port on 127.0.0.1 that refuses connections (bound, never listening, held for the test)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    yield sock.getsockname()[1]
    sock.close()


@pytest.fixture
def no_hub(monkeypatch, tmp_path, closed_port) -> list[str]:
    """The hub does not answer and the hub cache is empty; the list logs huggingface_hub's HTTP requests."""
    return use_hub(monkeypatch, tmp_path, f"http://127.0.0.1:{closed_port}")


def cache_hub_model(tiny_model, cache, repo_id: str) -> None:
    """Lay a tiny QA model (with tokenizer) out in the hub cache as a download of ``repo_id`` at ``main``."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    tiny_model(repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)


def test_unreachable_hub_fails_with_one_line_and_no_retries(no_hub, capfd):
    endpoint = modeling._hub_endpoint()
    with pytest.raises(ModelError, match=rf"^model\.name '{MISSING}': cannot load the model from '{MISSING}': "
                                         rf"the Hugging Face hub {endpoint} is unreachable \(.*refused.*\) and it "
                                         r"is not in the local hub cache .*hf.hub; pre-download it into this cache "
                                         rf".*'hf download {MISSING}'.*HF_HUB_OFFLINE=1.*local directory or "
                                         r"'minilm'") as info:
        describe_model(ModelConfig(name=MISSING))
    assert "\n" not in str(info.value)
    with pytest.raises(ModelError, match=rf"cannot load the tokenizer from '{MISSING}': .* is unreachable"):
        get_tokenizer(ModelConfig(name=MISSING))
    assert no_hub == [f"HEAD {endpoint}"]          # one probe per process, then the cache only: no retries
    assert capfd.readouterr().err == ""             # no retry warnings


def test_a_cached_hub_model_loads_while_the_hub_is_unreachable(no_hub, tmp_path, tiny_model, capfd):
    cache_hub_model(tiny_model, tmp_path / "hf" / "hub", "someorg/tiny-qa")
    cfg = ModelConfig(name="someorg/tiny-qa")
    info = describe_model(cfg)
    assert info["source"] == "someorg/tiny-qa" and info["head_trained"] is True
    assert (info["num_layers"], info["num_heads"]) == (2, 4)
    assert get_tokenizer(cfg).is_fast
    assert no_hub == [f"HEAD {modeling._hub_endpoint()}"]
    assert capfd.readouterr().err == ""


def test_offline_mode_uses_the_cache_without_probing(no_hub, tmp_path, tiny_model, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache_hub_model(tiny_model, tmp_path / "hf" / "hub", "someorg/tiny-qa")
    assert describe_model(ModelConfig(name="someorg/tiny-qa"))["head_trained"] is True
    with pytest.raises(ModelError, match=rf"'{MISSING}': the hub is offline \(HF_HUB_OFFLINE set\) and it is not in "
                                         r"the local hub cache .*'hf download .*' with the same HF_HOME\), or give"):
        describe_model(ModelConfig(name=MISSING))
    assert no_hub == []


class _NotFound(http.server.BaseHTTPRequestHandler):
    """A stand-in hub that answers every request with 404 (it is reachable, but knows no model)."""

    def _answer(self):
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET = _answer

    def log_message(self, *args):
        pass


def test_a_reachable_hub_is_asked_not_just_the_cache(monkeypatch, tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        requests = use_hub(monkeypatch, tmp_path, endpoint)
        with pytest.raises(ModelError, match=rf"cannot load the model from '{MISSING}' \(.*\); check the hub id "
                                             r"spelling, your network") as info:
            describe_model(ModelConfig(name=MISSING))
        assert "unreachable" not in str(info.value) and "\n" not in str(info.value)
    finally:
        server.shutdown()
        server.server_close()
    assert requests[0] == f"HEAD {endpoint}"
    assert any(f"/{MISSING}/" in r for r in requests[1:])   # the loader went to the hub for the files


def test_cli_run_with_an_unreachable_hub_exits_2_with_one_line_and_writes_nothing(no_hub, tmp_path, capfd):
    out = tmp_path / "out"
    assert main(["run", "--out", str(out), "--quiet", "--set", f"model.name={MISSING}"]) == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"attnclust: error: model.name '{MISSING}': cannot load")
    assert "is unreachable" in err and "HF_HUB_OFFLINE=1" in err
    assert not out.exists()


def test_a_silent_hub_counts_as_unreachable():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as silent:   # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        why = modeling._probe_hub(f"http://127.0.0.1:{silent.getsockname()[1]}", 0.2)
    assert why and "\n" not in why
