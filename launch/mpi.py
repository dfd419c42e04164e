"""The one place that imports mpi4py, lazily, so `import evolve` works on a laptop without MPI."""
from __future__ import annotations

import atexit
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from galapagos.datashare.poll import Backoff  # noqa: F401  (re-exported: launch's loops poll with it)

# The prefixes of the variables an MPI library and its launcher pass to their ranks (PMI, PMIx, Open MPI, Hydra,
# MPICH): a process started from a rank without them does not take itself for one.
MPI_ENV_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "MPIR_", "HYDRA_", "MPICH_")
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


def plain_env() -> dict[str, str]:
    """This process's environment less what a launcher set for its ranks: for a plain process started from a rank
    (no rank of the job, and no MPI of its own)."""
    return {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS + _SIZE_VARS + _RANK_VARS
            and not k.startswith(MPI_ENV_PREFIXES)}


def unwired(size: int, env: Mapping[str, str] | None = None) -> str | None:
    """Why MPI is not wired, when the launcher started several tasks but MPI sees a world of `size` 1: every
    task is a singleton (the launcher and the MPI library speak no common PMI). None when all is well. The fix it
    names is one that the scheduler in use accepts."""
    env = os.environ if env is None else env
    if size != 1:
        return None
    for var in _SIZE_VARS:
        tasks = env.get(var, "")
        if tasks.isdigit() and int(tasks) > 1:
            break
    else:
        return None
    library = library_version()
    offered = offered_pmi(env)
    fix = pmi_fix(library_kind(library), offered or "", env)
    return (f"MPI is not wired: the launcher started {tasks} tasks ({var}={tasks}) but each sees only itself "
            f"(the launcher serves PMI {offered or 'unknown'}; mpi4py loads {library_label(library)}): {fix}")


def launcher_rank() -> int:
    """This task's rank as its launcher numbered it (0 when it says nothing)."""
    for var in _RANK_VARS:
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


class MPIMismatch(RuntimeError):
    """The launcher and the MPI library cannot meet (found before MPI_Init, which would abort): one line with the
    fix."""


# -- which MPI library mpi4py loads, and which PMI it speaks -----------------------------------------------------------
# MPI_Get_library_version may be called before MPI_Init (MPI 4.1, section 9.1.1), so mpi4py imports with
# rc.initialize False for it (https://mpi4py.readthedocs.io/en/stable/mpi4py.html#mpi4py.rc).
LIBRARIES = (("cray-mpich", "CRAY MPICH"), ("spectrum", "Spectrum MPI"), ("openmpi", "Open MPI"),
             ("intel-mpi", "Intel(R) MPI"), ("mvapich", "MVAPICH"), ("mpich", "MPICH"))
WHEEL_MARK = "pypi.org/p/mpich"  # the pip mpich wheel's "MPICH Custom Information"


def library_version() -> str:
    """MPI_Get_library_version's text, without initialising MPI when this process has not yet (doctor's checks)."""
    import mpi4py

    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = not _ft_enabled()  # world() may still initialise it; then it is finalised at exit
    from mpi4py import MPI

    return MPI.Get_library_version()


def library_kind(text: str) -> str:
    """"mpich-wheel", or one of LIBRARIES' kinds ("cray-mpich", "mpich", "openmpi", ...), or "unknown"."""
    kind = next((k for k, mark in LIBRARIES if mark.lower() in text.lower()), "unknown")
    return "mpich-wheel" if kind == "mpich" and WHEEL_MARK in text else kind


LABELS = {"mpich-wheel": "the pip mpich wheel", "mpich": "MPICH", "cray-mpich": "Cray MPICH", "openmpi": "Open MPI",
          "spectrum": "IBM Spectrum MPI", "intel-mpi": "Intel MPI", "mvapich": "MVAPICH", "unknown": "an MPI"}


def library_label(text: str) -> str:
    """The library in a few words: its kind and the first line of its version text."""
    first = " ".join(text.split("\n", 1)[0].split())
    return f"{LABELS[library_kind(text)]} ({first})"


def configure_line(text: str) -> str:
    """MPICH's configure line, from its version text ("" for other libraries)."""
    return next((line.split(":", 1)[1].strip() for line in text.splitlines()
                 if line.strip().lower().startswith("mpich configure")), "")


def pmi_refused(kind: str, configure: str, offered: str) -> bool:
    """True where the library certainly cannot speak the PMI the launcher serves (its ranks would be singletons, or
    MPI_Init would abort). The pip wheel's MPICH has the simple PMI client only: PMI-1 (Hydra, Flux's shell) and
    PMI-2 (srun --mpi=pmi2); not Cray PMI (srun --mpi=cray_shasta, PALS mpiexec, aprun) nor PMIx. Open MPI 5 and
    Spectrum MPI speak PMIx only (https://docs.open-mpi.org/en/v5.0.x/launching-apps/slurm.html)."""
    cray = ("cray_shasta", "pals", "alps")
    if kind == "mpich-wheel":
        return offered in (*cray, "pmix")
    if kind == "mpich":
        return (offered == "pmix" and "pmix" not in configure.lower()) or (
            offered in cray and "cray" not in configure.lower())
    if kind in ("openmpi", "spectrum"):
        return offered in ("pmi1", *cray)
    return False


