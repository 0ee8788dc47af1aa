"""``featurize.precision``: how it resolves, that bf16 vectors agree with float32 ones, and that the featurize
stage's fingerprint tells them apart."""

from pathlib import Path

import numpy as np
import pytest

from attnclust.config import FeaturizeConfig, JobConfig, default_job_path, load_job
from attnclust.errors import ConfigError, StoreError
from attnclust.featurize import get_featurizer
from attnclust.featurize import resnet as rn
from attnclust.layout import RunLayout
from attnclust.stages.base import RunContext, fingerprint_of
from attnclust.stages.featurize import FeaturizeStage
from attnclust.synthetic import PATTERNS, planted_map


@pytest.mark.parametrize("setting, device, native, expected", [
    ("auto", "cuda", False, "float16"),
    ("auto", "cuda:1", True, "float16"),
    ("auto", "cpu", True, "bfloat16"),
    ("auto", "cpu", False, "float32"),
    ("float32", "cuda", True, "float32"),
    ("float32", "cpu", True, "float32"),
    ("bfloat16", "cpu", False, "bfloat16"),  # forced: runs, emulated, on a CPU without native bf16
    ("bfloat16", "cuda", False, "bfloat16"),
    ("float16", "cuda", False, "float16"),
])
def test_resolution_rules(monkeypatch, setting, device, native, expected):
    monkeypatch.setattr(rn, "cpu_has_native_bf16", lambda: native)
    assert rn.resolve_precision(setting, device) == expected


def test_resolve_rejects_an_unknown_setting_naming_the_key():
    with pytest.raises(ConfigError, match=r"featurize\.precision: got 'fp16'; allowed: auto \| float32 \| bfloat16"):
        rn.resolve_precision("fp16", "cpu")


def test_native_bf16_needs_the_instructions_not_only_onednn(monkeypatch):
    import torch

    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"avx512_f": True, "avx512_bf16": False})
    assert rn.cpu_has_native_bf16() is False  # AVX-512 without BF16: oneDNN emulates bf16, slower than float32
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"avx512_f": True, "amx_bf16": True})
    assert rn.cpu_has_native_bf16() is torch.ops.mkldnn._is_mkldnn_bf16_supported()
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert rn.cpu_has_native_bf16() is False


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="reads the CPU flags from /proc/cpuinfo")
def test_native_bf16_agrees_with_the_cpu_flags():
    import platform

    import torch

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86 flags only")
    flags = set(Path("/proc/cpuinfo").read_text().split())
    native = bool(flags & {"avx512_bf16", "amx_bf16"}) and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert rn.cpu_has_native_bf16() == native


def test_config_validates_precision_naming_the_key():
    assert FeaturizeConfig().precision == "auto"
    assert load_job(default_job_path(), ["featurize.precision=bfloat16"]).featurize.precision == "bfloat16"
    with pytest.raises(ConfigError, match=r"config featurize\.precision: got 'bf16'; allowed: auto \| float32 \| "
                                          r"bfloat16"):
        load_job(default_job_path(), ["featurize.precision=bf16"])


def _conv_dtypes(net):
    """Record the dtype of the first convolution's output on every forward; returns (list, handle)."""
    seen = []
    return seen, net.conv1.register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))


def test_bf16_vectors_agree_with_float32_and_come_back_float32():
    import torch

    rng = np.random.default_rng(0)
    maps = np.stack([planted_map(kind, 40, rng=rng) for kind in PATTERNS])  # (map, query, key)
    featurizer = get_featurizer("resnet")
    net = rn.load_resnet("resnet18", "none", "cpu")
    out = {}
    for precision in ("float32", "bfloat16"):
        cfg = FeaturizeConfig(method="resnet", weights="none", image_size=64, batch_size=4, precision=precision)
        seen, handle = _conv_dtypes(net)
        try:
            out[precision] = featurizer.embed(maps, cfg, "cpu")
        finally:
            handle.remove()
        assert seen and set(seen) == {getattr(torch, precision)}  # the net really ran at that precision
        assert out[precision].dtype == np.float32 and out[precision].shape == (len(PATTERNS), 512)
    a, b = out["float32"], out["bfloat16"]
    assert not np.array_equal(a, b)
    # random-init ResNet vectors of different maps already have cosine ~0.98-0.996, so compare them centred on
    # the float32 mean: only the part that tells maps apart counts
    mean = a.mean(0)
    ac, bc = a - mean, b - mean
    cos = (ac * bc).sum(1) / np.linalg.norm(ac, axis=1) / np.linalg.norm(bc, axis=1)
    assert cos.min() > 0.99, cos
    plain = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert plain.min() > 0.999, plain
    # each bf16 vector is nearest to the float32 vector of its own map
    dist = np.linalg.norm(b[:, None, :] - a[None, :, :], axis=-1)
    np.testing.assert_array_equal(dist.argmin(1), np.arange(len(PATTERNS)))


def _context(root: Path, cfg: JobConfig, backend: str = "cpu") -> RunContext:
    return RunContext(layout=RunLayout(root), cfg=cfg, job_id="t", backend=backend, executor=None, progress=False,
                      fingerprints={"extract": "0" * 16})


def _fingerprint(tmp_path, featurize: dict, backend: str = "cpu") -> dict:
    return fingerprint_of(FeaturizeStage(), _context(tmp_path / "run", JobConfig.from_dict({"featurize": featurize}),
                                                     backend))


