"""The master's runtime: steady-state dispatch of tasks over MPI, with progress, cancellation and limits (the
worker's side is launch/session.py: worker_serve).

The master never waits on one worker: it polls for any message, hands the next task to whichever worker is free,
and sleeps briefly (Backoff) only when nothing happened, so it takes no CPU from training.
"""
from __future__ import annotations

import gc
import heapq
import logging
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from galapagos.launch.heartbeat import Beacon, Silence
from galapagos.launch.mpi import Backoff, failed_ranks
from galapagos.launch.protocol import (TAG, Alive, Cancel, Liveness, Progress, RankFailed, Ready, Result, Serve, Status,
                                       Stop, Stopped, Task)
from galapagos.launch.slots import Slots
from galapagos.launch.supervisor import START_TIMEOUT

log = logging.getLogger(__name__)

Deadline = float | Callable[[], float | None] | None  # a time.time() to end at, or a function polled for it

# Seconds past a task's time limit after which the master gives up the worker rank running it as lost. The rank's
# supervisor kills a task at its limit and reports within seconds, but it may first have had to restart its trainer
# child (up to START_TIMEOUT). A silent rank (SIGSTOP, a hung node) is found by its heartbeat long before
# (Liveness.worker_timeout); this is the backstop for a rank that still answers but never ends its task.
LOST_GRACE = START_TIMEOUT + 60.0
STOPPED_WAIT = 10.0  # seconds to read on after Stop for every worker's answer (protocol.Stopped)


class TaskSource(Protocol):
    """What the master loop drives: the search (or an ensemble, or a benchmark) behind ask/tell."""

    def next_task(self) -> Task | None:
        """The next task to run now, or None if there is none right now."""

    def finished(self) -> bool:
        """True when no task will ever come again (the budget is spent)."""

    def on_result(self, result: Result) -> None: ...

    def on_progress(self, progress: Progress) -> Status | None:
        """Return a status (e.g. Status.PRUNED) to cancel the task, or None to let it go on."""

    def on_tick(self, state: "MasterState") -> None:
        """Called about once a second, every TICK_BUSY seconds while tasks come and go, and when the loop ends: for
        progress displays and writing through what the source buffered."""


@dataclass
class MasterState:
    """What the master knows of its workers, for progress displays and the utilisation figure."""

    workers: int
    running: dict = field(default_factory=dict)  # task id -> (worker rank, Task)
    hosts: dict = field(default_factory=dict)
    devices: dict = field(default_factory=dict)
    busy_seconds: float = 0.0
    started: float = field(default_factory=time.time)
    stopping: bool = False
    ended: bool = False  # the loop is over: the source's last tick
    lost: set[int] = field(default_factory=set)  # worker ranks that stopped answering or failed: sent nothing more
    lost_at: dict = field(default_factory=dict)  # lost worker rank -> when it was given up
    # hosts given up whole: every worker rank there went silent together (a frozen or cut-off node; heartbeat.py)
    lost_nodes: set[str] = field(default_factory=set)
    # ranks whose process MPI reports dead (ULFM: launch.mpi.failures_survivable): they hold up nobody's exit
    failed: set[int] = field(default_factory=set)
    slots: Slots = field(default_factory=Slots)  # tasks each worker rank holds
    followers: dict[int, int] = field(default_factory=dict)  # ranks that take no task -> their gang's leader

    @property
    def busy(self) -> int:
        """Workers with a task (one may also hold a queued one)."""
        return self.slots.busy

    def lost_summary(self) -> dict:
        """For the job's summary: `lost_ranks`, worker ranks that stopped answering (the job ends with EXIT_LOST,
        since MPI would wait for them), and `failed_ranks`, those whose process died where MPI goes on without them
        (ULFM): the job went on."""
        silent = self.lost - self.failed
        return {**({"lost_ranks": sorted(silent)} if silent else {}),
                **({"failed_ranks": sorted(self.failed)} if self.failed else {})}


# Seconds between the source's ticks while results keep coming (a log line per finished task, the journal written
# through, a progress redraw), and at most this long after the last of them: a tick at every round of a busy loop
# was 5% of rank 0's time per task at 27,648 simulated workers (bench/scale.py); once a second (`tick`) when
# nothing happens.
TICK_BUSY = 0.05
SHORT_TASK = 1.0  # seconds: below this mean task time, dispatch latency matters and workers get a queued task

