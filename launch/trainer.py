"""The trainer child: the process a worker rank starts to run its tasks, so that a crash costs a restart, not the rank.

Started as `python -m launch.trainer FD`; FD is one end of a multiprocessing pipe. The first message sets it up
(task function, cores, device, shared data); then it runs one task at a time until told to stop.
"""
from __future__ import annotations

import importlib
import logging
import math
import os
import signal
import sys
import traceback
import warnings
from multiprocessing.connection import Connection
from typing import Any, Callable

from launch.messages import CANCELLED, FAILED, NAN, OK, OOM, PRUNED, STATUSES

log = logging.getLogger(__name__)


class Cancelled(Exception):
    """Raised inside a task when the master cancelled it (pruned as hopeless, or the run is ending)."""

    def __init__(self, status: str = CANCELLED):
        super().__init__(status)
        self.status = status


class TaskContext:
    """What a task function sees: the data, its device, the cores it may use, and a way to report progress."""

    def __init__(self, conn: Connection, data: dict, device: str, threads: int):
        self.conn, self.data, self.device, self.threads = conn, data, device, threads
        self.task_id: int | None = None
        self.best_fitness: float | None = None
        self.cache: dict[str, Any] = {}  # lives as long as the child: e.g. the dataset already on the device

    def report(self, metrics: dict) -> None:
        """Stream one epoch's metrics to the master; raises Cancelled if the master said stop."""
        fit = metrics.get("fitness")
        if isinstance(fit, (int, float)) and math.isfinite(fit):
            self.best_fitness = fit if self.best_fitness is None else max(self.best_fitness, fit)
        self.conn.send(("progress", self.task_id, metrics))
        self.check_cancel()

    def check_cancel(self) -> None:
        while self.conn.poll():
            msg = self.conn.recv()
            if msg[0] == "cancel" and msg[1] == self.task_id:
                raise Cancelled(msg[2])


def load_function(spec: str) -> Callable:
    """'package.module:function' -> the function."""
    module, _, name = spec.partition(":")
    if not name:
        raise ValueError(f"task function {spec!r}: expected 'module:function'")
    return getattr(importlib.import_module(module), name)


def _classify(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    if status in STATUSES:
        return status
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return OOM
    return FAILED


def run_one(fn: Callable, payload: Any, ctx: TaskContext) -> tuple[str, float | None, dict, str | None]:
    """Run one task and turn whatever happens into (status, fitness, metrics, error)."""
    ctx.best_fitness = None
    try:
        out = fn(payload, ctx) or {}
    except Cancelled as c:
        fitness = ctx.best_fitness if c.status == PRUNED else None
        return c.status, fitness, {}, None
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a status, the child lives on
        if isinstance(exc, KeyboardInterrupt):
            raise
        lines = traceback.format_exception_only(type(exc), exc)
        log.warning("task %s failed:\n%s", ctx.task_id, traceback.format_exc())
        return _classify(exc), None, {}, "".join(lines).strip()[-2000:]
    fitness = out.get("fitness")
    metrics = out.get("metrics", {})
    if fitness is None or not isinstance(fitness, (int, float)) or not math.isfinite(fitness):
        return NAN, None, metrics, f"task returned a non-finite fitness: {fitness!r}"
    return OK, float(fitness), metrics, None


def _setup_cpu(cores: list[int] | None, threads: int) -> None:
    if cores:
        try:
            os.sched_setaffinity(0, cores)
        except (AttributeError, OSError) as exc:  # not Linux, or cores outside the allowed set
            log.warning("could not bind to cores %s: %s", cores, exc)
    if "torch" in sys.modules:  # imported by the task function; a task that needs no torch starts faster
        sys.modules["torch"].set_num_threads(max(1, threads))


def _die_with_parent() -> None:
    """Linux: SIGKILL this child when its worker rank dies, so no trainer outlives a killed job."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main(fd: int) -> None:
    _die_with_parent()
    conn = Connection(fd)
    setup = conn.recv()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format=f"%(asctime)s trainer[rank {setup['rank']}] %(levelname)s %(name)s: %(message)s")
    warnings.filterwarnings("ignore", message=".*non-writable.*")  # shared data is mapped read-only on purpose
    try:
        shared = None
        data: dict = {}
        if setup.get("data"):
            from datashare.share import open_shared

            shared, data = open_shared(setup["data"])
        fn = load_function(setup["task_fn"])
        _setup_cpu(setup.get("cores"), setup["threads"])
    except BaseException as exc:  # noqa: BLE001 - tell the supervisor why, then die
        conn.send(("fatal", f"{type(exc).__name__}: {exc}"))
        raise
    ctx = TaskContext(conn, data, setup["device"], setup["threads"])
    conn.send(("ready", os.getpid()))
    while True:
        msg = conn.recv()
        if msg[0] == "stop":
            break
        if msg[0] != "task":
            continue  # a cancel for a task that already ended
        ctx.task_id = msg[1]
        status, fitness, metrics, error = run_one(fn, msg[2], ctx)
        conn.send(("result", msg[1], status, fitness, metrics, error))
    if shared is not None:
        shared.close()


if __name__ == "__main__":
    main(int(sys.argv[1]))
