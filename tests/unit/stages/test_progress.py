"""Progress bars of the steps that are not blocks: the cluster fit (k search, KMeans, UMAP), run in this process or
on a Dask worker, and the report (mean maps, sections). Labelled, counted, silent when progress is off."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from attnclust.analysis.atlas import cluster_mean_maps
from attnclust.cluster import fit_clusters, fit_from_store
from attnclust.config import ClusterConfig
from attnclust.executors import DaskExecutor, StepBars
from attnclust.layout import RunLayout
from attnclust.report import ReportSection, render_sections
from attnclust.stages.cluster import _fit_steps
from attnclust.store import create_attention_store, mark_store_complete

from helpers import write_embedding

# k_min..k_max: 8 candidates
AUTO = ClusterConfig(k="auto", k_min=2, k_max=9, pca_components=5, umap=False)


def blobs(n_per: int = 40, dim: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """(map, dim) vectors of 3 well-separated Gaussian blobs and their planted labels."""
    rng = np.random.default_rng(0)
    centres = rng.normal(scale=10.0, size=(3, dim))
    labels = np.repeat(np.arange(3), n_per)
    return (centres[labels] + rng.normal(size=(len(labels), dim))).astype(np.float32), labels


@pytest.mark.slow
def test_k_search_bar_is_labelled_and_counts_every_candidate(capsys):
    x, _ = blobs()
    with StepBars("cluster") as bars:
        fitted = fit_clusters(x, AUTO, on_step=bars)
    err = capsys.readouterr().err
    assert fitted.k_ == 3
    assert "cluster: PCA to 5 dims" in err
    assert "cluster: choosing k 0/8 candidates" in err
    assert "cluster: choosing k 8/8 candidates" in err
    assert "cluster: fitting KMeans k=3" in err
    assert err.index("PCA") < err.index("choosing k") < err.index("fitting KMeans")


def test_umap_step_is_shown(capsys):
    x, _ = blobs()
    with StepBars("cluster") as bars:
        fit_clusters(x, ClusterConfig(k=3, umap=True, umap_neighbors=10, pca_components=None), on_step=bars)
    err = capsys.readouterr().err
    assert "cluster: UMAP on 120 maps" in err
    assert "choosing k" not in err  # k was given


@pytest.mark.slow
def test_progress_off_prints_nothing_and_changes_nothing(capfd):
    x, _ = blobs()
    quiet = fit_clusters(x, AUTO, on_step=StepBars("cluster", progress=False))
    assert capfd.readouterr() == ("", "")
    plain = fit_clusters(x, AUTO)
    assert quiet.k_scores_ == plain.k_scores_
    np.testing.assert_array_equal(quiet.kmeans_.predict(quiet.reduce(x)), plain.kmeans_.predict(plain.reduce(x)))


def test_a_finished_step_keeps_its_time_and_is_not_reopened(capsys):
    with StepBars("report") as bars:
        with bars.step("atlas tables"):
            pass
        bars("atlas tables", 1)  # told again: no second bar
        bars("mean maps", 0, 2, "clusters")
        bars("mean maps", 2, 2, "clusters")
    err = capsys.readouterr().err
    assert "report: atlas tables [" in err
    bars_shown = err.split("\n")  # a closed bar ends its line (updates rewrite it after "\r")
    assert sum("report: atlas tables" in line for line in bars_shown) == 1
    assert "report: mean maps 2/2 clusters |" in err


@pytest.fixture(scope="module")
def dask_client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:
        yield client


@pytest.mark.slow
def test_steps_of_a_fit_on_a_dask_worker_reach_the_driver(tmp_path, capsys, dask_client):
    x, _ = blobs()
    write_embedding(tmp_path, x)
    ctx = SimpleNamespace(executor=DaskExecutor(dask_client, "job-a"), progress=True, job_id="job-a")
    with StepBars("cluster") as bars, _fit_steps(ctx, bars) as on_step:
        assert on_step is not bars  # relayed as Dask events, not called in this process
        fitted = ctx.executor.call(fit_from_store, str(tmp_path), AUTO, "cpu", on_step, key="cluster-fit")
        # every event arrived before the result did: the bar is complete when the call returns
        err = capsys.readouterr().err
    assert fitted.k_ == 3
    assert "cluster: reading 120 maps" in err
    assert "cluster: choosing k 8/8 candidates" in err
    assert "cluster: fitting KMeans k=3" in err


def test_a_quiet_fit_on_a_dask_worker_sends_no_steps(tmp_path, capsys, dask_client):
    ctx = SimpleNamespace(executor=DaskExecutor(dask_client, "job-b"), progress=False, job_id="job-b")
    with StepBars("cluster", progress=False) as bars, _fit_steps(ctx, bars) as on_step:
        assert on_step is None
    assert capsys.readouterr().err == ""


def test_mean_maps_bar_counts_clusters(tmp_path, capsys):
    layout = RunLayout(tmp_path)
    store = create_attention_store(layout.attention, seq_len=np.array([4, 6, 5]), num_layers=1, num_heads=2,
                                   features_per_task=3, attrs={})
    store.attention.with_config({"write_empty_chunks": True})[:] = 0  # a complete store: every shard written
    mark_store_complete(layout.attention)
    maps = pd.DataFrame({"feature_id": np.repeat(np.arange(3), 2), "layer": 0, "head": np.tile([0, 1], 3),
                         "cluster": [0, 1, 2, 0, 1, 2]})
    with StepBars("report") as bars:
        means = cluster_mean_maps(layout, maps, 3, grid=4, on_step=bars)
    assert means.shape == (3, 4, 4)
    assert "report: mean maps 3/3 clusters" in capsys.readouterr().err


def test_writing_html_bar_counts_sections_including_those_left_out(capsys):
    sections = [ReportSection(name=f"s{i}", title=f"S{i}", order=i, template="<p>{{ n }}</p>",
                              build=lambda inputs, i=i: None if i == 1 else {"n": i}) for i in range(3)]
    with StepBars("report") as bars:
        rendered = render_sections(SimpleNamespace(), sections, on_step=bars)
    assert [s.name for s in rendered] == ["s0", "s2"]
    assert "report: writing HTML 3/3 sections" in capsys.readouterr().err
    render_sections(SimpleNamespace(), sections, on_step=StepBars("report", progress=False))
    assert capsys.readouterr().err == ""
