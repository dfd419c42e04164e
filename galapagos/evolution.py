"""The evolution run: its inputs checked before any rank starts, and rank 0's part: the engine behind ask/tell,
the journal, pruning, best/ and the summary."""
from __future__ import annotations

import bisect
import logging
import random
import statistics
import time
from collections import defaultdict
from typing import Any

from datashare.format import DatasetInfo, inspect
from datashare.plan import dataset_plan
from datashare.share import DataShareError
from evolve.build import check_genome, count_params
from evolve.engine import Engine
from evolve.errors import InvalidGenome, SearchExhausted
from evolve.files import write_json
from evolve.genome import Genome
from evolve.problem import Problem
from evolve.train import TrainTask
from galapagos.config import Config, evolve_config
from galapagos.errors import UsageError
from galapagos.mpijob import Flow, setup_logging, starting
from galapagos.options import EvolveOptions
from galapagos.progress import ProgressView, Snapshot
from galapagos.sources import JournalSource
from galapagos.reports import summarize
from galapagos.rundir import RunDir
from launch.protocol import Result, Setup, Status, Task
from launch.runtime import master_serve, stop_signal
from launch.session import master_start

log = logging.getLogger(__name__)


class EvolutionSource(JournalSource):
    """Asks the engine for a child whenever a worker is free, and records every result the moment it arrives."""

    def __init__(self, engine: Engine, config: Config, run: RunDir, problem: Problem, *,
                 deadline: float | None = None, view: ProgressView | None = None, records: list[dict] = ()):
        super().__init__(run, records, view=view, deadline=deadline)
        self.engine, self.config, self.run, self.problem = engine, config, run, problem
        self.inflight: dict[int, dict] = {}  # id -> what the record needs besides the result
        self.by_epoch: dict[int, list[float]] = defaultdict(list)  # epoch -> fitness of finished candidates
        self.best: dict | None = None
        self.failures = 0
        self.top: list[tuple[float, int]] = []  # (fitness, id) of the evaluations whose weights are kept
        for r in self.records:
            self._learn(r)
        self.run.prune_models([i for _, i in self.top])  # weights of tasks that were running when a run was killed
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
        self.running(cand.id)
        payload = TrainTask(cand.genome, self.problem, self.config.train, seed=self.config.run.seed * 1_000_003
                            + cand.id, save=str(self.run.model_path(cand.id)))
        return Task(cand.id, payload, self.config.run.task_timeout)

    def finished(self) -> bool:
        return self.exhausted or (self.budget is not None and len(self.records) >= self.budget)

    # -- results ---------------------------------------------------------------------------------------------
    def on_result(self, r: Result) -> None:
        record = self.journal_result(r, self.inflight.pop(r.id))
        if record is None:  # cancelled: a resumed run breeds afresh
            self.run.model_path(r.id).unlink(missing_ok=True)
            return
        self.engine.tell(r.id, r.fitness, r.status)
        if self._learn(record):
            self.run.save_best(record, {"problem": self.problem.to_dict(), "describe":
                                        Genome.from_json(record["genome"]).describe()})
        if r.status not in (Status.OK, Status.PRUNED):
            self.warn(f"eval {r.id}", r)

    def _learn(self, record: dict) -> bool:
        """Take in one finished evaluation; True if it is the new best."""
        if record["status"] != Status.OK:  # failures and pruned candidates leave no weights worth keeping
            self.failures += record["status"] != Status.PRUNED
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

    def judge(self, task_id: int) -> Status | None:
        """Median stopping: a candidate whose best so far is below the median of finished ones at this epoch."""
        curve, run = self.curves[task_id], self.config.run
        peers = self.by_epoch.get(len(curve), [])
        if (run.prune and run.prune_after <= len(curve) < self.config.train.epochs
                and len(peers) >= run.prune_min_results and max(curve) < statistics.median(peers)):
            return Status.PRUNED
        return None

    def snapshot(self) -> Snapshot:
        return self._snapshot(total=self.budget, best=self.best["fitness"] if self.best else None,
                              failures=self.failures)


def check(opts: EvolveOptions) -> tuple[Config, DatasetInfo]:
    """Everything that can be checked before any rank starts: config, data file, run directory."""
    config = evolve_config(opts)
    info = inspect(opts.data)
    RunDir.check(opts.out, resume=opts.resume)
    return config, info


def master(comm: Any, opts: EvolveOptions) -> dict:
    """Rank 0 of an evolution run: returns the summary (also written to summary.json)."""
    with starting(comm):
        config, info = check(opts)
        run = RunDir.open(opts.out, resume=opts.resume)
        setup_logging(0, run.logs / "master.log")
        records = run.read_journal() if opts.resume else []
        run.config.write_text(config.dumps())
        problem = Problem.of_dataset(info)
        try:  # warms torch up before the clock of the run starts
            check_genome(config.space.random_genome(random.Random(0), problem), problem, config.space)
        except InvalidGenome:
            pass
        engine = Engine(config.space, problem, config.evolution)
        if records:
            engine.replay(records)
        plan, memory, info = dataset_plan(opts.data, ("train", "val"), val_fraction=config.run.val_fraction,
                                          seed=config.run.seed, chunk_bytes=config.run.chunk_mib << 20,
                                          readers=config.run.readers or "node")
    start = time.time()
    deadline = start + 60 * config.run.budget_minutes if config.run.budget_minutes else None
    view = ProgressView()
    source = EvolutionSource(engine, config, run, problem, deadline=deadline, view=view, records=records)
    if records:
        log.info("resuming %s: %d evaluation(s) already done", run.path, len(records))
    log.info("evolving networks (%s) for %s (%s, samples %s) on %d worker(s); budget: %s", config.evolution.strategy,
             opts.data, info.task, tuple(info.sample_shape), comm.size - 1,
             " and ".join(filter(None, [config.run.evaluations and f"{config.run.evaluations} evaluations",
                                        config.run.budget_minutes and f"{config.run.budget_minutes:g} minutes"])))
    try:
        shared = master_start(comm, Setup(config.run.task, str(run.logs)), plan, memory)
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
    write_json(run.summary, summary)
    return {**summary, "run": str(run.path), "best_dir": str(run.best), "finished": source.finished()}


FLOW = Flow("evolve", check, master)
