"""True GPU runs (marked ``gpu``; skipped without a usable CUDA device, cupy and cuml)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

pytestmark = pytest.mark.gpu


def test_gpu_job_on_local_cuda_cluster_matches_cpu_clusters(tmp_path, tiny_bert_dir, small_squad):
    from sklearn.metrics import adjusted_rand_score

    from attnclust.config import JobConfig
    from attnclust.pipeline import run_job

    raw = {"data": {"path": str(small_squad)}, "model": {"name": str(tiny_bert_dir)},
           "cluster": {"k": 3, "umap": True, "umap_neighbors": 5}}
    gpu = run_job(JobConfig.from_dict({**raw, "backend": "gpu"}), tmp_path / "gpu", runtime="local-cuda",
                  progress=False)
    cpu = run_job(JobConfig.from_dict({**raw, "backend": "cpu"}), tmp_path / "cpu", n_workers=1, progress=False)
    assert gpu.stages["cluster"]["backend"] == "gpu"
    a = pd.read_parquet(gpu.out / "maps.parquet")
    b = pd.read_parquet(cpu.out / "maps.parquet")
    # fp16 maps and cuML are not bit-equal to CPU: compare the clustering, by a threshold
    assert adjusted_rand_score(a["cluster"], b["cluster"]) > 0.5
    assert np.isfinite(a[["umap_x", "umap_y"]].to_numpy()).all()


def test_resnet_featurizer_on_cuda_matches_cpu():
    import torch

    from attnclust.featurize.resnet import embed_maps, load_resnet
    from attnclust.synthetic import planted_map

    rng = np.random.default_rng(0)
    maps = np.stack([planted_map(k, 40, rng=rng) for k in ("cls", "previous", "uniform", "sep")])
    torch.manual_seed(0)
    cpu = embed_maps(load_resnet("resnet18", "none", "cpu"), maps, image_size=112, batch_size=4)
    net = load_resnet("resnet18", "none", "cuda")
    net.load_state_dict(load_resnet("resnet18", "none", "cpu").state_dict())
    gpu = embed_maps(net, maps, image_size=112, batch_size=4, device="cuda")
    cos = (cpu * gpu).sum(1) / np.linalg.norm(cpu, axis=1) / np.linalg.norm(gpu, axis=1)
    assert cos.min() > 0.99


@pytest.mark.parametrize("spread", ["keys", "prefix"])
def test_compact_rows_kept_mass_and_row_error_on_cuda_equal_the_cpu_path(spread):
    """compact_maps' torch path (on the GPU) against its NumPy path (on the CPU): the same codes, the same kept
    share and the same row error, for rows with ties at the cut and causal rows."""
    import torch

    from attnclust.store import compact_maps

    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 3, 50, 50)) * 3
    if spread == "prefix":
        logits = np.where(np.tri(50, dtype=bool), logits, -np.inf)
    maps = torch.from_numpy(logits).softmax(-1).float()
    maps[0, 0, :, :4] = maps[0, 0, :, :4].mean(-1, keepdim=True)  # four equal weights in each row
    for cap in (None, 3, 13):
        cpu = compact_maps(maps, mass=0.95, max_keys=cap, with_kept=True, error_spread=spread)
        gpu = compact_maps(maps.cuda(), mass=0.95, max_keys=cap, with_kept=True, error_spread=spread)
        assert torch.equal(cpu[0], gpu[0].cpu())
        np.testing.assert_allclose(gpu[1].cpu().numpy(), cpu[1].numpy(), atol=1e-6)
        np.testing.assert_allclose(gpu[2].cpu().numpy(), cpu[2].numpy(), atol=1e-6)


def test_finetune_on_cuda_uses_mixed_precision_and_learns(tmp_path, tiny_bert_dir):
    from attnclust.config import JobConfig
    from attnclust.qa import finetune_model

    cfg = JobConfig.from_dict({"backend": "gpu", "model": {"name": str(tiny_bert_dir)},
                               "extract": {"max_seq_len": 128, "doc_stride": 32, "max_query_len": 32},
                               "finetune": {"max_steps": 40, "learning_rate": 2e-3, "logging_steps": 2}})
    record = finetune_model(cfg, tmp_path / "model", progress=False)
    losses = [h["loss"] for h in record["loss_history"]]
    assert record["device"] == "cuda" and record["precision"] in ("bf16", "fp16")
    assert np.mean(losses[-4:]) < 0.8 * np.mean(losses[:4])
