"""What happens if ...: one test per fault, each against real processes (the `galapagos` command, its mpiexec and
ranks, real signals, real files). The table, fault -> expected outcome:

| fault                                             | expected                                                        |
|---------------------------------------------------|-----------------------------------------------------------------|
| Ctrl-C (SIGINT) to the command                    | clean stop: summary.json, one line with the resume command, 130 |
| SIGTERM to the command                            | clean stop, summary.json, exit 0, no rank left                  |
| SIGKILL to the command                            | its mpiexec and every rank end too (nothing trains on)          |
| a worker rank stops answering (SIGSTOP)           | its task recorded `lost`, the others go on, summary, exit 3     |
| ... in `design`                                   | the same, then the job ends before the ensemble's phase         |
| a worker rank fails unexpectedly (a bug)          | rank 0 is told at once; as above (tests/test_lost_worker.py)    |
| ... while the job starts                          | one line naming the error, every rank ends (MPI_Abort), exit 1  |
| a worker rank is killed (SIGKILL)                 | MPICH ends every rank; the command restarts it with --resume    |
|                                                   | (tests/test_recovery.py); with --max-restarts 0 it writes the   |
|                                                   | summary from the journal, prints the resume command, removes    |
|                                                   | MPICH's segments                                                |
| rank 0 fails unexpectedly (a bug)                 | one line naming the error, every rank ends (MPI_Abort), exit 1  |
| the disk under --out fills up                     | one line: the path and the room left; exit 2, no rank left      |
| too little room under --out for the model files   | refused at start: the room and what the run may need; exit 2    |
| --out is read-only                                | one line, exit 2, no rank left waiting                          |
| --workers 0                                       | one line, exit 2                                                |
| the launcher's tasks are MPI singletons (no PMI)  | task 0: one line naming the cause and the fix; all exit 2       |
| no mpiexec                                        | one line naming it, exit 2                                      |
| data import onto an existing file                 | refused (exit 2) unless --force                                 |
| a .npz that is not a zip archive                  | one line, exit 2                                                |
| predict --save into a missing directory           | one line, exit 2, before anything runs                          |
| a corrupt model.pt                                | one line, exit 2, no advice to unpickle it                      |
| a malformed metrics.json                          | one line, exit 2                                                |
| no candidate succeeds (space.max_params = 10)     | the summary, one line, exit 4; no best/ promised                |
| /dev/shm too small                                | the sizes in units that show them                               |
| ensemble --resume with the plan's own --members   | accepted                                                        |
"""
from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.mpirun import REPO, describe_run, run_mpi
from tests.test_evolve_run import SMALL, galapagos, shapes_file  # noqa: F401 - the fixture `data` takes

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def data(shapes_file) -> Path:  # noqa: F811 - the small shapes file of the end-to-end tests
    return shapes_file


