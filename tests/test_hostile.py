"""Galapagos tried as a hostile user would (issue 39): a disk that fills up, stop signals to every process of a job,
refusals after the ranks started, other data on --resume, a damaged journal. Real processes, real MPI (the
`galapagos` command and its mpiexec, or mpiexec started here), real file systems (tmpfs and read-only mounts, as
root; skipped elsewhere), real signals.

| what the user does                               | expected                                              |
|--------------------------------------------------|-------------------------------------------------------|
| fills the disk under --out mid-run               | exit 2, one line (the path, the room left); nothing   |
|                                                  | recorded against a candidate; --resume then goes on   |
| SIGTERM to every process of the job (scancel)    | the clean stop: summary, exit 0, no wait for workers  |
| SIGKILL to the command                           | the ranks stop cleanly at once (no wait for workers)  |
| Ctrl-C, then Ctrl-C again                        | the log names SIGINT; the second ends the job at once |
| a refused new run (NaN data, no room, read-only) | --out as found; read-only found before any rank       |
| a refused --resume                               | the run left intact                                   |
| --resume on data of the same size, other bytes   | what differs, not two equal sizes                     |
| a damaged middle line of results.jsonl           | its line number and how to recover                    |
"""
from __future__ import annotations

# ruff: noqa: F811 - the fixtures imported below are taken by name as the tests' arguments

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

from galapagos.errors import RunDirError
from galapagos.launch.protocol import Status, Task
from galapagos.launch.trainer import TaskContext, run_one
from galapagos.store.rundir import RunDir
from tests.mpirun import REPO, mpiexec
from tests.test_evolve_run import SMALL, galapagos, shapes_file  # noqa: F401 - the fixture `data` takes
from tests.test_faults import (data, fill, mount, no_job_outlives_its_test, ranks_of, running_job,  # noqa: F401
                               wait_until, worker_ranks)

QUICK = [*SMALL, "--set", "run.task='tests.hostile_tasks:quick'"]


# -- a disk that fills up ------------------------------------------------------------------------------------------
def saves_through_galapagos(path, ctx):
    import torch

    from galapagos.evolve.netdir import save_weights

    save_weights({"w": torch.zeros(100_000)}, path)
    return {"fitness": 1.0}


def saves_by_path(path, ctx):
    """torch.save given a path: torch's C++ writer reports the failed write without its errno."""
    import torch

    torch.save({"w": torch.zeros(100_000)}, path)
    return {"fitness": 1.0}


def wrong_candidate(path, ctx):
    raise ValueError("the candidate's own failure")


@pytest.mark.parametrize("kind, words", [("full", "No space left on device"), ("read-only", "Read-only file system")])
def test_a_write_the_disk_refuses_is_the_disks_fault_not_the_candidates(mount, kind, words):
    disk = mount(kind)
    if kind == "full":
        fill(disk, leave=0)
    ctx = TaskContext(None, {}, "cpu", 1)
    before = set(disk.iterdir())
    outcome = run_one(saves_through_galapagos, Task(7, str(disk / "7.pt")), ctx)
    assert outcome.status == Status.DISK and outcome.fitness is None and outcome.error.endswith(words), outcome
    assert set(disk.iterdir()) == before, "a half-written weights file was left behind"
    outcome = run_one(saves_by_path, Task(8, str(disk / "8.pt")), ctx)
    assert outcome.status == Status.DISK and "\n" not in outcome.error, outcome
    assert run_one(wrong_candidate, Task(9, str(disk / "9.pt")), ctx).status == Status.FAILED


def journal_lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def test_a_full_disk_records_nothing_against_candidates_and_resume_goes_on(data, mount):
    disk = mount("full")
    out = disk / "run"
    job = running_job(data, out, "--set", "space.max_params=20000", "--set", "run.keep_models=1")
    fill(disk)  # another user fills the disk mid-run: weights files no longer fit, journal lines may
    stdout, stderr = job.communicate(timeout=240)
    assert job.returncode == 2, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("galapagos evolve: error")]
    assert len(lines) == 1 and "No space left on device" in lines[0] and "MiB free" in lines[0], stderr
    assert str(out) in lines[0] and "--resume once there is room" in lines[0] and "Traceback" not in stderr
    done = journal_lines(out)
    assert not [r for r in done if r["status"] not in ("ok", "pruned")], "a candidate was blamed for the disk"
    (disk / "filler").unlink()
    budget = len(done) + 3
    proc = galapagos("evolve", "--data", data, "--out", out, "--resume", "--evaluations", budget, "--workers", 2,
                     *SMALL, "--set", "space.max_params=20000", "--set", "run.keep_models=1", timeout=240)
    assert proc.returncode == 0, proc.stderr
    ids = [r["id"] for r in journal_lines(out)]
    assert len(ids) == budget and len(set(ids)) == budget


