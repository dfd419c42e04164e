"""The trainer child: the process a worker rank starts to run its tasks, so that a crash costs a restart, not the rank.

Started as `python -m galapagos.launch.trainer FD`; FD is one end of a multiprocessing pipe. The first message, a
TrainerSetup, sets it up (task function, cores, device, shared data); then it runs one Task at a time until told to
Stop (messages: launch/protocol.py).
"""
from __future__ import annotations

import errno
import gc
import logging
import math
import os
import signal
import socket
import sys
import traceback
import warnings
from multiprocessing.connection import Connection
from typing import Any, Callable

from galapagos.evolve.settings import load_function
from galapagos.launch.protocol import (Cancel, Outcome, Progress, Status, Stop, Task, TrainerDevice, TrainerFailed,
                                       TrainerReady)

log = logging.getLogger(__name__)


class Cancelled(Exception):
    """Raised inside a task when the master cancelled it (pruned as hopeless, or the run is ending)."""

    def __init__(self, status: Status = Status.CANCELLED):
        super().__init__(status)
        self.status = status


class TaskContext:
    """What a task function sees: the data, its device, the cores it may use, and a way to report progress."""

    def __init__(self, conn: Connection, data: dict, device: str, threads: int, rank: int = 0):
        self.conn, self.data, self.device, self.threads, self.rank = conn, data, device, threads, rank
        self.task_id: int | None = None
        self.best_fitness: float | None = None
        self.cache: dict[str, Any] = {}  # lives as long as the child: e.g. the dataset already on the device

    def report(self, metrics: dict) -> None:
        """Stream one epoch's metrics to the master; raises Cancelled if the master said stop."""
        fit = metrics.get("fitness")
        if isinstance(fit, (int, float)) and math.isfinite(fit):
            self.best_fitness = fit if self.best_fitness is None else max(self.best_fitness, fit)
        self.conn.send(Progress(self.task_id, self.rank, metrics))
        self.check_cancel()

    def check_cancel(self) -> None:
        while self.conn.poll():
            msg = self.conn.recv()
            if isinstance(msg, Cancel) and msg.id == self.task_id:
                raise Cancelled(msg.status)


def status_of(exc: BaseException) -> Status:
    """A task may set `status` on its exception (e.g. "nan"); else the kind of error decides."""
    try:
        return Status(getattr(exc, "status", None))
    except ValueError:
        pass
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return Status.OOM
    if isinstance(exc, FloatingPointError):  # e.g. evolve.train.NonFiniteLoss: the candidate diverged
        return Status.NAN
    return Status.FAILED


# The errors that mean the disk refused a write rather than the task failing: no room, a quota, a read-only file
# system (errno(3)). They end the run (Status.DISK), since every candidate after would fail the same way. torch's own
# file writer (caffe2/serialize/inline_container.cc) reports them without their errno where it was given a path: a
# write that came short ("unexpected pos ...", "file write failed") or a file it could not open (with the strerror).
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
_TORCH_WRITER = "inline_container.cc"
_TORCH_SHORT_WRITE = ("unexpected pos", "file write failed", "failed writing")


def disk_fault(exc: BaseException, path: str | None = None) -> str | None:
    """What the disk refused, in one line ("PATH: No space left on device"; `path` where the error names none), when
    `exc`, or an error it was raised from or while handling, is a write the disk refused; None for any other
    failure."""
    chain: list[BaseException] = []
    where = f"{path}: " if path else ""
    while exc is not None and not any(exc is seen for seen in chain):
        chain.append(exc)
        if isinstance(exc, OSError) and exc.errno in DISK_ERRNOS:
            return f"{exc.filename}: {exc.strerror}" if exc.filename else f"{where}{exc.strerror}"
        exc = exc.__cause__ or exc.__context__
    for seen in chain:
        text = str(seen).strip()
        if _TORCH_WRITER not in text:
            continue
        named = [os.strerror(n) for n in sorted(DISK_ERRNOS) if os.strerror(n) in text]
        if named or any(words in text for words in _TORCH_SHORT_WRITE):
            first = text.splitlines()[0][:200] if text else ""
            return where + (named[0] if named else f"a write came short ({first})")
    return None


def run_one(fn: Callable, task: Task, ctx: TaskContext) -> Outcome:
    """Run one task and turn whatever happens into its Outcome."""
    ctx.task_id, ctx.best_fitness = task.id, None
    try:
        out = fn(task.payload, ctx) or {}
    except Cancelled as c:
        fitness = ctx.best_fitness if c.status == Status.PRUNED else None
        return Outcome(task.id, Status(c.status), fitness)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a status, the child lives on
        if isinstance(exc, KeyboardInterrupt):
            raise
        if (refused := disk_fault(exc, getattr(task.payload, "save", None))) is not None:  # the run stops
            log.warning("task %s: the disk refused a write: %s", ctx.task_id, refused)
            return Outcome(task.id, Status.DISK, None, {}, refused)
        lines = traceback.format_exception_only(type(exc), exc)
        log.warning("task %s failed:\n%s", ctx.task_id, traceback.format_exc())
        return Outcome(task.id, status_of(exc), None, {}, "".join(lines).strip()[-2000:])
    fitness = out.get("fitness")
    metrics = out.get("metrics", {})
    if fitness is None or not isinstance(fitness, (int, float)) or not math.isfinite(fitness):
        return Outcome(task.id, Status.NAN, None, metrics, f"task returned a non-finite fitness: {fitness!r}")
    return Outcome(task.id, Status.OK, float(fitness), metrics)


