"""The `galapagos` command: parses the command line, calls the Python API (galapagos.api), prints what it returns."""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import select
import shlex
import signal
import sys

from galapagos import api
from galapagos.datashare.rules import CLASS_TASKS
from galapagos.errors import NoResult
from galapagos.flows.mpijob import JobFailed, WorkerExit, setup_logging, user_errors
from galapagos.flows.recovery import lost_ranks
from galapagos.launch.protocol import EXIT_BAD_INPUT, EXIT_LOST, EXIT_NO_RESULT
from galapagos.options import EnsembleOptions, EvolveOptions, PredictOptions
from galapagos.parser import build_parser
from galapagos.reports.summary import format_metrics, format_report, format_run_report, format_summary, metric_keys


def show(*lines: str) -> None:
    print(*lines, sep="\n", flush=True)


def show_json(result: dict) -> None:
    """`--json`: the result as one JSON object, one line (what a script or jq reads)."""
    show(json.dumps(result, sort_keys=True, default=str))


def cmd_evolve(args) -> int:
    result = api.run("evolve", EvolveOptions.from_args(args))
    if result is not None:
        show_json(result) if args.json else show_evolution(result, args)
    return stop_code(result)


def stop_code(result: dict | None) -> int:
    """0; EXIT_LOST when worker ranks stopped answering or failed (their tasks went to the other workers, the job
    was ended since MPI would wait for them); 130 when Ctrl-C stopped the job (cleanly: what was done is kept)."""
    if lost := lost_ranks(result):
        print(f"worker rank(s) {', '.join(map(str, lost))} stopped answering or failed; their tasks went back to the "
              "queue and the job was ended", file=sys.stderr)
        return EXIT_LOST
    return 128 + signal.SIGINT if result and result.get("stopped_by") == "SIGINT" else 0


def show_evolution(summary: dict, args) -> None:
    best = f"best network in {summary['best_dir']}" if summary.get("best_dir") else "no best network yet"
    show(format_summary(summary), f"run directory: {summary['run']} ({best})")
    if summary.get("stopped_by") and not summary["finished"]:
        show(f"stopped by {summary['stopped_by']} before the budget was spent: continue with --resume: "
             f"{resume_command(args, summary['run'])}")


def resume_command(args, out: str | None = None) -> str:
    """The command that continues this job where it stopped (evolve, design or ensemble)."""
    run = ["--run", args.from_run] if getattr(args, "from_run", None) else []
    return shlex.join(["galapagos", args.command, "--resume", *run, "--out", out or args.out, "--data", args.data])


def show_failed(exc: JobFailed, args) -> None:
    """A job that died without its result (a rank was killed): the summary written from its journal, and how to
    go on."""
    s = exc.summary
    show_evolution(s, args)
    why = exc.reason or f"the job ended abnormally (exit code {exc.code}; its output above says why)"
    print(f"galapagos {args.command}: {why}; the {s['evaluations']} evaluation(s) in its journal are kept: continue "
          f"with --resume: {resume_command(args, s['run'])}", file=sys.stderr)


def show_ensemble(metrics: dict, args) -> None:
    if "stopped_by" in metrics:
        show(f"stopped by {metrics['stopped_by']} before every member was trained: continue with --resume: "
             f"{resume_command(args)}")
    else:
        show(format_metrics(metrics), f"ensemble directory: {metrics['ensemble_dir']}")


def cmd_ensemble(args) -> int:
    result = api.run("ensemble", EnsembleOptions.from_args(args))
    if result is not None:
        show_json(result) if args.json else show_ensemble(result, args)
    return stop_code(result)


def cmd_design(args) -> int:
    result = api.run("design", EvolveOptions.from_args(args))
    if result is None:
        return 0
    if args.json:
        show_json(result)
        return stop_code(result)
    show_evolution(result["evolution"], args)
    if "ensemble" not in result:
        show(f"the ensemble was not built: continue with `{resume_command(args, result['evolution']['run'])}`")
        return stop_code(result)
    show_ensemble(result["ensemble"], args)
    if "report" in result:
        show(format_report(result["report"]))
    return stop_code(result)


