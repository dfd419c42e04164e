"""Spreading: one candidate trained data-parallel over g devices of a worker rank (run.spread), by g trainer children
that form a torch.distributed group for the task (evolve/distributed.py splits every batch among them).

Each child is a Supervisor of its own, so each keeps its time limit and crash handling as it was; this only routes.
The group's leader (child 0) is the task: its progress and Result are the task's, and a cancel goes to it (it stops
the others at the same epoch). A follower that fails (crashed, out of memory, an error) fails the task: the other
children are killed at once, since they would wait for it in a collective (NCCL notices a dead peer only at its
timeout, minutes later). The worker rank stays one worker of capacity 1 to the master.

The group meets through a torch.distributed FileStore, a new file in the rank's temporary directory for each task:
no port to pick for the rendezvous, and a task tried again never meets a stale one; the children then connect over
the loopback interface. gloo on the CPU, NCCL on CUDA GPUs (RCCL under ROCm, which torch also calls nccl), XCCL on
Intel GPUs.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from galapagos.launch.gang import Remote, store_address
from galapagos.launch.placement import core_count
from galapagos.launch.protocol import Result, Status, Task
from galapagos.launch.supervisor import Children, Supervisor

log = logging.getLogger(__name__)

SPREAD_FN = "galapagos.launch.spread:member"
# run.spread = "auto" spreads a candidate whose estimated memory (evolve.distributed.estimate_memory) is more than
# this share of its GPU's free memory; the rest is left to the caching allocator's blocks and the CUDA context.
MEMORY_SHARE = 0.8
# ... or whose training on one GPU, projected from a few timed steps (evolve.distributed.step_seconds), would take
# more than this share of its time limit (run.task_timeout): the rest is validation, and the steps' spread.
TIME_SHARE = 0.5
BACKENDS = {"cuda": "nccl", "xpu": "xccl"}  # torch.distributed's backend by device kind; gloo for the CPU
STOPPED = (Status.OK, Status.CANCELLED)  # a follower's ends that are not failures: done, or stopped by the leader
# Seconds the children's failures are gathered before the task's is chosen (Spread._fail): one child's failure makes
# the others fail in their next collective, and which Result the worker reads first is a race.
HOLD = 2.0
STORE_TIMEOUT = 300  # seconds a gang's children wait for each other at the TCPStore (a follower's start included)


def spread_width(spread: int | str, devices: tuple[str, ...], rank: int) -> int:
    """How many children train each candidate of this rank: run.spread (a count, or "auto": every GPU the rank
    owns) within the devices it owns (`devices`, launch.placement.Placement.devices). On the CPU a count gives each
    child its share of the rank's cores; "auto" spreads nothing there, where memory is the node's either way."""
    if spread == 1:
        return 1
    if devices[0] == "cpu":
        if spread == "auto":
            log.info("worker rank %d trains on the CPU: run.spread = auto spreads no candidate there", rank)
            return 1
        return int(spread)
    if len(devices) < 2:  # a count asked for is worth a warning; "auto" finds nothing to do
        log.log(logging.INFO if spread == "auto" else logging.WARNING, "worker rank %d owns one device (%s): "
                "run.spread is off (give a node fewer worker ranks than GPUs to spread)", rank, devices[0])
        return 1
    if spread != "auto" and int(spread) > len(devices):
        log.warning("worker rank %d owns %d devices: its candidates spread over %d, not run.spread = %s", rank,
                    len(devices), len(devices), spread)
    return len(devices) if spread == "auto" else min(int(spread), len(devices))


@dataclasses.dataclass(frozen=True)
class Member:
    """A task's payload for one child of a spread group: the task function, the group, and where it meets."""

    task_fn: str
    payload: Any
    rank: int
    size: int
    store: str  # the FileStore's file, or a gang's "tcp://HOST:PORT" (launch/gang.py)
    auto: bool  # the leader decides from the candidate's memory and speed whether the group trains it (run.spread
    # = auto)
    time_limit: float | None = None  # the task's

    @property
    def save(self) -> str | None:  # where the trainer looks for the file a refused write names
        return getattr(self.payload, "save", None)


def member(job: Member, ctx: Any) -> dict:
    """Run in a trainer child of a spread group: the task's own function inside the group's process group (its
    Result is the task's where this is the leader), or alone on the leader where "auto" found that it fits; the
    metrics say over how many devices it trained (`spread`)."""
    import torch.distributed as dist

    from galapagos.evolve.settings import load_function

    key = ("spread", job.task_fn)
    if key not in ctx.cache:
        ctx.cache[key] = load_function(job.task_fn, "task function")
    store = _store(job)
    size = job.size
    if job.auto:
        if job.rank == 0:
            store.set("size", str(size if needs_group(job.payload, ctx, job.time_limit) else 1))
        size = int(store.get("size"))
    if size == 1:  # fits one device: the leader trains it as a one-device candidate; the others have nothing to do
        # (and what a follower returns is never the task's)
        return _spread_over(1, ctx.cache[key](job.payload, ctx)) if job.rank == 0 else {"fitness": 0.0}
    kind = ctx.device.partition(":")[0]
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):  # every child on this node: meet on loopback
        if not job.store.startswith("tcp://"):  # a gang's (launch/gang.py) meet over the network
            os.environ.setdefault(name, "lo")
    if kind != "cpu":  # the collectives' device (NCCL's broadcast of the metrics needs it)
        import torch

        getattr(torch, kind).set_device(ctx.device)
    dist.init_process_group(BACKENDS.get(kind, "gloo"), store=store, rank=job.rank, world_size=size)
    try:
        return _spread_over(size, ctx.cache[key](job.payload, ctx))
    finally:
        dist.destroy_process_group()


