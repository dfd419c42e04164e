"""The `galapagos` command."""
from __future__ import annotations

import argparse
import json
import logging
import os
import random
import subprocess
import sys
import time
from pathlib import Path

log = logging.getLogger("galapagos")

EXIT_USAGE = 2


class UsageError(Exception):
    """A bad argument, config or file: one clear line, exit code 2, nothing written."""


def setup_logging(rank: int = 0, logfile: Path | None = None) -> None:
    fmt = f"%(asctime)s [rank {rank}] %(levelname)s %(message)s"
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if logfile is not None:
        handlers.append(logging.FileHandler(logfile))
    for h in handlers:
        h.setFormatter(logging.Formatter(fmt, "%H:%M:%S"))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, handlers=handlers, force=True)


def default_workers() -> int:
    """One worker per GPU, else one per core (a share of a node for each)."""
    from launch.placement import _gpu_count

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return _gpu_count() or cores


def self_start(workers: int, argv: list[str]) -> int:
    """Run this same command under `mpiexec -n workers+1`, so one command works on a laptop."""
    from launch.mpi import mpiexec

    if workers < 1:
        raise UsageError(f"--workers {workers}: need at least one worker")
    cmd = [mpiexec(), "-n", str(workers + 1), sys.executable, "-m", "launch.cli", *argv]
    log.info("starting %d worker(s): %s", workers, " ".join(cmd[:4]) + " ...")
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return 130


# -- evolve ----------------------------------------------------------------------------------------------------
def _evolve_config(args):
    from launch.config import load_config
    from launch.rundir import RunDir

    overrides = {}
    if args.evaluations is not None:
        overrides["run.evaluations"] = args.evaluations
    if args.budget_minutes is not None:
        overrides["run.budget_minutes"] = args.budget_minutes
    if args.strategy is not None:
        overrides["evolution.strategy"] = args.strategy
    overrides.update(_ensemble_overrides(args))
    path = args.config
    if args.resume:
        if args.config:
            raise UsageError("--resume uses the run's own config.toml; change it with --set instead of --config")
        path = RunDir.check(args.out, resume=True).config
    config = load_config(path, args.set or [], overrides)
    if not config.run.evaluations and not config.run.budget_minutes:
        raise UsageError("no budget: give --evaluations N or --budget-minutes M (or run.evaluations / "
                         "run.budget_minutes in the config)")
    return config


def _check_inputs(args):
    """Everything that can be checked before any rank starts: config, data file, run directory."""
    from datashare.format import inspect
    from launch.rundir import RunDir

    config = _evolve_config(args)
    info = inspect(args.data)
    RunDir.check(args.out, resume=args.resume)
    return config, info


def cmd_evolve(args, argv: list[str]) -> int:
    return _mpi_job("evolve", args, argv, _check_inputs, _master_evolve)


