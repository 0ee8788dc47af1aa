"""The SQuAD2-dev rehearsal (``python -m bench --only squad_dev``): the default job, as a user runs it, over
generated SQuAD-v2 data with dev's size and length distribution (:mod:`bench.common.squadgen`, 11,873 questions).

Each arm is the real command line in a child process, ``python -m attnclust.cli run --out DIR --set data.path=FILE``
(``jobs/demo.yaml`` otherwise: every stage and the default analyses on; the bundled gold parses fit only the
bundled sample, so the syntax analysis skips itself with one line), so the embedded Dask cluster's start-up and
everything else a user pays is in the figure. While it runs, a thread samples the resident memory of the whole
process tree (the CLI driver, the nanny and its workers) every :data:`SAMPLE_S` seconds. Afterwards:

- per stage: seconds (its ``_state/{stage}.json`` record), the peak of the tree's RSS between the stage's start
  (the mtime of ``_state/{stage}.started``) and its end (the mtime of its record), and the bytes of the outputs it
  recorded (apparent file sizes);
- the whole run: wall seconds from the child's start to its exit, peak tree RSS, the run directory's disk use
  (allocated blocks), the store mode the run used (the store's ``store`` attribute, ``full`` or ``compact``);
- ``report.html``: its size, and the time Chromium (Playwright, ``/usr/bin/chromium``, browser started beforehand)
  takes from navigation to a working page: ``load`` fired and a click on a grid cell has opened the head panel
  (median of :data:`TTI_REPS` fresh pages);
- ``attnclust explore`` on the run (a child process on 127.0.0.1, port 0): p95 latency of :data:`N_REQUESTS`
  requests each of ``/api/map`` (a seeded random feature, layer and head) and ``/api/search`` (a word of the
  generated questions), each on a new connection, after one untimed request of each (the first loads the tables).

The arms run at three question counts (defaults about 1k and 4k features, then dev's 11,873), smallest first, then
a dense arm at the largest count (:data:`bench.common.squadgen.DENSE`: features of median ~220 tokens against ~150,
about 1.8x the attention volume, like real technical prose). Beside the largest arm and the dense one, the bare
forward over the same features on as many one-thread processes as the run's workers (:func:`bare_forward_workers`)
judges the whole run against this machine's physical limit: ``squad_dev_e2e_vs_forward`` (and ``_dense_``);
``squad_dev_growth_<stage>`` is a stage's seconds per feature at the larger arms over the smallest arm's (the
largest of those ratios). Goals with absolute values (minutes, GB, ms) apply at dev's size only: at another size
the figures are recorded as ``report`` (``settings.goal_at_dev_size`` keeps the goal).

BERT-base: a randomly initialised ``BertConfig(hidden 768, 12 layers, 12 heads, intermediate 3072)`` saved as a
local model directory with MiniLM's tokenizer files (both use BERT's uncased 30,522-token WordPiece vocabulary:
checked here on the size, the special tokens' ids and lower-casing), run on about 200 of the same generated
features, paired with MiniLM on the same features. Dev on BERT-base is projected per stage as the largest MiniLM
arm's seconds times dev's features over that arm's, times BERT-base's seconds over MiniLM's on the pair (fixed
costs such as choosing k then count once, not per feature); bytes as BERT-base's bytes per feature times dev's
features, for the store mode the default job chose and (a second, extract-only run) the other mode. Random
weights attend almost uniformly, the worst case for a compact store: the byte projections are upper bounds for a
trained BERT-base whose heads are sparser.
"""

from __future__ import annotations

import json
import math
import os
import select
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

from ..common.memory import TreeRSS

__all__ = ["DEV_QUESTIONS", "bare_forward_workers", "bench_squad_dev", "growth_ratio", "p95", "write_bert_base"]

