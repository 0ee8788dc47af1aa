import numpy as np
import pytest

from attnclust.errors import BackendUnavailable, ConfigError
from attnclust.featurize.pooled import pool_maps
from attnclust.featurize.resnet import check_weights, embed_maps, load_resnet
from attnclust.synthetic import planted_map


def test_pooled_is_length_invariant_for_the_same_pattern():
    rng = np.random.default_rng(0)
    a = pool_maps(planted_map("uniform", 40, rng=rng, noise=0)[None], grid=8)
    b = pool_maps(planted_map("uniform", 96, rng=rng, noise=0)[None], grid=8)
    assert a.shape == (1, 64)
    np.testing.assert_allclose(a, b, rtol=1e-5)
    # rows of the pooled map sum to 1 before the square root
    np.testing.assert_allclose((a.reshape(8, 8) ** 2).sum(1), 1.0, rtol=1e-5)


def test_pooled_separates_previous_from_next():
    rng = np.random.default_rng(0)
    prev = pool_maps(planted_map("previous", 64, rng=rng, noise=0)[None], grid=16)
    nxt = pool_maps(planted_map("next", 64, rng=rng, noise=0)[None], grid=16)
    prev2 = pool_maps(planted_map("previous", 50, rng=rng, noise=0)[None], grid=16)
    assert np.linalg.norm(prev - prev2) < np.linalg.norm(prev - nxt)


def test_resnet_random_weights_shapes_and_determinism():
    rng = np.random.default_rng(0)
    maps = np.stack([planted_map(k, 30, rng=rng) for k in ("cls", "previous", "uniform")])
    net = load_resnet("resnet18", "none")
    a = embed_maps(net, maps, image_size=64, batch_size=2)
    b = embed_maps(net, maps, image_size=64, batch_size=3)
    assert a.shape == (3, 512) and a.dtype == np.float32
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_resnet_weights_from_a_saved_file(tmp_path):
    import torch
    import torchvision

    torch.manual_seed(1)
    path = tmp_path / "r18.pth"
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), path)
    net = load_resnet("resnet18", str(path))
    expected = torch.load(path, weights_only=True)["conv1.weight"]
    assert torch.equal(net.conv1.weight.detach(), expected)
    with pytest.raises(ConfigError, match=r"not a resnet50 state dict \(RuntimeError: [^\n]*size mismatch"):
        load_resnet("resnet50", str(path))


def test_missing_weights_file_and_unreachable_imagenet(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"featurize\.weights .*no such file"):
        check_weights("resnet18", str(tmp_path / "missing.pth"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    import torch.hub

    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "torch_home" / "hub"))

    def offline(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", offline)
    with pytest.raises(BackendUnavailable, match=r"imagenet: downloading resnet18-.*needs the internet or a "
                                                 r"TORCH_HOME cache"):
        check_weights("resnet18", "imagenet")
    with pytest.raises(BackendUnavailable, match=r"not in the torchvision cache"):
        check_weights("resnet18", "imagenet", download=False)
