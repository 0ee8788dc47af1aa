"""How well a causal model answers the bundled questions under each prompt style (``extract.prompt``, issue 26).

::

    .venv/bin/python -m bench.studies.prompts                       # SmolLM2, first 20 sample questions, 3 styles
    .venv/bin/python -m bench.studies.prompts --n 20 --styles short example --out /tmp/prompts.json
    .venv/bin/python -m bench.studies.prompts --decoding context        # answers restricted to context spans

The model is loaded once (``model.name``, default the packaged ``smollm2``); for each style every question's prompt
is answered by greedy decoding (:func:`attnclust.models.prompting.prompt_features`, ``max_new_tokens`` 16, prompts cut
to 384 tokens as the extract defaults do) and scored with the official SQuAD 2.0 metric (:func:`attnclust.qa.
score_answers`). Printed per style: EM, F1, HasAns/NoAns F1, questions right (F1 >= 0.5) and seconds per question
(generation only, on whatever else shares the machine); ``--out`` gets the same as JSON. Not a timed test.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

__all__ = ["main", "measure_prompts"]


def measure_prompts(name: str, n: int, styles: list[str], *, max_new_tokens: int = 16,
                    max_seq_len: int = 384, decoding: str = "greedy") -> dict:
    """Scores of each prompt style over the first ``n`` bundled questions (see the module docstring)."""
    import pandas as pd

    from attnclust.config import ModelConfig
    from attnclust.data import read_squad, sample_path
    from attnclust.models import get_model, get_tokenizer
    from attnclust.models.prompting import prompt_features
    from attnclust.qa import score_answers
    from attnclust.qa.generated import predict_generated

    cfg = ModelConfig(name=name)
    examples = read_squad(sample_path(), max_examples=n)
    table = pd.DataFrame({"id": [e.id for e in examples], "question": [e.question for e in examples],
                          "context": [e.context for e in examples],
                          "answer_texts": [[a.text for a in e.answers] for e in examples],
                          "is_impossible": [e.is_impossible for e in examples]})
    contexts = dict(zip(table["id"], table["context"]))
    t0 = time.perf_counter()
    loaded, tokenizer = get_model(cfg), get_tokenizer(cfg)
    out = {"model": name, "decoding": decoding, "questions": len(examples),
           "unanswerable": int(table["is_impossible"].sum()), "load_seconds": round(time.perf_counter() - t0, 1),
           "styles": {}}
    for style in styles:
        t0 = time.perf_counter()
        feats = prompt_features(examples, tokenizer, loaded, style=style, max_new_tokens=max_new_tokens,
                                max_seq_len=max_seq_len, decoding=decoding)
        seconds = time.perf_counter() - t0
        feats.insert(0, "feature_id", range(len(feats)))
        scored, scores, _ = score_answers(predict_generated(feats, None, contexts), table, null_threshold=0.0)
        out["styles"][style] = {
            "exact": round(scores["exact"], 2), "f1": round(scores["f1"], 2),
            "has_ans_f1": round(scores.get("HasAns_f1", float("nan")), 2),
            "no_ans_f1": round(scores.get("NoAns_f1", float("nan")), 2),
            "right": int((scored["f1"] >= 0.5).sum()), "seconds_per_question": round(seconds / len(examples), 2),
            "answers": dict(zip(scored["example_id"], scored["prediction"])),
            "generated": dict(zip(feats["example_id"], feats["generated"]))}
        s = out["styles"][style]
        print(f"{style:8s} EM {s['exact']:6.2f}  F1 {s['f1']:6.2f}  HasAns F1 {s['has_ans_f1']:6.2f}  NoAns F1 "
              f"{s['no_ans_f1']:6.2f}  right {s['right']}/{len(examples)}  {s['seconds_per_question']:.2f} s/question",
              flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.prompts", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="model.name (default: the packaged smollm2)")
    parser.add_argument("--n", type=int, default=20, help="first N questions of the bundled sample")
    parser.add_argument("--styles", nargs="+", default=["plain", "short", "example"])
    parser.add_argument("--decoding", default="greedy", choices=["greedy", "context"],
                        help="extract.decoding: free greedy, or restricted to runs of the context's tokens")
    parser.add_argument("--out", type=Path, default=None, help="write the figures and answers as JSON here")
    args = parser.parse_args(argv)
    result = measure_prompts(args.model, args.n, args.styles, decoding=args.decoding)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