DEV_QUESTIONS = 11_873
SAMPLE_S = 0.5
TTI_REPS = 3
N_REQUESTS = 100
CHROMIUM = "/usr/bin/chromium"
GOALS = {"e2e_min": ("<=", 8.0), "dense_e2e_min": ("<=", 15.0), "e2e_vs_forward": ("<=", 1.5),
         "disk_gb": ("<=", 5.0), "peak_rss_gb": ("<=", 6.0), "report_mb": ("<=", 10.0),
         "report_interactive_s": ("<=", 3.0), "explore_map_p95_ms": ("<=", 200.0),
         "explore_search_p95_ms": ("<=", 200.0), "growth": ("<=", 1.2), "bertbase_store_gb": ("<=", 5.0)}
MODEL_STAGES = ("extract", "qa")  # the stages whose cost is the model's forward (the others work on the maps)
BERT_BASE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072}
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
# bert-base-uncased's special tokens and their ids in its vocab.txt
BERT_UNCASED_SPECIAL = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}


def p95(values) -> float:
    """The 95th percentile by nearest rank: the smallest value with at least 95% of the values at or below it."""
    ordered = sorted(float(v) for v in values)
    if not ordered:
        raise ValueError("p95 of no values")
    return ordered[math.ceil(0.95 * len(ordered)) - 1]


def growth_ratio(seconds: list[float], features: list[int]) -> tuple[float, list[float]]:
    """Seconds per feature of each arm over the first (smallest) arm's; returns (largest ratio, every ratio).

    A stage whose cost is linear in the features gives 1; a fixed cost gives ratios below 1; anything growing
    faster than the features, above 1.
    """
    if len(seconds) != len(features) or len(seconds) < 2:
        raise ValueError("growth_ratio needs at least two arms, one seconds value per features count")
    base = seconds[0] / features[0]
    ratios = [(s / f) / base for s, f in zip(seconds[1:], features[1:])]
    return max(ratios), ratios


# ------------------------------------------------------------------------------------------------ the CLI child
def _env(ctx) -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": str(ctx.root) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _tree_bytes(path: Path, *, allocated: bool = False) -> int:
    """Apparent size (or allocated blocks) of a file or of every file under a directory."""
    if not path.exists():
        return 0
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file() and not p.is_symlink()]
    total = 0
    for f in files:
        st = f.stat()
        total += st.st_blocks * 512 if allocated else st.st_size
    return total


def run_cli(ctx, out: Path, data: Path, sets: list[str], *, command: str = "run") -> dict:
    """``python -m attnclust.cli COMMAND --out OUT --quiet --set data.path=DATA --set ...`` in a child, its tree's
    RSS sampled; returns wall seconds, peak RSS and the per-stage records (seconds, peak RSS, bytes written), the
    store mode the run used and the job's ``extract.store`` setting that chose it."""
    sets = [f"data.path={data}", *([f"backend={ctx.backend}"] if ctx.backend == "gpu" else []), *sets]
    cmd = [sys.executable, "-m", "attnclust.cli", command, "--out", str(out), "--quiet"]
    for s in sets:
        cmd += ["--set", s]
    log = out.parent / f"{out.name}.log"
    with open(log, "w") as fh:
        t0 = time.time()
        proc = subprocess.Popen(cmd, cwd=ctx.root, env=_env(ctx), stdout=fh, stderr=subprocess.STDOUT)
        sampler = TreeRSS(proc.pid, SAMPLE_S).start()
        rc = proc.wait()
        wall = time.time() - t0
        sampler.stop()
    if rc != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {rc}:\n{log.read_text()[-3000:]}")
    state = out / "_state"
    stages = {}
    for record_path in sorted(state.glob("*.json"), key=lambda p: p.stat().st_mtime):
        rec = json.loads(record_path.read_text())
        name = record_path.stem
        started = state / f"{name}.started"
        t_start = started.stat().st_mtime if started.exists() else None
        t_end = record_path.stat().st_mtime
        stages[name] = {
            "seconds": rec.get("seconds"),
            "peak_rss": sampler.peak(t_start, t_end) if t_start is not None else None,
            "bytes": sum(_tree_bytes(out / rel) for rel in rec.get("outputs", [])),
            "outputs": rec.get("outputs", []),
            **{k: rec[k] for k in ("skipped", "skipped_reason") if k in rec}}
    extract = json.loads((state / "extract.json").read_text()) if (state / "extract.json").exists() else {}
    job = json.loads((out / "job.json").read_text()) if (out / "job.json").exists() else {}
    return {"command": cmd, "wall_s": wall, "peak_rss": sampler.peak(), "rss_samples": len(sampler.samples),
            "peak_pss": max((m for _, m in sampler.pss_samples), default=None),
            "stages": stages, "features": extract.get("features"), "examples": extract.get("examples"),
            "maps": extract.get("maps"),
            "disk_bytes": _tree_bytes(out, allocated=True), "store": store_mode(out),
            "store_setting": job.get("config", {}).get("extract", {}).get("store"),
            "compact_max_keys": compact_max_keys(out), "store_bytes": _tree_bytes(out / "attention.zarr")}


