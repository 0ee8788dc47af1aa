"""Memory of a process and its children: summed RSS (or PSS) of a process tree, sampled in a thread (a running
peak, or a timed series to cut by stage), and a process's own high-water mark."""

from __future__ import annotations

import math
import os
import threading
import time

__all__ = ["PeakRSS", "TreeRSS", "peak_rss_bytes", "tree_memory"]


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


class TreeRSS:
    """Sample the summed RSS of a process and its descendants every ``interval`` seconds, with wall-clock times
    (``time.time()``, comparable with file mtimes); ``samples`` is a list of ``(t, bytes)``. Every
    ``pss_every``-th sample also sums PSS (``pss_samples``): RSS counts a page shared by N processes (torch's
    libraries, the model mapped by each worker) N times, PSS once in all."""

    def __init__(self, pid: int, interval: float = 0.5, pss_every: int = 5):
        self.pid, self.interval, self.pss_every = pid, interval, pss_every
        self.samples: list[tuple[float, int]] = []
        self.pss_samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def tree_memory(self, pss: bool = False) -> int:
        return tree_memory(self.pid, pss=pss)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            rss = self.tree_memory()
            if rss:
                self.samples.append((time.time(), rss))
            if i % self.pss_every == 0:
                pss = self.tree_memory(pss=True)
                if pss:
                    self.pss_samples.append((time.time(), pss))
            i += 1
            self._stop.wait(self.interval)

    def start(self) -> TreeRSS:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def peak(self, t0: float = -math.inf, t1: float = math.inf) -> int:
        """Largest sample within ``[t0, t1]``; when none fell there (a stage shorter than the gap between two
        samples on a busy machine), the sample nearest to the interval; 0 without samples."""
        inside = [rss for t, rss in self.samples if t0 <= t <= t1]
        if inside:
            return max(inside)
        return min(self.samples, key=lambda s: min(abs(s[0] - t0), abs(s[0] - t1)), default=(0.0, 0))[1]


def peak_rss_bytes() -> int:
    """This process's resident-memory high-water mark (``VmHWM`` in /proc/self/status), bytes.

    ``getrusage(RUSAGE_SELF).ru_maxrss`` would not do in a child: Linux carries the parent's high-water mark into
    it across fork + exec.
    """
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")
