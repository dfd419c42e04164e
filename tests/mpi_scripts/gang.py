"""Gangs under real MPI (tests/test_gang.py), 3 ranks: run.spread_ranks = 2, so that worker ranks 1 and 2 train
each of rank 1's tasks together. Prints one `RESULT {json}` line per task.

`train`: four small trainings, the third sent once the gang has been idle for longer than the worker timeout;
`follower-fails`: the follower's child runs out of memory in each task;
`frozen`: rank 2 and its trainer child stop (SIGSTOP) two seconds into the first, long, task: its leader fails
that task once rank 2 has been silent for the worker timeout and trains the next one without it; the master gives
rank 2 up and ends the job with EXIT_LOST. `leader-frozen`: the same of rank 1, the leader: the master gives it
and its task up, and rank 2 takes the next task itself.
"""
import json
import logging
import os
import signal
import sys
import threading
import time

import galapagos.launch.session as session
from galapagos.evolve.task import TrainConfig, TrainTask
from galapagos.launch.mpi import world
from galapagos.launch.protocol import Liveness, Setup, Task
from tests.test_spread import GENOME, PROBLEM

mode = sys.argv[1]
LIVENESS = Liveness(interval=0.5, worker_timeout=3.0, master_timeout=30.0)
TASK_FN = "tests.test_spread:fails_in_follower" if mode == "follower-fails" else "tests.test_spread:trained"
EPOCHS = {"train": [2, 2, 2, 2], "follower-fails": [1, 1], "frozen": [300, 1], "leader-frozen": [300, 1]}[mode]


class Tasks:
    def __init__(self):
        self.sent, self.results = 0, []

    def next_task(self):
        if self.sent == len(EPOCHS) or (self.sent == 2 and not self.idle()):
            return None
        self.sent += 1
        return Task(self.sent, TrainTask(GENOME, PROBLEM, TrainConfig(epochs=EPOCHS[self.sent - 1]), seed=self.sent),
                    600.0)

    def idle(self):
        """The gang has been idle longer than the worker timeout after its second task: a follower with nothing
        to do says nothing to its leader, and is not taken for lost."""
        return len(self.results) == 2 and time.time() - self.results[-1].ended > 1.5 * LIVENESS.worker_timeout

    def finished(self):
        return len(self.results) == len(EPOCHS)

    def on_result(self, result):
        self.results.append(result)
        print("RESULT " + json.dumps({"id": result.id, "rank": result.rank, "status": str(result.status),
                                      "fitness": result.fitness, "spread": result.metrics.get("spread"),
                                      "error": result.error}), flush=True)

    def on_progress(self, progress):
        return None

    def on_tick(self, state):
        pass


def freezing(serve, children):
    """`serve`, made to stop its rank's trainer children (`children` of its arguments) and the rank itself two
    seconds after it starts (a frozen node)."""
    def frozen(*args, **kwargs):
        def freeze():
            print(f"frozen at={time.time():.3f}", flush=True)
            for child in children(*args):
                if child.proc is not None:
                    os.kill(child.proc.pid, signal.SIGSTOP)
            os.kill(os.getpid(), signal.SIGSTOP)
        threading.Timer(2.0, freeze).start()
        return serve(*args, **kwargs)
    return frozen


comm = world()
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format=f"rank {comm.rank} %(levelname)s: %(message)s")
if comm.rank == 0:
    state = session.master_run(comm, Setup(TASK_FN, liveness=LIVENESS, spread_ranks=2), Tasks(), prefetch=0,
                               lost_grace=600.0)
    print(f"lost ranks={sorted(state.lost)} followers={sorted(state.followers)}", flush=True)
    session.abort_if_lost(comm, state)
else:
    if mode == "frozen" and comm.rank == 2:
        session.follower_serve = freezing(session.follower_serve, lambda comm, children, *_: children)
    if mode == "leader-frozen" and comm.rank == 1:
        session.worker_serve = freezing(session.worker_serve, lambda comm, pack, *_: pack.children[0].children[:1])
    session.worker_main(comm)
