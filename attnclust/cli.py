"""Command line: ``attnclust run|extract|featurize|cluster|report|finetune [JOB.yaml] ...``, ``attnclust evaluate``,
``attnclust compare A B --out C``, ``attnclust generate kv --out FILE [--calibrate]``,
``attnclust explore DIR [--port N] [--host H]``, ``attnclust export DIR --figure NAME [--format F] [--out FILE]``.

Thin by design: parse arguments, load the job, call the library, map errors to exit codes (2 for bad input).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .argtypes import integer, number, port  # integer, number: re-exported
from .config import load_job
from .data.kvgen import write_kv
from .errors import AttnclustError, ConfigError, os_error_line
from .qa import evaluate_files, finetune_model
from .qa.calibrate import write_calibrated
from .service.security import write_certificates

__all__ = ["main"]

STAGE_COMMANDS = ("run", "extract", "featurize", "cluster", "report")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnclust", description="Attention-head atlas: extract every "
                                     "attention map of a QA model over a dataset, cluster them, report.")
    from importlib import metadata

    parser.add_argument("--version", action="version", version=f"attnclust {metadata.version('attnclust')}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in STAGE_COMMANDS:
        p = sub.add_parser(name, help="the whole job" if name == "run" else f"the {name} stage alone")
        p.add_argument("job", nargs="?", help="job YAML (default: jobs/demo.yaml)")
        if name in ("run", "extract"):
            p.add_argument("--data", help="dataset file, overrides data.path")
        p.add_argument("--out", help="output directory (default: runs/<job name>)")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                       help="override a job setting, e.g. --set cluster.k=12 (repeatable); a list setting takes "
                       "YAML flow syntax or commas: --set 'probe.tasks=[answerable, qword]', --set probe.tasks=qword,"
                       "correct")
        p.add_argument("--scheduler", help="Dask scheduler address or scheduler JSON file (default: embedded)")
        p.add_argument("--workers", type=integer, help="workers of the embedded cluster (default: CPU cores)")
        p.add_argument("--runtime", choices=("local", "local-cuda"), default="local",
                       help="embedded cluster: LocalCluster (default) or dask-cuda LocalCUDACluster")
        p.add_argument("--force", action="store_true",
                       help="overwrite stages that were run with other settings" + (
                           "" if name == "run" else f"; re-run {name} even when nothing changed"))
        p.add_argument("--quiet", action="store_true", help="no progress bars")
    ft = sub.add_parser("finetune", help="fine-tune model.name for extractive QA on SQuAD-v2-format data")
    ft.add_argument("job", nargs="?", help="job YAML (default: jobs/demo.yaml), e.g. jobs/finetune-squad2.yaml")
    ft.add_argument("--data", help="training data, overrides data.path (default: the bundled sample)")
    ft.add_argument("--eval-data", help="data to score the model on afterwards, overrides finetune.eval_data")
    ft.add_argument("--out", help="model directory (default: models/<job name>); loads as model.name afterwards")
    ft.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override a job setting, e.g. --set finetune.max_steps=200 (repeatable); a list setting "
                    "takes YAML flow syntax or commas: --set 'probe.labels=[topic]'")
    ft.add_argument("--force", action="store_true", help="start over when --out holds another configuration")
    ft.add_argument("--quiet", action="store_true", help="no progress bars or loss lines")
    ev = sub.add_parser("evaluate", help="score predictions with the official SQuAD 2.0 metric (prints JSON)")
    ev.add_argument("--data", required=True, help="gold data: SQuAD-v2-format file the predictions were made on")
    ev.add_argument("--predictions", required=True, help="JSON object: question id -> answer ('' = no answer)")
    ev.add_argument("--null-odds", help="JSON object: question id -> no-answer probability or odds; adds best_*")
    ev.add_argument("--null-odds-threshold", type=number, default=1.0,
                    help="a question whose null odds exceed this counts as answered 'no answer' (default 1.0, "
                         "as the official script)")
    ev.add_argument("--allow-missing", action="store_true",
                    help="score only the questions that have a prediction (default: missing ones are an error)")
    cmp_ = sub.add_parser("compare", help="what changed between two runs over the same examples, head by head")
    cmp_.add_argument("a", help="run directory A (e.g. the pre-trained model's)")
    cmp_.add_argument("b", help="run directory B (e.g. the fine-tuned model's), same examples and tokenisation")
    cmp_.add_argument("--out", required=True, help="output directory: compare.parquet, compare_layers.parquet, "
                      "compare.html (new, empty, or written by attnclust before)")
    cmp_.add_argument("--max-features", type=integer, help="compare a seeded sample of this many features "
                      "(default: all)")
    cmp_.add_argument("--quiet", action="store_true", help="no progress bar")
    exp = sub.add_parser("explore", help="serve a finished run on a local web server: report, map and search API")
    exp.add_argument("dir", help="a finished run directory (e.g. runs/demo)")
    exp.add_argument("--port", type=port, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    exp.add_argument("--host", default=None, help="address to bind (default 127.0.0.1); any other exposes the "
                     "run, unauthenticated, to the network (a warning is printed)")
    ex = sub.add_parser("export", help="write one of the report's figures as a PNG, SVG or PDF file")
    ex.add_argument("dir", help="a finished run directory")
    ex.add_argument("--figure", required=True, help="figure name; 'list' prints the names")
    ex.add_argument("--format", dest="fmt", choices=("png", "svg", "pdf"),
                    help="file format (default: --out's suffix, else png)")
    ex.add_argument("--out", help="output file (default DIR/exports/<figure>.<format>); an existing file is never "
                    "overwritten unless attnclust wrote it in DIR/exports/")
    gen = sub.add_parser("generate", help="write generated questions as SQuAD-v2 JSON: in-context key-value lookup "
                         "(kv), its difficulty set or calibrated to a model")
    gen.add_argument("task", choices=("kv",), help="kv: 'k4170: v23' lists, 'What is the value of k4170?'")
    gen.add_argument("--out", required=True, help="the file to write (new, or one attnclust generate wrote)")
    gen.add_argument("--questions", type=integer, default=400, help="how many questions (default 400)")
    gen.add_argument("--pairs", type=integer, help="lines per list (default 12; chosen by --calibrate)")
    gen.add_argument("--similarity", type=number, default=0.5, help="share (0..1) of distractors that are near "
                     "misses of the key (or value) the question names: anagrams of its digits, then one edit away "
                     "(default 0.5; with --calibrate, the one tried first)")
    gen.add_argument("--seed", type=integer, default=0, help="numpy SeedSequence entropy (default 0)")
    gen.add_argument("--ask", choices=("value", "key"), default="value", help="what a question asks for: value "
                     "('What is the value of k4170?', default) or key ('Which key has the value v4170?')")
    gen.add_argument("--calibrate", action="store_true", help="choose --pairs (and if needed --similarity) so that "
                     "the job's model answers about --target of the questions right (it answers probe batches)")
    gen.add_argument("--job", help="with --calibrate: the job whose model and extract settings answer (default: "
                     "jobs/demo.yaml; e.g. jobs/llm.yaml)")
    gen.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                     help="with --calibrate: override a job setting, e.g. --set model.name=smollm2 (repeatable)")
    gen.add_argument("--target", type=number, help="with --calibrate: the share right aimed at "
                     "(0.35-0.65; default 0.5)")
    gen.add_argument("--probe-questions", type=integer,
                     help="with --calibrate: questions per probe batch (default 40)")
    gen.add_argument("--quiet", action="store_true", help="no probe lines")
    certs = sub.add_parser("certs", help="generate a CA and scheduler/worker/client TLS certificates")
    certs.add_argument("dir")
    return parser


def main(argv: list[str] | None = None) -> int:
    """The ``attnclust`` command; returns the exit code (2 for bad input)."""
    args = _parser().parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out = getattr(args, "out", None)
    try:
        if args.command == "certs":
            paths = write_certificates(Path(args.dir))
            print(f"certificates written to {args.dir}: {', '.join(sorted(p.name for p in paths))}")
            return 0
        if args.command == "evaluate":
            return _evaluate(args)
        if args.command == "compare":
            return _compare(args)
        if args.command == "explore":
            return _explore(args)
        if args.command == "export":
            return _export(args)
        if args.command == "finetune":
            return _finetune(args)
        if args.command == "generate":
            return _generate(args)
        from .pipeline import result_summary, run_job  # lazy: the stages load when a job runs; --help starts fast
        from .stages import COMMANDS  # lazy: as the pipeline

        overrides = list(args.overrides)
        if getattr(args, "data", None):
            overrides.append(f"data.path={args.data}")
        cfg = load_job(args.job, overrides)
        out = Path(args.out) if args.out else Path("runs") / cfg.name
        result = run_job(cfg, out, stages=COMMANDS[args.command], scheduler=args.scheduler,
                         force=args.force, force_named=args.force and args.command != "run",
                         progress=not args.quiet, n_workers=args.workers, runtime=args.runtime)
    except AttnclustError as exc:
        print(f"attnclust: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # disk full, read-only, permissions: the storage, not attnclust
        print(f"attnclust: error: {os_error_line(exc, where=str(out) if out else None)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        import warnings

        # Ctrl-C can land while Dask's client is handing a coroutine to its event loop; the abandoned coroutine's
        # "never awaited" warning (seen once in 2 days of suites, under load) is noise after this one line
        warnings.filterwarnings("ignore", message="coroutine .* was never awaited", category=RuntimeWarning)
        print("attnclust: interrupted; re-run the same command to resume", file=sys.stderr)
        return 130
    print(f"job {result.job_id} finished in {result.stages.get('total_seconds', 0):.1f} s")
    print(result_summary(result))
    if args.command in ("run", "report"):
        print(f"report: {result.report.resolve()}")
    print(f"outputs: {result.out.resolve()}")
    return 0


def _evaluate(args) -> int:
    import json

    scores = evaluate_files(args.data, args.predictions, args.null_odds, null_odds_threshold=args.null_odds_threshold,
                            allow_missing=args.allow_missing)
    print(json.dumps(scores, indent=2))
    return 0


def _compare(args) -> int:
    from .compare import run_compare  # lazy: pulls matplotlib and jinja2 (the report's), which --help does not need

    result = run_compare(args.a, args.b, args.out, max_features=args.max_features, progress=not args.quiet)
    top = result.heads.sort_values("rank").head(3)
    print(f"compared {int(result.heads['n_features'].iloc[0])} features in {result.seconds:.1f} s; most changed: "
          + ", ".join(f"L{r.layer} H{r.head} ({r.change:.3f})" for r in top.itertuples()))
    for note in result.notes:
        print(f"note: {note}")
    print(f"report: {result.files['compare_report'].resolve()}")
    return 0


def _explore(args) -> int:
    from .explore import DEFAULT_HOST, is_loopback, make_server  # lazy: pulls matplotlib and jinja2 (the report's)

    host = args.host or DEFAULT_HOST
    try:
        server = make_server(args.dir, host=host, port=args.port, note=lambda line: print(line, flush=True))
    except OSError as exc:
        import errno

        if exc.filename is not None:  # reading the run, not binding the address
            raise
        if exc.errno == errno.EACCES:
            raise ConfigError(f"--port {args.port}: permission denied (ports below 1024 need privileges); choose "
                              f"a port above 1023 (0 picks a free one)") from None
        raise ConfigError(f"--host {host} --port {args.port}: {os_error_line(exc)}") from None
    if not is_loopback(host):
        print(f"attnclust: warning: serving on {host}: anyone who can reach this machine can read this run "
              f"(no authentication); use the default 127.0.0.1 unless you mean it", file=sys.stderr)
    bound, port = server.server_address[:2]
    shown = f"[{bound}]" if ":" in bound else bound
    print(f"serving {Path(args.dir).resolve()} at http://{shown}:{port}/  (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:  # the normal way to stop it
        print("stopped")
    finally:
        server.server_close()
    return 0


def _export(args) -> int:
    from .export import EXPORT_FIGURES, write_figure  # lazy: pulls matplotlib and jinja2, which --help does not need

    if args.figure == "list":
        width = max(len(n) for n in EXPORT_FIGURES)
        for fig in EXPORT_FIGURES.values():
            print(f"{fig.name:<{width}}  {fig.description}")
        return 0
    path = write_figure(args.dir, args.figure, args.fmt, args.out)
    print(f"figure {args.figure}: {path}")
    return 0


def _generate(args) -> int:
    if not args.calibrate:
        stray = [flag for flag, given in (("--job", args.job), ("--set", args.overrides),
                                          ("--target", args.target is not None),
                                          ("--probe-questions", args.probe_questions is not None)) if given]
        if stray:
            raise ConfigError(f"{stray[0]}: applies only with --calibrate; add --calibrate or drop {stray[0]}")
        pairs = 12 if args.pairs is None else args.pairs
        path = write_kv(args.out, args.questions, pairs=pairs, similarity=args.similarity, seed=args.seed,
                        ask=args.ask)
        print(f"wrote {args.questions} key-value questions (ask {args.ask}, pairs {pairs}, similarity "
              f"{args.similarity:g}, seed {args.seed}) to {path}")
        return 0
    if args.pairs is not None:
        raise ConfigError(f"--pairs {args.pairs} with --calibrate: calibration chooses the list length; drop --pairs "
                          f"or --calibrate")

    cfg = load_job(args.job, list(args.overrides))
    path, result = write_calibrated(cfg, args.out, args.questions, seed=args.seed, similarity=args.similarity,
                                    ask=args.ask, target=0.5 if args.target is None else args.target,
                                    probe_questions=40 if args.probe_questions is None else args.probe_questions,
                                    progress=not args.quiet)
    print(result.line())
    if not result.in_band:
        print(f"attnclust: warning: {cfg.model.name}: no probe reached {result.band[0]:g}-{result.band[1]:g} right; "
              f"the file holds the closest setting (raise extract.max_seq_len for longer lists, or try another "
              f"--similarity)", file=sys.stderr)
    print(f"wrote {args.questions} key-value questions (ask {args.ask}, pairs {result.pairs}, similarity "
          f"{result.similarity:g}, seed {args.seed}) to {path}")
    return 0


def _finetune(args) -> int:
    overrides = list(args.overrides)
    if args.data:
        overrides.append(f"data.path={args.data}")
    if args.eval_data:
        overrides.append(f"finetune.eval_data={args.eval_data}")
    cfg = load_job(args.job, overrides)
    out = Path(args.out) if args.out else Path("models") / cfg.name
    record = finetune_model(cfg, out, force=args.force, progress=not args.quiet)
    losses = [h["loss"] for h in record.get("loss_history", [])]
    if losses:
        print(f"training loss {losses[0]:.3f} -> {losses[-1]:.3f} over {record['steps']} steps")
    if "eval" in record:
        ev = record["eval"]
        print(f"evaluation: EM {ev['exact']:.2f} / F1 {ev['f1']:.2f} on {ev['total']} questions "
              f"(official SQuAD 2.0 metric; {out / 'eval' / 'eval_results.json'})")
    print(f"model: {out.resolve()}  (use it with --set model.name={out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
