"""One job's life on every rank: the master tells the workers what to run, sends them the data, then serves tasks.

The start is point-to-point and polled, not a blocking collective, so workers waiting for rank 0 to read the
dataset do not spin on the CPU that rank 0 is reading with.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from galapagos.datashare.plan import Plan
from galapagos.datashare.share import DataShareError, Shared, share
from galapagos.datashare.shm import remove_stale
from galapagos.launch.gang import follower_serve, gang_of, meet
from galapagos.launch.heartbeat import MasterSilent, MasterWatch, Pulse
from galapagos.launch.mpi import Backoff, failed_ranks, node_comm
from galapagos.launch.packing import Pack
from galapagos.launch.placement import Placement, node_placement
from galapagos.launch.protocol import (EXIT_BAD_INPUT, EXIT_CRASH, EXIT_LOST, TAG, Cancel, Liveness, RankFailed, Ready,
                                      Result, Setup, SetupFailed, Stop, Stopped, Task)
from galapagos.launch.runtime import MasterState, TaskSource, master_serve

log = logging.getLogger(__name__)

# Seconds a rank waits between writing its last lines and MPI_Abort: the launcher forwards each rank's output
# through its own processes, and an abort that comes at once may kill them with the lines still on the way.
OUTPUT_GRACE = 1.0


def _placement(comm: Any, node: Any) -> Placement | None:
    """Collective: this worker's share of its node (its GPU and nearest cores, or the cores the launcher bound it
    to), counting only the worker ranks there; rank 0, the master, takes none (None)."""
    return node_placement(node, comm.rank, comm.rank != 0)


def master_start(comm: Any, setup: Setup | SetupFailed, data: Plan | dict[str, np.ndarray] | None = None,
                 memory: dict[str, np.ndarray] | None = None) -> Shared | None:
    """Send every worker its setup (or SetupFailed, which makes them exit), then share the data.

    ``data`` is a :class:`datashare.plan.Plan` (read from its file by the readers; ``memory`` holds the arrays
    it sends from rank 0's memory) or a dict of arrays. Returns the master's hold on its node's shared copy,
    which must stay open while the workers run (close it after serving).
    """
    for rank in range(1, comm.size):
        comm.send(setup, dest=rank, tag=TAG)
    if isinstance(setup, SetupFailed):
        return None
    if not isinstance(data, Plan):
        memory = data or {}
        data = Plan.of_arrays(memory, chunk_bytes=setup.chunk_bytes)
    node = node_comm(comm)
    try:
        _placement(comm, node)
        return share(comm, node, data, memory=memory, want={})
    finally:
        node.Free()


def master_run(comm: Any, setup: Setup, source: TaskSource, data: Plan | dict[str, np.ndarray] | None = None,
               memory: dict[str, np.ndarray] | None = None, **serve: Any):
    shared = master_start(comm, setup, data, memory)
    serve.setdefault("liveness", setup.liveness)
    try:
        return master_serve(comm, source, **serve)
    finally:
        if shared is not None:
            shared.close()


def abort_if_lost(comm: Any, state: MasterState) -> None:
    """Rank 0's last step, once it has written everything: a job that lost worker ranks cannot end normally (a
    stopped rank never exits, so mpiexec would wait forever), so it is aborted with EXIT_LOST, which kills every
    rank of the job, stopped ones included. Without lost ranks this does nothing; with them it never returns."""
    if state.lost - state.failed:  # a dead process (ULFM) is no longer waited for; a silent one would be
        log.error("ending the job with exit code %d: worker rank(s) %s stopped answering or failed",
                  EXIT_LOST, ", ".join(map(str, sorted(state.lost))))
        flush_then_abort(comm, EXIT_LOST)


def flush_then_abort(comm: Any, code: int) -> NoReturn:
    """End every rank of the job with exit code `code` once this rank's output has had time to reach the user."""
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(OUTPUT_GRACE)
    comm.Abort(code)
    os._exit(code)  # MPICH's MPI_Abort may return before the launcher kills the job: go on with nothing


