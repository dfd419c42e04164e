"""The master's own cost per candidate, against what a whole machine asks of it.

    python -m bench.master_cost --tasks 3000

Drives rank 0's evolution source without MPI, as the master loop does: `next_task` (the engine breeds a child,
checks and repairs it, counts its parameters, makes the task) then `on_result` (the engine learns the fitness,
the journal gets its fsynced line, best/ and the kept models are updated). The limit it is held to: Summit's 27,648
GPUs training one-minute candidates finish 460 tasks a second, all through this one process. Reported: tasks per
second of the master's wall time (its CPU time alone beside it), its ratio to those 460, a journal append's time,
and the parameter count as the master makes it (shape arithmetic) against a module built on the meta device (what
it did before), same genomes.
"""
from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import torch

from galapagos.config import load_config
from galapagos.evolve.build import build_model
from galapagos.evolve.check import count_params
from galapagos.evolve.engine import Engine
from galapagos.evolve.problem import Problem
from galapagos.flows.evolution import breeder, first_draws
from galapagos.flows.evolution_source import EvolutionSource
from galapagos.launch.protocol import Result, Status
from galapagos.store.journal import JournalRecord
from galapagos.store.rundir import RunDir

SUMMIT_RATE = 27_648 / 60  # tasks per second: every GPU of Summit on one-minute candidates


def timed_source(tmp: str, problem: Problem, config, workers: int = 1) -> tuple[EvolutionSource, list[float]]:
    """Rank 0's evolution source for a job of `workers` on a new run directory under `tmp`, and the list that gets
    the seconds of each journal append it makes."""
    run = RunDir.open(Path(tmp) / "run", resume=False)
    engine = Engine(config.space, problem, config.evolution)
    drawn = first_draws(engine, config, workers)
    source = EvolutionSource(breeder(engine, config, workers), config, run, problem, drawn=drawn)
    appends, original = [], run.append

    def timed_append(record: JournalRecord) -> None:
        t = time.perf_counter()
        original(record)
        appends.append(time.perf_counter() - t)

    run.append = timed_append
    return source, appends


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=3000)
    ap.add_argument("--shape", type=int, nargs="+", default=[3, 32, 32])
    args = ap.parse_args(argv)
    problem = Problem(tuple(args.shape), "classification", 10)
    config = load_config(None, [f"run.evaluations={args.tasks}", "evolution.population_size=64"])
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        source, appends = timed_source(tmp, problem, config)
        genomes = []
        t0, w0 = time.process_time(), time.perf_counter()
        for _ in range(args.tasks):
            task = source.next_task()
            genomes.append(task.payload.genome)
            now = time.time()
            source.on_result(Result(task.id, 1, "node0", Status.OK, rng.random(), now - 60, now,
                                    {"epochs": 6, "val_accuracy": 0.5}))
        cpu, wall = time.process_time() - t0, time.perf_counter() - w0
    sample = genomes[:: max(1, len(genomes) // 200)]
    t = time.perf_counter()
    for g in sample:
        count_params(g, problem)
    counted = (time.perf_counter() - t) / len(sample)
    t = time.perf_counter()
    for g in sample:
        with torch.device("meta"):
            sum(p.numel() for p in build_model(g, problem).parameters())
    built = (time.perf_counter() - t) / len(sample)
    out = {"tasks": args.tasks, "shape": args.shape, "master_tasks_per_s": round(args.tasks / wall),
           "ratio_to_summit_460_per_s": round(args.tasks / wall / SUMMIT_RATE, 2),
           "master_cpu_tasks_per_s": round(args.tasks / cpu),
           "journal_append_ms": round(1e3 * sum(appends) / len(appends), 3),
           "count_params_us": round(1e6 * counted, 1), "meta_build_us": round(1e6 * built, 1),
           "count_speedup": round(built / counted, 1)}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