def pmi_spoken(kind: str, configure: str) -> str:
    """The PMIs a library speaks, in words (what doctor prints beside its configure line)."""
    if kind == "mpich-wheel":
        return "PMI-1 and PMI-2 (simple PMI client: Hydra, srun --mpi=pmi2, Flux); no Cray PMI, no PMIx"
    if kind == "mpich":
        found = [name for mark, name in (("pmix", "PMIx"), ("cray", "Cray PMI"), ("slurm", "Slurm's PMI"))
                 if mark in configure.lower()]
        return ", ".join(found) or "PMI-1 and PMI-2 (simple PMI client)"
    return {"cray-mpich": "Cray PMI (srun --mpi=cray_shasta, PALS mpiexec, aprun, Flux)",
            "openmpi": "PMIx (mpirun, srun --mpi=pmix, jsrun)", "spectrum": "PMIx (jsrun, mpirun)"}.get(kind, "")


def offered_pmi(env: Mapping[str, str]) -> str | None:
    """The PMI the launcher serves this rank, from the variables it set (None: no launcher, a singleton).
    PMIx servers set PMIX_NAMESPACE and PMIX_RANK (https://openpmix.github.io/); srun's cray_shasta plugin and
    PALS set PALS_* (https://slurm.schedmd.com/mpi_guide.html); Flux's shell serves the simple PMI-1 wire protocol
    (PMI_FD; https://flux-framework.readthedocs.io/projects/flux-core/en/latest/man1/flux-shell.html); Hydra and
    srun --mpi=pmi2 set PMI_FD or PMI_PORT."""
    slurm = "SLURM_STEP_ID" in env
    if "PMIX_NAMESPACE" in env or "PMIX_RANK" in env or "JSM_NAMESPACE_SIZE" in env:
        return "pmix"
    if any(k.startswith("PALS_") for k in env):
        return "cray_shasta" if slurm else "pals"
    if "ALPS_APP_PE" in env:
        return "alps"
    if "FLUX_TASK_RANK" in env:
        return "flux"
    if slurm:
        return srun_pmi(env.get("SLURM_MPI_TYPE", "")) or ("pmi2" if "PMI_FD" in env else None)
    if "PMI_FD" in env or "PMI_PORT" in env:
        return "pmi1"
    return None


def srun_pmi(plugin: str) -> str:
    """The PMI an srun --mpi plugin serves: pmix_v4, pspmix (ParaStation's, JSC) are PMIx; "" for none."""
    plugin = plugin.strip().lower()
    return "pmix" if plugin.startswith("pmix") or plugin == "pspmix" else "" if plugin == "none" else plugin


def scheduler_of(env: Mapping[str, str]) -> str:
    """The batch system this process runs under: slurm, pbs, lsf, flux, alps or local."""
    for var, name in (("SLURM_JOB_ID", "slurm"), ("SLURM_STEP_ID", "slurm"), ("PBS_JOBID", "pbs"),
                      ("LSB_JOBID", "lsf"), ("FLUX_URI", "flux"), ("FLUX_JOB_ID", "flux"), ("ALPS_APP_ID", "alps")):
        if var in env:
            return name
    return "local"


def pmi_fix(kind: str, offered: str, env: Mapping[str, str], site: str = "NAME") -> str:
    """The fix for a library that cannot speak the launcher's PMI, in terms the scheduler in use accepts: only
    Slurm takes `galapagos launch --launcher mpiexec` or --srun-mpi (launch/scripts/request.py); under PBS the
    launcher is PALS's mpiexec, so the MPI must be the site's (https://docs.alcf.anl.gov/polaris/running-jobs/)."""
    scheduler = scheduler_of(env)
    route = f"set up the site's MPI route (`galapagos setup --site {site}`)"
    if kind == "mpich-wheel":
        if scheduler == "slurm" or offered == "cray_shasta":
            return ("the pip mpich wheel speaks PMI-1/PMI-2 only: write the job with `galapagos launch --srun-mpi "
                    "pmi2` (srun --mpi=pmi2) or `--launcher mpiexec`, both over TCP only; for the fast network "
                    f"{route}")
        if scheduler == "lsf":
            return f"jsrun serves PMIx for IBM Spectrum MPI: build mpi4py against the site's MPI: {route}"
        if offered == "pmix":
            return ("the pip mpich wheel speaks no PMIx, which this launcher serves (PALS mpiexec --pmi=pmix on "
                    f"Aurora): use the site's MPICH: {route}")
        if scheduler == "pbs" or offered == "pals":
            return ("PALS mpiexec serves Cray PMI, which the pip mpich wheel cannot speak, and a PBS job has no "
                    f"other launcher: build mpi4py against Cray MPICH or run its wheel on the ABI module: {route}")
        return f"aprun and jsrun serve their own MPI's PMI: build mpi4py against the site's MPI: {route}"
    if kind in ("openmpi", "spectrum"):
        return ("Open MPI speaks PMIx: start it with its own mpirun, srun --mpi=pmix (`galapagos launch --srun-mpi "
                f"pmix`) or jsrun, or {route}")
    return f"start the job with the launcher of the MPI that mpi4py loads, or {route}"


