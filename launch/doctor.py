"""`galapagos doctor`: does this node's MPI meet the launcher and the network the way the site's route says?

A user's first multi-node job fails in ways that show before any rank starts: mpi4py loads the pip mpich wheel where
the launcher serves Cray PMI or PMIx (singletons, or an abort in MPI_Init), or the wheel's MPI runs over TCP on a
Slingshot or InfiniBand machine (slow, silently). The checks here read what this process can see without
initialising MPI or any GPU runtime: the library's version text, the libraries this process mapped, the launcher's
environment, sysfs, the site profile's [mpi] and [storage] tables. Each mismatch is one line with the fix; TCP on a
fast fabric is a warning that names the cost. `launch/netcheck.py` measures the network itself (`--ranks`).

Everything that reads the machine takes a root directory (`root`), so tests build a node in tmp_path.
"""
from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from galapagos.launch.mpi import (LABELS, configure_line, failures_survivable, library_kind, library_version,
                                  offered_pmi, pmi_fix, pmi_refused, pmi_spoken, scheduler_of, srun_pmi)
from galapagos.launch.netcheck import FABRICS, TCP_GBS, node_fabric, transport

# the launcher a scheduler's job scripts start ranks with (launch/scripts/sites.py LAUNCHERS), and what each serves
DEFAULT_LAUNCHER = {"slurm": "srun", "pbs": "pals", "lsf": "jsrun", "flux": "flux", "alps": "aprun",
                    "local": "mpiexec"}
LAUNCHER_NAMES = {"pals": "PALS mpiexec", "mpiexec": "mpiexec (Hydra)", "flux": "flux run"}
PMI_NAMES = {"pals": "Cray PMI", "cray_shasta": "cray_shasta (Cray PMI)", "alps": "Cray PMI (ALPS)", "pmix": "PMIx",
             "pmi1": "PMI-1", "pmi2": "PMI-2", "flux": "Flux's simple PMI"}
LAUNCHER_PMI = {"pals": "pals", "jsrun": "pmix", "flux": "flux", "aprun": "alps", "mpiexec": "pmi1"}


@dataclass
class Report:
    """What doctor found: facts by section, and the lines that need the user (errors stop a job, warnings cost)."""

    facts: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    quiet: bool = False  # a rank that leaves the saying to the launcher's first

    def as_dict(self) -> dict[str, Any]:
        return {**self.facts, "errors": self.errors, "warnings": self.warnings, "ok": not self.errors}


# -- the MPI library -------------------------------------------------------------------------------------------------
def mapped(prefixes: tuple[str, ...] = ("libmpi", "libfabric", "libucp"), maps: str = "/proc/self/maps"
           ) -> dict[str, str]:
    """The path of each shared library this process mapped whose file name starts with a prefix: which libmpi the
    dynamic loader really found (LD_LIBRARY_PATH, the ABI module, an rpath)."""
    found: dict[str, str] = {}
    try:
        lines = Path(maps).read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        path = line.split(None, 5)[5].strip() if len(line.split(None, 5)) == 6 else ""
        name = os.path.basename(path)
        for prefix in prefixes:
            if name.startswith(prefix + ".so") or name.startswith(prefix + "_") and ".so" in name:
                found.setdefault(prefix, path)
    return found


def check_library(report: Report) -> dict[str, Any] | None:
    """Which MPI library mpi4py loads (MPI_Get_library_version, before MPI_Init) and from where."""
    try:
        text = library_version()
    except (ImportError, RuntimeError, OSError) as exc:
        report.errors.append(f"mpi4py cannot load an MPI library ({str(exc).splitlines()[0]}): on a workstation pip "
                             "install 'galapagos-nas[mpich]'; at a centre set up the site's route (`galapagos setup "
                             "--site NAME`)")
        return None
    kind = library_kind(text)
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
    device = next((line.split(":", 1)[1].strip() for line in lines if line.lower().startswith("mpich device")), "")
    paths = mapped()
    configure = configure_line(text)
    lib = {"kind": kind, "label": LABELS[kind], "version": lines[0] if lines else "", "path": paths.get("libmpi", ""),
           "configure": configure, "speaks": pmi_spoken(kind, configure), "device": device,
           "libfabric": paths.get("libfabric", ""), "ucx": paths.get("libucp", "")}
    report.facts["library"] = lib
    return lib