def compact_max_keys(run: Path) -> int | None:
    """The key cap a compact store kept per row (``None``: a full store, or no cap)."""
    from attnclust.store import open_attention_store

    if not (run / "attention.zarr").exists():
        return None
    store = open_attention_store(run / "attention.zarr")
    return (store.attrs.get("compact") or {}).get("max_keys") if store.mode == "compact" else None


def dev_compact_plan(run: Path, layers: int, heads: int):
    """The compact store ``extract.store: auto`` fits to the default budget for a model of ``layers`` x ``heads``
    over the features of ``run`` (the dev arm's), as the extract stage's pre-flight would: its key cap
    (``max_keys``) and exact sample (``sample``) (:class:`attnclust.store.plan.StorePlan`)."""
    import pandas as pd

    from attnclust.config import JobConfig
    from attnclust.stages.extract import store_plan

    seq = pd.read_parquet(run / "features.parquet", columns=["seq_len"])["seq_len"].to_numpy()
    return store_plan(JobConfig.from_dict({"extract": {"store": "compact"}}), seq,
                      {"num_layers": layers, "num_heads": heads})


def store_mode(run: Path) -> str | None:
    """The store mode the run used: the store's own ``store`` attribute (``full`` unless it says ``compact``),
    with the dtype of a full store (``full/float16``, ``full/uint8``); ``None`` without a store."""
    from attnclust.store import open_attention_store

    if not (run / "attention.zarr").exists():
        return None
    store = open_attention_store(run / "attention.zarr")
    if store.mode != "full":
        return store.mode
    quant = store.attrs.get("quantization") or {}
    return f"full/{quant.get('dtype', store.attention.dtype)}"


# --------------------------------------------------------------------------------------- report and explorer
def report_interactive_s(report: Path, reps: int = TTI_REPS) -> dict:
    """Seconds from navigation to ``load`` and to the head panel open after a click on a grid cell (median of
    ``reps`` fresh pages in one Chromium started beforehand)."""
    from playwright.sync_api import sync_playwright

    cell = "#grid [data-layer][data-head]"
    load, ready = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            for _ in range(reps):
                page = browser.new_page()
                t0 = time.perf_counter()
                page.goto(report.as_uri(), wait_until="load", timeout=120_000)
                load.append(time.perf_counter() - t0)
                page.locator(cell).first.click(timeout=120_000)
                page.locator("#head-panel").wait_for(state="visible", timeout=120_000)
                ready.append(time.perf_counter() - t0)
                page.close()
        finally:
            browser.close()
    return {"interactive_s": float(np.median(ready)), "load_s": float(np.median(load)),
            "interactive_reps": [round(x, 3) for x in ready], "load_reps": [round(x, 3) for x in load]}


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1: never through a proxy


def _get(url: str) -> float:
    t0 = time.perf_counter()
    with _DIRECT.open(url, timeout=60) as resp:
        resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}")
    return time.perf_counter() - t0


