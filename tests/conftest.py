"""Shared fixtures: the packaged MiniLM tokenizer, a tiny random BERT QA model directory, small datasets, and what
several test folders read, made once per session: the demo run (tests/integration, tests/browser) and the executed
tutorial notebook (tests/docs, tests/browser)."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
_THREADS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
if (int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) >= len(os.sched_getaffinity(0))
        and not any(name in os.environ for name in _THREADS)):  # a user's own thread settings stand
    # As many test processes as cores (the README's ``-n 2`` on 2 cores): each has one core, and its own OpenMP and
    # BLAS pools take one thread, as a Dask worker's do (``distributed.nanny.pre-spawn-environ``); they read these
    # variables as they load, so they are set for the import below only. A second thread finds no free core and
    # spins at every barrier: tests/unit/{stages,analysis,models} took 226 s instead of 183 s (bench/HISTORY.md).
    # The commands the tests start (CLI runs, Dask workers) get the environment as it was: there one thread
    # measured no faster.
    os.environ.update(dict.fromkeys(_THREADS, "1"))
    import torch  # noqa: E402, F401 - its OpenMP pool reads them now
    from threadpoolctl import threadpool_limits  # noqa: E402

    threadpool_limits(limits=1, user_api="blas")  # NumPy's OpenBLAS, loaded already by a pytest plugin
    for _name in _THREADS:
        del os.environ[_name]

from helpers import save_tiny_model  # noqa: E402 - after the environment it must see

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_model():
    """:func:`save_tiny_model`, the one factory every test builds its tiny models with."""
    return save_tiny_model


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    """A randomly initialised 2-layer x 4-head BERT QA model with the MiniLM tokenizer, saved to disk."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="session")
def family_model(tmp_path_factory):
    """``make(family)`` -> the directory of a tiny random QA model of that family (RoBERTa, DistilBERT, ELECTRA,
    ALBERT, DeBERTa-v2) with a tokenizer of its kind, saved once per session (:mod:`families`)."""
    from families import save_family_model

    made: dict[str, Path] = {}

    def make(family: str) -> Path:
        if family not in made:
            made[family] = save_family_model(family, tmp_path_factory.mktemp(family))
        return made[family]

    return make


@pytest.fixture(scope="session")
def small_planted_run(tmp_path_factory):
    """``make(name)`` -> a finished run directory (featurize, cluster, report; UMAP off, k = 2) over a small planted
    store of 6 features, 2 layers x 2 heads, lengths 8..40 (:func:`attnclust.synthetic.write_planted_store`)."""
    import numpy as np

    from attnclust.config import load_job
    from attnclust.pipeline import run_job
    from attnclust.stages import SerialExecutor
    from attnclust.synthetic import write_planted_store

    def make(name: str) -> Path:
        planted = write_planted_store(tmp_path_factory.mktemp(name) / "run", rng=np.random.default_rng(0),
                                      n_features=6, n_layers=2, n_heads=2, lengths=(8, 40), features_per_task=3)
        cfg = load_job(None, ["cluster.umap=false", "cluster.k=2", "cluster.stability_resamples=2"])
        run_job(cfg, planted.root, stages=("featurize", "cluster", "report"), executor=SerialExecutor(),
                progress=False)
        return planted.root

    return make


@pytest.fixture(scope="session")
def demo_small_run(tmp_path_factory) -> tuple[Path, str]:
    """One undisturbed ``attnclust run`` of :data:`runs.DEMO_SMALL` (the demo job, packaged MiniLM, 24 questions) per
    session, ``(run_dir, stdout)``: the run test_demo checks, the reference test_soak compares its killed run with,
    and the report the browser tests open."""
    from runs import demo_small

    out = tmp_path_factory.mktemp("demo_small") / "run"
    proc = demo_small(out)
    try:
        stdout, stderr = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    return out, stdout


@pytest.fixture(scope="session")
def tiny_reference(tmp_path_factory, tiny_bert_dir) -> Path:
    """One uninterrupted ``attnclust run`` of the tiny random BERT on 20 questions of the bundled sample
    (:func:`runs.reference_args`) per session: the run test_pipeline and test_storage_faults check, copy, damage
    and compare with."""
    from runs import cli, reference_args

    out = tmp_path_factory.mktemp("tiny_reference") / "out"
    r = cli(*reference_args(tiny_bert_dir, out))
    assert r.returncode == 0, r.stderr[-3000:]
    return out


TUTORIAL = Path(__file__).resolve().parents[1] / "docs" / "tutorial" / "atlas.ipynb"

_EXECUTE = """
import sys, nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, timeout=900, kernel_name="python3", record_timing=False,
               resources={"metadata": {"path": sys.argv[2]}}).execute()
nbformat.write(nb, sys.argv[3])
"""


