"""One table entry per scheduler: its directives, how its submitter answers, and how its launcher places the ranks.

The layout is always the same: one worker rank per GPU (or per share of a CPU-only node) and one master, rank 0, on
the first node beside that node's workers, so it takes no GPU from any of them. The runtime (launch/placement.py)
binds each worker to cuda:<its index among the workers of its node> and to an even share of the node's cores, so
the launchers leave every rank the whole node unless noted.
"""
from __future__ import annotations

import math
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from launch.mpi import mpiexec
from launch.scripts.request import SCHEDULERS_ORDER, JobRequest, JobScriptError, Layout


@dataclass(frozen=True)
class Scheduler:
    name: str
    prefix: str  # how a directive line starts
    submit: tuple[str, ...]  # the submitter; the script path is appended (bsub reads it from stdin)
    job_id: str  # regular expression whose first group is the job id in the submitter's output
    directives: Callable[[JobRequest], list[str]]
    launch: Callable[[JobRequest, dict], tuple[list[str], str]]  # (placement lines, launch line)
    dependency: Callable[[str], str] | None = None
    signal_how: Callable[[JobRequest], str] | None = None  # the scheduler warns natively (else: watchdog)
    active: tuple[str, ...] = ()  # command that succeeds with output while a job id is queued or running
    stdin: bool = False


def _hms(seconds: int) -> str:
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _extra(req: JobRequest) -> str:
    return f" {req.launcher_args}" if req.launcher_args else ""


def _slurm_directives(req: JobRequest) -> list[str]:
    lay = req.layout
    return [f"--job-name={req.job_name}", f"--nodes={lay.nodes}", f"--ntasks={lay.ranks}",
            "--overcommit", "--exclusive",
            *([f"--gpus-per-node={lay.gpus_per_node}"] if lay.gpus_per_node else []),
            *([f"--time={_slurm_time(req.walltime)}", f"--signal=B:USR1@{req.stop_before}"] if req.walltime else []),
            *([f"--account={req.account}"] if req.account else []),
            *([f"--partition={req.queue}"] if req.queue else []),
            *([f"--constraint={req.constraint}"] if req.constraint else []),
            f"--output={req.job_dir}/{req.stem}-%j.out"]


def _slurm_time(seconds: int) -> str:
    days, rest = divmod(seconds, 86400)
    return f"{days}-{_hms(rest)}" if days else _hms(rest)


def _slurm_launch(req: JobRequest, extra: dict) -> tuple[list[str], str]:
    lay = req.layout
    place = [(f"# An explicit host list: the first node twice over for rank 0 and its workers, then {lay.per_node} "
              "per node."),
             "# --overcommit lets the master be one task more than the workers' slots; --cpu-bind=none and",
             "# --gpu-bind=none leave every rank the whole node for the runtime's own binding.",
             'export SLURM_HOSTFILE="$job_dir/hosts-$SLURM_JOB_ID"',
             (f'scontrol show hostnames "$SLURM_JOB_NODELIST" | awk -v per={lay.per_node} '
              "'NR == 1 {print} {for (i = 0; i < per; i++) print}' >\"$SLURM_HOSTFILE\"")]
    if req.launcher == "mpiexec":  # Hydra starts its proxies through Slurm and places ranks by the host list
        return place, f'{shlex.quote(_mpiexec())} -n {lay.ranks} -f "$SLURM_HOSTFILE"{_extra(req)} "${{command[@]}}"'
    gpu = f" --gpus-per-node={lay.gpus_per_node} --gpu-bind=none" if lay.gpus_per_node else ""
    return place, (f"srun --nodes={lay.nodes} --ntasks={lay.ranks} --distribution=arbitrary --overcommit "
                   f"--cpu-bind=none{gpu}{_extra(req)} \"${{command[@]}}\"")


