"""The master at whole-machine scale without the machine: rank 0's real loop, driven by simulated workers.

    python -m bench.scale [--workers 1000 27648 75264 127488] [--minutes 5]

`launch/runtime.py: master_serve` runs unchanged with the real evolution source (engine, journal, median pruning,
kept models, progress) on a simulated communicator of N worker ranks (the defaults: a small job, Summit's 27,648
GPUs, Frontier's 75,264 GCDs and Aurora's 127,488 tiles). Each task draws its fate from MIX below: a full training
takes a lognormal time (median `--median` seconds, sigma `--sigma`: a heavy tail) and reports its fitness after
each of its EPOCHS epochs; most candidates report a curve that the master's own median rule (`EvolutionSource.judge`)
prunes as early as it may; a few crash or run into their time limit. The clock is virtual: it runs with
the master's own real time while the master works and jumps to the next worker event when the master would sleep,
so a slow master shows as idle workers, and minutes of 27,648 workers cost only the master's own CPU time. What the
simulated workers do is kept out of both the master's CPU time and its clock; what MPI would cost the master is
kept in: every message it sends is pickled and every message it receives unpickled, as mpi4py's `send` and
`Message.recv` do. The first round is drawn by the simulated workers (evolve/drawn.py), whose Results carry their
genomes back, as in a real job of this size.

Measured per scale, each in a fresh process: the master's CPU time per task (target: under 100 us), the workers'
utilization from the start to the deadline (busy worker-seconds over workers x time; target: at least 99%), the
same in steady state (after every worker got its first task), the seconds of the first round (every worker's first
task sent) and of the stop after the deadline (cancelling and stopping every worker), the steady task rate and
rank 0's CPU share at it (the master's CPU seconds per second of the clock in steady state; target: at most half
a core), journal lines per second of append time, the master's peak resident memory, and the mix as drawn
(`mix`) and as the master's pruning made it (`by_status`, `pruned_at_epoch`).

The mix. Pruning (`run.prune_after` = 2, `train.epochs` = 6, the defaults) judges a candidate after each epoch
from the second against the median of the finished candidates' best fitness by that epoch. The simulated curves
make the real rule give the drawn fate: a full candidate reports 1 - 2^-e after epoch e (the median itself: never
below it), a candidate drawn to be pruned after epoch k reports 1 - 2^-(k-1) from its first epoch on, at the median
until epoch k - 1 and below it at epoch k. The rule's peers are those of a run under way: the simulation starts with
`run.prune_min_results` full candidates' curves known (in the first seconds of a whole-machine job the fastest
candidates finish and give the rule its peers; were the first finishers counted as drawn, the weak majority of them
would set the median and the drawn fates would not be met). A cancel stops a simulated task at once, so a
candidate pruned after epoch 2 takes 2/6 of its training: as short as the rule allows (a real trainer sees the
cancel at its next epoch's end, one epoch later: the simulation asks more of the master than a real run of this
mix).
"""
from __future__ import annotations

import argparse
import bisect
import dataclasses
import heapq
import io
import itertools
import json
import math
import pickle
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import NamedTuple

import galapagos.launch.runtime as runtime
from bench.master_cost import timed_source
from galapagos.config import load_config
from galapagos.evolve.ahead import START_WAIT, Ahead
from galapagos.evolve.problem import Problem
from galapagos.flows.evolution_source import Median
from galapagos.launch.protocol import (Alive, Cancel, Liveness, Progress, RankFailed, Ready, Result, Status, Stop,
                                       Stopped, Task)

EPOCHS = 6  # train.epochs' default
PRUNE_AFTER = 2  # run.prune_after's default: the first epoch the median rule judges
TASK_TIMEOUT = 600.0  # run.task_timeout of the simulated run: ten median trainings


class Fate(NamedTuple):
    name: str
    share: float  # fraction of the tasks
    epochs: int  # epochs it reports: all of them, or those after which the rule prunes it; 0: drawn in _run
    status: Status  # how it ends if the master does not stop it first


