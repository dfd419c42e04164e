"""Children bred ahead in a helper process, for rank 0 of a job with many workers.

At whole-machine scale, breeding a child (selection, crossover, mutation, the check and the parameter count) was
half of rank 0's time per task (bench/scale.py). A helper process on rank 0's node, whose other cores are
otherwise idle, holds a copy of the engine, hears every tell, and keeps up to ``AHEAD`` children bred before they
are asked for. Rank 0 keeps its own engine as the record (population, best, pending and seen genomes): it adopts
each child the helper bred, so that, should the helper fail, it goes on breeding by itself.

A child bred ahead comes from a population at most ``AHEAD`` tells old, and which tells the helper has heard when it
breeds depends on timing: a run is then no longer reproducible from its seed. Hence only jobs with many workers use
it (``[evolution] breeder_workers``), where results arrive in an order no seed decides anyway.

The helper is a fresh Python (``python -m galapagos.evolve.ahead``, not a fork of rank 0, whose MPI library may
not survive one); it speaks over two pipes with multiprocessing's framed connections. Rank 0 -> helper: the
engine once, then ``(tells, more)`` (results it has not heard, and candidates drawn or promoted elsewhere to adopt,
in order;
how many more children to breed), None to stop.
Helper -> rank 0: lists of candidates (with their parameter counts), and a string, why, should the search space
hold no new child.
"""
from __future__ import annotations

import collections
import logging
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

from .check import count_params
from .engine import Candidate, Engine
from .errors import SearchExhausted
from .problem import Problem

__all__ = ["AHEAD", "Ahead"]

log = logging.getLogger(__name__)

AHEAD = 64  # children bred before they are asked for
BATCH = 16  # children the helper sends at once
START_WAIT = 600.0  # seconds the first child may take (the helper starts Python, maybe from a slow file system)
WAIT = 60.0  # seconds any later child may take before rank 0 gives up on the helper


class Ahead:
    """An :class:`Engine` whose asks are answered by a helper process; the rest is the local engine's own."""

    def __init__(self, engine: Engine, builder: str = "") -> None:
        self.engine = engine
        self.ready: collections.deque[Candidate] = collections.deque()  # bred (and counted), not yet asked for
        self.owed = 0  # children asked of the helper, not yet received
        self.tells: list[tuple] = []  # heard since the helper was last written to
        self.exhausted: str | None = None  # why the helper found no new child
        self.failed: str | None = None
        down_r, down_w = os.pipe()
        up_r, up_w = os.pipe()
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "galapagos.evolve.ahead", str(down_r), str(up_w)],
                                         pass_fds=(down_r, up_w), stdin=subprocess.DEVNULL)
        finally:
            os.close(down_r)
            os.close(up_w)
        self.down, self.up = Connection(down_w, readable=False), Connection(up_r, writable=False)
        self.down.send((engine, builder))
        self.down.send(([], AHEAD))  # the first children are bred while rank 0 shares the data
        self.owed = AHEAD
        self.started = False
        log.info("children are bred ahead in a helper process (pid %d)", self.proc.pid)

    def __getattr__(self, name: str) -> Any:  # population, elite, best, multi_objective, ...: the local engine's
        return getattr(self.engine, name)

    def ask(self) -> Candidate:
        if self.failed is None:
            try:
                candidate = self._bred()
            except (OSError, EOFError, pickle.UnpicklingError, TimeoutError) as exc:
                self._fail(exc)
            else:
                if candidate.origin not in ("seed", "prior") and \
                        (promoted := self.engine.promotion(candidate.id)) is not None:
                    candidate = promoted  # the child's id goes to the promotion, decided here on what rank 0 knows
                    self.tells.append(candidate)  # and the helper's engine takes it in place of the child
                self.engine.adopt(candidate)
                return candidate
        return self.engine.ask()

    def tell(self, candidate_id: int, fitness: float | None, status: str = "ok", values: Any = None) -> None:
        self.engine.tell(candidate_id, fitness, status, values)
        if self.failed is None:
            self.tells.append((candidate_id, fitness, status, values))

    def adopt(self, candidate: Candidate) -> None:
        """A candidate bred elsewhere (a worker's draw, evolve/drawn.py): the helper hears of it before its tell."""
        self.engine.adopt(candidate)
        if self.failed is None:
            self.tells.append(candidate)

    def _bred(self) -> Candidate:
        """The next child bred ahead. The helper is written to (the tells it has not heard, and how many more
        children to breed) only when half the children ahead are used up, and read only when none is left: the
        pipes cost rank 0 two system calls per AHEAD / 2 children."""
        if len(self.ready) + self.owed <= AHEAD // 2 and self.exhausted is None:
            more = AHEAD - len(self.ready) - self.owed
            self.down.send((self.tells, more))
            self.tells, self.owed = [], self.owed + more
        if not self.ready:
            if self.exhausted is not None:
                raise SearchExhausted(self.exhausted)
            self._receive()
        return self.ready.popleft()

    def _receive(self) -> None:
        """Everything the helper has sent, waiting for the first message."""
        wait = WAIT if self.started else START_WAIT
        end = time.monotonic() + wait
        while not self.up.poll(min(1.0, max(0.0, end - time.monotonic()))):
            if self.proc.poll() is not None:
                raise EOFError  # _fail names the exit code
            if time.monotonic() >= end:
                raise TimeoutError(f"no child in {wait:.0f} s")
        self.started = True
        while True:
            message = self.up.recv()
            if isinstance(message, str):
                self.exhausted = message
            else:
                self.ready.extend(message)
                self.owed -= len(message)
            if not self.up.poll(0):
                if not self.ready and self.exhausted is not None:
                    raise SearchExhausted(self.exhausted)
                return

    def _fail(self, exc: Exception) -> None:
        why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if self.proc.poll() is not None:
            why += f"; it exited with code {self.proc.returncode}"
        self.failed = why
        log.warning("the breeding helper failed (%s): rank 0 breeds the children itself from now on", why)
        self.close()

    def close(self) -> None:
        """Stop the helper (at the end of the run; again is harmless)."""
        self.up.close()  # a helper blocked on a full pipe stops at once
        if self.proc.poll() is None:
            try:
                self.down.send(None)
            except OSError:
                pass
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.down.close()


