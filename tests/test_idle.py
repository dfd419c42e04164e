"""The master and workers waiting on training take (almost) no CPU: MPICH spins in blocking calls, we do not."""
import re

import pytest

from tests.mpirun import describe_run, run_mpi

pytestmark = pytest.mark.mpi


def test_waiting_ranks_do_not_spin():
    proc = run_mpi(3, ["tests/mpi_scripts/idle_check.py"], timeout=120)
    assert proc.returncode == 0, describe_run(proc)
    shares = {int(r): float(s) for r, s in re.findall(r"cpu_share rank=(\d+) ([\d.]+)", proc.stdout)}
    assert set(shares) == {0, 1, 2}, describe_run(proc)
    # Over ~4 s of sleeping tasks a spinning rank would show ~1.0; polling with sleeps costs a few percent.
    assert all(share < 0.1 for share in shares.values()), shares
