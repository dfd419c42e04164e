"""A node dies mid-run and the search goes on: `galapagos supervise` (galapagos/flows/recovery.py) runs a 4-node
evolve across the namespace cluster (tests/cluster.py) with Hydra, from a fifth node that stands for the batch or
launch node; the test kills every process of one compute node (a worker's, then rank 0's) and the job probes the
nodes, leaves the dead one out and starts again with --resume on the three that remain. On one machine, a worker
rank SIGKILLed under `galapagos evolve --workers 3` is restarted by the same command; a job whose every restart
fails ends with one line, the summary and exit code 3.

Each run: the budget is reached, no id twice, every evaluation recorded before the failure kept as it was.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from galapagos.examples import shapes
from bench.recovery import journal
from galapagos.launch.protocol import EXIT_LOST
from tests.cluster import Cluster, cluster_problem
from tests.mpirun import REPO, describe_run

pytestmark = pytest.mark.mpi
CLI = [sys.executable, "-m", "galapagos.cli"]
QUICK = ["--set", "space.max_layers=3", "--set", "evolution.population_size=4", "--set", "run.task_timeout=60.0",
         "--set", "run.task='tests.faulty_tasks:slow_quick'"]
COMPUTE = ["node1", "node2", "node3", "node4"]  # node0 runs the supervisor and Hydra's mpiexec, as a batch node


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "shapes.h5"
    shapes.generate(path, samples=120, size=12, seed=1)
    return path


@pytest.fixture
def cluster():  # one per test: a test kills one of its nodes
    if (why := cluster_problem()) is not None:
        pytest.skip(why)
    with Cluster(5) as c:
        yield c


def wait_for(out: Path, records: int, proc: subprocess.Popen, timeout: float = 90) -> list[dict]:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if len(found := journal(out)) >= records:
            return found
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"{records} records not reached (exit code {proc.poll()}): {proc.communicate()[1][-3000:]}")


def check_run(out: Path, before: list[dict], budget: int) -> list[dict]:
    """The budget reached, no id twice, everything recorded before the failure kept as it was."""
    after = journal(out)
    assert after[:len(before)] == before  # nothing finished lost or rewritten
    assert len(after) == budget and len({r["id"] for r in after}) == budget, [r["id"] for r in after]
    assert json.loads((out / "summary.json").read_text())["evaluations"] == budget
    return after


def resumed_at(after: list[dict], killed: float) -> float:
    """Seconds from the kill to the first evaluation started after the restart: the one after the longest pause
    between evaluations starting once the node died (the surviving workers idle)."""
    starts = sorted(r["start"] for r in after if r["start"] > killed)
    gaps = [(b - a, b) for a, b in zip([killed, *starts], starts)]
    return max(gaps)[1] - killed


@pytest.mark.timeout(150)
@pytest.mark.parametrize("victim", ["node3", "node1"], ids=["a-worker-node", "rank-0-node"])
def test_a_dead_node_is_left_out_and_the_run_reaches_its_budget(cluster, data, tmp_path, victim):
    out, budget = tmp_path / "run", 70
    nodes = tmp_path / "nodes"
    nodes.write_text("".join(f"{n}\n" for n in COMPUTE))
    env = cluster.mpi_env({**os.environ, "PYTHONPATH": str(REPO), "HYDRA_LAUNCHER": "ssh",
                           "HYDRA_LAUNCHER_EXEC": str(cluster.launcher)})
    argv = [*CLI, "supervise", "--nodes", nodes, "--per-node", "1", "--max-restarts", "2", "--probe-timeout", "10",
            "--", *CLI, "evolve", "--data", data, "--out", out, "--evaluations", str(budget), *QUICK]
    proc = cluster.popen(0, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        wait_for(out, 10, proc)
        killed = time.time()
        cluster.kill_node(victim)
        before = [r for r in journal(out) if r["end"] <= killed]
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    run = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
    assert proc.returncode == 0, describe_run(run)
    assert f"node(s) {victim} did not answer" in stderr, describe_run(run)
    after = check_run(out, before, budget)
    later = [r for r in after if r["start"] > killed + 1]
    assert later and victim not in {r["host"] for r in later}, later  # the dead node is left out
    assert {r["host"] for r in later} == set(COMPUTE) - {victim}
    if victim == "node1":  # rank 0 moved to node2, beside its worker (rank 1); ranks 2 and 3 on node3 and node4
        assert {(r["rank"], r["host"]) for r in later} == {(1, "node2"), (2, "node3"), (3, "node4")}
    print(f"{victim}: surviving workers training again {resumed_at(after, killed):.1f} s after the kill")


def shell_job(data: Path, out: Path, *extra) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([*CLI, "evolve", "--data", str(data), "--out", str(out), *QUICK, *map(str, extra)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def worker_rank(out: Path, rank: int) -> int | None:
    """The pid of worker rank `rank` of the job writing `out`: the rank's own process, not its trainer child (which
    has the same command line and environment, and the rank as its parent)."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
            env = (entry / "environ").read_bytes().split(b"\0")
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if b"galapagos.flows.ranks" in cmd and str(out).encode() in b" ".join(cmd) and \
                f"PMI_RANK={rank}".encode() in env:
            found[int(entry.name)] = parent
    return next((pid for pid, parent in found.items() if parent not in found), None)


