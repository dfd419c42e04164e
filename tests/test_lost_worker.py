"""A job never hangs: a worker rank that stops answering is given up and the job aborted with EXIT_LOST, and a stop
request ends every rank within seconds (tests/mpi_scripts/lost_worker.py under real MPI)."""
from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

import pytest

from galapagos.launch.protocol import EXIT_CRASH, EXIT_LOST
from tests.mpirun import describe_run, run_mpi

pytestmark = pytest.mark.mpi
SCRIPT = "tests/mpi_scripts/lost_worker.py"


def left_behind(marker: str) -> list[int]:
    """Processes still alive whose environment holds the marker (the job's ranks and their trainer children)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker.encode() in (proc / "environ").read_bytes():
                pids.append(int(proc.name))
        except OSError:  # gone meanwhile, or not ours
            pass
    return pids


def run_job(mode: str) -> tuple:
    marker = f"GALAPAGOS_TEST_JOB={uuid.uuid4().hex}"
    proc = run_mpi(3, [SCRIPT, mode], timeout=120, env=dict([marker.split("=")]), abort_on_error=False)
    ended = time.time()
    for _ in range(50):  # a trainer child dies with its rank (PR_SET_PDEATHSIG): give it a moment
        if not (pids := left_behind(marker)):
            break
        time.sleep(0.1)
    assert not pids, f"left behind: {pids}\n{describe_run(proc)}"
    return proc, ended


def test_a_stopped_worker_rank_is_given_up_and_the_job_aborted():
    proc, _ = run_job("lost")
    out = describe_run(proc)
    assert proc.returncode == EXIT_LOST, out  # MPICH's mpiexec exits with MPI_Abort's code
    assert re.search(r"worker rank 2 on \S+ stopped answering", proc.stderr), out
    assert "lost ranks=[2]" in proc.stdout, out
    results = re.findall(r"result id=(\d+) rank=(\d+) status=(\w+)", proc.stdout)
    assert len(results) == 10, out  # every task reached the source once
    assert all(status == "ok" for _, rank, status in results if rank == "1"), out
    assert {status for _, rank, status in results if rank == "2"} <= {"ok", "lost"}, out
    assert any(status == "lost" for _, _, status in results), out
    assert "exit rank=0" not in proc.stdout, out  # rank 0 aborted the job instead of returning


def test_a_worker_rank_that_fails_is_given_up_at_once():
    proc, _ = run_job("fails")
    out = describe_run(proc)
    assert proc.returncode == EXIT_LOST, out
    assert re.search(r"worker rank 2 on \S+ failed \(RuntimeError: injected worker failure\): giving up its 1 task",
                     proc.stderr), out
    results = re.findall(r"result id=(\d+) rank=(\d+) status=(\w+)", proc.stdout)
    assert len(results) == 10, out
    assert [status for _, rank, status in results if rank == "2"] == ["ok", "lost"], out
    assert all(status == "ok" for _, rank, status in results if rank == "1"), out
    assert "lost ranks=[2]" in proc.stdout, out


def test_a_worker_rank_that_fails_at_start_ends_the_job():
    proc, _ = run_job("start-fails")
    out = describe_run(proc)
    assert proc.returncode == EXIT_CRASH, out
    assert re.search(r"worker rank 2 on \S+ failed while the job started: OSError: \[Errno 24\] Too many open files; "
                     "ending the job", proc.stderr), out
    assert "result id=" not in proc.stdout, out


def test_a_stop_request_ends_every_rank_within_seconds():
    proc, ended = run_job("stop")
    out = describe_run(proc)
    assert proc.returncode == 0, out
    stopped = float(re.search(r"stopped at=([\d.]+)", proc.stdout).group(1))
    exits = {int(r): float(t) for r, t in re.findall(r"exit rank=(\d+) at=([\d.]+)", proc.stdout)}
    assert sorted(exits) == [0, 1, 2], out
    assert max(exits.values()) - stopped < 3.0, out  # the busy trainer children are killed after about 1 s
    assert ended - stopped < 6.0, out  # mpiexec itself is gone too
    results = re.findall(r"result id=(\d+) rank=(\d+) status=(\w+)", proc.stdout)
    assert sorted(status for _, _, status in results) == ["cancelled", "cancelled"], out