def explore_latency(ctx, run: Path, n_features: int, layers: int, heads: int, n: int = N_REQUESTS) -> dict:
    """p95 milliseconds of ``/api/map`` and ``/api/search`` against ``attnclust explore RUN --port 0``."""
    from ..common.squadgen import WORDS

    cmd = [sys.executable, "-m", "attnclust.cli", "explore", str(run), "--port", "0"]
    proc = subprocess.Popen(cmd, cwd=ctx.root, env=_env(ctx), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        line, deadline = "", time.time() + 120
        while "serving" not in line:
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.time()))
            line = proc.stdout.readline() if ready else ""
            if not ready or (not line and proc.poll() is not None):
                raise RuntimeError(f"attnclust explore did not start: {line or 'no output'}")
        base = line.split(" at ", 1)[1].split()[0].rstrip("/")
        rng = np.random.default_rng(0)
        maps = [f"{base}/api/map?feature={rng.integers(n_features)}&layer={rng.integers(layers)}"
                f"&head={rng.integers(heads)}" for _ in range(n)]
        words = [WORDS[i] for i in rng.integers(len(WORDS), size=n)]
        searches = [f"{base}/api/search?q={w}" for w in words]
        cold = {"map_ms": 1e3 * _get(maps[0]), "search_ms": 1e3 * _get(searches[0])}
        map_ms = [1e3 * _get(u) for u in maps]
        search_ms = [1e3 * _get(u) for u in searches]
        import psutil

        rss = psutil.Process(proc.pid).memory_info().rss
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {"map_p95_ms": p95(map_ms), "search_p95_ms": p95(search_ms),
            "map_median_ms": float(np.median(map_ms)), "search_median_ms": float(np.median(search_ms)),
            "first_request_ms": {k: round(v, 1) for k, v in cold.items()}, "requests_each": n,
            "explore_rss_bytes": rss}


# ------------------------------------------------------------------------------------------------- BERT-base
def write_bert_base(folder: Path) -> dict:
    """A randomly initialised BERT-base-shaped encoder (seed 0) with MiniLM's tokenizer files in ``folder``;
    returns what was checked about the vocabulary."""
    import torch
    from transformers import BertConfig, BertModel

    from attnclust.config import ModelConfig
    from attnclust.models.sources import PACKAGED, resolve_model_path

    minilm = Path(resolve_model_path(ModelConfig(name="minilm")))
    vocab = (minilm / "vocab.txt").read_text(encoding="utf-8").splitlines()
    ids = {tok: vocab.index(tok) for tok in BERT_UNCASED_SPECIAL}
    lower = json.loads((minilm / "tokenizer_config.json").read_text()).get("do_lower_case")
    if len(vocab) != 30522 or ids != BERT_UNCASED_SPECIAL or lower is not True:
        raise RuntimeError(f"{PACKAGED['minilm']}'s vocabulary is not BERT's uncased one ({len(vocab)} tokens, "
                           f"special ids {ids}, do_lower_case {lower}); the BERT-base arm needs it")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), max_position_embeddings=512, type_vocab_size=2, **BERT_BASE)
    folder.mkdir(parents=True, exist_ok=True)
    BertModel(config).save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copy(minilm / name, folder / name)
    return {"vocab_size": len(vocab), "special_ids": ids, "do_lower_case": lower,
            "tokenizer_from": "the packaged MiniLM (BERT's uncased WordPiece vocabulary)", **BERT_BASE}


def _forward_share(root: str, model: str, batches: list[tuple[int, int]], threads: int) -> float:
    """In a child process: seconds of the bare forward (:func:`bench.figures.extraction.bare_forward`: maps
    returned, nothing kept) over ``batches`` (``(start, stop)`` feature ranges of ``root``'s features.parquet),
    the model loaded and the inputs made first, not timed."""
    import pandas as pd
    import torch

    from attnclust.config import ModelConfig
    from attnclust.models.runner import get_model

    from .extraction import bare_forward, make_batches

    torch.set_num_threads(threads)
    loaded = get_model(ModelConfig(name=model), threads=threads)
    feats = pd.read_parquet(Path(root) / "features.parquet").sort_values("feature_id").reset_index(drop=True)
    inputs = [make_batches(feats.iloc[b0:b1], b1 - b0)[0] for b0, b1 in batches]
    bare_forward(loaded.model, inputs[:1])  # warm-up, as a worker's first block
    return bare_forward(loaded.model, inputs)