@pytest.fixture(scope="session")
def executed_tutorial(tmp_path_factory) -> tuple[Path, Path]:
    """The tutorial notebook executed once per session by nbclient (as myst-nb executes it), in a fresh folder where
    its runs land, in a subprocess; a failing cell fails it: ``(executed notebook, folder)``. The browser tests read
    its outputs and runs; the Sphinx build of tests/docs renders its outputs from a jupyter-cache instead of
    executing it a second time (no timing in the cells' metadata: jupyter-cache matches a notebook by its code cells
    with their metadata)."""
    pytest.importorskip("nbclient", reason="nbclient is not installed (the docs extra: pip install -e '.[docs]')")
    work = tmp_path_factory.mktemp("tutorial")
    executed = work / "executed.ipynb"
    r = subprocess.run([sys.executable, "-c", _EXECUTE, str(TUTORIAL), str(work), str(executed)],
                       capture_output=True, text=True, cwd=work, timeout=1200, check=False)
    assert r.returncode == 0, f"the tutorial notebook failed:\n{r.stderr[-6000:]}"
    return executed, work


@pytest.fixture
def small_squad(tmp_path) -> Path:
    """A small valid SQuAD v2 file (nested format): 3 paragraphs, 8 questions, some unanswerable."""
    paragraphs = [
        ("The river town of Elsby grew around a stone bridge built in 1412. Its market, held every Thursday, "
         "drew traders from three valleys. Wool and cheese were the main goods.",
         [("When was the stone bridge built?", "1412"), ("What day was the market held?", "Thursday"),
          ("Who designed the bridge?", None)]),
        ("Copper conducts electricity well and resists corrosion, so it is used for wiring. Pure copper is soft; "
         "alloyed with tin it becomes bronze, which is much harder.",
         [("What is copper alloyed with to make bronze?", "tin"), ("What colour is copper oxide?", None),
          ("What is the melting point of copper?", None)]),
        ("A sourdough starter is a mixture of flour and water colonised by wild yeast and bacteria. Bakers feed "
         "it daily. Bread made with it rises slowly and tastes slightly sour.",
         [("How often do bakers feed a starter?", "daily"), ("Who invented sourdough?", None)]),
    ]
    data = []
    for i, (context, qas) in enumerate(paragraphs):
        items = []
        for j, (question, answer) in enumerate(qas):
            answers = [] if answer is None else [{"text": answer, "answer_start": context.index(answer)}]
            items.append({"id": f"q{i}{j}", "question": question, "answers": answers,
                          "is_impossible": answer is None})
        data.append({"title": f"t{i}", "paragraphs": [{"context": context, "qas": items}]})
    path = tmp_path / "small.json"
    path.write_text(json.dumps({"version": "v2.0", "data": data}))
    return path


# --- pytest -n 2 --dist loadgroup (the README's test command): which tests run together --------------------------

SHARED_GROUPS = {"shared-runs": ("demo_small_run", "demo_run", "executed_tutorial"),
                 "tiny-reference": ("tiny_reference",)}
"""The session runs (and the fixture that hands one on) that several modules read, by group: every module that names
one of a group's runs in one worker process, so each run is made once and no other process reads it while a test
plants a file in it."""
FIRST_FOLDERS = ("integration", "browser")
"""Folders whose modules run first, so that the two workers end on short unit tests."""
_NAMES = {group: re.compile(r"\b(" + "|".join(names) + r")\b") for group, names in SHARED_GROUPS.items()}


