"""Hostile or mistaken jobs end in one line and exit code 2, before anything is computed or served: alias bombs in
a job file, seeds out of the 32-bit range, a figure the run cannot have, a stage command over changed inputs; and
list settings set on the command line."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import yaml

from attnclust._settings import _fail
from attnclust.cli import main
from attnclust.config import ModelConfig, load_job
from attnclust.errors import ConfigError, StoreError
from attnclust.layout import RunLayout
from attnclust.models.sources import model_identity
from attnclust.pipeline import check_extract_inputs, run_job
from attnclust.stages import SerialExecutor


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("attnclust: error: "), err
    return err


# -- alias expansion bombs -------------------------------------------------------------------------------------

def _laughs(levels: int = 10, width: int = 9) -> str:
    """A "billion laughs" in ``report.title``: level i is a list of ``width`` aliases of level i-1."""
    items = ", ".join(["lol"] * width)
    parts = [f"&l0 [{items}]"] + [f"&l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "report:\n  title: [" + ", ".join(parts) + "]\n"


def test_an_alias_bomb_in_a_setting_is_refused_in_one_line(tmp_path, capsys):
    job = tmp_path / "bomb.yaml"
    job.write_text(_laughs())
    out = tmp_path / "out"
    assert main(["report", str(job), "--out", str(out)]) == 2
    err = _one_error_line(capsys)
    assert str(job) in err and "alias" in err
    assert not out.exists()


def test_aliases_that_expand_to_little_still_work(tmp_path):
    job = tmp_path / "anchors.yaml"
    job.write_text("probe:\n  tasks: &t [answerable, qword]\n  labels: []\n"
                   "cluster:\n  k_min: &k 5\n  k_max: *k\n")
    cfg = load_job(job)
    assert cfg.probe.tasks == ("answerable", "qword") and cfg.cluster.k_max == 5


def test_a_self_referencing_alias_is_refused(tmp_path):
    job = tmp_path / "cycle.yaml"
    job.write_text("report:\n  title: &a [*a]\n")
    with pytest.raises(ConfigError, match=r"refers to itself"):
        load_job(job)


def test_an_error_shows_a_bounded_value_however_large_the_value_is():
    value: list = ["lol"] * 9
    for _ in range(30):  # 9^31 leaves, all shared
        value = [value] * 9
    message = str(_fail("report", "title", value, "text, or null for the job name"))
    assert message.startswith("config report.title: got [[[[") and "..." in message and len(message) < 200


# -- seeds -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["cluster.random_state", "cluster.stability_seed", "finetune.seed"])
def test_seeds_of_2_to_the_32_or_more_are_refused_naming_the_range(key):
    assert load_job(None, [f"{key}={2**32 - 1}"]).value(key) == 2**32 - 1
    allowed = r"allowed: an integer >= 0 and <= 4294967295 \(2\*\*32 - 1"
    with pytest.raises(ConfigError, match=rf"{key}: got 4294967296; {allowed}"):
        load_job(None, [f"{key}={2**32}"])
    with pytest.raises(ConfigError, match=rf"{key}: got -1"):
        load_job(None, [f"{key}=-1"])


def test_a_too_large_seed_is_one_line_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["cluster", "--out", str(out), "--set", "cluster.random_state=4294967296"]) == 2
    err = _one_error_line(capsys)
    assert "cluster.random_state: got 4294967296" in err
    assert not out.exists()


def test_the_largest_seed_a_job_accepts_runs_every_random_stream():
    from attnclust.cluster import SEED_STREAMS, fit_clusters, stream_seed

    for seed in (0, 2**32 - 1):
        seeds = [stream_seed(seed, name) for name in SEED_STREAMS]
        assert all(0 <= s < 2**32 for s in seeds) and len(set(seeds)) == len(seeds)   # in range, distinct
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(c, 0.05, size=(40, 4)) for c in (0.0, 1.0, 2.0)]).astype(np.float32)
    settings = ["cluster.k_min=2", "cluster.k_max=4", "cluster.umap=false", "cluster.stability_resamples=2",
                "cluster.stability_splits=2"]
    for seed in (2**32 - 1, 2**32 - 6):
        cfg = load_job(None, [*settings, f"cluster.random_state={seed}", f"cluster.stability_seed={seed}"]).cluster
        assert fit_clusters(x, cfg).k_ == 3


# -- export of a figure the run has no data for ----------------------------------------------------------------

def _with_predictions(run, null_score: float):
    layout = RunLayout(run)
    n = 6
    pd.DataFrame({"example_id": [f"q{i}" for i in range(n)], "question": ["What?"] * n,
                  "prediction": ["", "a", "b", "", "c", "d"], "best_span": ["x", "a", "b", "y", "c", "d"],
                  "span_score": np.zeros(n), "null_score": np.full(n, null_score),
                  "null_odds": [1.0, -1.0, -1.0, 1.0, -1.0, -1.0], "span_probability": np.full(n, 0.5),
                  "n_best": np.ones(n, dtype=np.int64), "is_impossible": [True, False] * 3,
                  "gold_answers": [[], ["a"], [], ["z"], [], ["d"]], "f1": np.ones(n)}
                 ).to_parquet(layout.predictions)
    layout.qa_scores.write_text(json.dumps({"scores": {"exact": 50.0, "f1": 50.0, "total": n},
                                            "settings": {"null_threshold": 0.0}}))
    return layout


@pytest.fixture(scope="module")
def planted(small_planted_run):
    return small_planted_run("hostile-export")


def test_null_odds_of_generated_answers_is_refused_saying_why(planted, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(planted, run)
    layout = _with_predictions(run, np.nan)  # a decoder's: generated, no null score
    target = tmp_path / "odds.png"
    assert main(["export", str(run), "--figure", "null_odds", "--out", str(target)]) == 2
    err = _one_error_line(capsys)
    assert "null_odds" in err and "no null score" in err and "generated" in err
    assert not target.exists() and not layout.exports.exists()


def test_null_odds_of_extracted_answers_is_drawn(planted, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(planted, run)
    _with_predictions(run, 0.5)
    target = tmp_path / "odds.png"
    assert main(["export", str(run), "--figure", "null_odds", "--out", str(target)]) == 0
    assert target.read_bytes().startswith(b"\x89PNG")


# -- a stage command over changed inputs ---------------------------------------------------------------------

TINY = ["cluster.k=2", "cluster.umap=false", "cluster.stability_resamples=2", "probe.enabled=false",
        "extract.features_per_task=4"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_bert_dir):
    """A finished run of every stage (tiny random BERT, 3 questions, in-process), its data file and job."""
    base = tmp_path_factory.mktemp("tiny_run")
    context = "The river town of Elsby grew around a stone bridge built in 1412. Its market drew traders."
    qas = [{"id": f"q{i}", "question": q, "is_impossible": a is None,
            "answers": [] if a is None else [{"text": a, "answer_start": context.index(a)}]}
           for i, (q, a) in enumerate([("When was the bridge built?", "1412"), ("Who built it?", None),
                                       ("What grew around the bridge?", "The river town of Elsby")])]
    data = base / "data.json"
    data.write_text(json.dumps({"version": "v2.0", "data": [{"title": "t", "paragraphs": [
        {"context": context, "qas": qas}]}]}))
    cfg = load_job(None, [f"model.name={tiny_bert_dir}", f"data.path={data}", *TINY])
    run_job(cfg, base / "run", executor=SerialExecutor(), progress=False)
    return base / "run", data, cfg


@pytest.fixture
def changed_run(tiny_run, tmp_path):
    """A copy of the tiny run; its data file is put back as it was afterwards."""
    run, data, cfg = tiny_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    original = data.read_bytes()
    yield copy, data, cfg
    data.write_bytes(original)


def _change(data):
    doc = json.loads(data.read_text())
    doc["data"][0]["paragraphs"][0]["qas"][0]["question"] = "A new question?"
    data.write_text(json.dumps(doc))


@pytest.mark.parametrize("command", ["featurize", "cluster", "report"])
def test_a_stage_command_refuses_when_the_data_file_changed(changed_run, tmp_path, capsys, command):
    run, data, cfg = changed_run
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(cfg.to_dict()))
    _change(data)
    report = (run / "report.html").read_bytes()
    for force in ([], ["--force"]):
        assert main([command, str(job), "--out", str(run), "--quiet", "--workers", "1", *force]) == 2
        err = _one_error_line(capsys)
        assert str(data) in err and "changed since the run's stage 'extract' read it" in err
        assert "attnclust run --force" in err
    assert (run / "report.html").read_bytes() == report


def test_a_stage_command_checks_the_data_the_run_was_built_from(changed_run):
    """A job that names no data file (``attnclust run --data FILE`` then ``attnclust report``) is checked
    against the file the run read; unchanged, the stage is complete."""
    run, data, cfg = changed_run
    unnamed = cfg.replace(data=cfg.data.replace(path=None))
    again = run_job(unnamed, run, stages=("report",), executor=SerialExecutor(), progress=False)
    assert again.stages["report"]["skipped"]
    _change(data)
    with pytest.raises(StoreError, match=r"data file .* changed since the run's stage 'extract' read it"):
        run_job(unnamed, run, stages=("report",), executor=SerialExecutor(), progress=False)


# -- list settings on the command line -----------------------------------------------------------------------

@pytest.mark.parametrize(("text", "tasks"), [("[answerable, qword]", ("answerable", "qword")),
                                             ("answerable,correct", ("answerable", "correct")),
                                             ("qword", ("qword",)), ("[]", ())])
def test_list_settings_take_a_yaml_list_or_commas_on_the_command_line(text, tasks):
    assert load_job(None, [f"probe.tasks={text}"]).probe.tasks == tasks


def test_list_labels_and_a_wrong_item_named():
    assert load_job(None, ['probe.labels=[topic, "a,b"]']).probe.labels == ("topic", "a,b")
    with pytest.raises(ConfigError, match=r"probe.tasks: got 'nope'; allowed: a list of answerable \| qword"):
        load_job(None, ["probe.tasks=[answerable, nope]"])
    with pytest.raises(ConfigError, match=r"probe.labels: got \['a'\]; allowed: a list of column names"):
        load_job(None, ["probe.labels=[[a]]"])


def test_a_stage_command_refuses_when_the_model_changed(tiny_run, tiny_bert_dir, tmp_path):
    run, _, cfg = tiny_run
    copy, model = tmp_path / "run", tmp_path / "model"
    shutil.copytree(run, copy)
    shutil.copytree(tiny_bert_dir, model)
    record_path = RunLayout(copy).stage_record("extract")
    record = json.loads(record_path.read_text())
    record["parts"]["keys"]["model.name"] = str(model)  # as if the run had read this copy
    record["parts"]["identity"]["model_weights"] = model_identity(ModelConfig(name=str(model)))
    record_path.write_text(json.dumps(record))
    check_extract_inputs(RunLayout(copy))  # unchanged
    (model / "tokenizer_config.json").write_text((model / "tokenizer_config.json").read_text() + "\n")
    with pytest.raises(StoreError, match=rf"the model '{model}' changed since the run's stage 'extract' read it"):
        run_job(cfg, copy, stages=("cluster",), executor=SerialExecutor(), progress=False)
