"""The master/worker runtime: steady-state dispatch of tasks over MPI, with progress, cancellation and limits.

The master never waits on one worker: it polls for any message, hands the next task to whichever worker is free,
and sleeps briefly (Backoff) only when nothing happened, so it takes no CPU from training.
"""
from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from launch.protocol import TAG, Cancel, Progress, Ready, Result, Status, Stop, Task
from launch.mpi import Backoff
from launch.supervisor import Supervisor

log = logging.getLogger(__name__)

STOP_GRACE = 30.0  # seconds the master waits for cancelled tasks to report before it stops the workers anyway


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
        """Called about once a second and at each event, for progress displays."""


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

    @property
    def busy(self) -> int:
        return len(self.running)


SHORT_TASK = 1.0  # seconds: below this mean task time, dispatch latency matters and workers get a queued task

# A scheduler warns a job ahead of its wall time with SIGUSR1 (Slurm --signal, LSF -wa, the job script's watchdog)
# and ends it with SIGTERM. The master ends the run cleanly on either; workers ignore SIGUSR1 (its default action
# kills) and leave when the master says STOP.
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
_stop_signals: list[int] = []


def catch_stop_signals() -> None:
    """From now on SIGUSR1 and SIGTERM only record a request to stop (see stop_signal)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda s, frame: _stop_signals.append(s))


def announce_ready(comm: Any) -> None:
    """Under a `galapagos launch` job script: once every rank catches stop signals (all have passed
    catch_stop_signals), tell the script, which only then passes a SIGUSR1 on (a rank still starting would die)."""
    path = os.environ.get("GALAPAGOS_READY_FILE")
    if path:
        comm.Barrier()
        if comm.rank == 0:
            Path(path).touch()


def stop_signal() -> str | None:
    """The name of the first stop signal received, or None."""
    return signal.Signals(_stop_signals[0]).name if _stop_signals else None


def master_serve(comm: Any, source: TaskSource, *, deadline: float | None = None, prefetch: int | None = None,
                 tick: float = 1.0, stop: Callable[[], Any] | None = None) -> MasterState:
    """Run tasks from `source` on every other rank until it is finished or `deadline` (time.time()) passes.

    `stop` (e.g. stop_signal) is polled: once it returns something true the run ends as at the deadline: running
    tasks are cancelled (not recorded as evaluations, so a resumed run breeds afresh) and the workers stopped.

    `prefetch` tasks are kept queued on each worker beyond the one it runs, to hide dispatch latency. None means
    automatic: one while tasks are short (under SHORT_TASK seconds on average), else none, so that long tasks are
    bred from the freshest results and no worker idles at the end while another still holds a queued task.
    """
    state = MasterState(workers=comm.size - 1)
    slots: dict[int, int] = {}  # worker rank -> tasks it holds
    backoff = Backoff()
    last_tick = 0.0
    cancelled_at: float | None = None
    mean_seconds: float | None = None

    def send(obj: Any, dest: int) -> None:
        comm.send(obj, dest=dest, tag=TAG)

    while True:
        event = False
        # 1. everything that has arrived
        while True:
            msg = comm.improbe(tag=TAG)
            if msg is None:
                break
            event = True
            obj = msg.recv()
            if isinstance(obj, Result):
                entry = state.running.pop(obj.id, None)
                if entry is None:
                    continue
                seconds = max(0.0, obj.ended - obj.started)
                state.busy_seconds += seconds
                mean_seconds = seconds if mean_seconds is None else 0.9 * mean_seconds + 0.1 * seconds
                slots[obj.rank] -= 1
                source.on_result(obj)
            elif isinstance(obj, Progress):
                if obj.id in state.running and not state.stopping:
                    status = source.on_progress(obj)
                    if status:
                        send(Cancel(obj.id, status), obj.rank)
            elif isinstance(obj, Ready):
                state.hosts[obj.rank], state.devices[obj.rank] = obj.host, obj.device
                slots[obj.rank] = 0
        # 2. the end: deadline or budget
        now = time.time()
        why = None
        if not state.stopping:
            if deadline is not None and now >= deadline:
                why = "time budget reached"
            elif stop is not None and (reason := stop()):
                why = f"stop requested ({reason})"
        if why:
            state.stopping, cancelled_at = True, now
            log.info("%s: cancelling %d running task(s)", why, len(state.running))
            for task_id, (rank, _) in list(state.running.items()):
                send(Cancel(task_id, Status.CANCELLED), rank)
        if state.stopping and cancelled_at is not None and now - cancelled_at > STOP_GRACE:
            log.warning("%d task(s) did not report after cancellation; stopping anyway", len(state.running))
            break
        # 3. keep every worker busy
        if not state.stopping:
            depth = prefetch if prefetch is not None else int(mean_seconds is not None and mean_seconds < SHORT_TASK)
            for rank in sorted(slots, key=slots.get):
                while slots[rank] <= depth:
                    task = source.next_task()
                    if task is None:
                        break
                    state.running[task.id] = (rank, task)
                    slots[rank] += 1
                    send(task, rank)
                    event = True
                else:
                    continue
                break
            if source.finished() and not state.running:
                break
        elif not state.running:
            break
        if event or now - last_tick >= tick:
            source.on_tick(state)
            last_tick = now
        if event:
            backoff.reset()
        else:
            backoff.sleep()
    for rank in range(1, comm.size):
        send(Stop(), rank)
    source.on_tick(state)
    return state


def worker_serve(comm: Any, supervisor: Supervisor, device: str) -> None:
    """Serve the master until STOP: receive tasks and cancels, stream progress and results back."""
    import socket

    comm.send(Ready(comm.rank, socket.gethostname(), device), dest=0, tag=TAG)
    backoff = Backoff()
    try:
        while True:
            msg = comm.improbe(source=0, tag=TAG)
            events: list = []
            if msg is not None:
                obj = msg.recv()
                if isinstance(obj, Stop):
                    break
                if isinstance(obj, Task):
                    events += supervisor.submit(obj)
                elif isinstance(obj, Cancel):
                    events += supervisor.cancel(obj.id, obj.status)
            # While a task runs, wait on the child's pipe (select: no CPU) rather than sleeping blind.
            events += supervisor.poll(0.0 if msg is not None else (0.01 if supervisor.busy else 0.0))
            for ev in events:
                comm.send(ev, dest=0, tag=TAG)
            if msg is not None or events:
                backoff.reset()
            elif not supervisor.busy:
                backoff.sleep()
    finally:
        supervisor.stop()