def _setup_cpu(cores: tuple[int, ...] | None, threads: int) -> None:
    """Bind to `cores` and run `threads` torch threads: the supervisor counts physical cores, not hardware threads
    (launch.placement.core_count), so two threads never compete for one core's units."""
    if cores:
        try:
            os.sched_setaffinity(0, cores)
        except (AttributeError, OSError) as exc:  # not Linux, or cores outside the allowed set
            log.warning("could not bind to cores %s: %s", cores, exc)
    if "torch" in sys.modules:  # imported by the task function; a task that needs no torch starts faster
        sys.modules["torch"].set_num_threads(max(1, threads))


def _backend(device: str) -> Any:
    """torch's module for `device`'s kind (torch.cuda, torch.xpu), where the task function imported torch."""
    torch = sys.modules.get("torch")
    return getattr(torch, device.partition(":")[0], None) if torch is not None and device != "cpu" else None


def _usable_device(device: str) -> str:
    """`device`, or "cpu" where this child's torch cannot drive it (a CPU-only build on a GPU node: the placement
    reads the node, not torch)."""
    backend = _backend(device)
    if backend is None or not hasattr(backend, "is_available") or backend.is_available():
        return device
    log.warning("this torch cannot use %s (built without its backend?): training on the CPU", device)
    return "cpu"


def _warm(device: str) -> None:
    """The GPU runtime of `device` started now, while the worker rank shares the data, so that the first task finds
    it up. Nothing where this torch cannot drive it: _usable_device says so at the setup, and the task meets any
    error again."""
    backend = _backend(device)
    try:
        if backend is not None and hasattr(backend, "is_available") and backend.is_available():
            sys.modules["torch"].empty(1, device=device)
    except Exception:  # noqa: BLE001, S110 - see above
        pass


def die_with_parent(signum: int = signal.SIGKILL) -> None:
    """Linux: `signum` to this process when its parent dies (a trainer when its worker rank dies, the job's mpiexec
    when the command that started it dies), so nothing outlives what started it."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signum)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _preload(task_fn: str | None) -> Callable | BaseException | None:
    """The task function, imported before the setup comes (with torch, for Galapagos's own: seconds, spent while
    the worker rank shares the data), or what importing it raised (reported once the setup has come)."""
    if not task_fn:
        return None
    try:
        return load_function(task_fn, "task function")
    except BaseException as exc:  # noqa: BLE001 - said to the supervisor after the setup, as any failure
        return exc


def _write_to(path: str) -> None:
    """This process's output (stdout and stderr) appended to `path` from now on: a child started before the job's
    setup named its log wrote nowhere until then."""
    try:
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as exc:
        log.warning("cannot write the trainer's log %s: %s", path, exc)
        return
    for fd in (1, 2):
        os.dup2(out, fd)
    os.close(out)


def _received_fd(fd: int) -> int:
    """The shared copy's file descriptor, sent after the setup over the pipe (a Unix socket pair)."""
    with socket.socket(fileno=os.dup(fd)) as sock:
        _, fds, _, _ = socket.recv_fds(sock, 1, 1)
    if not fds:
        raise RuntimeError("the shared data's file descriptor did not come with the setup")
    return fds[0]


def main(fd: int, task_fn: str | None = None) -> None:
    die_with_parent()
    # scancel and a scheduler's time limit send SIGTERM to every process of the job, this child too: its worker rank
    # stops it (Stop, then SIGKILL) as the job stops cleanly, and a task killed here would be recorded as crashed.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    conn = Connection(fd)
    preloaded = _preload(task_fn)
    while isinstance(setup := conn.recv(), TrainerDevice):
        _warm(setup.device)
    if isinstance(setup, Stop):  # started ahead (Supervisor.start), and the job ended before it had a task
        return
    received = _received_fd(fd) if setup.data and setup.data.get("fd") is not None else None
    if setup.log:
        _write_to(setup.log)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format=f"%(asctime)s trainer[rank {setup.rank}] %(levelname)s %(name)s: %(message)s")
    warnings.filterwarnings("ignore", message=".*non-writable.*")  # shared data is mapped read-only on purpose
    try:
        shared = None
        data: dict = {}
        if setup.data:
            from galapagos.datashare.share import open_shared

            shared, data = open_shared(setup.data if received is None else {**setup.data, "fd": received})
        if received is not None:
            os.close(received)  # mapped (open_shared keeps its own descriptor)
        if isinstance(preloaded, BaseException):
            raise preloaded
        fn = preloaded if preloaded is not None and task_fn == setup.task_fn else load_function(setup.task_fn,
                                                                                                 "task function")
        _setup_cpu(setup.cores, setup.threads)
    except BaseException as exc:  # noqa: BLE001 - tell the supervisor why, then die
        conn.send(TrainerFailed(f"{type(exc).__name__}: {exc}"))
        raise
    ctx = TaskContext(conn, data, _usable_device(setup.device), setup.threads, setup.rank)
    # What the imports made lives as long as the child: out of every garbage collection from now on, so that a full
    # one looks at the tasks' own objects only (https://docs.python.org/3/library/gc.html#gc.freeze).
    gc.freeze()
    conn.send(TrainerReady(os.getpid()))
    while True:
        msg = conn.recv()
        if isinstance(msg, Stop):
            break
        if isinstance(msg, Task):  # anything else is a cancel for a task that already ended
            conn.send(run_one(fn, msg, ctx))
    if shared is not None:
        shared.close()


if __name__ == "__main__":
    main(int(sys.argv[1]), *sys.argv[2:3])
