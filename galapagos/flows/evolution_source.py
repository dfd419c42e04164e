"""The evolution run's task source on rank 0: the engine behind ask/tell, the journal, median pruning, kept weights,
best/ and the Pareto front, and the run's search clock."""
from __future__ import annotations

import bisect
import heapq
import logging
import os
import shutil
import time
from collections import defaultdict, deque
from dataclasses import replace
from typing import Any, Iterable

from galapagos.config import Config
from galapagos.evolve.ahead import Ahead
from galapagos.evolve.check import count_params
from galapagos.evolve.drawn import Drawn
from galapagos.evolve.engine import Candidate, Engine
from galapagos.evolve.errors import SearchExhausted
from galapagos.evolve.genome import Genome
from galapagos.evolve.netdir import NetworkDir
from galapagos.evolve.pareto import OBJECTIVES, Front, objective_values
from galapagos.evolve.problem import Problem
from galapagos.evolve.rungs import cooldowns, rung_ends
from galapagos.evolve.task import TrainConfig, TrainTask
from galapagos.flows.finish import FINISH, Finish, epoch_seconds
from galapagos.flows.sources import JournalSource
from galapagos.launch.protocol import Result, Status, Task
from galapagos.reports.progress import ProgressView, Snapshot
from galapagos.reports.tracking import Tracker
from galapagos.store.journal import JournalRecord
from galapagos.store.rundir import RunDir

log = logging.getLogger(__name__)

# Seconds between updates of the run's search clock (clock.json) while it runs; the end of a job writes it too. A
# file replaced on every result would add a metadata operation per task to the master on a parallel file system;
# a job killed outright loses at most this much of its search time from the budget's count.
CLOCK_EVERY = 10.0
# The final ensemble's build (run.final_ensemble, galapagos/flows/evolution.py) comes out of the time budget: the
# search ends its expected seconds before the deadline. The build's process starts (BUILD_START_S: torch, the data)
# and each kept network predicts the val and test splits, at BUILD_RATE of its training's seconds over as many
# samples: the upper edge of round 5's 15 builds of 16 networks each, 4.9-60.3 s (bench/RESULTS.md).
BUILD_START_S = 5.0
BUILD_RATE = 0.75
SWEEP_EVERY = 1.0  # seconds between drops of the weights no longer kept (EvolutionSource.sweep)


