"""Your own training code (`run.task = "module:function"`): the bundled example evolves the hyperparameters of a
user-written model through the whole run (workers, progress reports and pruning, the journal, best/)."""
from __future__ import annotations

import json

import pytest

from tests.test_evolve_run import galapagos, shapes_file  # noqa: F401 - fixture

pytestmark = pytest.mark.mpi


def test_evolve_with_a_user_task(shapes_file, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    proc = galapagos("evolve", "--data", shapes_file, "--out", out, "--evaluations", 10, "--workers", 2,
                     "--set", "run.task=galapagos.examples.custom_task:train", "--set", "train.epochs=3",
                     "--set", "run.prune_after=1", "--set", "run.prune_min_results=2", timeout=300)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(records) == 10 and {r["status"] for r in records} <= {"ok", "pruned"}
    ok = [r for r in records if r["status"] == "ok"]
    assert ok and all(r["metrics"]["model"] == "ResidualMLP" and 1 <= r["metrics"]["depth"] <= 6 for r in ok)
    assert all(len(r["curve"]) == 3 for r in ok)  # one report per epoch reached the master
    best = json.loads((out / "best" / "metrics.json").read_text())
    assert best["fitness"] == max(r["fitness"] for r in ok) and not (out / "best" / "model.pt").exists()


def test_a_task_that_cannot_be_imported_is_one_line(shapes_file, tmp_path):  # noqa: F811
    proc = galapagos("evolve", "--data", shapes_file, "--out", tmp_path / "run", "--evaluations", 2, "--workers", 1,
                     "--set", "run.task=galapagos.examples.no_such_module:train", timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "run.task 'galapagos.examples.no_such_module:train': cannot be imported here" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_evolve_a_user_model_family_with_the_built_in_recipe(shapes_file, tmp_path):  # noqa: F811
    """train.builder: the user's modules trained by Galapagos; best/, an ensemble, predict and export use them."""
    out = tmp_path / "run"
    proc = galapagos("evolve", "--data", shapes_file, "--out", out, "--evaluations", 6, "--workers", 2,
                     "--set", "train.builder=galapagos.examples.custom_task:build", "--set", "train.epochs=2", timeout=300)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {r["status"] for r in records} <= {"ok", "pruned"}
    from galapagos.evolve.genome import Genome
    from galapagos.evolve.problem import Problem
    from galapagos.examples.custom_task import build

    best = json.loads((out / "best" / "metrics.json").read_text())
    assert best["builder"] == "galapagos.examples.custom_task:build"
    user = build(Genome.from_json(json.loads((out / "best" / "genome.json").read_text())),
                 Problem.from_dict(best["problem"]))
    assert best["params"] == sum(p.numel() for p in user.parameters())  # the user's network, not Galapagos's
    proc = galapagos("predict", "--model", out, "--data", shapes_file, "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["accuracy"] >= 0, proc.stderr
    proc = galapagos("ensemble", "--from", out, "--data", shapes_file, "--out", tmp_path / "ens", "--members", 2,
                     "--workers", 2, "--set", "ensemble.epochs=1", timeout=300)
    assert proc.returncode == 0, proc.stderr
    proc = galapagos("export", "--model", tmp_path / "ens", "--format", "torchscript", "--out", tmp_path / "e.pt")
    assert proc.returncode == 0, proc.stderr


def test_a_builder_that_cannot_be_imported_is_one_line(shapes_file, tmp_path):  # noqa: F811
    proc = galapagos("evolve", "--data", shapes_file, "--out", tmp_path / "run", "--evaluations", 2,
                     "--set", "train.builder=galapagos.examples.custom_task:no_such_function", timeout=120)
    assert proc.returncode == 2 and "train.builder 'galapagos.examples.custom_task:no_such_function'" in proc.stderr
    assert "Traceback" not in proc.stderr