def _listen(conn: Connection, inbox: queue.SimpleQueue) -> None:
    """The helper's reader: rank 0 is never kept waiting on a full pipe while the helper breeds or sends."""
    try:
        while True:
            inbox.put(conn.recv())
    except (EOFError, OSError):
        inbox.put(None)


def serve(engine: Engine, builder: str, inbox: queue.SimpleQueue, up: Connection) -> None:
    """Breed while rank 0 wants more children, sent BATCH at a time (or fewer when it wants no more); take in tells
    and wants as they come; return on None."""
    problem: Problem = engine.problem
    credit, batch, exhausted = 0, [], False
    while True:
        block = (credit == 0 or exhausted) and not batch
        while True:
            try:
                message = inbox.get(block=block)
            except queue.Empty:
                break
            if message is None:
                return
            block = False
            tells, more = message
            for told in tells:
                if isinstance(told, Candidate):
                    engine.adopt(told)
                else:
                    engine.tell(*told)
            credit += more
        if credit and not exhausted:
            try:
                candidate = engine.ask(promote=False)  # rank 0 promotes (multi-fidelity), on what it knows
            except SearchExhausted as exc:
                up.send(batch)
                up.send(str(exc))
                batch, exhausted = [], True
                continue
            batch.append(replace(candidate, params=count_params(candidate.genome, problem, builder)))
            credit -= 1
        if batch and (len(batch) >= BATCH or credit == 0):
            up.send(batch)
            batch = []


def main(argv: list[str]) -> None:
    # It lives exactly as long as its pipe from rank 0: a stop signal is rank 0's to handle (it ends the run and
    # closes the pipe), and should rank 0 be killed outright, the pipe's end stops the helper too.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    down, up = Connection(int(argv[0]), writable=False), Connection(int(argv[1]), readable=False)
    engine, builder = down.recv()
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_listen, args=(down, inbox), daemon=True).start()
    try:
        serve(engine, builder, inbox, up)
    except BrokenPipeError:  # rank 0 closed its end: the run is over
        pass
    sys.stderr.flush()
    os._exit(0)  # nothing to save: skip the interpreter's teardown, which rank 0 would wait for


if __name__ == "__main__":
    main(sys.argv[1:])
