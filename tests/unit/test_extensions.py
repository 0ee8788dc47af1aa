"""Every kind of extension is one module and nothing else: a toy featurizer, statistic, head analysis and report
section registered from this test module alone appear in a real run's outputs and HTML (tiny BERT, in-process)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from attnclust.analysis.heads import HEAD_ANALYSES, head_analysis
from attnclust.config import JobConfig
from attnclust.featurize import FEATURIZERS, register_featurizer
from attnclust.layout import RunLayout
from attnclust.maps.stats import STATISTICS, statistic
from attnclust.pipeline import run_job
from attnclust.report import REPORT_SECTIONS, report_section
from attnclust.stages import SerialExecutor


class ToyFeaturizer:
    """Three numbers per map: mass on the first token, on the diagonal, and the map's length."""

    name = "toy_features"
    version = 1
    keys = ()

    def dim(self, cfg) -> int:
        return 3

    def check(self, cfg) -> None:
        pass

    def embed(self, maps, cfg, device="cpu"):
        n = maps.shape[-1]
        return np.stack([maps[:, :, 0].mean(1), np.einsum("mii->m", maps) / n, np.full(len(maps), n)], 1
                        ).astype(np.float32)


@pytest.fixture
def toys():
    register_featurizer(ToyFeaturizer())

    @statistic("toy_last", unit="share", description="toy: attention mass on the last token")
    def _toy_last(batch):
        return batch.a[..., :, -1].mean(-1)

    @head_analysis("toy_depth", columns=("toy_depth",), unit="ratio", description="toy: layer over head + 1")
    def _toy_depth(ctx):
        heads = ctx.maps[["layer", "head"]].drop_duplicates()
        return heads.assign(toy_depth=heads["layer"] / (heads["head"] + 1.0))

    @report_section("toy_section", title="Toy section", order=950, template="<p>{{ n }} maps in a toy</p>")
    def _toy_section(inputs):
        return {"n": len(inputs.maps)}

    yield
    FEATURIZERS.pop("toy_features")
    STATISTICS.pop("toy_last")
    HEAD_ANALYSES.pop("toy_depth")
    REPORT_SECTIONS.pop("toy_section")


@pytest.mark.slow
def test_toy_extensions_reach_the_outputs_and_the_report(toys, tmp_path, tiny_bert_dir, small_squad):
    import zarr

    cfg = JobConfig.from_dict({"name": "toy", "backend": "cpu", "data": {"path": str(small_squad)},
                               "model": {"name": str(tiny_bert_dir)}, "featurize": {"method": "toy_features"},
                               "cluster": {"k": 3, "umap": False, "pca_components": None}})
    out = tmp_path / "run"
    run_job(cfg, out, executor=SerialExecutor(), progress=False)
    layout = RunLayout(out)
    emb = zarr.open_group(str(layout.embedding), mode="r")
    assert emb.attrs["method"] == "toy_features" and emb["embedding"].shape[1] == 3
    maps = pd.read_parquet(layout.table("maps"))
    assert maps["toy_last"].between(0, 1).all() and maps["toy_last"].gt(0).any()
    # the toy featurizer's third number is the map's length: the embedding rows name their maps explicitly
    vectors = pd.DataFrame({"feature_id": emb["feature_id"][:], "layer": emb["layer"][:], "head": emb["head"][:],
                            "n": emb["embedding"][:, 2]}).merge(maps[["feature_id", "layer", "head", "seq_len"]])
    np.testing.assert_array_equal(vectors["n"], vectors["seq_len"])
    heads = pd.read_parquet(layout.table("heads"))
    np.testing.assert_allclose(heads["toy_depth"], heads["layer"] / (heads["head"] + 1.0))
    html = layout.report.read_text()
    assert "Toy section" in html and f"{len(maps)} maps in a toy" in html
    assert "toy: attention mass on the last token" in html and "toy: layer over head + 1" in html
    # a key the featurizer does not read changes nothing: the finished stages are kept
    again = run_job(cfg.replace(featurize=cfg.featurize.replace(grid=8)), out, executor=SerialExecutor(),
                    progress=False)
    assert all(rec.get("skipped") for name, rec in again.stages.items() if name != "total_seconds")