def bare_forward_workers(run: Path, *, workers: int, batch_size: int = 8, model: str = "minilm") -> dict:
    """The physical limit of a run on this machine: the bare forward of an encoder (attention maps returned,
    nothing converted or stored) over the run's own features, in the extract stage's length-grouped batches
    (:func:`attnclust.stages.extract.batch_ranges`), on ``workers`` processes of one thread each as the embedded
    cluster's workers, the batches dealt round-robin. ``wall_s``: the slowest process's forward seconds."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    import pandas as pd

    from attnclust.stages.extract import CPU_BATCH_SIDE, batch_ranges

    seq_len = pd.read_parquet(run / "features.parquet", columns=["feature_id", "seq_len"]).sort_values(
        "feature_id")["seq_len"].to_numpy()
    batches = batch_ranges(seq_len, batch_size, pairs=batch_size * CPU_BATCH_SIDE ** 2)
    shares = [batches[i::workers] for i in range(workers)]
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        seconds = list(pool.map(_forward_share, [str(run)] * workers, [model] * workers, shares, [1] * workers))
    return {"wall_s": max(seconds), "worker_s": seconds, "features": len(seq_len), "batches": len(batches),
            "workers": workers, "tokens": int(seq_len.sum()), "attention_volume": float((seq_len ** 2.0).sum())}


# ------------------------------------------------------------------------------------------------------ figure
def _arm(ctx, questions: int, *, dense: bool = False) -> dict:
    from ..common.squadgen import write_squad

    tag = f"{questions}_dense" if dense else str(questions)
    data = write_squad(ctx.tmp / "squad_dev" / f"gen_{tag}.json", questions, seed=0, dense=dense)
    out = ctx.tmp / "squad_dev" / f"run_{tag}"
    res = run_cli(ctx, out, data, [])
    layers, heads = _geometry(out)
    res.update(questions=questions, data=str(data), run=str(out), layers=layers, heads=heads, dense=dense,
               report_bytes=(out / "report.html").stat().st_size)
    res["report"] = report_interactive_s(out / "report.html")
    res["explore"] = explore_latency(ctx, out, res["features"], layers, heads)
    _print_arm(f"MiniLM, {questions} questions{' (dense)' if dense else ''}", res)
    return res


def _forward_arm(arm: dict) -> dict:
    """:func:`bare_forward_workers` over an arm's features with as many workers as its run had (one per core)."""
    forward = bare_forward_workers(Path(arm["run"]), workers=max(1, len(os.sched_getaffinity(0))))
    print(f"#   bare forward over its {forward['features']} features on {forward['workers']} processes: "
          f"{forward['wall_s']:.1f} s (end to end {arm['wall_s'] / forward['wall_s']:.2f}x that)", flush=True)
    return forward


def _geometry(run: Path) -> tuple[int, int]:
    from attnclust.store import open_attention_store

    store = open_attention_store(run / "attention.zarr")
    return store.n_layers, int(store.attention.shape[2])


def _print_arm(label: str, res: dict) -> None:
    gb = 1e9
    pss = "-" if res["peak_pss"] is None else f"{res['peak_pss'] / gb:.2f}"
    print(f"# squad_dev {label}: {res['features']} features, {res['wall_s']:.1f} s wall, peak RSS "
          f"{res['peak_rss'] / gb:.2f} GB (tree; PSS {pss} GB), disk {res['disk_bytes'] / gb:.3f} GB, "
          f"store {res['store']} (extract.store: {res['store_setting']})", flush=True)
    for name, st in res["stages"].items():
        rss = "-" if st["peak_rss"] is None else f"{st['peak_rss'] / gb:.2f} GB"
        print(f"#   {name:<10} {st['seconds'] or 0:8.1f} s  peak RSS {rss:>8}  wrote {st['bytes'] / 1e6:9.1f} MB"
              f"{' (skipped: ' + st['skipped_reason'] + ')' if st.get('skipped_reason') else ''}", flush=True)
    if "report" in res:
        ex = res["explore"]
        print(f"#   report.html {res['report_bytes'] / 1e6:.2f} MB, interactive in Chromium "
              f"{res['report']['interactive_s']:.2f} s (load {res['report']['load_s']:.2f} s); explore p95 "
              f"/api/map {ex['map_p95_ms']:.1f} ms, /api/search {ex['search_p95_ms']:.1f} ms", flush=True)


