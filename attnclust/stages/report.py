"""Report: the atlas (cluster labels joined to (example, layer, head) by explicit columns, per-head analyses,
per-cluster tables with each cluster's type, description, length view and, when ``cluster_model.json`` has
``cluster_stability``, its stability against ``cluster.min_stability``), the ``syntax`` analysis when
``syntax.conllu`` or ``syntax.spacy_model`` is set (``syntax.parquet``, the ``syntax_best_*`` columns of
``heads.parquet``; otherwise skipped with one line saying why) and the self-contained HTML report.

Its driver-side steps show progress bars (:class:`~attnclust.stages.executors.StepBars`): ``report: syntax
parses``, ``report: syntax heads 3/8 blocks``, ``report: atlas tables``, ``report: mean maps 4/10 clusters``,
``report: writing HTML 3/10 sections``."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..analysis.atlas import stats_block
from ..analysis.heads import analysis_versions
from ..analysis.words import readable_tokens
from ..config import BUNDLED_CONLLU
from ..errors import DataError
from ..layout import RunLayout
from ..store.contract import atomic_write_parquet, open_attention_store, read_features
from .base import RunContext, Stage
from .executors import StepBars

__all__ = ["PROBE_CAUSAL", "PROBE_KEYS", "PROBE_SKIPPED", "SYNTAX_KEYS", "SYNTAX_SKIPPED", "ReportStage",
           "map_source_note"]

SYNTAX_KEYS = ("syntax.conllu", "syntax.spacy_model", "syntax.max_features")
"""Settings of the ``syntax`` analysis; part of the report's fingerprint when the analysis is on."""
SYNTAX_SKIPPED = "syntax: skipped (set syntax.conllu to a CoNLL-U file of gold parses, or syntax.spacy_model)"
"""The line printed when the ``syntax`` analysis is off."""
PROBE_KEYS = ("probe.enabled", "probe.tasks", "probe.labels", "probe.pooling", "probe.top_k", "probe.permutations",
              "probe.null", "probe.max_features")
"""Settings of the ``probe`` analysis; part of the report's fingerprint when the analysis is on."""
PROBE_SKIPPED = "probe: skipped (probe.enabled is false)"
PROBE_CAUSAL = ("probe: skipped (the model is causal: the probes read each head's pooled output and the last "
                "layer's [CLS] state, which extraction keeps for encoders only; a decoder's prompts have no [CLS]. "
                "Set probe.enabled=false to leave this line out)")
"""The line printed when the ``probe`` analysis is off."""


