"""The papers' protocols for decoder heads, run as built-in diagnostics of the extract stage: Gu et al.'s sink rate
(:mod:`.sink_rate`), the standard induction, previous-token and duplicate-token scales (:mod:`.head_detectors`) and
Wu et al.'s retrieval heads by the needle-in-a-haystack test (:mod:`.needle`).

A causal run's extract stage, with the model loaded (after today's induction diagnostic,
:mod:`attnclust.analysis.induction`), feeds it

- for the sink rate: :data:`SINK_SEQUENCES` sequences of :data:`~.sink_rate.SINK_T` tokens of each kind, natural
  windows of the run's own contexts, random tokens and one token repeated, each also with the chat template's
  first token in front (:func:`template_first_token`; none without a chat template);
- for the head detectors: ARENA's :data:`~.head_detectors.ARENA_SEQUENCES` sequences of BOS (the tokenizer's
  ``bos_token``, when it has one) and :data:`~.head_detectors.ARENA_LENGTH` random tokens twice, scored by every
  registered head detector (:mod:`.detectors`: ARENA's induction scale and TransformerLens's induction,
  previous-token and duplicate-token patterns are built in), each with the permutation null of
  :func:`~.head_detectors.pair_pvalues`;
- for the retrieval heads: the needle-in-a-haystack tests of :func:`~.needle.measure_retrieval` (three needles in
  the run's contexts, three lengths up to ``extract.max_seq_len``, three depths, greedy answers),

and writes ``decoder_protocols.parquet`` (one row per head, :func:`protocol_columns`) and
``decoder_protocols.json`` (the rates, thresholds and counts; :func:`measure_protocols`, :func:`write_protocols`;
registered as the per-model extraction analysis ``decoder_protocols``, :mod:`.extraction`, whose version
:func:`protocols_version` holds the detectors'). The head analyses ``sink_rate``, one per head detector and
``needle_retrieval`` join the per-head numbers to ``heads.parquet`` (NaN for encoders); the ``decoder_protocols``
analysis hands the summary to the report's "Decoder protocols" section. A head is one of a detector's heads when
its score is above the detector's threshold (:func:`~.detectors.detector_thresholds`) and its Benjamini-Hochberg
q-value over the model's heads is at most :data:`~.detectors.PROTOCOL_FDR`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import pandas as pd

from ..errors import DataError
from ..models.decoder import causal_forward
from ..models.runner import get_model, get_tokenizer
from ..models.templates import checked_template
from ..safeio import atomic_write_json
from ..store import atomic_write_parquet
from .detectors import (
    HEAD_DETECTORS,
    PROTOCOL_FDR,
    detector_flags,
    detector_thresholds,
    detector_versions,
    score_detectors,
)
from .extraction import ModelContext, model_analysis
from .head_detectors import ARENA_LENGTH, ARENA_SEQUENCES, repeated_halves
from .heads import HeadContext, head_analysis
from .needle import NEEDLE_COLUMNS, NEEDLE_DEPTHS, NEEDLE_FRACTIONS, NEEDLES, measure_retrieval, needle_fractions
from .plugins import AnalysisContext, register_analysis
from .protocol_files import SINK_VARIANTS, aligned_protocols, read_protocols, table_columns
from .protocol_reuse import ProtocolReuse, contexts_digest, shared_reuse
from .sink_rate import (
    GU_TABLE1,
    SINK_EPSILON,
    SINK_KINDS,
    SINK_T,
    default_prefix,
    first_token_alpha,
    natural_windows,
    ordinary_ids,
    random_token_sequences,
    repeated_token_sequences,
    sink_rates,
    with_first_token,
)

__all__ = ["PROTOCOLS_VERSION", "PROTOCOL_FDR", "PROTOCOL_PERMUTATIONS", "SINK_SEQUENCES",
           "VERSION_2_DETECTORS", "detector_flags", "detector_thresholds", "measure_protocols", "protocol_columns",
           "protocol_inputs", "protocols_version", "read_protocols", "run_protocols", "template_first_token",
           "write_protocols"]

log = logging.getLogger(__name__)

PROTOCOLS_VERSION = 2
"""Bumped when a protocol changes (part of the extract stage's fingerprint for causal models, with the head
detectors': :func:`protocols_version`)."""
VERSION_2_DETECTORS = {"induction_arena": 1, "induction_tl": 1, "previous_token": 1, "duplicate_token": 1}
"""The head detectors (name: version) that version 2 of the protocols measured."""
SINK_SEQUENCES = 10
"""Sequences of each kind and variant for the sink rate (Gu et al. use 100 natural ones; natural windows may be
fewer): 60 forward passes of 64 tokens in all."""
PROTOCOL_PERMUTATIONS = 999
"""Random-key draws of each detector's null."""
PROTOCOL_SEED = 0
"""Root of the seed sequence whose named streams draw the random, repeated and detector tokens and the nulls."""
_STREAMS = ("random", "repeated", "detectors", "null")


def protocol_columns() -> tuple[str, ...]:
    """Columns of ``decoder_protocols.parquet``: per head, each kind's mean ``alpha_1`` and the share of sequences it
    is a sink on (raw and with the template's first token: ``_template``), each registered head detector's score and
    p-value (:mod:`.detectors`), and the needle-in-a-haystack retrieval score and flag
    (:func:`~.protocol_files.table_columns`)."""
    return table_columns(HEAD_DETECTORS)


def protocols_version() -> int | dict:
    """The protocols' version with the head detectors': :data:`PROTOCOLS_VERSION` while the registered detectors are
    those it measured (:data:`VERSION_2_DETECTORS`), so earlier runs and kept measurements are served; with any other
    set (a detector added, or one's version bumped) ``{"protocols": PROTOCOLS_VERSION, "detectors": {name:
    version}}``. Part of the extract stage's fingerprint for causal models and of the detectors' key between runs."""
    detectors = detector_versions()
    return PROTOCOLS_VERSION if detectors == VERSION_2_DETECTORS else {"protocols": PROTOCOLS_VERSION,
                                                                       "detectors": detectors}


def _streams(seed: int = PROTOCOL_SEED) -> dict[str, np.random.SeedSequence]:
    return dict(zip(_STREAMS, np.random.SeedSequence(seed).spawn(len(_STREAMS))))


def template_first_token(tokenizer: Any, style: str = "short") -> int | None:
    """The first token of the model's chat prompts: the first id of its chat template's rendering (SmolLM2's
    ``<|im_start|>``), None without a chat template.

    The template renders once, bounded in time and memory (:func:`attnclust.models.templates.checked_template`), with
    the run's prompt style.
    """
    if not getattr(tokenizer, "chat_template", None):
        return None

    ids = tokenizer(checked_template(tokenizer, style), add_special_tokens=False)["input_ids"]
    return int(ids[0]) if len(ids) else None


def protocol_inputs(tokenizer: Any, contexts, *, vocab_size: int | None = None, template: int | None = None,
                    n_sink: int = SINK_SEQUENCES, n_detector: int = ARENA_SEQUENCES, length: int = ARENA_LENGTH,
                    seed: int = PROTOCOL_SEED) -> dict[str, np.ndarray]:
    """Every token sequence of the protocols.

    Parameters
    ----------
    tokenizer
        The model's tokenizer.
    contexts
        The run's contexts (natural text).
    vocab_size
        The model's embedding size (ids at or above it are not drawn).
    template
        The chat template's first token (:func:`template_first_token`), or None.
    n_sink, n_detector, length, seed
        :data:`SINK_SEQUENCES`, ARENA's batch and half length, :data:`PROTOCOL_SEED`.

    Returns
    -------
    dict of str to numpy.ndarray, each (sequence, token) int64
        ``natural``, ``random``, ``repeated`` (``SINK_T`` tokens each), the same with ``_template`` when there is
        a template token, and ``detectors`` (BOS + ``length`` tokens twice).
    """
    streams = _streams(seed)
    vocab = ordinary_ids(tokenizer, vocab_size)
    out = {"natural": natural_windows(contexts, tokenizer, n=n_sink),
           "random": random_token_sequences(vocab, n=n_sink, rng=np.random.default_rng(streams["random"])),
           "repeated": repeated_token_sequences(vocab, n=n_sink, rng=np.random.default_rng(streams["repeated"]))}
    if template is not None:
        out["natural_template"] = natural_windows(contexts, tokenizer, n=n_sink, first=template)
        out["random_template"] = with_first_token(out["random"], template)
        out["repeated_template"] = with_first_token(out["repeated"], template)
    bos = getattr(tokenizer, "bos_token_id", None)
    out["detectors"] = repeated_halves(vocab, n=n_detector, length=length, bos=bos,
                                       rng=np.random.default_rng(streams["detectors"]))
    return out


def _maps(loaded: Any, ids: np.ndarray, device: str, batch: int) -> np.ndarray:
    """(sequence, layer, head, query, key) float32 maps of equally long sequences, ``batch`` at a time."""

    parts = []
    for s in range(0, len(ids), batch):
        result = causal_forward(loaded, pd.DataFrame({"input_ids": list(ids[s:s + batch])}), device=device)
        parts.append(result.attentions.float().cpu().numpy())
    return np.concatenate(parts)


def measure_protocols(loaded: Any, tokenizer: Any, contexts, *, device: str = "cpu", template: int | None = None,
                      n_sink: int = SINK_SEQUENCES, n_detector: int = ARENA_SEQUENCES, length: int = ARENA_LENGTH,
                      permutations: int = PROTOCOL_PERMUTATIONS, seed: int = PROTOCOL_SEED,
                      batch: int = 10, max_len: int | None = None,
                      needle_lengths: int = len(NEEDLE_FRACTIONS), reuse: ProtocolReuse | None = None) \
        -> tuple[pd.DataFrame, dict]:
    """Run the protocols on a causal model.

    Parameters
    ----------
    loaded : attnclust.models.LoadedModel
        A causal model with eager attention (:func:`attnclust.models.get_model`).
    tokenizer
        Its tokenizer.
    contexts
        The run's contexts (the natural text).
    device
        ``cpu`` or ``cuda``.
    template
        The chat template's first token, or None (the ``_template`` columns are then NaN).
    n_sink, n_detector, length, permutations, seed
        See :func:`protocol_inputs`, :data:`PROTOCOL_PERMUTATIONS`.
    batch
        Sequences per forward pass.
    max_len
        The longest needle-in-a-haystack test, prompt and answer (the job's ``extract.max_seq_len``;
        :func:`~.needle.measure_retrieval`); None: no needle test (its columns NaN and False, ``retrieval`` None).
    needle_lengths
        Context lengths of the needle test, evenly spaced from half of the longest to the longest
        (:func:`~.needle.needle_fractions`; the job's ``extract.needle_lengths``); 0: no needle test, as None above.
    reuse
        Where the parts that do not read the run's questions are kept between runs (:mod:`.protocol_reuse`: the
        sink rate on random and repeated tokens, the detectors, and the needle test for the same contexts); None:
        everything is measured.

    Returns
    -------
    table : pandas.DataFrame
        One row per (``layer``, ``head``) with :func:`protocol_columns`.
    summary : dict
        ``sink`` (``T``, ``epsilon``, ``heads``, ``template_token``, ``default_prefix``, ``rates`` and
        ``sequences`` per kind and variant (``raw``, ``template``; a rate is None without sequences), each
        sequence's rate (``sequence_rates``),
        ``gu_table1``) and ``detectors`` (``sequences``, ``length``, ``bos`` and ``bos_text``, ``permutations``,
        ``fdr``, and per detector ``threshold``, ``ceiling``, ``above``, ``heads``, ``max``, ``best``) and
        ``retrieval`` (:func:`~.needle.measure_retrieval`'s summary, or None) and ``reused`` (per part,
        ``sink_<kind>``, ``detectors``, ``retrieval``: whether it was read from an earlier run's entry; with
        ``why_not`` when nothing could be).
    """
    t0 = time.perf_counter()
    reuse = reuse or ProtocolReuse(None)
    vocab_size = getattr(getattr(loaded.model, "config", None), "vocab_size", None)
    inputs = protocol_inputs(tokenizer, contexts, vocab_size=vocab_size, template=template, n_sink=n_sink,
                             n_detector=n_detector, length=length, seed=seed)
    n_layers, n_heads = int(loaded.num_layers), int(loaded.num_heads)
    li, hi = np.repeat(np.arange(n_layers), n_heads), np.tile(np.arange(n_heads), n_layers)
    columns: dict[str, np.ndarray] = {"layer": li.astype(np.int64), "head": hi.astype(np.int64)}
    rates: dict[str, dict] = {}
    counts: dict[str, dict] = {}
    spread: dict[str, dict] = {}
    reused: dict[str, bool] = {}

    def sink_part(kind: str) -> tuple[pd.DataFrame, dict]:  # both variants of one kind of sequence
        part, info = {}, {"rates": {}, "counts": {}, "spread": {}}
        for variant in SINK_VARIANTS:
            key, suffix = (kind, "") if variant == "raw" else (f"{kind}_template", "_template")
            ids = inputs.get(key)
            n = 0 if ids is None else len(ids)
            info["counts"][variant] = n
            if not n:
                info["rates"][variant] = info["spread"][variant] = None
                part[f"sink_alpha_{kind}{suffix}"] = part[f"sink_share_{kind}{suffix}"] = np.full(len(li), np.nan)
                continue
            alpha = first_token_alpha(_maps(loaded, ids, device, batch))  # (sequence, layer, head)
            per_sequence = sink_rates(alpha)
            info["rates"][variant] = float(per_sequence.mean())
            info["spread"][variant] = [round(float(r), 6) for r in per_sequence]
            part[f"sink_alpha_{kind}{suffix}"] = alpha.mean(0).ravel()
            part[f"sink_share_{kind}{suffix}"] = (alpha > SINK_EPSILON).mean(0).ravel()
        return pd.DataFrame(part), info

    sink_settings = {"version": PROTOCOLS_VERSION, "template": template, "n": n_sink, "seed": seed, "batch": batch}
    for kind in SINK_KINDS:  # the natural windows read the run's contexts: measured every time
        if kind == "natural":
            (part, info), reused[f"sink_{kind}"] = sink_part(kind), False
        else:
            (part, info), reused[f"sink_{kind}"] = reuse.fetch(f"sink_{kind}", sink_settings,
                                                               lambda kind=kind: sink_part(kind))
        columns.update({c: part[c].to_numpy() for c in part.columns})
        rates[kind], counts[kind], spread[kind] = info["rates"], info["counts"], info["spread"]

    def detector_part() -> tuple[pd.DataFrame, dict]:  # every registered head detector on one set of forwards
        ids = inputs["detectors"]
        part, info = score_detectors(_maps(loaded, ids, device, batch), ids, length=length, permutations=permutations,
                                     seed=_streams(seed)["null"])
        return pd.DataFrame(part), info

    version = protocols_version()
    (part, info), reused["detectors"] = reuse.fetch(
        "detectors", {"version": version, "n": n_detector, "length": length, "permutations": permutations,
                      "seed": seed, "batch": batch}, detector_part)
    columns.update({c: part[c].to_numpy() for c in part.columns})
    ceiling = info["ceiling"]
    ids = inputs["detectors"]
    retrieval = None
    if max_len is None or needle_lengths <= 0:
        columns["needle_retrieval"], columns["needle_retrieval_head"] = np.full(len(li), np.nan), np.zeros(len(li),
                                                                                                            bool)
        reused["retrieval"] = False
    else:
        def needle_part() -> tuple[pd.DataFrame, dict]:
            found, summary = measure_retrieval(loaded, tokenizer, contexts, max_len=max_len, device=device,
                                               fractions=needle_fractions(needle_lengths))
            return found[list(NEEDLE_COLUMNS)].reset_index(drop=True), summary

        (found, retrieval), reused["retrieval"] = reuse.fetch(
            "needle", {"version": PROTOCOLS_VERSION, "contexts": contexts_digest(contexts), "max_len": int(max_len),
                       "fractions": list(needle_fractions(needle_lengths))}, needle_part)
        columns.update({c: found[c].to_numpy() for c in NEEDLE_COLUMNS})  # the same (layer, head) order
    table = pd.DataFrame({c: columns[c] for c in protocol_columns()})
    thresholds = detector_thresholds(ceiling)
    flags = detector_flags(table, thresholds)
    detectors = {}
    for name, detector in HEAD_DETECTORS.items():
        score = table[name].to_numpy(np.float64)
        best = int(np.nanargmax(score))
        detectors[name] = {"threshold": thresholds[name], "above": int((score > thresholds[name]).sum()),
                           "heads": int(flags[name][1].sum()), "max": float(score[best]),
                           "best": [int(li[best]), int(hi[best])], "ceiling": detector.ceiling(ceiling)}
    bos = getattr(tokenizer, "bos_token_id", None)
    summary = {
        "version": version,
        "sink": {"T": SINK_T, "epsilon": SINK_EPSILON, "heads": n_layers * n_heads,
                 "template_token": None if template is None else {"id": int(template),
                                                                   "text": tokenizer.decode([int(template)])},
                 "default_prefix": default_prefix(tokenizer), "rates": rates, "sequences": counts,
                 "sequence_rates": spread,
                 "contexts": len({c for c in contexts if isinstance(c, str) and c.strip()}),
                 "gu_table1": {model: dict(zip(SINK_KINDS, row)) for model, row in GU_TABLE1.items()}},
        "detectors": {"sequences": int(len(ids)), "length": int(length), "bos": None if bos is None else int(bos),
                      "bos_text": None if bos is None else tokenizer.decode([int(bos)]),
                      "permutations": int(permutations), "fdr": PROTOCOL_FDR, **detectors},
        "retrieval": retrieval,
        "reused": {**reused, "why_not": reuse.why_not} if reuse.model is None else reused,
        "seconds": round(time.perf_counter() - t0, 3)}
    return table, summary


def write_protocols(layout: Any, cfg: Any, contexts, *, device: str = "cpu", note=None,
                    reuse: ProtocolReuse | None = None, identity: str | None = None) -> dict:
    """Measure the run's causal model (:func:`measure_protocols`) and write ``decoder_protocols.parquet`` and
    ``decoder_protocols.json`` atomically; ``note`` (a callable taking one line) is told why the needle test ran
    no test, when it ran none. ``reuse``: where the parts that do not read the run's questions are kept between
    runs (:func:`~.protocol_reuse.protocol_reuse`; None: everything is measured). ``identity``: the model's, as
    the driver resolved it (the key of the process's model cache; None: computed).

    Returns ``seconds`` (what it took) and ``reused`` (the parts read from an earlier run's entry).
    """

    t0 = time.perf_counter()
    tokenizer = get_tokenizer(cfg.model, identity=identity)
    table, summary = measure_protocols(get_model(cfg.model, device=device, identity=identity), tokenizer,
                                       list(contexts), device=device,
                                       template=template_first_token(tokenizer, cfg.extract.prompt),
                                       max_len=cfg.extract.max_seq_len, needle_lengths=cfg.extract.needle_lengths,
                                       reuse=reuse)
    atomic_write_parquet(table, layout.decoder_protocols)
    atomic_write_json(layout.decoder_protocols_summary, summary)
    why = (summary.get("retrieval") or {}).get("none_reason")
    if why and note is not None:
        note(f"needle test: no test ran: {why}")
    return {"seconds": time.perf_counter() - t0,
            "reused": [part for part, was in summary["reused"].items() if was is True]}


def _needle_identity(cfg: Any) -> dict:
    """The needle test's grid in the fingerprint when the job sets another than the default (so that earlier runs
    keep theirs)."""
    needles = cfg.extract.needle_lengths
    return {} if needles == type(cfg.extract).model_fields["needle_lengths"].default else \
        {"extract.needle_lengths": needles}


@model_analysis("decoder_protocols", version=protocols_version, applies=lambda kind: kind.is_decoder,
                outputs=lambda layout: (layout.decoder_protocols, layout.decoder_protocols_summary),
                identity=_needle_identity,
                description="the papers' protocols for decoder heads: Gu et al.'s sink rate, the registered head "
                            "detectors on ARENA's repeated random halves, Wu et al.'s retrieval heads by the "
                            "needle-in-a-haystack test")
def run_protocols(ctx: ModelContext) -> dict:
    """The protocols in the extract stage's finalize (a causal model), the run's contexts as natural text; the
    record's ``protocols_seconds``, ``protocols_reused`` (the parts read from an earlier run's entry) and, when
    nothing could be, ``protocols_not_reused`` (why)."""
    reuse = shared_reuse(ctx)
    done = write_protocols(ctx.layout, ctx.cfg, ctx.examples["context"], device=ctx.device, note=ctx.note,
                           reuse=reuse, identity=ctx.identity)
    return {"protocols_seconds": round(done["seconds"], 3), "protocols_reused": done["reused"],
            **({"protocols_not_reused": reuse.why_not} if reuse.why_not else {})}


@head_analysis("sink_rate", columns=tuple(f"sink_alpha_{kind}" for kind in SINK_KINDS), unit="share",
               description=f"Gu et al.'s alpha_1: the first token's attention averaged over all {SINK_T} query "
                           f"rows, mean over {SINK_SEQUENCES} sequences of natural text from the run's contexts, "
                           f"random tokens and one repeated token (causal models only; a sink above "
                           f"{SINK_EPSILON:g})")
def _sink_rate(ctx: HeadContext) -> pd.DataFrame:
    heads, table, _ = aligned_protocols(ctx)
    names = [f"sink_alpha_{kind}" for kind in SINK_KINDS]
    if table is None:
        return heads.assign(**{c: np.nan for c in names})
    return heads.assign(**{c: table[c].to_numpy(np.float64) for c in names})


@head_analysis("needle_retrieval", columns=NEEDLE_COLUMNS, unit="share",
               description=f"Wu et al.'s retrieval score by the needle-in-a-haystack test: per accepted test (answer "
                           f"ROUGE-1 recall > 0.5), the decoding steps where the head's attention argmax is on the "
                           f"needle token being generated, over the needle's length; mean over {len(NEEDLES)} needles "
                           f"x up to 3 lengths x {len(NEEDLE_DEPTHS)} depths (causal models only); "
                           f"needle_retrieval_head: above 0.1")
def _needle_retrieval(ctx: HeadContext) -> pd.DataFrame:
    heads, table, _ = aligned_protocols(ctx)
    if table is None:
        return heads.assign(needle_retrieval=np.nan, needle_retrieval_head=False)
    return heads.assign(needle_retrieval=table["needle_retrieval"].to_numpy(np.float64),
                        needle_retrieval_head=table["needle_retrieval_head"].eq(True).to_numpy())


def _check_summary(result: Any) -> None:
    if not isinstance(result, dict) or not {"sink", "detectors"} <= set(result):
        raise DataError("report input analyses['decoder_protocols']: expected decoder_protocols.json's mapping "
                        "with sink and detectors")


@register_analysis("decoder_protocols", section="decoder_protocols", validate=_check_summary, version=1)
def protocol_summary(ctx: AnalysisContext) -> dict | None:
    """``decoder_protocols.json`` of a causal run, with its table under ``table`` (None for an encoder or a run
    without it): read by the report's "Decoder protocols" section. Its files are the extract stage's outputs (their
    version is in that stage's fingerprint), so it records no version of its own."""
    found = read_protocols(ctx.layout)
    if found is None:
        return None
    table, summary = found
    return {**summary, "table": table}
