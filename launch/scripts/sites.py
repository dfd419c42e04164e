"""Site profiles: one machine's defaults, limits and MPI route in a TOML file (examples/sites/NAME.toml, installed as
galapagos.examples/sites), found by name, checked key by key, and applied to a job's options.

The [mpi] table says how mpi4py meets the site's MPI (the route), which launcher and PMI start the ranks, which
modules and environment they need; [storage] names the node-local storage and the directive a job needs to get it;
`retired` marks a machine that is gone. Every bad key or value is one line naming the file and the key.
"""
from __future__ import annotations

import datetime
import re
from pathlib import Path

from galapagos.launch.scripts.request import OPTION_KEYS, JobScriptError, parse_walltime

SITE_KEYS = (*OPTION_KEYS, "directives", "env", "machine", "queues", "description", "mpi", "storage", "retired")
MACHINE_KEYS = ("max_nodes", "gpus_per_node", "cpus_per_node", "node_mtbf_hours")
QUEUE_KEYS = ("min_nodes", "max_nodes", "min_walltime", "max_walltime", "bins", "description", "chain", "qos")
BIN_KEYS = ("min_nodes", "max_nodes", "max_walltime")
STORAGE_KEYS = ("local", "directive", "doc")
MPI_KEYS = ("route", "modules", "module_use", "prepare", "install", "python", "torch", "launcher", "pmi", "srun",
            "library", "network", "fabric", "bandwidth_gbs", "latency_us", "doc", "env")
# what each [mpi] key may be (the agreed format: /tmp/coord/SCHEMA.md)
MPI_CHOICES = {
    "route": ("wheel", "cray-mpich-abi", "build", "system"),
    "launcher": ("srun", "pals", "jsrun", "flux", "aprun", "mpiexec"),
    "pmi": ("cray_shasta", "pmix", "pmi2", "pmi1", "pals", "flux"),
    "library": ("cray-mpich", "mpich", "openmpi", "spectrum", "intel-mpi", "mvapich"),
    "network": ("cxi", "verbs", "ucx", "efa", "tcp"),
    "python": ("venv", "venv-system", "conda"),  # a plain venv, a venv over the module's python, a conda env
}
# the launchers each scheduler starts ranks with (schedulers.py writes exactly these)
LAUNCHERS = {"slurm": ("srun", "mpiexec"), "pbs": ("pals",), "lsf": ("jsrun",), "flux": ("flux",),
             "alps": ("aprun",), "local": ("mpiexec",)}
SRUN_PLUGINS = ("cray_shasta", "pmix", "pmi2")  # PMIs srun --mpi=TYPE serves (https://slurm.schedmd.com/mpi_guide.html)


def bundled_dir() -> Path:
    """The profiles installed with Galapagos (galapagos.examples/sites)."""
    import galapagos.examples

    return Path(galapagos.examples.__file__).parent / "sites"


def bundled_sites() -> list[str]:
    return sorted(p.stem for p in bundled_dir().glob("*.toml"))


def find_site(name: str | Path) -> Path:
    """A profile by bundled name (`frontier`) or by path (anything with a / or ending in .toml, or an existing file)."""
    text = str(name)
    if "/" in text or text.endswith(".toml") or Path(text).is_file():
        return Path(text)
    path = bundled_dir() / f"{text}.toml"
    if not path.is_file():
        raise JobScriptError(f"--site {text}: no bundled profile of that name; bundled: {', '.join(bundled_sites())} "
                             "(or give the path of a TOML file)")
    return path