class EvolutionSource(JournalSource):
    """Asks the engine for a child whenever a worker is free, and records every result the moment it arrives."""

    def __init__(self, engine: Engine | Ahead, config: Config, run: RunDir, problem: Problem, *,
                 deadline: float | None = None, view: ProgressView | None = None, records: list[JournalRecord] = (),
                 spent: float = 0.0, tracker: Tracker | None = None, access: Any = None, drawn: range = range(0),
                 build_share: float = 0.0):
        """`drawn`: the ids of the first round, whose workers draw the genomes (evolve/drawn.py). `build_share`: with
        a final ensemble to build at the end, its val and test samples over the training split's (build_seconds);
        0 without one."""
        super().__init__(run, records, view=view, deadline=deadline, keep=False)
        self.drawn = deque(drawn)
        self.access = access  # how trainers read the training split (galapagos/flows/datamode.py); None: resident
        self.tracker = tracker  # experiment tracking ([report]), if any
        self.spent = spent  # search seconds of the run's earlier jobs
        self.engine, self.config, self.run, self.problem = engine, config, run, problem
        self.inflight: dict[int, dict] = {}  # id -> what the record needs besides the result
        # (inherited weights?, epoch) -> the best fitness by then of each finished candidate, as a running median.
        # Candidates are judged against peers that started as they did: a child that inherits trained weights starts
        # ahead of any fresh network, which would be pruned against it.
        self.by_epoch: dict[tuple[bool, int], Median] = defaultdict(Median)
        self.best: JournalRecord | None = None
        # (-fitness, id, record) of the best evaluations, in order: their weights are kept
        self.top: list[tuple[float, int, JournalRecord]] = []
        self.build_share = build_share
        self.reserve = 0.0  # the build's seconds: none until a kept network's weights are in models/
        ev = config.evolution
        # multi-fidelity (evolve/rungs.py): each rung's last epoch and the one its decay starts after, the schedule
        # of all of them; their checkpoints
        self.ends = rung_ends(config.train.epochs, ev.reduction_factor, ev.rungs)
        self.cools = cooldowns(self.ends)
        self.train = replace(config.train, epochs=self.ends[-1], warmup=config.train.warmup * self.ends[0] /
                             self.ends[-1]) if ev.rungs > 1 else config.train
        self.released: list[int] = []  # checkpoints no promotion needs, dropped at the next sweep
        self.held: set[int] = set()  # evaluations whose weights are in models/
        self.shrink: dict[int, float] = {}  # train.adaptive_shrink: a held evaluation -> its children's share of it
        self.shrunk: dict[float, TrainConfig] = {}  # a share -> the training of a child that starts from it
        self.swept = 0.0  # when the weights no longer kept were last dropped (sweep)
        # the end of the time budget: the best networks train on (galapagos/flows/finish.py)
        self.finish = Finish(ev.finish, 60 * config.run.budget_minutes, deadline, config.train,
                             config.run.task_timeout, records)
        self.finishing: dict[int, TrainConfig] = {}  # id -> its training, of the finishing tasks in flight
        objectives = config.evolution.objectives
        self.front = Front(objectives) if len(objectives) > 1 else None  # kept in front/ and pareto.json
        self.front_rows: dict[int, dict] = {}  # id -> its line in pareto.json
        self.unmeasured = False  # an evaluation lacked an objective's value (warned once)
        for r in records:
            self._learn(r, live=False)
        if self.front is not None:
            self._sync_front(records)
        kept = self.kept()
        self.held = {i for i in self.held & kept if os.path.exists(self.run.model_path(i))}
        self.shrink = {i: s for i, s in self.shrink.items() if i in self.held}
        self.run.prune_models(kept)  # weights of tasks that were running when a run was killed
        if ev.rungs > 1:
            os.makedirs(self.run.checkpoints, exist_ok=True)
            engine.forget(i for i in engine.resumable() if not os.path.exists(self.run.checkpoint_path(i)))
            engine.released()  # what the replay released: the prune below deletes every checkpoint not resumable
            self.run.prune_checkpoints(engine.resumable())
        self.exhausted: str | None = None  # why the space has no new genome left
        self.clocked = 0.0  # when clock.json was last written

    # -- budget ----------------------------------------------------------------------------------------------
    @property
    def budget(self) -> int | None:
        return self.config.run.evaluations or None

    def next_task(self) -> Task | None:
        if self.again:  # its worker was lost: sent again (it is still in flight, within the budget)
            return self._task(self.again.popleft())
        if self.finish.begun(time.time()):
            return self._finishing()
        if self.exhausted or (self.budget is not None and self.done + len(self.inflight) >= self.budget):
            return None
        if self.drawn:
            cid = self.drawn.popleft()
            self.inflight[cid] = {"parents": [], "origin": "random", "genome": None, **self._rung(0)}
            return self._task(cid)
        try:
            cand = self.engine.ask()
        except SearchExhausted as exc:
            self.exhausted = str(exc)
            self.view.message(f"ending the run early: {exc}")
            return None
        params = cand.params if cand.params is not None else count_params(cand.genome, self.problem,
                                                                           self.config.train.builder)
        self.inflight[cand.id] = {"parents": list(cand.parents), "origin": cand.origin,
                                  "genome": cand.genome, "key": cand.genome.key, "params": params,
                                  **self._rung(cand.rung)}
        parent = next((p for p in cand.parents if p in self.held), None) \
            if self.config.evolution.inherit and cand.origin != "promoted" else None
        if parent is not None:
            self.inflight[cand.id]["inherits"] = parent
        return self._task(cand.id)

    def _finishing(self) -> Task | None:
        """The end of the time budget: the best network not finished yet trains on from its weights, as a task of
        a new id (galapagos/flows/finish.py); None once none is left."""
        if self.finish.over:
            return None
        if not self.finish.keys:
            self.view.message(f"finishing: the search stops breeding; its best networks train on for the budget's "
                              f"last {max(self.end() - time.time(), 0) / 60:.1f} minute(s)")
        found = self.finish.next([t[2] for t in self.top], time.time(), self.end())
        if found is None:
            return None
        record, train = found
        (cid,) = self.engine.reserve(1)  # an id no ask gives (the engine has adopted every child bred ahead)
        self.inflight[cid] = {"parents": [record.id], "origin": FINISH, "genome": Genome.from_json(record.genome),
                              "key": record.key, "params": record.params, "inherits": record.id}
        self.finishing[cid] = train
        return self._task(cid)

    def _rung(self, rung: int) -> dict:
        """What a record holds of its rung: nothing without rungs."""
        return {"rung": rung} if len(self.ends) > 1 else {}

    def _task(self, cid: int) -> Task:
        what = self.inflight[cid]
        parent = what.get("inherits")
        if parent is not None and parent not in self.held:  # sent again after its parent's weights were dropped
            del what["inherits"]
            parent = None
        self.running(cid)
        genome = what["genome"]
        drawn = None if genome is not None else self._draw(cid)
        seed = self.config.run.seed * 1_000_003 + cid
        payload = TrainTask(genome, self.problem, self._training(cid, parent), seed=seed,
                            save=self.run.model_path(cid), data=self.access, drawn=drawn,
                            inherit=None if parent is None else self.run.model_path(parent), **self._parts(cid, what))
        return Task(cid, payload, self.config.run.task_timeout)

    def _training(self, cid: int, parent: int | None) -> TrainConfig:
        """A task's `[train]`: a finishing task's own; a child's with the share of its parent's weights that follows
        the parent's fit (`train.adaptive_shrink`); else the run's."""
        if cid in self.finishing:
            return self.finishing[cid]
        share = self.shrink.get(parent)
        if share is None:
            return self.train
        if share not in self.shrunk:
            self.shrunk[share] = replace(self.train, inherit_shrink=share)
        return self.shrunk[share]

    def _parts(self, cid: int, what: dict) -> dict:
        """Multi-fidelity: a task trains to its rung's end, from its parent's checkpoint if it was promoted, and
        leaves its own (its state where its learning rate starts to decay) for a promotion unless it reached the last
        rung."""
        if "rung" not in what:
            return {}
        rung = what["rung"]
        return {"until": self.ends[rung],
                "resume": self.run.checkpoint_path(what["parents"][0]) if what["origin"] == "promoted" else None,
                "checkpoint": self.run.checkpoint_path(cid) if rung < len(self.ends) - 1 else None,
                "cooldown": self.cools[rung]}

    def finished(self) -> bool:
        return not self.again and (bool(self.exhausted) or self.finish.over
                                   or (self.budget is not None and self.done >= self.budget))

    def end(self) -> float | None:
        """When the search stops: the deadline, less the final ensemble's expected build (polled by the master
        loop; it moves as the kept networks change)."""
        return None if self.deadline is None else self.deadline - self.reserve

    def search_seconds(self) -> float:
        """The run's search time over all its jobs so far (what its time budget counts)."""
        return self.spent + time.time() - self.started

    # -- results ---------------------------------------------------------------------------------------------
    def on_result(self, r: Result) -> None:
        if self.lost_again(r):
            return
        if time.time() - self.clocked >= CLOCK_EVERY:
            self.run.record_seconds(self.search_seconds())
            self.clocked = time.time()
        what = self.inflight.pop(r.id)
        if what["genome"] is None and r.status != Status.CANCELLED:
            self._adopt_drawn(r, what)
        self.finishing.pop(r.id, None)
        record = self.journal_result(r, what)
        if record is None:  # cancelled (no weights: the run's end prunes models/): a resumed run breeds afresh
            return
        if record.origin != FINISH:  # the search is over: the engine has nothing to learn from it
            self.engine.tell(r.id, r.fitness, r.status,
                             objective_values(record, self.config.evolution.objectives))
        if record.rung is not None:
            self.released += self.engine.released()
            if record.origin == "promoted":  # the checkpoint it went on from is used up
                self.released.append(record.parents[0])
            if record.status != Status.OK:  # one a trainer killed in its decay may have left
                self.released.append(record.id)
        if self.tracker is not None:
            self.tracker.log(record)
        if self._learn(record):
            self.run.save_network(self.run.best, record, self.network_extra(record))
        if r.status not in (Status.OK, Status.PRUNED):
            self.warn(f"eval {r.id}", r)

    def _draw(self, cid: int) -> Drawn:
        return Drawn(self.engine.space, self.engine.config.seed, cid)

    def _adopt_drawn(self, r: Result, what: dict) -> None:
        """A drawn candidate's genome, as its worker sent it back (drawn again here where the result came from
        rank 0 itself: a task given up), taken into the engine as if asked there."""
        genome = r.metrics.pop("genome", None)
        params = r.metrics.pop("params", None)
        if not isinstance(genome, Genome):
            genome = self._draw(r.id).genome(self.problem)
        if params is None:
            params = count_params(genome, self.problem, self.config.train.builder)
        what.update(genome=genome, key=genome.key, params=params)
        self.engine.adopt(Candidate(r.id, genome, (), "random", params))

    def network_extra(self, record: JournalRecord) -> dict:
        """What a saved network's metrics.json holds besides the record's own values."""
        builder = {"builder": self.config.train.builder} if self.config.train.builder else {}
        return {"problem": self.problem.to_dict(), **builder,
                "describe": Genome.from_json(record.genome).describe()}

    def _learn(self, record: JournalRecord, live: bool = True) -> bool:
        """Take in one finished evaluation; True if it is the new best. `live`: it just finished (its weights are
        fresh), rather than read back from the journal of a resumed run."""
        if record.status != Status.OK:  # failures and pruned candidates leave no weights worth keeping
            if record.error:  # a trainer stopped cooperatively (pruned) saved none; another may have
                self.run.drop_model(record.id)
            return False
        if self.front is not None:
            self._place(record, live)
        curve, rung = record.curve, record.rung or 0
        inherited = record.inherits is not None
        finishing = record.origin == FINISH
        if not rung and not finishing:  # a promotion's curve starts where its rung does: not pruned, not compared
            for epoch in range(1, len(curve) + 1):
                self.by_epoch[inherited, epoch].add(max(curve[:epoch]))
        keep = self.config.run.keep_models
        if bisect.bisect(self.top, (-record.fitness, record.id), key=lambda t: t[:2]) < keep:
            bisect.insort(self.top, (-record.fitness, record.id, record), key=lambda t: t[:2])
            del self.top[keep:]
            if self.build_share and self.deadline is not None and (
                    self.reserve or os.path.exists(self.run.model_path(record.id))):  # a task may save none
                self.reserve = build_seconds((t[2] for t in self.top), self.build_share)
        self.held.add(record.id)
        if (share := self.train.shrink_after(record.metrics)) is not None:
            self.shrink[record.id] = share
        # once a network is finished, the best is the best finished one (galapagos/flows/finish.py), which may rank
        # below the kept top: its weights are kept as the best's, and the sweep comes after it is named
        new_best = self.best is None or (finishing, record.fitness) > (self.best.origin == FINISH, self.best.fitness)
        if new_best:
            self.best = record
        if live and time.monotonic() - self.swept >= SWEEP_EVERY:
            self.sweep()
        return new_best

    def sweep(self) -> None:
        """Drop the weights no longer kept. Once every SWEEP_EVERY seconds, not per result: the kept set is the
        population's size (up to 4,096) and rank 0 finishes hundreds of evaluations a second at whole-machine
        scale; a file dropped a second late costs nothing."""
        self.swept = time.monotonic()
        kept = self.kept()
        for dropped in self.held - kept:
            self.run.drop_model(dropped)
        self.held &= kept
        self.shrink = {i: s for i, s in self.shrink.items() if i in self.held}
        for dropped in self.released:
            self.run.drop_checkpoint(dropped)
        self.released = []

    def kept(self) -> set[int]:
        """Whose weights stay in models/: the best `run.keep_models` evaluations and, for children to inherit
        from, the engine's population and the parents of every child asked and not yet told: a parent that ages
        out of the population while its child waits for a worker or trains keeps the weights the child loads. With
        nothing in flight (the end of a job, whose cancelled children the engine was never told of) none is needed.
        And the best's, a finished network below the top."""
        kept = {t[1] for t in self.top}
        if self.best is not None:
            kept.add(self.best.id)
        if self.config.evolution.inherit:
            kept.update(c.id for c, _ in (self.engine.elite if self.engine.multi_objective else
                                          self.engine.population))
            if self.inflight:
                kept.update(self.engine.pending_parents())
        kept.update(what["parents"][0] for what in self.inflight.values() if what["origin"] == FINISH)
        return kept

    def _place(self, record: JournalRecord, live: bool) -> None:
        """Several objectives: put the evaluation on the Pareto front if nothing found so far beats it on every
        objective; its network goes to front/ID (before its weights can be pruned from models/) and the members it
        beats leave."""
        objectives = self.config.evolution.objectives
        values = objective_values(record, objectives)
        if values is None:
            if not self.unmeasured:
                self.unmeasured = True
                self.view.message(f"eval {record.id}: no value for one of the objectives {', '.join(objectives)}"
                                  " (latency is metrics.latency_ms, which a task function of its own must report);"
                                  " evaluations without one stay off the Pareto front")
            return
        removed = self.front.add(record.id, values)
        if removed is None:
            return
        net = self.run.front_dir(record.id)
        self.front_rows[record.id] = {"id": record.id, "dir": net.relative_to(self.run.path).as_posix(),
                                      "fitness": record.fitness, "params": record.params,
                                      "latency_ms": record.metrics.get("latency_ms"), "key": record.key}
        for k in removed:
            del self.front_rows[k]
        if live:
            self.run.save_network(net, record, self.network_extra(record))
            for k in removed:
                shutil.rmtree(self.run.front_dir(k), ignore_errors=True)
            self._save_pareto()

    def _sync_front(self, records: list[JournalRecord]) -> None:
        """A resumed run: front/ holds exactly the members of the front the journal gives."""
        if self.run.front.is_dir():
            for d in self.run.front.iterdir():
                if not (d.name.isdigit() and int(d.name) in self.front_rows):
                    shutil.rmtree(d, ignore_errors=True)
        by_id = {r.id: r for r in records if r.id in self.front_rows}
        for i in self.front_rows:
            if not NetworkDir(self.run.front_dir(i)).complete() and os.path.exists(self.run.model_path(i)):
                self.run.save_network(self.run.front_dir(i), by_id[i], self.network_extra(by_id[i]))
        self._save_pareto()

    def _save_pareto(self) -> None:
        objectives = self.config.evolution.objectives
        self.run.save_front([[o, "max" if OBJECTIVES[o][0] > 0 else "min"] for o in objectives],
                            sorted(self.front_rows.values(), key=lambda m: (-m["fitness"], m["id"])))

    def judge(self, task_id: int) -> Status | None:
        """Median stopping: a candidate whose best so far is below the median of finished ones at this epoch (those
        that inherited weights, or those that did not, as it did)."""
        curve, run, what = self.curves[task_id], self.config.run, self.inflight[task_id]
        if what.get("rung") or what["origin"] == FINISH:  # a promotion: among the best of its rung already; a
            return None  # finishing network: among the best of the run
        peers = self.by_epoch.get(("inherits" in what, len(curve)), ())
        if (run.prune and run.prune_after <= len(curve) < self.config.train.epochs
                and len(peers) >= run.prune_min_results and max(curve) < peers.median()):
            return Status.PRUNED
        return None

    def snapshot(self) -> Snapshot:
        return self._snapshot(total=self.budget, best=self.best.fitness if self.best else None)


