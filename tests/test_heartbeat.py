"""A hung rank is found in seconds (launch/heartbeat.py): a worker rank frozen with its trainer is given up after
run.worker_timeout and the run goes on; a slow candidate is not given up; a stopped rank 0 ends the job with its
summary and the resume command; a frozen node of the namespace cluster is given up whole.

The task limits and run.lost_grace are far away in these tests: only a heartbeat can find the silent rank."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

import pytest

from galapagos.launch.heartbeat import Beacon, MasterWatch, Silence
from galapagos.launch.protocol import EXIT_LOST, Alive, Liveness, Ready, Status
from galapagos.launch.runtime import master_serve
from tests.cluster import Cluster, cluster_problem, pids_in
from tests.mpirun import REPO, describe_run, run_mpi
from tests.test_evolve_run import SMALL, shapes_file  # noqa: F401 - the fixture `data` takes
from tests.test_faults import STARTED, no_job_outlives_its_test, ranks_of, start, wait_until  # noqa: F401
from tests.test_runtime import FakeComm, ListSource, forever

SCRIPT = "tests/mpi_scripts/heartbeat.py"
FAST = Liveness(interval=0.05, worker_timeout=0.3, master_timeout=0.3)


# -- the master's side, with simulated workers (tests/test_runtime.py's FakeComm) ------------------------------------
class BeatingComm(FakeComm):
    """FakeComm whose workers in `beating` send Alive whenever they have nothing else to say, as Pulse does."""

    def __init__(self, hosts: dict[int, str], beating: set[int], **kw):
        super().__init__(size=len(hosts) + 1, **kw)
        self.inbox = deque(Ready(r, h, "cpu") for r, h in hosts.items())
        self.beating = beating

    def improbe(self, source=None, tag=None):
        msg = super().improbe(source, tag)
        if msg is None:
            for rank in self.beating:
                self.deliver(Alive(rank))
        return msg


def until(seconds: float):
    """A task that ends `seconds` from now, saying nothing meanwhile."""
    end = time.time() + seconds
    return [("until", lambda: time.time() > end), ("result", 1.0, seconds)]


@pytest.mark.timeout(30)
def test_a_silent_rank_is_given_up_by_its_heartbeat_and_a_busy_one_that_beats_is_not():
    comm = BeatingComm({1: "a", 2: "b", 3: "b"}, beating={1, 3},
                       script=lambda rank, task: forever(rank, task) if rank == 2 else until(1.0))
    source = ListSource(4)
    state = master_serve(comm, source, tick=0.01, liveness=FAST, prefetch=0)
    assert state.lost == {2}  # rank 3, on the same host, busy past three timeouts but beating, is kept
    assert state.lost_nodes == set()  # so the rank is lost, not its node
    lost = [r for r in source.results if r.status == Status.LOST]
    assert [r.rank for r in lost] == [2] and lost[0].error == "worker rank 2 stopped answering"
    assert sorted(r.rank for r in source.results if r.status == Status.OK) in ([1, 1, 3], [1, 3, 3])


@pytest.mark.timeout(30)
def test_a_host_whose_every_rank_is_silent_is_given_up_whole():
    comm = BeatingComm({1: "a", 2: "b", 3: "b"}, beating={1},
                       script=lambda rank, task: forever(rank, task) if rank != 1 else until(0.0))
    state = master_serve(comm, ListSource(4), tick=0.01, liveness=FAST, prefetch=0)
    assert state.lost == {2, 3} and state.lost_nodes == {"b"}


def test_a_master_that_was_away_gives_its_workers_an_interval_to_be_heard():
    """Its loop blocked (a slow file system, say): what the workers sent meanwhile may still be on the way."""
    liveness = Liveness(interval=1.0, worker_timeout=3.0)
    silence = Silence(range(1, 3), liveness, now=0.0, tick=0.5)
    assert silence.silent(0.6, set()) == []  # heard at 0: fine
    assert silence.silent(10.0, set()) == []  # back after 9.4 s away: none given up yet
    silence.seen[1] = 10.5
    assert silence.silent(10.8, set()) == []  # still within the interval after its return
    assert silence.silent(11.4, set()) == [2]  # rank 2 said nothing since: given up; rank 1 was heard
    assert silence.silent(12.0, {2}) == []


# -- rank 0's heartbeat file and its watch --------------------------------------------------------------------------
def test_the_watch_sees_a_file_that_stands_still_and_ignores_an_old_one(tmp_path):
    path = tmp_path / "master.alive"
    path.write_text("left by a job that was killed\n")
    watch = MasterWatch(path, timeout=10.0, every=0.0)
    assert watch.check(now=100.0) is None and watch.check(now=200.0) is None  # old: not watched
    beacon = Beacon(Liveness(interval=1.0, master_timeout=10.0, master_file=str(path)))
    assert watch.check(now=300.0) is None  # a new file: watched from now
    assert watch.pid == os.getpid() and watch.file_timeout == 10.0
    assert watch.check(now=305.0) is None
    assert watch.check(now=311.0) == pytest.approx(11.0)  # untouched for 11 s by the watch's clock
    os.utime(path, ns=(1, 1))  # any change of the modification time is a sign of life
    assert watch.check(now=312.0) is None
    beacon.close()  # serving ended: nothing to watch
    assert not path.exists() and watch.check(now=400.0) is None


def test_the_watch_takes_the_timeout_the_file_states(tmp_path):
    path = tmp_path / "master.alive"
    Beacon(Liveness(interval=1.0, master_timeout=4.0, master_file=str(path)))
    watch = MasterWatch(path, every=0.0)
    os.utime(path, ns=(2, 2))
    assert watch.check(now=0.0) is None and watch.check(now=3.0) is None and watch.check(now=5.0) == 5.0


# -- real MPI ---------------------------------------------------------------------------------------------------------
def run_script(n: int, mode: str, tmp_path: Path):
    proc = run_mpi(n, [SCRIPT, mode, tmp_path], timeout=120, abort_on_error=False)
    results = [(int(i), int(r), s, float(t)) for i, r, s, t in
               re.findall(r"result id=(\d+) rank=(\d+) status=(\w+) at=([\d.]+)", proc.stdout)]
    return proc, results


@pytest.mark.mpi
def test_a_frozen_worker_rank_is_given_up_within_the_timeout_and_the_run_reaches_its_budget(tmp_path):
    proc, results = run_script(4, "frozen", tmp_path)
    out = describe_run(proc)
    assert proc.returncode == EXIT_LOST, out
    assert re.search(r"worker rank 2 on \S+ stopped answering \(silent for \d+ s", proc.stderr), out
    assert "lost ranks=[2]" in proc.stdout, out
    assert len(results) == 12 and len({i for i, *_ in results}) == 12, out  # the budget, every id once
    assert all(status == "ok" for _, rank, status, _ in results if rank != 2), out
    frozen = float(re.search(r"frozen at=([\d.]+)", proc.stdout).group(1))
    lost = [t for _, rank, status, t in results if status == "lost"]
    assert len(lost) == 1, out
    # given up after the worker timeout (3 s) and within seconds of it, not after the task limit (600 s)
    assert 3.0 - 0.6 < lost[0] - frozen < 3.0 + 3.0, out


@pytest.mark.mpi
def test_a_slow_candidate_that_says_nothing_is_not_given_up(tmp_path):
    proc, results = run_script(3, "slow", tmp_path)
    out = describe_run(proc)
    assert proc.returncode == 0, out
    assert "lost ranks=[] nodes=[]" in proc.stdout and "stopped answering" not in proc.stderr, out
    assert [s for *_, s, _ in results] == ["ok"] * 4, out


@pytest.mark.mpi
def test_a_stopped_master_is_found_by_the_first_worker_of_its_node(tmp_path):
    proc, results = run_script(3, "master-stops", tmp_path)
    out = describe_run(proc)
    assert proc.returncode == EXIT_LOST, out
    assert re.search(r"rank 0 \(the master, pid \d+ on \S+\) has not touched \S+ for \d+ s", proc.stderr), out
    assert "exit rank=" not in proc.stdout, out


# -- the command a user starts --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def data(shapes_file) -> Path:  # noqa: F811
    return shapes_file


@pytest.mark.mpi
@pytest.mark.timeout(240)
def test_a_stopped_rank0_ends_the_shell_started_job_with_its_summary_and_the_resume_command(data, tmp_path):
    out = tmp_path / "run"
    job = start("evolve", "--data", data, "--out", out, "--evaluations", 500, "--workers", 2, "--max-restarts", 0,
                *SMALL, "--set", "train.epochs=1", "--set", "run.heartbeat=0.5", "--set", "run.master_timeout=4")
    heartbeat = out / "log" / "master.alive"
    wait_until(lambda: (out / "results.jsonl").exists() and (out / "results.jsonl").stat().st_size > 0
               or job.poll() is not None, 120, "the first evaluation")
    assert job.poll() is None, job.communicate()
    rank0 = json.loads(heartbeat.read_text())["pid"]
    os.kill(rank0, signal.SIGSTOP)
    stdout, stderr = job.communicate(timeout=90)
    assert job.returncode == EXIT_LOST, stderr
    assert "Traceback" not in stderr
    assert re.search(r"rank 0 \(the master, pid \d+ on \S+\) has not touched \S+master.alive for \d+ s", stderr)
    assert "continue with --resume: galapagos evolve --resume --out" in stderr, stderr
    assert "evaluations" in stdout, stdout  # the summary, written from the journal
    summary = json.loads((out / "summary.json").read_text())
    assert summary["evaluations"] == len((out / "results.jsonl").read_text().splitlines())
    wait_until(lambda: not ranks_of(out), 30, "every rank to end")


# -- a frozen node of the namespace cluster (tests/cluster.py) ------------------------------------------------------
TINY = ["--set", "train.epochs=1", "--set", "space.max_layers=3", "--set", "space.channels=[4, 8]",
        "--set", "space.units=[16, 32]", "--set", "evolution.population_size=4", "--set", "run.task_timeout=600"]
# run.heartbeat and run.worker_timeout of the cluster test; GALAPAGOS_TEST_BEAT="10,30" (the defaults): bench/RESULTS.md
BEAT = dict(zip(("heartbeat", "worker_timeout"), map(float, os.environ.get("GALAPAGOS_TEST_BEAT", "1,6").split(","))))


def freeze(cluster, index: int, how: str) -> None:
    """Node `index` stops answering: every process in it stopped (SIGSTOP), or its link taken down."""
    if how == "sigstop":
        spaces = cluster.node(index).namespaces()
        for pid in pids_in(spaces):
            if pid != os.getpid():
                os.kill(pid, signal.SIGSTOP)
    else:
        cluster.run(index, ["ip", "link", "set", "eth0", "down"], check=True)


def thaw(cluster, index: int, how: str) -> None:
    if how == "sigstop":
        for pid in pids_in(cluster.node(index).namespaces()):
            os.kill(pid, signal.SIGCONT)
    else:
        cluster.run(index, ["ip", "link", "set", "eth0", "up"], check=True)


@pytest.mark.mpi
@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["sigstop", "link-down"])
def test_a_frozen_node_is_given_up_within_seconds_of_the_timeout(data, tmp_path, how):
    """Four nodes, rank 0 and a worker on node0, one worker on each other node; node2 freezes mid-run. Prints the
    seconds from the freeze to the master giving the node up (bench/RESULTS.md)."""
    if (why := cluster_problem()) is not None:
        pytest.skip(why)
    run, evaluations = tmp_path / "run", 40
    cli = [sys.executable, "-m", "galapagos.cli", "evolve", "--data", data, "--out", run, "--evaluations",
           str(evaluations), *TINY, *[a for k, v in BEAT.items() for a in ("--set", f"run.{k}={v}")]]
    with Cluster(4, name="node") as c, open(tmp_path / "out.txt", "w") as out:
        node2 = c.hosts[2]
        job = c.popen(0, c.mpiexec_argv(cli, ppn=[2, 1, 1, 1]), env={**c.mpi_env(), "PYTHONPATH": str(REPO)},
                      stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        journal = run / "results.jsonl"
        wait_until(lambda: journal.exists() and len(journal.read_text().splitlines()) >= 4 or job.poll() is not None,
                   120, "four evaluations")
        assert job.poll() is None, (tmp_path / "out.txt").read_text()
        frozen = time.time()
        freeze(c, 2, how)
        try:
            wait_until(lambda: (run / "summary.json").exists() or job.poll() is not None, 200, "the run's end")
        finally:
            thaw(c, 2, how)
        try:
            code = job.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            code = job.wait()
    text = (tmp_path / "out.txt").read_text()
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    assert code == EXIT_LOST, text[-4000:]
    assert re.search(rf"node {node2} stopped answering: its worker rank\(s\) 3 are silent", text), text[-4000:]
    assert len(records) == evaluations and len({r["id"] for r in records}) == evaluations, text[-4000:]
    # its running and queued tasks went back to the queue; nothing finished was lost, nothing ran on node2 after
    assert all(r["status"] == "ok" for r in records), records
    assert "goes back to the queue" in text, text[-4000:]
    seconds = json.loads((run / "log" / "lost.json").read_text())["given_up"]["3"] - frozen
    print(f"\nfrozen node ({how}) given up {seconds:.1f} s after it froze (run.worker_timeout "
          f"{BEAT['worker_timeout']:g} s, run.heartbeat {BEAT['heartbeat']:g} s, 4 nodes)")
    assert BEAT["worker_timeout"] - BEAT["heartbeat"] - 0.5 < seconds < BEAT["worker_timeout"] + 5.0
