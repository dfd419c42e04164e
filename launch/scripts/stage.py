"""Staging (`launch --stage DIR`): before the ranks start, the Python environment and the data file are copied to
storage local to each node, so that thousands of ranks import Python and torch, and read the data, from there
instead of all at once from the shared file system (the start-up bottleneck of Python at scale).

The environment travels as one tar file (one large sequential read per node instead of tens of thousands of
small-file lookups per rank). Slurm broadcasts the files to the nodes with sbcast, which reads the shared file
system once in all (https://slurm.schedmd.com/sbcast.html: DEST must be a fully qualified path on a file system
local to the node); the other schedulers copy once per node with their launcher, one task per node.
"""
from __future__ import annotations

import os
import shlex
import sys
import tarfile
from pathlib import Path

from galapagos.launch.scripts.request import JobScriptError

# The job's id in its script, which names the staging directory so that two jobs on a node never share one.
JOB_ID = {"slurm": "$SLURM_JOB_ID", "pbs": "$PBS_JOBID", "alps": "$PBS_JOBID", "lsf": "$LSB_JOBID",
          "flux": "$FLUX_JOB_ID", "local": "$$"}


def per_node(scheduler: str, nodes: int) -> str:
    """How the script runs one command once on every node of the job."""
    # Slurm: the script exports SLURM_HOSTFILE for the ranks (rank 0's node twice), and srun places any step's
    # tasks by it while it is set ("it will over ride any other method specified", https://slurm.schedmd.com/
    # srun.html, --distribution=arbitrary): on 4 nodes the copy went twice to the first and never to the last
    return {"slurm": f"env -u SLURM_HOSTFILE srun --nodes={nodes} --ntasks={nodes} --ntasks-per-node=1",
            "pbs": f"mpiexec -n {nodes} --ppn 1",  # PALS: https://docs.alcf.anl.gov/running-jobs/
            "alps": f"aprun -n {nodes} -N 1",
            "lsf": f"jsrun -n {nodes} -r 1 -a 1 -c 1",  # one resource set per host, one task in it
            "flux": f"flux run -N {nodes} -n {nodes}",
            "local": ""}[scheduler]


def environment() -> Path:
    """The Python environment this installation runs in (a venv or a conda environment)."""
    return Path(sys.prefix)


def pack_environment(prefix: Path, job_dir: Path) -> Path:
    """The environment at `prefix` as one tar file in `job_dir`, made again only when the environment changed
    since (a package installed or removed changes a directory's modification time)."""
    tar = job_dir / f"env-{prefix.name.lstrip('.') or 'python'}.tar"
    if tar.exists() and tar.stat().st_mtime >= _newest(prefix):
        return tar
    job_dir.mkdir(parents=True, exist_ok=True)
    part = tar.with_suffix(".tar.part")
    try:
        with tarfile.open(part, "w") as out:
            out.add(prefix, arcname=prefix.name)
        os.replace(part, tar)
    except OSError as exc:
        part.unlink(missing_ok=True)
        raise JobScriptError(f"--stage: cannot pack the environment {prefix} into {tar}: {exc.strerror or exc}") \
            from None
    return tar


def _newest(prefix: Path) -> float:
    """The latest change to the environment's directories (its own, bin/ and every site-packages)."""
    dirs = [prefix, prefix / "bin", *prefix.glob("lib/python*/site-packages")]
    return max(d.stat().st_mtime for d in dirs if d.exists())


def stage_dir(scheduler: str, root: str) -> str:
    """The script line that names this job's staging directory, $stage (before the command that uses it)."""
    return f'stage="{root.rstrip("/")}/galapagos-{JOB_ID[scheduler]}"  # each node\'s local copy (--stage)'


def stage_lines(scheduler: str, nodes: int, env_tar: Path, data: Path | None) -> list[str]:
    """Script lines that fill $stage on every node; `stage_cleanup` removes it after the run."""
    run = per_node(scheduler, nodes)
    lines = ["# -- staging (--stage): the environment and the data on each node's local storage"]
    files = [env_tar, *([data] if data else [])]
    if scheduler == "slurm":
        lines.append(f'{run} mkdir -p "$stage"')
        lines += [f'sbcast --force {shlex.quote(str(f))} "$stage/{f.name}"' for f in files]
        lines.append(f'{run} tar -xf "$stage/{env_tar.name}" -C "$stage"')
        lines.append(f'{run} rm -f "$stage/{env_tar.name}"')
    else:
        copy = " && ".join(['mkdir -p "$0"', 'tar -xf "$1" -C "$0"', *(['cp "$2" "$0/"'] if data else [])])
        args = " ".join(shlex.quote(str(f)) for f in files)
        lines.append(f'{run + " " if run else ""}bash -c {shlex.quote(copy)} "$stage" {args}')
    return lines


def stage_cleanup(scheduler: str, nodes: int) -> str:
    run = per_node(scheduler, nodes)
    return f'{run + " " if run else ""}rm -rf "$stage" || true'


def staged_python(prefix: Path) -> str:
    """The staged environment's interpreter, in the script's words (a venv's bin/python finds its pyvenv.cfg
    beside it, so the copy runs with the copy's packages)."""
    return f'"$stage/{prefix.name}/bin/python"'
