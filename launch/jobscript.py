"""Job scripts that run one Galapagos job across a whole machine, for the scheduler that machine has.

Every script has the same body (header, `set -euo pipefail`, the site's setup, the environment, a clean stop ahead
of the wall time, the launch line); what differs per scheduler is a small table entry: its directives and how its
launcher places the ranks. The layout is always the same: one worker rank per GPU (or per share of a CPU-only
node) and one master, rank 0, on the first node beside that node's workers, so it takes no GPU from any of them.
The runtime (launch/placement.py) binds each worker to cuda:<its index among the workers of its node> and to an
even share of the node's cores, so the launchers leave every rank the whole node unless noted.
"""
from __future__ import annotations

import math
import re
import shlex
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from launch.cli import UsageError

SCHEDULERS_ORDER = ("slurm", "lsf", "alps", "pbs", "flux", "local")
JOB_COMMANDS = ("evolve", "ensemble", "design")
PATH_OPTIONS = ("--data", "--out", "--config", "--from")


# -- what a job asks for -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """N nodes with `per_node` workers each, plus the master on the first node."""

    nodes: int
    gpus_per_node: int
    per_node: int  # workers per node: one per GPU, or --workers-per-node on CPU-only nodes
    cpus_per_node: int | None = None

    @property
    def workers(self) -> int:
        return self.nodes * self.per_node

    @property
    def ranks(self) -> int:
        return self.workers + 1


@dataclass(frozen=True)
class JobRequest:
    scheduler: str
    layout: Layout
    command: tuple[str, ...]  # the galapagos subcommand and its arguments, paths absolute
    out: Path  # the run directory of the command
    program: str  # how to start galapagos on the compute nodes
    workdir: Path
    walltime: int | None = None  # seconds
    stop_before: int = 0  # seconds ahead of the wall time at which the run is told to stop
    account: str | None = None
    queue: str | None = None
    job_name: str = "galapagos"
    constraint: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    setup: str = ""
    launcher_args: str = ""
    launcher: str = ""  # "" (the scheduler's own) or "mpiexec" (this installation's, inside the allocation)
    after: str | None = None  # job id this job waits for (any end state)
    generated_by: str = ""
    script: Path | None = None

    @property
    def job_dir(self) -> Path:
        return self.script.parent if self.script else self.out / "job"

    @property
    def stem(self) -> str:
        return self.script.stem if self.script else self.scheduler

    @property
    def warn_at(self) -> int | None:
        """Seconds from the start at which the script's own watchdog asks for the stop."""
        return None if self.walltime is None else self.walltime - self.stop_before


