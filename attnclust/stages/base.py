"""The Stage abstraction and the one orchestrator that runs stages: resume, ``--force``, progress, cancellation,
timing, ownership of outputs and invalidation of what depends on a re-run stage are handled here, once.

A stage declares its ``name``, ``version``, upstream ``inputs``, the config keys it ``reads``, the outputs it
writes, a ``plan`` of blocks, a per-block ``task`` (runs on a Dask worker or in-process) and a ``finalize`` step
(on the driver). Its fingerprint is made of the values of the keys it reads, its version, its upstream stages'
fingerprints and any content identity it declares (data file hash, model weights): a key a stage does not read
never invalidates it, and a refused re-run names the key that changed, with its old and new values.

A stage is complete only when its record matches *and* the outputs it recorded at the end are still there and open (a
cheap check: parquet footers, JSON, zarr metadata and chunk files; :func:`attnclust.store.integrity.output_problem`). A
selected stage whose output is missing or damaged runs again (and what depends on it is invalidated); an upstream stage
that is not selected is refused in one line naming the output and the command that rebuilds it.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..config import JobConfig
from ..errors import AttnclustError, JobCancelled, StoreError
from ..layout import RunLayout
from ..runtime import trim_heap
from ..store.contract import atomic_write_json
from ..store.integrity import error_text, is_checksum_error, output_problem

__all__ = ["PART_COMMANDS", "RunContext", "Stage", "check_stages", "describe_change", "fingerprint_of", "run_block",
           "run_stages"]

PART_COMMANDS: dict[str, tuple[str, ...]] = {
    "extract": ("extract", "qa"),
    "featurize": ("featurize",),
    "cluster": ("cluster",),
    "report": ("report",),
}
"""CLI command -> the stages it runs, for each command but ``run`` (every stage: :data:`attnclust.stages.COMMANDS`);
here, below the stage modules, so that a stage's error can name the command that reruns it."""


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass
class RunContext:
    """What stages share during one run.

    Attributes
    ----------
    layout
        The run directory's paths.
    cfg
        The validated job.
    job_id
        Prefix of every task key of the run.
    backend
        ``cpu`` or ``gpu`` (resolved).
    executor
        Runs blocks: :class:`~attnclust.executors.DaskExecutor` or ``SerialExecutor``.
    progress
        Show progress bars and notes.
    inputs
        Driver-side inputs prepared before anything is written (examples, features, model facts).
    fingerprints, records
        Per stage name, filled as stages run (or are found complete).
    should_stop
        Asked before each stage and before each stage's finalize step.
    on_event
        Called as ``on_event(stage, event, info)`` with ``event`` in ``started``, ``finished``, ``skipped``.
    """

    layout: RunLayout
    cfg: JobConfig
    job_id: str
    backend: str
    executor: Any
    progress: bool = True
    inputs: dict = field(default_factory=dict)
    fingerprints: dict[str, str] = field(default_factory=dict)
    records: dict[str, dict] = field(default_factory=dict)
    should_stop: Callable[[], bool] | None = None
    on_event: Callable[[str, str, dict], None] | None = None

    def note(self, message: str) -> None:
        """Print a one-line note when progress is on."""
        if self.progress:
            print(message, flush=True)

    def stop_if_asked(self, before: str) -> None:
        """Raise :class:`~attnclust.errors.JobCancelled` when the run was asked to stop."""
        if self.should_stop is not None and self.should_stop():
            raise JobCancelled(f"job stopped on request before {before}")