class Median:
    """The median of numbers that only ever come in (as statistics.median), in two heaps: the lower half (negated)
    and the upper half, O(log n) a number. A sorted list's insort moved the whole list: at 127,488 simulated workers
    that was a millisecond of rank 0's per finished candidate after a few minutes (bench/scale.py)."""

    __slots__ = ("low", "high")

    def __init__(self, values: Iterable[float] = ()) -> None:
        self.low: list[float] = []  # max-heap, negated: as long as `high` or one longer
        self.high: list[float] = []
        for value in values:
            self.add(value)

    def add(self, value: float) -> None:
        if self.low and value > -self.low[0]:
            heapq.heappush(self.high, value)
        else:
            heapq.heappush(self.low, -value)
        if len(self.low) > len(self.high) + 1:
            heapq.heappush(self.high, -heapq.heappop(self.low))
        elif len(self.high) > len(self.low):
            heapq.heappush(self.low, -heapq.heappop(self.high))

    def __len__(self) -> int:
        return len(self.low) + len(self.high)

    def median(self) -> float:
        return -self.low[0] if len(self.low) > len(self.high) else (self.high[0] - self.low[0]) / 2


def build_seconds(kept: Iterable[JournalRecord], share: float) -> float:
    """The final ensemble's expected build: its process's start-up, then each kept network's predictions on the val
    and test splits (`share`: their samples over the training split's) at BUILD_RATE of its training's seconds."""
    return BUILD_START_S + BUILD_RATE * share * sum(epoch_seconds(r) for r in kept)