# -- checks --------------------------------------------------------------------------------------------------------
def parse_walltime(text: str) -> int:
    """'HH:MM', 'HH:MM:SS', 'D-HH:MM[:SS]' or minutes -> seconds."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+):(\d{1,2})(?::(\d{1,2}))?|(\d+)", text.strip())
    if not m:
        raise UsageError(f"--walltime {text!r}: expected HH:MM (or HH:MM:SS, D-HH:MM, or minutes)")
    days, hours, minutes, seconds, only_minutes = m.groups()
    if only_minutes is not None:
        total = 60 * int(only_minutes)
    else:
        if int(minutes) > 59 or (seconds and int(seconds) > 59):
            raise UsageError(f"--walltime {text!r}: minutes and seconds must be below 60")
        total = ((int(days or 0) * 24 + int(hours)) * 60 + int(minutes)) * 60 + int(seconds or 0)
    if total <= 0:
        raise UsageError(f"--walltime {text!r}: must be longer than zero")
    return total


def default_stop_before(walltime: int) -> int:
    """A tenth of the wall time, at least one minute (cancelled tasks get 30 s to report), at most ten."""
    return max(60, min(600, walltime // 10))


def make_layout(nodes: int | None, gpus_per_node: int | None, *, cpus_per_node: int | None = None,
                workers_per_node: int | None = None, site: dict | None = None) -> Layout:
    """Check the geometry against itself and against the machine a site profile describes."""
    site = site or {}
    if nodes is None:
        raise UsageError("--nodes is required (or `nodes` in the --site profile)")
    if gpus_per_node is None:
        raise UsageError("--gpus-per-node is required (0 for CPU-only nodes; or `gpus_per_node` in --site)")
    if nodes < 1:
        raise UsageError(f"--nodes {nodes}: a job needs at least one node")
    if gpus_per_node < 0:
        raise UsageError(f"--gpus-per-node {gpus_per_node}: must be 0 or more")
    if cpus_per_node is not None and cpus_per_node < 1:
        raise UsageError(f"--cpus-per-node {cpus_per_node}: must be at least 1")
    for key, value, flag in (("max_nodes", nodes, "--nodes"), ("gpus_per_node", gpus_per_node, "--gpus-per-node"),
                             ("cpus_per_node", cpus_per_node, "--cpus-per-node")):
        limit = site.get("machine", {}).get(key)
        if limit is not None and value is not None and value > limit:
            raise UsageError(f"{flag} {value}: the machine in {site.get('path', '--site')} has only {limit}")
    if gpus_per_node:
        if workers_per_node not in (None, gpus_per_node):
            raise UsageError(f"--workers-per-node {workers_per_node}: with GPUs there is one worker per GPU "
                             f"({gpus_per_node} per node)")
        per_node = gpus_per_node
    else:
        per_node = workers_per_node or cpus_per_node
        if per_node is None:
            raise UsageError("--gpus-per-node 0: CPU-only nodes need --workers-per-node K (or --cpus-per-node C "
                             "for one worker per core)")
        if per_node < 1:
            raise UsageError(f"--workers-per-node {per_node}: must be at least 1")
    if cpus_per_node is not None and per_node > cpus_per_node:
        raise UsageError(f"{per_node} workers per node need at least {per_node} cores, but --cpus-per-node is "
                         f"{cpus_per_node}")
    return Layout(nodes, gpus_per_node, per_node, cpus_per_node)


# -- the common body -----------------------------------------------------------------------------------------------
STOP_TEXT = ("Clean stop ahead of the wall time: {how}. The trap notes the request; once every rank catches the "
             "signal (the master touches $GALAPAGOS_READY_FILE after all ranks started: a rank still starting would "
             "die of it) SIGUSR1 goes on to the launcher, which hands it to every rank: the master stops handing out "
             "tasks, cancels the running ones (not recorded, so a resumed run breeds afresh), writes summary.json "
             "and exits; workers ignore SIGUSR1 and leave when the master stops them. Write the follow-up job with "
             "`galapagos launch --resume {out}`.")

STOP_BLOCK = """\
stop_requested=0
export GALAPAGOS_READY_FILE="$job_dir/.ready-$$"
rm -f "$GALAPAGOS_READY_FILE"
request_stop() {
    [ "$stop_requested" = 1 ] || echo "galapagos job: stop requested" >&2
    stop_requested=1
}
trap request_stop USR1 TERM
"""

WATCHDOG = """\
( trap 'kill "$sleep_pid" 2>/dev/null; exit 0' TERM; sleep {warn_at} & sleep_pid=$!
  wait "$sleep_pid" && kill -USR1 $$ ) &
watchdog_pid=$!
"""

RUN_BLOCK = """\
if [ "$stop_requested" = 1 ]; then
    echo "galapagos job: stopped before the run started" >&2
    exit 0
fi
{launch} &
launcher_pid=$!
passed=0
while kill -0 "$launcher_pid" 2>/dev/null; do
    if [ "$stop_requested" = 1 ] && [ "$passed" = 0 ] && [ -e "$GALAPAGOS_READY_FILE" ]; then
        echo "galapagos job: passing SIGUSR1 to the run" >&2
        kill -USR1 "$launcher_pid" 2>/dev/null || true
        passed=1
    fi
    sleep 1 & wait $! || true