class Stage:
    """One stage of the pipeline. Subclasses set the class attributes and override the hooks they need.

    Attributes
    ----------
    name
        Stage name (the CLI command, the ``_state`` records, the task key part).
    version
        Bumped when what the stage computes changes: finished results of an older version are not reused.
    inputs
        Names of the upstream stages whose outputs it reads (they must have finished).
    optional_inputs
        Upstream stages it reads when they ran (e.g. QA scores in the report); part of its fingerprint then.
    reads
        Dotted config keys it reads (``cluster.k``); see :meth:`keys` for keys that depend on the config.
    rerun_on_change
        A cheap derived stage (QA scoring) is recomputed when its settings change, without ``--force``.
    loads_model
        Its tasks load the model into the workers (extraction, importance): once it has run, an executor that owns
        its workers restarts them when they hold much (:meth:`DaskExecutor.restart_workers`), so later stages do
        not share the machine with workers that hold torch, the model and its heap idle; not while a later stage
        that loads the model too is still to run (:meth:`skip_reason` says it will), which would load it again.
    """

    name: ClassVar[str] = ""
    version: ClassVar[int] = 1
    inputs: ClassVar[tuple[str, ...]] = ()
    optional_inputs: ClassVar[tuple[str, ...]] = ()
    reads: ClassVar[tuple[str, ...]] = ()
    rerun_on_change: ClassVar[bool] = False
    loads_model: ClassVar[bool] = False

    def keys(self, cfg: JobConfig) -> tuple[str, ...]:
        """Config keys this stage reads under ``cfg`` (default: :attr:`reads`)."""
        return self.reads

    def identity(self, ctx: RunContext) -> dict:
        """Content identities beyond config values (data hash, model weights, backend, registry versions)."""
        return {}

    def resolved_keys(self, ctx: RunContext) -> dict:
        """Config keys whose value the stage resolves from its inputs (``extract.store: auto``), with the value
        it resolved: they replace (or join) the configured values in the fingerprint. Default: none."""
        return {}

    def outputs(self, layout: RunLayout) -> tuple[Path, ...]:
        """Paths this stage writes: recorded as attnclust's before it runs, removed when it is invalidated."""
        return ()

    def provided(self, layout: RunLayout) -> bool:
        """True when the stage's outputs are there although it did not run here (a store another tool wrote
        under the store contract): stages after it may then run. Default: never."""
        return False

    def check(self, ctx: RunContext) -> None:
        """Checks that must pass before anything is written (called for every stage before the first runs)."""

    def skip_reason(self, ctx: RunContext) -> str | None:
        """Why the stage, selected, will have nothing to do in this run (one line: a setting turned it off, the run
        lacks what it reads), or ``None``. Default: ``None``."""
        return None

    def verify(self, ctx: RunContext) -> None:
        """Check that the outputs of a finished (or provided) stage are still intact before later stages read
        them; called when the stage is skipped. Raise :class:`~attnclust.errors.StoreError` naming the damage."""

    def plan(self, ctx: RunContext, done: set[int]) -> tuple[list[tuple], set[int]]:
        """Prepare the stage's stores and return ``(blocks, done)``: the task arguments of every block (after
        ``root`` and ``block``) and the blocks that are already finished (``done``, or fewer when the stores had
        to be recreated)."""
        return [], set()

    def block_costs(self, ctx: RunContext, blocks: list[tuple]) -> list[float] | None:
        """The relative cost of each of :meth:`plan`'s blocks, or ``None`` (all alike): the costliest start first,
        so that the last to finish are the cheap ones and no worker waits long for the others at the end."""
        return None

    task: ClassVar[Callable | None] = None
    """``task(root: str, block: int, *args) -> result``, a module-level function run per block."""

    worker_imports: ClassVar[tuple[str, ...]] = ()
    """Modules its tasks import that take long to import (torch, matplotlib), besides :attr:`task`'s own module: an
    embedded cluster's workers are forked from a process that imported them while the driver prepared the run
    (:func:`attnclust.runtime.prestart_workers`)."""

    def finalize(self, ctx: RunContext, results: list) -> dict:
        """Driver step after every block finished: consolidate, write final outputs; returns the stage record."""
        return {}


def fingerprint_of(stage: Stage, ctx: RunContext) -> dict:
    """The parts a stage's fingerprint is made of: ``keys`` (values), ``version``, ``inputs``, ``identity``."""
    keys = {k: ctx.cfg.value(k) for k in stage.keys(ctx.cfg)} | stage.resolved_keys(ctx)
    inputs = {name: ctx.fingerprints[name] for name in (*stage.inputs, *stage.optional_inputs)
              if name in ctx.fingerprints}
    return {"version": stage.version, "keys": keys, "inputs": inputs, "identity": stage.identity(ctx)}


IDENTITY_WORDS = {"model_weights": "model (its weights, tokenizer, chat template or generation config)"}
"""How :func:`describe_change` names an identity whose key alone would say less than it covers."""


def describe_change(old: dict, new: dict) -> str:
    """What differs between two fingerprints, for people: ``cluster.k: 8 -> 10``, ``data file content``."""
    def plain(value: Any) -> Any:  # as the record holds it (JSON): a tuple of this run is the list it recorded
        return json.loads(json.dumps(value, default=str))

    changes = []
    for key in sorted(set(old.get("keys", {})) | set(new.get("keys", {}))):
        a, b = plain(old.get("keys", {}).get(key, "(unset)")), plain(new.get("keys", {}).get(key, "(unset)"))
        if a != b:
            changes.append(f"{key}: {a!r} -> {b!r}" if isinstance(a, str) or isinstance(b, str) else
                           f"{key}: {a} -> {b}")
    for key in sorted(set(old.get("identity", {})) | set(new.get("identity", {}))):
        if old.get("identity", {}).get(key) != new.get("identity", {}).get(key):
            changes.append(f"{IDENTITY_WORDS.get(key, key.replace('_', ' '))} changed")
    if old.get("version") != new.get("version"):
        changes.append(f"stage version {old.get('version')} -> {new.get('version')}")
    for name in sorted(set(old.get("inputs", {})) | set(new.get("inputs", {}))):
        if old.get("inputs", {}).get(name) != new.get("inputs", {}).get(name) and not changes:
            changes.append(f"its input stage '{name}' changed")
    return "; ".join(changes) or "settings changed"