class ReportStage(Stage):
    """``maps.parquet``, ``heads.parquet``, ``clusters.parquet`` and ``report.html``."""

    name = "report"
    version = 2  # 2: Kovaleva types, distinct descriptions, length view, stability flags
    inputs = ("cluster",)
    optional_inputs = ("qa", "importance")
    reads = ("name", "report.title", "report.max_tokens_shown", "cluster.random_state")

    def keys(self, cfg) -> tuple[str, ...]:
        """:attr:`reads`, plus ``cluster.min_stability`` where the configuration has that setting, plus
        :data:`SYNTAX_KEYS` when the syntax analysis is on (off, they leave earlier runs' fingerprints alone)."""
        return self.reads + (("cluster.min_stability",) if hasattr(cfg.cluster, "min_stability") else ()) + (
            SYNTAX_KEYS if _syntax_on(cfg) else ()) + (PROBE_KEYS if _probe_on(cfg) else ())

    def identity(self, ctx: RunContext) -> dict:
        """The registered head analyses' versions, report sections and the head map's version (a new one
        re-renders the report)."""
        from ..analysis.distances import VERSION as HEAD_LAYOUT_VERSION
        from ..report import REPORT_SECTIONS

        identity = {"head_analyses": analysis_versions(), "report_sections": sorted(REPORT_SECTIONS),
                    "head_layout": HEAD_LAYOUT_VERSION}
        conllu = ctx.cfg.syntax.conllu
        if conllu is not None:  # edited gold parses re-render the report
            import hashlib

            path = ctx.cfg.syntax.conllu_path()  # ``bundled``: the packaged file
            identity["syntax_parses"] = hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() \
                else "missing"
        return identity

    def check(self, ctx: RunContext) -> None:
        """With ``syntax.conllu``: the file is read and checked (one-line ``DataError`` naming the file and line)
        and, but for the bundled parses, matched against the run's contexts (this run's data, or
        ``examples.parquet``): a file none of whose sentences is there is refused before any stage runs or
        anything is removed. With ``syntax.spacy_model`` only: spaCy and the pipeline are loaded (one-line
        ``BackendUnavailable`` naming the install step)."""
        syntax = ctx.cfg.syntax
        if syntax.conllu is not None:
            from ..analysis.parses import context_key, match_conllu, read_conllu

            sentences = read_conllu(syntax.conllu_path())
            if syntax.conllu == BUNDLED_CONLLU:  # fits the bundled sample only; otherwise skipped with one line
                return
            if ctx.inputs.get("examples") is not None:  # extract runs too: this run's data
                texts = ctx.inputs["examples"]["context"]
            else:
                try:
                    texts = pd.read_parquet(ctx.layout.examples, columns=["context"])["context"]
                except (OSError, ValueError):  # none (a store of another tool) or damaged: the stages say so
                    return
            match_conllu(syntax.conllu_path(), sentences, {context_key(t): t for t in dict.fromkeys(texts)})
        elif syntax.spacy_model is not None:
            from ..analysis.parses import spacy_parses

            spacy_parses({}, model=syntax.spacy_model)

    def outputs(self, layout: RunLayout) -> tuple[Path, ...]:
        """The joined tables, the head map, the syntax table and its parse cache, and the HTML report."""
        return (layout.table("maps"), layout.table("heads"), layout.table("clusters"), layout.head_layout,
                layout.table("syntax"), layout.parses, layout.probes, layout.probes_summary, layout.report)

    def plan(self, ctx: RunContext, done: set[int]) -> tuple[list[tuple], set[int]]:
        """Blocks only for a store without ``map_stats.parquet`` (written by another tool): its statistics."""
        if ctx.layout.map_stats.exists():
            return [], set()
        # a store written by another tool carries no statistics: compute them from the maps, block by block
        blocks = open_attention_store(ctx.layout.attention).blocks()
        return [(s, e) for s, e in blocks], set()

    task = staticmethod(stats_block)

    def finalize(self, ctx: RunContext, results: list) -> dict:
        """Build the atlas tables, run the head analyses, write ``report.html``."""
        from ..analysis.atlas import build_atlas, cluster_mean_maps, medoid_maps
        from ..analysis.distances import compute_head_layout
        from ..report import ReportInputs, write_report

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
        control = ctx.records.get("extract", {}).get("control_strings") or {}
        if control.get("examples"):
            notes.append(f"{control['examples']:,} question(s) held the model's control-token strings in the "
                         f"context or the question ({', '.join(repr(t) for t in control['strings'][:4])}); they "
                         f"were read as text, never as the control tokens.")
        examples = pd.read_parquet(layout.examples) if layout.examples.exists() else None
        ran = "importance" in ctx.records  # the importance stage ran (when skipped, it wrote nothing)
        importance = pd.read_parquet(layout.importance) if ran and layout.importance.exists() else None
        pruning = pd.read_parquet(layout.pruning) if ran and layout.pruning.exists() else None
        settings = {"job_id": ctx.job_id, "config": cfg.to_dict(), "backend": ctx.backend,
                    "stages": {name: {k_: v for k_, v in rec.items() if k_ != "parts"}
                               for name, rec in ctx.records.items()}}
        with StepBars("report", progress=ctx.progress) as bars:
            syntax = _syntax(ctx, features, bars)
            probes = _probes(ctx, features, bars, examples=examples, qa=qa, predictions=predictions)
            with bars.step("atlas tables"):
                maps, heads, clusters = build_atlas(layout, labels, stats, features, k=k,
                                                    min_stability=_min_stability(cfg), importance=importance,
                                                    syntax=syntax,
                                                    extra={} if predictions is None else {"predictions": predictions})
            mean_sources: dict[int, str] = {}
            mean_maps = cluster_mean_maps(layout, maps, k, random_state=cfg.cluster.random_state, on_step=bars,
                                          sources=mean_sources)
            head_layout = compute_head_layout(open_attention_store(layout.attention),
                                              random_state=cfg.cluster.random_state, on_step=bars)
            atomic_write_parquet(head_layout, layout.head_layout)
            medoid_sources: dict[int, str] = {}
            medoids = medoid_maps(layout, clusters, readable_tokens(features), sources=medoid_sources)
            store = open_attention_store(layout.attention)
            if store.mode != "full":  # say which maps each analysis read (their tables' attrs say it too)
                clustering = ctx.records.get("featurize", {}).get("map_source")
                notes.append(map_source_note(store, {**({"clustering": clustering} if clustering else {}),
                                                     **heads.attrs.get("map_source", {}),
                                                     **head_layout.attrs.get("map_source", {})},
                                             mean_maps=mean_sources, medoids=medoid_sources))
            with bars.step("interactive sample"):
                from ..report.interactive import build_explorer

                explorer = build_explorer(open_attention_store(layout.attention), readable_tokens(features), maps,
                                          predictions=predictions, random_state=cfg.cluster.random_state,
                                          examples=examples)
            inputs = ReportInputs(
                title=cfg.report.title or f"attnclust atlas: {cfg.name}", maps=maps, heads=heads,
                clusters=clusters, mean_maps=mean_maps, medoids=medoids,
                settings=settings, notes=tuple(notes),
                k_scores=_k_scores(cl_record), k_score_name=_k_score_name(cl_record),
                max_tokens_shown=cfg.report.max_tokens_shown, qa=qa, predictions=predictions, pruning=pruning,
                head_layout=head_layout, syntax=syntax, explorer=explorer, probes=probes)
            ctx.stop_if_asked("writing report.html")  # the atlas is built on the driver: no task to cancel
            path = write_report(layout.report, inputs, on_step=bars)
        record = {"report": str(path), "clusters": k}
        if syntax is not None:
            record["syntax"] = {key: syntax.attrs[key] for key in ("sentences", "unmatched", "features", "arcs")}
        if probes is not None:
            record["probe"] = {task: {k_: info[k_] for k_ in ("n", "folds", "top_k_accuracy", "last_layer_accuracy")}
                               for task, info in probes.attrs["summary"]["tasks"].items()}
        return record