@functools.cache
def module_group(module: str) -> str:
    """The group of a test module (its path from the project root): the first of :data:`SHARED_GROUPS` one of whose
    runs its code names, else the module itself (so module fixtures are made once)."""
    path = ROOT / module  # a node id's file, relative to the project root (any other node: its own group)
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    return next((group for group, names in _NAMES.items() if names.search(text)), module)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` by :func:`module_group`, the work handed out in collection order.

    pytest-xdist's own loadgroup reads ``xdist_group`` marks through a node-id suffix that pytest 9.2 no longer
    keeps (pytest-dev/pytest-xdist#1386: the tests are then spread one by one); the scheduler below groups by the
    module's path instead, which the controller process knows without collecting."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return module_group(nodeid.split("::")[0])

    config.option.loadscopereorder = False  # keep FIRST_FOLDERS first (xdist would sort the groups by test count)
    return ModuleGroups(config, log)


def pytest_collection_modifyitems(config, items):
    """Everything under tests/integration is marked ``slow`` (elsewhere a test that takes seconds is marked by
    hand: ``-m "not slow and not docs"`` is the fast tier the README names); GPU tests run only where a CUDA device
    with cupy/cuml is usable. Modules of :data:`FIRST_FOLDERS` (the long ones) run first; the order within a module
    is kept. A test that reaches a shared run through a fixture its module does not name is refused (its module
    would run in another worker and make the run again)."""
    from attnclust.backend import gpu_status

    for item in items:
        if "integration" in Path(str(item.fspath)).parts:
            item.add_marker(pytest.mark.slow)
        module = item.nodeid.split("::")[0]
        used = set(getattr(item, "fixturenames", ()))
        for group, names in SHARED_GROUPS.items():
            if used & set(names) and module_group(module) != group:
                raise pytest.UsageError(f"{item.nodeid} reads a shared session run through a fixture {module} does "
                                        f"not name; name one of {names} in it or add its fixture to SHARED_GROUPS")
    items.sort(key=lambda item: not any(f in Path(str(item.fspath)).parts for f in FIRST_FOLDERS))

    usable, why = gpu_status()
    if usable:
        return
    skip = pytest.mark.skip(reason=f"no usable GPU: {why}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# --- a planted store with gold parses (the syntax analysis and its report) ----------------------------------

def _sentences(context: list[str], rng) -> list[list[tuple[str, int, str]]]:
    """Random projective parses of a planted context's sentences (split after each '.'): words left of the root
    hang on the next word (``next``) or the root (``far``), words right of it on the previous word (``prev``) or
    the root (``far``), punctuation on the root."""
    sents, cur = [], []
    for tok in context:
        cur.append(tok)
        if tok == ".":
            sents.append(cur)
            cur = []
    if cur:
        sents.append(cur)
    parsed = []
    for words in sents:
        content = [i for i, w in enumerate(words) if w not in (".", ",")] or [0]
        root = int(rng.choice(content))
        rows = []
        for i, w in enumerate(words):
            if i == root:
                rows.append((w, 0, "root"))
            elif w in (".", ","):
                rows.append((w, root + 1, "punct"))
            elif rng.random() < 0.3:
                rows.append((w, root + 1, "far"))
            elif i < root:
                rows.append((w, i + 2, "next"))
            else:
                rows.append((w, i, "prev"))
        parsed.append(rows)
    return parsed


@pytest.fixture
def planted_syntax(tmp_path):
    """A planted store whose contexts have gold parses: head (0, 0) previous-token, head (1, 1) gold-head."""
    import numpy as np
    import pandas as pd

    from attnclust.analysis.parses import align_feature, context_key, load_parses
    from attnclust.layout import RunLayout
    from attnclust.store import atomic_write_parquet, open_attention_store
    from attnclust.synthetic import write_planted_store

    rng = np.random.default_rng(0)
    root = tmp_path / "run"
    planted = write_planted_store(root, rng=rng, n_features=6, n_layers=2, n_heads=2, lengths=(20, 48), noise=0.0,
                                  kinds=("previous", "broad", "cls", "self"), shuffle_heads=False)
    layout = RunLayout(root)
    layout.claim(adopt=layout.contract())
    features = pd.read_parquet(layout.features)
    contexts, offsets, conllu = [], [], []
    store = open_attention_store(layout.attention, mode="r+")
    for seq in planted.tokens:
        toks = list(seq.tokens)
        ctx_pos = [i for i, s in enumerate(seq.segment_ids) if s == 1][:-1]  # context tokens (not the last [SEP])
        text, off, glued = "", [[-1, -1] for _ in toks], set()
        for k, i in enumerate(ctx_pos):  # glue some word pairs into one word of two pieces
            prev_word = k > 0 and toks[ctx_pos[k - 1]] not in (".", ",") and ctx_pos[k - 1] - 1 not in glued
            if k > 0 and prev_word and toks[i] not in (".", ",") and rng.random() < 0.25:
                glued.add(i - 1)
            elif k > 0:
                text += " "
            off[i] = [len(text), len(text) + len(toks[i])]
            text += toks[i]
        words = []  # the CoNLL-U words: glued pairs are one word
        for i in ctx_pos:
            if i - 1 in glued:
                words[-1] = words[-1] + toks[i]
            else:
                words.append(toks[i])
        for sent in _sentences(words, rng):
            conllu += [f"{w}\t{i}\t_\t_\t_\t_\t{h}\t{r}\t_\t_".replace(f"{w}\t{i}", f"{i}\t{w}", 1)
                       for i, (w, h, r) in enumerate(sent, start=1)] + [""]
        contexts.append(text)
        offsets.append(off)
    conllu_path = tmp_path / "gold.conllu"
    conllu_path.write_text("# planted gold parses\n" + "\n".join(conllu) + "\n")
    features["offsets"] = offsets
    atomic_write_parquet(features, layout.features)
    layout.record(layout.examples)
    atomic_write_parquet(pd.DataFrame({"id": features["example_id"], "context": contexts}), layout.examples)

    parses = load_parses(layout, conllu=conllu_path)
    for f, seq in enumerate(planted.tokens):  # head (1, 1): every parsed token attends to its gold head's first piece
        n = len(seq)
        fp = align_feature(list(seq.tokens), offsets[f], parses[parses["context_key"] == context_key(contexts[f])])
        first = np.r_[0, np.flatnonzero(np.diff(fp.word_ids)) + 1]
        gold = np.eye(n, dtype=np.float32)
        for d, h in zip(fp.dependent, fp.head):
            for t in np.flatnonzero(fp.word_ids == d):
                gold[t] = 0
                gold[t, first[h]] = 1
        store.attention[f, 1, 1, :n, :n] = gold.astype(np.float16)
    return layout, parses, features, conllu_path