def worker_main(comm: Any, preload: str | None = None) -> int:
    """Everything a worker rank does; returns its exit code. `preload`: the task function the job most likely runs
    (the setup names the one it runs): its trainer child starts at once and imports it (torch, for Galapagos's own:
    seconds from a shared file system) while rank 0 checks its inputs and the data is shared."""
    # A scheduler's SIGUSR1 ahead of the wall time is for the master; ignored here, and so in the trainer children.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    supervisor = Pack(comm.rank, preload or "")
    try:
        try:
            if preload:
                supervisor.start()
            started = _start(comm, supervisor)
        except Exception as exc:
            start_failed(comm, exc)
        if isinstance(started, int):
            return started
        shared, device, liveness, watch, leader = started
        try:
            # a gang's follower (run.spread_ranks) trains its leader's tasks, and its own once the leader is lost
            if leader == comm.rank or follower_serve(comm, supervisor.children[0].children, leader, device,
                                                     liveness.interval, watch):
                worker_serve(comm, supervisor, device, liveness, watch)
        except MasterSilent as exc:  # rank 0 is stopped or hung: nobody else may end the job (a plain srun)
            log.error("worker rank %d on %s: %s", comm.rank, socket.gethostname(), exc)
            flush_then_abort(comm, EXIT_LOST)
        except Exception as exc:
            if 0 in (failed_ranks(comm, exc) or ()):  # rank 0's process died (ULFM reports it): end the job
                log.error("worker rank %d on %s: rank 0 died; ending the job", comm.rank, socket.gethostname())
                flush_then_abort(comm, EXIT_LOST)
            # Rank 0 is told at once, rather than finding this rank silent past its task's time limit: it gives up
            # the rank's tasks and goes on with the other workers.
            comm.send(RankFailed(comm.rank, f"{type(exc).__name__}: {exc}"), dest=0, tag=TAG)
            log.error("worker rank %d on %s failed: %s: %s; its tasks are given up, the other workers go on",
                      comm.rank, socket.gethostname(), type(exc).__name__, exc, exc_info=exc)
            return EXIT_CRASH  # MPI_Finalize then waits for the job's end (rank 0 aborts it, see abort_if_lost)
        finally:
            shared.close()
        return 0
    finally:
        supervisor.stop()


def _start(comm: Any, supervisor: Pack) -> tuple[Shared, str, Liveness, MasterWatch | None, int] | int:
    """The worker's part of the job's start: (its hold on the shared data, its device, the job's heartbeat
    settings, the watch on rank 0's heartbeat of the first worker rank of each node, and the rank it serves: its
    own, or its gang's leader), or the exit code when the job cannot start (bad input: rank 0 says why)."""
    backoff = Backoff(longest=0.01)
    while (msg := comm.improbe(source=0, tag=TAG)) is None:
        backoff.sleep()
    setup = msg.recv()
    if isinstance(setup, SetupFailed):
        return EXIT_BAD_INPUT  # the master could not start; it says why
    remove_stale()
    log_path = None
    if setup.log_dir:
        Path(setup.log_dir).mkdir(parents=True, exist_ok=True)
        log_path = Path(setup.log_dir) / f"trainer-{comm.rank}.log"
    node = node_comm(comm)
    gang = gang_of(comm.rank, comm.size - 1, setup.spread_ranks)
    try:
        placement = _placement(comm, node)
        supervisor.place(setup.task_fn, cores=list(placement.cores), device=placement.device,
                         devices=placement.devices, log_path=log_path, pack=setup.pack, spread=setup.spread,
                         gang=len(gang) > 1)
        supervisor.start()  # if not started yet: the trainer children import their task function while data is shared
        shared = share(comm, node, want=setup.want)
    except DataShareError:
        return EXIT_BAD_INPUT  # every rank has the same error; the master reports it
    finally:
        node.Free()
    supervisor.attach(shared.descriptor())
    if len(gang) > 1:
        meet(comm, supervisor.children[0], gang, setup.liveness.worker_timeout)
    log.debug("worker %d on %s: %s, cores %s", comm.rank, socket.gethostname(), placement.device, placement.cores)
    return shared, placement.device, setup.liveness, _master_watch(setup.liveness, placement), gang[0]