def _master_evolve(comm, args) -> int:
    from datashare.format import DataError
    from datashare.share import DataShareError, dataset_plan
    from evolve.build import check_genome
    from evolve.engine import Engine
    from evolve.errors import ConfigError, InvalidGenome
    from evolve.problem import Problem
    from launch.evolution import EvolutionSource, format_summary, summarize, write_summary
    from launch.job import WorkerSetup, master_start
    from launch.progress import ProgressView
    from launch.rundir import RunDir, RunDirError
    from launch.runtime import master_serve, stop_signal

    setup_logging(0)
    if args.workers and args.workers != comm.size - 1:
        log.warning("--workers %d ignored: this job has %d worker rank(s)", args.workers, comm.size - 1)
    try:
        config, info = _check_inputs(args)
        run = RunDir.open(args.out, resume=args.resume)
        setup_logging(0, run.logs / "master.log")
        records = run.read_journal() if args.resume else []
        run.config.write_text(config.dumps())
        problem = Problem(tuple(info.sample_shape), info.task, info.num_targets)
        try:  # warms torch up before the clock of the run starts
            check_genome(config.space.random_genome(random.Random(0), problem), problem, config.space)
        except InvalidGenome:
            pass
        engine = Engine(config.space, problem, config.evolution)
        if records:
            engine.replay(records)
        plan, memory, info = dataset_plan(args.data, ("train", "val"), val_fraction=config.run.val_fraction,
                                          seed=config.run.seed, chunk_bytes=config.run.chunk_mib << 20,
                                          readers=config.run.readers or "node")
    except (UsageError, ConfigError, DataError, DataShareError, RunDirError, ValueError) as exc:
        master_start(comm, str(exc))
        raise UsageError(str(exc)) from None
    start = time.time()
    deadline = start + 60 * config.run.budget_minutes if config.run.budget_minutes else None
    view = ProgressView()
    source = EvolutionSource(engine, config, run, problem, deadline=deadline, view=view, records=records)
    if records:
        log.info("resuming %s: %d evaluation(s) already done", run.path, len(records))
    log.info("evolving networks (%s) for %s (%s, samples %s) on %d worker(s); budget: %s", config.evolution.strategy,
             args.data, info.task, tuple(info.sample_shape), comm.size - 1,
             " and ".join(filter(None, [config.run.evaluations and f"{config.run.evaluations} evaluations",
                                        config.run.budget_minutes and f"{config.run.budget_minutes:g} minutes"])))
    try:
        shared = master_start(comm, WorkerSetup(config.run.task, str(run.logs)), plan, memory)
    except DataShareError as exc:
        raise UsageError(str(exc)) from None
    cpu = time.process_time()
    serve_start = time.time()
    try:
        state = master_serve(comm, source, deadline=deadline, stop=stop_signal,
                             prefetch=None if config.run.prefetch < 0 else config.run.prefetch)
    finally:
        view.clear()
        shared.close()
    wall = time.time() - start
    summary = summarize(source.records, population_size=config.evolution.population_size, workers=comm.size - 1,
                        wall_seconds=wall, busy_seconds=state.busy_seconds)
    # The master's own CPU use while it served: it should leave the cores to training.
    summary["master_cpu_share"] = round((time.process_time() - cpu) / max(time.time() - serve_start, 1e-9), 4)
    if stopped := stop_signal():
        summary["stopped_by"] = stopped
    write_summary(run, summary)
    print(format_summary(summary), flush=True)
    print(f"run directory: {run.path} (best network in {run.best})", flush=True)
    if stopped and not source.finished():
        print(f"stopped by {stopped} before the budget was spent: continue with --resume", flush=True)
    return 0


# -- ensemble, design --------------------------------------------------------------------------------------------
def _ensemble_overrides(args) -> dict:
    """--members (ensemble and design) and the ensemble's --strategy as config overrides."""
    members = getattr(args, "members", None)
    if members is not None and members < 1:
        raise UsageError(f"--members {members}: an ensemble needs at least one member")
    flags = {"ensemble.members": members, "ensemble.strategy": getattr(args, "member_strategy", None)}
    return {k: v for k, v in flags.items() if v is not None}


def _mpi_job(name: str, args, argv: list[str], check, master, phases: int = 1) -> int:
    """Outside MPI: check the inputs, then start this command under mpiexec. Under a launcher: rank 0 runs
    `master(comm, args)`; every other rank serves `phases` jobs as a worker (design: evolution, then ensemble)."""
    from launch.mpi import under_launcher

    if not under_launcher():
        check(args)
        return self_start(args.workers or default_workers(), argv)
    from launch.mpi import world
    from launch.runtime import announce_ready, catch_stop_signals

    catch_stop_signals()
    comm = world()
    announce_ready(comm)
    if comm.size < 2:
        raise UsageError(f"galapagos {name} needs at least one worker: run it under mpiexec/srun with 2 or more "
                         "ranks (rank 0 is the master), or start it without MPI and pass --workers W")
    if comm.rank != 0:
        setup_logging(comm.rank)
        from launch.job import worker_main

        for phase in range(phases):
            if (code := worker_main(comm)) != 0:  # the master could not start this phase; it says why
                return code if phase == 0 else 0
        return 0
    return master(comm, args)


def _ensemble_job(args):
    from launch.ensemble_run import prepare

    return prepare(args.from_run, args.data, args.out, sets=args.set or [], overrides=_ensemble_overrides(args),
                   resume=args.resume)