done
status=0
wait "$launcher_pid" || status=$?
rm -f "$GALAPAGOS_READY_FILE"
{cleanup}exit "$status"
"""


def _comment(text: str) -> list[str]:
    return [f"# {line}".rstrip() for line in text.splitlines()]


def _shell_value(value: str) -> str:
    """Double-quoted: the job's shell expands $VARIABLES in --env values (e.g. /tmp/cache-$USER), nothing else."""
    return '"' + re.sub(r'([\\"`])', r"\\\1", value) + '"'


def _hms(seconds: int) -> str:
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def render(req: JobRequest) -> tuple[str, dict[str, str]]:
    """The job script, and any files it needs beside it (name -> text), for `req.scheduler`."""
    sched = SCHEDULERS[req.scheduler]
    if req.after and sched.dependency is None:
        raise UsageError(f"--after: the {req.scheduler} scheduler has no job dependencies")
    directives = [f"{sched.prefix} {d}" for d in sched.directives(req)]
    if req.after:
        directives.append(f"{sched.prefix} {sched.dependency(req.after)}")
    extra: dict[str, str] = {}
    place, launch = sched.launch(req, extra)
    lay = req.layout
    gpus = (f"{lay.gpus_per_node} GPU(s) per node, one worker per GPU" if lay.gpus_per_node else
            f"no GPUs, {lay.per_node} worker(s) per node")
    lines = ["#!/bin/bash", *directives, "#",
             "# Galapagos job script, generated by:",
             *_comment(req.generated_by or "galapagos launch"),
             "#",
             f"# {lay.nodes} node(s), {gpus}: {lay.workers} worker(s) + 1 master = {lay.ranks} MPI ranks.",
             "# Rank 0, the master, runs on the first node beside that node's workers and uses no GPU. Each worker",
             "# binds cuda:<its index among the workers of its node> (counted without rank 0) and an even share of",
             "# its node's cores (launch/placement.py), so the launcher leaves GPUs and cores to the runtime.",
             "set -euo pipefail", f"job_dir={shlex.quote(str(req.job_dir))}",
             f"run_dir={shlex.quote(str(req.out))}", ""]
    how = (sched.signal_how(req) if req.walltime and sched.signal_how else
           f"a watchdog in this script sends SIGUSR1 {req.stop_before} s before the wall time" if req.walltime
           else "no wall time was given, so only a SIGUSR1 or SIGTERM sent to this script stops the run early")
    lines += ["# " + line for line in textwrap.wrap(STOP_TEXT.format(how=how, out=req.out), 112)]
    lines += STOP_BLOCK.splitlines()
    watchdog = req.walltime is not None and sched.signal_how is None
    if watchdog:
        lines += WATCHDOG.format(warn_at=req.warn_at).splitlines()
    if req.setup.strip():
        lines += ["", "# -- site setup (--setup)", *req.setup.strip().splitlines()]
    lines += ["", "# -- environment", "export PYTHONUNBUFFERED=1",
              *(f"export {k}={_shell_value(v)}" for k, v in req.env), f"cd {shlex.quote(str(req.workdir))}"]
    lines += ["", "# -- the run: the command whose resolved config and run directory are pinned here",
              f"command=({' '.join(shlex.quote(a) for a in _program(req))})", ""]
    if place:
        lines += ["# -- where the ranks go", *place, ""]
    cleanup = 'kill "$watchdog_pid" 2>/dev/null || true\n' if watchdog else ""
    lines += RUN_BLOCK.format(launch=launch, cleanup=cleanup).splitlines()
    return "\n".join(lines) + "\n", extra


def _program(req: JobRequest) -> list[str]:
    return [*shlex.split(req.program), *req.command]


# -- one entry per scheduler ---------------------------------------------------------------------------------------
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
        raise UsageError("--cpus-per-node is needed for jsrun's resource file (e.g. 42 on Summit)")
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
             "# its own GPU; see launch/jobscript.py:erf."]
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
    from launch.mpi import mpiexec

    try:
        return mpiexec()
    except RuntimeError as exc:
        raise UsageError(str(exc)) from None


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