# What a task does, drawn per task. Seconds are those of its full training (lognormal, `--median`, `--sigma`)
# times the share of the epochs it runs. The fractions follow the journals of real runs with the default pruning:
# bench.search's 8-minute evolution runs pruned 73-82% of their candidates (bench/history/search.md: 980 of 1,281,
# 677 of 902, 86 of 109, 84 of 102, 56 of 72, 41 of 56), and the demo run's journal (runs/demo, 129 evaluations)
# shows 90% of its pruned candidates stopped at the first epoch the rule judges, the rest spread over the later ones.
MIX = (
    Fate("pruned@2", 0.690, 2, Status.OK),  # most pruned candidates: stopped after 2 of 6 epochs, the earliest
    Fate("pruned@3", 0.040, 3, Status.OK),  # the rest of the pruned 76.5% (the runs' middle), one epoch later each
    Fate("pruned@4", 0.020, 4, Status.OK),
    Fate("pruned@5", 0.015, 5, Status.OK),
    Fate("full", 0.220, EPOCHS, Status.OK),  # trained to the end: the runs' 18-27% finished
    Fate("crash", 0.010, 0, Status.CRASHED),  # trainer dies at a uniform point of its training (out of memory, ...)
    Fate("timeout", 0.005, 0, Status.TIMEOUT),  # too slow a network: runs the whole run.task_timeout
)
assert abs(sum(f.share for f in MIX) - 1.0) < 1e-9


def curve_value(epoch: int) -> float:
    """A full candidate's fitness after `epoch` epochs (exact in binary: the median rule compares equal values)."""
    return 1.0 - 0.5 ** epoch


class Clock:
    """Real time, less the time the simulated workers took, plus the jumps taken while the master had nothing to
    do."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.sim_cpu = 0.0  # CPU seconds spent simulating the workers (not the master's)
        self.asides = 0
        self._began: list[tuple[float, float]] = []
        self.leak = 0.0
        self.leak = self._calibrate()

    def time(self) -> float:
        return time.time() + self.offset

    def jump(self, to: float) -> None:
        self.offset += max(0.0, to - self.time())

    def aside(self) -> "Clock":
        """`with clock.aside():` time spent in the block is the simulated workers': it moves neither the clock nor
        the master's CPU."""
        return self

    def __enter__(self) -> None:
        self._began.append((time.perf_counter(), time.process_time()))

    def __exit__(self, *exc) -> None:
        cpu, wall = time.process_time(), time.perf_counter()
        began_wall, began_cpu = self._began.pop()
        self.offset -= wall - began_wall
        self.sim_cpu += cpu - began_cpu
        self.asides += 1

    def _calibrate(self, n: int = 200_000) -> float:
        """CPU seconds an empty `aside` costs outside its own measurement (a few per task, about 1 us each): the
        simulation's, not the master's, taken off with `simulation_cpu`."""
        offset, sim, cpu = self.offset, self.sim_cpu, time.process_time()
        for _ in range(n):
            with self.aside():
                pass
        leak = (time.process_time() - cpu - (self.sim_cpu - sim)) / n
        self.offset, self.sim_cpu, self.asides = offset, sim, 0
        return leak

    def simulation_cpu(self) -> float:
        """CPU seconds the simulated workers took, with what measuring them cost."""
        return self.sim_cpu + self.asides * self.leak


class Message:
    """A received message: its bytes, unpickled by the master as mpi4py's Message.recv does."""

    def __init__(self, data: bytes):
        self.data = data

    def recv(self):
        return pickle.loads(self.data)


class _WorkerUnpickler(pickle.Unpickler):
    """How a simulated worker reads a message: a task's payload (the genome and its training) is not rebuilt, as a
    real worker rebuilds it on its own node. Rebuilt here, in rank 0's process, it took most of the simulation's
    time, during which the clock stood still while the breeding helper went on breeding on the other core: the
    first round looked twice as fast as the helper can breed it. A draw (evolve/drawn.py) is drawn, as its worker
    does, for the genome its Result carries back (the payload's echo); that time is the simulation's too."""

    def find_class(self, module: str, name: str):
        if (module, name) == ("galapagos.evolve.task", "_unpickle_task"):
            return _payload
        return super().find_class(module, name)


