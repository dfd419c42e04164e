"""Ranks waiting on others must not spin: CPU seconds of the master and the worker ranks while tasks sleep."""
import time

from galapagos.launch.mpi import world
from galapagos.launch.protocol import Setup, Task
from galapagos.launch.session import master_run, worker_main


class Sleepers:
    def __init__(self, n, seconds):
        self.n, self.seconds, self.sent, self.done = n, seconds, 0, 0

    def next_task(self):
        if self.sent == self.n:
            return None
        self.sent += 1
        return Task(self.sent, self.seconds)

    def finished(self):
        return self.done == self.n

    def on_result(self, result):
        assert result.status == "ok", result
        self.done += 1

    def on_progress(self, progress):
        return None

    def on_tick(self, state):
        pass


comm = world()
wall, cpu = time.time(), time.process_time()
if comm.rank == 0:
    master_run(comm, Setup("tests.faulty_tasks:sleeper"), Sleepers(2 * (comm.size - 1), 2.0))
else:
    worker_main(comm)
share = (time.process_time() - cpu) / (time.time() - wall)
print(f"cpu_share rank={comm.rank} {share:.4f}", flush=True)
