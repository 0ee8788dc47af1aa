"""``attnclust explore DIR``: a local HTTP server over one finished run, reading maps lazily from its store.

Routes (GET and HEAD only)::

    /                     the run's report.html (also /report.html)
    /favicon.ico          204 No Content (browsers ask for it; a 404 would be a console error)
    /exports/NAME         a figure written by ``attnclust export`` (exports/ is attnclust's own folder)
    /api/heads            heads.parquet as a JSON list of records (NaN -> null)
    /api/search?q=TEXT    questions whose text contains TEXT (case-insensitive) or whose id starts with it,
                          with their features; ``limit`` (default 20, at most 200)
    /api/features?sort=longest|id[&limit=N]
                          features (no maps) with their example id, question, span and seq_len, the longest first
                          (``longest``, ties by id) or by id; ``limit`` as for search (the page's "longest" button)
    /api/map?feature=F&layer=L&head=H[&format=json|png]
                          one map at its full true length, read from attention.zarr, with its tokens and the gold
                          answer's token span (``answer``, or null); JSON weights are rounded to
                          :data:`MAP_DECIMALS` decimals; ``format=png`` draws it with matplotlib. On a compact store
                          a map outside its exact sample is exact too, recomputed by one forward of the run's model
                          (:mod:`attnclust.recompute`), while that model is here unchanged; otherwise it is the
                          compact map, and the answer says why it was not recomputed

A re-run into the same directory is noticed per request: the identity of the run on disk (the inode, mtime and
size of its marker, its report and every stage record in ``_state/``: one ``stat`` each) is compared with that
of the run whose tables are cached. On a change the caches are dropped and the new run is served; while the
directory is not a finished run (a re-run in progress) requests are answered 409 with one line; and an answer
during which the run changed is never sent (409): no answer mixes two runs.

What it refuses: every path that is not one of those routes (404), any path holding ``..`` or ``.`` segments,
backslashes, NUL or encoded slashes, before or after percent-decoding (403), and any file that is, or lies under,
a symbolic link or resolves outside the run directory (403). Files are opened only after those checks and with
``O_NOFOLLOW``. Bound to 127.0.0.1 by default; on a loopback address a request whose ``Host`` header names another
host is refused (403, against DNS rebinding). Another address must be asked for explicitly (``--host``); there is
no authentication, so the command line then prints a warning.

What the server answers, independent of HTTP, is :class:`~attnclust.explore.app.ExploreApp`'s (the run's tables
and maps read lazily, the run on disk checked per request, a file inside the run found only after every check);
the routes, the checks that refuse a request target or a ``Host`` and the request handler are
:mod:`attnclust.explore.server`'s, reviewed together with :meth:`~attnclust.explore.app.ExploreApp.safe_file` as
one security boundary (recomputing a compact run's maps lives in :mod:`attnclust.recompute`).
"""

from __future__ import annotations

from .app import FEATURE_SORTS, MAP_DECIMALS, SEARCH_LIMIT, SEARCH_MAX, ExploreApp, Refused, finished_run
from .server import DEFAULT_HOST, is_loopback, make_server

__all__ = ["DEFAULT_HOST", "FEATURE_SORTS", "MAP_DECIMALS", "SEARCH_LIMIT", "SEARCH_MAX", "ExploreApp", "Refused",
           "finished_run", "is_loopback", "make_server"]
