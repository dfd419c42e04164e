"""`galapagos setup --site NAME DIR`: the Python environment a site documents, as shell lines in order (its modules,
a venv or conda environment, mpi4py by the site's route, torch for its GPUs, galapagos-nas), and running them where
that needs no module system (the "wheel" route of a workstation: a venv, torch, galapagos-nas[mpich]).

A centre's lines load modules, which only a login shell of that machine has, so they are printed to be run there."""
from __future__ import annotations

import logging
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from galapagos.launch.scripts.request import JobScriptError
from galapagos.launch.scripts.sites import module_lines

log = logging.getLogger(__name__)
SETUP_TIMEOUT = 3600.0  # one step (pip building torch's dependencies can be slow)


@dataclass(frozen=True)
class SetupOptions:
    source: str = "galapagos-nas"  # what pip installs for Galapagos: the name on PyPI, a checkout or a wheel
    torch: str | None = None  # pip arguments for torch ("" skips it); default: the profile's [mpi].torch
    python: str | None = None  # the interpreter that makes the venv (default: this one for "wheel", else python3)
    system_site_packages: bool = False  # the venv sees the interpreter's packages (always so for "venv-system")
    pip_args: tuple[str, ...] = ()  # added to every pip install (e.g. --no-index --no-deps for an offline test)


def runnable(site: dict) -> bool:
    """Only the wheel route runs here: every other route loads modules (or a uenv) on the centre's login node."""
    mpi = site.get("mpi", {})
    return mpi.get("route") == "wheel" and not mpi.get("modules") and not mpi.get("prepare")


def setup_plan(site: dict, target: Path, opts: SetupOptions = SetupOptions()) -> list[str]:
    """The shell lines that make the environment at `target` the way the profile's [mpi] route documents."""
    name, mpi = site.get("name", "site"), site.get("mpi", {})
    if site.get("retired"):
        raise JobScriptError(f"--site {site.get('path', name)}: {name} was retired on {site['retired']}; nothing "
                             "to set up")
    route = mpi.get("route")
    if route is None:
        raise JobScriptError(f"--site {site.get('path', name)}: no [mpi] route in the profile: say how mpi4py meets "
                             "the site's MPI (route = wheel, cray-mpich-abi, build or system)")
    target = Path(target).absolute()
    python = opts.python or (sys.executable if route == "wheel" else "python3")
    kind = mpi.get("python", "venv")
    lines = [*mpi.get("prepare", []), *module_lines(mpi)]
    pip = [str(target / "bin" / "python"), "-m", "pip", "install", *opts.pip_args]
    if kind == "conda":
        lines += [f"conda create --yes --prefix {shlex.quote(str(target))} python=3.11 pip",
                  f"conda activate {shlex.quote(str(target))}"]
    else:
        system = kind == "venv-system" or opts.system_site_packages
        lines.append(shlex.join([python, "-m", "venv", *(["--system-site-packages"] if system else []),
                                 str(target)]))
        if not runnable(site):
            lines.append(f"source {shlex.quote(str(target / 'bin' / 'activate'))}")
    if route == "build":  # the site's compiler wrapper builds mpi4py against its MPI, with no cached wheel
        lines.append(_with_pip_args(mpi.get("install") or
                                    "MPICC=mpicc pip install --no-cache-dir --no-binary=mpi4py mpi4py", opts))
    elif route == "cray-mpich-abi":  # mpi4py's binary wheel, run against Cray MPICH through the ABI module
        lines.append(_with_pip_args(mpi.get("install") or "pip install mpi4py", opts))
    torch = mpi.get("torch", "") if opts.torch is None else opts.torch
    if torch.strip():
        lines.append(shlex.join([*pip, *shlex.split(torch)]))
    extra = "[mpich]" if route == "wheel" else ""  # the wheel route's MPI is the mpich wheel
    lines.append(shlex.join([*pip, f"{opts.source}{extra}"]))
    return lines


def _with_pip_args(line: str, opts: SetupOptions) -> str:
    if not opts.pip_args or " pip install " not in f" {line} ":
        return line
    head, _, tail = line.partition("pip install")
    return f"{head}pip install {shlex.join(opts.pip_args)}{tail}"


def run_plan(lines: list[str], say) -> None:
    """Run the wheel route's lines one by one (no shell: each line is one command), stopping at the first failure
    with one line naming it."""
    for line in lines:
        say(f"$ {line}")
        try:
            proc = subprocess.run(shlex.split(line), capture_output=True, text=True, check=False,
                                  timeout=SETUP_TIMEOUT)
        except FileNotFoundError as exc:
            raise JobScriptError(f"setup: {shlex.split(line)[0]} not found ({exc.strerror})") from None
        except subprocess.TimeoutExpired:
            raise JobScriptError(f"setup: `{line}` did not finish within {SETUP_TIMEOUT:.0f} s") from None
        if proc.returncode != 0:
            why = (proc.stderr or proc.stdout).strip().splitlines()
            raise JobScriptError(f"setup: `{line}` failed (exit {proc.returncode}): {why[-1] if why else 'no message'}")
        log.debug("%s", proc.stdout)