# -- the launcher and its PMI ----------------------------------------------------------------------------------------
def launch_pmi(env: Mapping[str, str], site: dict, launcher: str | None, pmi: str | None) -> dict[str, str]:
    """The PMI the job's ranks will be served: from the rank's own environment under a launcher, else from what the
    script's launch line will use (--launcher, --pmi), the site profile, and the scheduler's default."""
    scheduler = scheduler_of(env)
    scheduler = site.get("scheduler", scheduler) if scheduler == "local" else scheduler
    offered = offered_pmi(env)
    if offered and not launcher and not pmi:
        return {"scheduler": scheduler, "launcher": "this rank's launcher", "pmi": offered,
                "how": "the rank's environment"}
    mpi = site.get("mpi", {})
    launcher = launcher or mpi.get("launcher") or DEFAULT_LAUNCHER.get(scheduler, "mpiexec")
    if pmi:
        served, how = pmi, "--pmi"
    elif launcher == "srun":
        for how, plugin in (("SLURM_MPI_TYPE", env.get("SLURM_MPI_TYPE")), ("the site's [mpi].srun", mpi.get("srun")),
                            ("the site's [mpi].pmi", mpi.get("pmi"))):
            if served := srun_pmi(plugin or ""):
                break
        else:  # srun serves slurm.conf's MpiDefault (https://slurm.schedmd.com/mpi_guide.html)
            served, how = srun_pmi(_mpi_default()), "slurm.conf's MpiDefault"
    elif launcher in ("pals", "flux") and mpi.get("pmi") == "pmix":
        served, how = "pmix", "the site's [mpi].pmi"  # Aurora: PALS mpiexec --pmi=pmix
    else:
        served, how = LAUNCHER_PMI.get(launcher, ""), "the launcher's own"
    return {"scheduler": scheduler, "launcher": LAUNCHER_NAMES.get(launcher, launcher), "pmi": served or "",
            "how": how}


def _mpi_default() -> str:
    """slurm.conf's MpiDefault from `scontrol show config` (quick; "" where there is no Slurm)."""
    import subprocess

    if not shutil.which("scontrol"):
        return ""
    try:
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=10,
                             check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    value = next((line.split("=", 1)[1].strip() for line in out.splitlines()
                  if line.split("=", 1)[0].strip() == "MpiDefault"), "")
    return value


def check_pmi(report: Report, lib: dict, env: Mapping[str, str], site: dict, launcher: str | None,
              pmi: str | None) -> None:
    """A library that cannot speak the launcher's PMI is an error (singletons, or an abort in MPI_Init); a library
    other than the one the site's route names is a warning."""
    served = launch_pmi(env, site, launcher, pmi)
    report.facts["launcher"] = served
    name = site.get("name", "NAME")
    if served["pmi"] and pmi_refused(lib["kind"], lib["configure"], served["pmi"]):
        offered = PMI_NAMES.get(served["pmi"], served["pmi"])
        report.errors.append(f"PMI mismatch: {served['launcher']} serves {offered} ({served['how']}) but "
                             f"mpi4py loads {lib['label']} ({lib['path'] or lib['version']}), which cannot speak it: "
                             f"{pmi_fix(lib['kind'], served['pmi'], {**env, **_scheduler_env(site)}, name)}")
    want = site.get("mpi", {}).get("library")
    have = "mpich" if lib["kind"] == "mpich-wheel" else lib["kind"]
    if want and want != have and not report.errors:
        report.warnings.append(f"library: the site's route ({site.get('path', name)}) loads {LABELS.get(want, want)} "
                               f"but mpi4py loads {lib['label']} ({lib['path'] or lib['version']}): load the route's "
                               f"modules first (`galapagos setup --site {name}` prints them)")


def _scheduler_env(site: dict) -> dict[str, str]:
    """A marker of the profile's scheduler for pmi_fix where the environment has none (a login node)."""
    marks = {"slurm": "SLURM_JOB_ID", "pbs": "PBS_JOBID", "lsf": "LSB_JOBID", "flux": "FLUX_URI"}
    return {marks[site["scheduler"]]: "site"} if site.get("scheduler") in marks else {}


