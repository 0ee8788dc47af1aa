"""The layout of a run directory: every path attnclust reads or writes there is spelled here, and nowhere else.

A run directory belongs to attnclust only when it holds the ownership marker :data:`MARKER`, written *first*,
before anything else, into a directory that was new or empty. attnclust refuses to write into any other existing
directory, and it only ever removes paths that its marker lists as written by it (:meth:`RunLayout.record`), so a
user's own files are never deleted or overwritten, whatever they are called.

Layout (relative to the run directory)::

    .attnclust-run.json     ownership marker: schema, schema_version, created, paths written by attnclust
    attention.zarr          the attention store (see store.py for its contract)
    features.parquet        one row per feature (store row)
    examples.parquet        one row per question of the data file
    map_stats.parquet       per-map statistics (feature, layer, head)
    qa.parquet              start/end logits per feature (a decoder: token log-probabilities, top-1 hits)
    window_loss.parquet     a decoder's next-token loss per window of natural text
    head_outputs.zarr       per-head outputs pooled per feature (cls or a decoder's last_prompt, context_mean) and
                            the last hidden state there
    induction.parquet       per (layer, head) induction score of a causal model's diagnostic (analysis/induction.py)
    decoder_protocols.*     a causal model's sink rate and head detectors as the papers score them: .parquet per
                            (layer, head), .json the rates and counts (analysis/protocols.py)
    predictions.*           answers (parquet, the official JSON), null_odds.json, best_spans.json, qa_scores.json
    embedding.zarr          one vector per map
    cluster_labels.parquet  cluster, centroid distance and 2-D position per map; cluster_model.json
    maps/heads/clusters.parquet, report.html, job.json
    head_layout.parquet     2-D map of the heads by their Jensen-Shannon distances (analysis/distances.py)
    importance.parquet      per-head importance; pruning.parquet: F1 (a decoder: the gold answer's log-probability)
                            as heads are removed; importance_groups.parquet: per key/value group (grouped decoders)
    parses.parquet          dependency parses of the contexts (analysis/parses.py); syntax.parquet (analysis/syntax.py)
    probes.parquet          per (task, layer, head) linear probe accuracy (analysis/probes.py); probes_summary.json
    exports/                figures written by 'attnclust export' (exports/<figure>.<png|svg|pdf>)
    parts/                  per-block parquet parts of the extraction
    _state/                 stage records, per-block markers, the run lock, the service's job state and log
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from .errors import JobLocked, StoreError
from .safeio import atomic_write_json, first_link_in_tree, link_line

__all__ = ["MARKER", "MARKER_SCHEMA", "TOKENIZER_FILES", "WEIGHT_FILES", "CompareLayout", "ModelDirLayout",
           "RunLayout", "StateDirectory"]

MARKER = ".attnclust-run.json"
MARKER_SCHEMA = "attnclust.run"
MARKER_VERSION = 1


class StateDirectory:
    """What every directory attnclust writes shares: its ``_state/`` folder (stage records, markers) and run lock.

    Parameters
    ----------
    root
        The directory.
    """

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r})"

    # -- state ------------------------------------------------------------------------------------
    @property
    def state(self) -> Path:
        """``_state/``: stage records, block markers, the lock, the service's files."""
        return self.root / "_state"

    @property
    def lock(self) -> Path:
        """The run lock file (held while a run writes here)."""
        return self.state / "run.lock"

    def stage_record(self, stage: str) -> Path:
        """``_state/{stage}.json``: written when the stage finished."""
        return self.state / f"{stage}.json"

    def stage_started(self, stage: str) -> Path:
        """``_state/{stage}.started``: the fingerprint a stage began with."""
        return self.state / f"{stage}.started"

    def block_markers(self, stage: str) -> Path:
        """``_state/{stage}/``: one marker per finished block."""
        return self.state / stage

    def block_marker(self, stage: str, block: int) -> Path:
        """``_state/{stage}/{block:06d}.done``."""
        return self.block_markers(stage) / f"{block:06d}.done"

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the directory's run lock (an OS file lock: released when the process ends, even when killed).

        Raises
        ------
        attnclust.errors.JobLocked
            Another process holds it.
        """
        from filelock import FileLock, Timeout

        self.state.mkdir(parents=True, exist_ok=True)
        lock = FileLock(self.lock, timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise JobLocked(f"output dir {self.root}: in use by another attnclust run; wait for it to finish or "
                            f"choose another --out") from None
        try:
            yield
        finally:
            lock.release()


class RunLayout(StateDirectory):
    """Every path of one run directory, and its ownership.

    Parameters
    ----------
    root
        The run directory (``--out``).
    """

    # -- data products ----------------------------------------------------------------------------
    @property
    def marker(self) -> Path:
        """The ownership marker (written first, lists every path attnclust wrote)."""
        return self.root / MARKER

    @property
    def attention(self) -> Path:
        """``attention.zarr``: (feature, layer, head, query, key) attention maps."""
        return self.root / "attention.zarr"

    @property
    def features(self) -> Path:
        """``features.parquet``: one row per feature (= store row)."""
        return self.root / "features.parquet"

    @property
    def examples(self) -> Path:
        """``examples.parquet``: one row per question of the data file."""
        return self.root / "examples.parquet"

    @property
    def map_stats(self) -> Path:
        """``map_stats.parquet``: per-map statistics keyed by (feature_id, layer, head)."""
        return self.root / "map_stats.parquet"

    @property
    def qa_logits(self) -> Path:
        """``qa.parquet``: start/end logits of every feature."""
        return self.root / "qa.parquet"

    @property
    def window_loss(self) -> Path:
        """``window_loss.parquet``: a decoder's next-token loss and top-1 accuracy per window of natural text."""
        return self.root / "window_loss.parquet"

    @property
    def induction(self) -> Path:
        """``induction.parquet``: per (layer, head) induction score of a causal model (analysis/induction.py)."""
        return self.root / "induction.parquet"

    @property
    def decoder_protocols(self) -> Path:
        """``decoder_protocols.parquet``: per (layer, head) sink alpha and head-detector scores of a causal model
        under the papers' protocols (analysis/protocols.py)."""
        return self.root / "decoder_protocols.parquet"

    @property
    def decoder_protocols_summary(self) -> Path:
        """``decoder_protocols.json``: a causal model's sink rates, detector thresholds and head counts
        (analysis/protocols.py)."""
        return self.root / "decoder_protocols.json"

    @property
    def head_outputs(self) -> Path:
        """``head_outputs.zarr``: arrays ``cls`` and ``context_mean`` (feature, layer, head, dim) and ``last_cls``
        (feature, hidden), float16; a decoder's ``last_prompt``, ``context_mean`` and ``last_prompt_hidden``
        (analysis/head_outputs.py)."""
        return self.root / "head_outputs.zarr"

    def head_output_part(self, block: int) -> Path:
        """``parts/head_outputs-{block:06d}.npz``: one extraction block's pooled head outputs."""
        return self.parts / f"head_outputs-{block:06d}.npz"

    @property
    def probes(self) -> Path:
        """``probes.parquet``: per (task, layer, head) cross-validated probe accuracy, baseline, p and q."""
        return self.root / "probes.parquet"

    @property
    def probes_summary(self) -> Path:
        """``probes_summary.json``: the probe tasks, folds, skipped tasks and top-k heads vs last layer."""
        return self.root / "probes_summary.json"

    @property
    def embedding(self) -> Path:
        """``embedding.zarr``: one vector per map with explicit (feature_id, layer, head) arrays."""
        return self.root / "embedding.zarr"

    @property
    def cluster_labels(self) -> Path:
        """``cluster_labels.parquet``: label, centroid distance and UMAP position per map."""
        return self.root / "cluster_labels.parquet"

    @property
    def cluster_model(self) -> Path:
        """``cluster_model.json``: k, per-k scores, centres."""
        return self.root / "cluster_model.json"

    @property
    def report(self) -> Path:
        """``report.html``: the self-contained report."""
        return self.root / "report.html"

    @property
    def job(self) -> Path:
        """``job.json``: the resolved configuration, versions and per-stage records."""
        return self.root / "job.json"

    @property
    def head_layout(self) -> Path:
        """``head_layout.parquet``: per (layer, head) MDS position by Jensen-Shannon head distance."""
        return self.root / "head_layout.parquet"

    @property
    def exports(self) -> Path:
        """``exports/``: figures written by ``attnclust export`` (each recorded as attnclust's own)."""
        return self.root / "exports"

    def export(self, name: str, fmt: str) -> Path:
        """``exports/{name}.{fmt}``: one exported figure (``fmt`` is ``png``, ``svg`` or ``pdf``)."""
        return self.exports / f"{name}.{fmt}"

    @property
    def importance(self) -> Path:
        """``importance.parquet``: per (layer, head) importance (Michel et al. 2019), raw and normalised."""
        return self.root / "importance.parquet"

    @property
    def pruning(self) -> Path:
        """``pruning.parquet``: QA scores as heads are removed by importance and at random."""
        return self.root / "pruning.parquet"

    @property
    def importance_groups(self) -> Path:
        """``importance_groups.parquet``: per (layer, key/value head) importance of a decoder with grouped
        key/value heads (analysis/decoder_importance.py)."""
        return self.root / "importance_groups.parquet"

    @property
    def parses(self) -> Path:
        """``parses.parquet``: one row per parsed word of the contexts (analysis/parses.py), a cache."""
        return self.root / "parses.parquet"

    @property
    def qa_scores(self) -> Path:
        """``qa_scores.json``: official SQuAD 2.0 scores of the run's answers."""
        return self.root / "qa_scores.json"

    @property
    def predictions(self) -> Path:
        """``predictions.parquet``: one row per question (answer, null odds, EM/F1)."""
        return self.root / "predictions.parquet"

    @property
    def predictions_json(self) -> Path:
        """``predictions.json``: question id -> answer (the official evaluation's format)."""
        return self.root / "predictions.json"

    @property
    def null_odds(self) -> Path:
        """``null_odds.json``: question id -> null odds."""
        return self.root / "null_odds.json"

    @property
    def best_spans(self) -> Path:
        """``best_spans.json``: question id -> best non-empty span."""
        return self.root / "best_spans.json"

    def contract(self) -> tuple[str, ...]:
        """Entries of a store another tool may write under the store contract (read as input, never owned)."""
        return (self.attention.name, self.features.name)

    def qa_files(self) -> tuple[Path, ...]:
        """Every file the QA scoring writes (here, or in a fine-tuned model's ``eval/`` folder)."""
        return (self.predictions, self.predictions_json, self.null_odds, self.best_spans, self.qa_scores)

    def table(self, name: str) -> Path:
        """``{name}.parquet`` (``maps``, ``heads``, ``clusters``, ``predictions`` ...)."""
        return self.root / f"{name}.parquet"

    def file(self, name: str) -> Path:
        """A file directly in the run directory (``predictions.json``, ``null_odds.json`` ...)."""
        return self.root / name

    @property
    def parts(self) -> Path:
        """``parts/``: per-block parquet parts."""
        return self.root / "parts"

    def part(self, kind: str, block: int) -> Path:
        """``parts/{kind}-{block:06d}.parquet``."""
        return self.parts / f"{kind}-{block:06d}.parquet"

    @property
    def service_state(self) -> Path:
        """``_state/service.json``: a dask-submit job's state."""
        return self.state / "service.json"

    @property
    def service_log(self) -> Path:
        """``job.log``: a dask-submit job's log."""
        return self.root / "job.log"

    # -- ownership --------------------------------------------------------------------------------
    def is_run(self) -> bool:
        """True when the directory carries a readable attnclust ownership marker."""
        return self._read_marker() is not None

    def _read_marker(self) -> dict | None:
        try:
            data = json.loads(self.marker.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("schema") != MARKER_SCHEMA:
            return None
        return data

    def check_writable(self, *, adopt: tuple[str, ...] = ()) -> None:
        """Refuse, before anything is written, a directory attnclust may not write into.

        Allowed: a path that does not exist yet (its parent must be writable), an empty directory, or a
        directory marked as an attnclust run. Refused: an existing file, a directory holding anything else,
        a marker of another schema version, a symbolic link anywhere under the run directory (in its stores
        too), a read-only location.
        ``adopt`` names entries an unmarked directory may hold as inputs (a store written by another tool under
        the store contract): they are read, never recorded as attnclust's, so never removed or overwritten.

        Raises
        ------
        attnclust.errors.StoreError
            One line naming the path, what is wrong and the fix.
        """
        root = self.root
        if root.is_symlink():
            raise StoreError(f"output dir {root}: is a symbolic link; give the real directory as --out")
        if root.exists() and not root.is_dir():
            raise StoreError(f"output dir {root}: exists and is a file, not a directory; choose another --out")
        if not root.exists():
            parent = next((p for p in root.absolute().parents if p.exists()), None)
            if parent is None or not os.access(parent, os.W_OK | os.X_OK):
                raise StoreError(f"output dir {root}: cannot be created ({parent} is not writable); choose "
                                 f"a writable location for --out")
            return
        if not os.access(root, os.W_OK | os.X_OK):
            raise StoreError(f"output dir {root}: is read-only; choose a writable location for --out")
        entries = sorted(p.name for p in root.iterdir())
        if not entries:
            return
        marker = self._read_marker()
        if marker is None and set(entries) <= set(adopt):
            return
        if marker is None:
            shown = ", ".join(entries[:4]) + (", ..." if len(entries) > 4 else "")
            raise StoreError(f"output dir {root}: holds files attnclust did not write ({shown}) and no "
                             f"{MARKER} marker; attnclust never writes into such a directory: choose a new or "
                             f"empty --out")
        if marker.get("schema_version") != MARKER_VERSION:
            raise StoreError(f"output dir {root}: marked by another attnclust version (run schema "
                             f"{marker.get('schema_version')!r}, this one writes {MARKER_VERSION}); choose a new "
                             f"--out")
        link = first_link_in_tree(root)
        if link is not None:
            raise StoreError(link_line(link, f"output dir {root}"))

    def claim(self, *, adopt: tuple[str, ...] = ()) -> None:
        """Make the directory an attnclust run (after :meth:`check_writable`): create it and write the marker
        first; a directory already marked keeps its record of written paths."""
        self.check_writable(adopt=adopt)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            if not self.is_run():
                self._write_marker({"schema": MARKER_SCHEMA, "schema_version": MARKER_VERSION,
                                    "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "written": ["_state"]})
            self.state.mkdir(exist_ok=True)
        except OSError as exc:
            raise StoreError(f"output dir {self.root}: cannot write there ({exc.strerror}); choose a writable "
                             f"location for --out") from None

    def _write_marker(self, data: dict) -> None:
        atomic_write_json(self.marker, data)

    def written(self) -> set[str]:
        """Paths (relative to the run directory) that attnclust recorded as its own."""
        marker = self._read_marker() or {}
        return set(marker.get("written", []))

    def record(self, *paths: Path) -> None:
        """Record ``paths`` as written by attnclust, before they are written.

        A path that already exists and is not attnclust's own is refused (the user put something there).

        Raises
        ------
        attnclust.errors.StoreError
            When an existing path was not written by attnclust.
        """
        marker = self._read_marker()
        if marker is None:
            raise StoreError(f"output dir {self.root}: has no {MARKER} marker; it is not an attnclust run")
        known = set(marker.get("written", []))
        new = []
        for path in paths:
            rel = self.relative(path)
            if rel in known:
                continue
            if Path(path).exists() or Path(path).is_symlink():
                raise StoreError(f"output dir {self.root}: {rel} exists but attnclust did not write it; move it "
                                 f"away or choose a new --out")
            new.append(rel)
        if new:
            marker["written"] = sorted(known | set(new))
            self._write_marker(marker)

    def relative(self, path: Path) -> str:
        """``path`` relative to the run directory (refusing paths outside it)."""
        try:
            return Path(path).relative_to(self.root).as_posix()
        except ValueError:
            raise StoreError(f"path {path}: outside the run directory {self.root}") from None

    def remove(self, *paths: Path) -> None:
        """Remove paths attnclust wrote (files or whole directories); paths it did not record are left alone."""
        own = self.written()
        for path in paths:
            path = Path(path)
            rel = Path(self.relative(path))
            if not ({rel.as_posix(), *(p.as_posix() for p in rel.parents)} & own) or \
                    not (path.exists() or path.is_symlink()):
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()


WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model", "chat_template.jinja", "chat_template.json", "generation_config.json")
"""A model directory's files that decide how text becomes ids and how a decoder is prompted and stops: part of the
model's identity, with ``additional_chat_templates/*.jinja`` (:meth:`ModelDirLayout.text_files`)."""


class ModelDirLayout(StateDirectory):
    """Every path of a model directory written by ``attnclust finetune`` (``--out``), which loads as ``model.name``.

    Layout (relative to the model directory)::

        config.json, model.safetensors, tokenizer files   the finished model (``save_pretrained``), config.json last
        finetune.json        what the fine-tuning did: settings, steps, losses, the evaluation's scores
        checkpoints/         the trainer's checkpoints (``checkpoint-STEP/``), resumed from
        eval/                predictions and ``eval_results.json`` of the evaluation (file names of RunLayout)
        .final.tmp/          the model being written, moved into place file by file
        _state/              the fine-tuning's record (``finetune.json``, ``finetune.started``) and run lock

    Parameters
    ----------
    root
        The model directory.
    """

    stage = "finetune"

    @property
    def record(self) -> Path:
        """``finetune.json``: what the fine-tuning did."""
        return self.root / "finetune.json"

    @property
    def config(self) -> Path:
        """``config.json``: written last; a directory with it holds a finished model."""
        return self.root / "config.json"

    def weights(self) -> tuple[Path, ...]:
        """The weight files transformers may have written (one of them holds the model)."""
        return tuple(self.root / name for name in WEIGHT_FILES)

    def text_files(self) -> tuple[Path, ...]:
        """The tokenizer, chat-template and generation files present, in a fixed order (:data:`TOKENIZER_FILES`,
        then ``additional_chat_templates/*.jinja`` by name)."""
        found = [self.root / name for name in TOKENIZER_FILES if (self.root / name).is_file()]
        return (*found, *sorted((self.root / "additional_chat_templates").glob("*.jinja")))

    @property
    def checkpoints(self) -> Path:
        """``checkpoints/``: the trainer's checkpoints."""
        return self.root / "checkpoints"

    def checkpoint_steps(self) -> dict[int, Path]:
        """Complete checkpoints (their trainer state was written) by training step."""
        found = {}
        for path in self.checkpoints.glob("checkpoint-*"):
            step = path.name.rsplit("-", 1)[-1]
            if path.is_dir() and step.isdigit() and (path / "trainer_state.json").exists():
                found[int(step)] = path
        return found

    @property
    def staging(self) -> Path:
        """``.final.tmp/``: the finished model is saved here, then moved into place."""
        return self.root / ".final.tmp"

    @property
    def eval(self) -> RunLayout:
        """``eval/``: the evaluation's predictions, named as in a run directory."""
        return RunLayout(self.root / "eval")

    @property
    def eval_results(self) -> Path:
        """``eval/eval_results.json``: the official SQuAD 2.0 scores."""
        return self.root / "eval" / "eval_results.json"

    def is_finetune_dir(self) -> bool:
        """True when ``attnclust finetune`` has begun or finished writing here."""
        return self.stage_started(self.stage).exists() or self.record.exists()

    def unfinished(self) -> bool:
        """True when a fine-tuning began here and has not finished (the model is not there yet)."""
        return self.stage_started(self.stage).exists() and not self.stage_record(self.stage).exists()


class CompareLayout(RunLayout):
    """The output directory of ``attnclust compare A B --out C``, with the ownership rules of a run directory
    (marker first, only recorded paths are ever replaced or removed).

    Layout (relative to the directory)::

        .attnclust-run.json     ownership marker (as in a run directory)
        compare.parquet         one row per (layer, head): change, cosine, rank, roles gained / lost
        compare_layers.parquet  one row per layer: the same measures averaged over the layer's heads
        compare.html            the self-contained comparison report
        _state/                 the lock

    Parameters
    ----------
    root
        The directory (``--out``).
    """

    @property
    def compare(self) -> Path:
        """``compare.parquet``: per (layer, head) change between the two runs."""
        return self.root / "compare.parquet"

    @property
    def compare_layers(self) -> Path:
        """``compare_layers.parquet``: per layer change between the two runs."""
        return self.root / "compare_layers.parquet"

    @property
    def compare_report(self) -> Path:
        """``compare.html``: the comparison report."""
        return self.root / "compare.html"

    def compare_files(self) -> tuple[Path, ...]:
        """Every file a comparison writes."""
        return (self.compare, self.compare_layers, self.compare_report)
