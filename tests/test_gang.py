"""Gangs (launch/gang.py, run.spread_ranks): one candidate trained data-parallel over the trainer children of
several worker ranks, under real MPI. A gang trains as one process would (the same fitness), its follower's
failure is the task's with its rank named, a follower that goes silent fails the task it holds and leaves the
gang, which trains on alone, and the follower of a lost leader takes tasks itself. Across the nodes of the
namespace cluster: tests/test_cluster.py."""
from __future__ import annotations

import json
import re

import pytest

from galapagos.evolve.task import TrainConfig, TrainTask
from galapagos.evolve.train import train_task
from galapagos.launch.gang import gang_of
from galapagos.launch.protocol import EXIT_LOST
from tests.mpirun import describe_run, run_mpi
from tests.test_spread import GENOME, PROBLEM, Here

SCRIPT = "tests/mpi_scripts/gang.py"


def test_workers_make_gangs_of_neighbouring_ranks_the_last_one_smaller():
    assert [gang_of(r, 5, 2) for r in range(1, 6)] == [[1, 2], [1, 2], [3, 4], [3, 4], [5]]
    assert [gang_of(r, 4, 1) for r in range(1, 5)] == [[1], [2], [3], [4]]
    assert gang_of(7, 8, 4) == [5, 6, 7, 8]
    with pytest.raises(ValueError, match="rank 0 is not a worker rank"):
        gang_of(0, 4, 2)


def run_script(n: int, mode: str) -> tuple[object, dict[int, dict]]:
    proc = run_mpi(n, [SCRIPT, mode], timeout=240, abort_on_error=False)
    results = {r["id"]: r for r in (json.loads(line[7:]) for line in proc.stdout.splitlines()
                                    if line.startswith("RESULT "))}
    return proc, results


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_a_gang_of_two_ranks_trains_each_candidate_as_one_process_would():
    proc, results = run_script(3, "train")  # one gang: ranks 1 and 2
    out = describe_run(proc)
    assert proc.returncode == 0, out
    assert "followers=[2]" in proc.stdout, out  # rank 2 took no task of its own
    assert sorted(results) == [1, 2, 3, 4], out
    for i, r in results.items():
        assert r["status"] == "ok" and r["rank"] == 1 and r["spread"] == 2, out
        alone = train_task(TrainTask(GENOME, PROBLEM, TrainConfig(epochs=2), seed=i), Here())
        assert r["fitness"] == pytest.approx(alone["fitness"], abs=1e-6), (i, r, alone["fitness"])


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_a_followers_failure_is_the_tasks_and_names_its_rank():
    proc, results = run_script(3, "follower-fails")
    out = describe_run(proc)
    assert proc.returncode == 0, out
    assert sorted(results) == [1, 2], out
    for r in results.values():
        assert r["status"] == "oom" and r["rank"] == 1, out
        assert re.match(r"spread member 1 of 2 on cpu of rank 2 on \S+: MemoryError: the follower's device is full",
                        r["error"]), out


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_a_silent_follower_fails_the_task_it_holds_and_the_gang_trains_on_without_it():
    proc, results = run_script(3, "frozen")
    out = describe_run(proc)
    assert proc.returncode == EXIT_LOST, out  # rank 2 never ends: the job is aborted once everything is written
    assert "lost ranks=[2]" in proc.stdout, out
    first, second = results[1], results[2]
    assert first["status"] == "crashed" and "gang follower rank 2" in first["error"], out
    assert "stopped answering" in first["error"] and first["error"].startswith("spread member 1 of 2"), out
    assert second["status"] == "ok" and second["spread"] == 1, out  # the leader alone


@pytest.mark.mpi
@pytest.mark.timeout(300)
def test_the_follower_of_a_lost_leader_takes_tasks_itself():
    proc, results = run_script(3, "leader-frozen")
    out = describe_run(proc)
    assert proc.returncode == EXIT_LOST, out
    assert "lost ranks=[1]" in proc.stdout and "followers=[]" in proc.stdout, out  # rank 2 serves the master now
    assert results[1]["status"] == "lost" and results[1]["rank"] == 1, out
    assert results[2]["status"] == "ok" and results[2]["rank"] == 2 and results[2]["spread"] == 1, out
