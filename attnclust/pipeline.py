"""Running a job: checks before anything is written, ownership and lock of the run directory, the stages on a
Dask client (or in-process), and ``job.json``.

Order of a run: the output directory is checked (attnclust writes only into a new, empty or attnclust-marked
directory); the data is read and tokenised and the model loaded once to check it; every selected stage's
pre-flight check runs (featurizer weights, ``cluster.k`` against the number of maps); only then is the directory
claimed (marker first) and locked, and the stages run through :func:`attnclust.stages.run_stages`.
"""

from __future__ import annotations

import contextlib
import platform
import secrets
import string
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from . import backend as bk
from .config import JobConfig, ModelConfig
from .data.hf import data_fingerprint
from .data.squad import sample_path
from .errors import AttnclustError, StoreError
from .executors import MadeOnFirstUse
from .layout import RunLayout
from .models.sources import model_identity
from .runtime import check_embedded, dask_client, prestart_workers, release_forkserver
from .stages import COMMANDS, DaskExecutor, RunContext, Stage, check_stages, make_stages, run_stages, stage_names
from .stages.extract import prepare_inputs
from .store.contract import atomic_write_json, open_attention_store

__all__ = ["JobResult", "check_extract_inputs", "make_job_id", "result_summary", "run_job"]

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
        """The run's ``report.html``."""
        return RunLayout(self.out).report


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


def run_job(cfg: JobConfig, out: str | Path, *, stages: tuple[str, ...] = COMMANDS["run"],
            scheduler: str | None = None, force: bool = False, force_named: bool = False, progress: bool = True,
            client=None, executor=None, n_workers: int | None = None, job_id: str | None = None, security=None,
            runtime: str = "local", should_stop: Callable[[], bool] | None = None,
            on_event: Callable[[str, str, dict], None] | None = None, inputs: dict | None = None) -> JobResult:
    """Run some or all stages of a job into ``out``.

    Parameters
    ----------
    cfg
        The validated job.
    out
        Output directory: new, empty, or an earlier attnclust run (anything else is refused untouched).
    stages
        Names of the stages to run (a subset of :data:`attnclust.stages.STAGES`' names), run in pipeline order.
    scheduler
        A Dask scheduler address or scheduler file; ``None`` starts an embedded LocalCluster.
    force
        Overwrite stages recorded with other settings (and invalidate what depends on them).
    force_named
        Re-run the selected stages even when nothing changed (``attnclust cluster --force``).
    client
        An existing ``distributed.Client`` (overrides ``scheduler``).
    executor
        Run blocks with this executor instead of a Dask client, e.g.
        :class:`~attnclust.stages.SerialExecutor` (in-process, no Dask): tests and benchmarks.
    runtime
        Embedded cluster kind when no scheduler is given: ``local`` (LocalCluster) or ``local-cuda``.
    should_stop
        Asked before each stage, before its finalize step and before the report is written; when it returns
        True the run raises :class:`~attnclust.errors.JobCancelled` (finished blocks stay recorded).
    on_event
        ``on_event(stage, event, info)`` as stages start, finish or are found complete.
    inputs
        Inputs already prepared by :func:`attnclust.stages.extract.prepare_inputs` (benchmarks pass a subset of
        its features); by default they are prepared here when ``extract`` runs.
    """
    unknown = [s for s in stages if s not in stage_names()]
    if unknown:
        raise AttnclustError(f"stage {unknown[0]!r}: unknown; stages are {', '.join(stage_names())}")
    layout = RunLayout(out)
    adopt = () if "extract" in stages else layout.contract()
    layout.check_writable(adopt=adopt)
    if "extract" not in stages:
        open_attention_store(layout.attention)  # fail fast on a missing or foreign store
        check_extract_inputs(layout)
    job_id = job_id or make_job_id(cfg.name)
    with contextlib.ExitStack() as forked:
        pipeline = make_stages()
        embedded = executor is None and client is None and scheduler is None
        if embedded:
            check_embedded(n_workers, runtime)
            if runtime == "local":  # the workers' imports, beside the reading of the data and the model below
                prestart_workers(worker_imports(pipeline, stages))
                forked.callback(release_forkserver)  # after the cluster, if one started, has closed
        ctx = RunContext(layout=layout, cfg=cfg, job_id=job_id, backend="cpu", executor=executor, progress=progress,
                         should_stop=should_stop, on_event=on_event)
        if "extract" in stages:
            ctx.inputs = inputs if inputs is not None else prepare_inputs(cfg)
            if progress and not ctx.inputs["model_info"]["head_trained"] and cfg.data.format != "text":
                print(f"note: model {cfg.model.name!r} has no trained question-answering head; it gets a seeded random "
                      f"one, so QA predictions are marked untrained (attention is unaffected)", flush=True)
        check_stages(ctx, pipeline, stages)
        # the embedded LocalCluster starts when a stage first has work for it (MadeOnFirstUse): a rerun that finds
        # every stage complete, or one refused for changed settings, starts none. A dask-cuda cluster starts here, as
        # before: its start is where a missing GPU or dask-cuda is found, which a run says before any stage.
        lazy = embedded and runtime == "local"
        layout.claim(adopt=adopt)
        result = JobResult(out=layout.root, job_id=job_id)
        with layout.locked():
            started = time.perf_counter()
            with contextlib.ExitStack() as cluster:
                def announce(cl) -> None:
                    if progress:
                        where = f"dashboard {cl.dashboard_link}" if cl is not None else "in-process"
                        print(f"job {job_id}: backend {ctx.backend}, {where}", flush=True)

                if lazy:  # its workers are processes of this machine from this environment: this one answers for them
                    ctx.backend = bk.resolve_backend(cfg.backend)

                    def start() -> DaskExecutor:
                        cl = cluster.enter_context(dask_client(None, n_workers=n_workers, runtime=runtime))
                        announce(cl)
                        return DaskExecutor(cl, job_id, owns_workers=True)  # this run's own: they may be restarted

                    ctx.executor = MadeOnFirstUse(start)
                else:
                    cl = None if executor is not None else client if client is not None else \
                        cluster.enter_context(dask_client(scheduler, n_workers=n_workers, security=security,
                                                          runtime=runtime))
                    if cl is not None:  # the embedded cluster's workers are this run's own (they may be restarted)
                        ctx.executor = DaskExecutor(cl, job_id, owns_workers=embedded)
                    ctx.backend = bk.resolve_backend(cfg.backend, cl)
                    announce(cl)
                try:
                    result.stages = run_stages(ctx, pipeline, stages, force=force, force_named=force_named)
                finally:
                    _write_job_json(layout, cfg, job_id, ctx.backend, ctx.records)
            result.stages["total_seconds"] = round(time.perf_counter() - started, 3)
        return result


