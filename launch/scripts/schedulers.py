"""One table entry per scheduler: its directives, how its submitter answers, and how its launcher places the ranks.

The layout is always the same: one worker rank per GPU (or per share of a CPU-only node) and one master, rank 0, on
the first node beside that node's workers, so it takes no GPU from any of them. The runtime (launch/placement.py)
binds each worker to its GPU and the physical cores nearest it (from sysfs), so the launchers leave every rank the
whole node; where a launcher binds the ranks of a node to disjoint sets of cores (jsrun's resource file), the
runtime keeps them. Each rule below names the page that documents it.
"""
from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from galapagos.launch.mpi import mpiexec
from galapagos.launch.scripts.request import SCHEDULERS_ORDER, JobRequest, JobScriptError, Layout, hms

SRUN_DOC = "https://slurm.schedmd.com/srun.html"
SBATCH_DOC = "https://slurm.schedmd.com/sbatch.html"
SUMMIT_DOC = "https://docs.olcf.ornl.gov/systems/summit_user_guide.html"
ERF_DOC = "https://www.ibm.com/support/knowledgecenter/en/SSWRJV_10.1.0/jsm/erf_format.html"
ERF_INDEXING_DOC = "https://github.com/olcf-tutorials/ERF-CPU-Indexing"
ALCF_JOBS_DOC = "https://docs.alcf.anl.gov/running-jobs/"
FLUX_JOBS_DOC = "https://flux-framework.readthedocs.io/projects/flux-core/en/latest/man1/flux-jobs.html"


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
    active: tuple[str, ...] = ()  # command that answers for a job id (appended) while it is queued or running
    # shell lines that write the allocation's nodes, one a line, to "$node_file" (rank 0 goes on the first); the
    # default, the batch node alone, restarts the ranks on the whole allocation (galapagos/flows/recovery.py)
    nodes: Callable[[JobRequest], list[str]] = lambda r: ['hostname >"$node_file"']
    # shell text that runs one task on node "$node" through the launcher (recovery's probe); exit 0: it answers
    probe: Callable[[JobRequest], str] = lambda r: "true"
    still_active: Callable[[str], bool] = lambda out: bool(out.strip())  # what that command printed means active
    stdin: bool = False


def _extra(req: JobRequest) -> str:
    return f" {req.launcher_args}" if req.launcher_args else ""


# -- Slurm (Perlmutter, Frontier) ------------------------------------------------------------------------------------
def _slurm_directives(req: JobRequest) -> list[str]:
    lay = req.layout
    return [f"--job-name={req.job_name}", f"--nodes={lay.nodes}", f"--ntasks={lay.ranks}",
            "--overcommit", "--exclusive",
            # sbatch(1) --no-kill: a node's failure does not revoke the allocation, so new steps may run on the
            # nodes that remain (the step on the dead node still ends: SLURM_NO_KILL is not set). The batch script
            # itself runs on the first node: if that node dies the script dies with it, and Slurm ends the job
            # (NODE_FAIL), requeued where JobRequeue=1 or --requeue allows (slurm.conf(5) JobRequeue); a requeued
            # script resumes the run (galapagos supervise adds --resume when the run directory holds a run).
            *([] if lay.nodes == 1 else ["--no-kill"]),
            *([f"--gpus-per-node={lay.gpus_per_node}"] if lay.gpus_per_node else []),
            # --signal=B:USR1@lead signals the batch shell only (sbatch: SBATCH_DOC)
            *([f"--time={_slurm_time(req.walltime)}", f"--signal=B:USR1@{req.stop_before}"] if req.walltime else []),
            *([f"--account={req.account}"] if req.account else []),
            *([f"--partition={req.queue}"] if req.queue else []),
            # a QOS is not a partition: at NERSC a job without one gets debug (https://docs.nersc.gov/jobs/policy/)
            *([f"--qos={req.qos}"] if req.qos else []),
            *([f"--constraint={req.constraint}"] if req.constraint else []),
            f"--output={req.job_dir}/{req.stem}-%j.out"]


def _slurm_time(seconds: int) -> str:
    days, rest = divmod(seconds, 86400)
    return f"{days}-{hms(rest)}" if days else hms(rest)


