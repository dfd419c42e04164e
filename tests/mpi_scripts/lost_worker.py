"""A job that must end by itself. `lost`: worker rank 2 stops (SIGSTOP) one second into serving; the master gives
it up after its task's time limit plus the grace, rank 1 runs the rest, and rank 0 aborts the job with EXIT_LOST.
`fails`: worker rank 2 fails unexpectedly at its second task; the master gives it up at once, rank 1 runs the rest,
and rank 0 aborts the job with EXIT_LOST. `start-fails`: worker rank 2 fails while the job starts; it ends the job.
`stop`: a stop request while every worker runs a long task; the master and the workers leave at once."""
import logging
import os
import signal
import sys
import threading
import time

import galapagos.launch.session as session
from galapagos.launch.supervisor import Supervisor
from galapagos.launch.mpi import world
from galapagos.launch.protocol import Setup, Task

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


def fail_at_second_task(comm):
    """Rank 2's supervisor raises when handed its second task (as a bug in the worker rank's own code would)."""
    submit = Supervisor.submit
    handed = []

    def failing(self, task):
        handed.append(task.id)
        if comm.rank == 2 and len(handed) == 2:
            raise RuntimeError("injected worker failure")
        return submit(self, task)
    Supervisor.submit = failing


def fail_at_start(comm):
    """Rank 2 fails as it places itself on its node, before the data is shared."""
    place = session._placement

    def failing(comm_, node):
        if comm_.rank == 2:
            raise OSError(24, "Too many open files")
        return place(comm_, node)
    session._placement = failing


mode = sys.argv[1]
comm = world()
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format=f"rank {comm.rank} %(levelname)s: %(message)s")
if comm.rank == 0:
    setup = Setup("tests.faulty_tasks:sleeper")
    if mode in ("lost", "fails", "start-fails"):
        source = Sleepers(10, 0.5, LIMIT)
        # a rank that fails says so: the master must not wait for it to be silent past the grace
        state = session.master_run(comm, setup, source, prefetch=0, lost_grace=GRACE if mode == "lost" else 600)
    else:
        source, until = Sleepers(4, 60.0, None), time.time() + 4.0
        state = session.master_run(comm, setup, source, prefetch=0, stop=lambda: time.time() > until and "test")
        print(f"stopped at={time.time():.3f}", flush=True)
    for r in source.results:
        print(f"result id={r.id} rank={r.rank} status={r.status}", flush=True)
    print(f"lost ranks={sorted(state.lost)}", flush=True)
    session.abort_if_lost(comm, state)
else:
    {"lost": stop_soon, "fails": fail_at_second_task, "start-fails": fail_at_start}.get(mode, id)(comm)
    session.worker_main(comm)
print(f"exit rank={comm.rank} at={time.time():.3f}", flush=True)