@pytest.fixture(scope="module")
def run(data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("faults") / "run"
    proc = galapagos("evolve", "--data", data, "--out", out, "--evaluations", 3, "--workers", 1, *SMALL)
    assert proc.returncode == 0, proc.stderr
    return out


STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def no_job_outlives_its_test():
    """A test that fails (or times out waiting) while its job runs does not leave the job training: the command is
    killed, and its mpiexec and ranks end with it (their PR_SET_PDEATHSIG)."""
    yield
    while STARTED:
        job = STARTED.pop()
        if job.poll() is None:
            job.kill()
            job.wait()


def start(*args) -> subprocess.Popen:
    """`galapagos ...` as a user starts it: one process, which starts its own MPI job."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_", "SLURM_"))}
    env["PYTHONPATH"] = str(REPO)
    job = subprocess.Popen([sys.executable, "-m", "galapagos.cli", *map(str, args)], cwd=REPO, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    STARTED.append(job)
    return job


def ranks_of(out: Path) -> list[int]:
    """Pids of the processes of a job writing to `out` (its mpiexec, ranks and trainers carry `out` in argv)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if str(out).encode() in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                pass
    return [p for p in pids if p != os.getpid()]


def wait_until(check, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if found := check():
            return found
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout:g} s waiting for {what}")


def running_job(data: Path, out: Path, *extra, command: str = "evolve", evaluations: int = 500) -> subprocess.Popen:
    """A long evolution that has begun training (its journal has a line)."""
    job = start(command, "--data", data, "--out", out, "--evaluations", evaluations, "--workers", 2, *SMALL, *extra)
    wait_until(lambda: (out / "results.jsonl").exists() and (out / "results.jsonl").stat().st_size > 0
               or job.poll() is not None, 120, "the first evaluation")
    assert job.poll() is None, job.communicate()
    return job


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
def test_stop_signal_to_the_command_stops_cleanly(data, tmp_path, signum, code):
    out = tmp_path / "run"
    job = running_job(data, out)
    job.send_signal(signum)
    stdout, stderr = job.communicate(timeout=90)
    assert job.returncode == code, stderr
    assert "Traceback" not in stderr
    assert (out / "summary.json").exists()
    name = signal.Signals(signum).name
    assert (f"stopped by {name} before the budget was spent: continue with --resume: galapagos evolve --resume "
            "--out") in stdout
    assert not ranks_of(out)


def test_killed_command_takes_its_job_with_it(data, tmp_path):
    out = tmp_path / "run"
    job = running_job(data, out)
    assert ranks_of(out)
    job.kill()
    job.wait()
    wait_until(lambda: not ranks_of(out), 60, "every rank to end after its command was killed")


@pytest.fixture
def mount(tmp_path):
    """mount(kind) -> a fresh directory: a 2 MiB tmpfs ("full") or a read-only bind mount (root only; skipped,
    saying why, elsewhere)."""
    mounted = []

    def make(kind: str) -> Path:
        where = tmp_path / f"mnt{len(mounted)}"
        where.mkdir()
        cmds = {"full": [["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)]],
                "read-only": [["mount", "--bind", str(tmp_path), str(where)],
                              ["mount", "-o", "remount,bind,ro", str(where)]]}[kind]
        for cmd in cmds:
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                if mounted or cmd is not cmds[0]:
                    subprocess.run(["umount", str(where)])
                pytest.skip(f"cannot make a {kind} file system here ({' '.join(cmd[:3])}: {proc.stderr.strip()})")
        mounted.append(where)
        return where

    yield make
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)])


def worker_ranks(out: Path) -> list[int]:
    """Pids of the worker ranks (PMI_RANK > 0) of the job writing to `out`."""
    pids = []
    for pid in ranks_of(out):
        try:
            env = dict(v.split(b"=", 1) for v in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in v)
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"galapagos.flows.ranks" in cmd and env.get(b"PMI_RANK", b"0") != b"0":
            pids.append(pid)
    return pids


def test_a_worker_rank_that_stops_answering_is_given_up(data, tmp_path):
    out = tmp_path / "run"
    job = running_job(data, out, "--set", "run.task_timeout=4.0", "--set", "run.lost_grace=6.0",
                      "--set", "train.epochs=1")
    stopped = worker_ranks(out)[0]
    os.kill(stopped, signal.SIGSTOP)
    stdout, stderr = job.communicate(timeout=240)  # 500 evaluations on the one worker left
    assert job.returncode == 3, stderr
    assert "stopped answering" in stderr and "Traceback" not in stderr
    import json

    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    # its running and queued tasks went back to the queue: the other worker ran them
    assert {r["status"] for r in records} <= {"ok", "pruned"} and len(records) == 500
    assert "goes back to the queue" in stderr
    assert json.loads((out / "summary.json").read_text())["lost_ranks"]
    wait_until(lambda: not ranks_of(out), 30, "every rank to end")


def test_design_with_a_lost_worker_rank_ends_after_its_evolution(data, tmp_path):
    """The ensemble's phase would wait forever for the lost rank to join its start: the job ends after the search."""
    out = tmp_path / "run"
    job = running_job(data, out, "--set", "run.task_timeout=4.0", "--set", "run.lost_grace=6.0",
                      "--set", "train.epochs=1", command="design", evaluations=40)
    os.kill(worker_ranks(out)[0], signal.SIGSTOP)
    stdout, stderr = job.communicate(timeout=240)
    assert job.returncode == 3, stderr
    assert "stopped answering" in stderr and "Traceback" not in stderr
    assert "the ensemble was not built: continue with `galapagos design --resume --out" in stdout, stdout
    assert len((out / "results.jsonl").read_text().splitlines()) == 40
    wait_until(lambda: not ranks_of(out), 30, "every rank to end")


