"""The final pick (`[train] holdout`, galapagos/flows/final_pick.py): trainings score on the validation rows not held
back, rank 0 re-scores the best networks (of any rung) on the held-back rows at the end of the job, and the
best there becomes best/ and the summary's best. Real MPI ranks, training and files."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import galapagos
from galapagos.config import Config, load_config
from galapagos.datashare.carve import holdout_indices
from galapagos.datashare.format import load
from galapagos.evolve.errors import ConfigError
from galapagos.examples import shapes
from galapagos.store.rundir import RunDir
from tests.mpirun import describe_run, run_mpi
from tests.test_evolve_run import SMALL, journal


def test_held_back_rows_are_fixed_disjoint_and_cover_the_split():
    search, held = holdout_indices(90, 0.5)
    assert len(held) == 45 and len(search) == 45 and not set(search) & set(held)
    assert sorted([*search, *held]) == list(range(90)) and list(held) == sorted(held)
    again = holdout_indices(90, 0.5)
    assert all(np.array_equal(a, b) for a, b in zip(again, (search, held)))
    assert len(holdout_indices(3, 0.01)[1]) == 1 and len(holdout_indices(3, 0.99)[0]) == 1  # one of each, at least
    for n, share in ((1, 0.5), (10, 0.0), (10, 1.0)):
        with pytest.raises(ValueError, match="hold back"):
            holdout_indices(n, share)


def test_holdout_is_checked():
    assert Config.from_dict({"train": {"holdout": 0.3}}).train.holdout == 0.3
    for bad in (1.0, -0.1):
        with pytest.raises(ConfigError, match="train.holdout"):
            Config.from_dict({"train": {"holdout": bad}})


def accuracy(model, x, y) -> float:
    import torch

    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean())


@pytest.mark.mpi
def test_the_run_picks_its_best_on_the_rows_no_training_saw(tmp_path):
    data, out = tmp_path / "shapes.h5", tmp_path / "run"
    shapes.generate(data, samples=400, size=12, seed=1)
    proc = run_mpi(3, ["-m", "galapagos.cli", "evolve", "--data", data, "--out", out, "--evaluations", 14, *SMALL,
                       "--set", "train.holdout=0.5", "--set", "evolution.rungs=2"], timeout=300)
    assert proc.returncode == 0, describe_run(proc)
    summary = json.loads((out / "summary.json").read_text())
    pick = summary["final_pick"]
    scored = pick["scored"]
    by_id = {r["id"]: r for r in journal(out)}
    keys = {by_id[s["id"]]["key"] for s in scored}
    others = [r["fitness"] for r in by_id.values() if r["status"] == "ok" and r["key"] not in keys
              and os.path.exists(RunDir(out).model_path(r["id"]))]  # whose weights the run kept
    keep = load_config(out / "config.toml").run.keep_models  # the best run.keep_models networks are re-scored
    assert 1 <= len(scored) <= keep and min(s["fitness"] for s in scored) >= max(others, default=0)  # of any rung
    assert [s["fitness"] for s in scored] == sorted((s["fitness"] for s in scored), reverse=True)
    assert len({by_id[s["id"]]["key"] for s in scored}) == len(scored)  # one per network
    assert pick["id"] == max(scored, key=lambda s: s["holdout_score"])["id"]  # the first such: the better by val
    assert summary["best"]["id"] == pick["id"]
    best = json.loads((out / "best" / "metrics.json").read_text())
    assert best["id"] == pick["id"] and best["final_pick"]["holdout_score"] == pick["holdout_score"]

    _, arrays = load(data, ("val",))
    x, y = arrays["val"]
    search, held = holdout_indices(len(y), 0.5)
    assert pick["holdout_rows"] == len(held)
    model = galapagos.load(out / "best", logits=True)
    # rank 0's score is the network's on the held-back rows; its fitness (trainers) on the others only
    assert accuracy(model, x[held], y[held]) == pytest.approx(pick["holdout_score"], abs=1e-6)
    assert accuracy(model, x[search], y[search]) == pytest.approx(by_id[pick["id"]]["fitness"], abs=1e-6)
    assert any("final pick: evaluation" in f.read_text() for f in (out / "log").iterdir() if f.is_file())
