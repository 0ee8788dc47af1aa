"""``attnclust explore``'s HTTP side: the routes (:mod:`attnclust.explore`), the checks that refuse a request target
(traversal, encoded slashes, NUL) or a ``Host`` that is not this machine's, the request handler that turns every
failure into a one-line JSON error, and :func:`make_server`. What each route answers is
:class:`~attnclust.explore.app.ExploreApp`'s.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote

from ..errors import StoreError
from ..maps import WEIGHTINGS
from .app import FEATURE_SORTS, SEARCH_LIMIT, SEARCH_MAX, ExploreApp, Refused

__all__ = ["DEFAULT_HOST", "is_loopback", "make_server"]

DEFAULT_HOST = "127.0.0.1"
"""The address served on unless ``--host`` names another."""
_EXPORT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")



def is_loopback(host: str) -> bool:
    """True when ``host`` is ``localhost`` or a loopback address (127.0.0.0/8, ::1).

    Parameters
    ----------
    host : str

    Returns
    -------
    bool
    """
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _json_bytes(obj) -> bytes:
    return (json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n").encode()


_TYPES = {".html": "text/html; charset=utf-8", ".png": "image/png", ".svg": "image/svg+xml",
          ".pdf": "application/pdf"}


def _check_path(raw: str) -> str:
    """The decoded path of a request target, or :class:`Refused` for traversal attempts."""
    if not raw.startswith("/"):
        raise Refused(HTTPStatus.BAD_REQUEST, "request target: expected a path starting with '/'")
    path = raw.split("#", 1)[0].split("?", 1)[0]  # not urlsplit: it reads '//x/y' as host 'x'
    for candidate in (path, unquote(path), unquote(unquote(path))):
        low = candidate.lower()
        segments = candidate.split("/")
        if "\\" in candidate or "\x00" in candidate or "%2f" in low or "%5c" in low or "//" in candidate \
                or any(s in (".", "..") for s in segments[1:]):
            raise Refused(HTTPStatus.FORBIDDEN, "path refused: '..', '.', '//', backslashes and encoded "
                                                "slashes are not served")
    return unquote(path)


def _limit(value: str | None) -> int:
    """The ``limit`` query parameter (default :data:`SEARCH_LIMIT`), or :class:`Refused` (400)."""
    limit = value or str(SEARCH_LIMIT)
    if not re.fullmatch(r"[0-9]{1,4}", limit) or not 1 <= int(limit) <= SEARCH_MAX:
        raise Refused(HTTPStatus.BAD_REQUEST, f"limit={limit!r}: expected an integer in 1..{SEARCH_MAX}")
    return int(limit)


def _host_name(header: str) -> str | None:
    """The host of a ``Host`` header without its port (``[::1]:8000`` -> ``[::1]``); ``None`` unless the header is
    exactly a host and an optional port of ASCII digits (``127.0.0.1:8000.evil.com`` is no such header)."""
    match = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[^:\[\]\s]+)(?::[0-9]{1,5})?", header.strip())
    return match.group(1) if match else None


class _Handler(BaseHTTPRequestHandler):
    app: ExploreApp
    check_host: bool
    server_version = "attnclust-explore"
    sys_version = ""

    def log_message(self, format: str, *args) -> None:
        """Quiet: no line per request."""

    def _send(self, status: HTTPStatus, body: bytes, ctype: str) -> None:
        identity, self._identity = getattr(self, "_identity", None), None
        if identity is not None:
            self.app.confirm(identity)  # Refused (409) when the run changed while the answer was read
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: HTTPStatus, message: str) -> None:
        self._send(status, _json_bytes({"error": message.splitlines()[0] if message else status.phrase}),
                   "application/json")

    def do_HEAD(self) -> None:
        """Like GET, without the body."""
        self.do_GET()

    def do_GET(self) -> None:
        """Route one request; every failure becomes a one-line JSON error."""
        self._identity = None
        try:
            if self.check_host:
                header = (self.headers.get("Host") or "").strip()
                host = _host_name(header)
                if header and (host is None or not is_loopback(host)):
                    raise Refused(HTTPStatus.FORBIDDEN, f"Host {header[:80]!r}: refused; this server answers only "
                                                        f"requests for localhost")
            path = _check_path(self.path)
            query = parse_qs(self.path.split("#", 1)[0].partition("?")[2], keep_blank_values=True)

            def arg(k: str) -> str | None:
                return query.get(k, [None])[-1]

            app = self.app
            self._identity = app.refresh()  # the run on disk is the one served, or 409
            if path in ("/", "/report.html"):
                self._send(HTTPStatus.OK, app.read_file(app.layout.report.name), _TYPES[".html"])
            elif path == "/favicon.ico":  # browsers ask for one; the report has none: "no content", not an error
                self._send(HTTPStatus.NO_CONTENT, b"", "image/x-icon")
            elif path == "/api/heads":
                self._send(HTTPStatus.OK, app.heads_json(), "application/json")
            elif path == "/api/search":
                limit = _limit(arg("limit"))
                self._send(HTTPStatus.OK, _json_bytes(app.search(arg("q") or "", limit)), "application/json")
            elif path == "/api/features":
                sort = arg("sort") or "longest"
                if sort not in FEATURE_SORTS:
                    raise Refused(HTTPStatus.BAD_REQUEST, f"sort={sort!r}: expected one of {', '.join(FEATURE_SORTS)}")
                self._send(HTTPStatus.OK, _json_bytes(app.feature_list(sort, _limit(arg("limit")))),
                           "application/json")
            elif path == "/api/map":
                fmt = arg("format") or "json"
                if fmt not in ("json", "png"):
                    raise Refused(HTTPStatus.BAD_REQUEST, f"format={fmt!r}: expected json or png")
                weighting = arg("weighting") or "weights"
                if weighting not in WEIGHTINGS:
                    raise Refused(HTTPStatus.BAD_REQUEST, f"weighting={weighting!r}: expected one of "
                                                          f"{', '.join(WEIGHTINGS)}")
                index = app.map_index(arg("feature"), arg("layer"), arg("head"))
                if weighting == "norm" and app.store.value_norm is None:
                    raise Refused(HTTPStatus.BAD_REQUEST, "weighting=norm: this run's store holds no value norms "
                                                          "(its model's family has no known value projection, or it "
                                                          "was extracted before attnclust stored them); re-run "
                                                          "'attnclust extract --force' for it, or ask for "
                                                          "weighting=weights")
                if fmt == "png":
                    self._send(HTTPStatus.OK, app.map_png(*index, weighting), "image/png")
                else:
                    self._send(HTTPStatus.OK, _json_bytes(app.map_json(*index, weighting)), "application/json")
            elif path.startswith("/exports/") and _EXPORT_NAME.match(path[len("/exports/"):]):
                name = path[len("/exports/"):]
                ctype = _TYPES.get(Path(name).suffix.lower())
                if ctype is None:
                    raise Refused(HTTPStatus.NOT_FOUND, f"path {path!r}: not found")
                self._send(HTTPStatus.OK, app.read_file(f"{app.layout.exports.name}/{name}"), ctype)
            else:
                raise Refused(HTTPStatus.NOT_FOUND, f"path {path!r}: not found")
        except Refused as exc:
            self._error(exc.status, exc.message)
        except StoreError as exc:
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, str(exc))
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:  # noqa: BLE001 (one request failing never stops the server)
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {exc}")

    def do_POST(self) -> None:
        """Refused: the server is read-only."""
        self._error(HTTPStatus.METHOD_NOT_ALLOWED, "read-only server: only GET and HEAD")

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_POST


def make_server(root: str | os.PathLike[str], *, host: str = DEFAULT_HOST, port: int = 0,
                note: Callable[[str], None] | None = None) -> ThreadingHTTPServer:
    """A server for the run ``root``, bound (and listening) on ``host:port`` but not yet serving.

    Call ``serve_forever()`` on it (in a thread, for tests), ``shutdown()`` and ``server_close()`` to stop; its
    :class:`ExploreApp` is ``server.app``.

    Parameters
    ----------
    root
        A finished run directory.
    host : str
        Address to bind (default 127.0.0.1); any other than a loopback address exposes the run to the network.
    port : int
        0 picks a free port; ``server.server_address`` tells which.
    note : callable, optional
        Given one line whenever a compact run's maps are, or are not, recomputed (:class:`ExploreApp`).

    Returns
    -------
    http.server.ThreadingHTTPServer

    Raises
    ------
    attnclust.errors.StoreError
        ``root`` is not a finished run.
    OSError
        The address cannot be bound (in use, not an address of this machine).
    """
    app = ExploreApp(root, note=note)
    handler = type("ExploreHandler", (_Handler,), {"app": app, "check_host": is_loopback(host)})
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server_cls = type("ExploreServer", (ThreadingHTTPServer,), {"address_family": family,
                                                                 "daemon_threads": True, "app": app})
    return server_cls((host.strip("[]"), port), handler)
