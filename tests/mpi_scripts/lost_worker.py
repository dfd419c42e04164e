"""A job that must end by itself. `lost`: worker rank 2 stops (SIGSTOP) one second into serving; the master gives
it up after its task's time limit plus the grace, rank 1 runs the rest, and rank 0 aborts the job with EXIT_LOST.
`stop`: a stop request while every worker runs a long task; the master and the workers leave at once."""
import logging
import os
import signal
import sys
import threading
import time

import launch.session as session
from launch.mpi import world
from launch.protocol import Setup, Task

LIMIT, GRACE = 2.0, 8.0  # the grace covers the trainer child's start (torch's import) before the first task


class Sleepers:
    def __init__(self, n, seconds, limit):
        self.n, self.seconds, self.limit, self.sent, self.results = n, seconds, limit, 0, []

    def next_task(self):
        if self.sent == self.n:
            return None
        self.sent += 1
        return Task(self.sent, self.seconds, self.limit)

    def finished(self):
        return len(self.results) == self.n

    def on_result(self, result):
        self.results.append(result)

    def on_progress(self, progress):
        return None

    def on_tick(self, state):
        pass


def stop_soon(comm):
    """Rank 2 stops itself a second after it starts serving (setup and data share done: no collective hangs)."""
    serve = session.worker_serve

    def stopping(*args):
        if comm.rank == 2:
            threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGSTOP)).start()
        serve(*args)
    session.worker_serve = stopping


mode = sys.argv[1]
comm = world()
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format=f"rank {comm.rank} %(levelname)s: %(message)s")
if comm.rank == 0:
    setup = Setup("tests.faulty_tasks:sleeper")
    if mode == "lost":
        source = Sleepers(10, 0.5, LIMIT)
        state = session.master_run(comm, setup, source, prefetch=0, lost_grace=GRACE)
    else:
        source, until = Sleepers(4, 60.0, None), time.time() + 4.0
        state = session.master_run(comm, setup, source, prefetch=0, stop=lambda: time.time() > until and "test")
        print(f"stopped at={time.time():.3f}", flush=True)
    for r in source.results:
        print(f"result id={r.id} rank={r.rank} status={r.status}", flush=True)
    print(f"lost ranks={sorted(state.lost)}", flush=True)
    session.abort_if_lost(comm, state)
else:
    if mode == "lost":
        stop_soon(comm)
    session.worker_main(comm)
print(f"exit rank={comm.rank} at={time.time():.3f}", flush=True)