def load_site(path: str | Path) -> dict:
    """A TOML site profile: defaults for any launch option, [env], extra `directives`, [machine] limits that flags
    cannot exceed, [queues.NAME] limits (min_nodes, max_nodes, min_walltime, max_walltime, `bins` of max_walltime by
    job size, `chain`, `qos`) for the queue or QOS of that name, the [mpi] route, [storage] and `retired`."""
    import tomllib

    p = find_site(path)
    try:
        site = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise JobScriptError(f"--site {p}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise JobScriptError(f"--site {p}: not valid TOML: {exc}") from None
    _known(p, "", site, SITE_KEYS)
    if isinstance(site.get("mpi"), str):  # the launch option `mpi` (srun --mpi=TYPE) of older profiles
        site["mpi"] = {"srun": site["mpi"]}
    _known(p, "machine.", site.get("machine", {}), MACHINE_KEYS)
    mtbf = site.get("machine", {}).get("node_mtbf_hours")  # hours between failures of one node (launch's estimate)
    if mtbf is not None and (isinstance(mtbf, bool) or not isinstance(mtbf, (int, float)) or mtbf <= 0):
        raise JobScriptError(f"--site {p}: machine.node_mtbf_hours {mtbf!r}: must be a number of hours above zero")
    directives = site.get("directives", [])
    if not isinstance(directives, list) or not all(isinstance(d, str) for d in directives):
        raise JobScriptError(f"--site {p}: directives must be a list of strings")
    _check_queues(p, site)
    _check_mpi(p, site)
    _known(p, "storage.", site.get("storage", {}), STORAGE_KEYS)
    for key, value in site.get("storage", {}).items():
        if not isinstance(value, str) or not value.strip() or "\n" in value:
            raise JobScriptError(f"--site {p}: storage.{key} must be one line of text")
    if "retired" in site:
        retired = site["retired"]
        if isinstance(retired, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", retired):
            retired = datetime.date.fromisoformat(retired)
        if not isinstance(retired, datetime.date):
            raise JobScriptError(f"--site {p}: retired {site['retired']!r}: expected a date, e.g. \"2024-11-15\"")
        site["retired"] = retired.isoformat()
    return {**site, "path": str(p), "name": p.stem}


def _check_queues(p: Path, site: dict) -> None:
    _known(p, "queues.", site.get("queues", {}), None)
    for name, limits in site.get("queues", {}).items():
        _known(p, f"queues.{name}.", limits, QUEUE_KEYS)
        if not isinstance(limits.get("bins", []), list):
            raise JobScriptError(f"--site {p}: queues.{name}.bins must be a list of tables")
        for i, size_bin in enumerate(limits.get("bins", [])):
            _known(p, f"queues.{name}.bins[{i}].", size_bin, BIN_KEYS)
            if "max_nodes" not in size_bin or "max_walltime" not in size_bin:
                raise JobScriptError(f"--site {p}: queues.{name}.bins[{i}] needs max_nodes and max_walltime")
            _limit(p, f"queues.{name}.bins[{i}]", size_bin)
        _limit(p, f"queues.{name}", limits)
        for key in ("chain", "qos"):
            if key in limits and not isinstance(limits[key], bool):
                raise JobScriptError(f"--site {p}: queues.{name}.{key} must be true or false")
        if limits.get("qos") and site.get("scheduler") not in (None, "slurm"):
            raise JobScriptError(f"--site {p}: queues.{name}.qos: only Slurm has a quality of service (scheduler "
                                 f"{site['scheduler']})")


def _check_mpi(p: Path, site: dict) -> None:
    mpi = site.get("mpi", {})
    _known(p, "mpi.", mpi, MPI_KEYS)
    for key, choices in MPI_CHOICES.items():
        if key in mpi and mpi[key] not in choices:
            raise JobScriptError(f"--site {p}: mpi.{key} {mpi[key]!r}: expected one of {', '.join(choices)}")
    for key in ("modules", "module_use"):
        value = mpi.get(key, [])
        if not isinstance(value, list) or not all(isinstance(m, str) and re.fullmatch(r"-?[\w./+@:-]+", m)
                                                  for m in value):
            raise JobScriptError(f"--site {p}: mpi.{key} must be a list of module names (\"-name\" unloads one)")
    prepare = mpi.get("prepare", [])
    if not isinstance(prepare, list) or not all(isinstance(x, str) and x.strip() and "\n" not in x for x in prepare):
        raise JobScriptError(f"--site {p}: mpi.prepare must be a list of shell lines (run first by `galapagos setup`)")
    if "srun" in mpi and (not isinstance(mpi["srun"], str) or not re.fullmatch(r"[A-Za-z0-9_]+", mpi["srun"])):
        raise JobScriptError(f"--site {p}: mpi.srun {mpi['srun']!r}: expected srun's --mpi plugin, e.g. pmix")
    for key in ("install", "torch", "fabric", "doc"):
        if key in mpi and (not isinstance(mpi[key], str) or "\n" in mpi[key]):
            raise JobScriptError(f"--site {p}: mpi.{key} must be one line of text")
    for key in ("bandwidth_gbs", "latency_us"):
        if key in mpi and (isinstance(mpi[key], bool) or not isinstance(mpi[key], (int, float)) or mpi[key] <= 0):
            raise JobScriptError(f"--site {p}: mpi.{key} must be a number above zero")
    env = mpi.get("env", {})
    _known(p, "mpi.env.", env, None)
    for key, value in env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key) or not isinstance(value, str):
            raise JobScriptError(f"--site {p}: mpi.env.{key}: expected NAME = \"text\"")
    launcher, scheduler = mpi.get("launcher"), site.get("scheduler")
    if launcher and scheduler in LAUNCHERS and launcher not in LAUNCHERS[scheduler]:
        raise JobScriptError(f"--site {p}: mpi.launcher {launcher!r} does not start ranks under the {scheduler} "
                             f"scheduler (it uses {' or '.join(LAUNCHERS[scheduler])})")
    if launcher == "srun" and "srun" not in mpi and mpi.get("pmi") not in (None, *SRUN_PLUGINS):
        raise JobScriptError(f"--site {p}: mpi.pmi {mpi['pmi']!r}: srun serves {', '.join(SRUN_PLUGINS)}")


def _known(p: Path, prefix: str, table, keys: tuple[str, ...] | None) -> None:
    if not isinstance(table, dict):
        raise JobScriptError(f"--site {p}: {prefix.rstrip('.') or 'the file'} must be a table")
    for key in table if keys is not None else ():
        if key not in keys:
            raise JobScriptError(f"--site {p}: unknown key {prefix}{key} (known: {', '.join(keys)})"
                                 if prefix else f"--site {p}: unknown key {key!r} (known: {', '.join(keys)})")


def _limit(p: Path, where: str, limits: dict) -> None:
    for key in ("min_nodes", "max_nodes"):
        if key in limits and (not isinstance(limits[key], int) or limits[key] < 1):
            raise JobScriptError(f"--site {p}: {where}.{key} must be a whole number of nodes, at least 1")
    for key in ("min_walltime", "max_walltime"):
        if key in limits:
            try:
                if not isinstance(limits[key], str):
                    raise JobScriptError(key)
                parse_walltime(limits[key])
            except JobScriptError:
                raise JobScriptError(f"--site {p}: {where}.{key} {limits[key]!r}: expected \"HH:MM\" (or HH:MM:SS, "
                                     "D-HH:MM)") from None


# -- applying a profile to a job's options ---------------------------------------------------------------------------
def module_lines(mpi: dict) -> list[str]:
    """The [mpi] modules as shell lines, in order: `module use` paths first, "-name" unloads, the rest loads."""
    lines = [f"module use {path}" for path in mpi.get("module_use", [])]
    return lines + [f"module unload {m[1:]}" if m.startswith("-") else f"module load {m}"
                    for m in mpi.get("modules", [])]


def route_line(site: dict) -> str:
    mpi = site.get("mpi", {})
    if not mpi.get("route"):
        return ""
    how = {"wheel": "mpi4py and the mpich wheel from PyPI", "cray-mpich-abi": "mpi4py's wheel on the ABI module",
           "build": "mpi4py built against the site's MPI", "system": "the site's own mpi4py"}.get(mpi.get("route"), "")
    parts = [f"{site.get('name', 'site')}: route {mpi.get('route', '?')} ({how})",
             *([f"launcher {mpi['launcher']}"] if "launcher" in mpi else []),
             *([f"PMI {mpi['pmi']}"] if "pmi" in mpi else []), *([mpi["doc"]] if "doc" in mpi else [])]
    return "; ".join(parts)


def site_options(site: dict) -> dict:
    """The launch options a profile sets (its [mpi] table is not the option `mpi`: apply_site turns it into one)."""
    return {k: v for k, v in site.items() if k in OPTION_KEYS and k != "mpi"}


def apply_site(site: dict, opts: dict, given: dict) -> dict:
    """The job's options with what the profile's route, queues and storage imply: the route's modules and
    environment, srun's --mpi from the PMI, a queue that is a QOS written as one, and the directive that node-local
    storage needs when --stage goes there. Refuses a retired machine with one line."""
    where = site.get("path", "--site")
    if site.get("retired"):
        raise JobScriptError(f"--site {where}: {site.get('name', 'this machine')} was retired on {site['retired']}; "
                             "its scheduler stays (e.g. --site generic-lsf for an LSF machine with jsrun)")
    opts = dict(opts)
    mpi = site.get("mpi", {})
    if mpi:
        opts.setdefault("modules", module_lines(mpi))
        opts.setdefault("route", route_line(site))
        opts["env"] = {**mpi.get("env", {}), **(opts.get("env") or {})}
    srun = mpi.get("srun") or (mpi.get("pmi") if mpi.get("pmi") in SRUN_PLUGINS else None)
    if (opts.get("scheduler") == "slurm" and mpi.get("launcher", "srun") == "srun" and opts.get("mpi") is None
            and not opts.get("launcher") and srun):
        opts["mpi"] = srun  # srun --mpi=<the plugin that serves the PMI the site's MPI speaks>
    queue = opts.get("queue")
    if opts.get("scheduler") == "slurm" and site.get("queues", {}).get(queue, {}).get("qos"):
        if opts.get("qos") not in (None, queue):
            if "queue" in given:
                raise JobScriptError(f"--queue {queue} is a QOS at this site ({where}): give --queue or --qos, "
                                     "not both")
        else:  # NERSC: "regular", "debug", ... are QOS, not partitions (https://docs.nersc.gov/jobs/policy/)
            opts["qos"] = queue
        opts["queue"] = None
    return _with_storage(site, opts)


def _with_storage(site: dict, opts: dict) -> dict:
    """--stage into the site's node-local storage: add the directive that storage needs (Frontier's -C nvme joins
    any --constraint as A&B; LSF's -alloc_flags NVME joins the others), so the job gets it rather than failing."""
    storage, stage = site.get("storage", {}), opts.get("stage") or ""
    directive, local = storage.get("directive"), storage.get("local", "")
    root = local.split("$", 1)[0].rstrip("/")
    if not directive or not stage or not root or not (stage == root or stage.startswith(root + "/")):
        return opts
    scheduler, constraint = opts.get("scheduler"), opts.get("constraint")
    slurm = re.fullmatch(r"(?:-C\s*|--constraint[= ])(\S+)", directive.strip())
    lsf = re.fullmatch(r"-alloc_flags\s+(\S+)", directive.strip())
    if scheduler == "slurm" and slurm:
        feature = slurm.group(1)
        if feature not in re.split(r"[&|,]", constraint or ""):
            opts["constraint"] = f"{constraint}&{feature}" if constraint else feature
    elif scheduler == "lsf" and lsf:
        if lsf.group(1) not in (constraint or "").split():
            opts["constraint"] = f"{constraint} {lsf.group(1)}" if constraint else lsf.group(1)
    elif directive not in (opts.get("directives") or []):
        opts["directives"] = [*(opts.get("directives") or []), directive]
    return opts


def check_chain(site: dict, opts: dict, chain: int) -> None:
    """--chain N submits N follow-ups that wait in the queue beside the first job: refused where the queue takes only
    one job per user at a time."""
    if not chain:
        return
    for name in dict.fromkeys(n for n in (opts.get("queue"), opts.get("qos")) if n):
        if site.get("queues", {}).get(name, {}).get("chain") is False:
            raise JobScriptError(f"--chain {chain}: queue {name} takes one job per user at a time "
                                 f"({site.get('path', '--site')}), so follow-ups would be refused; submit one job "
                                 "there, or chain in a queue that allows several")
