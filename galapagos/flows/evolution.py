"""The evolution run: its inputs checked before any rank starts, and rank 0's part: the engine behind ask/tell,
the journal, pruning, best/ and the summary.

A run may span several jobs (`--resume`): each checks that its data is the run's own (data.json), holds the run
directory's lock while it runs, and takes its time budget from what the earlier jobs left (clock.json)."""
from __future__ import annotations

import bisect
import logging
import os
import shutil
import time
from collections import defaultdict
from typing import Any

from galapagos.datashare.format import DatasetInfo, inspect
from galapagos.datashare.share import DataShareError
from galapagos.evolve.ahead import Ahead
from galapagos.evolve.check import count_params
from galapagos.evolve.engine import Engine
from galapagos.evolve.errors import SearchExhausted
from galapagos.evolve.genome import Genome
from galapagos.evolve.netdir import NetworkDir
from galapagos.evolve.pareto import OBJECTIVES, Front, objective_values
from galapagos.evolve.problem import Problem
from galapagos.evolve.settings import load_function
from galapagos.evolve.task import TrainTask
from galapagos.config import Config, evolve_config, load_config
from galapagos.flows.datamode import data_memory, data_setup
from galapagos.errors import NoResult, RunDirError, UsageError
from galapagos.store.fingerprint import data_fingerprint
from galapagos.flows.mpijob import Flow, default_workers, end_when_done, setup_logging, starting
from galapagos.options import TRAIN_TASK, EvolveOptions
from galapagos.reports.progress import ProgressView, Snapshot
from galapagos.reports.summary import summarize
from galapagos.store.rundir import RunDir
from galapagos.flows.sources import JournalSource
from galapagos.reports.tracking import Tracker, check_tracking
from galapagos.flows.warmstart import seed_genomes
from galapagos.launch.protocol import Result, Setup, Status, Task
from galapagos.launch.runtime import master_serve, stop_signal
from galapagos.launch.session import master_start

log = logging.getLogger(__name__)

# Seconds between updates of the run's search clock (clock.json) while it runs; the end of a job writes it too. A
# file replaced on every result would add a metadata operation per task to the master on a parallel file system;
# a job killed outright loses at most this much of its search time from the budget's count.
CLOCK_EVERY = 10.0


