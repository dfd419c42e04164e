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
    from launch.mpi import under_launcher

    if not under_launcher():
        _check_inputs(args)
        return self_start(args.workers or default_workers(), argv)
    from launch.mpi import world

    comm = world()
    if comm.size < 2:
        raise UsageError("galapagos evolve needs at least one worker: run it under mpiexec/srun with 2 or more "
                         "ranks (rank 0 is the master), or start it without MPI and pass --workers W")
    if comm.rank != 0:
        setup_logging(comm.rank)
        from launch.job import worker_main

        return worker_main(comm)
    return _master_evolve(comm, args)


def _master_evolve(comm, args) -> int:
    from datashare.format import DataError, load
    from evolve.build import check_genome
    from evolve.engine import Engine
    from evolve.errors import ConfigError, InvalidGenome
    from evolve.problem import Problem
    from launch.evolution import EvolutionSource, format_summary, summarize, write_summary
    from launch.job import WorkerSetup, master_start
    from launch.progress import ProgressView
    from launch.rundir import RunDir, RunDirError
    from launch.runtime import master_serve

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
        t0 = time.time()
        _, splits = load(args.data, ("train", "val"), val_fraction=config.run.val_fraction, seed=config.run.seed)
        log.info("read %s in %.1f s: %s", args.data, time.time() - t0,
                 ", ".join(f"{k} {len(v[0])}" for k, v in splits.items()))
    except (UsageError, ConfigError, DataError, RunDirError, ValueError) as exc:
        master_start(comm, str(exc))
        raise UsageError(str(exc)) from None
    arrays = {f"{split}/{part}": arr for split, (x, y) in splits.items() for part, arr in (("x", x), ("y", y))}
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
    master_start(comm, WorkerSetup(config.run.task, str(run.logs), config.run.chunk_mib << 20), arrays)
    del arrays, splits
    cpu = time.process_time()
    serve_start = time.time()
    try:
        state = master_serve(comm, source, deadline=deadline,
                             prefetch=None if config.run.prefetch < 0 else config.run.prefetch)
    finally:
        view.clear()
    wall = time.time() - start
    summary = summarize(source.records, population_size=config.evolution.population_size, workers=comm.size - 1,
                        wall_seconds=wall, busy_seconds=state.busy_seconds)
    # The master's own CPU use while it served: it should leave the cores to training.
    summary["master_cpu_share"] = round((time.process_time() - cpu) / max(time.time() - serve_start, 1e-9), 4)
    write_summary(run, summary)
    print(format_summary(summary), flush=True)
    print(f"run directory: {run.path} (best network in {run.best})", flush=True)
    return 0


# -- predict, report, data -----------------------------------------------------------------------------------
def cmd_predict(args) -> int:
    from launch.predict import predict

    result = predict(args.model, args.data, args.split, save=args.save)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        keys = ("accuracy", "nll", "ece") if result["task"] == "classification" else ("mse", "mae", "r2")
        print(f"{args.split} ({result['samples']} samples): " + ", ".join(f"{k} {result[k]:.4f}" for k in keys))
        for name, m in result.get("per_target", {}).items():
            print(f"  {name}: " + ", ".join(f"{k} {v:.4f}" for k, v in m.items()))
    return 0


def cmd_report(args) -> int:
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


def cmd_data(args) -> int:
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

    pr = sub.add_parser("predict", help="score a saved network on a split of a dataset")
    pr.add_argument("--model", required=True, help="a run's best/ directory (or the run directory)")
    pr.add_argument("--data", required=True)
    pr.add_argument("--split", default="test")
    pr.add_argument("--json", action="store_true", help="print one JSON object")
    pr.add_argument("--save", help="write predictions to this HDF5 file")

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
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if not logging.getLogger().handlers:
        setup_logging(0)
    from datashare.format import DataError
    from evolve.errors import ConfigError
    from launch.predict import ModelError
    from launch.rundir import RunDirError

    try:
        if args.command == "evolve":
            return cmd_evolve(args, argv)
        return {"predict": cmd_predict, "report": cmd_report, "data": cmd_data}[args.command](args)
    except (UsageError, ConfigError, DataError, ModelError, RunDirError) as exc:
        print(f"galapagos {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
