"""Report: the atlas (cluster labels joined to (example, layer, head) by explicit columns, per-head analyses,
per-cluster tables with each cluster's type, description, length view and, when ``cluster_model.json`` has
``cluster_stability``, its stability against ``cluster.min_stability``), the registered analysis plugins
(:mod:`attnclust.analysis.plugins`: the head map, ``syntax``, ``probe``, the importance stage's tables; each runs or
says in one line why not, and declares its outputs, fingerprint keys and report section) and the self-contained
HTML report.

Its driver-side steps show progress bars (:class:`~attnclust.executors.StepBars`): ``report: head
distances``, ``report: syntax parses``, ``report: syntax heads 3/8 blocks``, ``report: atlas tables``,
``report: mean maps 4/10 clusters``, ``report: writing HTML 3/10 sections`` and, on a cluster, whose workers draw
the figures while the driver builds the sections (:mod:`attnclust.report.pictures`), ``report: pictures 30/38``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from ..analysis.atlas import DEFAULT_MIN_STABILITY, build_atlas, stats_block
from ..analysis.heads import analysis_versions
from ..analysis.plugins import (
    AnalysisContext,
    analysis_plugins,
    check_analyses,
    map_sources,
    report_identity,
    report_keys,
    report_outputs,
    run_analyses,
)
from ..analysis.thumbnails import cluster_mean_maps, medoid_maps
from ..analysis.words import readable_tokens
from ..data.text import reads_text
from ..executors import StepBars
from ..layout import RunLayout
from ..models.kinds import kind_of
from ..store.contract import atomic_write_parquet, open_attention_store, read_features
from .base import RunContext, Stage

__all__ = ["TEXT_NOTE", "ReportStage", "map_source_note"]

TEXT_NOTE = ("The data is natural text (data.format: text): no questions, so the sections on question answering, "
             "head importance, probes, answer attention and what predicts a right answer are left out.")
"""The report's one line on a run over natural text."""