class _Serving:
    """master_serve's state and the loop's steps, cut as mpi4py.futures cuts its loops (client_exec, server_exec in
    mpi4py/futures/_core.py): `receive` drains what arrived and `decide`s on each message, `ended` looks for the
    end (deadline, stop request, silent ranks given up, no worker left), `fill` hands tasks to free workers, `tick`
    lets the source show progress and write through. Slots: state read without dict lookups (bench/dispatch.py,
    bench/master_cost.py time this path)."""

    __slots__ = ("comm", "source", "deadline", "prefetch", "tick_seconds", "stop", "grace", "state", "slots", "sent",
                 "heard", "order", "watch", "last_tick", "last_check", "unticked", "mean_seconds", "silence", "seen",
                 "beacon")

    def __init__(self, comm: Any, source: TaskSource, deadline: Deadline, prefetch: int | None,
                 tick_seconds: float, stop: Callable[[], Any] | None, grace: float, liveness: Liveness) -> None:
        self.comm, self.source, self.prefetch = comm, source, prefetch
        self.deadline = deadline if callable(deadline) else lambda: deadline
        self.tick_seconds, self.stop, self.grace = tick_seconds, stop, grace
        self.state = MasterState(workers=comm.size - 1)
        self.silence = Silence(range(1, comm.size), liveness, time.time(), tick_seconds)
        self.seen = self.silence.seen  # worker rank -> when any message of it last arrived
        self.beacon = Beacon(liveness)  # rank 0's heartbeat file
        self.slots = self.state.slots
        self.sent: dict[int, float] = {}  # task id -> when it was sent
        self.heard: dict[int, float] = {}  # worker rank -> when it last reported a result (its queued task starts then)
        self.order: dict[int, list[int]] = defaultdict(list)  # worker rank -> the ids of the tasks it holds, as sent
        self.watch: list[tuple[float, int]] = []  # heap: (earliest time its rank may be given up as lost, task id)
        self.last_tick = self.last_check = 0.0
        self.unticked = False  # something happened since the source's last tick
        self.mean_seconds: float | None = None

    def send(self, obj: Any, dest: int) -> None:
        try:
            self.comm.send(obj, dest=dest, tag=TAG)
        except Exception as exc:
            if not self.failed(exc):
                raise

    def receive(self, now: float) -> bool:
        """Step 1: everything that has arrived, each message decided on in order; True if there was any but Alive.
        Any message is a sign of life of its rank: one timestamp, nothing more (launch/heartbeat.py)."""
        event, seen = False, self.seen
        while True:
            try:
                msg = self.comm.improbe(tag=TAG)
                if msg is None:
                    return event
                obj = msg.recv()
            except Exception as exc:
                if not self.failed(exc):
                    raise
                continue
            seen[obj.rank] = now
            if obj.__class__ is not Alive:
                event = True
                self.decide(obj)

    def decide(self, obj: Any) -> None:
        """What one message changes: a result frees its worker's slot, progress may cancel its task, a rank that
        failed is given up, a ready one gets slots. Anything else (no other kind comes before Stop) is dropped."""
        state = self.state
        if isinstance(obj, Result):
            entry = state.running.pop(obj.id, None)
            if entry is None:  # a duplicate, or late from a lost rank: the task is already recorded
                return
            self.sent.pop(obj.id, None)
            self.order[entry[0]].remove(obj.id)
            self.heard[obj.rank] = time.time()
            seconds = max(0.0, obj.ended - obj.started)
            state.busy_seconds += seconds
            mean = self.mean_seconds
            self.mean_seconds = seconds if mean is None else 0.9 * mean + 0.1 * seconds
            self.slots.change(obj.rank, -1)
            self.source.on_result(obj)
        elif isinstance(obj, Progress):
            if obj.id in state.running:
                status = self.source.on_progress(obj)
                if status:
                    self.send(Cancel(obj.id, status), obj.rank)
        elif isinstance(obj, RankFailed) and obj.rank not in state.lost:
            self.lose(obj.rank, time.time(), "failed", obj.error)
        elif isinstance(obj, Ready):
            state.hosts[obj.rank], state.devices[obj.rank] = obj.host, obj.device
            if obj.capacity:
                self.slots.add(obj.rank, obj.capacity)
            else:  # it trains its gang leader's tasks (launch/gang.py)
                state.followers[obj.rank] = obj.leader
            self.heard[obj.rank] = time.time()

    def ended(self, now: float) -> bool:
        """Step 2: the end. At the deadline or on a stop request, running tasks are cancelled (and given up at
        once); once a tick, silent ranks are given up, and the loop ends when no worker is left."""
        state = self.state
        why = None
        if (deadline := self.deadline()) is not None and now >= deadline:
            why = "time budget reached"
        elif self.stop is not None and (reason := self.stop()):
            why = f"stop requested ({reason})"
        if why:
            state.stopping = True
            log.info("%s: cancelling %d running task(s) and stopping the workers", why, len(state.running))
            for task_id, (rank, _) in list(state.running.items()):
                self.send(Cancel(task_id, Status.CANCELLED), rank)
            for task_id in list(state.running):
                self.give_up(task_id, Status.CANCELLED, now, now)
            return True
        if now - self.last_check >= self.tick_seconds:
            self.last_check = now
            self.give_up_silent_ranks(now)
            self.give_up_quiet_ranks(now)
            self.beacon.beat(now)
            if len(state.lost | state.followers.keys()) == state.workers:
                log.error("every worker rank that takes tasks stopped answering or failed (%s): ending the run",
                          ", ".join(map(str, sorted(state.lost))))
                return True
        return False

    def fill(self) -> bool:
        """Step 3: keep every worker busy, the least loaded first; True if any task was sent."""
        mean = self.mean_seconds
        depth = self.prefetch if self.prefetch is not None else int(mean is not None and mean < SHORT_TASK)
        slots, source, running, sent = self.slots, self.source, self.state.running, self.sent
        event = False
        while (rank := slots.least_loaded(depth)) is not None:
            task = source.next_task()
            if task is None:
                break
            running[task.id], sent[task.id] = (rank, task), time.time()
            self.order[rank].append(task.id)
            if task.time_limit is not None:
                heapq.heappush(self.watch, (sent[task.id] + task.time_limit + self.grace, task.id))
            slots.change(rank, 1)
            self.send(task, rank)
            event = True
        return event

    def tick(self, now: float, event: bool) -> None:
        """Step 4: the source's tick, every TICK_BUSY seconds while something happens, else every tick."""
        self.unticked = self.unticked or event
        if now - self.last_tick >= (min(TICK_BUSY, self.tick_seconds) if self.unticked else self.tick_seconds):
            self.source.on_tick(self.state)
            self.last_tick, self.unticked = now, False

    def give_up(self, task_id: int, status: Status, started: float, now: float, error: str | None = None) -> None:
        """End a task on the master's word: the source hears of it as of any result (and journals it)."""
        rank, _ = self.state.running.pop(task_id)
        self.sent.pop(task_id, None)
        self.order[rank].remove(task_id)
        self.source.on_result(Result(task_id, rank, self.state.hosts.get(rank, ""), status, None, started, now,
                                     error=error))

    def give_up_silent_ranks(self, now: float) -> None:
        """A rank whose running task (of the first `capacity` it holds: they start in order) is past its time limit
        plus the grace has stopped answering (its supervisor would have reported the timeout): its tasks end as LOST.
        Only tasks whose earliest such time has come are looked at (`watch`), not every running task: at
        whole-machine scale a scan of all of them each second took more of the master than dispatch did."""
        watch, running, grace = self.watch, self.state.running, self.grace
        while watch and watch[0][0] < now:
            _, task_id = heapq.heappop(watch)
            if task_id not in running:
                continue
            rank, task = running[task_id]
            running_now = task_id in self.order[rank][:self.slots.capacity(rank)]  # a packed rank runs several
            began = max(self.sent[task_id], self.heard.get(rank, 0.0)) if running_now else now
            if now <= began + task.time_limit + grace:  # started late, or not yet: look again when it may be due
                heapq.heappush(watch, (began + task.time_limit + grace, task_id))
                continue
            self.lose(rank, now, "stopped answering", f"task {task_id} is {now - began - task.time_limit:.0f} s "
                      f"past its time limit of {task.time_limit:g} s")

    def give_up_quiet_ranks(self, now: float) -> None:
        """Ranks silent past the worker timeout (launch/heartbeat.py: any message counts, a slow task does not
        matter); all the ranks of a node at once when every one there is silent."""
        for ranks, node, why in self.silence.given_up(now, self.state.hosts, self.state.lost):
            if node is not None:
                log.warning("node %s stopped answering: its worker rank(s) %s are silent (%s): giving the node up",
                            node, ", ".join(map(str, ranks)), why)
                self.state.lost_nodes.add(node)
            for rank in ranks:
                self.lose(rank, now, "stopped answering", why)

    def failed(self, exc: BaseException) -> bool:
        """Where MPI goes on without dead processes (ULFM), an operation that met one raises: each dead worker rank
        is given up at once (its tasks go back to the source), a node whose every worker died with it. True if
        that was the error."""
        ranks = failed_ranks(self.comm, exc)
        if ranks is None:
            return False
        state, now = self.state, time.time()
        for rank in sorted(ranks - state.failed - {0}):
            state.failed.add(rank)
            if rank not in state.lost:
                self.lose(rank, now, "failed", "MPI reports its process dead")
        for host in {state.hosts.get(r) for r in ranks} - {None}:
            if all(r in state.failed for r, h in state.hosts.items() if h == host):
                state.lost_nodes.add(host)
        return True

    def lose(self, rank: int, now: float, what: str, why: str) -> None:
        """Give up a worker rank that stopped answering or failed: its tasks end as LOST; it gets no more work."""
        held = list(self.order[rank])
        log.warning("worker rank %d on %s %s (%s): giving up its %d task(s); it gets no more work", rank,
                    self.state.hosts.get(rank, "?"), what, why, len(held))
        self.state.lost.add(rank)
        self.state.lost_at[rank] = now
        self.slots.remove(rank)
        for i in held:
            self.give_up(i, Status.LOST, self.sent[i], now, f"worker rank {rank} {what}")
        for follower in [f for f, lead in self.state.followers.items() if lead == rank and f not in self.state.lost]:
            log.warning("worker rank %d's gang lost its leader: it takes tasks itself", follower)
            del self.state.followers[follower]  # its Ready follows
            self.send(Serve(), follower)