def run_block(task: Callable, root: str, stage: str, fingerprint: str, block: int, args: tuple) -> Any:
    """Run one block of a stage and write its completion marker (only after the block's data is written)."""

    try:
        result = task(root, block, *args)
    finally:
        trim_heap()  # what the task freed between live chunks goes back to the OS, not kept by the worker
    atomic_write_json(RunLayout(root).block_marker(stage, block), {"fingerprint": fingerprint})
    return result


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _done_blocks(layout: RunLayout, stage: str, fingerprint: str) -> set[int]:
    folder = layout.block_markers(stage)
    done = set()
    if folder.is_dir():
        for marker in folder.glob("*.done"):
            data = _read_json(marker)
            if data is not None and data.get("fingerprint") == fingerprint:
                done.add(int(marker.stem))
    return done


def _forget(layout: RunLayout, stage: Stage) -> None:
    """Remove a stage's record, markers and outputs (only paths attnclust recorded as its own)."""
    import shutil

    layout.stage_record(stage.name).unlink(missing_ok=True)
    layout.stage_started(stage.name).unlink(missing_ok=True)
    shutil.rmtree(layout.block_markers(stage.name), ignore_errors=True)
    layout.remove(*stage.outputs(layout))


def _output_problem(layout: RunLayout, stage: Stage, record: dict) -> str | None:
    """``heads.parquet is missing``: the first recorded output of a finished stage that is gone or does not open.

    A record written before outputs were recorded (no ``outputs`` key) is checked on the outputs that exist.
    """

    recorded = record.get("outputs")
    paths = ([layout.root / rel for rel in recorded] if isinstance(recorded, list)
             else [p for p in stage.outputs(layout) if p.exists()])
    return next((problem for problem in map(output_problem, paths) if problem), None)


def _downstream(stages: tuple[Stage, ...], name: str) -> list[Stage]:
    """Every stage that depends, directly or not, on ``name`` (in pipeline order)."""
    hit = {name}
    out = []
    for stage in stages:
        if hit & {*stage.inputs, *stage.optional_inputs}:
            hit.add(stage.name)
            out.append(stage)
    return out


def _command(stage: str) -> str:
    """The command that runs ``stage`` (``qa`` runs with ``extract``, ``importance`` with ``run``)."""
    return next((cmd for cmd, names in PART_COMMANDS.items() if stage in names), "run")


def check_stages(ctx: RunContext, stages: tuple[Stage, ...], selected: tuple[str, ...]) -> None:
    """Every selected stage's :meth:`Stage.check`, before anything is written."""
    for stage in stages:
        if stage.name in selected:
            stage.check(ctx)


def run_stages(ctx: RunContext, stages: tuple[Stage, ...], selected: tuple[str, ...], *,
               force: bool = False, force_named: bool = False) -> dict[str, dict]:
    """Run the ``selected`` stages of ``stages`` (the whole pipeline, in order) in ``ctx``.

    A selected stage finished with the same fingerprint is skipped. One begun or finished with another
    fingerprint is refused, naming what changed, unless ``force`` (or the stage is ``rerun_on_change``); then it
    is re-run and every stage that depends on it is invalidated first (records and outputs removed), so nothing
    old is served as current. ``force_named`` re-runs the selected stages even when nothing changed (``attnclust
    cluster --force``); upstream stages are never re-run by it. Unselected upstream stages must be finished.

    Returns
    -------
    dict
        Stage name -> record (``skipped: True`` for stages found complete).
    """
    layout = ctx.layout
    by_name = {s.name: s for s in stages}
    results: dict[str, dict] = {}
    for stage in stages:
        record = _read_json(layout.stage_record(stage.name))
        if stage.name not in selected:
            if record is not None:
                ctx.fingerprints[stage.name] = record["fingerprint"]
                ctx.records[stage.name] = record
                needed = {s.name for s in _downstream(stages, stage.name)} & set(selected)
                problem = _output_problem(layout, stage, record) if needed else None
                if problem:
                    command = _command(stage.name)
                    also = "" if command == "run" else " (or 'attnclust run')"
                    raise StoreError(f"output dir {layout.root}: stage '{stage.name}' finished but its output "
                                     f"{problem}; re-run 'attnclust {command}'{also} for this output dir to "
                                     f"rebuild it")
                stage.verify(ctx)
            elif stage.provided(layout):
                stage.verify(ctx)
            elif any(stage.name in by_name[s].inputs for s in selected) and not stage.provided(layout):
                raise StoreError(f"output dir {layout.root}: stage '{stage.name}' has not finished; run "
                                 f"'attnclust {stage.name}' (or 'attnclust run') for this output dir first")
            continue
        ctx.stop_if_asked(f"the {stage.name} stage")
        parts = fingerprint_of(stage, ctx)
        fp = ctx.fingerprints[stage.name] = _digest(parts)
        started = _read_json(layout.stage_started(stage.name))
        previous = record or started
        damaged = None
        if record is not None and record.get("fingerprint") == fp and not force_named:
            damaged = _output_problem(layout, stage, record)
        if damaged:
            ctx.note(f"{stage.name}: finished before, but its output {damaged}; running it again")
        if record is not None and record.get("fingerprint") == fp and not force_named and not damaged:
            stage.verify(ctx)
            ctx.records[stage.name] = results[stage.name] = {**record, "skipped": True}
            if ctx.on_event:
                ctx.on_event(stage.name, "skipped", record)
            continue
        changed = previous is not None and previous.get("fingerprint") != fp
        if changed and not (force or stage.rerun_on_change):
            raise StoreError(f"output dir {layout.root}: stage '{stage.name}' was run with other settings "
                             f"({describe_change(previous.get('parts', {}), parts)}); re-run with --force to "
                             f"overwrite it, or choose another --out")
        for later in _downstream(stages, stage.name):
            _forget(layout, later)
        if changed or force_named or damaged:
            _forget(layout, stage)
        else:
            layout.stage_record(stage.name).unlink(missing_ok=True)
        record = results[stage.name] = ctx.records[stage.name] = _run_one(ctx, stage, fp, parts)
        ran = record.get("blocks", 0) - record.get("blocks_resumed", 0)  # tasks that loaded the model
        later = [s for s in stages[stages.index(stage) + 1:] if s.name in selected]
        if stage.loads_model and ran > 0 and later and not _reloads_model(ctx, _downstream(stages, stage.name),
                                                                          selected):
            ctx.executor.restart_workers()  # idle, they would keep it
    return results


