"""The records a figure leaves: the machine it was measured on, the standalone cost scripts' report records, and
merging records by name into a results file (``bench/results.json``)."""

from __future__ import annotations

import json
import os
import platform
import time
from importlib import metadata
from pathlib import Path

from .timing import median

__all__ = ["cost_records", "machine", "merge_records"]


def machine() -> dict:
    """What the figures were measured on."""
    import torch

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    return {"cpu": cpu, "cores": len(os.sched_getaffinity(0)), "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(), "torch": version("torch"), "torchvision": version("torchvision"),
            "transformers": version("transformers"), "zarr": version("zarr"), "scikit-learn": version("scikit-learn"),
            "umap-learn": version("umap-learn"), "attnclust": version("attnclust"),
            "loadavg_1min_at_start": None if load is None else round(load, 2),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def cost_records(times: dict[str, list[float]], settings: dict, *, digits: int = 3) -> list[dict]:
    """``analysis_cost_<name>`` report records (median seconds, every repetition, load average, machine) from
    ``{name: [seconds, ...]}``, one printed line each: what the standalone cost scripts write."""
    records = []
    for name, values in times.items():
        value, load = median(values), round(os.getloadavg()[0], 2)
        seconds = [round(t, digits) for t in values]
        records.append({"name": f"analysis_cost_{name}", "value": round(value, digits), "goal": "report",
                        "pass": None, "machine": machine(),
                        "settings": {**settings, "unit": "s", "seconds": seconds, "loadavg_1min_at_figure": load}})
        print(f"analysis_cost_{name:<28} {value:>10.3f} s  (load average {load:.2f})", flush=True)
    return records


def merge_records(path, records: list[dict]) -> None:
    """Write ``records`` into the results file at ``path``, replacing older records of the same names and keeping
    the others (the standalone cost scripts add their figures to ``bench/results.json`` this way)."""
    out = Path(path)
    old = json.loads(out.read_text()) if out.exists() else []
    names = {r["name"] for r in records}
    out.write_text(json.dumps([r for r in old if r.get("name") not in names] + records, indent=2) + "\n")
