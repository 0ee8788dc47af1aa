"""What ``attnclust explore`` answers, independent of HTTP (:class:`ExploreApp`): one finished run
(:func:`finished_run`), its tables and maps read lazily, the run on disk checked before each answer and after it,
a file inside the run found only after every check. The routes and the handler: :mod:`attnclust.explore.server`.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import threading
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path

from ..errors import StoreError
from ..layout import RunLayout
from ..models.kinds import kind_of
from ..recompute import ExactOnDemand
from ..report.formatting import plain_text
from ..store.contract import open_attention_store, read_features, read_table
from ..store.integrity import output_problem

__all__ = ["FEATURE_SORTS", "MAP_DECIMALS", "SEARCH_LIMIT", "SEARCH_MAX", "ExploreApp", "Refused", "finished_run"]

MAP_DECIMALS = 5
"""Decimals of the weights in ``/api/map`` JSON (the store holds float16: about 3 significant digits)."""
SEARCH_LIMIT = 20
"""Results of ``/api/search`` unless ``limit`` asks for another number (at most :data:`SEARCH_MAX`)."""
SEARCH_MAX = 200
FEATURE_SORTS = ("longest", "id")
"""Orders ``/api/features`` accepts in ``sort``."""

class Refused(Exception):
    """A request the server answers with an error status and a one-line JSON message."""

    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def finished_run(root: str | os.PathLike[str]) -> RunLayout:
    """Check that ``root`` is a finished attnclust run (marker, report stage done, the tables it needs).

    Parameters
    ----------
    root
        The run directory.

    Returns
    -------
    RunLayout
        The layout of the directory, with its root resolved to the real path.

    Raises
    ------
    attnclust.errors.StoreError
        One line naming the directory, what is missing and the fix.
    """
    given = Path(root)
    if not given.is_dir():
        raise StoreError(f"run dir {given}: not found or not a directory; give the output directory of "
                         f"'attnclust run'")
    layout = RunLayout(given.resolve())
    fix = f"run 'attnclust run' (or 'attnclust report') with --out {given} first"
    if not layout.is_run():
        raise StoreError(f"run dir {given}: not an attnclust run (no {layout.marker.name} marker); {fix}")
    needed = (layout.attention, layout.features, layout.table("heads"), layout.report)
    for path in needed:
        if path.is_symlink():
            raise StoreError(f"run dir {given}: {path.name} is a symbolic link; attnclust does not follow links "
                             f"inside a run directory: replace it by the real file or re-run the report")
    missing = [p.name for p in needed if not p.exists()]
    if missing or not layout.stage_record("report").exists():
        what = ", ".join(missing) if missing else "the report stage's record"
        raise StoreError(f"run dir {given}: not a finished run ({what} missing); {fix}")

    problem = next((p for p in map(output_problem, needed[:3]) if p), None)  # parquet footers, zarr metadata
    if problem:
        raise StoreError(f"run dir {given}: {problem}; re-run 'attnclust run' with --out {given} to rebuild it")
    return layout


class ExploreApp:
    """What the server answers, independent of HTTP: one run directory, its tables loaded on first use.

    Parameters
    ----------
    root
        A finished run directory (checked with :func:`finished_run`).
    exact_on_demand : bool
        On a compact store, recompute the exact maps of a feature outside its exact sample by one forward of the
        run's model (:class:`~attnclust.recompute.ExactOnDemand`) when that model is here unchanged; ``False`` serves
        the compact maps (and says so).
    note : callable, optional
        Called with one line for people: whether a compact store's maps are recomputed and, if not, why (when a run
        is first read, and when its model fails to load); the command line prints it.
    """

    def __init__(self, root: str | os.PathLike[str], *, exact_on_demand: bool = True,
                 note: Callable[[str], None] | None = None):
        self.given = Path(root)
        self.layout = finished_run(root)
        self.root = self.layout.root  # resolved
        self._lock = threading.Lock()
        self._exact_on_demand, self._note = exact_on_demand, note
        self.identity = self.run_identity()
        self._drop_caches()
        _ = self.exact_on_demand  # decided (and said) at start-up; the model loads on the first map it recomputes

    def _drop_caches(self) -> None:
        self._store = None
        self._features = None
        self._search = None
        self._questions = None
        self._heads = None
        self._exact = None

    # -- the run on disk ----------------------------------------------------------------------
    def run_identity(self) -> tuple:
        """What changes whenever a run writes into the directory: ``(name, inode, mtime_ns, size)`` of the
        marker, the report and every stage record (``_state/*.json``, ``*.started``). Cheap: one ``stat`` each.

        Returns
        -------
        tuple
        """
        def stat(path: Path) -> tuple:
            try:
                st = path.stat()
            except OSError:
                return (path.name, None)
            return (path.name, st.st_ino, st.st_mtime_ns, st.st_size)

        records = []
        with contextlib.suppress(OSError), os.scandir(self.layout.state) as entries:
            records = sorted(e.name for e in entries if e.name.endswith((".json", ".started"))
                             and e.name != self.layout.service_state.name)
        return (stat(self.layout.marker), stat(self.layout.report),
                *(stat(self.layout.state / name) for name in records))

    def refresh(self) -> tuple:
        """Called before each request: when the run on disk is not the one cached, drop the caches (serve the
        new run) or, while it is not a finished run, refuse.

        Returns
        -------
        tuple
            The identity the request is answered from (give it to :meth:`confirm` before answering).

        Raises
        ------
        Refused
            409 while the directory is not a finished run (being re-run).
        """
        now = self.run_identity()
        with self._lock:
            if now != self.identity:
                try:
                    finished_run(self.given)
                except StoreError as exc:
                    raise Refused(HTTPStatus.CONFLICT, f"{exc}; the run changed on disk since explore started "
                                                       f"(a re-run?): reload the page when it has finished") from None
                self.identity = now
                self._drop_caches()
            return now

    def confirm(self, identity: tuple) -> None:
        """Before an answer is sent: the run on disk is still the one the answer was read from.

        Raises
        ------
        Refused
            409 when it changed while the answer was read (it could mix two runs).
        """
        if self.run_identity() != identity:
            raise Refused(HTTPStatus.CONFLICT, f"run dir {self.given}: the run changed on disk while this answer "
                                               f"was read (a re-run?); reload the page")

    # -- lazily loaded data -------------------------------------------------------------------
    @property
    def store(self):
        """The attention store (opened once, read map by map)."""
        with self._lock:
            if self._store is None:
                self._store = open_attention_store(self.layout.attention)
            return self._store

    @property
    def exact_on_demand(self):
        """The run's :class:`~attnclust.recompute.ExactOnDemand`: whether (and how) maps outside a compact store's
        exact sample are recomputed exactly."""
        store = self.store
        with self._lock:
            if self._exact is None:
                self._exact = ExactOnDemand(self.layout, store, enabled=self._exact_on_demand, note=self._note)
            return self._exact

    @property
    def features(self):
        """``features.parquet`` indexed by ``feature_id``."""
        with self._lock:
            if self._features is None:
                self._features = read_features(self.root).set_index("feature_id", drop=False)
            return self._features

    def _search_table(self):
        features = self.features
        with self._lock:
            if self._search is None:
                import pandas as pd

                ids = pd.unique(features["example_id"].astype(str))
                table = pd.DataFrame({"example_id": ids, "question": ""})
                path = self.layout.examples
                if path.exists() and not path.is_symlink():
                    ex = pd.read_parquet(path, columns=["id", "question"]).astype(str)
                    table = table.merge(ex.rename(columns={"id": "example_id"}), on="example_id", how="left",
                                        suffixes=("_", ""))[["example_id", "question"]].fillna("")

                table["question"] = table["question"].map(plain_text)  # shown in the page: no bidi controls
                table["_text"] = table["question"].str.lower()
                table["_id"] = table["example_id"].str.lower()
                self._search = table
            return self._search

    # -- answers ------------------------------------------------------------------------------
    def heads_json(self) -> bytes:
        """``heads.parquet`` as a JSON list of records (NaN as ``null``).

        Returns
        -------
        bytes
        """
        with self._lock:
            if self._heads is None:
                heads = read_table(self.layout.table("heads"), fix="re-run 'attnclust report' for this run")
                heads = heads.sort_values(["layer", "head"])
                self._heads = heads.to_json(orient="records").encode() + b"\n"
            return self._heads

    def search(self, q: str, limit: int = SEARCH_LIMIT) -> dict:
        """Questions whose text contains ``q`` (case-insensitive) or whose example id starts with ``q``.

        Parameters
        ----------
        q : str
            Text or id; empty lists the first ``limit`` questions.
        limit : int
            At most this many results.

        Returns
        -------
        dict
            ``{"q", "total", "results": [{"example_id", "question", "features": [{"feature_id", "span",
            "seq_len"}]}]}``.
        """
        table = self._search_table()
        needle = q.strip().lower()
        hit = table if not needle else table[table["_id"].str.startswith(needle)
                                             | table["_text"].str.contains(needle, regex=False)]
        features = self.features
        by_example = features.groupby(features["example_id"].astype(str))
        results = []
        for row in hit.head(limit).itertuples(index=False):
            rows = by_example.get_group(row.example_id)
            results.append({"example_id": row.example_id, "question": row.question,
                            "features": [{"feature_id": int(f), "span": int(s), "seq_len": int(n)}
                                         for f, s, n in zip(rows["feature_id"], rows["span"], rows["seq_len"])]})
        return {"q": q, "total": len(hit), "results": results}

    def questions(self) -> dict[str, str]:
        """Question text by example id (``""`` where ``examples.parquet`` has none); made once, with the search table
        (every ``/api/map`` asks for one question)."""
        table = self._search_table()
        with self._lock:
            if self._questions is None:
                self._questions = dict(zip(table["example_id"], table["question"]))
            return self._questions

    def feature_list(self, sort: str = "longest", limit: int = SEARCH_LIMIT) -> dict:
        """Features without their maps, the longest first (ties by id) or by id.

        Parameters
        ----------
        sort : {"longest", "id"}
        limit : int
            At most this many results.

        Returns
        -------
        dict
            ``{"sort", "total", "results": [{"feature_id", "example_id", "question", "span", "seq_len"}]}``.
        """
        features = self.features.reset_index(drop=True)
        order = (features.sort_values(["seq_len", "feature_id"], ascending=[False, True]) if sort == "longest"
                 else features.sort_values("feature_id"))
        questions = self.questions()
        results = [{"feature_id": int(f), "example_id": str(e), "question": questions.get(str(e), ""),
                    "span": int(s), "seq_len": int(n)}
                   for f, e, s, n in zip(order["feature_id"][:limit], order["example_id"][:limit],
                                         order["span"][:limit], order["seq_len"][:limit])]
        return {"sort": sort, "total": len(features), "results": results}

    def map_index(self, feature: str | None, layer: str | None, head: str | None) -> tuple[int, int, int]:
        """Check the query's ``feature``, ``layer`` and ``head`` against the store.

        Returns
        -------
        tuple of int
            (feature, layer, head).

        Raises
        ------
        Refused
            400 naming the parameter, the value and the allowed range.
        """
        store = self.store
        out = []
        for name, value, n in (("feature", feature, store.n_features), ("layer", layer, store.n_layers),
                               ("head", head, store.n_heads)):
            if value is None or not re.fullmatch(r"[0-9]{1,9}", value.strip()) or not 0 <= int(value) < n:
                raise Refused(HTTPStatus.BAD_REQUEST, f"{name}={value!r}: expected an integer in 0..{n - 1}")
            out.append(int(value))
        return out[0], out[1], out[2]

    def map_source(self, feature: int) -> str:
        """Where :meth:`read_map` reads ``feature``'s maps: ``full``, ``exact sample`` (a compact store's exact maps
        of the feature), ``recomputed`` (not in the sample: exact, recomputed by one forward of the run's model,
        :attr:`exact_on_demand`) or ``compact`` (its approximate maps, when they are not recomputed). Asked after
        :meth:`read_map`, it names what that read: a model that failed to load there turned recomputing off for
        good."""
        store = self.store
        if store.exact is not None and feature in set(store.exact_features.tolist()):
            return "exact sample"
        if store.mode == "compact" and self.exact_on_demand.status:
            return "recomputed"
        return store.mode

    def read_map(self, feature: int, layer: int, head: int) -> tuple:
        """One map at its full true length and its tokens: exact where the store holds it exactly (a full store,
        or a compact store's exact sample), exact as recomputed by one forward of the run's model for a compact
        store's other features (:attr:`exact_on_demand`), otherwise the compact store's approximation
        (:meth:`map_source`, asked after this, says which).

        Returns
        -------
        weights : numpy.ndarray of float32, shape (query, key) = (n, n)
        tokens : list of str, length n
        """
        import numpy as np

        source = self.map_source(feature)
        maps = self.exact_on_demand.maps(feature) if source == "recomputed" else None  # None: the model did not load
        if source == "exact sample":
            weights = self.store.read_exact(feature)[layer, head]
        elif maps is not None:
            weights = maps[layer, head].astype(np.float32)
        else:
            weights = self.store.read_map(feature, layer, head)
        # a decoder's byte-level tokens as readable labels
        return weights, kind_of(self.features).token_labels(self.features.loc[feature, "tokens"])

    def map_json(self, feature: int, layer: int, head: int, weighting: str = "weights") -> dict:
        """``/api/map`` as JSON: ``feature``, ``layer``, ``head``, ``example_id``, ``seq_len``, ``tokens``,
        ``segment_ids``, ``question``, ``answer`` (the gold answer's inclusive token span ``[start, end]``, or
        ``null`` when it is not in this feature or the run has no answer positions), ``weights`` (query rows of
        key weights, rounded to :data:`MAP_DECIMALS`), ``source`` (:meth:`map_source`: ``full``, ``exact
        sample``, ``recomputed``: exact, recomputed by one forward of the run's model, or ``compact``), ``kept_mass``:
        for a compact map the share of the exact row mass its rows hold, averaged over them as measured at
        extraction (:meth:`~attnclust.store.AttentionStore.read_kept_mass`), ``null`` for an exact map, ``map_error``:
        for a compact map its mean row L1 distance from the exact map as measured at extraction
        (:meth:`~attnclust.store.AttentionStore.read_map_error`; ``null`` for an exact map or a store that did not
        measure it), ``exact_on_demand``: on a compact store whether maps outside its exact sample are recomputed
        (``true``) or not (``false``, and ``exact_on_demand_reason`` says why in one line), ``null`` for a full
        store, ``weighting`` (:data:`attnclust.maps.WEIGHTINGS`: with ``"norm"``, ``weights`` are each query row's
        shares of the norm it moves, from the store's value norms) and ``value_norms`` (whether the store holds them:
        whether ``weighting=norm`` can be asked)."""
        import numpy as np

        weights, tokens = self.read_map(feature, layer, head)
        weights = self.store.reweigh(weights, feature, layer, head, weighting)
        source = self.map_source(feature)  # after the read: what it read
        kept = round(self.store.read_kept_mass(feature, layer, head), 4) if source == "compact" else None
        error = self.store.read_map_error(feature, layer, head) if source == "compact" else float("nan")
        exact = self.exact_on_demand
        row = self.features.loc[feature]
        a, b = int(row.get("answer_start_token", -1)), int(row.get("answer_end_token", -1))
        return {"feature": feature, "layer": layer, "head": head, "example_id": str(row["example_id"]),
                "seq_len": len(tokens), "tokens": tokens, "segment_ids": [int(s) for s in row["segment_ids"]],
                "question": self.questions().get(str(row["example_id"]), ""),
                "answer": [a, b] if 0 <= a <= b < len(tokens) else None,
                "weights": np.round(weights.astype(np.float64), MAP_DECIMALS).tolist(),
                "source": source, "kept_mass": kept, "map_error": round(error, 4) if np.isfinite(error) else None,
                "exact_on_demand": exact.status,
                "exact_on_demand_reason": exact.reason if exact.status is False else None,
                "weighting": weighting, "value_norms": self.store.value_norm is not None}

    def map_png(self, feature: int, layer: int, head: int, weighting: str = "weights") -> bytes:
        """``/api/map?format=png``: the map drawn at full length with token labels (matplotlib Agg).

        Returns
        -------
        bytes
            A PNG file.
        """
        import numpy as np
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        weights, tokens = self.read_map(feature, layer, head)
        weights = self.store.reweigh(weights, feature, layer, head, weighting)
        source = self.map_source(feature)  # after the read: what it read
        n = len(tokens)
        side = min(40.0, max(4.0, 1.5 + 0.12 * n))
        fig = Figure(figsize=(side + 0.8, side))
        FigureCanvasAgg(fig)
        ax = fig.subplots()
        im = ax.imshow(weights, cmap="viridis", interpolation="nearest", vmin=0.0)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
        labels = [t.replace("$", r"\$") for t in tokens]
        ax.set_xticks(np.arange(n), labels, rotation=90, fontsize=6)
        ax.set_yticks(np.arange(n), labels, fontsize=6)
        kept = f": its rows keep {self.store.read_kept_mass(feature, layer, head):.3g} of their mass on average" \
            if source == "compact" else ""
        what = {"full": "", "recomputed": ", exact map recomputed by one forward of the run's model"}.get(
            source, f", {source} map{kept}")
        moved = ", norm-weighted: each row's shares of the norm it moves" if weighting == "norm" else ""
        ax.set_title(f"feature {feature} L{layer}H{head} ({n} tokens){what}{moved}", fontsize=9)
        ax.set_xlabel("key")
        ax.set_ylabel("query")
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100, bbox_inches="tight", metadata={"Software": None})
        return buf.getvalue()

    def safe_file(self, rel: str) -> Path:
        """The file ``rel`` (relative, ``/``-separated) inside the run directory, after every check.

        Raises
        ------
        Refused
            403 when a component is ``..``/``.``/empty or a symbolic link, or the file resolves outside the
            run directory; 404 when it is not a regular file.
        """
        parts = rel.split("/")
        if any(p in ("", ".", "..") for p in parts):
            raise Refused(HTTPStatus.FORBIDDEN, f"path {rel!r}: refused")
        current = self.root
        for part in parts:
            current = current / part
            if current.is_symlink():
                raise Refused(HTTPStatus.FORBIDDEN, f"path {rel!r}: refused (symbolic link)")
        real = current.resolve()
        if not real.is_relative_to(self.root):
            raise Refused(HTTPStatus.FORBIDDEN, f"path {rel!r}: refused (outside the run directory)")
        if not real.is_file():
            raise Refused(HTTPStatus.NOT_FOUND, f"path {rel!r}: not found")
        return real

    def read_file(self, rel: str) -> bytes:
        """The bytes of :meth:`safe_file` ``(rel)``, opened without following a link."""
        path = self.safe_file(rel)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as fh:
            return fh.read()