def _clusters(n: int) -> str:
    return f"{n:,} cluster{'s' if n != 1 else ''}"


def map_source_note(store, sources: dict[str, str], *, mean_maps: dict[int, str] | None = None,
                    medoids: dict[int, str] | None = None) -> str:
    """The report's note on a compact store: which maps each analysis read (``sources``: analysis -> ``full``,
    ``exact sample`` or ``compact``, as the tables' ``attrs["map_source"]`` hold them), and the share of the row
    mass the compact rows keep as measured at extraction, with the key cap
    (:meth:`~attnclust.store.AttentionStore.kept_text`). The cluster mean maps and medoids read what ``mean_maps``
    and ``medoids`` say (cluster -> source, :func:`~attnclust.analysis.atlas.cluster_mean_maps`,
    :func:`~attnclust.analysis.atlas.medoid_maps`; ``None``: the compact ones); the embedded question maps are the
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


def _syntax_on(cfg) -> bool:
    syntax = getattr(cfg, "syntax", None)
    return syntax is not None and (syntax.conllu is not None or syntax.spacy_model is not None)


def _syntax(ctx: RunContext, features: pd.DataFrame, bars: StepBars) -> pd.DataFrame | None:
    """The ``syntax`` analysis (``syntax.parquet``), or ``None`` with one line saying why it was skipped.

    The table's ``attrs`` say where the parses came from (``source``), how many sentences were found in the
    contexts (``sentences``; ``unmatched`` of a CoNLL-U file were not), and how many features and arcs were read.
    """
    from ..analysis.parses import load_parses
    from ..analysis.syntax import syntax_table

    layout, cfg = ctx.layout, ctx.cfg
    if not _syntax_on(cfg):
        layout.remove(layout.table("syntax"))  # never a table of an earlier configuration
        ctx.note(SYNTAX_SKIPPED)
        return None
    if "offsets" not in features.columns:
        layout.remove(layout.table("syntax"))
        ctx.note(f"syntax: skipped ({layout.features.name} has no token offsets to align parses with: the store "
                 f"was not extracted by attnclust)")
        return None
    conllu, model = cfg.syntax.conllu, cfg.syntax.spacy_model
    with bars.step("syntax parses"):
        try:
            parses = load_parses(layout, conllu=cfg.syntax.conllu_path(),
                                 spacy_model=None if conllu is not None else model)
        except DataError:
            if conllu != BUNDLED_CONLLU:
                raise
            layout.remove(layout.table("syntax"))  # the bundled parses fit only some of the sample's contexts
            ctx.note(f"syntax: skipped (syntax.conllu: {BUNDLED_CONLLU} parses sentences of the bundled sample, and "
                     f"none of them is in this run's contexts; set syntax.conllu to a CoNLL-U file of your "
                     f"contexts, or syntax.spacy_model; with the bundled sample and data.max_examples, keep more "
                     f"of it)")
            return None
    store = open_attention_store(layout.attention)
    features = features[features["feature_id"].isin(store.exact_ids())]  # a compact store: its exact sample
    if cfg.syntax.max_features is not None:
        features = features.iloc[:cfg.syntax.max_features]
    table = syntax_table(layout, parses, features, progress=lambda done, total: bars("syntax heads", done, total,
                                                                                     "blocks"))
    if conllu is not None:  # sentences of the file found in a context (the cache keeps each one's index)
        from ..analysis.parses import read_conllu

        found = int(parses["sentence"].nunique())
        unmatched = len(read_conllu(cfg.syntax.conllu_path())) - found
    else:
        found, unmatched = len(parses.drop_duplicates(["context_key", "sentence"])), 0
    table.attrs.update({
        "source": f"gold CoNLL-U {cfg.syntax.conllu_path().name}" if conllu is not None else f"spaCy {model}",
        "sentences": found, "unmatched": unmatched, "features": len(features),
        "arcs": int(table.groupby("relation")["n"].max().sum())})
    ctx.note(f"syntax: {found} parsed sentence(s) found in the contexts"
             + (f" ({unmatched} of the file in none)" if unmatched else "")
             + f", {table.attrs['arcs']:,} arcs over {len(features):,} features"
             + (" (the store's exact sample)" if store.exact_source == "exact sample" else "")
             + f" -> {layout.table('syntax').name}")
    return table


def _probe_on(cfg) -> bool:
    probe = getattr(cfg, "probe", None)
    return probe is not None and probe.enabled


def _probes(ctx: RunContext, features: pd.DataFrame, bars: StepBars, *, examples: pd.DataFrame | None,
            qa: dict | None, predictions: pd.DataFrame | None) -> pd.DataFrame | None:
    """The ``probe`` analysis (``probes.parquet``, ``probes_summary.json``), or ``None`` with one line saying why.

    ``examples``, ``qa`` (``qa_scores.json``) and ``predictions`` are the run's, as the report stage read them (``None``
    when absent). The features of the first questions (whole questions, in file order) up to ``probe.max_features`` are
    probed; the table's ``attrs["summary"]`` holds ``probes_summary.json``.
    """
    from ..analysis.probes import probe_labels, probe_table, read_head_outputs
    from ..store.contract import atomic_write_json

    layout, cfg = ctx.layout, ctx.cfg
    layout.remove(layout.probes, layout.probes_summary)  # never the tables of an earlier configuration
    if not _probe_on(cfg):
        ctx.note(PROBE_SKIPPED)
        return None
    if "part" in features.columns:  # a causal model's prompts (attnclust.qa.prompting)
        ctx.note(PROBE_CAUSAL)
        return None
    if not layout.head_outputs.exists() or examples is None:
        ctx.note(f"probe: skipped (the run has no {layout.head_outputs.name}: set extract.head_outputs=true and "
                 f"re-run extract with --force, or set probe.enabled=false)")
        return None
    builtin, untrained = cfg.probe.tasks, []
    if "correct" in builtin and predictions is not None and not qa["head_trained"]:
        builtin = tuple(t for t in builtin if t != "correct")
        untrained = [("probe correct: skipped (the model's QA head is untrained, so right/wrong is noise: fine-tune "
                      "it or use a SQuAD 2.0 checkpoint)")]
    tasks = (*builtin, *cfg.probe.labels)
    labels, skipped = probe_labels(examples, tasks=builtin, labels=cfg.probe.labels, predictions=predictions)
    skipped = untrained + skipped
    per_example = features.groupby("example_id").size().reindex(examples["id"].astype(str)).fillna(0)
    if cfg.probe.max_features is not None:
        per_example = per_example[per_example.cumsum() <= cfg.probe.max_features]
    chosen = features[features["example_id"].astype(str).isin(per_example.index)].sort_values("feature_id")
    heads, last = read_head_outputs(layout.head_outputs, cfg.probe.pooling, chosen["feature_id"].to_numpy())
    tasks = [t for t in tasks if t in labels.columns]
    table, summary = probe_table(heads, last, labels, chosen["example_id"].to_numpy(), tasks=tasks,
                                 pooling=cfg.probe.pooling, permutations=cfg.probe.permutations,
                                 null=cfg.probe.null,
                                 top_k=cfg.probe.top_k, seed=cfg.cluster.random_state,
                                 on_head=lambda task, done, total: bars(f"probe {task}", done, total, "heads"))
    summary["skipped"] = skipped + summary["skipped"]
    summary["features"], summary["examples"] = len(chosen), len(per_example)
    for line in summary["skipped"] + summary["notes"]:
        ctx.note(line)
    atomic_write_parquet(table, layout.probes)
    atomic_write_json(layout.probes_summary, summary)
    done = ", ".join(f"{t} {info['top_k_accuracy']:.2f} top-{info['top_k']} vs "
                     + (f"{info['last_layer_accuracy']:.2f}" if info["last_layer_accuracy"] is not None else "-")
                     + " last layer" for t, info in summary["tasks"].items())
    ctx.note(f"probe: {len(summary['tasks'])} task(s) over {len(chosen):,} features ({cfg.probe.pooling})"
             + (f": {done}" if done else "") + f" -> {layout.probes.name}")
    table.attrs["summary"] = summary
    return table


def _min_stability(cfg) -> float:
    """``cluster.min_stability``, or the atlas' default where the configuration does not have that setting."""
    from ..analysis.atlas import DEFAULT_MIN_STABILITY

    return float(getattr(cfg.cluster, "min_stability", DEFAULT_MIN_STABILITY))


def _k_scores(record: dict) -> dict[int, float] | None:
    """The score that chose k: split-half stability per candidate (silhouette in runs made before it)."""
    scores = record.get("k_stability") or record.get("k_scores") or {}
    return {int(k): float(v) for k, v in scores.items() if v is not None} or None


def _k_score_name(record: dict) -> str:
    return "split-half stability (median ARI)" if record.get("k_stability") else "silhouette"
