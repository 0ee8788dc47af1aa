"""Extract: forward passes -> every attention map, cropped to the true length, into the zarr store.

The driver reads and checks the data and the model before anything is written (:func:`prepare_inputs`),
prints the store's projected size and refuses one that would not fit (:meth:`ExtractStage.check`), orders
features by length (so a batch pads little) and plans one block per shard of the store; each block, on a
Dask worker, loads the model once per process, runs its features in length-grouped batches, writes its whole
shard (no other task touches it) with the maps' ``profile`` vectors, its per-map statistics and QA logits as
parquet parts. Each batch is one streaming pass per layer: a hook on each layer's attention module hands the
layer's weights over as the forward makes them (:func:`attnclust.models.hooks.stream_attention`), each feature's
maps of the layer are converted there (the vectors and the statistics from one pass over them, then the stored
form) and the weights are dropped before the next layer runs, so neither the forward nor the task ever holds a
batch's maps of all layers. The driver never holds attention maps. The stage's fingerprint holds the data file's
content hash and the model's weights identity, so an edited file or a re-trained model is never served from an
old extraction.

The store's size and the room for it are :mod:`attnclust.store.plan`'s (:func:`store_bytes`,
:func:`check_store_room`), the shard and the exact sample are written by :mod:`attnclust.stages.extract_writers`
(:func:`profile_and_statistics`, :class:`~attnclust.stages.extract_writers.ShardFiller`, a layer at a time), each
block's task is :mod:`attnclust.stages.extract_task`'s (:func:`extract_block`, its batches :func:`batch_ranges`); this
stage reads the inputs, plans the store and orders the work.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd

from .. import backend as bk
from ..analysis.extraction import (
    MODEL_ANALYSES,
    ModelContext,
    applicable,
    extraction_versions,
    model_fingerprint,
    run_model_analyses,
)
from ..analysis.probes import consolidate_head_outputs
from ..config import JobConfig
from ..data.features import FEATURE_LAYOUT_VERSION, examples_with_control_strings
from ..data.hf import data_fingerprint
from ..data.limits import InputBound
from ..data.squad import check_label_fields, extra_columns, read_squad, sample_path
from ..data.text import TEXT_WINDOWS_VERSION, read_texts
from ..errors import DataError
from ..featurize.profile import ProfileFeaturizer as _Profile
from ..layout import RunLayout
from ..maps import CompactCode
from ..maps.profile import PROFILE_COMPONENTS
from ..models.resolved import ResolvedModel, resolve_model
from ..models.runner import get_tokenizer
from ..runtime import trim_heap
from ..store.contract import (
    atomic_write_parquet,
    check_store_tables,
    create_attention_store,
    mark_store_complete,
    open_attention_store,
)
from ..store.plan import (  # re-exported: the extract stage's pre-flight names
    StorePlan,
    check_store_room,
    compact_store_bytes,
    plan_store,
    store_bytes,
)
from .base import RunContext, Stage
from .extract_task import CPU_BATCH_SIDE, _stores_head_outputs, batch_ranges, extract_block
from .extract_writers import profile_and_statistics  # re-exported: what every extract task computes

COMPACT_SPREAD_VERSION = 1
"""Version of how a compact store gives a read row its dropped mass back (``attrs["compact"]["spread"]`` and the
``map_error`` array, :func:`attnclust.maps.compact_code.spread_dropped`): in a compact run's fingerprint, so a
compact store written without them is extracted again."""
PROFILE_VERSION = _Profile.version
"""Version of the ``profile`` vectors a store holds (its ``profile`` attribute; checked by the featurize stage)."""

__all__ = ["CPU_BATCH_SIDE", "ExtractStage", "batch_ranges", "check_store_room", "compact_store_bytes", "extract_block",
           "plan_features", "prepare_inputs", "profile_and_statistics", "shard_features", "store_bytes", "store_plan"]


def prepare_inputs(cfg: JobConfig) -> dict:
    """Read and validate the data, tokenise it, load the model once; nothing is written.

    Returns
    -------
    dict
        ``data_path``, ``data_sha256``, ``examples`` (one row per question), ``features`` (planned: one row per
        feature in store order), ``dropped_features`` (example id -> features dropped by
        ``data.max_features_per_example``), ``normalised`` (what the features change of the tokenizer's output:
        :func:`attnclust.data.tokenize_examples`) and ``model_info`` (:func:`attnclust.models.resolved.resolve_model`,
        as :meth:`~attnclust.models.resolved.ResolvedModel.to_dict` records it).
        The features are the model kind's (:meth:`attnclust.models.kinds.ModelKind.build_features`: a decoder's
        prompts are answered by the model here, in the driver). With ``data.format: text`` the examples are the
        texts (:func:`attnclust.data.text.read_texts`: no question, ``is_impossible`` null) and the features
        their windows.
    """

    path = Path(cfg.data.path).expanduser() if cfg.data.path else sample_path()
    text = cfg.data.format == "text"
    bound = InputBound.of(cfg)  # what the windows can use: a longer context is refused before it is tokenised
    if text:
        examples = read_texts(path, unit=cfg.data.text_unit, max_examples=cfg.data.max_examples, bound=bound)
    else:
        examples = read_squad(path, max_examples=cfg.data.max_examples, split=cfg.data.split, bound=bound)
    if cfg.probe.enabled and not text:  # natural text has no labels to probe: the probe analysis says so
        check_label_fields(examples, cfg.probe.labels, f"data file {path}")
    model = resolve_model(cfg.model)  # once, here: the stages read it from model_info, the workers get its identity
    tokenizer = get_tokenizer(cfg.model, identity=model.identity)
    features = model.kind.build_features(examples, tokenizer, cfg)
    if features.empty:
        raise DataError(f"data file {path}: zero usable examples after tokenisation; check the file")
    table = pd.DataFrame({
        "id": [e.id for e in examples], "title": [e.title for e in examples],
        "question": [e.question for e in examples], "context": [e.context for e in examples],
        "answer_texts": [[a.text for a in e.answers] for e in examples],
        "answer_starts": [[a.answer_start for a in e.answers] for e in examples],
        "is_impossible": [None if text else e.is_impossible for e in examples],
        **{name: values for name, values in extra_columns(examples).items()  # the data's own labels (probe.labels)
           if name not in ("id", "answer_texts", "answer_starts")}})
    return {"data_path": str(path), "data_sha256": data_fingerprint(path, cfg.data.split), "examples": table,
            "features": plan_features(features), "dropped_features": dict(features.attrs["dropped_features"]),
            "windowed_contexts": dict(features.attrs.get("windowed_contexts", {})), "model_info": model.to_dict(),
            "normalised": list(features.attrs.get("normalised", ())),
            "control_strings": examples_with_control_strings(examples, tokenizer),
            # the registered extraction analyses this model allows (the workers run the same ones)
            "extraction_analyses": [a.name for a in applicable(model)]}  # read from the pre-flight check


def plan_features(features: pd.DataFrame) -> pd.DataFrame:
    """Order features by true length (ties keep dataset order) and number them: ``feature_id`` = store row.

    Grouping similar lengths into one batch (and one shard) is what keeps padding cheap; the join back to
    examples always goes through the explicit ``example_id`` and ``span`` columns.
    """
    ordered = features.reset_index(drop=True)
    ordered = ordered.assign(_order=np.arange(len(ordered)))
    ordered = ordered.sort_values(["seq_len", "_order"], kind="stable").drop(columns="_order")
    ordered.insert(0, "feature_id", np.arange(len(ordered), dtype=np.int64))
    return ordered.reset_index(drop=True)


# features.parquet's rows per row group. Every extract, featurize and atlas task reads its own range of features
# from it (``filters=``), which decodes only the row groups holding the range: at dev's 12,214 features (1,357
# reads) a read takes 0.0096 s with groups of 64 rows, 0.117 s with one group for the whole table and 0.042 s with
# groups of 9, one per task (more metadata).
FEATURE_ROW_GROUP = 64


def shard_features(cfg: JobConfig, *, num_layers: int, num_heads: int, width: int, mode: str = "full") -> int:
    """Features per task/shard: the configured number, or about ``target_task_mb`` of maps as the shard holds them
    in memory (``mode``: a full store's ``extract.store_dtype``; a compact store's uint8)."""
    if cfg.extract.features_per_task is not None:
        return cfg.extract.features_per_task
    itemsize = 1 if mode == "compact" or cfg.extract.store_dtype == "uint8" else 2
    per_feature = num_layers * num_heads * width * width * itemsize
    return max(1, int(cfg.extract.target_task_mb * 2**20 // per_feature))


CONTROL_TEXT_VERSION = 1
"""Version of how data text holding control-token strings is tokenised (as text: ``split_special_tokens``); in
the fingerprint of a run whose data holds such strings, so its earlier extraction is not served."""


def control_strings_note(found: dict[str, list[str]], *, texts: bool = False) -> str:
    """One line: how many questions (``texts``: texts of natural text) held the model's control-token strings,
    which, and that they stayed text."""
    strings = sorted({t for hits in found.values() for t in hits})
    shown = ", ".join(repr(t) for t in strings[:4]) + (", ..." if len(strings) > 4 else "")
    n = len(found)
    what, where = ("text", "") if texts else ("question", " in the context or the question")
    return (f"note: {n:,} {what}{'s' if n != 1 else ''} ({', '.join(sorted(found)[:3])}"
            f"{', ...' if n > 3 else ''}) {'hold' if n != 1 else 'holds'} the model's control-token strings{where} "
            f"({shown}); they are read as text, never as the control tokens, so the data cannot end a segment or a "
            f"chat turn")


def _capped_note(dropped: dict[str, int], cap: int | None) -> str:
    n, total = len(dropped), sum(dropped.values())
    kept = f"its first {cap}" if n == 1 else f"the first {cap} of each"
    return (f"note: {n:,} example{'s' if n != 1 else ''} had more than {cap} features: kept {kept}, dropped "
            f"{total:,} feature{'s' if total != 1 else ''}; raise data.max_features_per_example (null keeps all) "
            f"to keep them")


def prepare_store(layout: RunLayout, features: pd.DataFrame, *, cfg: JobConfig, model_info: dict,
                  done: set[int], plan: StorePlan | None = None) -> tuple[list[tuple[int, int]], set[int]]:
    """Write features.parquet and create the store, or keep them when resuming (``done`` blocks exist).

    ``plan`` is the resolved store (:func:`store_plan`; by default resolved here from ``cfg``).

    Returns the blocks ``[(start, stop)]`` and the set of blocks already done.
    """
    if done and layout.attention.exists():
        try:
            store = open_attention_store(layout.attention, require_complete=False)
            if store.n_features == len(features):
                return store.blocks(), done
        except Exception:  # noqa: BLE001 -- unreadable leftovers of our own: start over
            pass
    shutil.rmtree(layout.block_markers(ExtractStage.name), ignore_errors=True)
    layout.remove(layout.parts, layout.attention)
    atomic_write_parquet(features, layout.features, row_group_size=FEATURE_ROW_GROUP)
    seq_len = features["seq_len"].to_numpy(np.int32)
    plan = plan or store_plan(cfg, seq_len, model_info)
    model = ResolvedModel.from_dict(model_info)
    layers, heads = model.layout.layers, model.layout.heads
    per_task = shard_features(cfg, num_layers=layers, num_heads=heads, width=int(seq_len.max()), mode=plan.mode)
    store = create_attention_store(
        layout.attention, seq_len=seq_len, num_layers=layers, num_heads=heads,
        features_per_task=per_task, dtype=cfg.extract.store_dtype, mode=plan.mode,
        compact_mass=cfg.extract.compact_mass, compact_max_keys=plan.max_keys,
        profile_dim=len(PROFILE_COMPONENTS), exact_features=plan.sample,
        # a read compact row gets the mass it dropped back, over the keys it sees (a decoder's: up to its query)
        compact_spread=model.kind.compact_spread,
        value_norms=model.value_norms,  # what heads move: each key's norm beside the maps
        # the model's heads and kind (grouped key/value heads: the report's grid by key/value group)
        attrs={"model": cfg.model.name, "max_seq_len": cfg.extract.max_seq_len, **model.store_attrs,
               "profile": {"featurizer": "profile", "version": PROFILE_VERSION}},
    )
    return store.blocks(), set()


def store_plan(cfg: JobConfig, seq_len: np.ndarray, model_info: dict) -> StorePlan:
    """The store these features get: ``extract.store`` resolved (``auto``: full within ``extract.store_budget_gb``)
    and a compact store's exact sample (:func:`attnclust.store.plan.plan_store`)."""
    layers, heads = model_info["num_layers"], model_info["num_heads"]
    return plan_store(cfg, seq_len, num_layers=layers, num_heads=heads,
                      full_bytes=store_bytes(seq_len, num_layers=layers, num_heads=heads,
                                             dtype=cfg.extract.store_dtype),
                      compact_bytes=compact_store_bytes(seq_len, num_layers=layers, num_heads=heads))