def test_fingerprint_follows_the_resolved_precision(tmp_path, monkeypatch):
    base = {"method": "resnet", "weights": "none"}
    fp32 = _fingerprint(tmp_path, {**base, "precision": "float32"})
    bf16 = _fingerprint(tmp_path, {**base, "precision": "bfloat16"})
    assert fp32 != bf16
    assert fp32["identity"]["featurizer_precision"] == "float32"
    assert bf16["identity"]["featurizer_precision"] == "bfloat16"
    # the same setting, auto, on a CPU with and without native bf16: different vectors, different fingerprints
    monkeypatch.setattr(rn, "cpu_has_native_bf16", lambda: True)
    auto_native = _fingerprint(tmp_path, {**base, "precision": "auto"})
    monkeypatch.setattr(rn, "cpu_has_native_bf16", lambda: False)
    auto_plain = _fingerprint(tmp_path, {**base, "precision": "auto"})
    assert auto_native != auto_plain
    assert auto_native["identity"]["featurizer_precision"] == "bfloat16"
    assert auto_plain["identity"]["featurizer_precision"] == "float32"
    assert _fingerprint(tmp_path, {**base, "precision": "auto"}, "gpu")["identity"]["featurizer_precision"] == \
        "float16"


def test_other_featurizers_ignore_precision(tmp_path):
    for method in ("profile", "pooled"):
        a = _fingerprint(tmp_path, {"method": method, "precision": "float32"})
        b = _fingerprint(tmp_path, {"method": method, "precision": "bfloat16"})
        assert a == b
        assert not any(k.startswith("featurizer_") for k in a["identity"])
        assert "featurize.precision" not in a["keys"]


def test_stage_records_the_precision_and_refuses_vectors_of_another(tmp_path):
    import zarr

    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor
    from attnclust.synthetic import write_planted_store

    planted = write_planted_store(tmp_path / "run", rng=np.random.default_rng(0), n_features=2, n_layers=1,
                                  n_heads=2, lengths=(8, 12), features_per_task=2)
    settings = ["featurize.method=resnet", "featurize.weights=none", "featurize.image_size=32"]
    run_job(load_job(None, [*settings, "featurize.precision=float32"]), planted.root, stages=("featurize",),
            executor=SerialExecutor(), progress=False)
    group = zarr.open_group(str(RunLayout(planted.root).embedding), mode="r")
    assert group.attrs["resolved"] == {"precision": "float32"} and group.attrs["complete"]
    with pytest.raises(StoreError, match=r"featurize\.precision: 'float32' -> 'bfloat16'.*featurizer precision "
                                         r"changed"):
        run_job(load_job(None, [*settings, "featurize.precision=bfloat16"]), planted.root, stages=("featurize",),
                executor=SerialExecutor(), progress=False)


def test_tasks_get_the_precision_the_driver_resolved(tmp_path, monkeypatch):
    """``auto`` is resolved once, on the driver: a worker on another kind of CPU runs what the fingerprint says."""
    from attnclust.synthetic import write_planted_store

    cfg = load_job(None, ["featurize.method=resnet", "featurize.weights=none", "featurize.precision=auto"])
    for native, expected in ((True, "bfloat16"), (False, "float32")):
        planted = write_planted_store(tmp_path / expected, rng=np.random.default_rng(0), n_features=4, n_layers=1,
                                      n_heads=2, lengths=(8, 12), features_per_task=2)
        monkeypatch.setattr(rn, "cpu_has_native_bf16", lambda native=native: native)
        blocks, _ = FeaturizeStage().plan(_context(planted.root, cfg), set())
        assert len(blocks) == 2 and {b[2].precision for b in blocks} == {expected}
        assert all(b[2].replace(precision="auto") == cfg.featurize for b in blocks)


@pytest.mark.parametrize("setting, device, expected", [
    ("auto", "cpu", 16), ("auto", "cuda", 64), ("auto", "cuda:1", 64), (5, "cpu", 5), (128, "cuda", 128)])
def test_batch_size_resolution(setting, device, expected):
    assert rn.resolve_batch_size(setting, device) == expected


@pytest.mark.parametrize("value, message", [
    ("0", r"featurize\.batch_size: got 0; allowed: an integer >= 1 or 'auto'"),
    ("many", r"featurize\.batch_size: got 'many'; allowed: an integer >= 1 or 'auto'")])
def test_batch_size_setting_is_validated(value, message):
    with pytest.raises(ConfigError, match=message):
        load_job(None, [f"featurize.batch_size={value}"])
    assert load_job(None, ["featurize.batch_size=12"]).featurize.batch_size == 12
    assert load_job(None, []).featurize.batch_size == "auto"


def test_embed_maps_feeds_the_net_the_normalised_image_built_pixel_by_pixel():
    """The image the net sees, built one map and one channel at a time from the documented recipe (scaled by the
    map's maximum, bilinear to image_size, (x - mean[c]) / std[c] in each of 3 channels): the same vectors."""
    import torch
    import torch.nn.functional as F

    rng = np.random.default_rng(4)
    maps = np.stack([planted_map(p, 23, rng=rng) for p in ("cls", "previous", "uniform", "next", "cls")])
    net = rn.load_resnet("resnet18", "none")
    got = rn.embed_maps(net, maps, image_size=48, batch_size=2)
    images = torch.empty((len(maps), 3, 48, 48))
    for i, m in enumerate(maps):
        resized = F.interpolate(torch.from_numpy(m / m.max())[None, None].float(), size=(48, 48), mode="bilinear",
                                align_corners=False)[0, 0]
        for c in range(3):
            images[i, c] = (resized - rn.IMAGENET_MEAN[c]) / rn.IMAGENET_STD[c]
    with torch.inference_mode():
        want = net(images.contiguous(memory_format=torch.channels_last)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
