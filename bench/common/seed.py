"""The seed project's pipeline, re-implemented as the baseline of the end-to-end figures.

The seed project (a Springboard capstone, "transformer attention clustering") fine-tuned bert-base-uncased on
SQuAD 2.0 (2 epochs, lr 3e-5, batch 4, ``max_seq_len`` 384, ``doc_stride`` 128: dev EM 72.96 / F1 76.29), took the
attention of its 131,944 training features and clustered 1,123,200 of the maps (cuML Dask KMeans, k = 35, on 2 RTX
3090s); the featurization took about a week and 26 CSV files of ~16 GB. Its notebooks are not part of this
repository and nothing here reads them: what this module copies from them is written below.

As the seed did: features one at a time (batch 1), padded to ``max_seq_len`` (384); every 384 x 384 map kept *with
its padding*; scaled 0-255 by a scikit-learn ``MinMaxScaler`` fitted on the map (which scales each column
separately, not the map); copied to 3 channels; fed unnormalised at native size (384 px) to a ResNet-50 without its
classifier -> 2,048-d; each feature's rows appended to a CSV file; then KMeans (k = 35, or fewer when there are
fewer maps) on the CSV read back. Layer/head are implied by row position, as in the seed. Differences: the seed used
Barlow Twins weights, BERT-base and cuML on GPUs; here the ResNet-50 is randomly initialised (no weights are
downloaded; the cost is the same), the model is the one under test (MiniLM) and KMeans is scikit-learn's.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["SeedPipeline", "seed_featurize_maps", "seed_resnet50"]

SEED_K = 35
SEED_SIZE = 384


def seed_resnet50():
    """ResNet-50, random init (stand-in for Barlow Twins weights), classifier removed, eval, default layout."""
    import torch
    import torchvision.models as tvm

    net = tvm.resnet50(weights=None)
    net.fc = torch.nn.Identity()
    return net.eval()


def seed_featurize_maps(net, maps: np.ndarray) -> np.ndarray:
    """Seed featurizer on (map, 384, 384) padded maps: per-column MinMaxScaler 0-255 (on the CPU, as the seed),
    3 channels, batch 1 on the net's device."""
    import torch
    from sklearn.preprocessing import MinMaxScaler

    device = next(net.parameters()).device
    out = np.empty((len(maps), 2048), dtype=np.float32)
    with torch.inference_mode():
        for i, m in enumerate(maps):
            img = MinMaxScaler(feature_range=(0, 255)).fit_transform(np.asarray(m, dtype=np.float64))
            x = torch.from_numpy(img.astype(np.float32))[None, None].expand(1, 3, -1, -1).contiguous()
            out[i] = net(x.to(device)).cpu().numpy()[0]
    return out


class SeedPipeline:
    """The seed pipeline over QA features, writing CSVs into ``workdir``.

    Parameters
    ----------
    model
        The QA model (eager attention); the seed runs on its device (the ResNet-50 is moved there too).
    workdir
        Directory for the CSV files (one per call of :meth:`extract_featurize`, as the seed wrote parts).
    maps_timed
        When set, the seed featurizer runs on only the first ``maps_timed`` maps of each feature and its time is
        scaled by ``maps / maps_timed`` (every map is 384 x 384 at batch 1, so its cost does not depend on the
        map); the remaining CSV rows repeat the computed ones so the CSV and KMeans see every map. ``None``: all.
    """

    def __init__(self, model, workdir: Path, *, max_seq_len: int = SEED_SIZE, pad_id: int = 0,
                 maps_timed: int | None = None, net=None):
        self.model = model
        self.maps_timed = maps_timed
        self.device = next(model.parameters()).device
        self.net = (net if net is not None else seed_resnet50()).to(self.device)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.max_seq_len = max_seq_len
        self.pad_id = pad_id

    def extract_featurize(self, features: pd.DataFrame, csv: Path) -> dict:
        """Batch-1 forward padded to max_seq_len, seed featurizer on every padded map, rows appended to ``csv``."""
        import torch

        t_fwd = t_feat = t_csv = 0.0
        for row in features.itertuples(index=False):
            n = len(row.input_ids)
            ids = np.full((1, self.max_seq_len), self.pad_id, dtype=np.int64)
            types = np.zeros_like(ids)
            mask = np.zeros_like(ids)
            ids[0, :n], types[0, :n], mask[0, :n] = row.input_ids, row.segment_ids, 1
            t0 = time.perf_counter()
            with torch.inference_mode():
                res = self.model(input_ids=torch.from_numpy(ids).to(self.device),
                                 attention_mask=torch.from_numpy(mask).to(self.device),
                                 token_type_ids=torch.from_numpy(types).to(self.device), output_attentions=True)
            maps = torch.cat(res.attentions, dim=1)[0].float().cpu().numpy()  # (layer*head, 384, 384), padded
            t1 = time.perf_counter()
            m = len(maps) if self.maps_timed is None else min(self.maps_timed, len(maps))
            part = seed_featurize_maps(self.net, maps[:m])
            t2 = time.perf_counter()
            vec = part[np.arange(len(maps)) % m]
            pd.DataFrame(vec).to_csv(csv, mode="a", header=False, index=False)
            t3 = time.perf_counter()
            t_fwd += t1 - t0
            t_feat += (t2 - t1) * len(maps) / m  # scaled when only some maps were timed
            t_csv += t3 - t2
        return {"forward": t_fwd, "featurize": t_feat, "csv": t_csv}

    @staticmethod
    def cluster(csvs: list[Path], *, k: int = SEED_K, random_state: int = 0) -> np.ndarray:
        """KMeans (k, or fewer when there are fewer maps) on every CSV row read back."""
        from sklearn.cluster import KMeans

        x = pd.concat([pd.read_csv(c, header=None) for c in csvs], ignore_index=True).to_numpy(np.float32)
        return KMeans(n_clusters=min(k, len(x)), random_state=random_state, n_init="auto").fit_predict(x)

    def run(self, features: pd.DataFrame, tag: str) -> dict:
        """The whole seed pipeline on ``features``; seconds per part and in total."""
        csv = self.workdir / f"seed-{tag}.csv"
        csv.unlink(missing_ok=True)
        parts = self.extract_featurize(features, csv)
        t1 = time.perf_counter()
        labels = self.cluster([csv])
        cluster_s = time.perf_counter() - t1
        total = parts["forward"] + parts["featurize"] + parts["csv"] + cluster_s
        return {**parts, "cluster": cluster_s, "total": total, "n_maps": len(labels)}