def finish_store(layout: RunLayout, n_blocks: int) -> None:
    """Consolidate the parts into ``map_stats.parquet`` / ``qa.parquet`` and mark the store complete."""
    stats = pd.concat([pd.read_parquet(layout.part("stats", b)) for b in range(n_blocks)], ignore_index=True)
    qa = pd.concat([pd.read_parquet(layout.part("qa", b)) for b in range(n_blocks)], ignore_index=True)
    atomic_write_parquet(stats, layout.map_stats)
    atomic_write_parquet(qa, layout.qa_logits)
    mark_store_complete(layout.attention)


def drop_parts(layout: RunLayout, n_blocks: int) -> None:
    """Remove the extract tasks' parts once ``map_stats.parquet``, ``qa.parquet`` and ``head_outputs.zarr`` hold them
    (at SQuAD2-dev's size 219 MB that nothing reads again); ``parts/`` itself only when nothing else is in it.

    The block markers go first: a run stopped between here and the stage's record then extracts again from the
    start instead of resuming blocks whose parts are gone.
    """
    shutil.rmtree(layout.block_markers(ExtractStage.name), ignore_errors=True)
    for block in range(n_blocks):
        for path in (layout.part("stats", block), layout.part("qa", block), layout.head_output_part(block)):
            path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # absent, or holding another stage's parts
        layout.parts.rmdir()