def worker_imports(pipeline: tuple[Stage, ...], stages: tuple[str, ...]) -> list[str]:
    """What the workers of the selected ``stages`` import (:attr:`~attnclust.stages.base.Stage.worker_imports` and
    each task's module), in pipeline order."""
    names = []
    for stage in pipeline:
        if stage.name in stages:
            names += [*stage.worker_imports, *((stage.task.__module__,) if stage.task is not None else ())]
    return list(dict.fromkeys(names))


def check_extract_inputs(layout: RunLayout) -> None:
    """Refuse to serve a run whose data file or model changed since its ``extract`` stage read them.

    ``attnclust run`` (and ``attnclust extract``) see such a change in the extract stage's fingerprint; a command
    that runs later stages alone takes that stage's recorded fingerprint, so it checks here, before anything is
    found complete or re-run: the data file the run read (its recorded ``data.path``, or the bundled sample)
    against the recorded content hash, and the model (its recorded ``model.name`` and ``model.revision``) against
    the recorded weights identity (:func:`attnclust.models.sources.model_identity`). A data file or model that is gone
    is not a change (the later stages read only the run's own outputs). A run without an extract record (a store
    another tool wrote) has nothing to check.

    Raises
    ------
    attnclust.errors.StoreError
        One line naming the changed file or model and the command that rebuilds the run.
    """
    import json

    try:
        record = json.loads(layout.stage_record("extract").read_text())
        parts = record["parts"]
        keys, identity = dict(parts["keys"]), dict(parts["identity"])
    except (OSError, ValueError, KeyError, TypeError):
        return
    fix = ("so this run's results no longer match it; re-run 'attnclust run --force' with the same data and model "
           "for this output dir to rebuild them, or write to another --out")
    changed = _data_changed(keys, identity)
    if changed is not None:
        raise StoreError(f"output dir {layout.root}: the data file {changed} changed since the run's stage "
                         f"'extract' read it (its content differs), {fix}")
    changed = _model_changed(keys, identity)
    if changed is not None:
        raise StoreError(f"output dir {layout.root}: the model {changed!r} changed since the run's stage 'extract' "
                         f"read it (its weights, configuration or tokenizer files differ), {fix}")


def _data_changed(keys: dict, identity: dict) -> Path | None:
    """The recorded data file or ``save_to_disk`` folder, when its content no longer has the recorded identity
    (:func:`attnclust.data.hf.data_fingerprint`). A hub dataset id is no local path: it is not downloaded again
    here (``attnclust run`` and ``extract`` compare it when they load it)."""

    recorded = identity.get("data_file_content")
    path = Path(keys["data.path"]).expanduser() if keys.get("data.path") else sample_path()
    if not isinstance(recorded, str) or not path.exists():
        return None
    try:
        return None if data_fingerprint(path, keys.get("data.split")) == recorded else path
    except (OSError, AttnclustError):  # unreadable now: the later stages do not read it
        return None


def _model_changed(keys: dict, identity: dict) -> str | None:
    """The recorded model's name, when its weights identity is no longer the recorded one."""

    recorded = identity.get("model_weights")
    if not isinstance(recorded, str) or not isinstance(keys.get("model.name"), str):
        return None
    try:
        cfg = ModelConfig(name=keys["model.name"], revision=keys.get("model.revision"),
                          gguf_file=identity.get("model.gguf_file"))
        return None if model_identity(cfg) == recorded else cfg.name
    except (AttnclustError, OSError):  # gone or unreadable now: the later stages do not load it
        return None


def _write_job_json(layout: RunLayout, cfg: JobConfig, job_id: str, backend: str, records: dict) -> None:
    layout.record(layout.job)
    stages = {name: {k: v for k, v in rec.items() if k != "parts"} for name, rec in records.items()}
    atomic_write_json(layout.job, {"job_id": job_id, "config": cfg.to_dict(), "backend": backend,
                                   "versions": _versions(), "stages": stages})


def result_summary(result: JobResult) -> str:
    """One line per stage (seconds, or "already complete") and the QA line."""
    lines = []
    for name in stage_names():
        rec = result.stages.get(name)
        if rec:
            extra = " (already complete)" if rec.get("skipped") else ""
            lines.append(f"  {name:<10} {rec.get('seconds', 0):8.1f} s{extra}")
    qa = result.stages.get("qa")
    if qa and qa.get("note"):
        lines.append(f"  {qa['note']}")
    return "\n".join(lines)
