"""The ``resnet`` featurizer: a torchvision ResNet's penultimate layer on each map seen as an image.

Each map is cropped to its true length, scaled to [0, 1] by its own maximum (per map, never per column),
resized to ``image_size`` with bilinear interpolation on tensors, copied to 3 channels, ImageNet-normalised,
and passed through the network without its classifier (512-d for resnet18/34, 2,048-d for resnet50).

The forward runs at the precision ``featurize.precision`` resolves to (:func:`resolve_precision`): float16
autocast on a GPU, bfloat16 autocast on a CPU with native bf16, float32 otherwise, unless forced; the
preprocessing stays float32 and the vectors come back float32 whatever the precision. The resolved precision is
part of the featurize stage's fingerprint (:meth:`ResnetFeaturizer.identity`), so vectors made in one precision
are never served to a run that asks for another.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import AfterValidator

from .._settings import _auto_or_at_least, _choice, _int, _Model, _setting
from ..errors import BackendUnavailable, ConfigError
from .base import register_featurizer, settings_keys

__all__ = ["ResnetFeaturizer", "ResnetSettings", "autocast_for", "check_weights", "cpu_has_native_bf16",
           "embed_maps", "load_resnet", "resolve_batch_size", "resolve_precision"]

Resolved = Literal["float32", "bfloat16", "float16"]
ResnetArch = Literal["resnet18", "resnet34", "resnet50"]
FeaturizePrecision = Literal["auto", "float32", "bfloat16", "float16"]


class ResnetSettings(_Model):
    """The ``resnet`` featurizer's settings (keys of the ``featurize`` section).

    Parameters
    ----------
    arch, weights, image_size
        ``resnet`` settings; ``weights`` is ``imagenet`` (torchvision download or TORCH_HOME cache), ``none``
        (random init, for tests) or a path to a state dict.
    batch_size
        Maps per ResNet forward (``resnet``), or ``auto``: 16 on a CPU, 64 on a GPU
        (:func:`attnclust.featurize.resnet.resolve_batch_size`).
    precision
        Arithmetic of the ResNet forward (``resnet``): ``auto`` = float16 autocast on a GPU, bfloat16 autocast on
        a CPU with native bf16 (AVX512-BF16 / AMX, about 2.5x faster than float32 with cosine >= 0.9999 to the
        float32 vectors), float32 otherwise; ``float32`` everywhere; ``bfloat16`` autocast everywhere (slow on a
        CPU without native bf16); ``float16`` autocast everywhere (meant for GPUs). The driver resolves ``auto``
        once and the tasks get the resolved value, so every worker runs what the fingerprint records. See
        :func:`attnclust.featurize.resnet.resolve_precision`.
    """

    SECTION = "featurize"
    arch: ResnetArch = _choice("resnet18", ResnetArch)
    weights: str = _setting("imagenet", "imagenet | none | a path to a .pth state dict", pattern=r"\S")
    image_size: int = _int(224, 32, 1024)
    # the check travels with the field into the featurize section (a validator method of this model would not)
    batch_size: Annotated[int | Literal["auto"], AfterValidator(lambda value: _auto_or_at_least(value, 1))] = \
        _setting("auto", "an integer >= 1 or 'auto'", "for example batch_size: 16 or batch_size: auto")
    precision: FeaturizePrecision = _choice("auto", FeaturizePrecision)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_CACHE: dict = {}
_LOCK = threading.Lock()


def _weights_enum(arch: str):
    import torchvision.models as tvm

    return {"resnet18": tvm.ResNet18_Weights.IMAGENET1K_V1, "resnet34": tvm.ResNet34_Weights.IMAGENET1K_V1,
            "resnet50": tvm.ResNet50_Weights.IMAGENET1K_V2}[arch]


def imagenet_cache_file(arch: str) -> Path:
    """Where torchvision keeps (or would download) the ImageNet weights of ``arch``."""
    import torch

    url = _weights_enum(arch).url
    return Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(url)


def check_weights(arch: str, weights: str, *, download: bool = True) -> None:
    """Fail early, with the fix, when the requested weights cannot be had (no silent random fallback)."""
    if weights == "none":
        return
    if weights == "imagenet":
        cached = imagenet_cache_file(arch)
        if cached.exists():
            return
        if not download:
            raise BackendUnavailable(
                f"featurize.weights imagenet: {cached.name} is not in the torchvision cache ({cached.parent}); "
                f"fill TORCH_HOME with it (torchvision downloads it on a machine with internet), or set "
                f"featurize.weights to a .pth file or 'none'")
        import torch

        try:
            torch.hub.load_state_dict_from_url(_weights_enum(arch).url, progress=False, check_hash=True)
        except Exception as exc:
            raise BackendUnavailable(
                f"featurize.weights imagenet: downloading {cached.name} failed ({type(exc).__name__}: "
                f"{' '.join(str(exc).split())[:120]}); this needs the internet or a TORCH_HOME cache holding the file "
                f"({cached.parent}); or set featurize.weights to a .pth file or 'none'") from None
        return
    path = Path(weights).expanduser()
    if not path.is_file():
        raise ConfigError(f"featurize.weights {weights!r}: no such file; allowed: imagenet | none | a path to a "
                          f"torchvision {arch} state dict (.pth)")


def load_resnet(arch: str, weights: str, device: str = "cpu"):
    """The ResNet trunk (classifier replaced by identity), eval mode, channels_last; cached per process."""
    key = (arch, weights, device)
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
        import torch
        import torchvision.models as tvm

        check_weights(arch, weights)
        builder = getattr(tvm, arch)
        if weights == "imagenet":
            net = builder(weights=_weights_enum(arch))
        else:
            net = builder(weights=None)
            if weights != "none":
                try:
                    state = torch.load(Path(weights).expanduser(), map_location="cpu", weights_only=True)
                    if isinstance(state, dict) and "state_dict" in state:
                        state = state["state_dict"]
                    state = {k: v for k, v in state.items() if not k.startswith("fc.")}
                    missing, unexpected = net.load_state_dict(state, strict=False)
                except Exception as exc:
                    detail = " ".join(str(exc).split())[:160]
                    raise ConfigError(f"featurize.weights {weights!r}: not a {arch} state dict "
                                      f"({type(exc).__name__}: {detail}); use weights of that arch") from None
                bad = [k for k in missing if not k.startswith("fc.")]
                if bad or unexpected:
                    raise ConfigError(f"featurize.weights {weights!r}: does not match {arch} (missing "
                                      f"{bad[:3]}, unexpected {list(unexpected)[:3]}); use weights of that arch")
        net.fc = torch.nn.Identity()
        net.eval().to(device=device, memory_format=torch.channels_last)
        _CACHE[key] = net
        return net


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 convolutions in hardware: oneDNN can run bf16 here
    (``torch.ops.mkldnn._is_mkldnn_bf16_supported``) *and* the CPU has AVX512-BF16 or AMX-BF16 (x86) or BF16
    (ARM64).

    The oneDNN check alone is true on any AVX-512 CPU, where bf16 is emulated and slower than float32; the
    instruction check (``torch.cpu.get_capabilities``) tells the native case apart.
    """
    import torch

    if not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        return False
    caps = torch.cpu.get_capabilities()
    return any(bool(caps.get(name, False)) for name in ("avx512_bf16", "amx_bf16", "bf16"))


