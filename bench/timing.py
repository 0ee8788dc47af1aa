"""Timing helpers: interleaved repetitions, peak RSS of a process tree, a description of the machine."""

from __future__ import annotations

import os
import platform
import statistics
import threading
import time
from collections.abc import Callable
from importlib import metadata

__all__ = ["PeakRSS", "interleave", "machine", "median", "tree_memory"]


def median(values) -> float:
    return float(statistics.median(values))


def interleave(arms: dict[str, Callable[[int], float]], reps: int, *, warmup: bool = True) -> dict[str, list[float]]:
    """Run the arms A, B, C, A, B, C ... ``reps`` times; each arm gets the repetition index, returns seconds.

    A shared machine drifts (the other engineer's tests come and go); alternating arms puts the drift into every
    arm alike, and the median of the repetitions drops the odd outlier. ``warmup`` runs each arm once untimed.
    """
    if warmup:
        for fn in arms.values():
            fn(-1)
    out: dict[str, list[float]] = {name: [] for name in arms}
    for r in range(reps):
        for name, fn in arms.items():
            out[name].append(float(fn(r)))
    return out


def tree_memory(pid: int, *, pss: bool = False) -> int:
    """Summed RSS (or PSS: a page shared by N processes counted once in all) of process ``pid`` and its
    descendants, in bytes; 0 when it is gone. Processes that end or deny access while being read are skipped."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_full_info().pss if pss else p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
    return total


class PeakRSS:
    """Sample the resident memory of this process and all its children (Dask workers too) in a thread.

    ``with PeakRSS() as p: ...`` then ``p.peak`` (bytes, whole tree) and ``p.baseline`` (at entry).
    """

    def __init__(self, interval: float = 0.02, pid: int | None = None):
        self.interval = interval
        self.pid = pid or os.getpid()
        self.peak = 0
        self.baseline = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _tree_rss(self) -> int:
        return tree_memory(self.pid)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._tree_rss())
            self._stop.wait(self.interval)

    def __enter__(self):
        self.baseline = self._tree_rss()
        self.peak = self.baseline
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._tree_rss())
        return False

    @property
    def growth(self) -> int:
        return self.peak - self.baseline


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
    import os

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
    import json
    from pathlib import Path

    out = Path(path)
    old = json.loads(out.read_text()) if out.exists() else []
    names = {r["name"] for r in records}
    out.write_text(json.dumps([r for r in old if r.get("name") not in names] + records, indent=2) + "\n")
