"""Search quality at whole-machine scale, by simulation: rank 0's real master and search on a landscape fitted to
real evaluations (bench/landscape.py), with 1,000 to 127,488 simulated workers.

    python -m bench.search_scale [--workers 1000 27648 127488] [--contestants evolution evolution-rungs ...]
                                 [--minutes 5] [--time-scale 10] [--seeds 0]

bench/scale.py's simulation (the real `master_serve`, evolution source, engine, journal and pruning on a virtual
clock; simulated worker ranks) with one change: a worker's task ends as the landscape says. The network's genome
(sent as in a real job) gives its *true score* after `[train] epochs` and its training seconds (times
`--time-scale`: the landscape's networks trained in seconds on a core; scaled, a job holds the rounds of a
longer training); a child that inherited weights adds the landscape's `inherit_bonus`; a promotion (the network it
continues, inheritance included) has its error (1 - score) times `rung_shrink` per rung, and trains from where its
parent's decay began to its rung's end at the same rate per epoch. A first training in rungs scores as one of
`[train] epochs` does (its rate decays to zero at its end as the one cycle's does). What the
master sees is the true score plus the binomial noise of the landscape's validation rows, and per epoch a curve
rising to it with noise of its own (so that median pruning judges as on real curves; a promotion is not judged).

Measured per scale and contestant: the true score of the run's best network (the best by validation of any
rung, as `best/`) at a quarter, half and all of the time, the tasks finished, and the true score of
the best network the run evaluated at all (what a perfect final pick would get). A search that does not get better
with more workers, or in which multi-fidelity does not pay, shows here.
"""
from __future__ import annotations

import argparse
import json
import math
import pickle
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench.landscape import Landscape
from bench.scale import SimComm, _WorkerUnpickler, in_fresh_process, one
from galapagos.evolve.check import count_params
from galapagos.evolve.genome import Genome
from galapagos.evolve.problem import Problem
from galapagos.evolve.rungs import cooldowns, rung_ends
from galapagos.launch.protocol import Progress, Result, Status, Task

LANDSCAPES = Path(__file__).parent / "landscapes"
CONTESTANTS = {"evolution": ["evolution.strategy=evolution"],
               "evolution-rungs": ["evolution.strategy=evolution", "evolution.rungs=2"],
               "evolution-surrogate": ["evolution.strategy=evolution", "evolution.surrogate=8"],
               "evolution-holdout": ["evolution.strategy=evolution", "train.holdout=0.5"],
               "evolution-holdout-64": ["evolution.strategy=evolution", "train.holdout=0.5", "run.keep_models=64"],
               "random": ["evolution.strategy=random"]}
PROBLEM = Problem((1, 128), "classification", 10)  # the signals' (examples/signals.py), the landscape's data
EPOCHS = 6  # [train] epochs, the landscape's first training
EPOCH_NOISE = 0.02  # of a curve's earlier epochs


def _payload(genome: str, shared: bytes, seed: int, save, inherit, *parts) -> SimpleNamespace:
    """What the landscape needs of a task: its genome, whether it inherits, how far it trains."""
    until, resume = (tuple(parts) + (None, None))[:2]
    return SimpleNamespace(genome=genome, inherit=inherit, until=until, resume=resume, echo=None)


class _Unpickler(_WorkerUnpickler):
    def find_class(self, module: str, name: str):
        if (module, name) == ("galapagos.evolve.task", "_unpickle_task"):
            return _payload
        return pickle.Unpickler.find_class(self, module, name)


class LandscapeComm(SimComm):
    """Simulated workers whose tasks end as the landscape says."""

    unpickler = _Unpickler
    land: Landscape
    time_scale = 10.0
    ends: tuple[int, ...] = (EPOCHS,)
    cools: tuple[int, ...] = cooldowns(ends)  # where each rung's decay begins: a promotion trains on from its parent's
    holdout = 0.0  # [train] holdout: the share of the landscape's validation rows the searches never score on

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.true: dict[int, float] = {}  # task id -> the true score of what it trained
        self.noise = random.Random(self.rng.random())
        self.genomes: dict[str, tuple[float, float, int]] = {}  # genome JSON -> (true score, seconds, params)

    def prime(self, source, config) -> None:
        """No peers made up: the median rule learns from the landscape's curves."""

    def _value(self, genome) -> tuple[float, float]:
        text = genome if isinstance(genome, str) else genome.canonical()
        if text not in self.genomes:
            g = genome if isinstance(genome, Genome) else Genome.from_json(text)
            params = count_params(g, PROBLEM)
            self.genomes[text] = (*self.land.value(g, params), params)
        return self.genomes[text][:2]

    def scored(self, true: float, rows: float) -> float:
        """A network's score on `rows` validation rows: its true score with their binomial noise."""
        return min(1.0, max(0.0, self.noise.gauss(true, math.sqrt(max(true * (1 - true), 1e-4) / rows))))

    def _run(self, task: Task, rank: int, now: float) -> None:
        p = task.payload
        start = max(now, self.free_at[rank])
        self.first_task.setdefault(rank, start)
        true, seconds = self._value(p.genome)
        if p.inherit is not None:
            true = min(1.0, true + self.land.inherit_bonus)
        rung = self.ends.index(p.until) if p.until is not None else 0
        first = self.cools[rung - 1] if p.resume is not None else 0
        last = self.ends[rung]
        if p.resume is not None:  # the same network trained on: its parent's score, one rung on
            true = 1 - (1 - self.true[int(Path(p.resume).stem)]) * self.land.rung_shrink
        seen = self.scored(true, self.land.val_rows * (1 - self.holdout))
        per_epoch = seconds * self.time_scale / EPOCHS
        curve = [seen * (1 - 0.3 * 0.5 ** (e - 1)) + (self.noise.gauss(0, EPOCH_NOISE) if e < last else 0.0)
                 for e in range(first + 1, last + 1)]
        times = [start + per_epoch * (e - first) for e in range(first + 1, last + 1)]
        for epoch, (when, value) in enumerate(zip(times, curve), first + 1):
            self._push(when, Progress(task.id, rank, {"epoch": epoch, "fitness": value}))
        end = times[-1]
        self._beats(rank, start, times)
        self.true[task.id] = true
        self.last[task.id] = (start, curve)
        self.spans[task.id, rank] = [start, end, rank]
        echo = getattr(p, "echo", None) or {}
        if echo:
            self.echoes[task.id] = echo
        self._push(end, Result(task.id, rank, self.host(rank), Status.OK, max(curve), start, end,
                               {"epochs": last, **echo}))
        self.free_at[rank] = end