# -- from the command line: options, site profiles, the command, the files ----------------------------------------
OPTION_KEYS = ("scheduler", "nodes", "gpus_per_node", "cpus_per_node", "workers_per_node", "walltime", "stop_before",
               "account", "queue", "job_name", "constraint", "setup", "launcher", "launcher_args", "program")
SITE_KEYS = (*OPTION_KEYS, "env", "machine", "description")
MACHINE_KEYS = ("max_nodes", "gpus_per_node", "cpus_per_node")
SETTINGS = "launch.toml"  # in <run dir>/job/: what `launch --resume` needs to write the follow-up job


def load_site(path: str | Path) -> dict:
    """A TOML site profile: defaults for any launch option, [env], and [machine] limits that flags cannot exceed."""
    import tomllib

    p = Path(path)
    try:
        site = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise UsageError(f"--site {p}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"--site {p}: not valid TOML: {exc}") from None
    for key in site:
        if key not in SITE_KEYS:
            raise UsageError(f"--site {p}: unknown key {key!r} (known: {', '.join(SITE_KEYS)})")
    for key in site.get("machine", {}):
        if key not in MACHINE_KEYS:
            raise UsageError(f"--site {p}: unknown key machine.{key} (known: {', '.join(MACHINE_KEYS)})")
    return {**site, "path": str(p)}


def _parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise UsageError(f"--env {pair!r}: expected NAME=VALUE")
        env[key] = value
    return env


def _parse_command(tokens: list[str]):
    """argparse's verdict on a galapagos command, as a UsageError instead of an exit."""
    import contextlib
    import io

    from launch.cli import build_parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return build_parser().parse_args(tokens)
    except SystemExit:
        why = err.getvalue().strip().splitlines()
        raise UsageError(f"the command after --: {why[-1] if why else 'not a valid galapagos command'}") from None


def resolve_command(tokens: list[str], cwd: Path) -> tuple[tuple[str, ...], Path]:
    """The galapagos command after `--`, checked, with every path made absolute; and its run directory."""
    tokens = list(tokens)
    if tokens[:1] == ["--"]:
        tokens = tokens[1:]
    if tokens and Path(tokens[0]).name == "galapagos":
        tokens = tokens[1:]
    if not tokens:
        raise UsageError("no command: put the Galapagos command after --, e.g. "
                         "-- galapagos evolve --data data.h5 --out runs/big --evaluations 5000")
    if tokens[0] not in JOB_COMMANDS:
        raise UsageError(f"the command after -- must be a Galapagos job ({', '.join(JOB_COMMANDS)}), not "
                         f"{shlex.join(tokens[:2])!r}")
    resolved, i = [tokens[0]], 1
    while i < len(tokens):
        name, eq, value = tokens[i].partition("=")
        if name in PATH_OPTIONS and eq:
            resolved.append(f"{name}={(cwd / value).absolute()}")
        elif name in PATH_OPTIONS and i + 1 < len(tokens):
            resolved += [name, str((cwd / tokens[i + 1]).absolute())]
            i += 1
        else:
            resolved.append(tokens[i])
        i += 1
    _parse_command(resolved)
    paths = _path_values(resolved)
    if "--out" not in paths:
        raise UsageError(f"the command after -- has no --out: galapagos {resolved[0]} needs a run directory")
    out = Path(paths["--out"])
    if not out.parent.is_dir():
        raise UsageError(f"--out {out}: parent directory {out.parent} does not exist")
    for option, value in paths.items():
        if option != "--out" and not Path(value).exists():
            raise UsageError(f"{option} {value}: no such file or directory")
    return tuple(resolved), out


def _path_values(tokens: list[str] | tuple[str, ...]) -> dict[str, str]:
    values, i = {}, 0
    while i < len(tokens):
        name, eq, value = tokens[i].partition("=")
        if name in PATH_OPTIONS:
            values[name] = value if eq else tokens[i + 1]
            i += 0 if eq else 1
        i += 1
    return values


def _without_option(tokens: tuple[str, ...], option: str) -> list[str]:
    out, skip = [], False
    for t in tokens:
        if skip:
            skip = False
        elif t == option:
            skip = True
        elif not t.startswith(option + "="):
            out.append(t)
    return out


def pin_config(command: tuple[str, ...], out: Path, job_dir: Path) -> tuple[str, ...]:
    """evolve: check the config now, write the resolved file beside the script and run the job with it."""
    from launch.cli import _evolve_config
    from launch.rundir import RunDir

    args = _parse_command(list(command))
    if args.command != "evolve" or args.resume:
        return command
    config = _evolve_config(args)  # bad keys and values fail here, before anything is written
    RunDir.check(out, resume=False)
    job_dir.mkdir(parents=True, exist_ok=True)
    pinned = job_dir / "config.toml"
    pinned.write_text(config.dumps())
    return (*_without_option(command, "--config"), "--config", str(pinned))


def resume_command(command: tuple[str, ...]) -> tuple[str, ...]:
    """The follow-up of a job: the same command continuing its run (--resume, the run's own config)."""
    tokens = _without_option(command, "--config")
    if "--resume" not in tokens:
        tokens.append("--resume")
    try:
        _parse_command(tokens)
    except UsageError as exc:
        raise UsageError(f"galapagos {tokens[0]} cannot be resumed: {exc}") from None
    return tuple(tokens)


def default_program() -> str:
    """The galapagos of this installation, by absolute path, so the job runs what was checked here."""
    import sys

    entry = Path(sys.executable).parent / "galapagos"
    return str(entry) if entry.exists() else f"{sys.executable} -m launch.cli"


def next_script(job_dir: Path, scheduler: str) -> Path:
    taken = [int(m.group(1)) for p in job_dir.glob(f"{scheduler}-*.sh")
             if (m := re.fullmatch(rf"{scheduler}-(\d+)\.sh", p.name))]
    return job_dir / f"{scheduler}-{max(taken, default=0) + 1}.sh"


def build_request(opts: dict, command: tuple[str, ...], out: Path, *, site: dict | None = None,
                  script: Path | None = None, after: str | None = None, generated_by: str = "") -> JobRequest:
    """Check every option and turn them into one JobRequest."""
    scheduler = opts.get("scheduler")
    if scheduler is None:
        raise UsageError(f"--scheduler is required: one of {', '.join(SCHEDULERS_ORDER)} (or `scheduler` in --site)")
    if scheduler not in SCHEDULERS:
        raise UsageError(f"--scheduler {scheduler!r}: unknown; expected one of {', '.join(SCHEDULERS_ORDER)}")
    layout = make_layout(opts.get("nodes"), opts.get("gpus_per_node"), cpus_per_node=opts.get("cpus_per_node"),
                         workers_per_node=opts.get("workers_per_node"), site=site)
    if scheduler == "local" and layout.nodes != 1:
        raise UsageError(f"--nodes {layout.nodes}: the local scheduler runs on this machine only (--nodes 1)")
    walltime = opts.get("walltime")
    seconds = parse_walltime(walltime) if isinstance(walltime, str) else walltime
    stop_before = opts.get("stop_before")
    if seconds is None:
        if stop_before is not None:
            raise UsageError("--stop-before needs --walltime: it counts back from the wall time")
        stop_before = 0
    else:
        stop_before = default_stop_before(seconds) if stop_before is None else stop_before
        if stop_before < 0 or stop_before >= seconds:
            raise UsageError(f"--stop-before {stop_before}: must be at least 0 and less than the wall time "
                             f"({seconds} s)")
    launcher = opts.get("launcher") or ""
    if launcher not in ("", "mpiexec") or (launcher and scheduler != "slurm"):
        raise UsageError(f"--launcher {launcher!r}: only 'mpiexec' (inside a Slurm allocation, instead of srun)")
    job_name = opts.get("job_name") or f"galapagos-{command[0]}"
    if not re.fullmatch(r"[A-Za-z0-9_.+-]+", job_name):
        raise UsageError(f"--job-name {job_name!r}: use letters, digits and _ . + - only")
    return JobRequest(scheduler, layout, command, out, opts.get("program") or default_program(),
                      Path(opts.get("workdir") or Path.cwd()), seconds, stop_before, opts.get("account"),
                      opts.get("queue"), job_name, opts.get("constraint"),
                      tuple((opts.get("env") or {}).items()), opts.get("setup") or "",
                      opts.get("launcher_args") or "", launcher, after, generated_by, script)


def write_job(req: JobRequest) -> Path:
    """Write the script (executable) and the files it needs; returns its path."""
    text, extra = render(req)
    req.job_dir.mkdir(parents=True, exist_ok=True)
    for name, body in extra.items():
        (req.job_dir / name).write_text(body)
    req.script.write_text(text)
    req.script.chmod(0o755)
    return req.script


def save_settings(req: JobRequest, job_id: str | None = None) -> Path:
    """<run>/job/launch.toml: the options of this job, for `launch --resume`; submitted job ids accumulate."""
    import tomllib

    import tomli_w

    path = req.out / "job" / SETTINGS
    jobs = tomllib.loads(path.read_text()).get("jobs", []) if path.exists() else []
    jobs.append({"script": str(req.script), **({"id": job_id} if job_id else {})})
    lay = req.layout
    settings = {"scheduler": req.scheduler, "nodes": lay.nodes, "gpus_per_node": lay.gpus_per_node,
                "workers_per_node": None if lay.gpus_per_node else lay.per_node, "cpus_per_node": lay.cpus_per_node,
                "walltime": req.walltime,
                "stop_before": req.stop_before if req.walltime else None, "account": req.account,
                "queue": req.queue, "job_name": req.job_name, "constraint": req.constraint, "setup": req.setup,
                "launcher": req.launcher or None, "launcher_args": req.launcher_args, "program": req.program, "workdir": str(req.workdir),
                "command": list(req.command), "env": dict(req.env), "jobs": jobs}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps({k: v for k, v in settings.items() if v is not None}))
    return path