def _slurm_launch(req: JobRequest, extra: dict) -> tuple[list[str], str]:
    lay = req.layout
    mpi = f" --mpi={req.mpi}" if req.mpi else ""
    gpu = f" --gpus-per-node={lay.gpus_per_node} --gpu-bind=none" if lay.gpus_per_node else ""
    bind = ["# --overcommit lets the master be one task more than the workers' slots; --cpu-bind=none and",
            "# --gpu-bind=none leave every rank the whole node for the runtime's own binding. --kill-on-bad-exit=1:",
            "# a rank that ends with an error ends the step (srun's default lets the others wait to the wall time)."]
    if req.mpi == "pmi2":
        bind += ["# --mpi=pmi2: Slurm's pmi2 plugin reads each PMI-1 request with one read() of 1024 bytes",
                 "# (src/plugins/mpi/pmi2/pmi1.c) though it allows values of 1024: an MPICH that speaks PMI-1 (the",
                 "# pip wheel) exchanging network addresses between nodes can send longer ones and hang in MPI_Init."]
    if lay.nodes == 1 and req.launcher != "mpiexec":
        # one node: srun's default (block) layout puts every task on it, and the step's process map is right
        # (Slurm before 24.05 reports each task on a node of its own under --distribution=arbitrary)
        return [f"# One node: rank 0 and its {lay.per_node} workers all on it.", *bind], (
            f"srun --ntasks={lay.ranks} --overcommit --kill-on-bad-exit=1{mpi} --cpu-bind=none{gpu}{_extra(req)} "
            "\"${command[@]}\"")
    place = [(f"# An explicit host list from the nodes that answer: the first node twice over for rank 0 and its "
              f"workers, then {lay.per_node} per node."), *bind,
             "# The host list gives the nodes: srun takes no --nodes with --distribution=arbitrary (Slurm 23.11 and",
             "# later refuse it).",
             "# SLURM_OVERLAP (srun --overlap): a step after a lost node may share the CPUs of the one before, which",
             "# stays COMPLETING until Slurm has given up the dead node (else: \"Requested nodes are busy\").",
             "export SLURM_OVERLAP=1",
             'export SLURM_HOSTFILE="$job_dir/hosts-$SLURM_JOB_ID"',
             (f"awk -v per={lay.per_node} 'NR == 1 {{print}} {{for (i = 0; i < per; i++) print}}' \"$node_file\" "
              '>"$SLURM_HOSTFILE"')]
    ranks = f"$((nodes * {lay.per_node} + 1))"
    if req.launcher == "mpiexec":  # Hydra starts its proxies through Slurm and places ranks by the host list
        return place, f'{shlex.quote(_mpiexec())} -n {ranks} -f "$SLURM_HOSTFILE"{_extra(req)} "${{command[@]}}"'
    # SRUN_DOC: "-N, --nodes ... NOTE: This option cannot be used in with arbitrary distribution"; --distribution=
    # arbitrary lays the tasks out in the order of SLURM_HOSTFILE; --mpi=<type> picks the PMI srun serves
    return place, (f"srun --ntasks={ranks} --distribution=arbitrary --overcommit --kill-on-bad-exit=1{mpi} "
                   f"--cpu-bind=none{gpu}{_extra(req)} \"${{command[@]}}\"")


# SRUN_DOC: -w/--nodelist, -N, -n; one task on the node, as a step of the job's allocation (--overlap: beside the
# failed step, still COMPLETING)
SLURM_PROBE = 'srun --overlap --nodes=1 --ntasks=1 --nodelist="$node" true'


# -- LSF with jsrun (Summit) -----------------------------------------------------------------------------------------
def _lsf_directives(req: JobRequest) -> list[str]:
    lead_minutes = max(1, math.ceil(req.stop_before / 60))
    # -wa/-wt: https://www.ibm.com/docs/en/SSWRJV_10.1.0/lsf_command_ref/bsub.wa.1.html (and bsub.wt.1.html)
    return [f"-J {req.job_name}", f"-nnodes {req.layout.nodes}",
            *([f"-W {_lsf_time(req.walltime)}", "-wa USR1", f"-wt {lead_minutes}"] if req.walltime else []),
            *([f"-P {req.account}"] if req.account else []),
            *([f"-q {req.queue}"] if req.queue else []),
            *([f"-alloc_flags {shlex.quote(req.constraint)}"] if req.constraint else []),
            f"-o {req.job_dir}/{req.stem}-%J.out"]


