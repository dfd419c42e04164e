"""The master's side of an evolution run: the engine behind ask/tell, the journal, pruning, best/ and the summary."""
from __future__ import annotations

import bisect
import logging
import statistics
import time
from collections import Counter, defaultdict
from pathlib import Path

from evolve.build import count_params
from evolve.engine import Engine
from evolve.errors import SearchExhausted
from evolve.genome import Genome
from evolve.problem import Problem
from launch.config import Config
from launch.messages import CANCELLED, OK, PRUNED, Progress, Result, Task
from launch.progress import ProgressView, Snapshot
from launch.rundir import RunDir, write_json
from launch.runtime import MasterState

log = logging.getLogger(__name__)


class EvolutionSource:
    """Asks the engine for a child whenever a worker is free, and records every result the moment it arrives."""

    def __init__(self, engine: Engine, config: Config, run: RunDir, problem: Problem, *,
                 deadline: float | None = None, view: ProgressView | None = None, records: list[dict] = ()):
        self.engine, self.config, self.run, self.problem = engine, config, run, problem
        self.deadline, self.view = deadline, view or ProgressView()
        self.records: list[dict] = list(records)
        self.inflight: dict[int, dict] = {}  # id -> what the record needs besides the result
        self.curves: dict[int, list[float]] = {}  # id -> fitness after each epoch, while running
        self.by_epoch: dict[int, list[float]] = defaultdict(list)  # epoch -> fitness of finished candidates
        self.best: dict | None = None
        self.failures = 0
        self.top: list[tuple[float, int]] = []  # (fitness, id) of the evaluations whose weights are kept
        for r in self.records:
            self._learn(r)
        self.run.prune_models([i for _, i in self.top])  # weights of tasks that were running when a run was killed
        self.started = time.time()
        self.state: MasterState | None = None
        self.shown = -1
        self.exhausted = False  # the space has no new genome left

    # -- budget ----------------------------------------------------------------------------------------------
    @property
    def budget(self) -> int | None:
        return self.config.run.evaluations or None

    def next_task(self) -> Task | None:
        if self.exhausted or (self.budget is not None and len(self.records) + len(self.inflight) >= self.budget):
            return None
        try:
            cand = self.engine.ask()
        except SearchExhausted as exc:
            self.exhausted = True
            self.view.message(f"ending the run early: {exc}")
            return None
        self.inflight[cand.id] = {"parents": list(cand.parents), "origin": cand.origin,
                                  "genome": cand.genome.to_json(), "key": cand.genome.key,
                                  "params": count_params(cand.genome, self.problem)}
        self.curves[cand.id] = []
        payload = {"genome": cand.genome.to_json(), "problem": self.problem.to_dict(),
                   "train": self.config.train.to_dict(), "seed": self.config.run.seed * 1_000_003 + cand.id,
                   "save": str(self.run.model_path(cand.id))}
        return Task(cand.id, payload, self.config.run.task_timeout)

    def finished(self) -> bool:
        return self.exhausted or (self.budget is not None and len(self.records) >= self.budget)

    # -- results ---------------------------------------------------------------------------------------------
    def on_result(self, r: Result) -> None:
        info = self.inflight.pop(r.id)
        curve = self.curves.pop(r.id, [])
        if r.status == CANCELLED:  # the run is ending: not an evaluation; a resumed run breeds afresh
            self.run.model_path(r.id).unlink(missing_ok=True)
            return
        record = {"id": r.id, **info, "status": r.status, "fitness": r.fitness, "metrics": r.metrics,
                  "curve": curve, "rank": r.rank, "host": r.host, "start": r.started, "end": r.ended,
                  "error": r.error}
        self.run.append(record)
        self.records.append(record)
        self.engine.tell(r.id, r.fitness, r.status)
        if self._learn(record):
            self.run.save_best(record, {"problem": self.problem.to_dict(), "describe":
                                        Genome.from_json(record["genome"]).describe()})
        fit = "-" if r.fitness is None else f"{r.fitness:.4f}"
        msg = (f"eval {r.id} {r.status} fitness {fit} in {r.seconds:.1f}s on rank {r.rank}"
               + (f": {r.error.splitlines()[-1]}" if r.error else ""))
        if r.status not in (OK, PRUNED):
            self.view.message(msg)

    def _learn(self, record: dict) -> bool:
        """Take in one finished evaluation; True if it is the new best."""
        if record["status"] != OK:  # failures and pruned candidates leave no weights worth keeping
            self.failures += record["status"] != PRUNED
            self.run.model_path(record["id"]).unlink(missing_ok=True)
            return False
        curve = record.get("curve", [])
        for epoch in range(1, len(curve) + 1):
            self.by_epoch[epoch].append(max(curve[:epoch]))
        bisect.insort(self.top, (-record["fitness"], record["id"]))
        for _, dropped in self.top[self.config.run.keep_models:]:
            self.run.model_path(dropped).unlink(missing_ok=True)
        del self.top[self.config.run.keep_models:]
        if self.best is None or record["fitness"] > self.best["fitness"]:
            self.best = record
            return True
        return False

    def on_progress(self, p: Progress) -> str | None:
        """Median stopping: a candidate whose best so far is below the median of finished ones at this epoch."""
        fit = p.metrics.get("fitness")
        if not isinstance(fit, (int, float)) or p.id not in self.curves:
            return None
        self.curves[p.id].append(fit)
        epoch, run = len(self.curves[p.id]), self.config.run
        peers = self.by_epoch.get(epoch, [])
        if (run.prune and epoch >= run.prune_after and epoch < self.config.train.epochs
                and len(peers) >= run.prune_min_results and max(self.curves[p.id]) < statistics.median(peers)):
            return PRUNED
        return None

    # -- display ---------------------------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        state = self.state
        return Snapshot(done=len(self.records), total=self.budget, best=self.best["fitness"] if self.best else None,
                        busy=state.busy if state else 0, workers=state.workers if state else 0,
                        failures=self.failures,
                        elapsed=time.time() - self.started,
                        remaining=None if self.deadline is None else max(0.0, self.deadline - time.time()))

    def on_tick(self, state: MasterState) -> None:
        """Called after each round of dispatch: a log line per finished evaluation, or a live bar redraw."""
        self.state = state
        self.view.show(self.snapshot(), force=len(self.records) != self.shown)
        self.shown = len(self.records)