def _ran(stage: dict) -> bool:
    """A stage that did its work (not skipped by its settings, not found complete)."""
    return bool(stage.get("seconds")) and not stage.get("skipped_reason") and not stage.get("skipped")


def _slim(res: dict) -> dict:
    return {k: v for k, v in res.items() if k not in ("command",)}


def _bert_pair(ctx, features_per_question: float, n_features: int, max_keys: int | None) -> dict:
    """BERT-base and MiniLM on the same ~``n_features`` generated features (every stage), then BERT-base's store
    in the other mode (extract only; a compact one with the key cap ``max_keys`` that auto fits at dev's size)."""
    from ..common.squadgen import write_squad

    questions = max(1, round(n_features / features_per_question))
    data = write_squad(ctx.tmp / "squad_dev" / f"gen_bert_{questions}.json", questions, seed=0)
    folder = ctx.tmp / "squad_dev" / "bert_base_random"
    checked = write_bert_base(folder)
    runs = {}
    for label, sets in (("minilm", []), ("bert_base", [f"model.name={folder}"])):
        out = ctx.tmp / "squad_dev" / f"pair_{label}"
        runs[label] = run_cli(ctx, out, data, sets)
        _print_arm(f"{label} pair, {questions} questions", runs[label])
    used = runs["bert_base"]["store"] or "full"
    other = "full" if used.startswith("compact") else "compact"
    out = ctx.tmp / "squad_dev" / f"pair_bert_base_{other}"
    # a compact run without its exact sample: at ~200 features the default sample would hold every feature
    # (the sample's bytes are a fixed cost, added once in the projection)
    sets = [f"model.name={folder}", f"extract.store={other}"] + (
        ["extract.exact_sample=0", f"extract.compact_max_keys={'null' if max_keys is None else max_keys}"]
        if other == "compact" else [])
    runs["bert_base_other_store"] = run_cli(ctx, out, data, sets, command="extract")
    return {"questions": questions, "model": checked, "runs": runs}


