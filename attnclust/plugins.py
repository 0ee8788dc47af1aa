"""Extensions installed as Python packages: every module named in the ``attnclust.plugins`` entry-point group is
imported when attnclust is, in every process (the driver and each Dask worker), so what it registers (a statistic,
a head analysis, an analysis plugin, a featurizer, a report section, a model family's output projections) is
known wherever a job runs. Then the job's model is assembled, once, with the sections and settings registered by
then (:func:`assemble_job_config`): importing a module never changes it.

A package declares its module in its ``pyproject.toml``::

    [project.entry-points."attnclust.plugins"]
    my_statistic = "my_package.my_statistic"

How to write each kind of extension: ``docs/extending.md``.
"""

from __future__ import annotations

from importlib import metadata

from .analysis.plugins import analysis_sections
from .config import assemble_job

__all__ = ["GROUP", "PluginError", "assemble_job_config", "load_plugins"]

GROUP = "attnclust.plugins"
"""The entry-point group whose modules are imported with attnclust."""


class PluginError(ImportError):
    """An installed plugin failed to import (the message names it and the fix)."""


def load_plugins() -> list[str]:
    """Import every module of the :data:`GROUP` entry points, in name order, then assemble the job's model
    (:func:`assemble_job_config`).

    Returns
    -------
    list of str
        The entry points' names, in the order imported.

    Raises
    ------
    PluginError
        One line naming the plugin, its module, the error and the fix.
    """
    loaded = []
    for entry in sorted(metadata.entry_points(group=GROUP), key=lambda e: e.name):
        try:
            entry.load()
        except Exception as exc:  # noqa: BLE001 - whatever a third-party module raises on import
            first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
            raise PluginError(f"attnclust plugin {entry.name!r} ({entry.value}) failed to import "
                              f"({type(exc).__name__}{': ' + first if first else ''}); fix it or uninstall the "
                              f"package that declares it") from None
        loaded.append(entry.name)
    assemble_job_config()
    return loaded


def assemble_job_config() -> None:
    """Assemble :class:`attnclust.config.JobConfig` from what is registered now: the analyses' sections
    (:func:`attnclust.analysis.plugins.analysis_sections`) and the featurizers' settings
    (:func:`attnclust.config.assemble_job`).

    :func:`load_plugins` calls it once the installed plugins are imported, as ``import attnclust`` does; call it
    again after registering or removing an analysis or a featurizer by hand (a notebook, a test), so that the job
    knows its settings.
    """
    assemble_job(analysis_sections())