class EvolutionSource(JournalSource):
    """Asks the engine for a child whenever a worker is free, and records every result the moment it arrives."""

    def __init__(self, engine: Engine | Ahead, config: Config, run: RunDir, problem: Problem, *,
                 deadline: float | None = None, view: ProgressView | None = None, records: list[dict] = (),
                 spent: float = 0.0, tracker: Tracker | None = None, access: Any = None):
        super().__init__(run, records, view=view, deadline=deadline, keep=False)
        self.access = access  # how trainers read the training split (galapagos/datamode.py); None: resident
        self.tracker = tracker  # experiment tracking ([report]), if any
        self.spent = spent  # search seconds of the run's earlier jobs
        self.engine, self.config, self.run, self.problem = engine, config, run, problem
        self.inflight: dict[int, dict] = {}  # id -> what the record needs besides the result
        # (inherited weights?, epoch) -> best fitness by then of each finished candidate, kept sorted: the median is
        # read, not sorted for. Candidates are judged against peers that started as they did: a child that inherits
        # trained weights starts ahead of any fresh network, which would be pruned against it.
        self.by_epoch: dict[tuple[bool, int], list[float]] = defaultdict(list)
        self.best: dict | None = None
        self.top: list[tuple[float, int]] = []  # (fitness, id) of the best evaluations: their weights are kept
        self.held: set[int] = set()  # evaluations whose weights are in models/
        objectives = config.evolution.objectives
        self.front = Front(objectives) if len(objectives) > 1 else None  # kept in front/ and pareto.json
        self.front_rows: dict[int, dict] = {}  # id -> its line in pareto.json
        self.unmeasured = False  # an evaluation lacked an objective's value (warned once)
        for r in records:
            self._learn(r, live=False)
        if self.front is not None:
            self._sync_front(records)
        self.held = {i for i in self.held if os.path.exists(self.run.model_path(i))}
        self.run.prune_models(self.kept())  # weights of tasks that were running when a run was killed
        self.exhausted: str | None = None  # why the space has no new genome left
        self.clocked = 0.0  # when clock.json was last written

    # -- budget ----------------------------------------------------------------------------------------------
    @property
    def budget(self) -> int | None:
        return self.config.run.evaluations or None

    def next_task(self) -> Task | None:
        if self.exhausted or (self.budget is not None and self.done + len(self.inflight) >= self.budget):
            return None
        try:
            cand = self.engine.ask()
        except SearchExhausted as exc:
            self.exhausted = str(exc)
            self.view.message(f"ending the run early: {exc}")
            return None
        params = cand.params if cand.params is not None else count_params(cand.genome, self.problem,
                                                                           self.config.train.builder)
        self.inflight[cand.id] = {"parents": list(cand.parents), "origin": cand.origin,
                                  "genome": cand.genome, "key": cand.genome.key, "params": params}
        parent = next((p for p in cand.parents if p in self.held), None) if self.config.evolution.inherit else None
        if parent is not None:
            self.inflight[cand.id]["inherits"] = parent
        self.running(cand.id)
        payload = TrainTask(cand.genome, self.problem, self.config.train, seed=self.config.run.seed * 1_000_003
                            + cand.id, save=self.run.model_path(cand.id), data=self.access,
                            inherit=None if parent is None else self.run.model_path(parent))
        return Task(cand.id, payload, self.config.run.task_timeout)

    def finished(self) -> bool:
        return bool(self.exhausted) or (self.budget is not None and self.done >= self.budget)

    def search_seconds(self) -> float:
        """The run's search time over all its jobs so far (what its time budget counts)."""
        return self.spent + time.time() - self.started

    # -- results ---------------------------------------------------------------------------------------------
    def on_result(self, r: Result) -> None:
        if time.time() - self.clocked >= CLOCK_EVERY:
            self.run.record_seconds(self.search_seconds())
            self.clocked = time.time()
        record = self.journal_result(r, self.inflight.pop(r.id))
        if record is None:  # cancelled (no weights: the run's end prunes models/): a resumed run breeds afresh
            return
        self.engine.tell(r.id, r.fitness, r.status, objective_values(record, self.config.evolution.objectives))
        if self.tracker is not None:
            self.tracker.log(record)
        if self._learn(record):
            self.run.save_network(self.run.best, record, self._network_extra(record))
        if r.status not in (Status.OK, Status.PRUNED):
            self.warn(f"eval {r.id}", r)

    def _network_extra(self, record: dict) -> dict:
        """What a saved network's metrics.json holds besides the record's own values."""
        builder = {"builder": self.config.train.builder} if self.config.train.builder else {}
        return {"problem": self.problem.to_dict(), **builder,
                "describe": Genome.from_json(record["genome"]).describe()}

    def _learn(self, record: dict, live: bool = True) -> bool:
        """Take in one finished evaluation; True if it is the new best. `live`: it just finished (its weights are
        fresh), rather than read back from the journal of a resumed run."""
        if record["status"] != Status.OK:  # failures and pruned candidates leave no weights worth keeping
            if record.get("error"):  # a trainer stopped cooperatively (pruned) saved none; another may have
                self.run.drop_model(record["id"])
            return False
        if self.front is not None:
            self._place(record, live)
        curve = record.get("curve", [])
        inherited = record.get("inherits") is not None
        for epoch in range(1, len(curve) + 1):
            bisect.insort(self.by_epoch[inherited, epoch], max(curve[:epoch]))
        bisect.insort(self.top, (-record["fitness"], record["id"]))
        del self.top[self.config.run.keep_models:]
        self.held.add(record["id"])
        kept = self.kept()
        for dropped in self.held - kept:
            self.run.drop_model(dropped)
        self.held &= kept
        if self.best is None or record["fitness"] > self.best["fitness"]:
            self.best = record
            return True
        return False

    def kept(self) -> set[int]:
        """Whose weights stay in models/: the best `run.keep_models` evaluations and, for children to inherit
        from, the engine's population."""
        kept = {i for _, i in self.top}
        if self.config.evolution.inherit:
            kept.update(c.id for c, _ in (self.engine.elite if self.engine.multi_objective else
                                          self.engine.population))
        return kept

    def _place(self, record: dict, live: bool) -> None:
        """Several objectives: put the evaluation on the Pareto front if nothing found so far beats it on every
        objective; its network goes to front/ID (before its weights can be pruned from models/) and the members it
        beats leave."""
        objectives = self.config.evolution.objectives
        values = objective_values(record, objectives)
        if values is None:
            if not self.unmeasured:
                self.unmeasured = True
                self.view.message(f"eval {record['id']}: no value for one of the objectives {', '.join(objectives)}"
                                  " (latency is metrics.latency_ms, which a task function of its own must report);"
                                  " evaluations without one stay off the Pareto front")
            return
        removed = self.front.add(record["id"], values)
        if removed is None:
            return
        self.front_rows[record["id"]] = {"id": record["id"], "dir": f"{self.run.front.name}/{record['id']}",
                                         "fitness": record["fitness"], "params": record["params"],
                                         "latency_ms": record["metrics"].get("latency_ms"), "key": record["key"]}
        for k in removed:
            del self.front_rows[k]
        if live:
            self.run.save_network(self.run.front / str(record["id"]), record, self._network_extra(record))
            for k in removed:
                shutil.rmtree(self.run.front / str(k), ignore_errors=True)
            self._save_pareto()

    def _sync_front(self, records: list[dict]) -> None:
        """A resumed run: front/ holds exactly the members of the front the journal gives."""
        if self.run.front.is_dir():
            for d in self.run.front.iterdir():
                if not (d.name.isdigit() and int(d.name) in self.front_rows):
                    shutil.rmtree(d, ignore_errors=True)
        by_id = {r["id"]: r for r in records if r["id"] in self.front_rows}
        for i in self.front_rows:
            if not NetworkDir(self.run.front / str(i)).complete() and os.path.exists(self.run.model_path(i)):
                self.run.save_network(self.run.front / str(i), by_id[i], self._network_extra(by_id[i]))
        self._save_pareto()

    def _save_pareto(self) -> None:
        objectives = self.config.evolution.objectives
        self.run.save(self.run.pareto, {
            "objectives": [[o, "max" if OBJECTIVES[o][0] > 0 else "min"] for o in objectives],
            "members": sorted(self.front_rows.values(), key=lambda m: (-m["fitness"], m["id"]))})

    def judge(self, task_id: int) -> Status | None:
        """Median stopping: a candidate whose best so far is below the median of finished ones at this epoch (those
        that inherited weights, or those that did not, as it did)."""
        curve, run = self.curves[task_id], self.config.run
        peers = self.by_epoch.get(("inherits" in self.inflight[task_id], len(curve)), [])
        if (run.prune and run.prune_after <= len(curve) < self.config.train.epochs
                and len(peers) >= run.prune_min_results and max(curve) < _median(peers)):
            return Status.PRUNED
        return None

    def snapshot(self) -> Snapshot:
        return self._snapshot(total=self.budget, best=self.best["fitness"] if self.best else None)


