"""Tuning the key-value lookup task (:mod:`attnclust.data.kvgen`) to a model, so that it answers about half the
questions right (``attnclust generate kv --calibrate``).

A right/wrong analysis needs both classes: a task the model always fails (or always passes) has nothing to predict.
The model answers small probe batches (``probe_questions`` each, default 40) by its own prompting path
(:func:`attnclust.models.prompting.prompt_features` and :func:`~attnclust.qa.generated.predict_generated`, under the
job's ``extract`` settings), each answer scored right when its official SQuAD F1 is at least
:data:`RIGHT_MIN_F1`, as the atlas's right/wrong analyses score it. Accuracy falls as the list grows, so
:func:`calibrate` bisects ``pairs`` between the shortest list and the longest one that fits the prompt
(``extract.max_seq_len`` less ``extract.max_new_tokens``) until a probe lands within ``tolerance`` of ``target``;
when even the longest list is answered too well it raises ``similarity`` to 1 (every distractor a near miss), and
when even the shortest is answered too badly it lowers it to 0. The chosen setting is the probe closest to
``target``; it is in the band when its accuracy lies in :data:`BAND`. A probe's accuracy over 40 questions has a
standard error of about 0.08 at 0.5: the final file's own share right is what a bench reports. A guess among the
lines is right 1 / ``pairs`` of the time (:attr:`Calibration.chance`, printed beside the accuracy): a short list can
be in the band by guessing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..data import Answer, Example
from ..data.kvgen import KVSettings, check_out, check_questions, kv_questions, write_kv
from ..errors import ConfigError
from ..models import get_model, get_tokenizer
from ..models.kinds import kind_of
from ..models.prompting import encode_prompt, prompt_features
from .evaluate import RIGHT_MIN_F1, f1_score
from .generated import predict_generated

__all__ = ["BAND", "RIGHT_MIN_F1", "Calibration", "ModelAnswerer", "Probe", "answer_examples", "calibrate",
           "check_target", "kv_examples", "longest_fitting", "write_calibrated"]

BAND = (0.35, 0.65)
"""The share right a calibrated task aims to lie in."""


@dataclass(frozen=True)
class Probe:
    """One probe batch: the setting, and how many of its questions the model answered right."""

    pairs: int
    similarity: float
    right: int
    questions: int

    @property
    def accuracy(self) -> float:
        return self.right / self.questions


@dataclass(frozen=True)
class Calibration:
    """The chosen setting (``pairs``, ``similarity``), its probe's ``accuracy``, whether that lies in ``band``, the
    longest list tried (``max_pairs``) and every probe in the order it ran."""

    pairs: int
    similarity: float
    accuracy: float
    in_band: bool
    band: tuple[float, float]
    target: float
    max_pairs: int
    probes: tuple[Probe, ...] = field(default=())

    @property
    def chance(self) -> float:
        """The share right of a guess among the list's lines (1 / ``pairs``): an accuracy near it says the model
        barely finds the line."""
        return 1.0 / self.pairs

    def as_dict(self) -> dict:
        return {"pairs": self.pairs, "similarity": self.similarity, "probe_accuracy": self.accuracy,
                "chance": self.chance,
                "in_band": self.in_band, "band": list(self.band), "target": self.target, "max_pairs": self.max_pairs,
                "probes": [{"pairs": p.pairs, "similarity": p.similarity, "right": p.right, "questions": p.questions}
                           for p in self.probes]}

    def line(self) -> str:
        """One line: the setting and its probe accuracy, and the probes."""
        tried = ", ".join(f"{p.pairs}@{p.similarity:g}: {p.accuracy:.2f}" for p in self.probes)
        where = "in" if self.in_band else "OUTSIDE"
        return (f"calibrated: pairs {self.pairs}, similarity {self.similarity:g}: probe accuracy {self.accuracy:.3f} "
                f"({where} {self.band[0]:g}-{self.band[1]:g}; a guess among the {self.pairs} lines: {self.chance:.2f}; "
                f"probes pairs@similarity: {tried})")


def check_target(target: float, band: tuple[float, float] = BAND) -> None:
    """Refuse a ``target`` outside ``band`` (``ConfigError``)."""
    low, high = band
    if not 0.0 < low <= target <= high < 1.0:
        raise ConfigError(f"--target {target!r}: must lie in the band {low:g}-{high:g} (the share right a "
                          f"calibrated task aims at); pass e.g. --target 0.5")


def longest_fitting(tokens: Callable[[int], int], budget: int, upper: int) -> int:
    """The largest ``pairs`` in ``1..upper`` whose prompt takes at most ``budget`` tokens (``tokens(pairs)``, which
    grows with ``pairs``); 0 when not even one pair fits."""
    if tokens(1) > budget:
        return 0
    lo, hi = 1, upper
    if tokens(hi) <= budget:
        return hi
    while hi - lo > 1:  # tokens(lo) fits, tokens(hi) does not
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if tokens(mid) <= budget else (lo, mid)
    return lo


def calibrate(answer: Callable[[int, float], Sequence[bool]], *, max_pairs: int, min_pairs: int = 2,
              similarity: float = 0.5, target: float = 0.5, band: tuple[float, float] = BAND,
              tolerance: float = 0.1, max_probes: int = 12) -> Calibration:
    """Choose ``pairs`` (and, when needed, ``similarity``) so that ``answer`` gets about ``target`` right.

    Bisection over ``min_pairs..max_pairs``, starting in the middle (short prompts are cheap, and a probe within
    ``tolerance`` of ``target`` stops it); when it runs past the long end (even ``max_pairs`` answered too well) it
    starts again at similarity 1, past the short end at similarity 0, each at most once.

    Parameters
    ----------
    answer
        ``answer(pairs, similarity)``: one probe batch, a right/wrong flag per question (:class:`ModelAnswerer`;
        a test's planted answerer). Accuracy is assumed to fall as ``pairs`` grows.
    max_pairs, min_pairs
        The longest and shortest lists tried (:func:`longest_fitting` gives the longest a prompt holds).
    similarity
        The similarity tried first; 1 is tried when the longest list is answered too well, 0 when the shortest
        is answered too badly.
    target
        The share right aimed at; a probe within ``tolerance`` of it stops the search.
    band
        ``(low, high)``: the shares right that count as calibrated.
    max_probes
        The most probe batches run.

    Returns
    -------
    Calibration
        The probe closest to ``target`` (fewer pairs on a tie), and whether its accuracy lies in ``band``.

    Raises
    ------
    ConfigError
        A setting out of range (``target`` outside ``band``, ``min_pairs`` above ``max_pairs``).
    """
    low, high = band
    check_target(target, band)
    if not 1 <= min_pairs <= max_pairs:
        raise ConfigError(f"kv calibration: the shortest list ({min_pairs} pairs) is longer than the longest that "
                          f"fits the prompt ({max_pairs} pairs); raise extract.max_seq_len")
    done: dict[tuple[int, float], Probe] = {}
    order: list[Probe] = []

    def probe(pairs: int, sim: float) -> float:
        if (pairs, sim) not in done:
            flags = np.asarray(answer(pairs, sim), bool)
            if flags.size == 0:
                raise ConfigError("kv calibration: a probe batch answered no questions; pass --probe-questions >= 1")
            done[pairs, sim] = Probe(pairs, sim, int(flags.sum()), int(flags.size))
            order.append(done[pairs, sim])
        return done[pairs, sim].accuracy

    def close(acc: float) -> bool:
        return abs(acc - target) <= tolerance

    def budget_left() -> bool:
        return len(order) < max_probes

    sim, tried = float(similarity), set()
    while budget_left():
        tried.add(sim)
        lo, hi = min_pairs - 1, max_pairs + 1  # as if the empty list were always right and the too long never
        while hi - lo > 1 and budget_left():
            mid = (lo + hi) // 2
            acc = probe(mid, sim)
            if close(acc):
                break
            lo, hi = (mid, hi) if acc > target else (lo, mid)
        else:
            if lo == max_pairs and 1.0 not in tried:  # the longest list answered too well: nearer distractors
                sim = 1.0
                continue
            if hi == min_pairs and 0.0 not in tried:  # the shortest list answered too badly: farther ones
                sim = 0.0
                continue
        break
    best = min(order, key=lambda p: (abs(p.accuracy - target), p.pairs))
    return Calibration(pairs=best.pairs, similarity=best.similarity, accuracy=best.accuracy,
                       in_band=low <= best.accuracy <= high, band=(low, high), target=target, max_pairs=max_pairs,
                       probes=tuple(order))


def kv_examples(n_questions: int, *, pairs: int, similarity: float, seed: int, ask: str = "value",
                stream: str = "probe") -> list[Any]:
    """Key-value questions (:func:`attnclust.data.kvgen.kv_questions`, by default from the seed's ``probe`` stream:
    not a file's questions) as :class:`attnclust.data.Example` objects."""
    out = []
    for para in kv_questions(n_questions, KVSettings(pairs, similarity, seed, ask), stream=stream):
        for q in para["qas"]:
            out.append(Example(id=q["id"], title="key-value lookup", question=q["question"], context=para["context"],
                               answers=tuple(Answer(text=a["text"], answer_start=a["answer_start"])
                                             for a in q["answers"]),
                               is_impossible=False))
    return out


class ModelAnswerer:
    """A job's causal model answering key-value probe batches by its own prompting path.

    Parameters
    ----------
    cfg : attnclust.config.JobConfig
        The job: ``model`` (a causal model), ``extract.prompt``, ``extract.decoding``, ``extract.max_new_tokens``
        and ``extract.max_seq_len`` as a run would use them.
    questions
        Questions per probe batch.
    seed
        Entropy of the probe batches' questions (every batch the same seed: the settings compared on the same
        draws).
    ask
        What the questions ask for (:data:`attnclust.data.kvgen.ASK`).
    progress
        Print one line per probe batch.
    """

    def __init__(self, cfg: Any, *, questions: int = 40, seed: int = 0, ask: str = "value", progress: bool = False):
        if not kind_of(cfg.model).is_decoder:
            raise ConfigError(f"model.name {cfg.model.name!r}: is an encoder; calibration prompts a causal model "
                              f"(a decoder) for its answers; generate without --calibrate and set --pairs and "
                              f"--similarity yourself")
        if isinstance(questions, bool) or not isinstance(questions, int) or questions < 1:
            raise ConfigError(f"--probe-questions {questions!r}: must be an integer >= 1; pass e.g. 40")
        KVSettings(1, 0.0, seed, ask)
        self.cfg, self.questions, self.seed, self.ask, self.progress = cfg, questions, seed, ask, progress
        self.budget = cfg.extract.max_seq_len - cfg.extract.max_new_tokens

    @property
    def tokenizer(self) -> Any:
        return get_tokenizer(self.cfg.model)

    def prompt_tokens(self, pairs: int, similarity: float) -> int:
        """The longest prompt (tokens) of a probe batch at this setting."""
        return max(len(encode_prompt(self.tokenizer, ex.context, ex.question, self.cfg.extract.prompt)["input_ids"])
                   for ex in kv_examples(self.questions, pairs=pairs, similarity=similarity, seed=self.seed,
                                         ask=self.ask))

    def max_pairs(self, similarity: float, upper: int = 200) -> int:
        """The longest list whose probe prompts all fit ``extract.max_seq_len`` with room for the answer."""
        return longest_fitting(lambda p: self.prompt_tokens(p, similarity), self.budget, upper)

    def __call__(self, pairs: int, similarity: float) -> np.ndarray:
        """Right (F1 >= :data:`RIGHT_MIN_F1`) or wrong, per question of one probe batch."""
        examples = kv_examples(self.questions, pairs=pairs, similarity=similarity, seed=self.seed, ask=self.ask)
        right = answer_examples(examples, self.cfg)
        if self.progress:
            print(f"probe: pairs {pairs}, similarity {similarity:g}: {int(right.sum())} of {len(right)} right",
                  flush=True)
        return right


def answer_examples(examples: Sequence[Any], cfg: Any) -> np.ndarray:
    """Whether the job's causal model answers each example right (official F1 >= :data:`RIGHT_MIN_F1`), by the
    prompting path a run takes (``extract`` settings; the model on the GPU when the backend may use one)."""
    import torch

    device = "cuda" if cfg.backend != "cpu" and torch.cuda.is_available() else "cpu"
    tokenizer = get_tokenizer(cfg.model)
    features = prompt_features(examples, tokenizer, get_model(cfg.model, device=device), style=cfg.extract.prompt,
                               max_new_tokens=cfg.extract.max_new_tokens, max_seq_len=cfg.extract.max_seq_len,
                               doc_stride=cfg.extract.doc_stride, device=device, decoding=cfg.extract.decoding)
    features = features.assign(feature_id=np.arange(len(features)))
    predicted = predict_generated(features, None, {ex.id: ex.context for ex in examples})
    said = dict(zip(predicted["example_id"], predicted["prediction"]))
    return np.array([max(f1_score(a.text, said.get(ex.id, "")) for a in ex.answers) >= RIGHT_MIN_F1
                     for ex in examples], bool)


def write_calibrated(cfg: Any, out: str | Path, n_questions: int, *, seed: int = 0, similarity: float = 0.5,
                     ask: str = "value", target: float = 0.5, probe_questions: int = 40,
                     progress: bool = True) -> tuple[Path, Calibration]:
    """Calibrate the key-value task to the job's model (:func:`calibrate` with a :class:`ModelAnswerer`), then
    write ``n_questions`` questions at the chosen setting to ``out`` (:func:`attnclust.data.kvgen.write_kv`), the
    calibration recorded in the file's ``settings`` (``calibration``).

    ``out`` is checked before the model runs: a file attnclust did not write is refused. The longest list tried
    is the longest whose probe prompts fit ``extract.max_seq_len`` with room for the answer, at the similarity
    tried first and at 1 (near keys are longer); the file's prompts longer than that (windowed by a run) are
    counted in the record (``prompts_over_budget``).

    Raises
    ------
    ConfigError
        ``out`` is not writable by this command, the model is not a causal one, or a setting is out of range.
    """
    out = Path(out)
    check_out(out)
    check_questions(n_questions)
    check_target(target)
    KVSettings(1, similarity, seed, ask)
    answerer = ModelAnswerer(cfg, questions=probe_questions, seed=seed, ask=ask, progress=progress)
    longest = min(answerer.max_pairs(similarity), answerer.max_pairs(1.0))
    if progress:
        print(f"calibrating: lists of 2 to {longest} pairs fit extract.max_seq_len {cfg.extract.max_seq_len}; "
              f"{probe_questions} questions a probe", flush=True)
    result = calibrate(answerer, max_pairs=longest, similarity=similarity, target=target)
    over = sum(len(encode_prompt(answerer.tokenizer, ex.context, ex.question, cfg.extract.prompt)["input_ids"])
               > answerer.budget for ex in kv_examples(n_questions, pairs=result.pairs, similarity=result.similarity,
                                                       seed=seed, ask=ask, stream="questions"))
    record = {**result.as_dict(), "model": cfg.model.name, "probe_questions": probe_questions,
              "prompts_over_budget": int(over), "extract.prompt": cfg.extract.prompt,
              "extract.decoding": cfg.extract.decoding, "extract.max_seq_len": cfg.extract.max_seq_len}
    write_kv(out, n_questions, pairs=result.pairs, similarity=result.similarity, seed=seed, ask=ask,
             extra={"calibration": record})
    return out, result