def summarize(records: list[dict], *, population_size: int, workers: int | None = None,
              wall_seconds: float | None = None, busy_seconds: float | None = None) -> dict:
    """Evaluations by status, the best network, how it compares with the initial population, utilisation."""
    scored = [r for r in records if r["fitness"] is not None and r["status"] == OK]
    best = max(scored, key=lambda r: r["fitness"]) if scored else None
    initial = [r for r in scored if r["id"] < population_size]
    out = {"evaluations": len(records), "by_status": dict(Counter(r["status"] for r in records)),
           "best": None, "initial_population_best": max((r["fitness"] for r in initial), default=None),
           "initial_population_median": statistics.median([r["fitness"] for r in initial]) if initial else None}
    if best:
        out["best"] = {"id": best["id"], "fitness": best["fitness"], "params": best["params"],
                       "genome": Genome.from_json(best["genome"]).describe(), "metrics": best["metrics"]}
    if workers and wall_seconds:
        out["workers"] = workers
        out["wall_seconds"] = round(wall_seconds, 2)
        out["worker_utilization"] = round(busy_seconds / (workers * wall_seconds), 4)
    return out


def format_summary(s: dict) -> str:
    lines = [f"evaluations: {s['evaluations']} (" + ", ".join(f"{k} {v}" for k, v in sorted(s["by_status"].items()))
             + ")"]
    if s.get("best"):
        b = s["best"]
        lines.append(f"best fitness: {b['fitness']:.4f} (evaluation {b['id']}, {b['params']:,} parameters)")
        lines.append(f"best network: {b['genome']}")
    if s.get("initial_population_best") is not None:
        lines.append(f"initial population: best {s['initial_population_best']:.4f}, "
                     f"median {s['initial_population_median']:.4f}")
    if "worker_utilization" in s:
        lines.append(f"worker utilization: {100 * s['worker_utilization']:.1f}% of {s['workers']} workers over "
                     f"{s['wall_seconds']:.0f} s")
    return "\n".join(lines)


def write_summary(run: RunDir, summary: dict) -> Path:
    path = run.path / "summary.json"
    write_json(path, summary)
    return path
