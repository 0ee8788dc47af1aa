"""How much of an input a run can use, known before anything is decoded or tokenised.

A run keeps at most ``data.max_features_per_example`` windows of ``extract.max_seq_len`` tokens of each context
(or text), and no token stands for more than :data:`CHARS_PER_TOKEN` characters, so a context longer than
:attr:`InputBound.chars` cannot change what the run extracts beyond its first windows: it is refused before it is
tokenised, and a table whose row groups are larger than such rows allow is refused before it is decompressed
(:attr:`InputBound.row_bytes`). Without ``max_features_per_example`` every window is kept and only the file size
bounds the input (:data:`attnclust.safeio.MAX_INPUT_BYTES`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CHARS_PER_TOKEN", "ROW_OVERHEAD_BYTES", "InputBound"]

CHARS_PER_TOKEN = 100
"""The most characters one token stands for: WordPiece's ``max_input_chars_per_word`` (100; a longer word is one
``[UNK]``), above the longest vocabulary entries of the byte-level BPE vocabularies attnclust loads."""
ROW_OVERHEAD_BYTES = 1 << 20
"""Bytes a table row may hold beyond its context (question, id, title, answers, extra columns)."""


@dataclass(frozen=True)
class InputBound:
    """What one example of a run can use: ``max_features_per_example`` windows of ``max_seq_len`` tokens.

    Examples
    --------
    >>> InputBound(384, 16).chars
    614400
    >>> InputBound(384, None).chars is None
    True
    """

    max_seq_len: int
    max_features_per_example: int | None

    @classmethod
    def of(cls, cfg) -> InputBound:
        """The bound of a job (``cfg.extract.max_seq_len``, ``cfg.data.max_features_per_example``)."""
        return cls(int(cfg.extract.max_seq_len), cfg.data.max_features_per_example)

    @property
    def chars(self) -> int | None:
        """The most characters of one context (or text) the windows can hold; ``None``: no bound."""
        if self.max_features_per_example is None:
            return None
        return int(self.max_features_per_example) * int(self.max_seq_len) * CHARS_PER_TOKEN

    @property
    def row_bytes(self) -> int | None:
        """The most uncompressed bytes one table row may take (4 bytes a character in UTF-8, plus
        :data:`ROW_OVERHEAD_BYTES`); ``None``: no bound."""
        return None if self.chars is None else 4 * self.chars + ROW_OVERHEAD_BYTES

    def refusal(self, where: str, what: str, n_chars: int) -> str:
        """One line refusing ``what`` (a context, a text) of ``n_chars`` characters, over :attr:`chars`."""
        return (f"{where}: {what} holds {n_chars:,} characters, more than data.max_features_per_example = "
                f"{self.max_features_per_example} windows of extract.max_seq_len = {self.max_seq_len} tokens can use "
                f"({self.chars:,} at most, {CHARS_PER_TOKEN} characters a token); cut the text, or raise "
                f"data.max_features_per_example (null keeps every window)")