def _lsf_time(seconds: int) -> str:
    minutes = math.ceil(seconds / 60)
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


SOCKETS = 2  # IBM AC922 (Summit, Sierra): two POWER9 sockets, GPUs split evenly between them (SUMMIT_DOC)
THREAD_IDS_PER_CORE = 4  # hardware-thread numbers per POWER9 core, whatever the SMT level (ERF_INDEXING_DOC)


def smt_level(constraint: str | None) -> int:
    """The SMT level -alloc_flags asks for (smt1, smt2, smt4); Summit's default is smt4 (SUMMIT_DOC)."""
    levels = re.findall(r"\bsmt([124])\b", constraint or "")
    return int(levels[-1]) if levels else 4


def _split(cores: list[int], parts: int) -> list[list[int]]:
    size, rest = divmod(len(cores), parts)
    out, at = [], 0
    for i in range(parts):
        n = size + (i < rest)
        out.append(cores[at:at + n])
        at += n
    return out


def _cpu_set(socket: int, cores: list[int], stride: int, smt: int) -> str:
    """Physical hardware-thread numbers of `cores` (indices within `socket`), as ERF ranges: with
    cpu_index_using: physical, thread t of core c on socket s is 4 * (s * stride + c) + t, and only the first
    `smt` threads of a core exist under SMT1 and SMT2 (ERF_INDEXING_DOC)."""
    threads = [THREAD_IDS_PER_CORE * (socket * stride + c) + t for c in cores for t in range(smt)]
    runs: list[list[int]] = []
    for t in threads:
        if runs and t == runs[-1][1] + 1:
            runs[-1][1] = t
        else:
            runs.append([t, t])
    return ",".join(f"{{{a}-{b}}}" if a != b else f"{{{a}}}" for a, b in runs)


