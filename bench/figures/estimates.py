"""Per-stage FLOPs and bytes per example, and what they would mean on one H100 — ESTIMATES, not measurements.

FLOPs come from the model config (``2 * non-embedding params * tokens`` for the dense layers plus
``4 * L * H * n^2 * d_head`` for QK^T and AV, with n^2 averaged over the generated features) and from the
published ResNet costs (torchvision quotes ResNet-18 1.8 and ResNet-50 4.1 "GFLOPS" at 224 px; those count
multiply-adds, so 2x that is used here), scaled with pixels. Bytes are what a stage must move per example:
attention maps at true length in float16, the store's bytes as measured by the ``store`` figures of this run
(when those did not run: 1/1.14, what zstd level 1 gave on dense float16 maps in the project's first measurement on
the 2-core machine, and 1/7 for uint8 over float16). H100 figures are public specs: ~990 TFLOP/s dense bf16
with ~60% achievable, 3.35 TB/s HBM3, PCIe Gen5 x16 ~50 GB/s in practice, NVMe ~7 GB/s. Nothing here was
measured on an H100.
"""

from __future__ import annotations

import numpy as np

__all__ = ["H100", "estimate_rows", "estimate_text", "squad_dev_store_gb"]

H100 = {"flops": 990e12 * 0.6, "hbm": 3.35e12, "pcie": 50e9, "nvme": 7e9}
RESNET_GMACS_224 = {"resnet18": 1.8, "resnet34": 3.6, "resnet50": 4.1}
BERT_BASE = {"layers": 12, "heads": 12, "hidden": 768, "ff": 3072}
LABEL = "ESTIMATE from the model config and public H100 specs, not a measurement"


def _nonembedding_params(layers: int, hidden: int, ff: int) -> int:
    per_layer = 4 * hidden * hidden + 4 * hidden + 2 * hidden * ff + hidden + ff + 4 * hidden
    return layers * per_layer


def model_geometry(model) -> dict:
    c = model.config
    return {"layers": int(c.num_hidden_layers), "heads": int(c.num_attention_heads), "hidden": int(c.hidden_size),
            "ff": int(c.intermediate_size)}