def cmd_predict(args) -> int:
    opts = PredictOptions.from_args(args)
    result = api.run("predict", opts)
    if result is None:  # not rank 0
        return 0
    if args.json:
        show(json.dumps(result, sort_keys=True))
        return 0
    ensemble = "uncertainty" in result
    classes = result["task"] in CLASS_TASKS
    keys = metric_keys(result["task"])
    count = f" of {len(result['members'])}" if "members" in result else ""
    what = f", ensemble{count} on {result['ranks']} rank(s)" if ensemble else ""
    show(f"{opts.split} ({result['samples']} samples{what}): " + ", ".join(f"{k} {result[k]:.4f}" for k in keys))
    for name, m in result.get("per_target", result.get("per_class", {})).items():
        show(f"  {name}: " + ", ".join(f"{k} {'-' if v is None else f'{v:.4f}'}" for k, v in m.items()))
    if ensemble:
        u = result["uncertainty"]
        show("  uncertainty: " + (f"entropy {u['entropy']:.4f} nats, mutual information "
                                  f"{u['mutual_information']:.4f}" if classes else
                                  ", ".join(f"{n} std {v['std']:.4g}" for n, v in u["per_target"].items())))
        for name, m in result.get("members", {}).items():
            show(f"  member {name} (weight {m['weight']:.3f}): " + ", ".join(f"{k} {m[k]:.4f}" for k in keys))
    return 0


def cmd_report(args) -> int:
    # --serve reads a journal the run may be writing: only the report's own read-only reader touches it
    report = None if args.serve else api.report(args.dir, args.top)
    wrote = []
    if args.csv:
        wrote.append(f"wrote {args.csv} ({api.results(args.dir, csv=args.csv)} rows)")
    if args.html:
        wrote.append(f"wrote {api.html_report(args.dir, args.html, compare=args.compare)}")
    if args.serve:
        from galapagos.reports.serve import serve

        if wrote:
            show(*wrote)
        serve(args.dir, args.port, compare=args.compare, announce=show)
    elif args.json:
        show(json.dumps(report))
    else:
        show(format_run_report(report), *wrote)
    return 0


def cmd_export(args) -> int:
    info = api.export(args.model, args.out, args.format)
    if args.json:
        show(json.dumps(info))
    else:
        shape = lambda dims: "(" + ", ".join("N" if d is None else str(d) for d in dims) + ")"  # noqa: E731
        show(f"wrote {info['out']} ({info['format']}): inputs {shape(info['input'])} float32 -> "
             f"{info['outputs']} {shape(info['output'])}")
    return 0


def cmd_data(args) -> int:
    from galapagos.datashare import format as fmt
    from galapagos.datashare.mistakes import review

    if args.action == "check":
        info = api.check_data(args.file)
        warnings = review(args.file, info)
        if args.json:
            show_json({**dataclasses.asdict(info), "ok": True, "warnings": list(warnings)})
            return 0
        show(f"{args.file}: OK", fmt.describe(info))
        for warning in warnings:
            print(f"galapagos data check: warning: {warning}", file=sys.stderr)
    elif args.action == "info":
        info = api.check_data(args.file, values=False)
        show_json(dataclasses.asdict(info)) if args.json else show(fmt.describe(info))
    else:
        info = api.import_data(args.file, args.out, task=args.task, num_classes=args.num_classes, name=args.name,
                               overwrite=args.force, channels_last=args.channels_last, relabel=args.relabel,
                               ignore_index=args.ignore_index)
        show_json(dataclasses.asdict(info)) if args.json else show(f"wrote {args.out}", fmt.describe(info))
    return 0


def cmd_launch(args, argv: list[str]) -> int:
    from galapagos.jobs import launch

    if not args.json:
        launch(args, argv, say=show)
        return 0
    notes: list[str] = []
    show_json({"jobs": launch(args, argv, say=notes.append), "notes": notes})
    return 0


def cmd_setup(args) -> int:
    from galapagos.jobs import setup

    setup(args, say=show)
    return 0


def cmd_doctor(args) -> int:
    from galapagos.launch.doctor import format_report, run_doctor

    report = run_doctor(args.site, args.ranks, args.before_launch, args.launcher, args.pmi)
    if report.quiet:
        pass  # another rank of the same run: the launcher's first says it
    elif args.before_launch:
        for line in report.warnings:
            print(f"galapagos doctor: warning: {line}", file=sys.stderr)
        if report.errors:
            print(f"galapagos doctor: {report.errors[0]}", file=sys.stderr)
    else:
        show(json.dumps(report.as_dict()) if args.json else format_report(report))
    return EXIT_BAD_INPUT if report.errors else 0