def erf(layout: Layout, smt: int = 4) -> str:
    """jsrun's explicit resource file (ERF_DOC) for AC922 nodes: rank 0 on host 1 without a GPU, then one rank per
    GPU (or per share of a CPU-only node) on every host.

    Physical indexing: `cpus_per_node` usable cores are split evenly between the sockets; each socket has one more
    core that the system keeps (Summit: 21 + 1, so socket 1 starts at hardware thread 88). GPUs 0..G/2-1 sit on
    socket 0 and the rest on socket 1, and each worker gets its own cores of its GPU's socket, SMT-aware. Rank 0
    takes the last core of socket 0 on host 1 for itself when that socket has a core to spare, else shares one.
    """
    if layout.cpus_per_node is None:
        raise JobScriptError("--cpus-per-node is needed for jsrun's resource file (e.g. 42 on Summit)")
    if layout.cpus_per_node % SOCKETS:
        raise JobScriptError(f"--cpus-per-node {layout.cpus_per_node}: jsrun's resource file splits the cores "
                             f"evenly over {SOCKETS} sockets")
    usable = layout.cpus_per_node // SOCKETS
    stride = usable + 1  # the system's core at the end of each socket
    socket_of = [i * SOCKETS // layout.per_node for i in range(layout.per_node)]
    on_socket = [socket_of.count(s) for s in range(SOCKETS)]
    if max(on_socket) > usable:
        raise JobScriptError(f"{layout.per_node} workers per node: more than the {usable} cores of a socket")
    lines = ["cpu_index_using: physical"]
    spare = on_socket[0] < usable
    if not spare:
        lines += ["overlapping_rs: allow", "oversubscribe_cpu: allow"]
    master = _cpu_set(0, [usable - 1], stride, smt)
    lines.append(f"rank: 0 : {{ host: 1; cpu: {master} }}")
    rank = 1
    for host in range(1, layout.nodes + 1):
        shares = []
        for s in range(SOCKETS):
            free = usable - 1 if host == 1 and s == 0 and spare else usable  # rank 0's own core stays out
            shares.append(_split(list(range(free)), on_socket[s]) if on_socket[s] else [])
        taken = [0] * SOCKETS
        for i in range(layout.per_node):
            s = socket_of[i]
            cores = shares[s][taken[s]]
            taken[s] += 1
            gpu = f"; gpu: {{{i}}}" if layout.gpus_per_node else ""
            lines.append(f"rank: {rank} : {{ host: {host}; cpu: {_cpu_set(s, cores, stride, smt)}{gpu} }}")
            rank += 1
    return "\n".join(lines) + "\n"


def _lsf_launch(req: JobRequest, extra: dict) -> tuple[list[str], str]:
    name = f"{req.stem}.erf"
    smt = smt_level(req.constraint)
    extra[name] = erf(req.layout, smt)
    place = [f"# {name} (beside this script) places rank 0 on the first host without a GPU and gives each worker",
             f"# its own GPU and its own physical cores of that GPU's socket (SMT{smt}); see schedulers.py:erf.",
             "# -disable_gpu_hooks: each worker's trainer is a CUDA process that is no MPI process, which Spectrum",
             "# MPI's CUDA hook fails on (\"CUDA Hook Library: Failed to find symbol\"); the run sends no GPU buffers.",
             f"# ({SUMMIT_DOC}, 'CUDA hook error when program uses CUDA without first calling MPI_Init()')"]
    return place, (f'jsrun --erf_input "$job_dir/{name}" --smpiargs="-disable_gpu_hooks"{_extra(req)} '
                   '"${command[@]}"')


# -- PBS (PBS Pro with PALS mpiexec: Polaris, Aurora; Torque with aprun: ALPS) -------------------------------------
def _pbs_directives(req: JobRequest, select: str) -> list[str]:
    return [f"-N {req.job_name}", select,
            *([f"-l walltime={hms(req.walltime)}"] if req.walltime else []),
            # ALCF_JOBS_DOC: "filesystems ... is mandatory" (else "qsub: Resource: filesystems is required to be set")
            *([f"-l filesystems={req.filesystems}"] if req.filesystems else []),
            *([f"-A {req.account}"] if req.account else []),
            *([f"-q {req.queue}"] if req.queue else []),
            "-j oe", f"-o {req.job_dir}/"]


PALS_CHECK = """\
launcher_version=$(mpiexec --version 2>&1 || true)
if ! command -v mpiexec >/dev/null || [[ "${launcher_version,,}" == *hydra* \\
      || "${launcher_version,,}" == *"open mpi"* || "${launcher_version,,}" == *"intel(r) mpi"* ]]; then
    echo "galapagos job: mpiexec ($(command -v mpiexec || echo none)) is not HPE Cray PALS's, which this PBS Pro job" \\
         "needs: load the site's modules first (galapagos setup --site NAME prints them) and do not put a pip" \\
         "mpich's Hydra mpiexec ahead of PALS on PATH" >&2
    exit 2
fi"""


def _pbs_launch(req: JobRequest, extra: dict) -> tuple[list[str], str]:
    """PALS mpiexec (ALCF_JOBS_DOC): -n, --ppn and --cpu-bind per MPMD command; the hosts are the job's own
    ($PBS_NODEFILE, one line per node with place=scatter:excl), which PALS takes itself, so no host list is given
    (Hydra refuses --hosts in both MPMD parts, and PALS fills the nodes in that order). The first command is rank 0
    and the first node's workers (P + 1 on it); the second, P workers on each node after it."""
    lay = req.layout
    place = ["# HPE Cray PALS mpiexec, not another MPI's: a Hydra mpiexec refuses these options, and PALS starts the",
             "# ranks of a wheel MPICH as singletons.", *PALS_CHECK.splitlines(),
             "# Two MPMD commands over the nodes that answer, in $PBS_NODEFILE order (PALS fills them in that order):",
             f"# rank 0 and the first node's {lay.per_node} workers on the first node, then {lay.per_node} workers on "
             "each other node.",
             "# --cpu-bind none leaves the cores to the runtime."]
    # --hostfile: the nodes that answer, one a line (ALCF_JOBS_DOC runs mpiexec on a share of $PBS_NODEFILE so)
    first = f'--hostfile "$node_file" -n {lay.per_node + 1} --ppn {lay.per_node + 1} "${{command[@]}}"'
    if lay.nodes == 1:
        return place, f"mpiexec --cpu-bind none{_extra(req)} {first}"
    one = f'[ "$nodes" -gt 1 ] || exec mpiexec --cpu-bind none{_extra(req)} {first}'
    return [*place, one], (f"mpiexec --cpu-bind none{_extra(req)} {first} : -n $(((nodes - 1) * {lay.per_node})) "
                           f"--ppn {lay.per_node} --cpu-bind none \"${{command[@]}}\"")


def _alps_launch(req: JobRequest, extra: dict) -> tuple[list[str], str]:
    lay = req.layout
    place = ["# Two MPMD parts, which ALPS puts on separate nodes: rank 0 with the first node's workers, then",
             f"# {lay.per_node} workers per node on the others. -cc none leaves the cores to the runtime."]
    first = f"-n {lay.per_node + 1} -N {lay.per_node + 1} -cc none{_extra(req)} \"${{command[@]}}\""
    if lay.nodes == 1:
        return place, f"aprun {first}"
    return place, (f"aprun {first} : -n {lay.workers - lay.per_node} -N {lay.per_node} -cc none{_extra(req)} "
                   "\"${command[@]}\"")


# -- Flux ------------------------------------------------------------------------------------------------------------
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
    # --requires=host:LIST, the nodes that answer (RFC 31 constraints; https://flux-framework.readthedocs.io/
    # projects/flux-core/en/latest/man1/flux-run.html); nothing when every node of the allocation is there
    hosts = '$([ "$nodes" = ' + str(lay.nodes) + ' ] || echo --requires=host:"$(paste -sd, "$node_file")")'
    return place, (f"flux run -N $nodes -n $((nodes * {lay.per_node} + 1)) {hosts} -o cpu-affinity=off "
                   f"-o gpu-affinity=off{_extra(req)} \"${{command[@]}}\"")


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
        active=("squeue", "--noheader", "--jobs"),
        nodes=lambda r: ['scontrol show hostnames "$SLURM_JOB_NODELIST" >"$node_file"'], probe=lambda r: SLURM_PROBE),
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
        _pbs_launch, dependency=lambda job: f"-W depend=afterany:{job}", active=("qstat",),
        # $PBS_NODEFILE: one line per node with place=scatter:excl, once each, in order
        nodes=lambda r: ["awk '!seen[$0]++' \"$PBS_NODEFILE\" >\"$node_file\""],
        probe=lambda r: 'echo "$node" >"$job_dir/probe-$node" && mpiexec --hostfile "$job_dir/probe-$node" -n 1 true'),
    # FLUX_JOBS_DOC: job ids on the command line list only those jobs ("Filtering options ignored with jobid
    # list", so --filter cannot say whether a listed job is still active); {state} is DEPEND, PRIORITY, SCHED,
    # RUN, CLEANUP or INACTIVE, and an unknown id exits 1. -n is --no-header (--suppress-header before flux 0.47)
    "flux": Scheduler(
        "flux", "# flux:", ("flux", "batch"), r"^(\S+)", _flux_directives, _flux_launch,
        dependency=lambda job: f"--dependency=afterany:{job}",
        active=("flux", "jobs", "-n", "--format={state}"),
        still_active=lambda out: bool(out.split()) and out.split()[0] != "INACTIVE",
        # flux-hostlist(1): `instance`, the hosts of this job's instance, expanded one a line
        nodes=lambda r: ["flux hostlist --expand --delimiter='\\n' instance >\"$node_file\""],
        probe=lambda r: 'flux run -N 1 -n 1 --requires=host:"$node" true'),
    "local": Scheduler(
        "local", "# local:", ("bash",), r"^(\d+)", lambda r: [f"{r.layout.ranks} MPI ranks on this machine"],
        _local_launch, dependency=lambda job: f"after process {job}"),
}
assert tuple(SCHEDULERS) == SCHEDULERS_ORDER