class ReportStage(Stage):
    """``maps.parquet``, ``heads.parquet``, ``clusters.parquet`` and ``report.html``."""

    name = "report"
    version = 2  # 2: Kovaleva types, distinct descriptions, length view, stability flags
    inputs = ("cluster",)
    optional_inputs = ("qa", "importance")
    reads = ("name", "report.title", "report.max_tokens_shown", "cluster.random_state")

    def keys(self, cfg) -> tuple[str, ...]:
        """:attr:`reads`, plus ``cluster.min_stability`` where the configuration has that setting, plus the
        settings keys of every analysis plugin that is on (off, they leave earlier runs' fingerprints alone:
        :meth:`attnclust.analysis.plugins.AnalysisPlugin.fingerprint_keys`)."""
        return self.reads + (("cluster.min_stability",) if hasattr(cfg.cluster, "min_stability") else ()) + \
            report_keys(cfg)

    def identity(self, ctx: RunContext) -> dict:
        """The registered head analyses' versions, report sections and what the analysis plugins declare (the
        head map's version, the gold parses' hash ...): a new one re-renders the report."""
        from ..report import REPORT_SECTIONS  # lazy: pulls matplotlib and jinja2; every worker imports attnclust.stages

        return {"head_analyses": analysis_versions(), "report_sections": sorted(REPORT_SECTIONS),
                **report_identity(ctx.cfg)}

    def check(self, ctx: RunContext) -> None:
        """Every analysis plugin's pre-flight check (``syntax.conllu`` is read and matched to the run's contexts,
        ``syntax.spacy_model`` loaded): a setting that cannot work is refused before any stage runs. An analysis
        whose declared report section is not registered (its module not imported) is a ``RuntimeError``."""
        from ..report import REPORT_SECTIONS  # lazy: pulls matplotlib and jinja2 (as above)

        for plugin in analysis_plugins():
            if plugin.section is not None and plugin.section not in REPORT_SECTIONS:
                raise RuntimeError(f"analysis {plugin.name!r} declares the report section {plugin.section!r}, which "
                                   f"is not registered; register it (attnclust.report.report_section) where the "
                                   f"analysis is registered")
        check_analyses(ctx)

    def outputs(self, layout: RunLayout) -> tuple[Path, ...]:
        """The joined tables, the analysis plugins' files (the head map, the syntax table and its parse cache, the
        probes) and the HTML report."""
        return (layout.table("maps"), layout.table("heads"), layout.table("clusters"), *report_outputs(layout),
                layout.report)

    def plan(self, ctx: RunContext, done: set[int]) -> tuple[list[tuple], set[int]]:
        """Blocks only for a store without ``map_stats.parquet`` (written by another tool): its statistics."""
        if ctx.layout.map_stats.exists():
            return [], set()
        # a store written by another tool carries no statistics: compute them from the maps, block by block
        blocks = open_attention_store(ctx.layout.attention).blocks()
        return [(s, e) for s, e in blocks], set()

    task = staticmethod(stats_block)
    worker_imports = ("attnclust.report.pictures",)  # matplotlib: the workers draw the pictures

    def finalize(self, ctx: RunContext, results: list) -> dict:
        """Run the analysis plugins, build the atlas tables, run the head analyses, write ``report.html``."""
        from ..report import ReportInputs, write_report  # lazy: pulls matplotlib and jinja2 (as above)

        layout, cfg = ctx.layout, ctx.cfg
        if results:
            layout.record(layout.map_stats)
            atomic_write_parquet(pd.concat(results, ignore_index=True), layout.map_stats)
        features = read_features(layout.root)
        labels = pd.read_parquet(layout.cluster_labels)
        stats = pd.read_parquet(layout.map_stats)
        cl_record = ctx.records["cluster"]
        k = int(cl_record["k"])
        qa = json.loads(layout.qa_scores.read_text()) if "qa" in ctx.records and layout.qa_scores.exists() else None
        predictions = pd.read_parquet(layout.predictions) if qa else None
        notes = [] if qa is None or qa["head_trained"] else [qa["note"]]
        if reads_text(ctx.records):
            notes.append(TEXT_NOTE)
        unit = cl_record.get("resampling") or ""
        if "windows" in unit:  # the examples are the usual unit: said only when it is not
            notes.append(f"Cluster stability (the choice of k, per-cluster stability) {unit}.")
        control = ctx.records.get("extract", {}).get("control_strings") or {}
        if control.get("examples"):
            held = "text(s) held" if reads_text(ctx.records) else "question(s) held"
            where = "" if reads_text(ctx.records) else " in the context or the question"
            notes.append(f"{control['examples']:,} {held} the model's control-token strings{where} "
                         f"({', '.join(repr(t) for t in control['strings'][:4])}); they "
                         f"were read as text, never as the control tokens.")
        examples = pd.read_parquet(layout.examples) if layout.examples.exists() else None
        settings = {"job_id": ctx.job_id, "config": cfg.to_dict(), "backend": ctx.backend,
                    "stages": {name: {k_: v for k_, v in rec.items() if k_ != "parts"}
                               for name, rec in ctx.records.items()}}
        with StepBars("report", progress=ctx.progress) as bars:
            analyses = run_analyses(AnalysisContext(layout=layout, cfg=cfg, features=features, examples=examples,
                                                    qa=qa, predictions=predictions, records=ctx.records,
                                                    note=ctx.note, bars=bars))
            with bars.step("atlas tables"):
                maps, heads, clusters = build_atlas(layout, labels, stats, features, k=k,
                                                    min_stability=_min_stability(cfg), analyses=analyses,
                                                    extra={} if predictions is None else {"predictions": predictions})
            mean_sources: dict[int, str] = {}
            mean_maps = cluster_mean_maps(layout, maps, k, random_state=cfg.cluster.random_state, on_step=bars,
                                          sources=mean_sources)
            medoid_sources: dict[int, str] = {}
            medoids = medoid_maps(layout, clusters, readable_tokens(features), sources=medoid_sources)
            store = open_attention_store(layout.attention)
            if store.mode != "full":  # say which maps each analysis read (their tables' attrs say it too)
                clustering = ctx.records.get("featurize", {}).get("map_source")
                notes.append(map_source_note(store, {**({"clustering": clustering} if clustering else {}),
                                                     **heads.attrs.get("map_source", {}),
                                                     **map_sources(analyses)},
                                             mean_maps=mean_sources, medoids=medoid_sources))
            with bars.step("interactive sample"):
                from ..report.interactive import build_explorer  # lazy: as above

                explorer = build_explorer(open_attention_store(layout.attention), readable_tokens(features), maps,
                                          predictions=predictions, random_state=cfg.cluster.random_state,
                                          examples=examples)
            inputs = ReportInputs(
                title=cfg.report.title or f"attnclust atlas: {cfg.name}", maps=maps, heads=heads,
                clusters=clusters, mean_maps=mean_maps, medoids=medoids,
                settings=settings, notes=tuple(notes),
                k_scores=_k_scores(cl_record), k_score_name=_k_score_name(cl_record),
                max_tokens_shown=cfg.report.max_tokens_shown, qa=qa, predictions=predictions,
                analyses=analyses, explorer=explorer,
                kind=kind_of(features),  # a decoder's cards leave out the next token and [SEP]
                kv_heads=store.attrs.get("num_key_value_heads"))  # grouped key/value heads: the grid by group
            ctx.stop_if_asked("writing report.html")  # the atlas is built on the driver: no task to cancel
            # on a cluster its workers draw the figures while the driver builds the sections; then the driver draws
            # those not yet drawn too where it has a core of its own (an embedded cluster of fewer workers than
            # cores), not beside a scheduler (attnclust submit) nor where the workers take every core
            ex = ctx.executor
            beside = ex.start if ex.client is not None else None
            spare = beside is not None and ex.owns_workers and ex.n_workers < len(os.sched_getaffinity(0))
            path = write_report(layout.report, inputs, on_step=bars, start=beside, draw_here=spare)
        record = {"report": str(path), "clusters": k}
        for plugin in analysis_plugins():  # each analysis' part of the record, under its name
            if plugin.record is not None and plugin.name in analyses:
                record[plugin.name] = plugin.record(analyses[plugin.name])
        return record


