"""How a job (evolve, ensemble, design, predict over ranks) runs, whoever starts it.

Under a launcher (mpiexec, srun, jsrun, aprun, flux run) the ranks are there: rank 0 runs the flow's master and
every other rank serves as a worker. Started as one process (a laptop, a notebook, the CLI without mpiexec), the
job checks its inputs here, then starts itself under `mpiexec -n W+1` as ``python -m galapagos.ranks``; rank 0 of
that job writes its result (or its one-line error) to a file that this process reads back.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from galapagos.errors import UsageError

log = logging.getLogger("galapagos")


class JobFailed(RuntimeError):
    """The started job ended without a result; its ranks' output says why."""

    def __init__(self, name: str, code: int):
        super().__init__(f"galapagos {name}: the job ended with exit code {code} (see its output above)")
        self.code = code


class WorkerExit(Exception):
    """A worker rank ends with this exit code (the master could not start the job; rank 0 says why)."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


@dataclass(frozen=True)
class Flow:
    """One application flow: what is checked before any rank starts, and what rank 0 does under MPI."""

    name: str
    check: Callable[[Any], Any]  # options -> anything; raises on bad input, writes nothing
    master: Callable[[Any, Any], dict | None]  # (comm, options) -> the result, on rank 0
    phases: int = 1  # jobs each worker rank serves in turn (design: evolution, then ensemble)


def setup_logging(rank: int = 0, logfile: Path | None = None) -> None:
    """Rank 0 logs at INFO, workers at WARNING, each line with its rank."""
    fmt = f"%(asctime)s [rank {rank}] %(levelname)s %(message)s"
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if logfile is not None:
        handlers.append(logging.FileHandler(logfile))
    for h in handlers:
        h.setFormatter(logging.Formatter(fmt, "%H:%M:%S"))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, handlers=handlers, force=True)


def default_workers() -> int:
    """One worker per GPU, else one per core (a share of a node for each)."""
    from launch.placement import gpu_count

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return gpu_count() or cores


def run(flow: Flow, opts: Any) -> dict | None:
    """The flow's result on rank 0 (or in the process that started the job); None on the other ranks."""
    from launch.mpi import under_launcher

    if not under_launcher():
        flow.check(opts)
        return start_ranks(flow.name, opts, opts.workers or default_workers())
    return run_rank(flow, opts)


def run_rank(flow: Flow, opts: Any) -> dict | None:
    """This rank's part of a job started by a launcher."""
    from launch.mpi import world
    from launch.runtime import announce_ready, catch_stop_signals
    from launch.session import worker_main

    catch_stop_signals()
    comm = world()
    announce_ready(comm)
    if comm.size < 2:
        raise UsageError(f"galapagos {flow.name} needs at least one worker: run it under mpiexec/srun with 2 or "
                         "more ranks (rank 0 is the master), or start it without MPI and pass --workers W")
    if comm.rank == 0:
        workers = getattr(opts, "workers", None)
        if workers and workers != comm.size - 1:
            log.warning("--workers %d ignored: this job has %d worker rank(s)", workers, comm.size - 1)
        return flow.master(comm, opts)
    setup_logging(comm.rank)
    for phase in range(flow.phases):
        if (code := worker_main(comm)) != 0:  # the master could not start this phase; it says why
            if phase == 0:
                raise WorkerExit(code)
            break
    return None


def start_ranks(name: str, opts: Any, workers: int) -> dict | None:
    """Run the job under `mpiexec -n workers+1` and return what its rank 0 returned."""
    from launch.mpi import mpiexec

    if workers < 1:
        raise UsageError(f"--workers {workers}: need at least one worker")
    with tempfile.TemporaryDirectory(prefix="galapagos-") as tmp:
        result = Path(tmp) / "result.json"
        cmd = [mpiexec(), "-n", str(workers + 1), sys.executable, "-m", "galapagos.ranks", name,
               json.dumps(opts.to_dict()), str(result)]
        log.info("starting %d rank(s): %s", workers + 1, " ".join(cmd[:6]) + " ...")
        try:
            code = subprocess.call(cmd)
        except KeyboardInterrupt:
            raise JobFailed(name, 130) from None
        outcome = json.loads(result.read_text()) if result.exists() else {}
    if "error" in outcome:
        raise UsageError(outcome["error"])
    if code != 0 or "result" not in outcome:
        raise JobFailed(name, code or 1)
    return outcome["result"]


def user_errors() -> tuple[type[Exception], ...]:
    """The errors that mean bad input: one line and exit code 2 for the user, never a traceback."""
    from datashare.format import DataError
    from datashare.share import DataShareError
    from ensemble.store import EnsembleError
    from evolve.errors import ConfigError
    from evolve.netdir import ModelError
    from galapagos.rundir import RunDirError
    from launch.scripts import JobScriptError

    return (UsageError, ConfigError, DataError, DataShareError, RunDirError, EnsembleError, ModelError,
            JobScriptError)


@contextmanager
def starting(comm: Any):
    """Rank 0 before it sets the workers up: on bad input (or a file it cannot write) the waiting workers are told
    to leave, then the error is raised as a UsageError."""
    from launch.protocol import SetupFailed
    from launch.session import master_start

    try:
        yield
    except (*user_errors(), ValueError, OSError) as exc:
        master_start(comm, SetupFailed(str(exc)))
        raise UsageError(str(exc)) from None