def _master_watch(liveness: Liveness, placement: Placement) -> MasterWatch | None:
    """The first worker rank of each node watches rank 0's heartbeat file: one look per node and interval on the
    shared file system, and a node other than rank 0's finds it silent even when rank 0's whole node froze. It
    waits half as long again as the timeout, so that a watcher outside the job (the command that started it, the
    recovery supervisor), which ends it more cleanly, goes first where there is one."""
    if not liveness.master_file or placement.local_index != 0:
        return None
    return MasterWatch(liveness.master_file, 1.5 * liveness.master_timeout, every=liveness.interval)


def start_failed(comm: Any, exc: Exception) -> NoReturn:
    """A worker rank failed unexpectedly while the job started (a bug, or its node refusing it memory, a file or a
    process): the other ranks wait for it in the data's sharing, so the whole job is ended (MPI_Abort) once the
    error is written, as when rank 0 fails."""
    log.error("worker rank %d on %s failed while the job started: %s: %s; ending the job", comm.rank,
              socket.gethostname(), type(exc).__name__, exc, exc_info=exc)
    flush_then_abort(comm, EXIT_CRASH)


def worker_serve(comm: Any, supervisor: Pack, device: str, liveness: Liveness | None = None,
                 watch: MasterWatch | None = None) -> None:
    """Serve the master until STOP: receive tasks and cancels, stream progress and results back, and Alive when
    nothing else went for a heartbeat's interval (also while the supervisor waits for its trainer child to start).
    `watch`: rank 0's heartbeat file, on the first worker rank of each node; MasterSilent once it stands still.
    Ready says how many tasks the rank runs at once, and again when that changes (an "auto" pack sized itself)."""
    pulse = Pulse(comm, (liveness or Liveness()).interval)
    supervisor.waiting = pulse.beat
    capacity = supervisor.capacity
    comm.send(Ready(comm.rank, socket.gethostname(), device, capacity), dest=0, tag=TAG)
    backoff = Backoff()
    echoes: dict[int, dict] = {}  # task id -> what its Result adds (protocol.Task)
    try:
        while True:
            msg = comm.improbe(source=0, tag=TAG)
            events: list = []
            if msg is not None:
                obj = msg.recv()
                if isinstance(obj, Stop):
                    supervisor.stop()  # a cancelled task writes nothing once the master has its answer
                    comm.send(Stopped(comm.rank), dest=0, tag=TAG)  # the last message it sends
                    break
                if isinstance(obj, Task):
                    if (echo := getattr(obj.payload, "echo", None)) is not None:
                        echoes[obj.id] = echo
                    events += supervisor.submit(obj)
                elif isinstance(obj, Cancel):
                    events += supervisor.cancel(obj.id, obj.status)
            # While a task runs, wait on the child's pipe (select: no CPU) rather than sleeping blind.
            events += supervisor.poll(0.0 if msg is not None else (0.01 if supervisor.busy else 0.0))
            if supervisor.capacity != capacity:
                capacity = supervisor.capacity
                events.append(Ready(comm.rank, socket.gethostname(), device, capacity))
            for ev in events:
                if ev.__class__ is Result and ev.id in echoes:
                    ev.metrics.update(echoes.pop(ev.id))
                comm.send(ev, dest=0, tag=TAG)
            if events:
                pulse.sent()
            pulse.beat()
            if watch is not None and (silent := watch.check()) is not None:
                raise MasterSilent(watch.describe(silent))
            if msg is not None or events:
                backoff.reset()
            elif not supervisor.busy:
                backoff.sleep()
    finally:
        supervisor.stop()