def _payload(*args) -> None:
    return None


class SimComm:
    """Rank 0's view of N simulated worker ranks: what it sends them schedules what they answer, and when."""

    rank = 0
    unpickler = _WorkerUnpickler  # how a worker reads what rank 0 sends it

    def __init__(self, workers: int, clock: Clock, median: float, sigma: float, seed: int, per_node: int = 4,
                 beat: float = Liveness.interval) -> None:
        self.beat = beat  # run.heartbeat: seconds of silence after which a worker sends Alive
        self.size, self.clock, self.rng, self.per_node = workers + 1, clock, random.Random(seed), per_node
        self.mu, self.sigma = math.log(median), sigma
        self.events: list = []  # (time, seq, message) heap
        self.seq = itertools.count()
        self.free_at = [0.0] * (workers + 1)  # when each worker finishes what it holds
        self.cancelled: set[int] = set()
        self.last: dict[int, tuple[float, list]] = {}  # running task id -> (when it started, its curve)
        self.spans: dict[tuple[int, int], list] = {}  # (task id, worker) -> [start, end, worker] of its time on it
        self.first_task: dict[int, float] = {}  # worker -> when its first task started
        self.dead: dict[int, float] = {}  # worker -> when its node died
        self.fates: Counter = Counter()  # drawn fate -> tasks
        self.pruned_at: Counter = Counter()  # epochs reported -> tasks the master pruned after them
        self.answered = 0  # results the master received
        self.reported: dict[int, int] = {}  # running task id -> epochs it reported to the master
        self.echoes: dict[int, dict] = {}  # task id -> what its worker adds to its Result (a drawn genome)
        self.samples: list[tuple[float, float, int]] = []  # (clock, the master's CPU seconds so far, answered)
        self._cdf = list(itertools.accumulate(f.share for f in MIX))
        now = clock.time()
        for rank in range(1, workers + 1):
            self._push(now, Ready(rank, self.host(rank), "cuda:0"))

    def host(self, rank: int) -> str:
        return f"node{(rank - 1) // self.per_node}"

    def kill_node(self, node: int, when: float, reported: bool) -> list[int]:
        """At `when`, every worker of `node` dies: nothing more comes from them, the time they spent on a task they
        never finished is lost. `reported`: MPI tells rank 0 at once (ULFM; the master's path is that of a rank that
        says it failed, RankFailed); else rank 0 finds the silence (its heartbeat timeout)."""
        ranks = [r for r in range(1, self.size) if self.host(r) == f"node{node}"]
        for rank in ranks:
            self.dead[rank] = when
            if reported:
                self._push(when, RankFailed(rank, "MPI reports its process dead"))
        return ranks

    def lost_seconds(self) -> float:
        """Worker-seconds the dead spent on tasks they did not finish (their spans end at the death)."""
        return sum(min(b, self.dead[r]) - a for (a, b, r) in self.spans.values()
                   if r in self.dead and a < self.dead[r] < b)

    def _push(self, when: float, obj) -> None:
        heapq.heappush(self.events, (when, next(self.seq), obj))

    def improbe(self, source=None, tag=None):
        with self.clock.aside():
            self._sample()
            data = self._arrived()
        return None if data is None else Message(data)

    def _sample(self) -> None:
        """Once a second of the clock: the master's CPU time so far (less the simulation's) and results so far."""
        now = self.clock.time()
        if not self.samples or now >= self.samples[-1][0] + 1.0:
            self.samples.append((now, time.process_time() - self.clock.simulation_cpu(), self.answered))

    def steady(self, begin: float, end: float) -> tuple[float, float]:
        """(results per second, the master's CPU seconds per second) between the samples nearest inside [begin,
        end]."""
        inside = [s for s in self.samples if begin <= s[0] <= end]
        if len(inside) < 2 or inside[-1][0] - inside[0][0] < 1.0:
            return 0.0, 0.0
        (t0, cpu0, n0), (t1, cpu1, n1) = inside[0], inside[-1]
        return (n1 - n0) / (t1 - t0), (cpu1 - cpu0) / (t1 - t0)

    def _arrived(self) -> bytes | None:
        while self.events and self.events[0][0] <= self.clock.time():
            when, _, obj = heapq.heappop(self.events)
            if obj.rank in self.dead and when >= self.dead[obj.rank] and not isinstance(obj, RankFailed):
                continue  # its node is dead
            if isinstance(obj, Result) and obj.status not in (Status.PRUNED, Status.CANCELLED):
                self.last.pop(obj.id, None)
                if obj.id in self.cancelled:  # a cancelled task says nothing more, but for the answer to its cancel
                    self.cancelled.discard(obj.id)
                    continue
            elif isinstance(obj, Progress) and obj.id in self.cancelled:
                continue
            if isinstance(obj, Result):
                self.answered += 1
                self.reported.pop(obj.id, None)
                self.echoes.pop(obj.id, None)
            elif isinstance(obj, Progress):
                self.reported[obj.id] = obj.metrics["epoch"]
            return pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
        return None

    def utilization(self, begin: float, end: float) -> float:
        """Worker-seconds spent on tasks within [begin, end] over all the worker-seconds there were."""
        busy = sum(max(0.0, min(b, end, self.dead.get(r, b)) - max(a, begin)) for a, b, r in self.spans.values())
        alive = sum(max(0.0, min(end, self.dead.get(r, end)) - begin) for r in range(1, self.size))
        return busy / max(alive, 1e-9)

    def next_event(self) -> float | None:
        return self.events[0][0] if self.events else None

    def send(self, obj, dest: int, tag=None) -> None:
        data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)  # the master's share of an MPI send
        with self.clock.aside():
            self._sample()
            self._receive(self.unpickler(io.BytesIO(data)).load(), dest)

    def _receive(self, obj, dest: int) -> None:
        now = self.clock.time()
        if isinstance(obj, Task):
            self._run(obj, dest, now)
        elif isinstance(obj, Cancel):
            self.cancelled.add(obj.id)
            started, curve = self.last.get(obj.id, (now, []))
            reported = self.reported.pop(obj.id, 0)
            fitness = max(curve[:reported], default=None)
            if obj.status == Status.PRUNED:
                self.pruned_at[reported] += 1
            self._push(now, Result(obj.id, dest, "", obj.status, fitness if obj.status == Status.PRUNED else None,
                                   started, now, self.echoes.pop(obj.id, {})))
            self.free_at[dest] = now  # its queue moves on at once (prefetch is 0 for minute-long tasks)
            if (obj.id, dest) in self.spans:
                self.spans[obj.id, dest][1] = min(self.spans[obj.id, dest][1], now)
        elif isinstance(obj, Stop):
            self._push(now, Stopped(dest))

    def _beats(self, rank: int, start: float, sends: list[float]) -> None:
        """A worker's Alive every `beat` seconds in which it sends nothing else (launch/heartbeat.py: Pulse)."""
        last = start
        for when in sends:
            beat = last + self.beat
            while beat < when:
                self._push(beat, Alive(rank))
                beat += self.beat
            last = when

    def prime(self, source, config) -> None:
        """The peers the median rule has once the run is under way (see MIX)."""
        for inherited in (False, True):
            for epoch in range(1, EPOCHS + 1):
                source.by_epoch[inherited, epoch] = Median([curve_value(epoch)] * config.run.prune_min_results)

    def _fate(self) -> Fate:
        return MIX[min(bisect.bisect(self._cdf, self.rng.random()), len(MIX) - 1)]

    def _run(self, task: Task, rank: int, now: float) -> None:
        """Schedule what the worker sends for `task` (see MIX): every epoch's Progress, then its Result, unless a
        cancel comes first."""
        start = max(now, self.free_at[rank])
        self.first_task.setdefault(rank, start)
        training = self.rng.lognormvariate(self.mu, self.sigma)  # its full training's seconds
        quality = self.rng.random()
        fate = self._fate()
        self.fates[fate.name] += 1
        seconds, status, epochs = training, fate.status, EPOCHS
        curve = [curve_value(e) for e in range(1, EPOCHS + 1)]
        if fate.status == Status.TIMEOUT:
            seconds = task.time_limit
            epochs = int(EPOCHS * self.rng.random())
            training = seconds * EPOCHS / (epochs + 1)  # its epochs are slow: the limit comes first
        elif fate.status == Status.CRASHED:
            seconds = training * self.rng.random()
            epochs = int(EPOCHS * seconds / training)
        elif fate.epochs < EPOCHS:  # pruned after epoch `fate.epochs` by the master's rule (else it runs on)
            curve = [curve_value(fate.epochs - 1)] * EPOCHS
        if status == Status.OK:
            curve[-1] += 0.5 ** EPOCHS * quality  # the final fitness ranks the candidates for the engine
        times = [start + training * e / EPOCHS for e in range(1, epochs + 1)]
        for epoch, when in enumerate(times, 1):
            self._push(when, Progress(task.id, rank, {"epoch": epoch, "fitness": curve[epoch - 1]}))
        end = start + seconds
        self._beats(rank, start, times + [end])
        fitness = curve[-1] if status == Status.OK else None
        self.last[task.id] = (start, curve)
        self.spans[task.id, rank] = [start, end, rank]
        echo = getattr(task.payload, "echo", None) or {}
        if echo:
            self.echoes[task.id] = echo
        self._push(end, Result(task.id, rank, self.host(rank), status, fitness, start, end,
                               {"epochs": epochs, **echo} if fitness is not None else dict(echo)))
        self.free_at[rank] = end


