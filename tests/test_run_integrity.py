"""A run directory stays one run: its data cannot change under --resume, one live job holds it at a time, and the
time budget counts every job's search time. Plain functions here; the end-to-end runs are at the bottom (mpi)."""
from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from galapagos.datashare.format import inspect
from galapagos.datashare.write import write_dataset
from galapagos.errors import RunDirError
from galapagos.store import fingerprint, runlock
from galapagos.store.fingerprint import data_fingerprint, sample_ranges
from galapagos.store.rundir import RunDir
from tests.mpirun import REPO, describe_run, mpiexec, run_mpi
from tests.test_evolve_run import SMALL, _rank0_pid, galapagos, journal


def classes(path: Path, *, size: int = 8, channels: int = 1, n: int = 40, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    x = rng.random((n, channels, size, size), dtype=np.float32)
    write_dataset(path, {"train": (x, rng.integers(0, 3, n)), "val": (x[:10], rng.integers(0, 3, 10))},
                  task="classification", num_classes=3)
    return path


def regression(path: Path) -> Path:
    rng = np.random.default_rng(0)
    write_dataset(path, {"train": (rng.random((40, 1, 8, 8), dtype=np.float32), rng.random((40, 2)))},
                  task="regression")
    return path


def resumable(tmp_path: Path, data: Path) -> RunDir:
    """A run directory evolved on `data`, as a job leaves it."""
    run = RunDir.open(tmp_path / "run", resume=False)
    run.config.write_text("")
    run.record_data(data_fingerprint(inspect(data), data), resume=False)
    return run


# -- the data ----------------------------------------------------------------------------------------------------
def test_resume_refuses_other_data_and_accepts_a_copy(tmp_path):
    data = classes(tmp_path / "d.h5")
    run = resumable(tmp_path, data)
    copy = tmp_path / "copy.h5"
    shutil.copy(data, copy)
    assert run.check_data(inspect(copy), copy)["path"] == str(copy.resolve())

    other = classes(tmp_path / "other.h5", size=6, channels=2)
    with pytest.raises(RunDirError) as err:
        run.check_data(inspect(other), other)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"--resume: {run.path} was evolved on {data.resolve()} (")
    assert "classification, float32 samples (1, 8, 8), 3 classes" in line and "samples (2, 6, 6)" in line
    assert line.endswith("(what differs: sample shape)")

    reg = regression(tmp_path / "reg.h5")
    differs = r"\(what differs: task, classes/targets, split sizes\)$"
    with pytest.raises(RunDirError, match=r"has regression, .* 2 targets.*" + differs):
        run.check_data(inspect(reg), reg)


def test_resume_refuses_a_changed_byte_of_the_same_shape(tmp_path):
    data = classes(tmp_path / "d.h5")
    run = resumable(tmp_path, data)
    edited = tmp_path / "edited.h5"
    shutil.copy(data, edited)
    with h5py.File(edited, "r+") as f:
        f["train/x"][3, 0, 2, 2] += 1
    with pytest.raises(RunDirError, match=r"same structure but the file's contents differ \(the same size, [\d,]+ "
                                          r"bytes; what differs: its values"):
        run.check_data(inspect(edited), edited)


def test_a_run_from_before_data_json_resumes_and_gets_one(tmp_path, caplog):
    data = classes(tmp_path / "d.h5")
    run = RunDir.open(tmp_path / "run", resume=False)
    fp = run.check_data(inspect(data), data)  # no data.json: taken on trust
    caplog.set_level("INFO")
    run.record_data(fp, resume=True)
    assert json.loads(run.data.read_text())["sha256"] == fp["sha256"] and "older than data.json" in caplog.text
    moved = tmp_path / "moved.h5"
    data.rename(moved)
    run.record_data(run.check_data(inspect(moved), moved), resume=True)
    assert f"the data moved from {data.resolve()} to {moved.resolve()}" in caplog.text
    assert json.loads(run.data.read_text())["path"] == str(moved.resolve())


def test_a_large_file_is_hashed_by_samples():
    size = 5 << 40  # 5 TiB: a few MiB read
    pieces = sample_ranges(size)
    assert sum(n for _, n in pieces) == 2 * fingerprint.EDGE_BYTES + fingerprint.BLOCKS * fingerprint.BLOCK_BYTES
    edge = fingerprint.EDGE_BYTES
    assert pieces[0] == (0, edge) and pieces[-1] == (size - edge, edge)
    assert all(a + n <= b for (a, n), (b, _) in zip(pieces, pieces[1:]))
    assert sample_ranges(1000) == [(0, 1000)]