def resolve_precision(setting: str, device: str) -> Resolved:
    """The precision the ResNet forward runs at for ``featurize.precision`` on ``device``.

    Parameters
    ----------
    setting
        ``auto``: ``float16`` on a GPU (``cuda``), ``bfloat16`` on a CPU with native bf16
        (:func:`cpu_has_native_bf16`), ``float32`` otherwise. ``float32``: float32 everywhere, GPU included.
        ``bfloat16``: bfloat16 autocast everywhere; on a CPU without native bf16 it still runs, but emulated
        and slower than float32. ``float16``: float16 autocast everywhere (meant for GPUs).
    device
        A torch device name (``cpu``, ``cuda``, ``cuda:1``).

    Returns
    -------
    str
        ``float32``, ``bfloat16`` or ``float16``.

    Raises
    ------
    attnclust.errors.ConfigError
        ``setting`` is none of the above.
    """
    if setting in ("float32", "bfloat16", "float16"):
        return setting
    if setting != "auto":
        raise ConfigError(f"config featurize.precision: got {setting!r}; allowed: auto | float32 | bfloat16 | "
                          f"float16")
    if device.split(":")[0] == "cuda":
        return "float16"
    return "bfloat16" if cpu_has_native_bf16() else "float32"


def resolve_batch_size(setting: int | str, device: str) -> int:
    """Maps per ResNet forward for ``featurize.batch_size`` on ``device``: ``auto`` is 16 on a CPU, 64 on a GPU.

    On a CPU a small batch keeps each layer's activations in cache: with ResNet-18 at 224 px a map takes about
    0.7 (bfloat16) to 0.8 (float32) of its time at batch 64. On a GPU the batch is 64, a default not measured.
    """
    if setting != "auto":
        return int(setting)
    return 64 if device.split(":")[0] == "cuda" else 16