def master_serve(comm: Any, source: TaskSource, *, deadline: Deadline = None, prefetch: int | None = None,
                 tick: float = 1.0, stop: Callable[[], Any] | None = None,
                 lost_grace: float | None = None, liveness: Liveness | None = None) -> MasterState:
    """Run tasks from `source` on every other rank until it is finished or `deadline` (time.time()) passes: a
    time, or a function polled for it (a deadline that moves as the run goes).

    `stop` (e.g. stop_signal) is polled: once it returns something true the run ends as at the deadline: running
    tasks are cancelled (not recorded as evaluations, so a resumed run breeds afresh) and the workers stopped at
    once, without waiting for the cancelled tasks to report: a scheduler kills the job soon after its warning.

    `prefetch` tasks are kept queued on each worker beyond the one it runs, to hide dispatch latency. None means
    automatic: one while tasks are short (under SHORT_TASK seconds on average), else none, so that long tasks are
    bred from the freshest results and no worker idles at the end while another still holds a queued task.

    A worker rank silent for `liveness.worker_timeout` seconds is given up as lost (see MasterState.lost: the caller
    must end the job with launch.session.abort_if_lost), as is one that says it failed (protocol.RankFailed), and
    one that answers but is `lost_grace` (default LOST_GRACE) seconds past the time limit of the task it runs.
    While it serves, rank 0 touches `liveness.master_file` (launch/heartbeat.py), for whoever watches the job.
    Whatever ends the loop, an exception included, every worker not lost is sent Stop, so that no rank waits
    forever; then (but for an exception) the master reads until each has answered (_read_until_stopped).
    """
    loop = _Serving(comm, source, deadline, prefetch, tick, stop, LOST_GRACE if lost_grace is None else lost_grace,
                    liveness or Liveness())
    # The cyclic collector is off while the master serves: its objects live long (the population, every running
    # task) and the loop makes next to no cyclic garbage (tests/test_runtime.py holds it to that), but each
    # collection walked the young ones, a sixth of rank 0's time at 127,488 simulated workers (bench/scale.py).
    state, backoff, collecting = loop.state, Backoff(), gc.isenabled()
    gc.disable()
    try:
        while True:
            now = time.time()
            event = loop.receive(now)
            if loop.ended(now):
                break
            event = loop.fill() or event
            if source.finished() and not state.running:
                break
            loop.tick(now, event)
            if event:
                backoff.reset()
            else:
                backoff.sleep()
    finally:
        loop.beacon.close()
        stopped = [rank for rank in range(1, comm.size) if rank not in state.lost]
        for rank in stopped:
            loop.send(Stop(), rank)
        if sys.exc_info()[0] is None:  # an exception goes on up at once
            _read_until_stopped(comm, stopped, state.failed)
        if collecting:
            gc.enable()
    state.ended = True
    source.on_tick(state)
    return state


def _read_until_stopped(comm: Any, ranks: list[int], failed: set[int]) -> None:
    """Read (and drop: the run is over) whatever the workers sent until each has answered Stop, so that nothing
    stays unread on rank 0 (see protocol.Stopped); MPI keeps each worker's messages in order. A rank that MPI
    reports dead meanwhile (ULFM) joins `failed` and is not waited for."""
    waiting, end, backoff = set(ranks), time.time() + STOPPED_WAIT, Backoff()
    while waiting and time.time() < end:
        try:
            msg = comm.improbe(tag=TAG)
            obj = None if msg is None else msg.recv()
        except Exception as exc:
            if (dead := failed_ranks(comm, exc)) is None:
                raise
            failed |= dead
            waiting -= dead
            continue
        if obj is None:
            backoff.sleep()
        elif isinstance(obj, Stopped):
            waiting.discard(obj.rank)
    if waiting:
        log.warning("worker rank(s) %s did not answer Stop within %g s", ", ".join(map(str, sorted(waiting))),
                    STOPPED_WAIT)