# -- the network -----------------------------------------------------------------------------------------------------
def check_network(report: Report, lib: dict, env: Mapping[str, str], site: dict, root: str | os.PathLike) -> None:
    """TCP on Slingshot, InfiniBand or EFA costs ~10x on every transfer between nodes: a warning that names the
    cost. A transport other than the site's [mpi].network is a warning too."""
    fabric, devices = node_fabric(root)
    used, how = transport(lib, env, fabric)
    mpi = site.get("mpi", {})
    report.facts["network"] = {"fabric": fabric, "devices": devices, "transport": used, "how": how,
                               "site_network": mpi.get("network", "")}
    name = site.get("name", "NAME")
    if fabric in FABRICS and used == "tcp":
        label, gbs, _ = FABRICS[fabric]
        label, gbs = mpi.get("fabric", label), float(mpi.get("bandwidth_gbs", gbs))
        report.warnings.append(
            f"network: {LABELS[lib['kind']]} uses TCP ({how}) on a {label} node ({', '.join(devices[:4])}): TCP gives "
            f"~1-3 GB/s against ~{gbs:g} GB/s on {label}; the data broadcast and the ensemble averaging slow by "
            f"~{max(2, round(gbs / TCP_GBS))}x: set up the site's MPI route (`galapagos setup --site {name}`)")
    elif mpi.get("network") and not _same(mpi["network"], used) and fabric != "none":
        report.warnings.append(f"network: the site's route ({site.get('path', name)}) uses {mpi['network']} but this "
                               f"process would use {used} ({how})")


def _same(wanted: str, used: str) -> bool:
    ib = ("verbs", "ucx", "mlx")  # InfiniBand through libfabric's verbs or through UCX: the same wire
    return wanted == used or (wanted in ib and used in ib)


# -- the node: GPUs and node-local storage ---------------------------------------------------------------------------
def check_gpus(report: Report, root: str | os.PathLike, env: Mapping[str, str]) -> None:
    """The GPUs this process may use and their vendor (launch/placement.py reads them from sysfs, no GPU runtime)."""
    from galapagos.launch.placement import VENDORS, read_topology

    topology = read_topology(root, env)
    vendors = sorted({VENDORS.get(_read(Path(root, "sys/bus/pci/devices", g.address, "vendor")), "unknown")
                      for g in topology.gpus if g.address} or ({"unknown"} if topology.gpus else set()))
    report.facts["gpus"] = {"count": len(topology.gpus), "vendor": ",".join(vendors), "device": topology.kind,
                            "addresses": [g.address for g in topology.gpus if g.address]}


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _space(path: Path) -> dict[str, Any]:
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return {"path": str(path), "exists": False}
    return {"path": str(path), "exists": True, "total_gb": round(usage.total / 1e9, 1),
            "free_gb": round(usage.free / 1e9, 1)}


def check_storage(report: Report, site: dict, root: str | os.PathLike) -> None:
    """/dev/shm (where the data lives, one copy per node) and the site's node-local storage for --stage."""
    storage = {"shm": _space(Path(root, "dev/shm"))}
    local = site.get("storage", {}).get("local")
    if local:
        where = os.path.expandvars(local)
        path = Path(root, where.lstrip("/")) if os.path.isabs(where) else Path(where)
        probe = path if path.exists() else path.parent
        storage["local"] = {**_space(probe), "path": where, "exists": path.exists()}
        if not probe.exists():
            need = site["storage"].get("directive")
            report.warnings.append(f"storage: {where} (the site's node-local storage) is not on this node"
                                   + (f": a job needs `{need}` for it (galapagos launch adds it with --stage there)"
                                      if need else ""))
    report.facts["storage"] = storage


# -- all checks ------------------------------------------------------------------------------------------------------
def load_profile(name: str | None) -> dict:
    """The site profile by name or path (`--site`, else $GALAPAGOS_SITE, which job scripts may set); {} without."""
    name = name or os.environ.get("GALAPAGOS_SITE")
    if not name:
        return {}
    from galapagos.launch.scripts.sites import load_site

    return load_site(name)


def diagnose(site: dict | None = None, env: Mapping[str, str] | None = None, root: str | os.PathLike = "/",
             launcher: str | None = None, pmi: str | None = None, node: bool = True) -> Report:
    """Every check that needs no MPI_Init: the library, the PMI, the network; with `node`, GPUs and storage."""
    site, env = site or {}, os.environ if env is None else env
    report = Report({"site": site.get("path", ""), "python": sys.executable})
    lib = check_library(report)
    if lib is not None:
        check_pmi(report, lib, env, site, launcher, pmi)
        check_network(report, lib, env, site, root)
    if node:
        check_gpus(report, root, env)
        check_storage(report, site, root)
    return report


