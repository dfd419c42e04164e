"""End to end over real MPI ranks: evolution runs, faults, --resume after killing the master, self-start."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from galapagos.evolve.ahead import AHEAD
from galapagos.examples import cosmoflow, shapes
from tests.mpirun import REPO, describe_run, run_mpi

pytestmark = pytest.mark.mpi

SMALL = ["--set", "train.epochs=2", "--set", "space.max_layers=4", "--set", "space.channels=[4, 8]",
         "--set", "space.units=[16, 32]", "--set", "evolution.population_size=4", "--set", "run.task_timeout=60.0"]


@pytest.fixture(scope="module")
def shapes_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "shapes.h5"
    shapes.generate(path, samples=600, size=12, seed=1)
    return path


@pytest.fixture(scope="module")
def cosmo_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "cosmo.h5"
    cosmoflow.generate(path, samples=240, size=8, seed=1)
    return path


def journal(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def galapagos(*args, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """The console command run as one process, outside MPI (no launcher variables)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_", "SLURM_"))}
    clean["PYTHONPATH"] = str(REPO)
    clean.update(env or {})
    return subprocess.run([sys.executable, "-m", "galapagos.cli", *map(str, args)], cwd=REPO, env=clean,
                          capture_output=True, text=True, timeout=timeout)


def test_evolution_run_end_to_end(shapes_file, tmp_path):
    out = tmp_path / "run"
    proc = run_mpi(3, ["-m", "galapagos.cli", "evolve", "--data", shapes_file, "--out", out, "--evaluations", 8, *SMALL],
                   timeout=300)
    assert proc.returncode == 0, describe_run(proc)
    records = journal(out)
    assert len(records) == 8
    assert len({r["id"] for r in records}) == 8 and len({r["key"] for r in records}) == 8
    assert {r["rank"] for r in records} <= {1, 2}
    for r in records:
        assert r["status"] in ("ok", "pruned"), r
        assert 0.0 <= r["fitness"] <= 1.0 and r["params"] > 0 and r["end"] >= r["start"]
        assert r["curve"] and r["genome"]["layers"] is not None
    assert [r["origin"] for r in sorted(records, key=lambda r: r["id"])][:2] == ["prior", "prior"]
    bred = [r for r in records if r["origin"] in ("mutation", "crossover")]
    assert all(r["parents"] for r in bred)
    best = json.loads((out / "best" / "metrics.json").read_text())
    assert best["fitness"] == max(r["fitness"] for r in records if r["status"] == "ok")
    assert (out / "best" / "model.pt").exists() and (out / "config.toml").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["evaluations"] == 8 and 0 < summary["worker_utilization"] <= 1
    assert "best network:" in proc.stdout and "worker utilization" in proc.stdout

    pred = galapagos("predict", "--model", out / "best", "--data", shapes_file, "--split", "test", "--json",
                     "--save", tmp_path / "p.h5")
    assert pred.returncode == 0, pred.stderr
    scores = json.loads(pred.stdout)
    assert set(scores) >= {"accuracy", "nll", "ece"} and scores["samples"] == 90
    val = galapagos("predict", "--model", out / "best", "--data", shapes_file, "--split", "val", "--json")
    assert json.loads(val.stdout)["accuracy"] == pytest.approx(best["fitness"])  # the saved weights are the best
    report = galapagos("report", out)
    assert report.returncode == 0 and "best fitness" in report.stdout

    # the kept networks made an ensemble in final/: the best distinct networks whose weights models/ holds
    final = summary["final_ensemble"]
    kept = {int(p.stem) for p in (out / "models").glob("*.pt")}
    ok = {r["key"]: r["id"] for r in sorted(records, key=lambda r: r["fitness"]) if r["status"] == "ok"}
    members = json.loads((out / "final" / "plan.json").read_text())
    assert {m["origin"]["id"] for m in members} == {i for i in ok.values() if i in kept}
    assert final["kept"] == len(members) and 1 <= final["members"] <= len(members)
    assert final["val_best"]["accuracy"] == pytest.approx(best["fitness"]) and final["val"]["nll"] <= \
        final["val_best"]["nll"]  # selection on val never makes the ensemble worse than its best member
    assert "final ensemble:" in proc.stdout and f"kept networks in {out / 'final'}" in proc.stdout
    ens = galapagos("predict", "--model", out / "final", "--data", shapes_file, "--split", "test", "--json",
                    "--workers", 1)
    assert ens.returncode == 0 and json.loads(ens.stdout)["samples"] == 90, ens.stderr