def load_settings(run_dir: Path) -> dict:
    import tomllib

    path = run_dir / "job" / SETTINGS
    if not path.exists():
        raise UsageError(f"--resume {run_dir}: no {path.relative_to(run_dir)} (was this run started with "
                         "`galapagos launch`?)")
    return tomllib.loads(path.read_text())


# -- the `galapagos launch` command --------------------------------------------------------------------------------
def add_parser(sub) -> None:
    """The `launch` subcommand's options (called from launch.cli.build_parser)."""
    import argparse

    p = sub.add_parser("launch", help="write (and submit) the batch job that runs a galapagos command across a "
                       "whole machine: slurm, lsf, alps, pbs, flux or local",
                       usage="galapagos launch --scheduler S --nodes N --gpus-per-node G [options] "
                             "-- galapagos evolve|ensemble|design ...")
    p.add_argument("--site", help="TOML profile with one machine's defaults and limits (see examples/sites/)")
    p.add_argument("--scheduler", help=f"one of {', '.join(SCHEDULERS_ORDER)}")
    p.add_argument("--nodes", type=int)
    p.add_argument("--gpus-per-node", type=int, help="one worker rank per GPU; 0 for CPU-only nodes")
    p.add_argument("--cpus-per-node", type=int, help="cores per node (jsrun's resource file needs it)")
    p.add_argument("--workers-per-node", type=int, help="worker ranks per CPU-only node (default: one per core)")
    p.add_argument("--walltime", help="HH:MM (or HH:MM:SS, D-HH:MM, minutes)")
    p.add_argument("--stop-before", type=int, metavar="SECONDS", help="tell the run to stop this long before the "
                   "wall time (default: a tenth of it, 60 to 600 s)")
    p.add_argument("--account")
    p.add_argument("--queue", help="queue or partition")
    p.add_argument("--job-name")
    p.add_argument("--constraint", help="node feature: Slurm --constraint, PBS select extra, LSF -alloc_flags, "
                   "Flux --requires")
    p.add_argument("--env", action="append", metavar="NAME=VALUE", help="exported in the job (repeatable)")
    p.add_argument("--setup", help="shell lines run before the launch: module loads, a venv")
    p.add_argument("--launcher", choices=["mpiexec"], help="slurm: start the ranks with this installation's "
                   "mpiexec inside the allocation instead of srun (when srun cannot speak its MPI's PMI)")
    p.add_argument("--launcher-args", help="extra arguments for srun, jsrun, aprun, mpiexec or flux run")
    p.add_argument("--program", help="how the compute nodes start galapagos (default: this installation's)")
    p.add_argument("--script", help="where to write the script (default: <out>/job/<scheduler>-<n>.sh)")
    p.add_argument("--submit", action="store_true", help="submit the script and print the job id")
    p.add_argument("--after", metavar="JOBID", help="start only after this job has ended")
    p.add_argument("--chain", type=int, default=0, metavar="N", help="with --submit: also submit N follow-up jobs, "
                   "each resuming the run after the one before ends")
    p.add_argument("--resume", metavar="DIR", help="write the follow-up job of the run in DIR (its saved options, "
                   "overridden by any given here)")
    p.add_argument("job_command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                   help="galapagos evolve|ensemble|design ...")


def main(args, argv: list[str]) -> int:
    """Check everything, write the script (and its settings), then submit it and any chained follow-ups."""
    from dataclasses import replace

    from launch.submit import is_active, submit

    site = load_site(args.site) if args.site else {}
    given = {k: getattr(args, k) for k in OPTION_KEYS if getattr(args, k, None) is not None}
    env = _parse_env(args.env or [])
    tokens = args.job_command[1:] if args.job_command[:1] == ["--"] else args.job_command
    if args.chain and not args.submit:
        raise UsageError("--chain needs --submit: follow-up jobs wait on the id of the job before them")
    if args.chain < 0:
        raise UsageError(f"--chain {args.chain}: must be 0 or more")
    if args.resume:
        if tokens:
            raise UsageError(f"--resume {args.resume} writes the follow-up of that run: give no command after --")
        out = Path(args.resume).absolute()
        saved = load_settings(out)
        opts = {**{k: v for k, v in site.items() if k in OPTION_KEYS},
                **{k: v for k, v in saved.items() if k in (*OPTION_KEYS, "workdir")}, **given}
        env = {**site.get("env", {}), **saved.get("env", {}), **env}
        command = resume_command(tuple(saved["command"]))
        after = args.after
        last = next((j["id"] for j in reversed(saved.get("jobs", [])) if "id" in j), None)
        if after is None and last and is_active(opts["scheduler"], last):
            after = last
            print(f"waits for job {last}, which is still queued or running", flush=True)
    else:
        opts = {**{k: v for k, v in site.items() if k in OPTION_KEYS}, **given}
        env = {**site.get("env", {}), **env}
        command, out = resolve_command(tokens, Path.cwd())
        after = args.after
    opts["env"] = env
    generated_by = shlex.join(["galapagos", *argv])
    req = build_request(opts, command, out, site=site, after=after, generated_by=generated_by,
                        script=Path(args.script).absolute() if args.script else out / "job" / "check.sh")
    render(req)  # scheduler-specific checks, before anything is written
    if args.script and not req.script.parent.is_dir():
        raise UsageError(f"--script {args.script}: directory {req.script.parent} does not exist")
    if not args.resume:
        command = pin_config(command, out, out / "job")
    req = replace(req, command=command, script=req.script if args.script else next_script(out / "job",
                                                                                         req.scheduler))
    jobs = [req]
    for k in range(args.chain):
        jobs.append(replace(req, command=resume_command(req.command), after=None,
                            script=req.script.with_name(f"{req.script.stem}-follow-{k + 1}.sh"),
                            generated_by=f"{generated_by}  (follow-up {k + 1} of --chain {args.chain})"))
    previous = None
    for job in jobs:
        if job is not req:
            job = replace(job, after=previous)
        write_job(job)
        print(f"script: {job.script}", flush=True)
        job_id = submit(job.scheduler, job.script) if args.submit else None
        save_settings(job, job_id)
        if job_id:
            print(f"submitted: {job.scheduler} job {job_id}", flush=True)
        previous = job_id
    return 0
