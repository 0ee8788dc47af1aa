"""Per-stage FLOPs and bytes per example, and what they would mean on one H100 — ESTIMATES, not measurements.

FLOPs come from the model config (``2 * non-embedding params * tokens`` for the dense layers plus
``4 * L * H * n^2 * d_head`` for QK^T and AV) and from the published ResNet costs (torchvision quotes ResNet-18
1.8 and ResNet-50 4.1 "GFLOPS" at 224 px; those count multiply-adds, so 2x that is used here), scaled with pixels.
Bytes are what a stage must move per example (attention maps, store bytes as measured here). H100 figures are
public specs: ~990 TFLOP/s dense bf16 with ~60% achievable, 3.35 TB/s HBM3, PCIe Gen5 x16 ~50 GB/s in practice,
NVMe ~7 GB/s. Nothing here was measured on an H100.
"""

from __future__ import annotations

__all__ = ["H100", "estimate_lines"]

H100 = {"flops": 990e12 * 0.6, "hbm": 3.35e12, "pcie": 50e9, "nvme": 7e9}
RESNET_GMACS_224 = {"resnet18": 1.8, "resnet34": 3.6, "resnet50": 4.1}
BERT_BASE = {"layers": 12, "heads": 12, "hidden": 768, "ff": 3072}


def _nonembedding_params(layers: int, hidden: int, ff: int) -> int:
    per_layer = 4 * hidden * hidden + 4 * hidden + 2 * hidden * ff + hidden + ff + 4 * hidden
    return layers * per_layer


def model_geometry(model) -> dict:
    c = model.config
    return {"layers": int(c.num_hidden_layers), "heads": int(c.num_attention_heads), "hidden": int(c.hidden_size),
            "ff": int(c.intermediate_size)}


def extract_cost(geo: dict, n: float) -> dict:
    """FLOPs and map bytes of one feature of ``n`` tokens."""
    params = _nonembedding_params(geo["layers"], geo["hidden"], geo["ff"])
    d_head = geo["hidden"] // geo["heads"]
    maps = geo["layers"] * geo["heads"]
    attn_flops = 4 * maps * n * n * d_head
    return {"params_nonembedding": params, "flops": 2 * params * n + attn_flops, "attention_flops": attn_flops,
            "maps": maps, "map_bytes_fp16": 2 * maps * n * n,
            "hbm_bytes_eager": 4 * 2 * maps * n * n}  # scores written, softmax read+written, read by AV (fp16)


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} us"


def estimate_lines(ctx) -> list[tuple[str, float, dict]]:
    """(name, value, settings) rows; value in microseconds per example on one H100 unless named otherwise."""
    import numpy as np

    lens = ctx.inputs["features"]["seq_len"].to_numpy(np.float64)
    n_mean, n_sq = float(lens.mean()), float((lens ** 2).mean())
    n_eff = n_sq ** 0.5  # attention cost goes with mean n^2
    store_ratio = ctx.state.get("store_bytes_ratio_true_length", 1 / 1.14)  # compressed / raw true-length fp16
    u8_ratio = ctx.state.get("uint8_vs_float16", 1 / 7)
    rows = []
    for label, geo in (("minilm", model_geometry(ctx.model)), ("bert_base", BERT_BASE)):
        c = extract_cost(geo, n_mean)
        c2 = extract_cost(geo, n_eff)
        flops = c["flops"] - c["attention_flops"] + c2["attention_flops"]
        maps_bytes = c2["map_bytes_fp16"]
        t = {"compute": flops / H100["flops"], "hbm": c2["hbm_bytes_eager"] / H100["hbm"],
             "pcie_raw_fp16_maps": maps_bytes / H100["pcie"],
             "nvme_store_fp16": maps_bytes * store_ratio / H100["nvme"],
             "nvme_store_uint8": maps_bytes * store_ratio * u8_ratio / H100["nvme"],
             "pcie_pooled_vectors": c["maps"] * 1024 * 4 / H100["pcie"]}
        bound = max(("compute", "hbm", "pcie_raw_fp16_maps", "nvme_store_fp16"), key=lambda k: t[k])
        settings = {"model": label, "tokens_mean": round(n_mean, 1), "tokens_rms": round(n_eff, 1),
                    "gflops_per_example": round(flops / 1e9, 3), "map_mb_per_example_fp16": round(maps_bytes / 1e6, 3),
                    "store_mb_per_example": round(maps_bytes * store_ratio / 1e6, 3),
                    "h100_us_per_example": {k: round(v * 1e6, 2) for k, v in t.items()}, "bound_by": bound,
                    "kind": "ESTIMATE from public specs, not a measurement"}
        if label == "minilm" and ctx.state.get("extract_fps"):
            settings["measured_here_gflops_per_s"] = round(flops / 1e9 * ctx.state["extract_fps"], 2)
        rows.append((f"estimate_h100_extract_{label}_us", t[bound] * 1e6, settings))
    # featurizers per example (all maps of one MiniLM feature)
    geo = model_geometry(ctx.model)
    maps = geo["layers"] * geo["heads"]
    for arch, size in (("resnet18", 224), ("resnet50", 224), ("resnet50", 384)):
        flops = 2 * RESNET_GMACS_224[arch] * 1e9 * (size / 224) ** 2 * maps
        rows.append((f"estimate_h100_featurize_{arch}_{size}px_us", flops / H100["flops"] * 1e6, {
            "gflops_per_example": round(flops / 1e9, 1), "maps_per_example": maps,
            "ratio_to_minilm_extract_flops": round(flops / extract_cost(geo, n_mean)["flops"], 1),
            "kind": "ESTIMATE from public specs, not a measurement"}))
    pooled_bytes = 2 * maps * n_sq
    rows.append(("estimate_h100_featurize_pooled_us", pooled_bytes / H100["hbm"] * 1e6, {
        "bytes_read_per_example": round(pooled_bytes), "flops_per_example": round(maps * n_sq),
        "bound_by": "hbm (one read of each map; ~1 FLOP per element)",
        "kind": "ESTIMATE from public specs, not a measurement"}))
    return rows


def verdict(rows) -> list[str]:
    """Plain-language consequences of the estimate rows."""
    by = {name: s for name, _, s in rows}
    out = []
    for label in ("minilm", "bert_base"):
        s = by.get(f"estimate_h100_extract_{label}_us")
        if not s:
            continue
        us = s["h100_us_per_example"]
        out.append(f"ESTIMATE {label}: compute {us['compute']} us, HBM {us['hbm']} us, PCIe (raw fp16 maps) "
                   f"{us['pcie_raw_fp16_maps']} us, NVMe (fp16 store) {us['nvme_store_fp16']} us, NVMe (uint8) "
                   f"{us['nvme_store_uint8']} us, PCIe (pooled vectors only) {us['pcie_pooled_vectors']} us per "
                   f"example -> bound by {s['bound_by']}")
    out.append("ESTIMATE consequence: on an H100 the forward pass is not the limit; shipping every raw map over "
               "PCIe and writing it to disk is (10-100x the compute time). Compute statistics and pooled features "
               "on the GPU, ship only vectors + statistics, and store maps as uint8 (or only a sample).")
    return out
