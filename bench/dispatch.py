"""Dispatch throughput: no-op tasks through the Galapagos runtime and through mpi4py.futures, same ranks, one run.

    python -m bench.dispatch --ranks 4 --tasks 3000

The Galapagos path is the real one: master loop -> worker rank -> supervised trainer child -> back. The peer is
mpi4py.futures.MPICommExecutor over the same communicator (the pool that MPIPoolExecutor runs).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from galapagos.launch.protocol import Result, Task


def noop(payload, ctx) -> dict:
    return {"fitness": 0.0}


def _noop_plain(i: int) -> int:
    return i


class _Noops:
    """`warmup` tasks first (trainer children started, imports done), then `n` timed ones."""

    def __init__(self, n: int, warmup: int):
        self.n, self.warmup, self.sent, self.done = n + warmup, warmup, 0, 0
        self.t0 = self.t1 = 0.0

    def next_task(self):
        if self.sent == self.n:
            return None
        self.sent += 1
        return Task(self.sent, None)

    def finished(self) -> bool:
        return self.done == self.n

    def on_result(self, result: Result) -> None:
        assert result.status == "ok", result
        self.done += 1
        if self.done == self.warmup:
            self.t0 = time.perf_counter()
        self.t1 = time.perf_counter()

    def on_progress(self, progress):
        return None

    def on_tick(self, state):
        pass

    @property
    def rate(self) -> float:
        return (self.n - self.warmup) / (self.t1 - self.t0)


def _inner(tasks: int, prefetch: int) -> None:
    from mpi4py import MPI  # default thread level, as MPIPoolExecutor wants

    from galapagos.launch.protocol import Setup
    from galapagos.launch.session import master_run, worker_main

    comm = MPI.COMM_WORLD
    warmup = 20 * (comm.size - 1)
    if comm.rank == 0:
        noops = _Noops(tasks, warmup)
        master_run(comm, Setup("bench.dispatch:noop"), noops,
                   prefetch=None if prefetch < 0 else prefetch)
    else:
        worker_main(comm)
    comm.Barrier()

    from mpi4py.futures import MPICommExecutor

    with MPICommExecutor(comm, root=0) as pool:
        if pool is not None:
            list(pool.map(_noop_plain, range(warmup)))
            t0 = time.perf_counter()
            list(pool.map(_noop_plain, range(tasks)))
            peer = tasks / (time.perf_counter() - t0)
    if comm.rank == 0:
        print(json.dumps({"ranks": comm.size, "tasks": tasks, "prefetch": prefetch,
                          "galapagos_tasks_per_s": round(noops.rate, 1), "mpipool_tasks_per_s": round(peer, 1),
                          "ratio": round(noops.rate / peer, 3)}))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--tasks", type=int, default=3000)
    p.add_argument("--prefetch", type=int, default=-1, help="tasks queued per worker; -1: the runtime's default")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.inner:
        _inner(args.tasks, args.prefetch)
        return
    from galapagos.launch.mpi import mpiexec

    cmd = [mpiexec(), "-n", str(args.ranks), sys.executable, "-m", "bench.dispatch", "--inner",
           "--tasks", str(args.tasks), "--prefetch", str(args.prefetch)]
    subprocess.run(cmd, check=True, env=dict(os.environ, PYTHONPATH=os.getcwd()))


if __name__ == "__main__":
    main()
