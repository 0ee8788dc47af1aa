"""What every benchmark shares: timing (:mod:`.timing`), memory (:mod:`.memory`), result records (:mod:`.results`),
the generated SQuAD-v2 data (:mod:`.squadgen`), the stages run in-process (:mod:`.inproc`) and the seed pipeline,
the baseline of the end-to-end figures (:mod:`.seed`)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["RESULTS", "ROOT"]

ROOT = Path(__file__).resolve().parents[2]
"""The repository root: the benchmarks read ``jobs/`` from it and start their child processes in it."""

RESULTS = ROOT / "bench" / "results.json"
"""Where ``python -m bench`` writes its records and the standalone scripts merge theirs by default."""
