"""Spawning real MPI jobs from tests: ``mpiexec -n N python -m mpi4py SCRIPT ...`` with a hard timeout.

A hang must fail the test, never block the suite, so the job runs in its own process group and the whole
group (mpiexec, its proxies and every rank) is killed on timeout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Sequence

import pytest

REPO = Path(__file__).resolve().parent.parent


def mpiexec() -> str:
    """The mpiexec the project would use (beside this Python first); skip where there is none."""
    from galapagos.launch.mpi import mpiexec as find

    try:
        return find()
    except RuntimeError as exc:
        pytest.skip(str(exc))


def _tail(text: str, limit: int = 4000) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


def describe_run(proc: subprocess.CompletedProcess) -> str:
    """Command, return code and output tails, for assertion messages."""
    cmd = " ".join(map(str, proc.args)) if isinstance(proc.args, (list, tuple)) else str(proc.args)
    return (f"command: {cmd}\nreturn code: {proc.returncode}\n--- stdout ---\n{_tail(proc.stdout or '')}\n"
            f"--- stderr ---\n{_tail(proc.stderr or '')}")


def run_mpi(n: int, args: Sequence[str | os.PathLike], timeout: float = 120,
            env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
            abort_on_error: bool = True, whole_env: bool = False) -> subprocess.CompletedProcess:
    """Run ``mpiexec -n n python -m mpi4py *args`` and return its result (stdout/stderr as text).

    On timeout the job's process group is killed and the test fails with the output seen so far. The repo
    root is on PYTHONPATH and is the default working directory, so scripts can import the project.
    `abort_on_error=False` runs ``python *args`` instead, as a Galapagos job's ranks run (galapagos.flows.ranks): an
    uncaught exception then leaves its rank in MPI_Finalize instead of ending the job (mpi4py's MPI_Abort).
    `env` holds variables set over this process's environment, or with `whole_env` the whole environment (the
    `gpu_env` fixture's, which leaves out the variables that hide the GPUs).
    """
    cmd = [mpiexec(), "-n", str(n), sys.executable, *(["-m", "mpi4py"] if abort_on_error else []), *map(str, args)]
    full_env = dict(env or {}) if whole_env else {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), full_env.get("PYTHONPATH", "")) if p)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    proc = subprocess.Popen(cmd, cwd=str(cwd or REPO), env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        result = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
        pytest.fail(f"MPI job timed out after {timeout:g} s (process group killed)\n{describe_run(result)}",
                    pytrace=False)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def assert_ranks(proc: subprocess.CompletedProcess, n: int, marker: str) -> None:
    """Fail unless the job exited 0 and each of ranks 0..n-1 printed ``{marker} rank=R``."""
    assert proc.returncode == 0, describe_run(proc)
    for rank in range(n):
        assert f"{marker} rank={rank}" in proc.stdout, f"rank {rank} did not report {marker}\n{describe_run(proc)}"