# -- stop signals --------------------------------------------------------------------------------------------------
def children(pids: list[int]) -> list[int]:
    """The processes whose parent is one of `pids` (a worker rank's trainer child)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid in pids:
                found.append(int(proc.name))
    return found


def rank_pids(out: Path) -> list[int]:
    """Every rank of the job writing to `out` (rank 0 too), not its mpiexec nor the command."""
    return [p for p in ranks_of(out) if b"PMI_RANK=" in Path(f"/proc/{p}/environ").read_bytes()]


def master_log(out: Path) -> str:
    return (out / "log" / "master.log").read_text()


def test_sigterm_to_every_process_of_the_job_is_the_clean_stop(data, tmp_path):
    """What scancel and a scheduler's time limit do: SIGTERM to every task of the job and to what they started."""
    out = tmp_path / "run"
    job = running_job(data, out, *QUICK[len(SMALL):], "--set", "run.task='tests.hostile_tasks:slowish'")
    ranks = rank_pids(out)
    assert len(ranks) == 3
    everyone = ranks + children(worker_ranks(out))
    for pid in everyone:
        os.kill(pid, signal.SIGTERM)
    stdout, stderr = job.communicate(timeout=90)
    assert job.returncode == 0, stderr
    assert "ended abnormally" not in stderr and "Traceback" not in stderr
    assert "stopped by SIGTERM before the budget was spent: continue with --resume" in stdout
    assert json.loads((out / "summary.json").read_text())["stopped_by"] == "SIGTERM"
    assert "did not answer Stop" not in master_log(out)
    assert {r["status"] for r in journal_lines(out)} == {"ok"}, "a trainer's SIGTERM was blamed on its candidate"
    wait_until(lambda: not ranks_of(out), 30, "every rank to end")


def test_sigkill_of_the_command_stops_its_ranks_cleanly_at_once(data, tmp_path):
    out = tmp_path / "run"
    job = running_job(data, out, *QUICK[len(SMALL):])
    job.kill()
    job.wait()
    wait_until(lambda: not ranks_of(out), 60, "every rank to end after its command was killed")
    assert "stop requested (SIGTERM)" in master_log(out) and "did not answer Stop" not in master_log(out)
    assert json.loads((out / "summary.json").read_text())["stopped_by"] == "SIGTERM"


def test_ctrl_c_is_named_and_a_second_one_ends_the_job_at_once(data, tmp_path):
    """A worker that hangs (SIGSTOP) holds up the clean stop: the user presses Ctrl-C again."""
    out = tmp_path / "run"
    job = running_job(data, out, *QUICK[len(SMALL):])
    os.kill(worker_ranks(out)[0], signal.SIGSTOP)
    job.send_signal(signal.SIGINT)
    wait_until(lambda: "stop requested" in master_log(out), 30, "the master to hear of the Ctrl-C")
    job.send_signal(signal.SIGINT)
    stdout, stderr = job.communicate(timeout=60)
    assert job.returncode == 130, stderr
    assert "SIGINT again: ending the job now" in stderr and "Traceback" not in stderr
    assert "stop requested (SIGINT)" in master_log(out) and "SIGUSR1" not in master_log(out)
    assert "continue with --resume: galapagos evolve --resume" in stderr
    wait_until(lambda: not ranks_of(out), 30, "every rank to end, the stopped one too")


# -- refusals leave the directory as they found it ------------------------------------------------------------------
def nan_data(src: Path, dest: Path) -> Path:
    """`src` with one NaN in a training sample: found only as the data is shared, once the ranks have started."""
    shutil.copy(src, dest)
    with h5py.File(dest, "r+") as f:
        f["train/x"][5, 0, 3, 3] = float("nan")
    return dest


def tree(path: Path) -> dict[str, bytes | None]:
    """Every entry under `path` and its contents (None for a directory)."""
    return {str(p.relative_to(path)): None if p.is_dir() else p.read_bytes() for p in sorted(path.rglob("*"))}


def one_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("galapagos evolve: error")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_a_refused_new_run_leaves_out_as_it_found_it(data, tmp_path):
    bad = nan_data(data, tmp_path / "nan.h5")
    made = tmp_path / "made"  # --out that the run would create
    empty = tmp_path / "empty"  # --out the user made beforehand
    empty.mkdir()
    for out in (made, empty):
        proc = galapagos("evolve", "--data", bad, "--out", out, "--evaluations", 2, "--workers", 1, *QUICK,
                         timeout=120)
        assert proc.returncode == 2 and "non-finite value (nan) in sample 5" in one_error(proc.stderr)
        assert "rank(s)" in proc.stderr, "the NaN is found once the ranks have started"
    assert not made.exists(), sorted(made.rglob("*"))
    assert list(empty.iterdir()) == []