def extract_cost(geo: dict, n_mean: float, n_sq: float) -> dict:
    """FLOPs and bytes of one feature: ``n_mean`` tokens on average, ``n_sq`` = mean of n^2."""
    params = _nonembedding_params(geo["layers"], geo["hidden"], geo["ff"])
    maps = geo["layers"] * geo["heads"]
    attn = 4 * maps * n_sq * (geo["hidden"] // geo["heads"])
    return {"params_nonembedding": params, "maps": maps, "flops": 2 * params * n_mean + attn,
            "attention_flops": attn, "map_bytes_fp16": 2 * maps * n_sq,
            # eager attention in HBM: scores written, softmax read + written, probabilities read by AV (fp16)
            "hbm_bytes": 4 * 2 * maps * n_sq}


def squad_dev_store_gb(ctx, compact_bytes_per_map: float, store_lens: np.ndarray) -> tuple[float, dict]:
    """The compact store of SQuAD2-dev on BERT-base, projected from the compact bytes per map measured here.

    ``questions x features per question x 144 maps x bytes per map``, with the features per question of the
    generated SQuAD-like dataset (max_seq_len 384, doc_stride 128) and the bytes per map measured on MiniLM at
    those lengths, scaled by the ratio of the whole dataset's mean length to the measured features' (a compact
    map has one row per token). A row's size is its kept-key count, which depends on how sparse the heads are:
    measured on MiniLM, not on BERT-base.

    Returns
    -------
    tuple
        The projected GB (10^9 bytes) and the figure's settings (the assumptions spelled out).
    """
    from ..common.squadgen import SQUAD2_DEV_QUESTIONS

    feats = ctx.inputs["features"]
    per_question = len(feats) / max(1, feats["example_id"].nunique())
    lens_all = feats["seq_len"].to_numpy(np.float64)
    lens_run = np.asarray(store_lens, np.float64)
    # a compact map holds about (rows x kept keys) entries: scale by the mean length (rows), kept keys as measured
    length_scale = float(lens_all.mean() / lens_run.mean())
    maps = BERT_BASE["layers"] * BERT_BASE["heads"]
    n_features = SQUAD2_DEV_QUESTIONS * per_question
    gb = n_features * maps * compact_bytes_per_map * length_scale / 1e9
    full = ctx.state.get("store_full_bytes_per_map")
    return gb, {
        "kind": "PROJECTION from a measurement on MiniLM, not a BERT-base measurement",
        "questions": SQUAD2_DEV_QUESTIONS, "features_per_question": round(per_question, 3),
        "features": round(n_features), "maps_per_feature": maps,
        "compact_bytes_per_map_measured": round(compact_bytes_per_map, 1),
        "length_scale_dataset_over_measured": round(length_scale, 3),
        **({"full_store_gb_same_projection": round(n_features * maps * full * length_scale / 1e9, 1)} if full else {}),
        "assumptions": "BERT-base has 12 x 12 = 144 heads; features per question from the generated SQuAD-like "
                       "dataset (max_seq_len 384, doc_stride 128); bytes per map measured on MiniLM maps at those "
                       "lengths and scaled by the mean length (a compact map has one row per token). The kept keys "
                       "per row depend on the heads' attention sparsity, measured on MiniLM, not on BERT-base: a "
                       "more diffuse BERT-base would need more keys per row and more bytes"}


def estimate_rows(ctx) -> list[tuple[str, float, str, dict]]:
    """``(name, value, unit, settings)`` rows: per-stage costs per example, then H100 times per example."""
    lens = ctx.inputs["features"]["seq_len"].to_numpy(np.float64)
    n_mean, n_sq = float(lens.mean()), float((lens ** 2).mean())
    store_ratio = ctx.state.get("store_bytes_ratio_true_length", 1 / 1.14)
    u8_ratio = ctx.state.get("uint8_vs_float16", 1 / 7)
    rows = []
    minilm = model_geometry(ctx.model)
    maps = minilm["layers"] * minilm["heads"]
    base = {"tokens_mean": round(n_mean, 1), "tokens_rms": round(n_sq ** 0.5, 1), "kind": LABEL,
            "store_bytes_over_true_length_fp16": round(store_ratio, 4), "uint8_over_float16_store": round(u8_ratio, 4)}
    for label, geo in (("minilm", minilm), ("bert_base", BERT_BASE)):
        c = extract_cost(geo, n_mean, n_sq)
        t = {"compute": c["flops"] / H100["flops"], "hbm": c["hbm_bytes"] / H100["hbm"],
             "pcie_raw_fp16_maps": c["map_bytes_fp16"] / H100["pcie"],
             "nvme_store_fp16": c["map_bytes_fp16"] * store_ratio / H100["nvme"],
             "nvme_store_uint8": c["map_bytes_fp16"] * store_ratio * u8_ratio / H100["nvme"],
             "pcie_pooled_vectors_only": c["maps"] * 32 * 32 * 4 / H100["pcie"]}
        bound = max(("compute", "hbm", "pcie_raw_fp16_maps", "nvme_store_fp16"), key=lambda k: t[k])
        s = {**base, "model": label, "maps_per_example": c["maps"], "gflop": round(c["flops"] / 1e9, 3),
             "attention_share_of_flops": round(c["attention_flops"] / c["flops"], 3),
             "maps_mb_fp16": round(c["map_bytes_fp16"] / 1e6, 3),
             "store_mb": round(c["map_bytes_fp16"] * store_ratio / 1e6, 3),
             "h100_us": {k: round(v * 1e6, 2) for k, v in t.items()}, "bound_by": bound}
        if label == "minilm" and ctx.state.get("extract_fps"):
            s["measured_here_gflop_per_s"] = round(c["flops"] / 1e9 * ctx.state["extract_fps"], 2)
        rows.append((f"stage_extract_{label}_gflop_per_example", c["flops"] / 1e9, "GFLOP", s))
        rows.append((f"stage_extract_{label}_maps_mb_per_example", c["map_bytes_fp16"] / 1e6, "MB", s))
        rows.append((f"h100_extract_{label}_us_per_example", t[bound] * 1e6, "us", s))
    read = 2 * maps * n_sq  # the featurizers read every map once from the store
    for arch, size in (("resnet18", 224), ("resnet50", 224), ("resnet50", 384)):
        flops = 2 * RESNET_GMACS_224[arch] * 1e9 * (size / 224) ** 2 * maps
        s = {**base, "gflop": round(flops / 1e9, 1), "maps_read_mb": round(read / 1e6, 3),
             "vector_kb_written": round(maps * (2048 if arch == "resnet50" else 512) * 4 / 1e3, 1),
             "times_minilm_extract_flops": round(flops / extract_cost(minilm, n_mean, n_sq)["flops"], 1)}
        rows.append((f"stage_featurize_{arch}_{size}px_gflop_per_example", flops / 1e9, "GFLOP", s))
        rows.append((f"h100_featurize_{arch}_{size}px_us_per_example", flops / H100["flops"] * 1e6, "us", s))
    s = {**base, "flops": round(maps * n_sq), "maps_read_mb": round(read / 1e6, 3),
         "vector_kb_written": round(maps * 1024 * 4 / 1e3, 1), "bound_by": "hbm (one pass over each map)"}
    rows.append(("stage_featurize_pooled_mflop_per_example", maps * n_sq / 1e6, "MFLOP", s))
    rows.append(("h100_featurize_pooled_us_per_example", read / H100["hbm"] * 1e6, "us", s))
    pca = 2 * 1024 * 50 + 2 * 50 * 16  # per map: PCA projection + distances to at most k_max centres
    rows.append(("stage_cluster_assign_mflop_per_example", maps * pca / 1e6, "MFLOP",
                 {**base, "bytes_read": maps * 1024 * 4, "note": "PCA 1024->50 and KMeans predict per map; UMAP "
                  "transform (nearest neighbours + a few epochs) comes on top and dominates on CPU"}))
    return rows


def estimate_text(rows) -> list[str]:
    """The consequences, with the numbers they rest on."""
    by = {name: s for name, _, _, s in rows}
    out = []
    for label in ("minilm", "bert_base"):
        s = by[f"h100_extract_{label}_us_per_example"]
        us = s["h100_us"]
        out.append(f"ESTIMATE H100 {label} extraction per example: compute {us['compute']} us, HBM {us['hbm']} us, "
                   f"PCIe raw fp16 maps {us['pcie_raw_fp16_maps']} us, NVMe fp16 store {us['nvme_store_fp16']} us "
                   f"(uint8 store {us['nvme_store_uint8']} us; pooled vectors only over PCIe "
                   f"{us['pcie_pooled_vectors_only']} us) -> bound by {s['bound_by']}: "
                   f"{us['nvme_store_fp16'] / us['compute']:.0f}x the compute time, PCIe alone "
                   f"{us['pcie_raw_fp16_maps'] / us['compute']:.0f}x")
    r18 = by["h100_featurize_resnet18_224px_us_per_example"]
    out.append(f"ESTIMATE the ResNet-18 featurizer costs {r18['times_minilm_extract_flops']}x the MiniLM forward's "
               f"FLOPs per example; pooled featurization is one pass over the maps (HBM-bound, ~"
               f"{by['h100_featurize_pooled_us_per_example']['maps_read_mb']} MB per example).")
    out.append("ESTIMATE consequence: on an H100 the forward pass is not the limit, moving maps is. Compute the "
               "statistics and pooled vectors on the GPU in the same task as the forward, ship only vectors and "
               "statistics over PCIe, and store maps as uint8 (about 7x fewer bytes) or only for a sample; the "
               "float16 full store would hold the GPU to NVMe speed.")
    return out
