"""Analyses as plugins: an analysis of a run is one module that declares its settings, outputs, fingerprint and
report section beside its code, and registers them (:func:`register_analysis`); nothing else needs editing.

The report stage runs every registered analysis on the driver, in registration order, before it builds the atlas
(:mod:`attnclust.stages.report`), and hands their results on by name: :func:`~attnclust.analysis.atlas.build_atlas`
joins their per-head columns to ``heads.parquet`` and the report's sections read them from
:attr:`attnclust.report.ReportInputs.analyses`. What an analysis declares, and what it reaches:

- ``settings``: a frozen settings model (``SECTION`` its name, e.g. ``syntax``): a section of every job once the
  job is assembled (:func:`attnclust.config.assemble_job` with :func:`analysis_sections`): job files,
  ``--set syntax.conllu=...``, ``cfg.syntax``, the job reference generated from the models;
- ``outputs``: the files it writes, paths of the run's layout (``layout.table("syntax")``): the report stage
  records them as its own and removes them when it is invalidated;
- its fingerprint: the settings keys it reads (``keys``; by default every key of its section while it is on) and
  what else its outputs depend on (``identity``: a file's hash; ``version``), part of the report stage's
  fingerprint, so changing them re-renders the report;
- ``section``: the name of the report section that shows it (one module of :mod:`attnclust.report.sections`, or
  a section registered with :func:`attnclust.report.report_section` next to the analysis).

Head analyses (:mod:`.heads`: columns of ``heads.parquet`` from the maps table) and per-map statistics
(:mod:`.stats`) have registries of their own; a plugin is an analysis with settings or files of its own.

Example, a whole analysis (``tests/unit/analysis/test_analysis_plugins.py`` registers one like it, with its section)::

    class ToyConfig(_Model):  # its docstring's Parameters section describes ``factor`` (the job reference)
        SECTION = "toy"
        factor: int = _int(2, 1)

    @register_analysis("toy", settings=ToyConfig, section="toy", outputs=lambda layout: (layout.table("toy"),),
                       heads=lambda table: table)
    def toy(ctx: AnalysisContext) -> pd.DataFrame:
        table = ...  # one row per (layer, head), from ctx.cfg.toy.factor
        atomic_write_parquet(table, ctx.layout.table("toy"))
        return table
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from .._settings import _name_of
from ..config import check_section
from ..errors import DataError
from ..layout import RunLayout

__all__ = ["ANALYSES", "AnalysisContext", "AnalysisPlugin", "analysis_plugins", "analysis_sections", "check_analyses",
           "join_heads", "map_sources", "register_analysis", "report_identity", "report_keys", "report_outputs",
           "run_analyses", "unregister_analysis"]


@dataclass
class AnalysisContext:
    """What an analysis may use when the report stage runs it (on the driver).

    Attributes
    ----------
    layout : RunLayout
        The run's paths (its stores, tables, and ``layout.table(name)`` for a table of its own).
    cfg : attnclust.config.JobConfig
        The job (``cfg.<section>``: the analysis' settings).
    features : pandas.DataFrame
        ``features.parquet``.
    examples, predictions : pandas.DataFrame or None
        ``examples.parquet`` and ``predictions.parquet`` when the run has them.
    qa : dict or None
        ``qa_scores.json`` when the run scored the model's answers.
    records : dict
        The finished stages' records by name (``"importance" in records``: that stage ran).
    note : callable
        ``note(line)`` prints one line when progress is on (why it was skipped, what it found).
    bars : object or None
        The report stage's progress bars (:class:`attnclust.executors.StepBars`); use :meth:`step` and
        :meth:`progress`, which do nothing without bars.
    """

    layout: RunLayout
    cfg: Any
    features: pd.DataFrame
    examples: pd.DataFrame | None = None
    qa: dict | None = None
    predictions: pd.DataFrame | None = None
    records: dict = field(default_factory=dict)
    note: Callable[[str], None] = print
    bars: Any = None

    def step(self, label: str) -> contextlib.AbstractContextManager:
        """A progress bar for one piece of work: ``with ctx.step("syntax parses"): ...``."""
        return self.bars.step(label) if self.bars is not None else contextlib.nullcontext()

    def progress(self, label: str, done: int, total: int = 1, unit: str = "") -> None:
        """Show that ``done`` of ``total`` ``unit`` of ``label`` are finished (:data:`attnclust.executors.OnStep`)."""
        if self.bars is not None:
            self.bars(label, done, total, unit)


@dataclass(frozen=True)
class AnalysisPlugin:
    """A registered analysis (see the module docstring; :func:`register_analysis` builds one).

    Attributes
    ----------
    name : str
        Its name: the key of its result (:attr:`attnclust.report.ReportInputs.analyses`) and of its part of the
        report stage's record.
    run : callable
        ``run(ctx: AnalysisContext) -> result or None``: computes, writes its outputs, returns what its section
        and ``heads`` read (``None``: nothing this run, with a line saying why; then it leaves none of its
        outputs behind).
    settings : type or None
        Its frozen settings model, a section of every job (``settings.SECTION``).
    outputs : callable
        ``outputs(layout) -> tuple of Path``: the files it writes.
    enabled : callable or None
        ``enabled(cfg) -> bool``; default: its section's ``enabled`` setting when it has one, else on.
    keys : callable or None
        ``keys(cfg) -> tuple of str``: the dotted settings keys its outputs depend on; default: every key of its
        section while it is on (off, they leave the fingerprint of runs without it alone).
    identity : callable or None
        ``identity(cfg) -> dict``: what else its outputs depend on (the gold parses' hash), merged into the
        report stage's fingerprint.
    version : int
        Bumped when what it computes changes: recorded in the report stage's fingerprint under ``analyses``
        (every analysis declares one, a positive integer; the conformance suite, ``tests/conformance``, checks that
        changing it changes the fingerprint).
    heads : callable or None
        ``heads(result) -> DataFrame or None`` with ``layer``, ``head`` and columns joined to ``heads.parquet``.
    record : callable or None
        ``record(result) -> dict``: its part of the report stage's record.
    section : str or None
        The report section that shows it (reading ``inputs.analyses[name]``); the report stage refuses to start
        when no section of that name is registered.
    check : callable or None
        ``check(ctx)`` before any stage runs or anything is written (``ctx``: the stage's
        :class:`attnclust.stages.base.RunContext`: ``cfg``, ``layout``, ``inputs``); raises on a setting that
        cannot work (a gold parses file that does not read).
    validate : callable or None
        ``validate(result)`` raises :class:`~attnclust.errors.DataError` when a result handed to the report
        (:class:`attnclust.report.ReportInputs`) lacks what its section reads.
    """

    name: str
    run: Callable[[AnalysisContext], Any]
    settings: type | None = None
    outputs: Callable[[RunLayout], tuple[Path, ...]] = lambda layout: ()
    enabled: Callable[[Any], bool] | None = None
    keys: Callable[[Any], tuple[str, ...]] | None = None
    identity: Callable[[Any], dict] | None = None
    version: int = 1
    heads: Callable[[Any], pd.DataFrame | None] | None = None
    record: Callable[[Any], dict] | None = None
    section: str | None = None
    check: Callable[[Any], None] | None = None
    validate: Callable[[Any], None] | None = None

    def is_on(self, cfg) -> bool:
        """Whether it runs under ``cfg`` (:attr:`enabled`)."""
        if self.enabled is not None:
            return bool(self.enabled(cfg))
        section = getattr(cfg, self.settings.SECTION, None) if self.settings is not None else None
        return bool(getattr(section, "enabled", True))

    def fingerprint_keys(self, cfg) -> tuple[str, ...]:
        """The settings keys of the report stage's fingerprint it adds under ``cfg`` (:attr:`keys`)."""
        if self.keys is not None:
            return tuple(self.keys(cfg))
        if self.settings is None or not self.is_on(cfg):
            return ()
        return tuple(f"{self.settings.SECTION}.{name}" for name in self.settings.model_fields)


ANALYSES: dict[str, AnalysisPlugin] = {}
"""Registered analyses by name, in registration order (the order the report stage runs them)."""


def register_analysis(name: str, **declared: Any) -> Callable:
    """Decorator registering ``run(ctx: AnalysisContext) -> result or None`` as the analysis ``name``, with the
    declarations of :class:`AnalysisPlugin` as keywords (``settings=``, ``outputs=``, ``section=`` ...).

    Its settings model becomes a section of every job when the job is assembled
    (:func:`attnclust.plugins.assemble_job_config`; ``import attnclust`` assembles it once the installed plugins are
    loaded): registering changes no job. Registering a name again replaces the earlier analysis (a module reloaded,
    a test's toy).

    Raises
    ------
    ValueError
        ``name`` is not a lower-case identifier, or its section cannot join the job (a stage's section, or one
        another analysis declares).
    TypeError
        An unknown declaration.
    """
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(f"analysis name {name!r}: allowed: a lower-case name (letters, digits, '_')")
    version = declared.get("version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"register_analysis({name!r}): version={version!r}; declare a positive integer, bumped "
                         f"when what it computes changes (part of the report stage's fingerprint)")
    unknown = set(declared) - set(AnalysisPlugin.__dataclass_fields__) - {"name", "run"}
    if unknown:
        raise TypeError(f"register_analysis({name!r}): unknown declaration(s) {', '.join(sorted(unknown))}; allowed: "
                        f"{', '.join(f for f in AnalysisPlugin.__dataclass_fields__ if f not in ('name', 'run'))}")

    def register(fn: Callable[[AnalysisContext], Any]) -> Callable[[AnalysisContext], Any]:
        plugin = AnalysisPlugin(name=name, run=fn, **declared)
        if plugin.settings is not None:
            check_section(plugin.settings)
            for other in ANALYSES.values():
                if other.name != name and other.settings is not None and \
                        other.settings.SECTION == plugin.settings.SECTION and \
                        _name_of(other.settings) != _name_of(plugin.settings):
                    raise ValueError(f"section {plugin.settings.SECTION!r} of {plugin.settings.__name__}: already "
                                     f"declared by {other.settings.__name__} (analysis {other.name!r}); choose "
                                     f"another name")
        ANALYSES[name] = plugin
        return fn

    return register


def unregister_analysis(name: str) -> AnalysisPlugin:
    """Remove the analysis ``name``; returns it (``KeyError`` when none). Its job section goes when the job is
    assembled again."""
    return ANALYSES.pop(name)


def analysis_plugins() -> tuple[AnalysisPlugin, ...]:
    """The registered analyses in registration order."""
    return tuple(ANALYSES.values())


def analysis_sections() -> tuple[type, ...]:
    """The registered analyses' settings models, in registration order: the sections the job is assembled with
    (:func:`attnclust.plugins.assemble_job_config`)."""
    return tuple(plugin.settings for plugin in ANALYSES.values() if plugin.settings is not None)


# -- what the report stage asks of them, once for all --------------------------------------------------------------

def report_keys(cfg) -> tuple[str, ...]:
    """Every analysis' settings keys in the report stage's fingerprint under ``cfg``."""
    return tuple(key for plugin in ANALYSES.values() for key in plugin.fingerprint_keys(cfg))


def report_identity(cfg) -> dict:
    """Every analysis' identity, and the versions of those that record one (``analyses``: name -> version)."""
    out: dict = {}
    for plugin in ANALYSES.values():
        if plugin.identity is not None:
            out.update(plugin.identity(cfg))
    versions = {p.name: p.version for p in ANALYSES.values()}
    if versions:
        out["analyses"] = versions
    return out


def report_outputs(layout: RunLayout) -> tuple[Path, ...]:
    """Every analysis' output files, in registration order."""
    return tuple(path for plugin in ANALYSES.values() for path in plugin.outputs(layout))


def check_analyses(ctx: Any) -> None:
    """Every analysis' pre-flight :attr:`AnalysisPlugin.check` (``ctx``: the stage's ``RunContext``)."""
    for plugin in ANALYSES.values():
        if plugin.check is not None:
            plugin.check(ctx)


def run_analyses(ctx: AnalysisContext) -> dict[str, Any]:
    """Run every registered analysis in order; name -> result, for those that returned one."""
    results = {}
    for plugin in ANALYSES.values():
        result = plugin.run(ctx)
        if result is not None:
            results[plugin.name] = result
    return results


def join_heads(heads: pd.DataFrame, results: Mapping[str, Any]) -> tuple[pd.DataFrame, dict[str, str]]:
    """``heads`` with the per-head columns of every analysis that declares ``heads`` and has a result, joined on
    (layer, head) in registration order; and the maps those analyses read (their results' ``attrs["map_source"]``).

    Raises
    ------
    attnclust.errors.DataError
        An analysis' columns lack ``layer`` / ``head``, clash with columns already there, or hold a head twice.
    """
    sources: dict[str, str] = {}
    for plugin in ANALYSES.values():
        result = results.get(plugin.name)
        if result is None or plugin.heads is None:
            continue
        table = plugin.heads(result)
        if table is None:
            continue
        clash = [c for c in table.columns if c in heads.columns and c not in ("layer", "head")]
        if clash or not {"layer", "head"} <= set(table.columns):
            raise DataError(f"analysis {plugin.name!r}: its heads columns must hold layer, head and new columns; "
                            f"got {sorted(table.columns)}" + (f" ({clash[0]!r} is already in heads.parquet)"
                                                               if clash else ""))
        heads = heads.merge(table.astype({"layer": heads["layer"].dtype, "head": heads["head"].dtype}),
                            on=["layer", "head"], how="left", validate="one_to_one")
        sources.update(getattr(result, "attrs", {}).get("map_source", {}))
    return heads, sources


def map_sources(results: Mapping[str, Any]) -> dict[str, str]:
    """Analysis -> the maps it read (``full``, ``exact sample``, ``compact``), from every result that says
    (``attrs["map_source"]``: :func:`attnclust.analysis.heads.map_source`)."""
    out: dict[str, str] = {}
    for plugin in ANALYSES.values():
        out.update(getattr(results.get(plugin.name), "attrs", {}).get("map_source", {}))
    return out