def _store(job: Member):
    """The group's meeting place: a FileStore on this node, or a gang's TCPStore, served by its first child."""
    import datetime

    import torch.distributed as dist

    if not job.store.startswith("tcp://"):
        return dist.FileStore(job.store, job.size)
    host, port = job.store.removeprefix("tcp://").rsplit(":", 1)
    return dist.TCPStore(host, int(port), job.size, is_master=job.rank == 0,
                         timeout=datetime.timedelta(seconds=STORE_TIMEOUT))


def _spread_over(size: int, out: dict | None) -> dict:
    out = out or {}
    return {**out, "metrics": {**out.get("metrics", {}), "spread": size}}


def needs_group(payload: Any, ctx: Any, time_limit: float | None) -> bool:
    """run.spread = "auto": whether a candidate's estimated memory is more than MEMORY_SHARE of what its GPU has
    free, or its training there, projected from a few timed steps, more than TIME_SHARE of its time limit. A payload
    that is not a network to train (a custom run.task's) stays on one device, as one that cannot be built or timed
    (a custom train.builder's, a streamed training split) does."""
    import torch

    from galapagos.evolve.distributed import estimate_memory

    device = ctx.device
    if not hasattr(payload, "genome") or not device.startswith("cuda"):
        return False
    try:
        need = estimate_memory(payload.genome, payload.problem, payload.genome.batch_size, payload.train.builder)
    except Exception as exc:  # noqa: BLE001 - no estimate: trained as it always was
        log.warning("no memory estimate for %s (%s: %s): it trains on one device", payload.genome, type(exc).__name__,
                    exc)
        return False
    free, _ = torch.cuda.mem_get_info(device)
    return need.total > MEMORY_SHARE * free or too_slow(payload, ctx, time_limit)