def test_regression_3d_run_and_predict(cosmo_file, tmp_path):
    out = tmp_path / "run"
    proc = run_mpi(3, ["-m", "galapagos.cli", "evolve", "--data", cosmo_file, "--out", out, "--evaluations", 4, *SMALL],
                   timeout=300)
    assert proc.returncode == 0, describe_run(proc)
    assert len(journal(out)) == 4
    pred = galapagos("predict", "--model", out, "--data", cosmo_file, "--json")
    assert pred.returncode == 0, pred.stderr
    scores = json.loads(pred.stdout)
    assert set(scores) >= {"mse", "mae", "r2", "per_target"}
    assert set(scores["per_target"]) == {"log10_amplitude", "spectral_slope"}
    final = json.loads((out / "summary.json").read_text())["final_ensemble"]
    assert final["task"] == "regression" and final["val"]["r2"] >= final["val_best"]["r2"] - 1e-9
    off = tmp_path / "off"  # the final ensemble is an option
    proc = galapagos("evolve", "--data", cosmo_file, "--out", off, "--evaluations", 2, "--workers", 1, *SMALL,
                     "--set", "run.final_ensemble=false", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert not (off / "final").exists() and "final_ensemble" not in json.loads((off / "summary.json").read_text())


def test_faults_are_recorded_and_the_run_completes(shapes_file, tmp_path):
    """Task 1 raises, 2 returns NaN, 3 segfaults, 4 hangs past its limit, 5 aborts; the rest train for real."""
    out = tmp_path / "run"
    proc = run_mpi(4, ["-m", "galapagos.cli", "evolve", "--data", shapes_file, "--out", out, "--evaluations", 9, *SMALL,
                       "--set", "run.task='tests.faulty_tasks:faulty'", "--set", "run.task_timeout=8.0"],
                   timeout=300)
    assert proc.returncode == 0, describe_run(proc)
    by_id = {r["id"]: r for r in journal(out)}
    assert len(by_id) == 9
    expected = {1: "failed", 2: "nan", 3: "crashed", 4: "timeout", 5: "crashed"}
    for task_id, status in expected.items():
        assert by_id[task_id]["status"] == status, by_id[task_id]
        assert by_id[task_id]["fitness"] is None and by_id[task_id]["error"]
    assert "SIGSEGV" in by_id[3]["error"] and "SIGABRT" in by_id[5]["error"]
    assert all(r["status"] in ("ok", "pruned") for i, r in by_id.items() if i not in expected)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["by_status"]["crashed"] == 2


def _rank0_pid(out: Path) -> int | None:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0")
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"galapagos.cli" in cmd and str(out).encode() in cmd and b"PMI_RANK=0" in env:
            return int(entry.name)
    return None


def test_resume_after_killing_the_master(shapes_file, tmp_path):
    out = tmp_path / "run"
    args = ["-m", "galapagos.cli", "evolve", "--data", shapes_file, "--out", out, *SMALL,
            "--set", "run.task='tests.faulty_tasks:slow_quick'"]
    from tests.mpirun import mpiexec

    env = dict(os.environ, PYTHONPATH=str(REPO))
    job = subprocess.Popen([mpiexec(), "-n", "3", sys.executable, "-m", "mpi4py", *map(str, args), "--evaluations",
                            "40"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            if (out / "results.jsonl").exists() and len((out / "results.jsonl").read_text().splitlines()) >= 8:
                break
            time.sleep(0.1)
        pid = _rank0_pid(out)
        assert pid is not None, "rank 0 not found"
        os.kill(pid, signal.SIGKILL)
        job.wait(timeout=60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    before = journal(out)
    assert 8 <= len(before) < 40
    proc = run_mpi(3, [*args, "--evaluations", 40, "--resume"], timeout=300)
    assert proc.returncode == 0, describe_run(proc)
    after = journal(out)
    assert after[:len(before)] == before  # nothing lost or rewritten
    assert len(after) == 40
    assert len({r["id"] for r in after}) == 40 and len({r["key"] for r in after}) == 40  # nothing repeated
    assert "resuming" in proc.stderr


def test_self_start_and_random_strategy(shapes_file, tmp_path):
    out = tmp_path / "run"
    proc = galapagos("evolve", "--data", shapes_file, "--out", out, "--workers", 2, "--evaluations", 6,
                     "--strategy", "random", *SMALL, "--set", "run.task='tests.faulty_tasks:quick'", timeout=180)
    assert proc.returncode == 0, proc.stderr
    records = journal(out)
    assert len(records) == 6 and all(r["origin"] == "random" for r in records)
    assert {r["rank"] for r in records} <= {1, 2}


def test_children_bred_ahead_in_a_helper_process(shapes_file, tmp_path):
    out = tmp_path / "run"
    n = AHEAD + 40  # the first AHEAD children are bred before any result: random, as a whole machine's first round
    proc = galapagos("evolve", "--data", shapes_file, "--out", out, "--workers", 2, "--evaluations", n, *SMALL,
                     "--set", "evolution.breeder_workers=2", "--set", "run.task='tests.faulty_tasks:quick'",
                     timeout=180)
    assert proc.returncode == 0, proc.stderr
    log = (out / "log" / "master.log").read_text()
    assert "bred ahead in a helper process" in log and "helper failed" not in log
    records = journal(out)
    assert len(records) == n and len({r["key"] for r in records}) == n
    assert sorted(r["id"] for r in records) == list(range(n))
    bred = [r for r in records if r["origin"] in ("mutation", "crossover")]
    assert bred and all(r["parents"] and all(p < r["id"] for p in r["parents"]) for r in bred)
    assert all(r["params"] > 0 for r in records)


def test_one_rank_says_it_needs_a_worker(shapes_file, tmp_path):
    proc = run_mpi(1, ["-m", "galapagos.cli", "evolve", "--data", shapes_file, "--out", tmp_path / "r", "--evaluations",
                       2], timeout=60)
    assert proc.returncode == 2
    assert "at least one worker" in proc.stderr


def test_bad_inputs_fail_clearly_before_any_rank_starts(shapes_file, tmp_path):
    cases = [
        (["--set", "train.epochz=3"], "train.epochz"),
        (["--set", "space.channels=[0]"], "space.channels"),
        (["--set", "evolution.population_size=0"], "evolution.population_size"),
        (["--config", tmp_path / "missing.toml"], "missing.toml"),
        ([], "no budget"),
    ]
    for extra, words in cases:
        budget = [] if words == "no budget" else ["--evaluations", "2"]
        proc = galapagos("evolve", "--data", shapes_file, "--out", tmp_path / "r", *budget, *extra, timeout=60)
        assert proc.returncode == 2, (extra, proc.stderr)
        assert words in proc.stderr, (extra, proc.stderr)
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("[train\nepochs = 3")
    proc = galapagos("evolve", "--data", shapes_file, "--out", tmp_path / "r", "--evaluations", 2, "--config", bad_toml)
    assert proc.returncode == 2 and "not valid TOML" in proc.stderr
    proc = galapagos("evolve", "--data", tmp_path / "nope.h5", "--out", tmp_path / "r", "--evaluations", 2)
    assert proc.returncode == 2 and "nope.h5" in proc.stderr
    proc = galapagos("evolve", "--data", shapes_file, "--out", tmp_path / "r", "--evaluations", 2, "--resume")
    assert proc.returncode == 2 and "no run to resume" in proc.stderr
    assert not (tmp_path / "r").exists()


def test_existing_run_is_not_overwritten(shapes_file, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.jsonl").write_text('{"id": 0}\n')
    proc = galapagos("evolve", "--data", shapes_file, "--out", out, "--evaluations", 2)
    assert proc.returncode == 2 and "already holds a run" in proc.stderr
    assert (out / "results.jsonl").read_text() == '{"id": 0}\n'


def test_one_worker_and_a_fixed_seed_repeat_the_search(shapes_file, tmp_path):
    """The same seed and one worker: the same genomes in the same order, with the same fitness (CPU)."""
    runs = []
    for i in range(2):
        out = tmp_path / f"run{i}"
        proc = galapagos("evolve", "--data", shapes_file, "--out", out, "--evaluations", 10, "--workers", 1,
                         *SMALL, "--set", "run.seed=3", "--set", "evolution.seed=3", timeout=300)
        assert proc.returncode == 0, proc.stderr
        runs.append([json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()])
    assert [(r["id"], r["key"], r["parents"]) for r in runs[0]] == [(r["id"], r["key"], r["parents"]) for r in runs[1]]
    assert [r["fitness"] for r in runs[0]] == [r["fitness"] for r in runs[1]]
    assert any(r["parents"] for r in runs[0])  # bred children too, not only the random population