def _lsf_directives(req: JobRequest) -> list[str]:
    lead_minutes = max(1, math.ceil(req.stop_before / 60))
    return [f"-J {req.job_name}", f"-nnodes {req.layout.nodes}",
            *([f"-W {_lsf_time(req.walltime)}", "-wa USR1", f"-wt {lead_minutes}"] if req.walltime else []),
            *([f"-P {req.account}"] if req.account else []),
            *([f"-q {req.queue}"] if req.queue else []),
            *([f"-alloc_flags {shlex.quote(req.constraint)}"] if req.constraint else []),
            f"-o {req.job_dir}/{req.stem}-%J.out"]


def _lsf_time(seconds: int) -> str:
    minutes = math.ceil(seconds / 60)
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def erf(layout: Layout) -> str:
    """jsrun's explicit resource file: rank 0 on host 1 without a GPU, then one rank per GPU on every host.

    Every rank may use all cores of its host (the runtime splits them); each worker sees only its own GPU, which
    the runtime then finds as its one visible device.
    """
    if layout.cpus_per_node is None:
        raise JobScriptError("--cpus-per-node is needed for jsrun's resource file (e.g. 42 on Summit)")
    cpus = f"{{0-{layout.cpus_per_node - 1}}}"
    lines = ["cpu_index_using: logical", "overlapping_rs: allow", "oversubscribe_cpu: allow",
             f"rank: 0 : {{ host: 1; cpu: {cpus} }}"]
    rank = 1
    for host in range(1, layout.nodes + 1):
        for i in range(layout.per_node):
            gpu = f"; gpu: {{{i}}}" if layout.gpus_per_node else ""
            lines.append(f"rank: {rank} : {{ host: {host}; cpu: {cpus}{gpu} }}")
            rank += 1
    return "\n".join(lines) + "\n"


def _lsf_launch(req: JobRequest, extra: dict) -> tuple[list[str], str]:
    name = f"{req.stem}.erf"
    extra[name] = erf(req.layout)
    place = [f"# {name} (beside this script) places rank 0 on the first host without a GPU and gives each worker",
             "# its own GPU; see launch/scripts/schedulers.py:erf."]
    return place, f'jsrun --erf_input "$job_dir/{name}"{_extra(req)} "${{command[@]}}"'


def _pbs_directives(req: JobRequest, select: str) -> list[str]:
    return [f"-N {req.job_name}", select,
            *([f"-l walltime={_hms(req.walltime)}"] if req.walltime else []),
            *([f"-A {req.account}"] if req.account else []),
            *([f"-q {req.queue}"] if req.queue else []),
            "-j oe", f"-o {req.job_dir}/"]


def _pbs_launch(req: JobRequest, extra: dict) -> tuple[list[str], str]:
    lay = req.layout
    place = ["# Two MPMD parts with explicit hosts: rank 0 and the first node's workers on the first node, then",
             f"# {lay.per_node} workers on each other node. --cpu-bind none leaves the cores to the runtime.",
             'mapfile -t hosts < <(awk \'!seen[$0]++\' "$PBS_NODEFILE")']
    first = f"-n {lay.per_node + 1} --ppn {lay.per_node + 1} --hosts \"${{hosts[0]}}\" \"${{command[@]}}\""
    if lay.nodes == 1:
        return place, f"mpiexec --cpu-bind none{_extra(req)} {first}"
    place.append('rest=$(IFS=,; echo "${hosts[*]:1}")')
    return place, (f"mpiexec --cpu-bind none{_extra(req)} {first} : -n {lay.workers - lay.per_node} "
                   f"--ppn {lay.per_node} --hosts \"$rest\" \"${{command[@]}}\"")


def _alps_launch(req: JobRequest, extra: dict) -> tuple[list[str], str]:
    lay = req.layout
    place = ["# Two MPMD parts, which ALPS puts on separate nodes: rank 0 with the first node's workers, then",
             f"# {lay.per_node} workers per node on the others. -cc none leaves the cores to the runtime."]
    first = f"-n {lay.per_node + 1} -N {lay.per_node + 1} -cc none{_extra(req)} \"${{command[@]}}\""
    if lay.nodes == 1:
        return place, f"aprun {first}"
    return place, (f"aprun {first} : -n {lay.workers - lay.per_node} -N {lay.per_node} -cc none{_extra(req)} "
                   "\"${command[@]}\"")


