"""The model kinds, one object each: an encoder (a BERT-family QA model) and a decoder (a causal LM prompted to
answer).

What differs between the two is asked of the kind, never of a string: :func:`kind_of` resolves it from whatever is
at hand (a loaded model, a model configuration, ``model_info``, a store or its attributes, a features table), and
the kind then

- builds the features from the examples (:meth:`ModelKind.build_features`: an encoder's question/context windows,
  :func:`attnclust.data.tokenize_examples`; a decoder's prompts with its greedy answers,
  :func:`attnclust.models.prompting.prompt_features`; for natural text, ``data.format: text``, either kind's windows of
  the texts, :meth:`ModelKind.text_features`);
- names the special positions (:meth:`ModelKind.special_positions`: an encoder's [CLS] or ``<s>`` first and its
  separators; a decoder's first token, its attention sink);
- runs the forward (:meth:`ModelKind.forward`) and says what it gives (:attr:`ModelKind.outputs`: start/end logits
  or each token's log-probability; :attr:`ModelKind.stores_head_outputs`);
- gates the heads (:meth:`ModelKind.gated`, :meth:`ModelKind.head_layout`: one gate per *query* head, grouped
  key/value heads noted);
- says what a run of it records (:attr:`ModelKind.store_attrs`, :meth:`ModelKind.identity`).

The kinds are spelled as ``model.kind`` spells them (``encoder``, ``causal``: :attr:`ModelKind.name`), which is
also how :attr:`attnclust.models.LoadedModel.kind`, ``model_info["kind"]`` and a decoder's store attribute
``model_kind`` record them; :func:`kind_of` is the one place that reads those records.

Here, above the model runner and the question-answering task (a decoder's features are its prompts and answers),
so that the stages and the analyses ask a model one way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..config import JobConfig, ModelConfig
from ..data.features import tokenize_examples
from ..data.text import window_texts
from ..errors import ModelError
from ..featurize.base import CAUSAL_CONTEXT_VERSION
from ..maps.stats import causal_uniform_scores, shown_statistics, stat_columns, statistics_versions
from ..maps.targets import CAUSAL_ROWS, FULL_ROWS, FullRowTargets
from ..maps.tokens import CLS_TOKENS, SEP_TOKENS, display_tokens
from ..store.contract import AttentionStore
from .decoder import causal_forward, model_kind
from .hooks import gated
from .prompting import PROMPT_WINDOWS_VERSION, prompt_features
from .runner import get_model, run_forward
from .sources import ForwardOutput, LoadedModel

if TYPE_CHECKING:
    import contextlib

    import pandas as pd
    import torch

__all__ = ["DECODER", "ENCODER", "KINDS", "DecoderKind", "EncoderKind", "HeadLayout", "ModelKind",
           "SpecialPositions", "kind_of"]


@dataclass(frozen=True)
class SpecialPositions:
    """The special positions of one feature, as the statistics and the featurizers' token masks read them.

    Attributes
    ----------
    first : int
        The first position (0): an encoder's [CLS] or ``<s>``, a decoder's attention sink; the ``to_cls`` target.
    first_name : str
        What the first position is called: ``[CLS]``, or ``first-token sink``.
    cls : tuple of int
        Positions counted as [CLS]: the first, and any token in :attr:`ModelKind.cls_tokens`.
    sep : tuple of int
        Separator positions: tokens in :attr:`ModelKind.sep_tokens`.
    """

    first: int
    first_name: str
    cls: tuple[int, ...]
    sep: tuple[int, ...]


@dataclass(frozen=True)
class HeadLayout:
    """A model's heads as they are gated and stored.

    Attributes
    ----------
    layers : int
        The ``layer`` dimension.
    heads : int
        Query heads per layer: the ``head`` dimension of the maps and of a gate.
    kv_heads : int
        Key/value heads per layer: ``heads`` unless grouped (Llama, Qwen), where ``heads / kv_heads`` query heads
        share one; their maps differ (eager attention repeats the key/value heads before the softmax) and each is
        gated on its own slice of the output projection's input.
    """

    layers: int
    heads: int
    kv_heads: int

    @property
    def group_size(self) -> int:
        """Query heads per key/value head (1 without grouping)."""
        return self.heads // self.kv_heads if self.kv_heads and self.heads % self.kv_heads == 0 else 1

    def kv_head(self, head: int | np.ndarray) -> int | np.ndarray:
        """The key/value head that query head ``head`` reads: transformers' ``repeat_kv`` repeats each key/value
        head over ``group_size`` consecutive query heads, so query head ``h`` reads ``h // group_size``."""
        return head // self.group_size