def slim_features(inputs: dict) -> None:
    """Keep only what the driver still reads of the planned features once features.parquet holds them all.

    The tasks read their features from features.parquet; the driver afterwards needs the count and the lengths
    only. The token, id and offset lists are Python objects: at SQuAD2-dev's 12,214 features they hold about
    0.5 GB of the driver's memory, which the rest of the run does not need.
    """

    features = inputs["features"]
    inputs["features"] = features[[c for c in ("feature_id", "example_id", "seq_len") if c in features]].copy()
    del features
    trim_heap()


class ExtractStage(Stage):
    """Attention maps, per-map statistics and QA logits of every feature (see the module docstring)."""

    name = "extract"
    loads_model = True
    reads = ("data.path", "data.max_examples", "model.name", "model.revision", "extract.max_seq_len",
             "extract.doc_stride", "extract.max_query_len", "extract.batch_size", "extract.features_per_task",
             "extract.target_task_mb", "extract.store_dtype", "extract.store", "extract.compact_mass",
             "extract.compact_max_keys")
    task = staticmethod(extract_block)
    worker_imports = ("torch", "transformers.modeling_utils")  # the model and its forward

    def keys(self, cfg: JobConfig) -> tuple[str, ...]:
        """:attr:`reads`, plus ``extract.head_outputs`` when on, ``data.split`` when set and ``data.format`` and
        ``data.text_unit`` for natural text: a run that leaves them unset keeps the fingerprint it has without
        them, and one that sets them is not served a run without them."""
        return self.reads + (("extract.head_outputs",) if cfg.extract.head_outputs else ()) + (
            ("data.split",) if cfg.data.split is not None else ()) + (
            ("data.format", "data.text_unit") if cfg.data.format == "text" else ())

    def resolved_keys(self, ctx: RunContext) -> dict:
        """``extract.store`` as resolved for this run's features (``auto`` -> ``full`` or ``compact``), so an
        ``auto`` run that resolves to ``full`` is the same extraction as ``store: full``; a compact store's
        ``extract.exact_sample`` too (the features it keeps when the budget cut it), and
        ``extract.compact_max_keys`` as fitted to the budget when it was ``null`` and a cap was needed
        (:func:`~attnclust.store.plan.fit_max_keys`), and the compact rows' encoding
        (:attr:`attnclust.maps.CompactCode.name`: a store in another is extracted again)."""
        plan = self._store_plan(ctx)
        return {"extract.store": plan.mode,
                **({"extract.exact_sample": len(plan.sample) if plan.sample_cut else ctx.cfg.extract.exact_sample,
                    "compact_encoding": CompactCode.name, "compact_spread": COMPACT_SPREAD_VERSION}
                   if plan.mode == "compact" else {}),
                **({"extract.compact_max_keys": plan.max_keys} if plan.fitted else {})}

    @staticmethod
    def _store_plan(ctx: RunContext) -> StorePlan:
        return store_plan(ctx.cfg, ctx.inputs["features"]["seq_len"].to_numpy(), ctx.inputs["model_info"])

    def identity(self, ctx: RunContext) -> dict:
        """The data's content identity (:func:`~attnclust.data.hf.data_fingerprint`), the model's identity
        (weights, tokenizer, chat template, generation config: :func:`~attnclust.models.model_identity`), the
        backend, the statistics' versions and those of the extraction analyses that measure this model
        (:mod:`attnclust.analysis.extraction`: what heads move ...; the per-model ones, a decoder's induction
        diagnostic and protocols, each at the top level under its name with the settings it reads),
        and ``data.max_features_per_example`` when it cut an example (a cap that cuts nothing leaves the
        features, so the fingerprint, as they were); for a causal model also the settings of its prompts and
        answers (``extract.prompt``, ``extract.max_new_tokens``, ``model.gguf_file``), which an encoder's
        fingerprint leaves out."""
        inputs = ctx.inputs
        capped = {"features_capped_at": ctx.cfg.data.max_features_per_example} if inputs.get("dropped_features") \
            else {}
        if inputs.get("control_strings"):  # data text holding "[SEP]" or "<|im_start|>" is tokenised as text
            capped["control_strings_as_text"] = CONTROL_TEXT_VERSION
        if inputs.get("normalised"):  # features that differ from the tokenizer's output (RoBERTa's segments ...)
            capped["features_normalised"] = FEATURE_LAYOUT_VERSION
        if ctx.cfg.data.format == "text":  # how texts become windows (data/text.py)
            capped["text_windows"] = TEXT_WINDOWS_VERSION
        model = ResolvedModel.from_dict(inputs["model_info"])  # resolved once, on the driver
        kind = model.kind
        capped.update(kind.identity(ctx.cfg))  # a decoder's: the settings of its prompts and answers
        capped.update(model_fingerprint(kind, ctx.cfg))  # the per-model analyses measured here (finalize)
        return {"data_file_content": inputs["data_sha256"], "model_weights": model.identity,
                "backend": ctx.backend, "statistics": kind.statistics_versions(),
                "extraction_analyses": extraction_versions(inputs["extraction_analyses"]), **capped}

    def check(self, ctx: RunContext) -> None:
        """Before anything is written: note the features the cap dropped, print the store's projected size (with
        ``extract.store: auto``, which store and why) and refuse one above ``extract.max_store_gb`` or the free
        disk space (:func:`check_store_room`)."""
        inputs, cfg = ctx.inputs, ctx.cfg
        if inputs.get("dropped_features"):
            ctx.note(_capped_note(inputs["dropped_features"], cfg.data.max_features_per_example))
        if inputs.get("windowed_contexts"):
            n, total = len(inputs["windowed_contexts"]), sum(inputs["windowed_contexts"].values())
            ctx.note(f"note: {n:,} context{'s' if n != 1 else ''} too long for one prompt in extract.max_seq_len = "
                     f"{cfg.extract.max_seq_len} tokens: windowed into {total:,} prompts (overlap "
                     f"extract.doc_stride = {cfg.extract.doc_stride} tokens), each question's answer chosen across "
                     f"its windows")
        if inputs.get("control_strings"):
            ctx.note(control_strings_note(inputs["control_strings"], texts=cfg.data.format == "text"))
        if cfg.data.format == "text":
            n_texts, n_windows = len(inputs["examples"]), len(inputs["features"])
            ctx.note(f"note: natural text (data.format: text): {n_texts:,} text{'s' if n_texts != 1 else ''} in "
                     f"{n_windows:,} window{'s' if n_windows != 1 else ''} of at most extract.max_seq_len = "
                     f"{cfg.extract.max_seq_len} tokens, consecutive windows of a text sharing extract.doc_stride = "
                     f"{cfg.extract.doc_stride}; no questions, so no QA, importance, probes or answer analyses")
        heads = ResolvedModel.from_dict(inputs["model_info"]).layout
        seq_len = inputs["features"]["seq_len"].to_numpy()
        plan = self._store_plan(ctx)
        ctx.note(f"extract: {len(seq_len):,} features, {heads.layers} layers x {heads.heads} heads, "
                 f"width {int(seq_len.max())}, {plan.describe(cfg.extract.store_dtype, cfg.extract.compact_mass)}")
        note = check_store_room(ctx.layout, plan.projected, cfg, expected=plan.expected)
        if note:
            ctx.note(note)

    def verify(self, ctx: RunContext) -> None:
        """``features.parquet`` still describes the store row for row (before any later stage reads them)."""

        if ctx.layout.attention.exists() and ctx.layout.features.exists():
            check_store_tables(ctx.layout.root)

    def provided(self, layout: RunLayout) -> bool:
        """A store written by another tool (attention.zarr + features.parquet, the store contract)."""
        return layout.attention.exists() and layout.features.exists()

    def outputs(self, layout: RunLayout) -> tuple[Path, ...]:
        """The store, its tables and parts, and the files of the per-model extraction analyses."""
        return (layout.examples, layout.features, layout.attention, layout.parts, layout.map_stats,
                layout.head_outputs, layout.qa_logits,
                *(path for analysis in MODEL_ANALYSES.values() for path in analysis.outputs(layout)))

    def plan(self, ctx: RunContext, done: set[int]) -> tuple[list[tuple], set[int]]:
        """Write ``examples.parquet``, create (or keep, when resuming) the store; one block per shard."""

        inputs = ctx.inputs
        atomic_write_parquet(inputs["examples"], ctx.layout.examples)
        blocks, done = prepare_store(ctx.layout, inputs["features"], cfg=ctx.cfg, model_info=inputs["model_info"],
                                     done=done, plan=self._store_plan(ctx))
        slim_features(inputs)
        self.t0_ = time.perf_counter()
        device = bk.torch_device(ctx.backend)
        identity = inputs["model_info"]["identity"]  # resolved on the driver: the workers' model cache key
        analyses = tuple(inputs["extraction_analyses"])  # the driver's choice: every block measures the same ones
        return [(s, e, ctx.cfg, device, identity, analyses) for s, e in blocks], done

    def block_costs(self, ctx: RunContext, blocks: list[tuple]) -> list[float]:
        """Each block's summed squared lengths (its maps' area: their conversion, writes and attention): the
        features are in length order, so without this the longest block would start last and finish alone."""
        seq_len = ctx.inputs["features"]["seq_len"].to_numpy(np.float64)
        return [float((seq_len[s:e] ** 2).sum()) for s, e, *_ in blocks]

    def finalize(self, ctx: RunContext, results: list) -> dict:
        """Consolidate the parts, mark the store complete; record counts, throughput, ``head_trained`` and the
        resolved ``store`` (``full`` or ``compact``)."""
        inputs = ctx.inputs
        model = ResolvedModel.from_dict(inputs["model_info"])  # resolved once, on the driver
        kind = model.kind
        store = open_attention_store(ctx.layout.attention, require_complete=False)
        blocks = store.blocks()
        finish_store(ctx.layout, len(blocks))
        if _stores_head_outputs(ctx.cfg, kind):  # -> head_outputs.zarr
            consolidate_head_outputs(ctx.layout.head_outputs, [ctx.layout.head_output_part(b) for b in
                                                               range(len(blocks))], len(inputs["features"]))
        else:
            ctx.layout.remove(ctx.layout.head_outputs)
        drop_parts(ctx.layout, len(blocks))
        # the per-model extraction analyses that apply (a decoder's induction diagnostic and the papers' protocols),
        # with the model the driver resolved; the files of those that do not apply are removed
        measured = run_model_analyses(ModelContext(ctx.layout, ctx.cfg, bk.torch_device(ctx.backend),
                                                   model.identity, inputs["examples"], note=ctx.note), kind)
        seconds = time.perf_counter() - self.t0_
        features = inputs["features"]
        return {"features": len(features), "examples": len(inputs["examples"]),
                "maps": len(features) * model.layout.layers * model.layout.heads,
                "features_per_second": round(sum(r["features"] for r in results) / seconds, 3) if results else None,
                "forward_seconds": round(sum(r["forward_seconds"] for r in results), 3),
                "convert_seconds": round(sum(r.get("convert_seconds", 0.0) for r in results), 3),
                "tokens": int(features["seq_len"].sum()), "head_trained": model.head_trained,
                "data_path": inputs["data_path"], "data_format": ctx.cfg.data.format, "store": store.mode,
                "control_strings": {"examples": len(inputs.get("control_strings", {})),
                                    "strings": sorted({t for hits in inputs.get("control_strings", {}).values()
                                                       for t in hits})},
                **measured}