def test_read_only_out_is_found_before_any_rank_starts(data, mount):
    out = mount("read-only") / "run"
    proc = galapagos("evolve", "--data", data, "--out", out, "--evaluations", 2, "--workers", 1, timeout=120)
    assert proc.returncode == 2
    line = one_error(proc.stderr)
    assert "Read-only file system" in line and "[Errno" not in line and f"--out {out}" in line, line
    assert "rank(s)" not in proc.stderr, "the ranks were started"


def test_too_little_room_is_found_before_any_rank_starts(data, mount):
    out = mount("full") / "run"
    proc = galapagos("evolve", "--data", data, "--out", out, "--evaluations", 4, "--workers", 1, *SMALL,
                     timeout=120)
    assert proc.returncode == 2 and "MiB free, the run may need" in one_error(proc.stderr)
    assert "rank(s)" not in proc.stderr and not out.exists()


def test_a_refused_resume_leaves_the_run_intact(data, tmp_path):
    out = tmp_path / "run"
    proc = galapagos("evolve", "--data", data, "--out", out, "--evaluations", 2, "--workers", 1, *QUICK,
                     timeout=120)
    assert proc.returncode == 0, proc.stderr
    before = tree(out)
    del before["log/master.log"]  # the refused job's lines are added to its log
    # Under a launcher every check runs on rank 0, after the ranks started: a room check that refuses.
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-m", "galapagos.cli", "evolve", "--data", str(data),
                           "--out", str(out), "--resume", "--evaluations", "4", *QUICK,
                           "--set", "space.max_params=100000000000"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "MiB free, the run may need" in proc.stderr, proc.stderr
    after = tree(out)
    del after["log/master.log"]
    assert after == before


# -- what --resume says ---------------------------------------------------------------------------------------------
def test_other_data_of_the_same_size_is_told_by_what_differs(data, tmp_path):
    from galapagos.datashare.format import inspect
    from galapagos.store.fingerprint import data_fingerprint

    run = RunDir.open(tmp_path / "run", resume=False)
    run.record_data(data_fingerprint(inspect(data), data), resume=False)
    edited, described = tmp_path / "edited.h5", tmp_path / "described.h5"
    for path in (edited, described):
        shutil.copy(data, path)
    with h5py.File(edited, "r+") as f:
        f["train/x"][3, 0, 2, 2] += 1
    with h5py.File(described, "r+") as f:
        f.attrs["description"] = "another description"
    assert edited.stat().st_size == data.stat().st_size
    size = f"{data.stat().st_size:,}"
    for path, words in [(edited, f"the same size, {size} bytes; what differs: its values"),
                        (described, "root attribute description")]:
        with pytest.raises(RunDirError) as err:
            run.check_data(inspect(path), path)
        line = str(err.value)
        assert words in line and f"{size} vs {size}" not in line and "\n" not in line, line


def test_a_dataset_that_does_not_fit_a_model_says_what_differs():
    """predict and ensemble on a file whose problem differs only where both sides print alike (ignore_index)."""
    from types import SimpleNamespace

    from galapagos.evolve.problem import Problem

    problem = Problem((1, 12, 12), "segmentation", 4, 255)
    why = problem.mismatch(SimpleNamespace(sample_shape=(1, 12, 12), task="segmentation", num_targets=4,
                                           ignore_index=None))
    assert why.endswith("(what differs: ignore_index 255 vs None)"), why


def test_a_damaged_middle_line_of_the_journal_says_how_to_recover(data, tmp_path):
    out = tmp_path / "run"
    proc = galapagos("evolve", "--data", data, "--out", out, "--evaluations", 3, "--workers", 1, *QUICK,
                     timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = (out / "results.jsonl").read_text().splitlines()
    (out / "results.jsonl").write_text("\n".join([lines[0], lines[1][:40], lines[2]]) + "\n")
    proc = galapagos("report", out, timeout=60)
    assert proc.returncode == 2
    line = proc.stderr.strip().splitlines()[-1]
    assert f"{out / 'results.jsonl'}:2:" in line and "Traceback" not in proc.stderr, proc.stderr
    assert f"sed -i 2d {out / 'results.jsonl'}" in line and "--resume" in line, line
    subprocess.run(["sed", "-i", "2d", str(out / "results.jsonl")], check=True)  # the hint, followed
    proc = galapagos("evolve", "--data", data, "--out", out, "--resume", "--evaluations", 3, "--workers", 1, *QUICK,
                     timeout=120)
    assert proc.returncode == 0, proc.stderr
    ids = [r["id"] for r in journal_lines(out)]
    assert len(ids) == 3 == len(set(ids))
