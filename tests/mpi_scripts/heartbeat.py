"""Heartbeats under real MPI (tests/test_heartbeat.py). The task limits and run.lost_grace are far away, so only a
heartbeat can find a silent rank.

`frozen`: worker rank 2 and its trainer child are stopped (SIGSTOP) two seconds into serving; the master gives the
rank up after the worker timeout, the other workers run the rest, and rank 0 aborts the job with EXIT_LOST.
`slow`: every task sleeps longer than the worker timeout (and reports nothing): no rank is given up, exit 0.
`master-stops`: rank 0 stops itself two seconds into serving; the first worker rank of the node finds rank 0's
heartbeat file standing still and ends the job with EXIT_LOST.
"""
import logging
import os
import signal
import sys
import threading
import time

import galapagos.launch.session as session
from galapagos.launch.mpi import world
from galapagos.launch.protocol import Liveness, Setup, Task

mode, folder = sys.argv[1], sys.argv[2]
LIVENESS = Liveness(interval=0.5, worker_timeout=3.0, master_timeout=3.0, master_file=f"{folder}/master.alive")


class Sleepers:
    def __init__(self, n, seconds):
        self.n, self.seconds, self.sent, self.results = n, seconds, 0, []

    def next_task(self):
        if self.sent == self.n:
            return None
        self.sent += 1
        return Task(self.sent, self.seconds, 600.0)

    def finished(self):
        return len(self.results) == self.n

    def on_result(self, result):
        self.results.append(result)
        print(f"result id={result.id} rank={result.rank} status={result.status} at={time.time():.3f}", flush=True)

    def on_progress(self, progress):
        return None

    def on_tick(self, state):
        pass


def freeze_rank_2(comm):
    """Rank 2 stops its trainer child and itself two seconds after it starts serving (as a frozen node would)."""
    serve = session.worker_serve

    def freezing(comm_, supervisor, *args, **kwargs):
        if comm.rank == 2:
            def freeze():
                print(f"frozen at={time.time():.3f}", flush=True)
                if supervisor.proc is not None:
                    os.kill(supervisor.proc.pid, signal.SIGSTOP)
                os.kill(os.getpid(), signal.SIGSTOP)
            threading.Timer(2.0, freeze).start()
        serve(comm_, supervisor, *args, **kwargs)
    session.worker_serve = freezing


comm = world()
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format=f"rank {comm.rank} %(levelname)s: %(message)s")
if comm.rank == 0:
    setup = Setup("tests.faulty_tasks:sleeper", liveness=LIVENESS)
    source = Sleepers(4, 5.0) if mode == "slow" else Sleepers(12, 0.5)
    if mode == "master-stops":
        threading.Timer(2.0, lambda: (print(f"frozen at={time.time():.3f}", flush=True),
                                      os.kill(os.getpid(), signal.SIGSTOP))).start()
    state = session.master_run(comm, setup, source, prefetch=0, lost_grace=600.0)
    print(f"lost ranks={sorted(state.lost)} nodes={sorted(state.lost_nodes)}", flush=True)
    session.abort_if_lost(comm, state)
else:
    if mode == "frozen":
        freeze_rank_2(comm)
    session.worker_main(comm)
print(f"exit rank={comm.rank} at={time.time():.3f}", flush=True)