def _median(ordered: list[float]) -> float:
    """The median of a sorted list (as statistics.median, without sorting it again)."""
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def check(opts: EvolveOptions) -> tuple[Config, DatasetInfo, dict]:
    """Everything that can be checked before any rank starts: config, data file, run directory (no live run holds
    it; on --resume, its run was evolved on this same data), seed genomes. Returns the config, the data's info and
    fingerprint."""
    config = evolve_config(opts)
    check_task(config.run.task)
    check_tracking(config.report)
    if config.train.builder:
        check_task(config.train.builder, "train.builder")
    if opts.seed_from:
        if opts.resume:
            raise UsageError("--seed-from with --resume: the run's population was seeded when it started")
        seed_genomes(opts.seed_from, config.evolution.population_size)
    info = inspect(opts.data)
    data_memory(config.data, config.run, info, opts.workers or default_workers())  # refuses when nothing fits
    run = RunDir.check(opts.out, resume=opts.resume)
    data = run.check_data(info, opts.data) if opts.resume else data_fingerprint(info, opts.data)
    return config, info, data


def check_task(spec: str, key: str = "run.task") -> None:
    """run.task (or train.builder) must name a function this Python can import (every node imports it alike).
    Galapagos's own task is not imported here: it imports torch, which only the trainer children need."""
    if spec == TRAIN_TASK:
        return
    try:
        fn = load_function(spec, key)
    except (ImportError, AttributeError, ValueError) as exc:
        raise UsageError(f"{key} {spec!r}: cannot be imported here: {type(exc).__name__}: {exc}") from None
    if not callable(fn):
        raise UsageError(f"{key} {spec!r}: not a function")