class ModelKind:
    """What a kind of model is and does (see the module docstring); :data:`ENCODER` and :data:`DECODER` are the
    two instances, :func:`kind_of` finds the one at hand.

    Attributes
    ----------
    name : str
        ``encoder`` or ``causal``: ``model.kind``'s spelling, and the records' (:func:`kind_of`).
    is_decoder : bool
        A causal LM: query ``i`` attends to keys ``0..i`` only, so nulls and names that assume a full row change
        (the causal uniform row, no next-token target), and it answers by generating.
    cls_tokens, sep_tokens : frozenset of str
        Tokens counted as [CLS] (besides the first position) and as separators, by their text
        (:data:`attnclust.maps.tokens.CLS_TOKENS`, :data:`~attnclust.maps.tokens.SEP_TOKENS`).
    first_name : str
        What the first position is called (:class:`SpecialPositions`).
    outputs : tuple of str
        The :class:`~attnclust.models.ForwardOutput` fields, each (feature, token), that the extract stage keeps per
        feature in ``qa.parquet`` (:meth:`token_outputs`).
    stores_head_outputs : bool
        The forward can capture each head's pooled output (``extract.head_outputs``: ``head_outputs.zarr``).
    compact_spread : str
        The keys over which a compact store's read row gets back the mass it dropped
        (:class:`~attnclust.maps.CompactCode`): an encoder's ``keys`` (all of them), a decoder's ``prefix`` (the
        keys up to its query, all a causal row sees).
    summary_pooling, summary_name : str
        The head outputs the probes read by default (``probe.pooling: auto``) and what that position is called:
        an encoder's ``cls`` ([CLS]), a decoder's ``last_prompt`` (the last prompt token, whose state predicts the
        answer's first token).
    targets : attnclust.maps.targets.FullRowTargets
        What its clusters are named after and how the names' thresholds read them
        (:mod:`attnclust.maps.targets`): an encoder's rows see every key, a decoder's are causal.
    store_attrs : dict
        Attributes the attention store of a run of this kind carries (read back by :func:`kind_of`).
    """

    name: ClassVar[str]
    is_decoder: ClassVar[bool]
    cls_tokens: ClassVar[frozenset[str]] = CLS_TOKENS
    sep_tokens: ClassVar[frozenset[str]] = SEP_TOKENS
    first_name: ClassVar[str]
    outputs: ClassVar[tuple[str, ...]]
    stores_head_outputs: ClassVar[bool]
    compact_spread: ClassVar[str]
    summary_pooling: ClassVar[str]
    summary_name: ClassVar[str]
    targets: ClassVar[FullRowTargets]

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    @property
    def store_attrs(self) -> dict:
        """Attributes the attention store of a run of this kind carries (none for an encoder)."""
        return {}

    def identity(self, cfg: JobConfig) -> dict:
        """What the extract stage's fingerprint holds for this kind beyond every run's entries (none for an
        encoder)."""
        return {}

    def stat_columns(self) -> tuple[str, ...]:
        """The per-map statistics computed on this kind's maps (:func:`attnclust.maps.stats.stat_columns`: a
        decoder's add the induction and duplicate-token shares)."""
        return stat_columns(self.is_decoder)

    def shown_statistics(self) -> tuple[str, ...]:
        """The per-map statistics shown for this kind's maps (:func:`attnclust.maps.stats.shown_statistics`: a
        decoder's leave out the next token and [SEP], which no causal row or prompt holds)."""
        return shown_statistics(self.is_decoder)

    def statistics_versions(self) -> dict[str, int]:
        """The versions of :meth:`stat_columns` (:func:`attnclust.maps.stats.statistics_versions`)."""
        return statistics_versions(self.is_decoder)

    def uniform_scores(self, tokens: Sequence[str], segment_ids: Sequence[int] | None = None
                       ) -> dict[str, float] | None:
        """What a uniform map of this kind scores on each share statistic of one feature, where that differs from
        the share of the keys a target holds: a decoder's causal uniform row, the baseline of its names and roles
        (:func:`attnclust.maps.stats.causal_uniform_scores`); None for an encoder, whose rows see every key."""
        return causal_uniform_scores(tokens, segment_ids) if self.is_decoder else None

    def token_labels(self, tokens: Sequence[str]) -> list[str]:
        """Readable labels of one feature's tokens, as the explorer and the report show them: an encoder's as they
        are (WordPiece tokens read as text)."""
        return [str(t) for t in tokens]

    def featurize_identity(self, featurizer: Any) -> dict:
        """What the featurize stage's fingerprint holds for this kind's maps beyond the featurizer's settings: none
        for an encoder."""
        return {}

    def build_features(self, examples: Sequence[Any], tokenizer: Any, cfg: JobConfig) -> pd.DataFrame:
        """The features of ``examples`` (the rows of ``features.parquet`` before they are ordered).

        Parameters
        ----------
        examples
            Validated examples (:func:`attnclust.data.read_squad`).
        tokenizer
            The model's fast tokenizer (:func:`attnclust.models.get_tokenizer`).
        cfg
            The job: ``extract.*`` and ``data.max_features_per_example`` (a decoder's model and ``backend`` too).

        Returns
        -------
        pandas.DataFrame
            One row per feature; ``attrs`` as the builder sets them (``dropped_features`` at least).
        """
        raise NotImplementedError

    def text_features(self, examples: Sequence[Any], tokenizer: Any, cfg: JobConfig) -> pd.DataFrame:
        """The windows of natural texts (``data.format: text``; :func:`attnclust.data.text.window_texts`):
        ``extract.max_seq_len`` tokens each with the tokenizer's special tokens, overlapping by
        ``extract.doc_stride``, at most ``data.max_features_per_example`` a text. No question, no answer, no model
        run: the kinds differ only in the columns they read back (a decoder's ``part``)."""

        return window_texts(examples, tokenizer, max_seq_len=cfg.extract.max_seq_len,
                            doc_stride=cfg.extract.doc_stride,
                            max_features_per_example=cfg.data.max_features_per_example)

    def forward(self, loaded: LoadedModel, rows: pd.DataFrame, *, device: str = "cpu", attentions: bool = False,
                head_outputs: bool = False, layer_maps: Callable[[int, torch.Tensor], None] | None = None
                ) -> ForwardOutput:
        """One forward pass over a batch of features (inference mode; fp16 autocast on ``cuda``).

        Parameters
        ----------
        loaded
            The model (:func:`attnclust.models.get_model`) on ``device``.
        rows : pandas.DataFrame
            The batch's rows of ``features.parquet``.
        device
            ``cpu`` or ``cuda``.
        attentions
            Also return the attention maps.
        head_outputs
            Also return each head's pooled output (only where :attr:`stores_head_outputs`).
        layer_maps
            Instead of ``attentions``: ``layer_maps(layer, weights)`` gets each layer's weights, (feature, head,
            query, key) padded on ``device``, inside the forward as the layer makes them; none is kept
            (:func:`attnclust.models.hooks.stream_attention`).

        Returns
        -------
        attnclust.models.ForwardOutput
            ``attentions`` (feature, layer, head, query, key) or ``None`` and the fields of :attr:`outputs`.
        """
        raise NotImplementedError

    def token_outputs(self, result: ForwardOutput, i: int, n: int) -> dict[str, np.ndarray]:
        """Feature ``i``'s :attr:`outputs` of a forward's ``result``, each cropped to its true length ``n``
        (float32): its row of ``qa.parquet`` besides ``feature_id``."""
        return {name: getattr(result, name)[i, :n].astype(np.float32) for name in self.outputs}

    def special_positions(self, tokens: Sequence[str]) -> SpecialPositions:
        """The special positions of a feature's tokens, as the token masks read them
        (:class:`attnclust.maps.tokens.TokenContext`, :func:`attnclust.maps.tokens.token_masks`)."""
        toks = [str(t) for t in tokens]
        cls = tuple(i for i, t in enumerate(toks) if i == 0 or t in self.cls_tokens)
        sep = tuple(i for i, t in enumerate(toks) if t in self.sep_tokens)
        return SpecialPositions(first=0, first_name=self.first_name, cls=cls, sep=sep)

    def head_layout(self, loaded: LoadedModel) -> HeadLayout:
        """The model's layers, query heads and key/value heads (:class:`HeadLayout`)."""
        config = getattr(loaded.model, "config", None)
        kv = getattr(config, "num_key_value_heads", None)
        return HeadLayout(layers=loaded.num_layers, heads=loaded.num_heads,
                          kv_heads=int(kv) if kv else loaded.num_heads)

    def gated(self, model: Any, gate: torch.Tensor) -> contextlib.AbstractContextManager[None]:
        """Run the model with head gates (:func:`attnclust.models.hooks.gated`): inside the block, query head
        ``h`` of layer ``l`` outputs ``gate[l, h]`` times its context vector (``gate[b, l, h]`` for feature ``b``).

        Parameters
        ----------
        model
            A :class:`~attnclust.models.LoadedModel` or its transformers model.
        gate : torch.Tensor, shape (layer, head) or (feature, layer, head)
            One gate per query head (:meth:`head_layout`).

        Raises
        ------
        ModelError
            The gate's shape does not match, or the architecture's attention output projections are not found
            (the hooks find those of BERT-style encoders, Llama-style decoders and GPT-2:
            :func:`attnclust.models.hooks.attention_outputs`).
        """

        return gated(model.model if isinstance(model, LoadedModel) else model, gate)