@pytest.mark.timeout(120)
def test_a_killed_worker_rank_on_one_machine_is_restarted_by_the_same_command(data, tmp_path):
    out, budget = tmp_path / "run", 60
    proc = shell_job(data, out, "--workers", 3, "--evaluations", budget)
    try:
        wait_for(out, 8, proc)
        pid = worker_rank(out, 2)
        assert pid is not None, "worker rank 2 not found"
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        before = [r for r in journal(out) if r["end"] <= killed]
        stdout, stderr = proc.communicate(timeout=100)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    run = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert proc.returncode == 0, describe_run(run)
    assert "restart 1 of 3 with --resume" in stderr, describe_run(run)
    check_run(out, before, budget)
    assert f"evaluations: {budget}" in stdout, describe_run(run)


@pytest.mark.timeout(120)
def test_a_job_whose_every_restart_fails_ends_with_one_line_the_summary_and_exit_code_3(data, tmp_path):
    out = tmp_path / "run"
    proc = shell_job(data, out, "--workers", 2, "--evaluations", 10, "--max-restarts", 1,
                     "--set", "run.task='tests.faulty_tasks:kills_its_rank'")
    stdout, stderr = proc.communicate(timeout=110)
    run = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert proc.returncode == EXIT_LOST, describe_run(run)
    assert "restart 1 of 1 with --resume" in stderr, describe_run(run)
    ends = [line for line in stderr.splitlines() if line.startswith("galapagos evolve: ")]
    assert len(ends) == 1 and "after 1 restart(s), the most it may take (--max-restarts 1)" in ends[0], ends
    assert "continue with --resume" in ends[0], ends
    assert "evaluations: 0" in stdout and json.loads((out / "summary.json").read_text())["evaluations"] == 0


@pytest.fixture
def slurm(tmp_path_factory):
    from tests.slurm_cluster import slurm_problem, start_slurm

    if (problem := cluster_problem() or slurm_problem()) is not None:
        pytest.skip(problem)
    with Cluster(4) as machines:
        try:
            cluster = start_slurm(machines, tmp_path_factory.mktemp("slurm"))
        except RuntimeError as exc:
            pytest.skip(f"the 4-node Slurm cluster did not start: {str(exc).splitlines()[0]}")
        try:
            yield cluster
        finally:
            cluster.stop()


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_a_slurm_job_goes_on_without_its_dead_node(slurm, data, tmp_path):
    """`galapagos launch --scheduler slurm --nodes 4 --launcher mpiexec --submit` (--no-kill; Hydra's proxies started
    by srun): node2 dies mid-run (its slurmd and ranks with it); rank 0 gives it up, the script's supervisor probes it
    with srun, leaves it out and starts the ranks again on the other three in the same allocation; the job completes
    with the budget. (srun --mpi=pmi2 restarts hit the wheel MPICH's PMI-1 message limit there: test_slurm.py.)"""
    from tests.test_slurm_cluster import submit

    out, budget = tmp_path / "run", 200
    script, job = submit(slurm, "--launcher", "mpiexec", "--", "galapagos", "evolve", "--data", data, "--out", out,
                         "--evaluations", budget, *QUICK, "--set", "run.heartbeat=2", "--set", "run.worker_timeout=8")
    deadline = time.time() + 120
    while len(journal(out)) < 10 and time.time() < deadline:
        time.sleep(0.1)
    killed = time.time()
    slurm.machines.kill_node("node2")
    before = [r for r in journal(out) if r["end"] <= killed]
    info = slurm.wait(job, 240)
    log = (script.parent / f"{script.stem}-{job}.out").read_text()
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{log}"
    assert "node(s) node2 did not answer" in log, log
    after = check_run(out, before, budget)
    later = [r for r in after if r["start"] > killed + 1]
    assert later and {r["host"] for r in later} == {"node0", "node1", "node3"}, later
    print(f"slurm: surviving workers training again {resumed_at(after, killed):.1f} s after the kill")