def _priorities(costs: list[float] | None, todo: list[int]) -> list[int] | None:
    """Task priorities of the blocks ``todo`` from all blocks' ``costs``: each block's rank among them, so the
    costliest runs first (ties in block order); ``None`` without costs."""
    if costs is None:
        return None
    order = sorted(todo, key=lambda b: (costs[b], -b))
    rank = {b: r for r, b in enumerate(order)}
    return [rank[b] for b in todo]


def _reloads_model(ctx: RunContext, downstream: list[Stage], selected: tuple[str, ...]) -> bool:
    """Whether a stage downstream of one that just ran (its input changed: it runs too) loads the model again:
    selected, ``loads_model`` and with work (:meth:`Stage.skip_reason`). Restarting the workers before it would
    free the model only for them to import torch and load it again (bench/HISTORY.md, 2026-12-07, evening 3)."""
    return any(s.loads_model and s.name in selected and s.skip_reason(ctx) is None for s in downstream)


def _run_one(ctx: RunContext, stage: Stage, fp: str, parts: dict) -> dict:
    layout = ctx.layout
    layout.record(*stage.outputs(layout))
    atomic_write_json(layout.stage_started(stage.name), {"fingerprint": fp, "parts": parts})
    if ctx.on_event:
        ctx.on_event(stage.name, "started", {})
    t0 = time.perf_counter()
    try:
        blocks, done = stage.plan(ctx, _done_blocks(layout, stage.name, fp))
        todo = [(b, args) for b, args in enumerate(blocks) if b not in done]
        results = ctx.executor.map(
            run_block, [(stage.task, str(layout.root), stage.name, fp, b, args) for b, args in todo],
            stage=stage.name, total=len(blocks), done=len(done), progress=ctx.progress,
            priorities=_priorities(stage.block_costs(ctx, blocks), [b for b, _ in todo])) if todo else []
        ctx.stop_if_asked(f"finishing the {stage.name} stage")
        record = stage.finalize(ctx, results)
    except AttnclustError:
        raise
    except (ValueError, RuntimeError) as exc:  # a chunk of an input store failed its checksum
        if not is_checksum_error(exc) or not stage.inputs:
            raise
        raise StoreError(f"output dir {layout.root}: stage '{stage.name}' read a damaged chunk of the output of "
                         f"stage '{stage.inputs[-1]}' ({error_text(exc)}); re-run 'attnclust "
                         f"{_command(stage.inputs[-1])} --force' for this output dir to rewrite it") from None
    outputs = [layout.relative(p) for p in stage.outputs(layout) if p.exists()]  # checked when it is skipped
    record = {"fingerprint": fp, "parts": parts, "seconds": round(time.perf_counter() - t0, 3),
              "blocks": len(blocks), "blocks_resumed": len(done), "outputs": outputs, **record}
    atomic_write_json(layout.stage_record(stage.name), record)
    if ctx.on_event:
        ctx.on_event(stage.name, "finished", record)
    return record