class EncoderKind(ModelKind):
    """A BERT-family question-answering model: ``[CLS] question [SEP] context [SEP]`` windows, answers from
    start/end logits, per-head outputs captured on request."""

    name = "encoder"
    is_decoder = False
    first_name = "[CLS]"
    outputs = ("start_logits", "end_logits")
    stores_head_outputs = True
    compact_spread = "keys"
    summary_pooling = "cls"
    summary_name = "[CLS]"
    targets = FULL_ROWS

    def build_features(self, examples: Sequence[Any], tokenizer: Any, cfg: JobConfig) -> pd.DataFrame:
        """The question/context windows of each example (:func:`attnclust.data.tokenize_examples`); the windows of
        natural text with ``data.format: text`` (:meth:`text_features`)."""
        if cfg.data.format == "text":
            return self.text_features(examples, tokenizer, cfg)

        return tokenize_examples(examples, tokenizer, max_seq_len=cfg.extract.max_seq_len,
                                 doc_stride=cfg.extract.doc_stride, max_query_len=cfg.extract.max_query_len,
                                 max_features_per_example=cfg.data.max_features_per_example)

    def forward(self, loaded: LoadedModel, rows: pd.DataFrame, *, device: str = "cpu", attentions: bool = False,
                head_outputs: bool = False, layer_maps: Callable[[int, torch.Tensor], None] | None = None
                ) -> ForwardOutput:
        """:func:`attnclust.models.run_forward`."""

        return run_forward(loaded, rows, device=device, attentions=attentions, head_outputs=head_outputs,
                           layer_maps=layer_maps)