def _start_ensemble(comm, make_job):
    """Rank 0: the checked ensemble job; on a bad input the waiting workers are told why before it is raised."""
    from datashare.format import DataError
    from evolve.errors import ConfigError
    from launch.job import master_start
    from launch.rundir import RunDirError

    try:
        return make_job()
    except (UsageError, ConfigError, DataError, RunDirError, ValueError) as exc:
        master_start(comm, str(exc))
        raise UsageError(str(exc)) from None


def _build_ensemble(comm, job) -> dict | None:
    from launch.ensemble_run import format_metrics, master_build
    from launch.runtime import stop_signal

    job.out.logs.mkdir(parents=True, exist_ok=True)
    setup_logging(0, job.out.logs / "master.log")
    metrics = master_build(comm, job)
    if metrics is None:
        print(f"stopped by {stop_signal()} before every member was trained: continue with --resume", flush=True)
        return None
    print(format_metrics(metrics), flush=True)
    print(f"ensemble directory: {job.out.path}", flush=True)
    return metrics


def cmd_ensemble(args, argv: list[str]) -> int:
    return _mpi_job("ensemble", args, argv, _ensemble_job, _master_ensemble)


def _master_ensemble(comm, args) -> int:
    setup_logging(0)
    _build_ensemble(comm, _start_ensemble(comm, lambda: _ensemble_job(args)))
    return 0


def cmd_design(args, argv: list[str]) -> int:
    return _mpi_job("design", args, argv, _check_inputs, _master_design, phases=2)


def _master_design(comm, args) -> int:
    """Evolve into --out, then train the ensemble on the same workers into --out/ensemble, then the report."""
    from launch.ensemble_run import design_report, format_report, prepare
    from launch.job import master_start
    from launch.rundir import write_json
    from launch.runtime import stop_signal

    _master_evolve(comm, args)
    out = Path(args.out)
    if stopped := stop_signal():
        master_start(comm, f"stopped by {stopped}")
        print(f"the ensemble was not built: continue with `galapagos evolve --resume --out {out} ...`, then "
              f"`galapagos ensemble --from {out} ...`", flush=True)
        return 0
    job = _start_ensemble(comm, lambda: prepare(out, args.data, out / "ensemble"))
    metrics = _build_ensemble(comm, job)
    if metrics is None:
        return 0
    report = design_report(out, job, metrics)
    write_json(out / "report.json", report)
    print(format_report(report), flush=True)
    return 0


# -- predict, report, data -----------------------------------------------------------------------------------
def cmd_predict(args, argv: list[str]) -> int:
    """One network in one process; an ensemble averaged over MPI ranks (started here unless under a launcher)."""
    from launch.mpi import under_launcher, world

    comm = world() if under_launcher() else None
    if comm is not None and comm.rank != 0:
        setup_logging(comm.rank)
    try:
        return _predict(args, argv, comm)
    except (UsageError, ValueError):
        if comm is not None and comm.rank != 0:
            return EXIT_USAGE  # every rank has the error; rank 0 reports it
        raise


def _predict(args, argv: list[str], comm) -> int:
    from launch.predict import predict, predict_ensemble, used_members

    if args.batch < 1:
        raise UsageError(f"--batch {args.batch}: must be at least 1")
    if args.ranks is not None and args.ranks < 1:
        raise UsageError(f"--ranks {args.ranks}: must be at least 1")
    members = used_members(args.model)  # an ensemble's manifest is checked before any rank starts
    if members is None:
        if args.ranks and args.ranks > 1 and (comm is None or comm.rank == 0):
            log.warning("--ranks %d ignored: %s is one network, not an ensemble", args.ranks, args.model)
        if comm is not None and comm.rank != 0:
            return 0
        result = predict(args.model, args.data, args.split, save=args.save, batch=args.batch)
    else:
        if comm is None and (ranks := min(args.ranks or default_workers(), members)) > 1:
            log.info("averaging %d member(s) over %d ranks", members, ranks)
            return self_start(ranks - 1, argv)
        if comm is not None and comm.rank == 0 and args.ranks and min(args.ranks, members) != comm.size:
            log.warning("--ranks %d ignored: this job has %d rank(s)", args.ranks, comm.size)
        result = predict_ensemble(args.model, args.data, args.split, comm=comm if comm and comm.size > 1 else None,
                                  save=args.save, batch=args.batch, per_member=not args.no_member_outputs)
        if result is None:  # not rank 0
            return 0
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return 0
    classes = result["task"] == "classification"
    keys = ("accuracy", "nll", "ece") if classes else ("mse", "mae", "r2")
    what = f", ensemble of {members} on {result['ranks']} rank(s)" if members else ""
    print(f"{args.split} ({result['samples']} samples{what}): " + ", ".join(f"{k} {result[k]:.4f}" for k in keys))
    for name, m in result.get("per_target", {}).items():
        print(f"  {name}: " + ", ".join(f"{k} {v:.4f}" for k, v in m.items()))
    if members:
        u = result["uncertainty"]
        print("  uncertainty: " + (f"entropy {u['entropy']:.4f} nats, mutual information "
                                   f"{u['mutual_information']:.4f}" if classes else
                                   ", ".join(f"{n} std {v['std']:.4g}" for n, v in u["per_target"].items())))
        for name, m in result.get("members", {}).items():
            print(f"  member {name} (weight {m['weight']:.3f}): " + ", ".join(f"{k} {m[k]:.4f}" for k in keys))
    return 0