def test_unexpected_rank0_failure_ends_every_rank():
    proc = run_mpi(3, [REPO / "tests" / "mpi_scripts" / "rank0_fails.py"], timeout=120)
    assert proc.returncode == 1, describe_run(proc)
    assert "galapagos boom: error on rank 0: RuntimeError: boom; ending the job" in proc.stderr, describe_run(proc)


def fill(disk: Path, leave: int = 8 << 10) -> None:
    """Fill the file system of `disk` but for about `leave` bytes, or wholly should the running job write meanwhile
    (the room it had between a look and a write was once gone before the write)."""
    with open(disk / "filler", "wb", buffering=0) as f:
        try:
            while (free := (st := os.statvfs(disk)).f_bavail * st.f_frsize) > leave:
                f.write(b"\0" * (free - leave))
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise


def test_full_disk_ends_the_job_with_one_line(data, mount):
    disk = mount("full")
    out = disk / "run"
    job = running_job(data, out, "--set", "space.max_params=20000", "--set", "run.keep_models=1")
    fill(disk)  # another user fills the disk mid-run
    stdout, stderr = job.communicate(timeout=240)
    assert job.returncode == 2, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("galapagos evolve: error")]
    assert len(lines) == 1 and "No space left on device" in lines[0] and "MiB free" in lines[0], stderr
    assert "continue with --resume once there is room" in lines[0] and "Traceback" not in stderr
    assert not ranks_of(out)
    assert not list((out / "models").glob(".*tmp*")), "a half-written weights file was left behind"