def cmd_supervise(args) -> int:
    """A job script's run line: the ranks, restarted on the nodes that answer after a failure
    (galapagos/flows/recovery.py); when it gives up, the run's summary and one line, exit code 3."""
    from galapagos.errors import UsageError
    from galapagos.flows.recovery import Policy
    from galapagos.flows.supervising import read_nodes, supervise_job

    words = args.job_command[1:] if args.job_command[:1] == ["--"] else args.job_command
    for name, value, least in (("--max-restarts", args.max_restarts, 0), ("--min-nodes", args.min_nodes, 1),
                               ("--workers-per-node", args.per_node, 1)):
        if value < least:
            raise UsageError(f"{name} {value}: must be {least} or more")
    if args.probe_timeout <= 0:
        raise UsageError(f"--probe-timeout {args.probe_timeout:g}: must be more than 0 seconds")
    policy = Policy(args.max_restarts, args.min_nodes, args.probe_timeout)
    outcome, summary = supervise_job(words, read_nodes(args.nodes), policy, ranks=args.ranks,
                                     per_node=args.per_node)
    if not outcome.gave_up:
        return outcome.code
    kept = ""
    if summary:
        show(format_summary(summary), f"run directory: {summary['run']}")
        kept = f"; the {summary['evaluations']} evaluation(s) in its journal are kept"
    print(f"galapagos supervise: gave up: {outcome.gave_up}{kept}: continue with `galapagos launch --resume --run RUN`",
          file=sys.stderr)
    return EXIT_LOST


def main(argv: list[str] | None = None) -> int:
    try:
        code = run_command(sys.argv[1:] if argv is None else argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        if not stdout_closed():
            raise
        # The reader of stdout went away (`galapagos report RUN | head -2`): end quietly. stdout goes to devnull so
        # that Python's flush at exit does not fail again (docs.python.org/3/library/signal.html#note-on-sigpipe).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll reports an error on its write end)."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0))
    except (OSError, ValueError):
        return False


def run_command(argv: list[str]) -> int:
    """One command: parsed, run, and its errors as one line and an exit code."""
    args = build_parser().parse_args(argv)
    if not logging.getLogger().handlers:
        setup_logging(0)
    if args.command == "report":
        if args.dir and args.run_dir and args.dir != args.run_dir:
            print(f"galapagos report: error: two directories ({args.dir}, --run {args.run_dir}): give one",
                  file=sys.stderr)
            return EXIT_BAD_INPUT
        args.dir = args.dir or args.run_dir
        if not args.dir:
            print("galapagos report: error: no directory: galapagos report DIR (or --run DIR)", file=sys.stderr)
            return EXIT_BAD_INPUT
    commands = {"evolve": cmd_evolve, "ensemble": cmd_ensemble, "design": cmd_design, "predict": cmd_predict,
                "report": cmd_report, "export": cmd_export, "data": cmd_data, "setup": cmd_setup,
                "doctor": cmd_doctor, "supervise": cmd_supervise}
    try:
        return cmd_launch(args, argv) if args.command == "launch" else commands[args.command](args)
    except WorkerExit as exc:  # a worker rank of a job that could not start; rank 0 says why
        return exc.code
    except JobFailed as exc:  # the job's ranks have already said why
        if exc.summary:
            show_failed(exc, args)
        elif exc.reason:
            print(f"galapagos {args.command}: {exc.reason}", file=sys.stderr)
        return exc.code
    except NoResult as exc:  # the run is over and nothing succeeded: its summary, one line, its own exit code
        show(format_summary(exc.summary))
        print(f"galapagos {args.command}: {exc}", file=sys.stderr)
        return EXIT_NO_RESULT
    except user_errors() as exc:
        from galapagos.launch.mpi import launcher_rank, under_launcher

        if args.command == "predict" and under_launcher() and launcher_rank() != 0:
            return EXIT_BAD_INPUT  # every rank of an ensemble prediction has the error; rank 0 reports it
        print(f"galapagos {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