def cmd_report(args, argv: list[str]) -> int:
    from evolve.genome import Genome
    from launch.config import load_config
    from launch.evolution import format_summary, summarize
    from launch.rundir import RunDir

    run = RunDir(args.dir)
    if not run.journal.exists():
        raise UsageError(f"{args.dir}: no results.jsonl (not a run directory)")
    records = run.read_journal()
    config = load_config(run.config if run.config.exists() else None)
    summary = summarize(records, population_size=config.evolution.population_size)
    saved = run.path / "summary.json"
    if saved.exists():
        summary = {**summary, **{k: v for k, v in json.loads(saved.read_text()).items()
                                 if k in ("workers", "wall_seconds", "worker_utilization")}}
    print(format_summary(summary))
    top = sorted((r for r in records if r["fitness"] is not None), key=lambda r: -r["fitness"])[:args.top]
    if top:
        print(f"top {len(top)}:")
        for r in top:
            print(f"  {r['id']:>5}  {r['fitness']:.4f}  {r['status']:<6} {Genome.from_json(r['genome']).describe()}")
    return 0


def cmd_data(args, argv: list[str]) -> int:
    from datashare import format as fmt

    if args.action == "check":
        info = fmt.validate(args.file)
        print(f"{args.file}: OK")
        print(fmt.describe(info))
    elif args.action == "info":
        print(fmt.describe(fmt.inspect(args.file)))
    else:
        info = fmt.import_npz(args.file, args.out, task=args.task, num_classes=args.num_classes, name=args.name)
        print(f"wrote {args.out}")
        print(fmt.describe(info))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="galapagos", description="Evolve neural networks for a scientific dataset, "
                                "at supercomputer scale.")
    sub = p.add_subparsers(dest="command", required=True)

    e = sub.add_parser("evolve", help="evolve networks for a dataset (rank 0 evolves, every other rank trains)")
    e.add_argument("--data", required=True, help="HDF5 dataset (see `galapagos data check`)")
    e.add_argument("--out", required=True, help="run directory")
    e.add_argument("--config", help="TOML config with [space] [evolution] [train] [run] tables")
    e.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one config value, e.g. "
                   "train.epochs=4 (repeatable)")
    budget = e.add_mutually_exclusive_group()
    budget.add_argument("--budget-minutes", type=float, help="stop after this many minutes")
    budget.add_argument("--evaluations", type=int, help="stop after this many evaluations")
    e.add_argument("--workers", type=int, help="worker ranks to start when run without MPI (default: one per GPU "
                   "or core)")
    e.add_argument("--strategy", choices=["evolution", "random"])
    e.add_argument("--resume", action="store_true", help="continue the run in --out from its results.jsonl")

    pr = sub.add_parser("predict", help="score a saved network or an ensemble on a split of a dataset")
    pr.add_argument("--model", required=True, help="a run's best/ directory (or the run directory), or an "
                    "ensemble directory (members averaged over MPI ranks)")
    pr.add_argument("--data", required=True)
    pr.add_argument("--split", default="test", choices=("train", "val", "test"))
    pr.add_argument("--json", action="store_true", help="print one JSON object")
    pr.add_argument("--save", help="write predictions (and, for an ensemble, uncertainties and each member's "
                    "predictions) to this HDF5 file")
    pr.add_argument("--batch", type=int, default=1024, help="samples per forward pass (and per broadcast)")
    pr.add_argument("--ranks", type=int, help="ensemble: MPI ranks to start when run without MPI (default: one per "
                    "member, at most one per GPU or core; 1 = in this process)")
    pr.add_argument("--no-member-outputs", action="store_true", help="ensemble: reduce only the ensemble's moments, "
                    "not each member's outputs (no per-member metrics or predictions; for very large ensembles)")

    en = sub.add_parser("ensemble", help="train an ensemble from an evolution run's best networks, one member per "
                        "worker, and select its members on val")
    en.add_argument("--from", dest="from_run", required=True, metavar="RUN", help="evolution run directory")
    en.add_argument("--data", required=True, help="HDF5 dataset (the one the run evolved for, or one like it)")
    en.add_argument("--out", required=True, help="ensemble directory (new, or with --resume an unfinished one)")
    en.add_argument("--members", type=int, help="members to train (default: ensemble.members)")
    en.add_argument("--strategy", dest="member_strategy", choices=["distinct", "seeds", "mixed"],
                    help="members from the best distinct genomes, the best genome with new seeds, or half each")
    en.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one value of the run's config, "
                    "e.g. ensemble.epochs=10 (repeatable)")
    en.add_argument("--workers", type=int, help="worker ranks to start when run without MPI (default: one per GPU "
                    "or core)")
    en.add_argument("--resume", action="store_true", help="finish an interrupted build in --out; members already "
                    "trained are kept")

    de = sub.add_parser("design", help="one command for a new dataset: evolve, build the ensemble, report")
    de.add_argument("--data", required=True, help="HDF5 dataset (see `galapagos data check`)")
    de.add_argument("--out", required=True, help="run directory; the ensemble goes to OUT/ensemble")
    de.add_argument("--config", help="TOML config with [space] [evolution] [train] [run] [ensemble] tables")
    de.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one config value (repeatable)")
    de_budget = de.add_mutually_exclusive_group()
    de_budget.add_argument("--budget-minutes", type=float, help="time budget of the evolution")
    de_budget.add_argument("--evaluations", type=int, help="evaluations of the evolution")
    de.add_argument("--workers", type=int, help="worker ranks to start when run without MPI (default: one per GPU "
                    "or core)")
    de.add_argument("--members", type=int, help="ensemble members to train (default: ensemble.members)")
    de.set_defaults(resume=False, strategy=None)

    r = sub.add_parser("report", help="summarise a run directory")
    r.add_argument("dir")
    r.add_argument("--top", type=int, default=5)

    d = sub.add_parser("data", help="check, describe or import datasets")
    dsub = d.add_subparsers(dest="action", required=True)
    c = dsub.add_parser("check", help="validate a file fully (structure and values)")
    c.add_argument("file")
    i = dsub.add_parser("info", help="describe a file (structure only)")
    i.add_argument("file")
    im = dsub.add_parser("import", help="convert a .npz (x_train, y_train, x_val, ...) to the HDF5 format")
    im.add_argument("file")
    im.add_argument("out")
    im.add_argument("--task", choices=["classification", "regression"])
    im.add_argument("--num-classes", type=int)
    im.add_argument("--name")

    from launch.jobscript import add_parser as add_launch_parser

    add_launch_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if not logging.getLogger().handlers:
        setup_logging(0)
    from datashare.format import DataError
    from ensemble.store import EnsembleError
    from evolve.errors import ConfigError
    from launch.predict import ModelError
    from launch.rundir import RunDirError

    try:
        if args.command == "launch":
            from launch.jobscript import main as cmd_launch

            return cmd_launch(args, argv)
        commands = {"evolve": cmd_evolve, "ensemble": cmd_ensemble, "design": cmd_design, "predict": cmd_predict,
                    "report": cmd_report, "data": cmd_data}
        return commands[args.command](args, argv)
    except (UsageError, ConfigError, DataError, ModelError, RunDirError, EnsembleError) as exc:
        print(f"galapagos {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
