"""What a job asks for: the layout of its ranks, every launch option checked into one JobRequest, site profiles
(with their queues' limits), and the settings a run keeps in <run>/job/launch.toml so that its follow-up job can be
written."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SCHEDULERS_ORDER = ("slurm", "lsf", "alps", "pbs", "flux", "local")  # the keys of schedulers.SCHEDULERS


class JobScriptError(ValueError):
    """A bad launch option: one clear line."""


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
    qos: str | None = None  # Slurm's quality of service (NERSC: regular, debug, ...)
    filesystems: str | None = None  # PBS Pro at ALCF: -l filesystems=home:eagle
    mpi: str | None = None  # srun --mpi=<this> (pmi2, pmix, cray_shasta)
    directives: tuple[str, ...] = ()  # extra directive lines, the text after the scheduler's prefix
    stop_before_given: bool = False  # --stop-before (or the site's) was given, not derived from the wall time
    stage: str = ""  # node-local directory the environment and the data are staged into ("" = none; stage.py)
    stage_env: Path | None = None  # the packed environment that is staged (made by `launch`)
    stage_data: str | None = None  # the command's --data file, staged with it
    modules: tuple[str, ...] = ()  # the site's module lines (`module load ...`), run before --setup (sites.py)
    route: str = ""  # one line naming the site's MPI route and its page, for the script's comment
    site: str = ""  # the site profile the job was written with (its path), which the script's doctor checks
    # the script's `galapagos supervise`: restarts after a lost rank or node, and the fewest nodes worth going on with
    max_restarts: int = 3  # (galapagos/flows/recovery.py MAX_RESTARTS)
    min_nodes: int = 1

    @property
    def job_dir(self) -> Path:
        return self.script.parent if self.script else job_folder(self.out)

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
        raise JobScriptError(f"--walltime {text!r}: expected HH:MM (or HH:MM:SS, D-HH:MM, or minutes)")
    days, hours, minutes, seconds, only_minutes = m.groups()
    if only_minutes is not None:
        total = 60 * int(only_minutes)
    else:
        if int(minutes) > 59 or (seconds and int(seconds) > 59):
            raise JobScriptError(f"--walltime {text!r}: minutes and seconds must be below 60")
        total = ((int(days or 0) * 24 + int(hours)) * 60 + int(minutes)) * 60 + int(seconds or 0)
    if total <= 0:
        raise JobScriptError(f"--walltime {text!r}: must be longer than zero")
    return total


def hms(seconds: int) -> str:
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def default_stop_before(walltime: int) -> int:
    """A tenth of the wall time, at least one minute (cancelled tasks get 30 s to report), at most ten."""
    return max(60, min(600, walltime // 10))


def make_layout(nodes: int | None, gpus_per_node: int | None, *, cpus_per_node: int | None = None,
                workers_per_node: int | None = None, site: dict | None = None) -> Layout:
    """Check the geometry against itself and against the machine a site profile describes."""
    site = site or {}
    if nodes is None:
        raise JobScriptError("--nodes is required (or `nodes` in the --site profile)")
    if gpus_per_node is None:
        raise JobScriptError("--gpus-per-node is required (0 for CPU-only nodes; or `gpus_per_node` in --site)")
    if nodes < 1:
        raise JobScriptError(f"--nodes {nodes}: a job needs at least one node")
    if gpus_per_node < 0:
        raise JobScriptError(f"--gpus-per-node {gpus_per_node}: must be 0 or more")
    if cpus_per_node is not None and cpus_per_node < 1:
        raise JobScriptError(f"--cpus-per-node {cpus_per_node}: must be at least 1")
    for key, value, flag in (("max_nodes", nodes, "--nodes"), ("gpus_per_node", gpus_per_node, "--gpus-per-node"),
                             ("cpus_per_node", cpus_per_node, "--cpus-per-node")):
        limit = site.get("machine", {}).get(key)
        if limit is not None and value is not None and value > limit:
            raise JobScriptError(f"{flag} {value}: the machine in {site.get('path', '--site')} has only {limit}")
    if gpus_per_node:
        if workers_per_node not in (None, gpus_per_node):
            raise JobScriptError(f"--workers-per-node {workers_per_node}: with GPUs there is one worker per GPU "
                                 f"({gpus_per_node} per node)")
        per_node = gpus_per_node
    else:
        per_node = workers_per_node or cpus_per_node
        if per_node is None:
            raise JobScriptError("--gpus-per-node 0: CPU-only nodes need --workers-per-node K (or --cpus-per-node "
                                 "C for one worker per core)")
        if per_node < 1:
            raise JobScriptError(f"--workers-per-node {per_node}: must be at least 1")
    if cpus_per_node is not None and per_node > cpus_per_node:
        raise JobScriptError(f"{per_node} workers per node need at least {per_node} cores, but --cpus-per-node is "
                             f"{cpus_per_node}")
    return Layout(nodes, gpus_per_node, per_node, cpus_per_node)


def build_request(opts: dict, command: tuple[str, ...], out: Path, *, site: dict | None = None,
                  script: Path | None = None, after: str | None = None, generated_by: str = "") -> JobRequest:
    """Check every option and turn them into one JobRequest (`opts["program"]`: how the nodes start galapagos)."""
    site = site or {}
    scheduler = opts.get("scheduler")
    if scheduler is None:
        raise JobScriptError(f"--scheduler is required: one of {', '.join(SCHEDULERS_ORDER)} (or `scheduler` in "
                             "--site)")
    if scheduler not in SCHEDULERS_ORDER:
        raise JobScriptError(f"--scheduler {scheduler!r}: unknown; expected one of {', '.join(SCHEDULERS_ORDER)}")
    layout = make_layout(opts.get("nodes"), opts.get("gpus_per_node"), cpus_per_node=opts.get("cpus_per_node"),
                         workers_per_node=opts.get("workers_per_node"), site=site)
    if scheduler == "local" and layout.nodes != 1:
        raise JobScriptError(f"--nodes {layout.nodes}: the local scheduler runs on this machine only (--nodes 1)")
    walltime = opts.get("walltime")
    seconds = parse_walltime(walltime) if isinstance(walltime, str) else walltime
    stop_before = opts.get("stop_before")
    given = stop_before is not None
    if seconds is None:
        if given:
            raise JobScriptError("--stop-before needs --walltime: it counts back from the wall time")
        stop_before = 0
    else:
        stop_before = stop_before if given else default_stop_before(seconds)
        if stop_before < 0 or stop_before >= seconds:
            raise JobScriptError(f"--stop-before {stop_before}: must be at least 0 and less than the wall time "
                                 f"({seconds} s)")
    launcher = opts.get("launcher") or ""
    if launcher not in ("", "mpiexec") or (launcher and scheduler != "slurm"):
        raise JobScriptError(f"--launcher {launcher!r}: only 'mpiexec' (inside a Slurm allocation, instead of srun)")
    job_name = opts.get("job_name") or f"galapagos-{command[0]}"
    if not re.fullmatch(r"[A-Za-z0-9_.+-]+", job_name):
        raise JobScriptError(f"--job-name {job_name!r}: use letters, digits and _ . + - only")
    if not opts.get("program"):
        raise JobScriptError("--program is required: how the compute nodes start galapagos")
    qos, filesystems, mpi = opts.get("qos"), opts.get("filesystems"), opts.get("mpi")
    _check_scheduler_options(scheduler, launcher, qos, filesystems, mpi)
    directives = check_directives(scheduler, opts.get("directives") or ())
    check_queue_limits(site, layout.nodes, seconds, [n for n in dict.fromkeys((opts.get("queue"), qos)) if n])
    restarts, min_nodes = opts.get("max_restarts", 3), opts.get("min_nodes", 1)
    if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
        raise JobScriptError(f"--max-restarts {restarts!r}: must be 0 or more")
    if isinstance(min_nodes, bool) or not isinstance(min_nodes, int) or not 1 <= min_nodes <= layout.nodes:
        raise JobScriptError(f"--min-nodes {min_nodes!r}: must be 1 to the job's {layout.nodes} node(s)")
    stage = opts.get("stage") or ""
    if stage and not stage.startswith(("/", "$")):
        raise JobScriptError(f"--stage {stage!r}: expected an absolute directory on each node's local storage "
                             "(e.g. /tmp, or /mnt/bb/$USER on Frontier's NVMe)")
    return JobRequest(scheduler, layout, command, out, opts["program"],
                      Path(opts.get("workdir") or Path.cwd()), seconds, stop_before, opts.get("account"),
                      opts.get("queue"), job_name, opts.get("constraint"),
                      tuple((opts.get("env") or {}).items()), opts.get("setup") or "",
                      opts.get("launcher_args") or "", launcher, after, generated_by, script,
                      qos, filesystems, mpi, directives, given, stage, None, None,
                      tuple(opts.get("modules") or ()), opts.get("route") or "", opts.get("site") or "",
                      restarts, min_nodes)


def _check_scheduler_options(scheduler: str, launcher: str, qos: str | None, filesystems: str | None,
                             mpi: str | None) -> None:
    """Options only some schedulers have: refused elsewhere with one line, rather than written where they mean
    nothing (LSF, PBS, ALPS and Flux document queues, not a QOS; filesystems is ALCF's PBS Pro resource)."""
    if qos is not None:
        if scheduler != "slurm":
            raise JobScriptError(f"--qos {qos}: only Slurm has a quality of service; the {scheduler} scheduler has "
                                 "queues (--queue)")
        if not re.fullmatch(r"[A-Za-z0-9_.+-]+", qos):
            raise JobScriptError(f"--qos {qos!r}: use letters, digits and _ . + - only")
    if filesystems is not None:
        if scheduler != "pbs":
            raise JobScriptError(f"--filesystems {filesystems}: a PBS Pro resource (-l filesystems=..., mandatory at "
                                 f"ALCF); the {scheduler} scheduler has none")
        if not re.fullmatch(r"[A-Za-z0-9_]+(:[A-Za-z0-9_]+)*", filesystems):
            raise JobScriptError(f"--filesystems {filesystems!r}: expected names joined by ':', e.g. home:eagle")
    if mpi is not None:
        if scheduler != "slurm" or launcher:
            raise JobScriptError(f"--srun-mpi {mpi}: srun's MPI plugin, for the Slurm scheduler started with srun "
                                 "(not with --launcher mpiexec)")
        if not re.fullmatch(r"[A-Za-z0-9_]+", mpi):
            raise JobScriptError(f"--srun-mpi {mpi!r}: expected a plugin name such as pmi2, pmix or cray_shasta")


def check_directives(scheduler: str, directives) -> tuple[str, ...]:
    """Extra directive lines (the text after the scheduler's prefix), each one line; duplicates dropped."""
    out = []
    for text in directives:
        if not isinstance(text, str) or not text.strip() or "\n" in text or text.lstrip().startswith("#"):
            raise JobScriptError(f"--directive {text!r}: one line of options without the prefix, e.g. "
                                 "--directive='--reservation=abc'")
        if scheduler == "local":
            raise JobScriptError(f"--directive {text!r}: the local scheduler reads no directives")
        if text.strip() not in out:
            out.append(text.strip())
    return tuple(out)


def check_queue_limits(site: dict, nodes: int, seconds: int | None, names: list[str]) -> None:
    """The site profile's limits of the queue (and of the QOS, which names its own table) the job goes to."""
    where = site.get("path", "--site")
    for name in names:
        limits = site.get("queues", {}).get(name)
        if limits is None:
            continue
        low, high = limits.get("min_nodes", 1), limits.get("max_nodes")
        if nodes < low or (high is not None and nodes > high):
            span = f"{low} to {high} nodes" if high is not None else f"at least {low} nodes"
            raise JobScriptError(f"--nodes {nodes}: queue {name} takes {span} ({where})")
        longest, size = limits.get("max_walltime"), ""
        if limits.get("bins"):
            size_bin = next((b for b in limits["bins"] if b.get("min_nodes", 1) <= nodes <= b["max_nodes"]), None)
            if size_bin is None:
                raise JobScriptError(f"--nodes {nodes}: no job-size bin of queue {name} takes {nodes} nodes "
                                     f"({where})")
            longest, size = size_bin["max_walltime"], (f" for jobs of {size_bin.get('min_nodes', 1)} to "
                                                       f"{size_bin['max_nodes']} nodes")
        if seconds is None:
            continue
        if longest is not None and seconds > parse_walltime(longest):
            raise JobScriptError(f"--walltime {hms(seconds)}: queue {name} allows at most "
                                 f"{hms(parse_walltime(longest))}{size} ({where})")
        shortest = limits.get("min_walltime")
        if shortest is not None and seconds < parse_walltime(shortest):
            raise JobScriptError(f"--walltime {hms(seconds)}: queue {name} needs at least "
                                 f"{hms(parse_walltime(shortest))} ({where})")


def next_script(job_dir: Path, scheduler: str) -> Path:
    taken = [int(m.group(1)) for p in job_dir.glob(f"{scheduler}-*.sh")
             if (m := re.fullmatch(rf"{scheduler}-(\d+)\.sh", p.name))]
    return job_dir / f"{scheduler}-{max(taken, default=0) + 1}.sh"


# -- site profiles and saved settings ------------------------------------------------------------------------------
OPTION_KEYS = ("scheduler", "nodes", "gpus_per_node", "cpus_per_node", "workers_per_node", "walltime", "stop_before",
               "account", "queue", "qos", "job_name", "constraint", "filesystems", "setup", "launcher", "mpi",
               "launcher_args", "program", "stage", "max_restarts", "min_nodes")


def job_folder(run_dir: Path) -> Path:
    """<run dir>/job/: the job scripts, their settings, the pinned config and the packed environment."""
    return Path(run_dir) / "job"


PINNED_CONFIG = "config.toml"  # in <run dir>/job/: the evolve config the job script runs with, resolved at launch
SETTINGS = "launch.toml"  # in <run dir>/job/: what `launch --resume` needs to write the follow-up job


def parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise JobScriptError(f"--env {pair!r}: expected NAME=VALUE")
        env[key] = value
    return env


def save_settings(req: JobRequest, job_id: str | None = None) -> Path:
    """<run>/job/launch.toml: the options of this job, for `launch --resume`; submitted job ids accumulate. The lead
    time is kept for the follow-up only if it was given (stop_before_explicit); else it follows the wall time."""
    import tomllib

    import tomli_w

    path = job_folder(req.out) / SETTINGS
    jobs = tomllib.loads(path.read_text()).get("jobs", []) if path.exists() else []
    jobs.append({"script": str(req.script), **({"id": job_id} if job_id else {})})
    lay = req.layout
    settings = {"scheduler": req.scheduler, "nodes": lay.nodes, "gpus_per_node": lay.gpus_per_node,
                "workers_per_node": None if lay.gpus_per_node else lay.per_node, "cpus_per_node": lay.cpus_per_node,
                "walltime": req.walltime,
                "stop_before": req.stop_before if req.walltime else None,
                "stop_before_explicit": req.stop_before_given, "account": req.account,
                "queue": req.queue, "qos": req.qos, "job_name": req.job_name, "constraint": req.constraint,
                "filesystems": req.filesystems, "setup": req.setup, "launcher": req.launcher or None, "mpi": req.mpi,
                "launcher_args": req.launcher_args, "program": req.program, "directives": list(req.directives),
                "stage": req.stage or None, "modules": list(req.modules) or None, "route": req.route or None,
                "site": req.site or None, "max_restarts": req.max_restarts, "min_nodes": req.min_nodes,
                "workdir": str(req.workdir), "command": list(req.command), "env": dict(req.env), "jobs": jobs}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps({k: v for k, v in settings.items() if v is not None}))
    return path


def load_settings(run_dir: Path) -> dict:
    import tomllib

    path = job_folder(run_dir) / SETTINGS
    if not path.exists():
        raise JobScriptError(f"--run {run_dir}: no {path.relative_to(run_dir)} (was this run started with "
                             "`galapagos launch`?)")
    return tomllib.loads(path.read_text())