def test_too_little_room_for_the_models_is_refused_at_start(data, mount):
    out = mount("full") / "run"  # 2 MiB: not enough for the weights of networks of up to 2 M parameters
    proc = galapagos("evolve", "--data", data, "--out", out, "--evaluations", 4, "--workers", 1, *SMALL,
                     timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "MiB free, the run may need" in proc.stderr and "lower run.keep_models or space.max_params" in proc.stderr
    assert not ranks_of(out)


def test_a_killed_worker_rank_ends_the_job_with_a_summary(data, tmp_path):
    """Without restarts (--max-restarts 0; the restart itself: tests/test_recovery.py)."""
    from galapagos.launch.mpi import orphaned_segments, shm_segments

    before = shm_segments()
    out = tmp_path / "run"
    job = running_job(data, out, "--max-restarts", 0)
    os.kill(worker_ranks(out)[0], signal.SIGKILL)  # MPICH then ends every rank: no rank 0 summary
    stdout, stderr = job.communicate(timeout=120)
    assert job.returncode != 0 and "Traceback" not in stderr, stderr
    assert "the job ended abnormally" in stderr and "continue with --resume: galapagos evolve --resume" in stderr
    import json

    summary = json.loads((out / "summary.json").read_text())
    done = len((out / "results.jsonl").read_text().splitlines())
    assert summary["ended_by"].startswith("the job's failure") and summary["evaluations"] == done >= 1
    assert f"evaluations: {done}" in stdout
    assert not ranks_of(out)
    # orphaned: other jobs running meanwhile (tests in parallel) map theirs
    assert not orphaned_segments(before), "the killed job's MPICH segments are still in /dev/shm"


def test_read_only_out_is_one_line(data, mount):
    out = mount("read-only") / "run"
    proc = galapagos("evolve", "--data", data, "--out", out, "--evaluations", 2, "--workers", 1, timeout=120)
    assert proc.returncode == 2 and "Read-only file system" in proc.stderr and "Traceback" not in proc.stderr
    assert not ranks_of(out)


def test_run_where_nothing_succeeds_says_so(data, tmp_path):
    out = tmp_path / "run"
    proc = galapagos("evolve", "--data", data, "--out", out, "--evaluations", 3, "--workers", 1, *SMALL,
                     "--set", "space.max_params=10", timeout=180)
    assert proc.returncode == 4, proc.stderr
    assert f"galapagos evolve: no evaluation of {out} succeeded" in proc.stderr and "Traceback" not in proc.stderr
    assert "best network in" not in proc.stdout and (out / "summary.json").exists()
    assert not (out / "best").exists()


def test_workers_zero_is_refused(data, tmp_path):
    proc = galapagos("evolve", "--data", data, "--out", tmp_path / "run", "--evaluations", 2, "--workers", 0)
    assert proc.returncode == 2 and "--workers 0: need at least one worker" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_tasks_that_are_mpi_singletons_say_why(data, tmp_path):
    """srun without a PMI its MPI speaks starts every task as a world of one: what srun leaves in each task's
    environment, and three real MPI singletons."""
    procs = []
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_", "SLURM_"))}
    for rank in range(3):
        task = {**env, "PYTHONPATH": str(REPO), "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "3",
                "SLURM_PROCID": str(rank)}
        procs.append(subprocess.Popen([sys.executable, "-m", "galapagos.cli", "evolve", "--data", str(data),
                                       "--out", str(tmp_path / "run"), "--evaluations", "2"], cwd=REPO, env=task,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [2, 2, 2]
    assert "MPI is not wired: the launcher started 3 tasks (SLURM_STEP_NUM_TASKS=3)" in outs[0][1]
    assert "srun --mpi=pmi2" in outs[0][1] and "Traceback" not in outs[0][1]
    assert not outs[1][1].strip() and not outs[2][1].strip()
    assert not (tmp_path / "run").exists()


def test_missing_mpiexec_is_one_line(data, tmp_path):
    proc = galapagos("evolve", "--data", data, "--out", tmp_path / "run", "--evaluations", 2, "--workers", 1,
                     env={"GALAPAGOS_MPIEXEC": str(tmp_path / "no-mpiexec")})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"cannot start {tmp_path / 'no-mpiexec'}: No such file or directory" in proc.stderr


def test_data_import_keeps_an_existing_file_unless_forced(data, tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x_train=rng.normal(size=(20, 4)).astype(np.float32), y_train=np.arange(20) % 2)
    target = tmp_path / "d.h5"
    target.write_bytes(b"precious")
    proc = galapagos("data", "import", tmp_path / "d.npz", target)
    assert proc.returncode == 2 and "already exists" in proc.stderr and target.read_bytes() == b"precious"
    proc = galapagos("data", "import", tmp_path / "d.npz", target, "--force")
    assert proc.returncode == 0, proc.stderr
    assert galapagos("data", "check", target).returncode == 0


def test_npz_that_is_not_a_zip(tmp_path):
    (tmp_path / "d.npz").write_text("not an archive")
    proc = galapagos("data", "import", tmp_path / "d.npz", tmp_path / "d.h5")
    assert proc.returncode == 2 and "not a .npz archive" in proc.stderr and "Traceback" not in proc.stderr


def test_predict_save_into_a_missing_directory(run, data, tmp_path):
    proc = galapagos("predict", "--model", run, "--data", data, "--save", tmp_path / "no" / "p.h5")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"directory {tmp_path / 'no'} does not exist" in proc.stderr


@pytest.mark.parametrize("broken, words", [
    ("model.pt", "model.pt is unreadable: not a state_dict saved by torch.save"),
    ("metrics.json", "unreadable metrics.json"),
])
def test_broken_network_files(run, data, tmp_path, broken, words):
    import shutil

    copy = tmp_path / "best"
    shutil.copytree(run / "best", copy)
    (copy / broken).write_bytes(b"\x80garbage")
    proc = galapagos("predict", "--model", copy, "--data", data)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert words in proc.stderr and "weights_only" not in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr


def test_shared_memory_sizes_are_shown_in_units_that_show_them():
    from galapagos.datashare.shm import _gib

    assert _gib(3 << 30) == "3.00 GiB" and _gib(2 << 20) == "2.00 MiB" and _gib(1536) == "1.50 KiB"
    assert _gib(10) == "10 bytes"


def test_ensemble_resume_accepts_the_plans_own_members(run, data, tmp_path):
    from galapagos.flows.ensembling import prepare

    out = tmp_path / "ens"
    proc = galapagos("ensemble", "--from", run, "--data", data, "--out", out, "--members", 2, "--workers", 1,
                     "--set", "ensemble.epochs=1")
    assert proc.returncode == 0, proc.stderr
    assert prepare(run, data, out, overrides={"ensemble.members": 2}, resume=True).specs
    with pytest.raises(ValueError, match="cannot change it"):
        prepare(run, data, out, overrides={"ensemble.members": 3}, resume=True)
