"""The worker side of a task: runs it in a trainer child and turns every way it can end into a Result."""
from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping
from multiprocessing import Pipe
from pathlib import Path

from galapagos.launch.mpi import MPI_ENV_PREFIXES
from galapagos.launch.placement import core_count
from galapagos.launch.protocol import (Cancel, Outcome, Progress, Result, Status, Stop, Task, TrainerDevice,
                                       TrainerFailed, TrainerReady, TrainerSetup)

log = logging.getLogger(__name__)

START_TIMEOUT = 300.0  # seconds for a child to import torch and map the data on a slow shared file system
CANCEL_GRACE = 10.0  # seconds a cancelled task has to stop on its own before its child is killed
STOP_WAIT = 5.0  # seconds an idle child has to exit when told to stop, before it is killed
# The same for a child still in a task when the job ends: it reads the pipe only between epochs, and a scheduler
# kills the job soon after its warning, so it is killed almost at once.
BUSY_STOP_WAIT = 1.0


def uncompiled(package: str = "torch", environ: Mapping[str, str] | None = None) -> str | None:
    """Why every trainer child would compile `package`'s sources again when it imports it, or None: its bytecode is
    not where the children look for it, and they may not write it (`PYTHONDONTWRITEBYTECODE`, or a directory they
    cannot write: https://docs.python.org/3/using/cmdline.html#envvar-PYTHONDONTWRITEBYTECODE). As in a GPU
    container image that ships torch without bytecode: 2.4 s per import where the bytecode took 1.2 s on an H200
    machine, and thousands of files read from a shared file system by every child (bench/RESULTS.md)."""
    environ = os.environ if environ is None else environ
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    cached = Path(importlib.util.cache_from_source(spec.origin))  # where a child looks (PYTHONPYCACHEPREFIX too)
    if cached.exists():
        return None
    if environ.get("PYTHONDONTWRITEBYTECODE"):
        why = "PYTHONDONTWRITEBYTECODE is set"
    else:
        parent = next(d for d in cached.parents if d.exists())
        if os.access(parent, os.W_OK):
            return None  # the first child writes it
        why = f"{parent} cannot be written"
    where = Path(spec.origin).parent
    return (f"{package} ({where}) has no compiled bytecode where its importers look and {why}: every trainer "
            f"child compiles its sources again when it starts (seconds each). Compile them once (python -m "
            f"compileall -q {where}) or let Python cache them on a local disk (PYTHONPYCACHEPREFIX=/tmp/pycache, "
            "PYTHONDONTWRITEBYTECODE unset)")