def _flux_directives(req: JobRequest) -> list[str]:
    return [f"--job-name={req.job_name}", f"-N {req.layout.nodes}", "--exclusive",
            *([f"-t {math.ceil(req.walltime / 60)}m"] if req.walltime else []),
            *([f"--bank={req.account}"] if req.account else []),
            *([f"--queue={req.queue}"] if req.queue else []),
            *([f"--requires={req.constraint}"] if req.constraint else []),
            f"--output={req.job_dir}/{req.stem}-{{{{id}}}}.out"]


def _flux_launch(req: JobRequest, extra: dict) -> tuple[list[str], str]:
    lay = req.layout
    place = [(f"# {lay.ranks} tasks on {lay.nodes} node(s) as evenly as possible, the one extra on the first node "
              "(block order):"),
             "# rank 0 and the first node's workers there. Affinity off: the runtime binds GPUs and cores."]
    return place, (f"flux run -N {lay.nodes} -n {lay.ranks} -o cpu-affinity=off -o gpu-affinity=off"
                   f"{_extra(req)} \"${{command[@]}}\"")


def _mpiexec() -> str:
    try:
        return mpiexec()
    except RuntimeError as exc:
        raise JobScriptError(str(exc)) from None


def _local_launch(req: JobRequest, extra: dict) -> tuple[list[str], str]:
    place = []
    if req.after:
        place = [f"# wait for the previous job (process {req.after}) to end",
                 f"while kill -0 {shlex.quote(req.after)} 2>/dev/null; do sleep 5; done"]
    return place, f"{shlex.quote(_mpiexec())} -n {req.layout.ranks}{_extra(req)} \"${{command[@]}}\""


SCHEDULERS: dict[str, Scheduler] = {
    "slurm": Scheduler(
        "slurm", "#SBATCH", ("sbatch", "--parsable"), r"^(\d+)", _slurm_directives, _slurm_launch,
        dependency=lambda job: f"--dependency=afterany:{job}",
        signal_how=lambda r: f"Slurm sends SIGUSR1 to this script {r.stop_before} s before the wall time "
                             "(--signal=B:USR1@...; up to a minute earlier)",
        active=("squeue", "--noheader", "--jobs")),
    "lsf": Scheduler(
        "lsf", "#BSUB", ("bsub",), r"Job <(\d+)>", _lsf_directives, _lsf_launch, stdin=True,
        dependency=lambda job: f"-w 'ended({job})'",
        signal_how=lambda r: f"LSF sends SIGUSR1 {math.ceil(r.stop_before / 60)} minute(s) before the wall time "
                             "(-wa USR1 -wt)",
        active=("bjobs", "-noheader")),
    "alps": Scheduler(
        "alps", "#PBS", ("qsub",), r"^(\S+)",
        lambda r: _pbs_directives(r, f"-l nodes={r.layout.nodes}" + (f":{r.constraint}" if r.constraint else "")),
        _alps_launch, dependency=lambda job: f"-W depend=afterany:{job}", active=("qstat",)),
    "pbs": Scheduler(
        "pbs", "#PBS", ("qsub",), r"^(\S+)",
        lambda r: [*_pbs_directives(r, f"-l select={r.layout.nodes}" + (f":{r.constraint}" if r.constraint
                                                                         else "")), "-l place=scatter:excl"],
        _pbs_launch, dependency=lambda job: f"-W depend=afterany:{job}", active=("qstat",)),
    "flux": Scheduler(
        "flux", "# flux:", ("flux", "batch"), r"^(\S+)", _flux_directives, _flux_launch,
        dependency=lambda job: f"--dependency=afterany:{job}"),
    "local": Scheduler(
        "local", "# local:", ("bash",), r"^(\d+)", lambda r: [f"{r.layout.ranks} MPI ranks on this machine"],
        _local_launch, dependency=lambda job: f"after process {job}"),
}
assert tuple(SCHEDULERS) == SCHEDULERS_ORDER