def one(workers: int, minutes: float, median: float, sigma: float, breeder_workers: int | None = None, *,
        per_node: int = 4, kill_at: float | None = None, reported: bool = False, keep: str | None = None,
        comm_class: type = SimComm, settings: tuple[str, ...] = (), problem: Problem | None = None, seed: int = 0,
        report=None) -> dict:
    """One scale, in this process: the master served for `minutes` of virtual time. `kill_at`: minutes after the
    start at which one node (the middle one) dies, `reported` by MPI (ULFM) or found by its silence. `keep`: a
    folder where the run directory (`keep`/run) stays, instead of a temporary one. `comm_class`, `settings` (config
    values), `problem`, `seed` and `report` (comm, source, start, end -> more of the result, called before the run
    directory goes) serve other simulations (bench/search_scale.py)."""
    problem = problem or Problem((3, 32, 32), "classification", 10)
    config = load_config(None, [f"run.task_timeout={TASK_TIMEOUT}", f"run.prune_after={PRUNE_AFTER}",
                                f"train.epochs={EPOCHS}", *settings]
                         + ([] if breeder_workers is None else [f"evolution.breeder_workers={breeder_workers}"]))
    config = dataclasses.replace(config, evolution=config.evolution.sized(workers))  # as flows.evolution.check
    liveness = config.run.liveness("", workers)  # run.heartbeat = "auto"
    clock = Clock()
    comm = comm_class(workers, clock, median, sigma, seed=seed, per_node=per_node, beat=liveness.interval)

    class Backoff:  # the master's idle sleep: jump to the next worker event instead
        def reset(self) -> None:
            pass

        def sleep(self) -> None:
            with clock.aside():
                when = comm.next_event()
            if when is not None:
                clock.jump(when)

    saved = runtime.time, runtime.Backoff
    runtime.time, runtime.Backoff = clock, Backoff  # master_serve reads time.time() only
    try:
        with tempfile.TemporaryDirectory() as tmp:
            source, appends = timed_source(keep or tmp, problem, config, workers)
            comm.prime(source, config)
            if isinstance(source.engine, Ahead):  # its start overlaps sharing the data in a run: let it start
                source.engine.up.poll(START_WAIT)
            start = clock.time()
            dead = [] if kill_at is None else comm.kill_node(workers // per_node // 2, start + 60 * kill_at, reported)
            cpu = time.process_time()
            try:
                state = runtime.master_serve(comm, source, deadline=start + 60 * minutes, prefetch=0, liveness=liveness)
            finally:
                source.engine.close()
                source.run.close()  # the journal on disk, as the session's end leaves it
            cpu = time.process_time() - cpu - clock.simulation_cpu()
            wall = clock.time() - start
            more = report(comm, source, start, min(start + wall, start + 60 * minutes)) if report else {}
            helper = resource.getrusage(resource.RUSAGE_CHILDREN)  # the breeding helper, if any
            helper_cpu = helper.ru_utime + helper.ru_stime
    finally:
        runtime.time, runtime.Backoff = saved
    done = source.done
    ramp = max(comm.first_task.values()) - start
    end = min(start + wall, start + 60 * minutes)  # the deadline: what follows is the job's stop
    rate, share = comm.steady(start + ramp, end)
    return {"workers": workers, "virtual_minutes": round(wall / 60, 2), "tasks": done,
            "master_cpu_us_per_task": round(1e6 * cpu / max(done, 1), 1),
            "breeder_cpu_us_per_task": round(1e6 * helper_cpu / max(done, 1), 1),
            "utilization": round(comm.utilization(start, end), 4),
            "ramp_seconds": round(ramp, 2),
            "steady_utilization": round(comm.utilization(start + ramp, end), 4),
            "stop_seconds": round(start + wall - end, 2),
            "steady_tasks_per_s": round(rate, 1),
            "master_cpu_share_steady": round(share, 3),
            "breeder_cpu_share": round(helper_cpu / max(wall, 1e-9), 3),
            "journal_lines_per_s": round(len(appends) / max(sum(appends), 1e-9)),
            "master_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "by_status": dict(source.by_status),
            "mix": dict(comm.fates),
            "pruned_at_epoch": dict(sorted(comm.pruned_at.items())),
            "lost": len(state.lost), **more,
            **(_after_death(comm, source, state, dead, start + 60 * kill_at, end) if dead else {})}


def _after_death(comm: SimComm, source, state, dead: list[int], died: float, end: float) -> dict:
    """What one node's death cost: seconds until rank 0 gave its workers up (their tasks back to the queue), the
    worker-seconds lost on unfinished tasks, the tasks sent again, and the other workers' utilization after it."""
    return {"node_workers": len(dead),
            "given_up_after_s": round(max(state.lost_at[r] for r in dead) - died, 2),
            "lost_worker_seconds": round(comm.lost_seconds(), 1),
            "tasks_sent_again": sum(source.tries.values()),
            # what a restart of the whole job would lose instead: every worker's unfinished task
            "running_worker_seconds": round(sum(died - a for a, b, _ in comm.spans.values() if a < died < b), 1),
            "utilization_after_death": round(comm.utilization(died, end), 4)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, nargs="+", default=[1000, 27648, 75264, 127488])
    p.add_argument("--minutes", type=float, default=5.0, help="virtual minutes of search per scale")
    p.add_argument("--median", type=float, default=60.0, help="median seconds of a task")
    p.add_argument("--sigma", type=float, default=0.6, help="lognormal sigma of task seconds (tail)")
    p.add_argument("--breeder-workers", type=int, default=None,
                   help="[evolution] breeder_workers (default: the configuration's)")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a single scale, in this process
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.workers[0], args.minutes, args.median, args.sigma, args.breeder_workers)), flush=True)
        return
    for n in args.workers:
        in_fresh_process("bench.scale", ["--workers", n, "--minutes", args.minutes, "--median", args.median,
                                         "--sigma", args.sigma]
                         + ([] if args.breeder_workers is None else ["--breeder-workers", args.breeder_workers]))


def in_fresh_process(module: str, args: list) -> None:
    """`python -m module --one ARGS`, a measurement in a process of its own (its peak memory its own): its line."""
    proc = subprocess.run([sys.executable, "-m", module, "--one", *map(str, args)], capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{module} {' '.join(map(str, args))} failed:\n{proc.stderr}")
    print(proc.stdout.strip(), flush=True)


if __name__ == "__main__":
    main()