class Supervisor:
    """Owns one trainer child at a time and a queue of tasks for it."""

    def __init__(self, rank: int, task_fn: str, *, data: dict | None = None, cores: list[int] | None = None,
                 device: str = "cpu", log_path: Path | None = None, threads: int | None = None):
        self.rank, self.host = rank, socket.gethostname()
        self.proc: subprocess.Popen | None = None
        self.conn = None
        self.ready = False  # the child has its setup and said TrainerReady
        self.setup = TrainerSetup(rank, task_fn, data, None, device, 1)
        self.place(task_fn, cores=cores, device=device, log_path=log_path, threads=threads)
        self.queue: deque[Task] = deque()
        self.current: Task | None = None
        self.started = 0.0
        self.cancel_sent: float | None = None
        self.cancel_status: str | None = None
        # called about every second while this waits for a child to start: the rank's heartbeat goes on meanwhile
        self.waiting: Callable[[], object] = lambda: None

    # -- the child -------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the child now: it imports its task function (torch, for Galapagos's own) while this rank goes on
        (waiting for the job's setup, sharing the data); its setup goes with the first task, with what place() and
        attach() gave. Without this, the first task starts it."""
        if self.proc is None:
            self._launch()

    def place(self, task_fn: str, *, cores: list[int] | None = None, device: str = "cpu",
              log_path: Path | None = None, threads: int | None = None) -> None:
        """What the child runs, on which cores and device, and where it writes: known once the job's setup has come
        and the node is placed; a child started before (start) gets it with its first task."""
        # torch (and OpenMP) threads: one per physical core of `cores`; hardware threads of a core share its units
        threads = threads or (core_count(cores) if cores else 1)
        self.setup = TrainerSetup(self.rank, task_fn, self.setup.data, tuple(cores) if cores else None, device,
                                  threads, str(log_path) if log_path else None)
        self._send_device()

    def _send_device(self) -> None:
        """A child not yet set up, placed on a GPU: its device now, so that it starts the GPU's runtime (a CUDA
        context: seconds) while this rank shares the data, before the setup can go."""
        if self.conn is not None and not self.ready and self.setup.device != "cpu":
            try:
                self.conn.send(TrainerDevice(self.setup.device))
            except OSError:  # the child is gone: the handshake says so
                pass

    def attach(self, data: dict | None) -> None:
        """The shared data's descriptor (datashare.share.Shared.descriptor) for the child's setup."""
        self.setup = dataclasses.replace(self.setup, data=data)

    def _launch(self) -> None:
        parent, child = Pipe()  # a Unix socket pair: the shared data's descriptor goes through it (_handshake)
        env = {k: v for k, v in os.environ.items() if not k.startswith(MPI_ENV_PREFIXES)}
        env.setdefault("OMP_NUM_THREADS", str(self.setup.threads))
        out = open(self.setup.log, "ab") if self.setup.log else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "galapagos.launch.trainer", str(child.fileno()),
                                          self.setup.task_fn], pass_fds=[child.fileno()], env=env, stdout=out,
                                         stderr=out, start_new_session=True)
        finally:
            child.close()
            if out is not subprocess.DEVNULL:
                out.close()
        self.conn = parent
        self._send_device()

    def _spawn(self) -> None:
        self.start()
        self._handshake()

    def _handshake(self) -> None:
        """The setup to the child, and the shared copy's file descriptor with it (SCM_RIGHTS: it may be open
        nowhere else by now, https://docs.python.org/3/library/socket.html#socket.send_fds); then its answer."""
        parent = self.conn
        parent.send(self.setup)
        fd = (self.setup.data or {}).get("fd")
        if fd is not None:
            with socket.socket(fileno=os.dup(parent.fileno())) as sock:
                socket.send_fds(sock, [b"\0"], [fd])
        began = time.monotonic()
        while not parent.poll(min(1.0, START_TIMEOUT)):
            if time.monotonic() - began >= START_TIMEOUT:
                self._kill()
                raise RuntimeError(f"trainer child on rank {self.rank} did not start within {START_TIMEOUT:.0f} s")
            self.waiting()
        try:
            reply = parent.recv()
        except EOFError:
            code = self.proc.wait()
            self.proc = None
            raise RuntimeError(f"trainer child on rank {self.rank} died while starting ({_describe_exit(code)})"
                               + (f"; see {self.setup.log}" if self.setup.log else "")) from None
        if not isinstance(reply, TrainerReady):
            self._kill()
            why = reply.reason if isinstance(reply, TrainerFailed) else f"unexpected {reply!r}"
            raise RuntimeError(f"trainer child on rank {self.rank} could not start: {why}")
        self.ready = True

    def _kill(self) -> int | None:
        code = None
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            code = self.proc.wait()
        if self.conn is not None:
            self.conn.close()
        self.proc, self.conn, self.ready = None, None, False
        return code

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # -- tasks -----------------------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self.current is not None or bool(self.queue)

    def submit(self, task: Task) -> list:
        self.queue.append(task)
        return self._start_next()

    def cancel(self, task_id: int, status: Status) -> list:
        """Cancel a queued or running task; a running one gets CANCEL_GRACE seconds to stop itself."""
        for task in list(self.queue):
            if task.id == task_id:
                self.queue.remove(task)
                now = time.time()
                return [self._result(task, status, None, now, now, {}, None)]
        if self.current is not None and self.current.id == task_id and self.cancel_sent is None:
            self.cancel_sent, self.cancel_status = time.time(), status
            try:
                self.conn.send(Cancel(task_id, status))
            except OSError:
                pass  # the child is gone; poll() reports the crash
        return []

    def _start_next(self) -> list:
        events: list = []
        while self.current is None and self.queue:
            task = self.queue.popleft()
            now = time.time()
            if not (self.ready and self.alive()):
                try:
                    if not self.alive():
                        self._kill()
                    self._spawn()
                except RuntimeError as exc:
                    events.append(self._result(task, Status.FAILED, None, now, time.time(), {}, str(exc)))
                    continue
            self.current, self.started, self.cancel_sent, self.cancel_status = task, time.time(), None, None
            self.conn.send(task)
        return events

    def poll(self, timeout: float = 0.0) -> list:
        """Progress and results that arrived within `timeout` seconds; enforces time limits and notices crashes."""
        if self.current is None:
            return self._start_next()
        events: list = []
        task = self.current
        try:
            ready = self.conn.poll(timeout)
            while ready:
                msg = self.conn.recv()
                if isinstance(msg, Progress) and msg.id == task.id:
                    events.append(msg)
                elif isinstance(msg, Outcome) and msg.id == task.id:
                    return events + self._finish(msg.status, msg.fitness, msg.metrics, msg.error, kill=False)
                ready = self.conn.poll(0)
        except (EOFError, OSError):
            code = self.proc.wait() if self.proc else None
            return events + self._finish(Status.CRASHED, None, {}, f"trainer child died: {_describe_exit(code)}",
                                         kill=True)
        now = time.time()
        if task.time_limit is not None and now - self.started > task.time_limit:
            return events + self._finish(Status.TIMEOUT, None, {}, f"past its time limit of {task.time_limit:g} s",
                                         kill=True)
        if self.cancel_sent is not None and now - self.cancel_sent > CANCEL_GRACE:
            return events + self._finish(self.cancel_status, None, {}, "did not stop when cancelled", kill=True)
        return events

    def end(self, status: Status, error: str) -> list:
        """End the running task now, its child killed (one of a spread group failed: launch/spread.py)."""
        return [] if self.current is None else self._finish(status, None, {}, error, kill=True)

    def _finish(self, status, fitness, metrics, error, *, kill: bool) -> list:
        if kill:
            self._kill()
        task, self.current = self.current, None
        events = [self._result(task, status, fitness, self.started, time.time(), metrics, error)]
        return events + self._start_next()

    def _result(self, task, status, fitness, started, ended, metrics, error) -> Result:
        return Result(task.id, self.rank, self.host, status, fitness, started, ended, metrics, error)

    def stop(self) -> None:
        """End the child: told to stop, then killed if it has not exited in time (sooner if it is in a task)."""
        if self.alive():
            try:
                self.conn.send(Stop())
                self.proc.wait(timeout=STOP_WAIT if self.current is None else BUSY_STOP_WAIT)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()

    def pending(self) -> list[Task]:
        return ([self.current] if self.current else []) + list(self.queue)


class Children:
    """What a holder of several Supervisors (Pack, Spread) passes on to each of them: the hook it calls while it
    waits for a child, and the start."""

    children: list
    _waiting: Callable[[], object]

    @property
    def waiting(self) -> Callable[[], object]:
        return self._waiting

    @waiting.setter
    def waiting(self, fn: Callable[[], object]) -> None:
        self._waiting = fn
        for child in self.children:
            child.waiting = fn

    def start(self) -> None:
        for child in self.children:
            child.start()


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "unknown exit"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