def master(comm: Any, opts: EvolveOptions) -> dict:
    """Rank 0 of an evolution run: returns the summary (also written to summary.json). Holds the run directory's
    lock until it returns. Raises NoResult, after writing summary.json, when the run is over and nothing
    succeeded."""
    with starting(comm):
        config, info, data = check(opts)
        run = RunDir.open(opts.out, resume=opts.resume)
        lock = run.lock()
    try:
        return evolve(comm, opts, config, info, data, run)
    finally:
        lock.release()


def evolve(comm: Any, opts: EvolveOptions, config: Config, info: DatasetInfo, data: dict, run: RunDir
           ) -> dict:
    """The run itself, on rank 0 of a job that holds the run directory."""
    with starting(comm):
        setup_logging(0, run.logs / "master.log")
        run.record_data(data, resume=opts.resume)
        records = run.read_journal() if opts.resume else []
        spent = run.spent_seconds() if opts.resume else 0.0
        run.config.write_text(config.dumps())
        # Kept weights (the best, and the population's for inheritance), one being written per worker, and best/.
        run.check_room(config.run.keep_models + comm.size + config.evolution.inherit
                       * config.evolution.population_size, config.space.max_params)
        problem = Problem.of_dataset(info)
        engine = Engine(config.space, problem, config.evolution)
        if records:
            engine.replay(records)
        elif opts.seed_from:
            seeded = engine.seed(seed_genomes(opts.seed_from, config.evolution.population_size))
            log.info("the population starts from %d genome(s) of %s", seeded, opts.seed_from)
        engine = breeder(engine, config, comm.size - 1)
        plan, memory, info, access, want = data_setup(config.data, config.run, opts.data, info, comm.size - 1)
    start = time.time()
    # The time budget counts the search time of every job of the run, not only this one's.
    deadline = start + 60 * config.run.budget_minutes - spent if config.run.budget_minutes else None
    tracker = Tracker.open(config.report, run.path, run.path.name)
    source = EvolutionSource(engine, config, run, problem, deadline=deadline, records=records,
                             spent=spent, tracker=tracker, access=access)
    if records:
        log.info("resuming %s: %d evaluation(s) already done in %.0f s of search", run.path, len(records), spent)
    if deadline is not None and deadline <= start:
        log.info("the time budget of %g minute(s) was spent by the run's earlier jobs (%.0f s of search): ending at "
                 "once; give it more with --set run.budget_minutes=M", config.run.budget_minutes, spent)
        plan, memory, want = {}, None, None  # nothing will train: no data to share
    log.info("evolving networks (%s) for %s (%s, samples %s) on %d worker(s); budget: %s", config.evolution.strategy,
             opts.data, info.task, tuple(info.sample_shape), comm.size - 1,
             " and ".join(filter(None, [config.run.evaluations and f"{config.run.evaluations} evaluations",
                                        config.run.budget_minutes and f"{config.run.budget_minutes:g} minutes"])))
    try:
        shared = master_start(comm, Setup(config.run.task, str(run.logs), want=want), plan, memory)
    except DataShareError as exc:
        engine.close()
        raise UsageError(str(exc)) from None
    cpu = time.process_time()
    serve_start = time.time()
    try:
        state = master_serve(comm, source, deadline=deadline, stop=stop_signal, lost_grace=config.run.lost_grace,
                             prefetch=prefetch(config.run.prefetch, comm.size - 1))
    finally:
        shared.close()
        run.close()
        engine.close()
        if tracker is not None:
            tracker.close()
    run.prune_models(source.kept())  # what cancelled tasks wrote before their trainers were stopped
    wall, searched = time.time() - start, source.search_seconds()
    run.record_seconds(searched)
    summary = summarize(run.iter_journal(), population_size=config.evolution.population_size, workers=comm.size - 1,
                        wall_seconds=wall, busy_seconds=state.busy_seconds)
    # The master's own CPU use while it served: it should leave the cores to training.
    summary["master_cpu_share"] = round((time.process_time() - cpu) / max(time.time() - serve_start, 1e-9), 4)
    summary["search_seconds"] = round(searched, 2)
    if stopped := stop_signal():
        summary["stopped_by"] = stopped
    if state.lost:
        summary["lost_ranks"] = sorted(state.lost)
        end_when_done(comm, state)
    if source.front is not None:
        summary["pareto_front"] = len(source.front.members)
    if source.exhausted:
        summary["ended_early"] = source.exhausted
    run.save(run.summary, summary)
    result = {**summary, "run": str(run.path), "best_dir": str(run.best) if source.best else None,
              "finished": source.finished() or (deadline is not None and time.time() >= deadline)}
    if source.best is None and not stopped:
        raise NoResult(result)
    return result