def too_slow(payload: Any, ctx: Any, time_limit: float | None) -> bool:
    """Whether one device would train the candidate in more than TIME_SHARE of `time_limit`: its steps per epoch
    (the training split's rows, or train.max_train_samples, over the batch) times its epochs, at the speed of a few
    steps timed on `ctx.device`."""
    from galapagos.datashare.plan import split_arrays
    from galapagos.evolve.distributed import step_seconds

    if not time_limit:
        return False
    try:
        train = split_arrays(ctx.data, ("train",))["train"]
        rows = len(train.index) if train.index is not None else len(train.x)
        seconds = step_seconds(payload.genome, payload.problem, ctx.device, payload.train.builder)
    except Exception as exc:  # noqa: BLE001 - not timed: trained on one device, as it always was
        log.warning("no step time for %s (%s: %s): it trains on one device", payload.genome, type(exc).__name__, exc)
        return False
    if payload.train.max_train_samples:
        rows = min(rows, payload.train.max_train_samples)
    projected = seconds * max(1, rows // payload.genome.batch_size) * payload.train.epochs
    if projected > TIME_SHARE * time_limit:
        log.info("candidate %s would train about %.0f s on %s, its limit %.0f s: it spreads", payload.genome,
                 projected, ctx.device, time_limit)
        return True
    return False


class Spread(Children):
    """The trainer children of one worker rank that train each of its tasks together, one per device: where Pack
    holds one Supervisor, it holds this instead (launch/packing.py)."""

    def __init__(self, leader: Supervisor, devices: tuple[str, ...], auto: bool, task_fn: str):
        self.rank, self.host, self.devices, self.auto = leader.rank, leader.host, devices, auto
        # the others start on the task function itself, so that they import torch before their first task
        self.children = [leader, *(Supervisor(leader.rank, task_fn) for _ in devices[1:])]
        self.members: list = self.children  # those that train the task: a gang's lost followers leave (join)
        self.task_fn = task_fn
        self.task: Task | None = None
        self.reported = False  # the task's Result went up
        self.failed: dict[int, Result] = {}  # the children's failures, gathered for HOLD seconds
        self.failed_at = 0.0
        self.tries = 0
        self.store = Path(tempfile.mkdtemp(prefix=f"galapagos-spread-{leader.rank}-"))
        self._waiting: Callable[[], object] = lambda: None

    @property
    def current(self) -> Task | None:
        """The task, until every child has ended it: the next one waits for all of them."""
        return self.task if any(c.current is not None for c in self.children) else None

    @property
    def conn(self):
        """A running child's pipe, for Pack to wait on (it then polls every child)."""
        return next((c.conn for c in self.children if c.current is not None and c.conn is not None), None)

    @property
    def proc(self):
        return self.children[0].proc

    def join(self, remotes: list[Remote]) -> None:
        """A gang's followers' children (launch/gang.py), after this rank's own: every task trains on all of them
        that are still there."""
        self.children = [*self.children, *remotes]
        self.devices = (*self.devices, *(f"{r.device} of rank {r.rank} on {r.host}" for r in remotes))

    def attach(self, data: dict | None) -> None:
        for child in self.children:
            child.attach(data)

    def place(self, task_fn: str, *, cores: list[int] | None = None, device: str = "cpu",
              log_path: Path | None = None, threads: int | None = None) -> None:
        """Supervisor.place for every child, each on its own of the group's devices (`device`, the rank's, is the
        leader's) with its share of the rank's cores as threads, each logging beside the leader
        (trainer-R.spreadI.log)."""
        self.task_fn = task_fn
        share = max(1, (threads or (core_count(cores) if cores else 1)) // len(self.children))
        for i, child in enumerate(self.children):
            path = log_path if i == 0 or log_path is None else log_path.with_name(f"{log_path.stem}.spread{i}.log")
            child.place(SPREAD_FN, cores=cores, device=self.devices[i], log_path=path, threads=share)

    def submit(self, task: Task) -> list:
        """The task to every child, each as its member of the group."""
        self.task, self.reported, self.failed, self.tries = task, False, {}, self.tries + 1
        self.members = [c for c in self.children if not getattr(c, "gone", False)]
        gang = len(self.members) > 1 and isinstance(self.members[-1], Remote)
        store = store_address(self.host) if gang else str(self.store / f"{task.id}.{self.tries}")
        events: list = []
        for i, child in enumerate(self.members):
            job = Member(self.task_fn, task.payload, i, len(self.members), store, self.auto, task.time_limit)
            events += self._take(i, child.submit(Task(task.id, job, task.time_limit)))
        return events + self._decided()  # where no child could start, at once

    def cancel(self, task_id: int, status: Status) -> list:
        """A cancel goes to the leader, which stops the group at its next epoch's end."""
        if self.task is None or self.task.id != task_id or self.reported:
            return []
        return self._take(0, self.members[0].cancel(task_id, status))

    def poll(self, timeout: float = 0.0) -> list:
        running = [c.conn for c in self.children if c.current is not None and c.conn is not None]
        if running and timeout > 0:
            wait(running, timeout)
        events: list = []
        for i, child in enumerate(self.members):
            if child.current is not None:
                events += self._take(i, child.poll(0.0))
        return events + self._decided()

    def _decided(self) -> list:
        """The task's failure, once HOLD seconds have passed since the first or every child has ended."""
        if self.failed and not self.reported and (time.monotonic() - self.failed_at > HOLD or self.current is None):
            return self._fail(*min(self.failed.items(), key=lambda f: (f[1].status == Status.FAILED, f[0])))
        return []

    def _take(self, i: int, events: list) -> list:
        """What child `i` said, as the task's: the leader's progress, and its Result where it ended or was stopped;
        the children's failures are gathered for HOLD seconds (or until all ended) and the cause is the task's."""
        out: list = []
        for ev in events:
            if not isinstance(ev, Result):
                out += [ev] if i == 0 else []
            elif self.reported or (i > 0 and ev.status in STOPPED):
                continue
            elif i == 0 and ev.status in (*STOPPED, Status.PRUNED):
                self.reported = True
                out.append(ev)
                for child in self.members[1:]:  # they end with it; one stuck in a collective is killed
                    child.cancel(ev.id, Status.CANCELLED)
            else:
                self.failed_at = self.failed_at if self.failed else time.monotonic()
                self.failed[i] = ev
        return out

    def _fail(self, i: int, result: Result) -> list:
        """Child `i`'s failure as the task's; the children still running are killed. The cause is a failure of
        its own kind (crashed, out of memory, past the time limit, diverged) before a plain `failed`, which is also
        what the others raise once a peer is gone (gloo: "Connection closed by peer"); the leader's on a tie."""
        self.reported, error = True, result.error
        if i > 0:
            where = self.devices[self.children.index(self.members[i])]
            error = f"spread member {i} of {len(self.members)} on {where}: {result.error}"
            log.warning("task %d failed in its spread group: %s", result.id, error)
        for child in self.members:
            child.end(result.status, error)
        return [dataclasses.replace(result, rank=self.rank, host=self.host, error=error)]  # a gang's: the leader's

    def stop(self) -> None:
        for child in self.children:
            child.stop()
        shutil.rmtree(self.store, ignore_errors=True)
