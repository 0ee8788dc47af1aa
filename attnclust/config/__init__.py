"""Job configuration: frozen pydantic v2 models validated on construction.

A job file (YAML) maps onto :class:`JobConfig`; every section maps onto one stage's model. Plugins declare their
settings beside their code: each featurizer its settings model, whose fields join the ``featurize`` section
(:attr:`attnclust.featurize.Featurizer.settings`), each analysis its own section (``syntax``, ``probe``,
``importance``: :func:`attnclust.analysis.plugins.register_analysis`). The sections here are the stages'; the job
is assembled with the plugins' once they are loaded (:func:`assemble_job`, called by
:func:`attnclust.plugins.load_plugins`), so importing a module never changes it. Unknown keys, wrong types and
out-of-range values raise one :class:`~attnclust.errors.ConfigError` naming the dotted key, the value, what is
allowed and the fix; a pydantic ``ValidationError`` never escapes this package. Types are strict (a bool is not
an int, ``"12"`` is not an int), except that float settings accept integers. ``to_dict``/``from_dict`` round-trip
exactly, so the resolved configuration written to ``job.json`` can be read back.

The helpers that declare what a setting allows, and the base model that turns pydantic's errors into one
``ConfigError`` line, are in :mod:`attnclust._settings`. This package's modules:

- :mod:`~attnclust.config.sections`: the stages' sections;
- :mod:`~attnclust.config.job`: the job, :class:`JobConfig`, and its registry of sections;
- :mod:`~attnclust.config.registry`: the job assembled with the sections plugins declare (analyses' sections,
  featurizers' settings);
- :mod:`~attnclust.config.overrides`: ``--set`` overrides, read as their settings' types;
- :mod:`~attnclust.config.yamlsafe`: the bound on what YAML aliases expand to;
- :mod:`~attnclust.config.files`: job files, read and validated (:func:`load_job`).
"""

from __future__ import annotations

from typing import Any

from .files import default_job_path, load_job
from .job import CORE_SECTIONS, JobConfig
from .overrides import apply_overrides
from .registry import assemble_job, check_section
from .sections import (
    ClusterConfig,
    DataConfig,
    ExtractConfig,
    FeaturizeConfig,
    FinetuneConfig,
    ModelConfig,
    QAConfig,
    ReportConfig,
)
from .yamlsafe import MAX_EXPANDED_VALUES

__all__ = [
    "CORE_SECTIONS",
    "ClusterConfig",
    "DataConfig",
    "ExtractConfig",
    "FeaturizeConfig",
    "FinetuneConfig",
    "JobConfig",
    "MAX_EXPANDED_VALUES",
    "ModelConfig",
    "QAConfig",
    "ReportConfig",
    "apply_overrides",
    "assemble_job",
    "check_section",
    "default_job_path",
    "load_job",
]


def __getattr__(name: str) -> Any:
    """The models of the sections that analyses declare, by their class names (``SyntaxConfig``:
    :mod:`attnclust.analysis.syntax`), as :attr:`JobConfig.SECTIONS` holds them."""
    for model in JobConfig.SECTIONS.values():
        if model.__name__ == name:
            return model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