def breeder(engine: Engine, config: Config, workers: int) -> Engine | Ahead:
    """What rank 0 asks for children: with `[evolution] breeder_workers` workers or more, a helper process that
    breeds them ahead (evolve/ahead.py); else the engine itself."""
    n = config.evolution.breeder_workers
    return Ahead(engine, config.train.builder) if 0 < n <= workers else engine


def prefetch(setting: int, workers: int) -> int | None:
    """Tasks queued on a worker beyond its running one (None: the runtime decides by task length). One worker gets
    none by default: each child is then bred knowing every earlier result, whatever the timing, so a run with a
    fixed seed and one worker repeats its sequence of genomes."""
    if setting >= 0:
        return setting
    return 0 if workers == 1 else None


def salvage(opts: EvolveOptions, code: int) -> dict | None:
    """The job died without rank 0's summary (MPICH ends every rank when one is killed): summary.json from the
    journal, which holds every evaluation that finished, so that the run still ends with its summary and resumes.
    None when the run never started or a live job holds it."""
    run = RunDir(opts.out)
    if not run.config.exists():
        return None
    try:
        lock = run.lock()
    except (RunDirError, OSError):
        return None
    try:
        config = load_config(run.config)
        summary = summarize(run.iter_journal(), population_size=config.evolution.population_size)
        summary["search_seconds"] = round(run.spent_seconds(), 2)
        summary["ended_by"] = f"the job's failure (exit code {code})"
        run.save(run.summary, summary)
    except (RunDirError, OSError, ValueError) as exc:
        log.warning("%s: no summary written after the job's failure: %s", run.path, exc)
        return None
    finally:
        lock.release()
    return {**summary, "run": str(run.path), "best_dir": str(run.best) if summary["best"] else None,
            "finished": False}


FLOW = Flow("evolve", check, master, salvage=salvage)