def pmix_refusal(env: Mapping[str, str] | None = None) -> str | None:
    """Aurora's case, found before MPI_Init: the launcher serves PMIx (PMIX_* variables) and the MPICH mpi4py loads
    speaks none, so MPI_Init would abort ("launcher not compatible with PMI1 client", or "unsupported PMI version
    PMIx"). None when no PMIx is offered or the library can take it."""
    env = os.environ if env is None else env
    if "PMIX_NAMESPACE" not in env and "PMIX_RANK" not in env:
        return None
    text = library_version()
    kind = library_kind(text)
    if not pmi_refused(kind, configure_line(text), "pmix"):
        return None
    return (f"the launcher serves PMIx (PMIX_NAMESPACE/PMIX_RANK set) but mpi4py loads {library_label(text)}, "
            "which speaks no PMIx, so MPI_Init would abort: "
            f"{pmi_fix(kind, 'pmix', env)}")


def world() -> Any:
    """COMM_WORLD, importing and initialising MPI on first use. Raises MPIMismatch, before MPI_Init, where the
    launcher serves a PMI that the library cannot speak and MPI_Init would abort."""
    import mpi4py

    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.thread_level = "funneled"  # datashare reads and checksums on threads; only this one calls MPI
        if why := pmix_refusal():
            raise MPIMismatch(why)
        if _ft_enabled():
            mpi4py.rc.finalize = False  # _finalize decides
    from mpi4py import MPI

    if not MPI.Is_initialized():  # imported without initialising (library_version): initialise now
        MPI.Init_thread(MPI.THREAD_FUNNELED)
    if not mpi4py.rc.finalize and failures_survivable():
        atexit.register(_finalize, MPI.COMM_WORLD)
    return MPI.COMM_WORLD


def _ft_enabled() -> bool:
    return os.environ.get("OMPI_MCA_mpi_ft_enable", "").lower() in ("1", "true", "yes", "on")


def _finalize(comm: Any) -> None:
    """ULFM: this rank's end. The surviving ranks agree on the dead ones (MPI_Comm_shrink, which survives them);
    with none dead, MPI_Finalize as usual. With some, Open MPI 5.0's MPI_Finalize waits forever for dead ranks of
    another node, so this rank leaves without it, once everything is written: the job's outcome is already
    decided, and mpiexec under ULFM lets ranks end without it."""
    from mpi4py import MPI

    try:
        survivors = comm.Shrink()
        dead = comm.size - survivors.size
        survivors.Free()
    except MPI.Exception as exc:
        print(f"galapagos: rank {comm.rank}: MPI_Comm_shrink at the end failed: {exc}", file=sys.stderr)
        dead = 1
    if not dead:
        MPI.Finalize()


def failures_survivable() -> bool:
    """True where the MPI lets the job go on when a process dies: Open MPI 5 started with `mpiexec --with-ft ulfm`
    (which sets OMPI_MCA_mpi_ft_enable=1 in every rank), User-Level Failure Mitigation: an operation with a dead
    peer returns MPIX_ERR_PROC_FAILED instead of ending every rank
    (https://docs.open-mpi.org/en/v5.0.8/features/ulfm.html). Open MPI supports it only under its own
    mpirun/mpiexec, not srun. Every other MPI ends the job (and `galapagos supervise` restarts it)."""
    return _ft_enabled() and library_kind(library_version()) == "openmpi"


def failed_ranks(comm: Any, exc: BaseException) -> set[int] | None:
    """Where `exc` is MPI's word that processes of `comm` died (ULFM's MPIX_ERR_PROC_FAILED or _PENDING): the
    ranks it knows dead, acknowledged so that receives from any source work again; None for any other error."""
    from mpi4py import MPI

    dead = {getattr(MPI, name, None) for name in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING")} - {None}
    if not isinstance(exc, MPI.Exception) or exc.Get_error_class() not in dead:
        return None
    comm.Ack_failed()
    group, everyone = comm.Get_failed(), comm.Get_group()
    try:
        return {r for r in MPI.Group.Translate_ranks(group, list(range(group.Get_size())), everyone)
                if r != MPI.UNDEFINED}
    finally:
        group.Free()
        everyone.Free()


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