# -- the lock ----------------------------------------------------------------------------------------------------
def test_a_held_lock_refuses_a_second_job_and_is_released(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    run = RunDir.open(tmp_path / "run", resume=False)
    with run.lock():
        holder = json.loads(run.lock_file.read_text())
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname() and holder["job"] == "4242"
        with pytest.raises(RunDirError) as err:
            RunDir.check(run.path, resume=False)  # the pre-flight check takes and gives back the lock
        assert str(err.value) == (f"{run.path} is in use by a live run (host {socket.gethostname()}, pid "
                                  f"{os.getpid()}, job 4242, since {holder['since']}); wait for it to end or use "
                                  "another --out")
    RunDir.check(run.path, resume=False).lock().release()


def test_a_killed_holder_leaves_no_lock(tmp_path):
    run = RunDir.open(tmp_path / "run", resume=False)
    code = ("import sys, time; from galapagos.store.rundir import RunDir; lock = RunDir(sys.argv[1]).lock(); "
            "print('locked', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(run.path)], cwd=REPO, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirError, match=f"pid {holder.pid}, since"):
            run.lock()
    finally:
        holder.kill()
        holder.wait()
    run.lock().release()  # the kernel dropped the flock of the killed process


def test_without_flock_a_stale_lock_is_replaced_and_a_live_one_refuses(tmp_path, monkeypatch):
    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(runlock.fcntl, "flock", no_flock)
    run = RunDir.open(tmp_path / "run", resume=False)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    run.lock_file.write_text(json.dumps({"host": host, "pid": dead.pid, "since": "then", "job": None}))
    lock = run.lock()  # its pid is dead on this host: stale
    assert json.loads(run.lock_file.read_text())["pid"] == os.getpid()
    with pytest.raises(RunDirError, match=f"in use by a live run \\(host {host}, pid {os.getpid()}"):
        run.lock()
    lock.release()
    assert not run.lock_file.exists()
    run.lock_file.write_text(json.dumps({"host": "elsewhere", "pid": dead.pid, "since": "then", "job": "7"}))
    with pytest.raises(RunDirError, match=r"host elsewhere, pid \d+, job 7, since then"):
        run.lock()  # another host's process cannot be seen from here: taken as live


def test_the_clock_adds_up_over_jobs(tmp_path):
    run = RunDir.open(tmp_path / "run", resume=False)
    assert run.spent_seconds() == 0.0
    run.record_seconds(12.3456)
    assert run.spent_seconds() == 12.346


# -- end to end, over real MPI ranks -----------------------------------------------------------------------------
QUICK = [*SMALL, "--set", "run.task='tests.mpi_scripts.integrity_tasks:quick'"]
SLOW = [*SMALL, "--set", "run.task='tests.mpi_scripts.integrity_tasks:slow'"]


@pytest.fixture(scope="module")
def shapes_file(tmp_path_factory) -> Path:
    from galapagos.examples import shapes

    path = tmp_path_factory.mktemp("data") / "shapes.h5"
    shapes.generate(path, samples=300, size=12, seed=1)
    return path


def start(out: Path, data: Path, *args) -> subprocess.Popen:
    """A live evolution job over 3 ranks, in its own process group."""
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    return subprocess.Popen([mpiexec(), "-n", "3", sys.executable, "-m", "mpi4py", "-m", "galapagos.cli", "evolve",
                             "--data", str(data), "--out", str(out), *map(str, args)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_for_lines(out: Path, n: int, job: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and job.poll() is None:
        if (out / "results.jsonl").exists() and len((out / "results.jsonl").read_bytes().splitlines()) >= n:
            return
        time.sleep(0.1)
    pytest.fail(f"{out}: fewer than {n} results (job exit code {job.poll()})")


def finish(job: subprocess.Popen, timeout: float = 180) -> tuple[str, str]:
    try:
        return job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.communicate()
        pytest.fail("the job did not end")


@pytest.mark.mpi
def test_resume_checks_the_data_end_to_end(shapes_file, tmp_path):
    out = tmp_path / "run"
    proc = galapagos("evolve", "--data", shapes_file, "--out", out, "--workers", 2, "--evaluations", 4, *QUICK,
                     timeout=180)
    assert proc.returncode == 0, proc.stderr
    before = (out / "results.jsonl").read_bytes()
    recorded = json.loads((out / "data.json").read_text())
    assert recorded["path"] == str(shapes_file.resolve()) and recorded["splits"] == inspect(shapes_file).splits

    other = classes(tmp_path / "other.h5", size=10)
    reg = regression(tmp_path / "reg.h5")
    edited = tmp_path / "edited.h5"
    shutil.copy(shapes_file, edited)
    with h5py.File(edited, "r+") as f:
        f["train/x"][5, 0, 3, 3] += 0.5
    for data, words in [(other, "(what differs: sample shape, classes/targets, split sizes)"),
                        (reg, "has regression"), (edited, "the file's contents differ")]:
        proc = galapagos("evolve", "--data", data, "--out", out, "--evaluations", 8, "--resume", timeout=120)
        assert proc.returncode == 2, (data, proc.stderr)
        errors = [line for line in proc.stderr.splitlines() if "error:" in line]
        assert len(errors) == 1 and f"--resume: {out} was evolved on {shapes_file.resolve()}" in errors[0], errors
        assert words in errors[0]
        assert (out / "results.jsonl").read_bytes() == before

    copy = tmp_path / "copy.h5"
    shutil.copy(shapes_file, copy)
    proc = galapagos("evolve", "--data", copy, "--out", out, "--workers", 2, "--evaluations", 6, "--resume",
                     timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert len(journal(out)) == 6 and "the data moved from" in proc.stderr
    assert json.loads((out / "data.json").read_text())["path"] == str(copy.resolve())


@pytest.mark.mpi
def test_a_live_run_refuses_a_second_job(shapes_file, tmp_path):
    out = tmp_path / "run"
    first = start(out, shapes_file, "--evaluations", 60, *SLOW)
    try:
        wait_for_lines(out, 2, first)
        second = galapagos("evolve", "--data", shapes_file, "--out", out, "--evaluations", 60, "--resume",
                           timeout=120)
        # refused while the first still runs: it did not wait for the first to end
        assert first.poll() is None, "the first run ended before the second was checked"
        assert second.returncode == 2, second.stderr
        assert f"{out} is in use by a live run (host {socket.gethostname()}, pid " in second.stderr
        assert "wait for it to end or use another --out" in second.stderr
        under_mpi = run_mpi(2, ["-m", "galapagos.cli", "evolve", "--data", shapes_file, "--out", out,
                                "--evaluations", 60, "--resume"], timeout=120)  # rank 0's own check
        assert under_mpi.returncode == 2 and "is in use by a live run" in under_mpi.stderr, describe_run(under_mpi)
    finally:
        _, stderr = finish(first)
    assert first.returncode == 0, stderr
    records = journal(out)
    assert len(records) == 60 and len({r["id"] for r in records}) == 60  # the first run went on undisturbed


@pytest.mark.mpi
def test_the_time_budget_spans_resumed_jobs(shapes_file, tmp_path):
    out, budget = tmp_path / "run", 0.3  # minutes
    first = start(out, shapes_file, "--budget-minutes", budget, *SLOW)
    try:
        wait_for_lines(out, 12, first)
        os.kill(_rank0_pid(out), signal.SIGUSR1)
    finally:
        _, stderr = finish(first)
    assert first.returncode == 0, stderr
    spent = json.loads((out / "clock.json").read_text())["seconds"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_by"] == "SIGUSR1" and summary["search_seconds"] == pytest.approx(spent, abs=0.01)
    assert 0 < spent < 60 * budget
    done = len(journal(out))

    t0 = time.time()
    proc = run_mpi(3, ["-m", "galapagos.cli", "evolve", "--data", shapes_file, "--out", out, "--resume", *SLOW],
                   timeout=180)
    assert proc.returncode == 0, describe_run(proc)
    summary = json.loads((out / "summary.json").read_text())
    assert "build_reserve" not in summary  # a task of its own that saves no weights: no final ensemble to build
    assert 60 * budget <= summary["search_seconds"] < 60 * budget + 2.5, summary  # the total, not this job's
    assert summary["wall_seconds"] == pytest.approx(60 * budget - spent, abs=2.5), summary
    assert time.time() - t0 < 60 * budget + 60
    assert len(journal(out)) > done and "time budget reached" in proc.stderr

    done = len(journal(out))
    proc = run_mpi(3, ["-m", "galapagos.cli", "evolve", "--data", shapes_file, "--out", out, "--resume", *SLOW],
                   timeout=120)
    assert proc.returncode == 0, describe_run(proc)
    assert "the time budget of 0.3 minute(s) was spent by the run's earlier jobs" in proc.stderr
    assert len(journal(out)) == done and "best network" in proc.stdout


@pytest.mark.mpi
def test_a_run_where_nothing_succeeds_raises_no_result(shapes_file, tmp_path):
    out = tmp_path / "run"
    proc = run_mpi(3, [REPO / "tests" / "mpi_scripts" / "no_result.py", shapes_file, out], timeout=180)
    assert proc.returncode == 0, describe_run(proc)
    assert "NoResult rank=0" in proc.stdout and "worker rank=1 code=0" in proc.stdout, describe_run(proc)
    raised = json.loads(proc.stdout.split("NoResult rank=0 ", 1)[1].splitlines()[0])
    assert raised["best_dir"] is None and raised["succeeded"] == 0 and "no evaluation of" in raised["line"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["succeeded"] == 0 and summary["best"] is None and "max_params" in summary["ended_early"]
    assert not (out / "best").exists()
