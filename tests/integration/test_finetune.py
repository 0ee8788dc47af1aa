"""``attnclust finetune`` and ``attnclust evaluate``: a tiny random BERT trained on the bundled sample."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnclust.cli import main
from attnclust.config import JobConfig
from attnclust.data import sample_path
from attnclust.errors import ConfigError, ModelError
from attnclust.qa import finetune_model

STEPS = 40
TOKENS = {"max_seq_len": 128, "doc_stride": 32, "max_query_len": 32}


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory, tiny_model) -> Path:
    """A randomly initialised 2-layer BERT *encoder* (no QA head) with the MiniLM tokenizer."""
    return tiny_model(tmp_path_factory.mktemp("encoder"), qa_head=False)


def job(encoder_dir, **finetune) -> JobConfig:
    return JobConfig.from_dict({
        "name": "ft", "backend": "cpu", "model": {"name": str(encoder_dir)}, "extract": TOKENS,
        "finetune": {"max_steps": STEPS, "learning_rate": 2e-3, "batch_size": 8, "logging_steps": 2,
                     "save_steps": 10, "eval_data": str(sample_path()), "eval_max_examples": 60, **finetune}})


@pytest.fixture(scope="module")
def trained(encoder_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("ft") / "model"
    record = finetune_model(job(encoder_dir), out, progress=False)
    return out, record


def test_training_loss_goes_down_and_the_dir_is_a_finished_model(trained):
    out, record = trained
    losses = [h["loss"] for h in record["loss_history"]]
    assert record["steps"] == STEPS and len(losses) >= 10
    assert np.mean(losses[-4:]) < 0.8 * np.mean(losses[:4])      # starts near 2 ln(128) ~ 9.7
    for name in ("config.json", "model.safetensors", "tokenizer.json", "finetune.json"):
        assert (out / name).exists()
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["checkpoint-30", "checkpoint-40"]
    saved = json.loads((out / "config.json").read_text())
    assert saved["architectures"] == ["BertForQuestionAnswering"]


def test_evaluation_scores_are_the_official_metric_of_the_written_predictions(trained):
    from attnclust.qa import evaluate_files

    out, record = trained
    ev = json.loads((out / "eval" / "eval_results.json").read_text())
    assert ev["total"] == 60 and ev["HasAns_total"] + ev["NoAns_total"] == 60
    again = evaluate_files(sample_path(), out / "eval" / "predictions.json", out / "eval" / "null_odds.json",
                           null_odds_threshold=0.0, allow_missing=True)
    for key in ("exact", "f1", "HasAns_f1", "NoAns_exact", "best_f1", "best_f1_thresh"):
        assert again[key] == pytest.approx(ev[key], abs=1e-6)
    assert record["eval"]["f1"] == pytest.approx(ev["f1"])


def test_the_output_dir_loads_in_an_extract_job_that_scores_its_answers(trained, tmp_path):
    from attnclust.pipeline import run_job
    from attnclust.stages import COMMANDS

    out, _ = trained
    cfg = JobConfig.from_dict({"name": "useft", "backend": "cpu", "model": {"name": str(out)}, "extract": TOKENS,
                               "data": {"max_examples": 12}})
    result = run_job(cfg, tmp_path / "run", stages=COMMANDS["extract"], progress=False, n_workers=1)
    qa = result.stages["qa"]
    assert qa["head_trained"] is True and qa["scores"]["total"] == 12
    job_json = json.loads((tmp_path / "run" / "job.json").read_text())
    assert job_json["stages"]["qa"]["scores"] == qa["scores"]
    preds = json.loads((tmp_path / "run" / "predictions.json").read_text())
    table = pd.read_parquet(tmp_path / "run" / "predictions.parquet")
    assert len(preds) == 12 and preds == dict(zip(table["example_id"], table["prediction"]))
    assert qa["scores"]["exact"] == pytest.approx(100 * table["exact"].mean())
    # one post-processing: extraction answers exactly as the fine-tune evaluation did on the same questions
    evaluated = json.loads((out / "eval" / "predictions.json").read_text())
    assert preds == {q: evaluated[q] for q in preds}
    odds = json.loads((out / "eval" / "null_odds.json").read_text())
    np.testing.assert_allclose(table["null_odds"], [odds[q] for q in table["example_id"]], atol=1e-3)


def test_rerun_is_a_no_op_and_another_config_is_refused(trained, encoder_dir):
    out, record = trained
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    again = finetune_model(job(encoder_dir, eval_data=None), out, progress=False)
    assert again["steps"] == record["steps"] and "eval" not in again
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
    with pytest.raises(ConfigError, match="another configuration.*--force"):
        finetune_model(job(encoder_dir, learning_rate=1e-3), out, progress=False)


def test_an_interrupted_run_resumes_from_its_last_checkpoint(encoder_dir, tmp_path):
    from transformers import TrainerCallback

    class Interrupt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 14:
                raise KeyboardInterrupt

    out = tmp_path / "model"
    cfg = job(encoder_dir, max_steps=20, eval_data=None)
    with pytest.raises(KeyboardInterrupt):
        finetune_model(cfg, out, progress=False, callbacks=(Interrupt(),))
    assert not (out / "config.json").exists()
    with pytest.raises(ModelError, match="has not finished.*resume"):
        from attnclust.models import resolve_model_path

        resolve_model_path(JobConfig.from_dict({"model": {"name": str(out)}}).model)
    record = finetune_model(cfg, out, progress=False)
    assert record["resumed_from"] == "checkpoint-10" and record["steps"] == 20
    assert [h["step"] for h in record["loss_history"]][:2] == [1, 2]     # history restored from the checkpoint


def test_cli_finetune_bad_inputs_exit_2_with_one_line(encoder_dir, tmp_path, capsys):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    cases = [
        (["--out", str(foreign)], "holds files not written by 'attnclust finetune'"),
        (["--out", str(tmp_path / "a"), "--data", str(tmp_path / "none.json")], "not found|no such|cannot read"),
        (["--out", str(tmp_path / "b"), "--set", "finetune.precision=fp16"], "fp16 mixed precision needs a GPU"),
        (["--out", str(tmp_path / "c"), "--set", "backend=gpu"], "no CUDA device"),
        (["--out", str(tmp_path / "d"), "--set", "finetune.learning_rate=-1"], "finetune.learning_rate"),
    ]
    import torch

    if torch.cuda.is_available():  # with a GPU these two start training instead of failing
        cases = [c for c in cases if "precision=fp16" not in c[0] and "backend=gpu" not in c[0]]
    for extra, pattern in cases:
        code = main(["finetune", "--quiet", "--set", f"model.name={encoder_dir}", *extra])
        err = capsys.readouterr().err.strip()
        assert code == 2, (extra, err)
        assert len(err.splitlines()) == 1 and re.search(pattern, err), (extra, err)
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    assert not any((tmp_path / d).exists() for d in "abcd")
    broken = tmp_path / "broken"                              # a model that cannot load leaves nothing behind
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "bert", "vocab_size": 10}')
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    assert main(["finetune", "--quiet", "--set", f"model.name={encoder_dir}", "--set", f"model.name={broken}",
                 "--out", str(tmp_path / "e")]) == 2
    assert "cannot load" in capsys.readouterr().err and not (tmp_path / "e").exists()


def test_bf16_on_a_gpu_without_it_is_refused_before_training(monkeypatch, encoder_dir):
    import torch

    from attnclust.qa.finetune import _precision

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "Tesla T4")
    with pytest.raises(ConfigError, match="got 'bf16', which Tesla T4 does not support.*auto or fp16"):
        _precision(job(encoder_dir, precision="bf16"), "cuda")
    assert _precision(job(encoder_dir, precision="auto"), "cuda")["precision"] == "fp16"
    assert _precision(job(encoder_dir, precision="bf16"), "cpu")["precision"] == "bf16"


def test_cli_evaluate_prints_official_json_and_refuses_bad_input(tmp_path, capsys):
    from attnclust.data import read_gold

    gold = read_gold(sample_path())
    preds = {q: (answers[0] if answers else "") for q, answers in gold.items()}
    first = next(iter(gold))
    preds[first] = "something else entirely"
    pred_file = tmp_path / "pred.json"
    pred_file.write_text(json.dumps(preds))
    assert main(["evaluate", "--data", str(sample_path()), "--predictions", str(pred_file)]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert list(scores)[:3] == ["exact", "f1", "total"] and scores["total"] == len(gold)
    assert scores["exact"] == pytest.approx(100 * (len(gold) - 1) / len(gold))

    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({**preds, "no-such-id": "x"}))
    malformed = tmp_path / "bad.json"
    malformed.write_text('{"a": "b",,}')
    for path, pattern in ((unknown, "not questions of the gold"), (tmp_path / "missing.json", "not found"),
                          (malformed, "malformed JSON at line 1")):
        assert main(["evaluate", "--data", str(sample_path()), "--predictions", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and pattern in err, err
