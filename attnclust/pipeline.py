"""Running a job: input checks, the output-dir lock, the four stages as Dask graphs, and ``job.json``.

Every input (data, model, featurizer weights, config) is checked before the output directory is touched, so
bad input leaves nothing behind. Each stage records its configuration fingerprint; re-running the same command
after an interruption skips finished blocks, and a different configuration is refused unless ``force``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import platform
import secrets
import string
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd

from . import backend as bk
from .config import JobConfig
from .errors import AttnclustError, DataError, JobCancelled, StoreError
from .runtime import dask_client, run_tasks
from .store import ATTENTION, OutputDir, atomic_write_json, atomic_write_parquet, open_attention_store, read_features

__all__ = ["STAGES", "JobResult", "make_job_id", "run_job"]

STAGES = ("extract", "featurize", "cluster", "report")
PACKAGES = ("attnclust", "torch", "torchvision", "transformers", "dask", "distributed", "zarr", "numpy",
            "pandas", "scikit-learn", "umap-learn")


@dataclass
class JobResult:
    """What a run produced: the output dir, the job id, per-stage records and the report path."""

    out: Path
    job_id: str
    stages: dict[str, dict] = field(default_factory=dict)

    @property
    def report(self) -> Path:
        return self.out / "report.html"


def make_job_id(name: str) -> str:
    """``{name}_{6 random chars}``: the prefix of every task key of this run (dashboard groups by it)."""
    alphabet = string.ascii_lowercase + string.digits
    return f"{name}_{''.join(secrets.choice(alphabet) for _ in range(6))}"


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


# -- input checks (nothing is written) ------------------------------------------------------------------------
def prepare_inputs(cfg: JobConfig) -> dict:
    """Read and validate the data, tokenise it, check the model and featurizer; nothing is written."""
    from .data import read_squad, sample_path, tokenize_examples
    from .extract import plan_features
    from .models import describe_model, get_tokenizer

    path = Path(cfg.data.path).expanduser() if cfg.data.path else sample_path()
    examples = read_squad(path, max_examples=cfg.data.max_examples)
    model_info = describe_model(cfg.model)
    tokenizer = get_tokenizer(cfg.model)
    features = tokenize_examples(examples, tokenizer, max_seq_len=cfg.extract.max_seq_len,
                                 doc_stride=cfg.extract.doc_stride, max_query_len=cfg.extract.max_query_len)
    if features.empty:
        raise DataError(f"data file {path}: zero usable examples after tokenisation; check the file")
    table = pd.DataFrame({
        "id": [e.id for e in examples], "title": [e.title for e in examples],
        "question": [e.question for e in examples], "context": [e.context for e in examples],
        "answer_texts": [[a.text for a in e.answers] for e in examples],
        "answer_starts": [[a.answer_start for a in e.answers] for e in examples],
        "is_impossible": [e.is_impossible for e in examples]})
    return {"data_path": str(path), "examples": table, "features": plan_features(features),
            "model_info": model_info}


def check_featurizer(cfg: JobConfig) -> None:
    if cfg.featurize.method == "resnet":
        from .featurize.resnet import check_weights

        check_weights(cfg.featurize.arch, cfg.featurize.weights)


# -- stages -------------------------------------------------------------------------------------------------
def _extract(client, outdir: OutputDir, cfg: JobConfig, job_id: str, inputs: dict, backend: str, *,
             force: bool, progress: bool) -> dict:
    from .extract import extract_block, finish_store, prepare_store

    # fp16 on GPU gives other maps; a model dir fine-tuned again gives other weights under the same name
    fp = _digest(cfg.fingerprint("data", "model", "extract"), backend, inputs["model_info"]["identity"])
    if outdir.begin_stage("extract", fp, force=force):
        record = outdir.stage_record("extract")
        return {**record, "qa": _score_qa(outdir, cfg, record, progress=progress), "skipped": True}
    t0 = time.perf_counter()
    features = inputs["features"]
    atomic_write_parquet(inputs["examples"], outdir.path / "examples.parquet")
    blocks, done = prepare_store(outdir, features, cfg=cfg, model_info=inputs["model_info"], fingerprint=fp,
                                 resume=not force)
    device = bk.torch_device(backend)
    todo = [(str(outdir.path), b, s, e, cfg, fp, device) for b, (s, e) in enumerate(blocks) if b not in done]
    results = run_tasks(client, extract_block, todo, job_id=job_id, stage="extract",
                        desc=f"extract ({len(blocks)} blocks, {len(done)} done)", progress=progress)
    finish_store(outdir, blocks)
    seconds = time.perf_counter() - t0
    n_maps = len(features) * inputs["model_info"]["num_layers"] * inputs["model_info"]["num_heads"]
    record = {"seconds": round(seconds, 3), "features": len(features), "examples": len(inputs["examples"]),
              "maps": n_maps, "blocks": len(blocks), "blocks_resumed": len(done),
              "features_per_second": round(sum(r["features"] for r in results) / seconds, 3) if results else None,
              "tokens": int(features["seq_len"].sum()),
              "qa_head_in_checkpoint": inputs["model_info"]["qa_head_in_checkpoint"],
              "data_path": inputs["data_path"]}
    record["qa"] = _score_qa(outdir, cfg, record, progress=progress)
    outdir.finish_stage("extract", fp, **record)
    return record


def _score_qa(outdir: OutputDir, cfg: JobConfig, record: dict, *, progress: bool) -> dict:
    """Answers from the stored logits and their official scores (cheap: redone when ``qa`` settings change)."""
    from .qa import score_output

    summary = score_output(outdir.path, cfg.qa, head_trained=bool(record.get("qa_head_in_checkpoint")))
    if progress:
        print(summary["note"], flush=True)
    return summary


def _store_identity(outdir: OutputDir) -> str:
    store = open_attention_store(outdir.path / ATTENTION)
    return store.attrs.get("fingerprint") or _digest(store.seq_len.tolist(), list(store.attention.shape))


def _featurize(client, outdir: OutputDir, cfg: JobConfig, job_id: str, backend: str, *, force: bool,
               progress: bool) -> dict:
    from .featurize import featurize_block, mark_embedding_complete, prepare_embedding

    store = open_attention_store(outdir.path / ATTENTION)
    read_features(outdir.path)  # contract check before any work
    fp = _digest(_store_identity(outdir), cfg.featurize.to_dict())
    if outdir.begin_stage("featurize", fp, force=force):
        return {**outdir.stage_record("featurize"), "skipped": True}
    check_featurizer(cfg)
    t0 = time.perf_counter()
    blocks = store.blocks()
    done = prepare_embedding(outdir, n_features=store.n_features, n_layers=store.n_layers,
                             n_heads=store.n_heads, per_task=store.features_per_task, cfg=cfg.featurize,
                             fingerprint=fp, resume=not force)
    device = bk.torch_device(backend)
    todo = [(str(outdir.path), b, s, e, cfg, fp, device) for b, (s, e) in enumerate(blocks) if b not in done]
    run_tasks(client, featurize_block, todo, job_id=job_id, stage="featurize",
              desc=f"featurize {cfg.featurize.method} ({len(blocks)} blocks)", progress=progress)
    mark_embedding_complete(outdir.path)
    seconds = time.perf_counter() - t0
    n_maps = store.n_features * store.n_layers * store.n_heads
    record = {"seconds": round(seconds, 3), "maps": n_maps, "method": cfg.featurize.method,
              "maps_per_second": round(n_maps / seconds, 1), "blocks_resumed": len(done)}
    outdir.finish_stage("featurize", fp, **record)
    return record


def _cluster(client, outdir: OutputDir, cfg: JobConfig, job_id: str, backend: str, *, force: bool,
             progress: bool) -> dict:
    from .cluster import assign_block, fit_from_store
    from .featurize import open_embedding

    feat_record = outdir.stage_record("featurize")
    if feat_record is None:
        raise StoreError(f"output dir {outdir.path}: featurize has not finished; run 'attnclust featurize' first")
    group = open_embedding(outdir.path)
    fp = _digest(feat_record["fingerprint"], cfg.cluster.to_dict())
    if outdir.begin_stage("cluster", fp, force=force):
        return {**outdir.stage_record("cluster"), "skipped": True}
    t0 = time.perf_counter()
    future = client.submit(fit_from_store, str(outdir.path), cfg.cluster, backend, key=f"{job_id}-cluster-fit",
                           pure=False, retries=1)
    if progress:
        print(f"cluster: fitting on a sample of {min(group['embedding'].shape[0], cfg.cluster.fit_sample)} maps "
              f"(k={cfg.cluster.k}, UMAP {'on' if cfg.cluster.umap else 'off'}) ...", flush=True)
    fitted = future.result()
    n_maps = group["embedding"].shape[0]
    n_workers = len(client.scheduler_info().get("workers", {}))
    if backend == "gpu" and n_workers > 1 and n_maps > cfg.cluster.fit_sample:
        fitted.kmeans_ = _distributed_kmeans(client, outdir, fitted, cfg)  # all maps, every GPU
    fit_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    [fitted_future] = client.scatter([fitted], broadcast=True)
    scatter_s = time.perf_counter() - t1
    step = group["embedding"].chunks[0]
    items = [(str(outdir.path), b, r0, min(r0 + step, n_maps), fitted_future)
             for b, r0 in enumerate(range(0, n_maps, step))]
    frames = run_tasks(client, assign_block, items, job_id=job_id, stage="cluster-assign",
                       desc=f"cluster assign (k={fitted.k_})", progress=progress)
    labels = pd.concat(frames, ignore_index=True)
    atomic_write_parquet(labels, outdir.path / "cluster_labels.parquet")
    model = {"k": fitted.k_, "k_scores": {str(k): v for k, v in fitted.k_scores_.items()},
             "centers": bk.to_numpy(fitted.kmeans_.cluster_centers_).tolist(),
             "pca_components": None if fitted.pca_ is None else int(fitted.pca_.n_components),
             "umap_fitted_on": None if fitted.umap_rows_ is None else len(fitted.umap_rows_)}
    atomic_write_json(outdir.path / "cluster_model.json", model)
    seconds = time.perf_counter() - t0
    record = {"seconds": round(seconds, 3), "fit_seconds": round(fit_s, 3), "fit_parts": fitted.timings_,
              "scatter_seconds": round(scatter_s, 3), "maps": int(n_maps),
              "k": fitted.k_, "k_scores": model["k_scores"], "backend": backend,
              "maps_per_second": round(n_maps / seconds, 1)}
    outdir.finish_stage("cluster", fp, **record)
    return record


def _distributed_kmeans(client, outdir: OutputDir, fitted, cfg: JobConfig):
    """Refit the final KMeans on every map across all GPU workers (k chosen on the sample stays)."""
    import dask.array as da

    from .featurize import open_embedding

    emb = da.from_zarr(open_embedding(outdir.path)["embedding"])
    dim = fitted.pca_.n_components if fitted.pca_ is not None else emb.shape[1]
    reduced = emb.map_blocks(fitted.reduce, dtype="float32", chunks=(emb.chunks[0], (dim,)))
    return bk.fit_kmeans_distributed(client, reduced, n_clusters=fitted.k_, random_state=cfg.cluster.random_state)


def _stop_if_asked(should_stop: Callable[[], bool] | None, before: str) -> None:
    if should_stop is not None and should_stop():
        raise JobCancelled(f"job stopped on request before {before}")


def _report(client, outdir: OutputDir, cfg: JobConfig, job_id: str, *, force: bool, progress: bool,
            settings: dict, should_stop: Callable[[], bool] | None = None) -> dict:
    from .atlas import build_atlas, cluster_mean_maps, medoid_maps, stats_block
    from .report import ReportInputs, write_report

    cl_record = outdir.stage_record("cluster")
    if cl_record is None:
        raise StoreError(f"output dir {outdir.path}: cluster has not finished; run 'attnclust cluster' first")
    qa_path = outdir.path / "qa_scores.json"
    fp = _digest(cl_record["fingerprint"], cfg.report.to_dict(), qa_path.read_text() if qa_path.exists() else None)
    if outdir.begin_stage("report", fp, force=force):
        return {**outdir.stage_record("report"), "skipped": True}
    t0 = time.perf_counter()
    out = outdir.path
    features = read_features(out)
    labels = pd.read_parquet(out / "cluster_labels.parquet")
    if (out / "map_stats.parquet").exists():
        stats = pd.read_parquet(out / "map_stats.parquet")
    else:  # a store written by another tool: compute the statistics from the maps
        store = open_attention_store(out / ATTENTION)
        frames = run_tasks(client, stats_block, [(str(out), s, e) for s, e in store.blocks()], job_id=job_id,
                           stage="stats", desc="statistics", progress=progress)
        stats = pd.concat(frames, ignore_index=True)
        atomic_write_parquet(stats, out / "map_stats.parquet")
    k = int(cl_record["k"])
    maps, heads, clusters = build_atlas(out, labels, stats, features, k=k)
    qa_path = out / "qa_scores.json"
    qa = json.loads(qa_path.read_text()) if qa_path.exists() else None
    predictions = pd.read_parquet(out / "predictions.parquet") if qa and (out / "predictions.parquet").exists() \
        else None
    notes = [] if qa is None or qa["head_trained"] else [qa["note"]]
    inputs = ReportInputs(
        title=cfg.report.title or f"attnclust atlas: {cfg.name}", maps=maps, heads=heads, clusters=clusters,
        mean_maps=cluster_mean_maps(out, maps, k, random_state=cfg.cluster.random_state),
        medoids=medoid_maps(out, clusters, features), settings=settings, notes=tuple(notes),
        k_scores={int(a): b for a, b in cl_record.get("k_scores", {}).items()} or None,
        max_tokens_shown=cfg.report.max_tokens_shown, qa=qa, predictions=predictions)
    _stop_if_asked(should_stop, "writing report.html")  # the atlas is built on the driver: no task to cancel
    path = write_report(out / "report.html", inputs)
    record = {"seconds": round(time.perf_counter() - t0, 3), "report": str(path), "clusters": k}
    outdir.finish_stage("report", fp, **record)
    return record


# -- the job ------------------------------------------------------------------------------------------------
def run_job(cfg: JobConfig, out: str | Path, *, stages: tuple[str, ...] = STAGES, scheduler: str | None = None,
            force: bool = False, progress: bool = True, client=None, n_workers: int | None = None,
            job_id: str | None = None, security=None, runtime: str = "local",
            should_stop: Callable[[], bool] | None = None) -> JobResult:
    """Run some or all stages of a job into ``out``.

    Parameters
    ----------
    cfg
        The validated job.
    out
        Output directory (created).
    stages
        Subset of ``("extract", "featurize", "cluster", "report")``, run in that order.
    scheduler
        A Dask scheduler address or scheduler file; ``None`` starts an embedded LocalCluster.
    force
        Overwrite stages that were run with another configuration.
    client
        An existing ``distributed.Client`` (overrides ``scheduler``).
    runtime
        Embedded cluster kind when no scheduler is given: ``local`` (LocalCluster) or ``local-cuda``
        (LocalCUDACluster, one worker per GPU).
    should_stop
        Asked before each stage and before the report is written; when it returns True the run raises
        :class:`~attnclust.errors.JobCancelled` (finished blocks stay recorded; the stopped stage is not marked
        finished). The stages' own tasks are cancelled by whoever stops the job (``dask-submit cancel``).
    """
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise AttnclustError(f"stage {unknown[0]!r}: unknown; stages are {', '.join(STAGES)}")
    inputs = prepare_inputs(cfg) if "extract" in stages else None
    if "featurize" in stages and "extract" in stages:
        check_featurizer(cfg)
    outdir = OutputDir(Path(out))
    job_id = job_id or make_job_id(cfg.name)
    result = JobResult(out=outdir.path, job_id=job_id)
    with outdir:
        if "extract" not in stages:
            open_attention_store(outdir.path / ATTENTION)  # fail fast on a missing/foreign store
        started = time.perf_counter()
        ctx = contextlib.nullcontext(client) if client is not None else dask_client(scheduler, n_workers=n_workers,
                                                                           security=security, runtime=runtime)
        with ctx as cl:
            backend = bk.resolve_backend(cfg.backend, cl)
            if progress:
                print(f"job {job_id}: backend {backend}, dashboard {cl.dashboard_link}", flush=True)
                if inputs is not None and not inputs["model_info"]["qa_head_in_checkpoint"]:
                    print(f"note: model {cfg.model.name!r} has no trained question-answering head; it gets a "
                          f"seeded random one, so QA predictions are marked untrained (attention is unaffected)",
                          flush=True)
            settings = {"job_id": job_id, "config": cfg.to_dict(), "backend": backend}
            for stage in STAGES:
                if stage not in stages:
                    continue
                _stop_if_asked(should_stop, f"the {stage} stage")
                if stage == "extract":
                    rec = _extract(cl, outdir, cfg, job_id, inputs, backend, force=force, progress=progress)
                elif stage == "featurize":
                    rec = _featurize(cl, outdir, cfg, job_id, backend, force=force, progress=progress)
                elif stage == "cluster":
                    rec = _cluster(cl, outdir, cfg, job_id, backend, force=force, progress=progress)
                else:
                    settings["stages"] = dict(result.stages)
                    rec = _report(cl, outdir, cfg, job_id, force=force, progress=progress, settings=settings,
                                  should_stop=should_stop)
                result.stages[stage] = rec
                _write_job_json(outdir, cfg, job_id, backend, result.stages)
        result.stages["total_seconds"] = round(time.perf_counter() - started, 3)
        _write_job_json(outdir, cfg, job_id, backend, result.stages)
    return result


def _write_job_json(outdir: OutputDir, cfg: JobConfig, job_id: str, backend: str, stages: dict) -> None:
    path = outdir.path / "job.json"
    previous = {}
    if path.exists():
        try:
            previous = json.loads(path.read_text()).get("stages", {})
        except ValueError:
            previous = {}
    merged = {**previous, **stages}
    atomic_write_json(path, {"job_id": job_id, "config": cfg.to_dict(), "backend": backend,
                             "versions": _versions(), "stages": merged})


def result_summary(result: JobResult) -> str:
    lines = []
    for name in STAGES:
        rec = result.stages.get(name)
        if rec:
            extra = " (already complete)" if rec.get("skipped") else ""
            lines.append(f"  {name:<10} {rec.get('seconds', 0):8.1f} s{extra}")
    qa = (result.stages.get("extract") or {}).get("qa")
    if qa:
        lines.append(f"  {qa['note']}")
    return "\n".join(lines)
