"""The pipeline's stages, in order, and the commands that run them.

Each stage is one module (:mod:`.extract`, :mod:`.qa`, :mod:`.featurize`, :mod:`.cluster`, :mod:`.importance`,
:mod:`.report`) declaring a :class:`~attnclust.stages.base.Stage`; :func:`~attnclust.stages.base.run_stages` runs
them on a Dask client or in-process (:mod:`.executors`). This module is the one place the stage list is spelled.
"""

from __future__ import annotations

from ..executors import DaskExecutor, SerialExecutor
from .base import PART_COMMANDS, RunContext, Stage, check_stages, run_stages
from .cluster import ClusterStage
from .extract import ExtractStage
from .featurize import FeaturizeStage
from .importance import ImportanceStage
from .qa import QAStage
from .report import ReportStage

__all__ = ["COMMANDS", "STAGES", "DaskExecutor", "RunContext", "SerialExecutor", "Stage", "check_stages",
           "make_stages", "run_stages", "stage_names"]

STAGES: tuple[type[Stage], ...] = (ExtractStage, QAStage, FeaturizeStage, ClusterStage, ImportanceStage, ReportStage)
"""Every stage, in the order they run."""

COMMANDS: dict[str, tuple[str, ...]] = {"run": tuple(s.name for s in STAGES), **PART_COMMANDS}
"""CLI command -> the stages it runs (``extract`` also scores the model's answers: cheap, from its logits)."""


def make_stages() -> tuple[Stage, ...]:
    """Fresh stage instances for one run (stages keep per-run state between plan and finalize)."""
    return tuple(cls() for cls in STAGES)


def stage_names() -> tuple[str, ...]:
    """Names of every stage, in order."""
    return tuple(s.name for s in STAGES)