def format_report(report: Report) -> str:
    """The report as lines for a person."""
    f = report.facts
    lines = []
    if lib := f.get("library"):
        lines.append(f"MPI library: {lib['label']}: {lib['version']}" + (f" ({lib['path']})" if lib["path"] else ""))
        if lib["configure"]:
            lines.append(f"  configure: {lib['configure']}")
        if lib["speaks"]:
            lines.append(f"  speaks: {lib['speaks']}")
    if served := f.get("launcher"):
        lines.append(f"launcher: {served['launcher']} under {served['scheduler']}, PMI {served['pmi'] or 'unknown'} "
                     f"({served['how']})")
    if net := f.get("network"):
        lines.append(f"network: fabric {net['fabric']}" + (f" ({', '.join(net['devices'][:4])})" if net["devices"]
                                                            else "") + f"; transport {net['transport']} ({net['how']})"
                     + (f"; site: {net['site_network']}" if net["site_network"] else ""))
    if gpus := f.get("gpus"):
        lines.append(f"GPUs: {gpus['count']}" + (f" {gpus['vendor']} ({gpus['device']})" if gpus["count"] else ""))
    for key, space in f.get("storage", {}).items():
        lines.append(f"{'/dev/shm' if key == 'shm' else 'node-local'}: {space['path']}" +
                     (f", {space['free_gb']:g} GB free of {space['total_gb']:g}" if "free_gb" in space else
                      ", not found"))
    if ranks := f.get("ranks"):
        from galapagos.launch.netcheck import format_ranks

        lines += format_ranks(ranks)
    lines += [f"warning: {w}" for w in report.warnings] + [f"error: {e}" for e in report.errors]
    if not report.warnings and not report.errors:
        lines.append("no problems found")
    return "\n".join(lines)


def run_doctor(site_name: str | None = None, ranks: int | None = None, before: bool = False,
               launcher: str | None = None, pmi: str | None = None) -> Report:
    """`galapagos doctor`: every check; with `ranks`, the network measured across the nodes (under a launcher on
    the ranks it started, else on `ranks` ranks started with mpiexec). `before` (a job script on its batch node,
    before the ranks start): the library, the PMI and the network only, nothing that initialises MPI. The report
    of a rank other than the launcher's first is `quiet`."""
    from galapagos.launch.mpi import launcher_rank, under_launcher, unwired, world
    from galapagos.launch.netcheck import compare, measure, run_ranks

    site = load_profile(site_name)
    report = diagnose(site, launcher=launcher, pmi=pmi, node=not before)
    report.quiet = launcher_rank() != 0
    if before or ranks is None:
        return report
    if ranks < 2 and not under_launcher():
        report.errors.append(f"--ranks {ranks}: the network run needs at least 2 ranks")
    if report.errors:
        return report  # a run across the nodes would fail the same way
    result = None
    if under_launcher():
        comm = world()
        if why := unwired(comm.size):
            report.errors.append(why)
            return report
        report.quiet = comm.rank != 0
        if ranks != comm.size:
            report.warnings.append(f"--ranks {ranks}: the launcher started {comm.size} rank(s); measured on those")
        result = measure(comm)
    else:
        try:
            result = run_ranks(ranks)
        except RuntimeError as exc:
            report.errors.append(str(exc))
    if result is not None:
        result["expected"], warnings = compare(result, site)
        report.facts["ranks"] = result
        report.warnings += warnings
    return report


def job_report(log: logging.Logger) -> None:
    """Rank 0 at a job's start: one line on the MPI and network in use, and each warning; no MPI traffic. The PMI
    check is left out (the job is wired: it got here)."""
    from galapagos.launch.scripts import JobScriptError

    try:
        site = load_profile(None)
    except JobScriptError as exc:  # a bad $GALAPAGOS_SITE must not stop a job that runs
        log.warning("doctor: %s", exc)
        site = {}
    report = Report()
    lib = check_library(report)
    if lib is None:
        return
    check_network(report, lib, os.environ, site, "/")
    net = report.facts["network"]
    log.info("MPI: %s (%s); network: %s (%s), fabric %s; a dead worker rank %s", lib["label"],
             lib["path"] or lib["version"], net["transport"], net["how"], net["fabric"],
             "leaves the job going (ULFM)" if failures_survivable() else "ends the job (a supervisor restarts it)")
    for line in report.warnings:
        log.warning("doctor: %s", line)
