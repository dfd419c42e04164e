"""One job's life on every rank: the master tells the workers what to run, sends them the data, then serves tasks.

The start is point-to-point and polled, not a blocking collective, so workers waiting for rank 0 to read the
dataset do not spin on the CPU that rank 0 is reading with.
"""
from __future__ import annotations

import logging
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from datashare.shm import bcast_shared, remove_stale
from launch.mpi import Backoff, node_comm
from launch.placement import Placement, place
from launch.runtime import TAG, TaskSource, master_serve, worker_serve
from launch.supervisor import Supervisor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerSetup:
    task_fn: str  # 'module:function' run in the trainer child for each task
    log_dir: str | None = None
    chunk_bytes: int = 64 << 20


def _placement(comm: Any) -> Placement:
    """Collective: this rank's share of its node, counting only the worker ranks there."""
    node = node_comm(comm)
    ranks = node.allgather(comm.rank)
    node.Free()
    workers = [r for r in sorted(ranks) if r != 0]
    index = workers.index(comm.rank) if comm.rank in workers else 0
    return place(index, max(1, len(workers)))


def _share_data(comm: Any, arrays: dict[str, np.ndarray] | None, chunk_bytes: int):
    """Collective: rank 0's arrays arrive in one shared-memory segment per worker that its trainer child maps."""
    return bcast_shared(comm, arrays, chunk_bytes=chunk_bytes)[1]


def master_start(comm: Any, setup: WorkerSetup | str, arrays: dict[str, np.ndarray] | None = None) -> None:
    """Send every worker its setup (or an error string that makes them exit), then share the data."""
    for rank in range(1, comm.size):
        comm.send(setup, dest=rank, tag=TAG)
    if not isinstance(setup, str):
        _placement(comm)
        _share_data(comm, arrays or {}, setup.chunk_bytes)


def master_run(comm: Any, setup: WorkerSetup, source: TaskSource, arrays: dict[str, np.ndarray] | None = None,
               **serve: Any):
    master_start(comm, setup, arrays)
    return master_serve(comm, source, **serve)


def worker_main(comm: Any) -> int:
    """Everything a worker rank does; returns its exit code."""
    backoff = Backoff(longest=0.01)
    while (msg := comm.improbe(source=0, tag=TAG)) is None:
        backoff.sleep()
    setup = msg.recv()
    if isinstance(setup, str):
        return 1  # the master could not start; it says why
    # A launcher ends a job with SIGTERM: exit through `finally`, so the shared segment is released.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    remove_stale()
    placement = _placement(comm)
    shared = _share_data(comm, None, setup.chunk_bytes)
    log_path = None
    if setup.log_dir:
        Path(setup.log_dir).mkdir(parents=True, exist_ok=True)
        log_path = Path(setup.log_dir) / f"trainer-{comm.rank}.log"
    supervisor = Supervisor(comm.rank, setup.task_fn, data=shared.descriptor() if shared else None,
                            cores=list(placement.cores), device=placement.device, log_path=log_path)
    log.debug("worker %d on %s: %s, cores %s", comm.rank, socket.gethostname(), placement.device, placement.cores)
    try:
        worker_serve(comm, supervisor, placement.device)
    finally:
        if shared is not None:
            shared.close()
    return 0
