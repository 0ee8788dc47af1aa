"""Python API for notebooks: run a job, open an output directory as xarray and pandas."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import pandas as pd

from .config import JobConfig, load_job
from .errors import StoreError
from .layout import RunLayout
from .store.contract import DIMS, open_attention_store, read_features, read_table

__all__ = ["Output", "open_output", "run"]


def run(job: str | Path | JobConfig | None = None, *, out: str | Path, overrides: list[str] | None = None,
        **kwargs):
    """Run a job (a YAML path, a :class:`JobConfig`, or ``None`` for the demo job) into ``out``.

    Call it under ``if __name__ == "__main__":`` in scripts: the embedded Dask cluster starts worker processes.

    Parameters
    ----------
    job : str, pathlib.Path, JobConfig or None
        A job YAML file, a validated job, or ``None`` for the demo job (``jobs/demo.yaml``).
    out : str or pathlib.Path
        The output directory: new, empty, or an earlier attnclust run.
    overrides : list of str, optional
        ``section.key=value`` settings applied over a job file (as ``--set``); ignored for a :class:`JobConfig`.
    **kwargs
        Passed to :func:`attnclust.pipeline.run_job`: ``stages``, ``scheduler``, ``force``, ``progress``,
        ``client``, ``n_workers`` ...

    Returns
    -------
    attnclust.pipeline.JobResult
        The output directory, the job id and each stage's record; ``.report`` is the path of ``report.html``.

    Examples
    --------
    >>> result = attnclust.run("jobs/demo.yaml", out="runs/demo", overrides=["data.max_examples=20"])  # doctest: +SKIP
    """
    from .pipeline import run_job  # lazy: the stages load when a job runs, not with import attnclust

    cfg = job if isinstance(job, JobConfig) else load_job(job, overrides)
    return run_job(cfg, Path(out), **kwargs)


class Output:
    """An output directory opened for analysis; tables load lazily on first access.

    Parameters
    ----------
    path : str or pathlib.Path
        The run directory (at least ``attention.zarr`` and ``features.parquet``, the store contract).

    Attributes
    ----------
    path : pathlib.Path
        The run directory.
    layout : attnclust.layout.RunLayout
        Every path of the run.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.layout = RunLayout(self.path)
        self._store = open_attention_store(self.layout.attention)

    def _table(self, name: str) -> pd.DataFrame:
        path = self.layout.table(name)
        if not path.exists():
            raise StoreError(f"{path}: not found; run the stage that writes it (attnclust run ... --out "
                             f"{self.path})")
        return read_table(path, fix=f"re-run the stage that writes it (attnclust run ... --out {self.path})")

    @cached_property
    def attention(self):
        """``xarray.DataArray`` (feature, layer, head, query, key), dask-backed, with ``seq_len`` and
        ``example_id`` coordinates on ``feature``. A compact store's maps are decoded as
        :meth:`~attnclust.store.AttentionStore.read_map` decodes them (each row's largest weights, and the mass
        it dropped spread over the other keys where the store says so); ``attrs["compact"]["kept"]`` holds the
        measured share of the row mass they keep and ``attrs["compact"]["error"]`` how far they are from the exact
        maps."""
        import dask.array as da
        import xarray as xr

        arr = da.from_zarr(self._store.attention)
        if self._store.mode == "compact":  # square-root codes, whole rows in every chunk
            code, seq_len = self._store.compact_code, self._store.seq_len

            def decode(block, block_info=None):  # each chunk: whole rows of some features
                first = block_info[0]["array-location"][0][0] if block_info else 0
                return code.decode(block, lengths=seq_len[first:first + block.shape[0]])

            arr = arr.map_blocks(decode, dtype="float32")
        elif self._store.scale != 1.0:  # a uint8 store: weights = stored * scale
            arr = arr.astype("float32") * self._store.scale
        feats = self.features
        return xr.DataArray(arr, dims=DIMS, name="attention", coords={
            "feature": feats["feature_id"].to_numpy(), "seq_len": ("feature", self._store.seq_len),
            "example_id": ("feature", feats["example_id"].to_numpy()),
            "layer": range(arr.shape[1]), "head": range(arr.shape[2])}, attrs=dict(self._store.attrs))

    @cached_property
    def features(self) -> pd.DataFrame:
        """``features.parquet``: one row per feature (store row)."""
        return read_features(self.path)

    @cached_property
    def maps(self) -> pd.DataFrame:
        """``maps.parquet``: one row per (feature, layer, head): cluster, UMAP position, statistics."""
        return self._table("maps")

    @cached_property
    def heads(self) -> pd.DataFrame:
        """``heads.parquet``: one row per (layer, head): cluster shares, mean statistics, head analyses."""
        return self._table("heads")

    @cached_property
    def clusters(self) -> pd.DataFrame:
        """``clusters.parquet``: one row per cluster: size, medoid, mean statistics, description."""
        return self._table("clusters")

    @cached_property
    def predictions(self) -> pd.DataFrame:
        """``predictions.parquet``: one row per question: the model's answer, null odds, EM/F1."""
        return self._table("predictions")

    @cached_property
    def qa(self) -> dict:
        """``qa_scores.json``: whether the QA head was trained, the settings and the official SQuAD 2.0 scores."""
        import json

        path = self.layout.qa_scores
        if not path.exists():
            raise StoreError(f"{path}: not found; run 'attnclust extract' for this output dir")
        return json.loads(path.read_text())

    def map(self, feature_id: int, layer: int, head: int):
        """One map at its true length, as a labelled ``xarray.DataArray`` (query, key) with token coords.

        Parameters
        ----------
        feature_id : int
            The feature (``feature_id`` of :attr:`features`, the row of the store).
        layer, head : int
            The head, counted from 0.

        Returns
        -------
        xarray.DataArray
            (query, key) weights of the feature's ``seq_len`` tokens, with ``query_token`` and ``key_token``
            coordinates.
        """
        n = int(self._store.seq_len[feature_id])
        tokens = list(self.features.set_index("feature_id").at[feature_id, "tokens"])
        da_ = self.attention.isel(feature=feature_id, layer=layer, head=head, query=slice(0, n),
                                  key=slice(0, n)).compute()
        return da_.assign_coords(query_token=("query", tokens), key_token=("key", tokens))

    # Inline views (attnclust/report/views.py): drawn in a notebook cell by the report's own template and script.

    def grid_view(self, *, examples: int = 1):
        """The report's layer x head grid, drawn inline in Jupyter; clicking a cell opens the head's panel.

        Parameters
        ----------
        examples : int, optional
            Sampled questions whose maps of every head the head panels show (0: none, the smallest page).

        Returns
        -------
        attnclust.report.views.GridView
            ``_repr_html_()`` (self-contained HTML), ``figure()`` (matplotlib).
        """
        from .report.views import grid_view  # lazy: pulls matplotlib and jinja2, which import attnclust does not need

        return grid_view(self, examples=examples)

    def head_view(self, layer: int, head: int, *, examples: int = 1):
        """One head's panel of the report, drawn inline: cluster mix, roles, measures and example maps.

        Parameters
        ----------
        layer, head : int
            The head, counted from 0.
        examples : int, optional
            The head's maps shown, those nearest its dominant cluster's centre first.

        Returns
        -------
        attnclust.report.views.HeadView
            ``_repr_html_()`` (self-contained HTML), ``figure()`` (matplotlib).

        Raises
        ------
        attnclust.AttnclustError
            ``layer`` or ``head`` is out of the run's range (the message gives it).
        """
        from .report.views import head_view  # lazy: pulls matplotlib and jinja2 (as grid_view)

        return head_view(self, layer, head, examples=examples)

    def map_view(self, feature_id: int, layer: int, head: int, *, weighting: str = "weights"):
        """One map with its tokens, drawn inline as the report draws it (hover a cell for the tokens and weight).

        Parameters
        ----------
        feature_id : int
            The feature (``feature_id`` of :attr:`features`, the row of the store).
        layer, head : int
            The head, counted from 0.
        weighting : {"weights", "norm"}
            Shown first and drawn by ``figure()``: the attention weights, or each query row's shares of the norm it
            moves (weight times each key's value-vector norm, Kobayashi et al. 2020). Where the store holds the
            norms the inline view toggles between the two.

        Returns
        -------
        attnclust.report.views.MapView
            ``weights`` (query, key) and ``tokens``; ``_repr_html_()`` (self-contained HTML), ``figure()``.

        Raises
        ------
        attnclust.AttnclustError
            ``feature_id``, ``layer`` or ``head`` is out of the run's range (the message gives it).
        """
        from .report.views import map_view  # lazy: pulls matplotlib and jinja2 (as grid_view)

        return map_view(self, feature_id, layer, head, weighting=weighting)


def open_output(path: str | Path) -> Output:
    """Open an output directory (needs at least ``attention.zarr`` and ``features.parquet``).

    Parameters
    ----------
    path : str or pathlib.Path
        A finished run's output directory, or a store written by another tool.

    Returns
    -------
    Output
        The run: ``attention`` as a lazy ``xarray.DataArray``, the tables as pandas ``DataFrame``.
    """
    return Output(path)