def autocast_for(precision: Resolved, device: str):
    """The context the ResNet forward runs in at a resolved ``precision``: ``torch.autocast`` on the device's
    type with that dtype, or nothing for float32."""
    import torch

    if precision == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device.split(":")[0], dtype=getattr(torch, precision))


def embed_maps(net, maps: np.ndarray, *, image_size: int, batch_size: int, device: str = "cpu",
               precision: Resolved = "float32") -> np.ndarray:
    """Embed maps of one true length.

    Parameters
    ----------
    maps
        (map, query, key) float32 of one true length.
    precision
        A resolved precision (:func:`resolve_precision`): the network runs under :func:`autocast_for`; the
        preprocessing stays float32.

    Returns
    -------
    numpy.ndarray
        (map, dim) float32.
    """
    import torch
    import torch.nn.functional as F

    # (x - mean) / std per channel as one multiply-add that writes the 3 channels straight in channels_last
    # order: (map, H, W, 3) contiguous, permuted to a (map, 3, H, W) view (0.18 vs 0.45 ms per map in three
    # passes: subtract, divide, copy to channels_last)
    scale = 1 / torch.tensor(IMAGENET_STD, device=device)
    shift = -torch.tensor(IMAGENET_MEAN, device=device) * scale
    out = []
    with torch.inference_mode():
        for b0 in range(0, len(maps), batch_size):
            x = torch.from_numpy(np.ascontiguousarray(maps[b0:b0 + batch_size])).to(device)[:, None]
            peak = x.amax(dim=(2, 3), keepdim=True).clamp_min(1e-12)
            x = F.interpolate(x / peak, size=(image_size, image_size), mode="bilinear", align_corners=False)
            x = torch.addcmul(shift, x[:, 0, :, :, None], scale).permute(0, 3, 1, 2)
            with autocast_for(precision, device):
                y = net(x)
            out.append(y.float().cpu().numpy())
    return np.concatenate(out, axis=0)


class ResnetFeaturizer:
    """``resnet``: a torchvision ResNet's penultimate layer on each map seen as an image (the original design)."""

    name = "resnet"
    version = 1
    settings = ResnetSettings
    keys = settings_keys(ResnetSettings)  # arch, weights, image_size, batch_size, precision

    def dim(self, cfg) -> int:
        """2,048 for resnet50, 512 for resnet18/34."""
        return 2048 if cfg.arch == "resnet50" else 512

    def check(self, cfg) -> None:
        """The requested weights can be had (no silent random fallback)."""
        check_weights(cfg.arch, cfg.weights)

    def identity(self, cfg, device: str = "cpu") -> dict:
        """What this machine resolves ``featurize.precision`` to on ``device``: part of the featurize stage's
        fingerprint, recorded with the embedding (``auto`` gives bf16 on one CPU, float32 on another), and what
        the stage hands its tasks instead of ``auto`` (so a worker on another kind of CPU runs the same)."""
        return {"precision": resolve_precision(cfg.precision, device)}

    def embed(self, maps: np.ndarray, cfg, device: str = "cpu") -> np.ndarray:
        """(map, query, key) of one length -> (map, dim) float32, the net at the resolved precision."""
        net = load_resnet(cfg.arch, cfg.weights, device)
        return embed_maps(net, maps, image_size=cfg.image_size, batch_size=resolve_batch_size(cfg.batch_size, device),
                          device=device,
                          precision=resolve_precision(cfg.precision, device))


def _register() -> None:
    register_featurizer(ResnetFeaturizer())


_register()