class DecoderKind(ModelKind):
    """A causal language model prompted to answer: each question's prompt and greedy answer is a feature, the
    forward gives each token's log-probability, the first token is the attention sink (the special tokens are read
    by their text as an encoder's, e.g. a template's ``<s>``)."""

    name = "causal"
    is_decoder = True
    first_name = "first-token sink"
    outputs = ("token_logprobs", "token_top1")
    stores_head_outputs = True
    compact_spread = "prefix"
    summary_pooling = "last_prompt"
    summary_name = "the last prompt token"
    targets = CAUSAL_ROWS

    @property
    def store_attrs(self) -> dict:
        """``model_kind: causal``."""
        return {"model_kind": self.name}

    def token_labels(self, tokens: Sequence[str]) -> list[str]:
        """Readable labels of a causal model's byte-level or SentencePiece tokens
        (:func:`attnclust.maps.tokens.display_tokens`)."""
        return display_tokens(tokens)

    def featurize_identity(self, featurizer: Any) -> dict:
        """``causal_context``: the version of the causal null that featurizers reading token masks use on a
        decoder's maps (:data:`attnclust.featurize.base.CAUSAL_CONTEXT_VERSION`), for a featurizer that
        ``uses_context``; none for the others."""
        return {"causal_context": CAUSAL_CONTEXT_VERSION} if getattr(featurizer, "uses_context", False) else {}

    def identity(self, cfg: JobConfig) -> dict:
        """The prompts and answers are the features: the settings that make them (``extract.prompt``,
        ``extract.max_new_tokens``, ``extract.decoding`` when not greedy, ``model.gguf_file``), the windowing's
        version (:data:`~attnclust.models.prompting.PROMPT_WINDOWS_VERSION`) and ``model_kind``; of natural text
        (``data.format: text``, no prompts) only ``model_kind`` and ``model.gguf_file``. Both also hold how the
        ``profile`` vectors stored at extraction read causal maps (``causal_context``:
        :data:`~attnclust.featurize.CAUSAL_CONTEXT_VERSION`)."""

        if cfg.data.format == "text":
            return {"model_kind": self.name, "model.gguf_file": cfg.model.gguf_file,
                    "causal_context": CAUSAL_CONTEXT_VERSION}

        return {"model_kind": self.name, "model.gguf_file": cfg.model.gguf_file, "extract.prompt": cfg.extract.prompt,
                "extract.max_new_tokens": cfg.extract.max_new_tokens,
                **({"extract.decoding": cfg.extract.decoding} if cfg.extract.decoding != "greedy" else {}),
                "prompt_windows": PROMPT_WINDOWS_VERSION, "causal_context": CAUSAL_CONTEXT_VERSION}

    def build_features(self, examples: Sequence[Any], tokenizer: Any, cfg: JobConfig) -> pd.DataFrame:
        """Each question's prompts and the model's answer to each (:func:`attnclust.models.prompting.prompt_features`),
        the model run here, on this process's device (the GPU when the backend may use one); the windows of natural
        text with ``data.format: text`` (:meth:`text_features`)."""
        if cfg.data.format == "text":
            return self.text_features(examples, tokenizer, cfg)
        import torch

        device = "cuda" if cfg.backend != "cpu" and torch.cuda.is_available() else "cpu"
        return prompt_features(examples, tokenizer, get_model(cfg.model, device=device), style=cfg.extract.prompt,
                               max_new_tokens=cfg.extract.max_new_tokens, max_seq_len=cfg.extract.max_seq_len,
                               doc_stride=cfg.extract.doc_stride,
                               max_features_per_example=cfg.data.max_features_per_example, device=device,
                               decoding=cfg.extract.decoding)

    def text_features(self, examples: Sequence[Any], tokenizer: Any, cfg: JobConfig) -> pd.DataFrame:
        """The windows of :meth:`ModelKind.text_features` with each token's ``part``
        (:data:`~attnclust.models.prompting.PARTS`): ``context`` for the text, ``instruction`` for a special token the
        tokenizer adds (Llama's ``<s>``)."""
        frame = super().text_features(examples, tokenizer, cfg)
        frame["part"] = [["context" if cs <= i <= ce else "instruction" for i in range(n)]
                         for n, cs, ce in zip(frame["seq_len"], frame["context_start"], frame["context_end"])]
        return frame

    def forward(self, loaded: LoadedModel, rows: pd.DataFrame, *, device: str = "cpu", attentions: bool = False,
                head_outputs: bool = False, layer_maps: Callable[[int, torch.Tensor], None] | None = None
                ) -> ForwardOutput:
        """:func:`attnclust.models.causal_forward` (teacher-forced over prompt + answer)."""

        return causal_forward(loaded, rows, device=device, attentions=attentions, head_outputs=head_outputs,
                              layer_maps=layer_maps)