def bench_squad_dev(ctx, questions: list[int], bert_features: int, default_questions: list[int]) -> None:
    """The MiniLM arms at ``questions`` (run smallest first; the largest is the dev arm), then the BERT-base pair
    over about ``bert_features`` features. Growth goals are judged only at ``default_questions`` (1k, 4k, dev)."""
    questions = sorted(set(questions))
    at_dev = questions[-1] == DEV_QUESTIONS
    at_default_arms = questions == sorted(set(default_questions))
    arms = [_arm(ctx, q) for q in questions]
    dev = arms[-1]
    dense = _arm(ctx, questions[-1], dense=True)  # text whose features are longer (bench/common/squadgen.py)
    forwards = {"dev": _forward_arm(dev), "dense": _forward_arm(dense)}

    def fig(name: str, value: float, key: str, settings: dict, *, judged: bool) -> None:
        op, goal = GOALS[key]
        extra = {"goal_at_dev_size": f"{op}{goal:g}", "questions": questions,
                 "judged": judged, **({} if judged else {"why_not_judged": "not dev's size / default arms"})}
        ctx.figure(f"squad_dev_{name}", value, op if judged else None, goal if judged else None,
                   {**extra, **settings})

    common = {"store_mode": dev["store"], "store_setting": dev["store_setting"], "features": dev["features"],
              "examples": dev["examples"],
              "job": "jobs/demo.yaml (the default job), data.path = generated SQuAD v2 (bench/common/squadgen.py)"}
    fig("e2e_min", dev["wall_s"] / 60, "e2e_min", {**common, "stages": dev["stages"], "wall_s": dev["wall_s"],
        "note": "the CLI child from start to exit: imports, Dask start-up, every stage"}, judged=at_dev)
    fig("disk_gb", dev["disk_bytes"] / 1e9, "disk_gb", {**common, "store_bytes": dev["store_bytes"],
        "note": "allocated blocks of the run directory at the end"}, judged=at_dev)
    fig("peak_rss_gb", dev["peak_rss"] / 1e9, "peak_rss_gb", {**common, "sample_s": SAMPLE_S,
        "peak_pss_gb": None if dev["peak_pss"] is None else dev["peak_pss"] / 1e9,
        "note": "summed RSS of the CLI process and its descendants (Dask nanny, workers); shared pages count "
                "once per process (peak_pss_gb: summed PSS, sampled every 5th time, counts them once)"},
        judged=at_dev)
    fig("e2e_vs_forward", dev["wall_s"] / forwards["dev"]["wall_s"], "e2e_vs_forward",
        {**common, "forward": forwards["dev"], "note": "end to end over the bare forward of the same features on "
         "the same number of one-thread processes (bare_forward_workers): the physical limit here"}, judged=at_dev)
    dense_common = {**common, "store_mode": dense["store"], "features": dense["features"],
                    "examples": dense["examples"], "data": "bench/common/squadgen.py DENSE lengths",
                    "forward": forwards["dense"]}
    fig("dense_e2e_min", dense["wall_s"] / 60, "dense_e2e_min", {**dense_common, "stages": dense["stages"]},
        judged=at_dev)
    fig("dense_e2e_vs_forward", dense["wall_s"] / forwards["dense"]["wall_s"], "e2e_vs_forward", dense_common,
        judged=at_dev)
    fig("dense_peak_rss_gb", dense["peak_rss"] / 1e9, "peak_rss_gb", {
        **dense_common, "peak_pss_gb": None if dense["peak_pss"] is None else dense["peak_pss"] / 1e9,
        "stage_peak_rss_gb": {k: None if v["peak_rss"] is None else v["peak_rss"] / 1e9
                              for k, v in dense["stages"].items()}}, judged=at_dev)
    fig("dense_disk_gb", dense["disk_bytes"] / 1e9, "disk_gb", dense_common, judged=at_dev)
    fig("report_mb", dev["report_bytes"] / 1e6, "report_mb", common, judged=at_dev)
    fig("report_interactive_s", dev["report"]["interactive_s"], "report_interactive_s",
        {**common, **dev["report"], "note": "navigation -> load -> click on a grid cell -> head panel visible"},
        judged=at_dev)
    fig("explore_map_p95_ms", dev["explore"]["map_p95_ms"], "explore_map_p95_ms", {**common, **dev["explore"]},
        judged=at_dev)
    fig("explore_search_p95_ms", dev["explore"]["search_p95_ms"], "explore_search_p95_ms",
        {**common, **dev["explore"]}, judged=at_dev)
    feats = [a["features"] for a in arms]
    per_arm = {str(a["questions"]): _slim(a) for a in arms}
    if len(arms) >= 2:
        timed = [name for name, st in dev["stages"].items() if _ran(st) and all(
                 _ran(a["stages"].get(name, {})) for a in arms)]
        for name in [*timed, "e2e"]:
            secs = [a["wall_s"] if name == "e2e" else a["stages"][name]["seconds"] for a in arms]
            worst, ratios = growth_ratio(secs, feats)
            fig(f"growth_{name}", worst, "growth", {
                "features": feats, "seconds": secs, "seconds_per_feature": [s / f for s, f in zip(secs, feats)],
                "ratios_vs_smallest": ratios,
                "note": "seconds per feature at each larger arm over the smallest arm's; the largest ratio"},
                judged=at_dev and at_default_arms)
    fpq = dev["features"] / dev["examples"]
    dev_features = DEV_QUESTIONS * fpq
    bert_plan = dev_compact_plan(Path(dev["run"]), BERT_BASE["num_hidden_layers"], BERT_BASE["num_attention_heads"])
    bert_keys, bert_sample = bert_plan.max_keys, len(bert_plan.sample)
    pair = _bert_pair(ctx, fpq, bert_features, bert_keys)
    runs = pair["runs"]
    bert, mini = runs["bert_base"], runs["minilm"]
    scale = dev_features / dev["features"]
    maps_ratio = (bert["maps"] / bert["features"]) / (mini["maps"] / mini["features"])
    projected, stage_proj, pair_ratio = 0.0, {}, {}
    for name, st in dev["stages"].items():
        if not (_ran(st) and _ran(bert["stages"].get(name, {})) and _ran(mini["stages"].get(name, {}))):
            continue
        pair_ratio[name] = bert["stages"][name]["seconds"] / mini["stages"][name]["seconds"]
        # the forward (extract, qa) scales as measured on the pair; the later stages work on maps: at dev's size
        # their fixed costs are paid once, so they scale with the maps (x2), not with the 200-feature pair's ratio
        ratio = pair_ratio[name] if name in MODEL_STAGES else maps_ratio
        stage_proj[name] = st["seconds"] * scale * ratio
        projected += stage_proj[name]
    startup = dev["wall_s"] - sum(st.get("seconds") or 0 for st in dev["stages"].values())
    pair_settings = {"bert_features": bert["features"], "pair_questions": pair["questions"], "model": pair["model"],
                     "dev_features_estimated": round(dev_features), "features_per_question": round(fpq, 4),
                     "bert_store_mode": bert["store"], "other_store_mode": runs["bert_base_other_store"]["store"],
                     "bert_compact_max_keys_at_dev": bert_keys, "bert_exact_sample_at_dev": bert_sample,
                     "minilm_compact_max_keys_at_dev": dev["compact_max_keys"],
                     "pair": {k: _slim(v) for k, v in runs.items()},
                     "weights": "random init (seed 0): near-uniform attention, the worst case for a compact store"}
    ctx.figure("squad_dev_bertbase_projected_min", (projected + startup) / 60, None, None, {
        **pair_settings, "projected_stage_s": stage_proj, "startup_and_between_stages_s": startup,
        "bert_over_minilm_seconds_on_the_pair": pair_ratio, "maps_ratio": maps_ratio,
        "method": "MiniLM dev arm's stage seconds x (dev features / its features) x, for extract and qa, BERT-base "
                  "over MiniLM seconds on the same features; for the stages after them, BERT-base's maps over "
                  "MiniLM's (144 / 72); plus the dev arm's start-up"})
    per_feature = {(run["store"] or "full").split("/")[0]: run["store_bytes"] / run["features"]
                   for run in (bert, runs["bert_base_other_store"])}
    gb = {"full": per_feature["full"] * dev_features / 1e9,
          "compact": (per_feature["compact"] * dev_features + bert_sample * per_feature["full"]) / 1e9}
    chosen = dev["store"].split("/")[0]  # what extract.store auto chose at the dev arm's size (MiniLM's)
    fig("bertbase_store_gb", gb[chosen], "bertbase_store_gb", {
        **pair_settings, "store_bytes_per_feature": per_feature, "projected_store": chosen, "full_store_gb": gb["full"],
        "compact_store_gb": gb["compact"],
        "method": "bytes per feature of BERT-base's attention.zarr on the pair (full; compact without its exact "
                  "sample, with the key cap auto fits at dev's size) x dev's features (from the dev arm's features "
                  "per question); the compact projection adds the exact sample auto keeps at dev's size "
                  f"({bert_sample} features) at the full store's bytes per feature; judged in the mode extract.store "
                  "auto chose at the dev arm's size"}, judged=True)
    brief = {k: v for k, v in pair_settings.items() if k != "pair"}
    other_mode = "full" if chosen == "compact" else "compact"
    ctx.figure("squad_dev_bertbase_other_store_gb", gb[other_mode], None, None, {**brief, "store_mode": other_mode})
    run_bytes = bert["disk_bytes"] / bert["features"] * dev_features / 1e9
    print(f"# squad_dev BERT-base projection for dev ({round(dev_features)} features): "
          f"{(projected + startup) / 60:.1f} min; store {gb[chosen]:.2f} GB ({chosen}: what auto chose at dev's size), "
          f"{gb[other_mode]:.2f} GB ({other_mode}); run directory {run_bytes:.2f} GB", flush=True)
    ctx.state["squad_dev"] = {"arms": per_arm, "dense": _slim(dense), "forwards": forwards}