def _clusters(n: int) -> str:
    return f"{n:,} cluster{'s' if n != 1 else ''}"


def map_source_note(store, sources: dict[str, str], *, mean_maps: dict[int, str] | None = None,
                    medoids: dict[int, str] | None = None) -> str:
    """The report's note on a compact store: which maps each analysis read (``sources``: analysis -> ``full``,
    ``exact sample`` or ``compact``, as the tables' ``attrs["map_source"]`` hold them), and the share of the row
    mass the compact rows keep as measured at extraction, with the key cap
    (:meth:`~attnclust.store.AttentionStore.kept_text`). The cluster mean maps and medoids read what ``mean_maps``
    and ``medoids`` say (cluster -> source, :func:`~attnclust.analysis.thumbnails.cluster_mean_maps`,
    :func:`~attnclust.analysis.thumbnails.medoid_maps`; ``None``: the compact ones); the embedded question maps are the
    compact ones."""
    groups: dict[str, list[str]] = {"exact sample": [], "compact": [], "full": []}
    for name, source in sources.items():
        groups[source].append(name.replace("_", " "))
    per_cluster = {"cluster mean maps": ("the mean maps", mean_maps), "medoid maps": ("the medoids", medoids)}
    for what, (of, read) in per_cluster.items():
        found = set((read or {}).values()) or {"compact"}
        if found == {"exact sample"}:
            groups["exact sample"].append(what)
        elif "exact sample" in found:
            count = {s: sum(v == s for v in read.values()) for s in ("exact sample", "compact")}
            groups["exact sample"].append(f"{of} of {_clusters(count['exact sample'])}")
            groups["compact"].append(f"{of} of {_clusters(count['compact'])} without maps in the sample")
        else:
            groups["compact"].append(what)
    groups["compact"].append("the question maps of this page")
    n = len(store.exact_features) if store.exact is not None else 0
    said = {"exact sample": f"exact maps of the store's sample of {n:,} features",
            "compact": "compact maps",
            "full": "statistics (and profile vectors) computed from every exact map at extraction"}
    parts = [f"{said[source]}: {', '.join(names)}" for source, names in groups.items() if names]
    return (f"The attention store is compact: each query row keeps only its largest weights ({store.kept_text()}; "
            f"the rest of the row is dropped), so maps drawn from it are approximate. Read from "
            f"{'; from '.join(parts)}.")


def _min_stability(cfg) -> float:
    """``cluster.min_stability``, or the atlas' default where the configuration does not have that setting."""

    return float(getattr(cfg.cluster, "min_stability", DEFAULT_MIN_STABILITY))


def _k_scores(record: dict) -> dict[int, float] | None:
    """The score that chose k: split-half stability per candidate, or the silhouettes of a clustering record that
    holds no stability per k."""
    scores = record.get("k_stability") or record.get("k_scores") or {}
    return {int(k): float(v) for k, v in scores.items() if v is not None} or None


def _k_score_name(record: dict) -> str:
    return "split-half stability (median ARI)" if record.get("k_stability") else "silhouette"