ENCODER = EncoderKind()
DECODER = DecoderKind()
KINDS: dict[str, ModelKind] = {kind.name: kind for kind in (ENCODER, DECODER)}
"""The kinds by :attr:`ModelKind.name`."""


def _recorded(name: Any) -> ModelKind:
    """The kind a record names: ``causal`` is a decoder; anything else, or nothing (a store written by another
    tool, ``model_info`` of an older attnclust), an encoder."""
    return DECODER if name == DECODER.name else ENCODER


def kind_of(source: Any) -> ModelKind:
    """The kind of a model, from whatever describes it.

    Parameters
    ----------
    source
        One of: a :class:`ModelKind`; its name (``encoder`` or ``causal``); a
        :class:`~attnclust.models.LoadedModel` (its ``kind``); a :class:`~attnclust.config.ModelConfig` or a
        :class:`~attnclust.config.JobConfig` (``model.kind``, ``auto`` resolved:
        :func:`attnclust.models.model_kind`); an opened attention store or its attributes (``model_kind``);
        ``model_info`` (:func:`attnclust.models.describe_model`: ``kind``); a features table (a decoder's have a
        ``part`` column, :data:`attnclust.models.prompting.PROMPT_COLUMNS`).

    Returns
    -------
    ModelKind
        :data:`ENCODER` or :data:`DECODER`.

    Raises
    ------
    ModelError
        A name other than ``encoder`` or ``causal``.
    TypeError
        ``source`` is none of the above.
    """
    import pandas as pd

    if isinstance(source, ModelKind):
        return source
    if isinstance(source, str):
        if source not in KINDS:
            raise ModelError(f"model kind {source!r}: unknown; allowed: {' | '.join(KINDS)}")
        return KINDS[source]
    if isinstance(source, LoadedModel):
        return _recorded(source.kind)
    if isinstance(source, JobConfig):
        source = source.model
    if isinstance(source, ModelConfig):
        return KINDS[model_kind(source)]
    if isinstance(source, pd.DataFrame):
        return DECODER if "part" in source.columns else ENCODER
    if isinstance(source, AttentionStore):
        source = source.attrs
    if isinstance(source, Mapping):  # model_info ("kind") or a store's attributes ("model_kind")
        return _recorded(source["kind"] if "kind" in source else source.get("model_kind"))
    raise TypeError(f"kind_of: cannot tell the model kind of a {type(source).__name__}; give a LoadedModel, a "
                    f"ModelConfig, model_info, an attention store or its attrs, or a features table")
