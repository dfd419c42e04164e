"""Packing: several candidates trained at once on one worker rank's device (run.pack), each in a trainer child of
its own under its own Supervisor; the master counts the rank's capacity in candidates (protocol.Ready). Where the
rank spreads its candidates over several devices instead (run.spread), its one child is a Spread group
(launch/spread.py)."""
from __future__ import annotations

import dataclasses
import logging
import subprocess
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from galapagos.launch.placement import core_count
from galapagos.launch.protocol import Result, Status, Task
from galapagos.launch.spread import Spread, spread_width
from galapagos.launch.supervisor import Children, Supervisor

log = logging.getLogger(__name__)

# run.pack = "auto" on a GPU: the first candidate trains alone and measures its peak memory; then as many train at
# once as fit in MEMORY_SHARE of the memory the device still had free, each counted as its peak plus a quarter (the
# caching allocator's blocks) plus CONTEXT_BYTES (its own CUDA context, cuBLAS and cuDNN workspaces), at most one per
# physical core of the rank (each child's host thread feeds its kernels: a small network is launch-bound) and at
# most PACK_MAX.
PACK_MAX = 8
MEMORY_SHARE = 0.8
CONTEXT_BYTES = 512 << 20
MEASURED = "galapagos.launch.packing:measured"


def auto_capacity(peak: int, free: int, cores: int) -> int:
    """The candidates one GPU trains at once under run.pack = "auto" (the rule above): `peak`, the first candidate's
    torch.cuda.max_memory_allocated; `free`, torch.cuda.mem_get_info's free bytes once it ended, its child still up."""
    each = 1.25 * peak + CONTEXT_BYTES
    return max(1, min(PACK_MAX, cores, 1 + int(MEMORY_SHARE * free // each)))


def out_of_memory(result: Result) -> bool:
    """A task that ran out of memory: torch.cuda.OutOfMemoryError (or the host's MemoryError), status oom
    (trainer.status_of)."""
    return result.status == Status.OOM


@dataclasses.dataclass(frozen=True)
class Measured:
    """A task's payload with the function that runs it, for `measured` (the children of an "auto" pack)."""

    task_fn: str
    payload: Any

    @property
    def save(self) -> str | None:  # where the trainer looks for the file a refused write names
        return getattr(self.payload, "save", None)


def measured(job: Measured, ctx: Any) -> dict:
    """Run in a trainer child: the task's own function, with its GPU's peak memory and the memory left free in
    its metrics (`gpu_peak_bytes`, `gpu_free_bytes`), from which an "auto" pack sizes itself."""
    import torch

    from galapagos.evolve.settings import load_function

    key = ("measured", job.task_fn)
    if key not in ctx.cache:
        ctx.cache[key] = load_function(job.task_fn, "task function")
    torch.cuda.init()  # the caching allocator's statistics exist once CUDA is initialized: before, "Invalid device"
    torch.cuda.reset_peak_memory_stats(ctx.device)
    out = ctx.cache[key](job.payload, ctx) or {}
    free, _ = torch.cuda.mem_get_info(ctx.device)
    metrics = {**out.get("metrics", {}), "gpu_peak_bytes": torch.cuda.max_memory_allocated(ctx.device),
               "gpu_free_bytes": free}
    return {**out, "metrics": metrics}


class Pack(Children):
    """The trainer children of one worker rank, all on its one device, each a Supervisor running one task at a
    time: `capacity` tasks train at once (run.pack), those beyond wait here for a free child. k Supervisors rather
    than one holding k children: each keeps its own time limit, cancel and crash handling as it was, and this only
    routes. A task that ran out of memory beside others is run once more alone: no new task starts until the
    others have ended and it has (its Result says so: `retried_alone` in its metrics)."""

    def __init__(self, rank: int, task_fn: str) -> None:
        self.rank, self.task_fn = rank, task_fn
        self.measure = self.sizing = False  # children measure each task's memory; the capacity waits for it
        self.children: list[Supervisor | Spread] = [Supervisor(rank, task_fn)]  # a Spread: run.spread (place)
        self.where: dict = {}  # place()'s keywords, for children added later
        self.data: dict | None = None
        self.queue: deque[Task] = deque()
        self.holder: dict[int, tuple[Supervisor, Task]] = {}  # running task id -> its child, the task as sent
        self.crowded: set[int] = set()  # running tasks that shared the device with another
        self.alone: Task | None = None  # one to run again alone, once the others have ended
        self.retried: set[int] = set()
        self._waiting: Callable[[], object] = lambda: None

    @property
    def capacity(self) -> int:
        return len(self.children)

    @property
    def proc(self) -> subprocess.Popen | None:
        """The first child's process."""
        return self.children[0].proc

    def place(self, task_fn: str, *, cores: list[int] | None = None, device: str = "cpu",
              devices: tuple[str, ...] = (), log_path: Path | None = None, pack: int | str = 1,
              spread: int | str = 1, gang: bool = False) -> None:
        """Supervisor.place for every child, and how many (`pack`: "auto" is one until the first candidate has
        measured its memory, and stays one off a CUDA or ROCm GPU). `spread` (run.spread) over more than one of
        `devices` (those the rank owns, `device` first) makes the one child a Spread group, and the pack one; so
        does a `gang` of several ranks (run.spread_ranks, launch/gang.py), over one device too."""
        self.task_fn = task_fn
        width = spread_width(spread, devices or (device,), self.rank)
        if width > 1 or gang:
            if pack != 1:
                log.info("worker rank %d spreads its candidates over %d children: run.pack = %s is 1", self.rank,
                         width, pack)
            pack = 1
            owned = devices[:width] if device != "cpu" else (device,) * width
            self.children[0] = Spread(self.children[0], owned, spread == "auto", task_fn)
        self.measure = self.sizing = pack == "auto" and device.startswith("cuda")
        self.where = {"cores": cores, "device": device, "log_path": log_path}
        self.resize(pack if isinstance(pack, int) else 1)

    def resize(self, k: int) -> None:
        """`k` children (more are started at once); each gets its share of the rank's cores as threads."""
        while len(self.children) < k:
            child = Supervisor(self.rank, self.task_fn)
            child.waiting = self._waiting
            child.attach(self.data)
            if self.where:  # started on the task function itself, so that it imports torch (not the measuring one)
                child.start()
            self.children.append(child)
        cores, log_path = self.where.get("cores"), self.where.get("log_path")
        threads = max(1, (core_count(cores) if cores else 1) // k)
        for i, child in enumerate(self.children):
            path = log_path if i == 0 or log_path is None else log_path.with_name(f"{log_path.stem}.{i}.log")
            child.place(MEASURED if self.measure else self.task_fn, cores=cores, device=self.where.get("device", "cpu"),
                        log_path=path, threads=threads)
        if self.where:
            self.start()

    def attach(self, data: dict | None) -> None:
        self.data = data
        for child in self.children:
            child.attach(data)

    @property
    def busy(self) -> bool:
        return bool(self.holder or self.queue or self.alone)

    def submit(self, task: Task) -> list:
        if self.measure:
            task = Task(task.id, Measured(self.task_fn, task.payload), task.time_limit)
        self.queue.append(task)
        return self._dispatch()

    def cancel(self, task_id: int, status: Status) -> list:
        """A queued task ends at once; a running one through its child (Supervisor.cancel)."""
        waiting = [t for t in [*self.queue, self.alone] if t is not None and t.id == task_id]
        if waiting:
            if waiting[0] is self.alone:
                self.alone = None
                self.retried.discard(task_id)
            else:
                self.queue.remove(waiting[0])
            now = time.time()
            return [Result(task_id, self.rank, self.children[0].host, status, None, now, now)] + self._dispatch()
        if task_id in self.holder:
            return self.holder[task_id][0].cancel(task_id, status)
        return []

    def _dispatch(self) -> list:
        """Start what may start: the task to retry alone once every child is free, else queued tasks on free
        children."""
        events: list = []
        free = [c for c in self.children if c.current is None]
        if self.alone is not None:
            if len(free) == len(self.children):
                task, self.alone = self.alone, None
                events += self._run(free[0], task)
            return events
        if self.retried & self.holder.keys():  # one runs alone: the others wait for it
            return events
        while self.queue and free:
            events += self._run(free.pop(), self.queue.popleft())
        return events

    def _run(self, child: Supervisor, task: Task) -> list:
        events = child.submit(task)
        if child.current is task:
            if self.holder:
                self.crowded.update(self.holder, (task.id,))
            self.holder[task.id] = (child, task)
        return events

    def poll(self, timeout: float = 0.0) -> list:
        """Supervisor.poll over every busy child: their progress and results, waiting up to `timeout` seconds on
        their pipes together."""
        running = [c for c in self.children if c.current is not None]
        if running and timeout > 0:  # a gang whose followers alone still train has no pipe here: a short sleep
            if conns := [c.conn for c in running if c.conn is not None]:
                wait(conns, timeout)
            else:
                time.sleep(timeout)
        events: list = []
        for child in running:
            for ev in child.poll(0.0):
                events += [ev] if not isinstance(ev, Result) else self._ended(ev)
        return events + self._dispatch()

    def _ended(self, result: Result) -> list:
        """A task's Result, or none yet when it ran out of memory beside others: it is run again alone."""
        _, task = self.holder.pop(result.id, (None, None))
        crowded = result.id in self.crowded
        self.crowded.discard(result.id)
        if task is None:
            return [result]
        if result.id in self.retried:
            self.retried.discard(result.id)
            error = None if result.error is None else ("out of memory beside other candidates on its device; run "
                                                       f"again alone: {result.error}")
            return [dataclasses.replace(result, metrics={**result.metrics, "retried_alone": 1}, error=error)]
        if crowded and out_of_memory(result):
            log.warning("task %d ran out of memory beside other candidates on %s: running it again alone",
                        result.id, self.where.get("device"))
            self.retried.add(result.id)
            self.alone = task
            return []
        if self.sizing and result.status == Status.OK and "gpu_peak_bytes" in result.metrics:
            self._size(result.metrics)
        return [result]

    def _size(self, metrics: dict) -> None:
        """An "auto" pack's capacity, from its first candidate that ended well (auto_capacity)."""
        cores = self.where.get("cores")
        k = auto_capacity(metrics["gpu_peak_bytes"], metrics["gpu_free_bytes"], core_count(cores) if cores else 1)
        self.sizing = False  # sized once; its children go on measuring
        log.info("worker rank %d packs %d candidates on %s (peak %.0f MiB, %.0f MiB free)", self.rank, k,
                 self.where.get("device"), metrics["gpu_peak_bytes"] / 2**20, metrics["gpu_free_bytes"] / 2**20)
        self.resize(k)

    def stop(self) -> None:
        for child in self.children:
            child.stop()

    def pending(self) -> list[Task]:
        return [t for _, t in self.holder.values()] + list(self.queue) + ([self.alone] if self.alone else [])
