"""The one place that imports mpi4py, lazily, so `import evolve` works on a laptop without MPI."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

from galapagos.datashare.poll import Backoff  # noqa: F401  (re-exported: launch's loops poll with it)

# Environment variables that a launcher sets in every rank it starts.
_LAUNCHER_VARS = (
    "PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE",
    "SLURM_STEP_ID", "ALPS_APP_PE", "JSM_NAMESPACE_SIZE", "FLUX_TASK_RANK", "PALS_RANKID",
)


# How many tasks the launcher says it started: srun (a step's tasks), PMI-1/2 launchers (Hydra, Cray PALS, Flux),
# Open MPI's mpirun, MVAPICH, jsrun, Flux's job shell.
_SIZE_VARS = ("SLURM_STEP_NUM_TASKS", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE",
              "JSM_NAMESPACE_SIZE", "FLUX_JOB_SIZE")
_RANK_VARS = ("SLURM_PROCID", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "JSM_NAMESPACE_RANK",
              "FLUX_TASK_RANK")


def under_launcher() -> bool:
    """True when this process was started by mpiexec/srun/jsrun/aprun/flux, so MPI already has its ranks."""
    return any(v in os.environ for v in _LAUNCHER_VARS)


def unwired(size: int) -> str | None:
    """Why MPI is not wired, when the launcher started several tasks but MPI sees a world of `size` 1: every
    task is a singleton (the launcher and the MPI library speak no common PMI). None when all is well."""
    if size != 1:
        return None
    for var in _SIZE_VARS:
        tasks = os.environ.get(var, "")
        if tasks.isdigit() and int(tasks) > 1:
            break
    else:
        return None
    if var == "SLURM_STEP_NUM_TASKS":
        fix = ("srun's MPI plugin does not match this MPI library: pass srun --mpi=pmi2 (the mpich wheel; "
               "`srun --mpi=list` shows what this Slurm has), or `galapagos launch --launcher mpiexec`")
    else:
        fix = (f"this launcher belongs to another MPI than the one mpi4py loads ({_mpi_library()}); start the job "
               "with that MPI's own launcher")
    return f"MPI is not wired: the launcher started {tasks} tasks ({var}={tasks}) but each sees only itself: {fix}"


def launcher_rank() -> int:
    """This task's rank as its launcher numbered it (0 when it says nothing)."""
    for var in _RANK_VARS:
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def _mpi_library() -> str:
    from mpi4py import MPI

    return MPI.Get_library_version().splitlines()[0].strip()


def world() -> Any:
    """COMM_WORLD, importing and initialising MPI on first use."""
    import mpi4py

    mpi4py.rc.thread_level = "funneled"  # datashare reads and checksums on threads; only this one calls MPI
    from mpi4py import MPI

    return MPI.COMM_WORLD


def node_comm(comm: Any) -> Any:
    """The ranks of `comm` that share this node's memory.

    GALAPAGOS_RANKS_PER_NODE=k splits each real node into groups of k ranks that behave as separate nodes: how
    tests and benchmarks exercise the between-node paths on one machine.
    """
    from mpi4py import MPI

    # Grouped by host name rather than MPI_COMM_TYPE_SHARED: under Slurm's arbitrary distribution (the host list of
    # `galapagos launch` job scripts) MPICH's PMI-2 gets no process map and would put every rank on a node alone.
    names = comm.allgather(MPI.Get_processor_name())
    node = comm.Split(sorted(set(names)).index(names[comm.rank]), comm.rank)
    per_node = int(os.environ.get("GALAPAGOS_RANKS_PER_NODE", "0") or 0)
    if per_node > 0:
        fake = node.Split(node.rank // per_node, comm.rank)
        node.Free()
        node = fake
    return node


def mpiexec() -> str:
    """The mpiexec that matches the MPI library mpi4py loads (the one beside this Python first)."""
    override = os.environ.get("GALAPAGOS_MPIEXEC")
    if override:
        return override
    local = Path(sys.executable).parent / "mpiexec"
    if local.exists():
        return str(local)
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if not found:
        raise RuntimeError("no mpiexec found: install MPI (pip install 'galapagos-nas[mpich]') or set "
                           "GALAPAGOS_MPIEXEC")
    return found


# MPICH's shared-memory segments on a node: its ranks remove them in MPI_Finalize, so the ranks of a job that was
# killed leave them in /dev/shm, holding memory until the node reboots.
_MPICH_SEGMENTS = ("mpich_shm_", "mpich_shar_tmp")


def shm_segments() -> set[str]:
    """The names of MPICH's segments now in /dev/shm."""
    try:
        return {p.name for p in Path("/dev/shm").iterdir() if p.name.startswith(_MPICH_SEGMENTS)}
    except OSError:
        return set()


def orphaned_segments(before: set[str]) -> set[str]:
    """MPICH's segments that appeared since `before` and that no process has mapped: left by a job that did not end
    cleanly (a job started meanwhile maps its own)."""
    new = shm_segments() - before
    if not new:
        return new
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:
            continue
        new = {name for name in new if name not in text}
    return new


def remove_leftover_segments(before: set[str]) -> list[str]:
    """After a job that did not end cleanly: remove this user's orphaned MPICH segments (`orphaned_segments`).
    Returns the names removed."""
    removed = []
    for name in sorted(orphaned_segments(before)):
        path = Path("/dev/shm", name)
        try:
            if path.stat().st_uid == os.getuid():
                path.unlink()
                removed.append(name)
        except OSError:
            pass
    return removed