def test_what_node_failures_cost_with_and_without_recovery(tmp_path, capsys):
    from galapagos.cli import main
    from galapagos.flows.recovery import expected_loss

    without, recovered = expected_loss(9408, 12 * 3600, 5 * 8760)  # a failure every 4.7 h in the allocation
    assert 0.6 < without < 0.7 and 0.003 < recovered < 0.005  # 1 - (1 - e^-x) / x at x = 2.58; l * 60 s + T / 2M
    assert expected_loss(1, 60) < expected_loss(100, 60)
    site = tmp_path / "site.toml"
    site.write_text('scheduler = "slurm"\n[machine]\nnode_mtbf_hours = 1000\n')
    data = tmp_path / "d.h5"
    shapes.generate(data, samples=60, size=12, seed=1)
    code = main(["launch", "--site", str(site), "--nodes", "100", "--gpus-per-node", "4", "--walltime", "12:00",
                 "--", "evolve", "--data", str(data), "--out", str(tmp_path / "run"), "--evaluations", "10"])
    said = capsys.readouterr()
    assert code == 0, said.err
    line = next(x for x in said.out.splitlines() if x.startswith("node failures: "))
    without, recovered = expected_loss(100, 12 * 3600, 1000)
    assert "MTBF of 1000 h (the site's [machine] node_mtbf_hours)" in line
    assert f"{without:.2%} of the allocation without recovery, {recovered:.2%} with it" in line
    site.write_text('scheduler = "slurm"\n[machine]\nnode_mtbf_hours = -3\n')
    code = main(["launch", "--site", str(site), "--nodes", "2", "--gpus-per-node", "4", "--", "evolve", "--data",
                 str(data), "--out", str(tmp_path / "run2"), "--evaluations", "10"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "machine.node_mtbf_hours -3: must be a number of hours" in err


def test_the_command_a_restart_runs_and_the_ranks_file_refuses_a_bad_call(tmp_path):
    from galapagos.flows.supervising import read_nodes, resume_words

    evolve = ["evolve", "--data", "d.h5", "--out", "r", "--config", "c.toml", "--seed-from", "old", "--set", "a=1"]
    assert resume_words(evolve) == ["evolve", "--data", "d.h5", "--out", "r", "--set", "a=1", "--resume"]
    assert resume_words(["design", "--data", "d.h5", "--out", "r"]) == ["design", "--data", "d.h5", "--out", "r",
                                                                         "--resume"]  # design resumes too
    nodes = tmp_path / "nodes"
    nodes.write_text("# the allocation\nn1:4\nn2\n\nn1\n")
    assert read_nodes(nodes) == ["n1", "n2"]
    from galapagos.launch.scripts import build_request, render

    req = build_request({"scheduler": "pbs", "nodes": 2, "gpus_per_node": 4, "program": "galapagos"},
                        ("evolve", "--data", "d.h5", "--out", str(tmp_path / "run")), tmp_path / "run",
                        script=tmp_path / "pbs-1.sh")
    _, extra = render(req)
    ranks = tmp_path / "pbs-1-ranks.sh"
    ranks.write_text(extra["pbs-1-ranks.sh"])
    proc = subprocess.run(["bash", str(ranks)], capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "usage:" in proc.stderr