def quality(comm: LandscapeComm, source, start: float, end: float) -> dict:
    """The true score of the run's best network (by validation, of any rung) at a quarter, half and
    all of the time, and of the best network it evaluated. With `train.holdout`, the network is the final pick's as
    if the job ended then (galapagos/flows/final_pick.py's rule: of the best `run.keep_models` distinct networks by
    validation, the best on the held-back rows, each scored there once)."""
    records = [r for r in source.run.read_journal() if r.status == Status.OK and r.fitness is not None]
    held: dict[int, float] = {}  # id -> its score on the held-back rows

    def pick(done: list) -> Any:
        ranked, keys = [], set()
        for r in sorted(done, key=lambda r: r.fitness, reverse=True):
            if r.key not in keys and len(ranked) < (source.config.run.keep_models if comm.holdout else 1):
                keys.add(r.key)
                ranked.append(r)
        if not comm.holdout:
            return ranked[0] if ranked else None
        for r in ranked:
            held.setdefault(r.id, comm.scored(comm.true[r.id], comm.land.val_rows * comm.holdout))
        return max(ranked, key=lambda r: held[r.id], default=None)

    out = {}
    for share in (0.25, 0.5, 1.0):
        best = pick([r for r in records if r.end <= start + share * (end - start)])
        out[f"best_true_{share:g}"] = None if best is None else round(comm.true[best.id], 4)
    out["evaluated_true_max"] = round(max(comm.true[r.id] for r in records), 4) if records else None
    out["promoted"] = sum(r.origin == "promoted" for r in records)
    return out


def run_one(workers: int, contestant: str, minutes: float, time_scale: float, seed: int, landscape: Path) -> dict:
    LandscapeComm.land = Landscape(json.loads(landscape.read_text()))
    LandscapeComm.time_scale = time_scale
    settings = [*CONTESTANTS[contestant], f"evolution.seed={seed}", f"run.seed={seed}"]
    LandscapeComm.ends = rung_ends(EPOCHS, 3, 2 if contestant == "evolution-rungs" else 1)
    LandscapeComm.cools = cooldowns(LandscapeComm.ends)
    LandscapeComm.holdout = 0.5 if contestant.startswith("evolution-holdout") else 0.0
    # bench.scale's median and sigma of task seconds are unused: the landscape times each network
    result = one(workers, minutes, 60.0, 0.6, comm_class=LandscapeComm, settings=tuple(settings),
                 problem=PROBLEM, seed=seed, report=quality)
    keep = ("workers", "tasks", "utilization", "master_cpu_share_steady", "by_status", "best_true_0.25",
            "best_true_0.5", "best_true_1", "evaluated_true_max", "promoted")
    return {"contestant": contestant, "seed": seed, **{k: result[k] for k in keep if k in result}}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.search_scale", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, nargs="+", default=[1000, 27648, 127488])
    p.add_argument("--contestants", nargs="+", choices=list(CONTESTANTS), default=list(CONTESTANTS))
    p.add_argument("--minutes", type=float, default=5.0, help="virtual minutes of search")
    p.add_argument("--time-scale", type=float, default=10.0, help="training seconds times this")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--landscape", type=Path, default=LANDSCAPES / "signals-clean.json")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # one run, in this process
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args.workers[0], args.contestants[0], args.minutes, args.time_scale, args.seeds[0],
                                 args.landscape)), flush=True)
        return
    for n in args.workers:
        for seed in args.seeds:
            for c in args.contestants:
                in_fresh_process("bench.search_scale", ["--workers", n, "--contestants", c, "--minutes", args.minutes,
                                                        "--time-scale", args.time_scale, "--seeds", seed,
                                                        "--landscape", args.landscape])


if __name__ == "__main__":
    main()
