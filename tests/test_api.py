"""The Python API: a whole tour (evolve, ensemble, predict, load) from a plain process, the same call under
mpiexec on every rank, and bad input refused before anything is written."""
from __future__ import annotations

import pytest
import torch

import galapagos
from galapagos.examples import api_tour, shapes
from tests.mpirun import REPO, describe_run, run_mpi

pytestmark = pytest.mark.mpi
TINY = ("train.epochs=1", "space.max_layers=3", "evolution.population_size=2", "evolution.tournament_size=2")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("api") / "shapes.h5"
    shapes.generate(path, samples=600)
    return path


def test_api_tour_evolves_ensembles_predicts_and_loads(tmp_path):
    out = api_tour.tour(tmp_path, evaluations=6, members=2, workers=2)
    run, ens = out["run"], out["ensemble"]
    assert run["evaluations"] == 6 and run["finished"] and (tmp_path / "run" / "best" / "model.pt").exists()
    assert out["report"]["evaluations"] == 6 and out["report"]["top"][0]["fitness"] == run["best"]["fitness"]
    assert ens["ensemble_dir"] == str(tmp_path / "ensemble") and sum(ens["weights"].values()) == pytest.approx(1)
    assert 0 <= out["predict"]["accuracy"] <= 1 and out["predict"]["samples"] == 180
    # the loaded ensemble, run in plain torch, predicts what `predict` scored
    assert out["torch_accuracy"] == pytest.approx(out["predict"]["accuracy"], abs=1e-6)
    assert out["predict"]["accuracy"] == pytest.approx(ens["test"]["ensemble"]["accuracy"], abs=1e-9)


def test_load_gives_a_torch_module_for_a_run(tmp_path, data):
    galapagos.evolve(data, tmp_path / "run", evaluations=2, workers=1, set=TINY)
    model = galapagos.load(tmp_path / "run")
    assert isinstance(model, torch.nn.Module) and not model.training
    assert model(torch.zeros(5, 1, 16, 16)).shape == (5, 6)


def test_bad_input_raises_before_anything_is_written(tmp_path, data):
    with pytest.raises(ValueError, match="no-such.h5"):
        galapagos.evolve(tmp_path / "no-such.h5", tmp_path / "run", evaluations=2)
    with pytest.raises(ValueError, match="train.epochs"):
        galapagos.evolve(data, tmp_path / "run", evaluations=2, set=("train.epochs=0",))
    with pytest.raises(ValueError, match="no budget"):
        galapagos.evolve(data, tmp_path / "run")
    with pytest.raises(ValueError, match="not a run, design or ensemble directory"):
        galapagos.report(tmp_path)
    assert not (tmp_path / "run").exists()


def test_every_rank_calls_the_api_under_mpiexec(tmp_path, data):
    proc = run_mpi(3, [REPO / "tests" / "mpi_scripts" / "api_under_mpi.py", data, tmp_path / "run"], timeout=240)
    assert proc.returncode == 0, describe_run(proc)
    assert "result rank=0 4" in proc.stdout, describe_run(proc)
    assert "result rank=1 null" in proc.stdout and "result rank=2 null" in proc.stdout, describe_run(proc)
    assert len((tmp_path / "run" / "results.jsonl").read_text().splitlines()) == 4
    # no rank imports torch: the worker ranks relay tasks to their trainer children unread, and rank 0 checks and
    # counts genomes by shape arithmetic; only the trainer children import it
    assert "rank=0 imported torch: False" in proc.stdout, describe_run(proc)
    assert "rank=1 imported torch: False" in proc.stdout and "rank=2 imported torch: False" in proc.stdout, \
        describe_run(proc)


def test_import_and_check_data(tmp_path, capsys):
    import numpy as np

    from galapagos.cli import main

    rng = np.random.default_rng(0)
    arrays = {f"x_{s}": rng.normal(size=(n, 3, 8)).astype(np.float32) for s, n in (("train", 40), ("test", 10))}
    arrays |= {f"y_{s}": rng.integers(0, 4, n) for s, n in (("train", 40), ("test", 10))}
    np.savez(tmp_path / "d.npz", **arrays)
    info = galapagos.import_data(tmp_path / "d.npz", tmp_path / "d.h5", task="classification", num_classes=4)
    assert info.splits == {"train": 40, "test": 10} and tuple(info.sample_shape) == (3, 8)
    assert galapagos.check_data(tmp_path / "d.h5").splits == info.splits
    assert main(["data", "import", str(tmp_path / "d.npz"), str(tmp_path / "e.h5"), "--task", "classification",
                 "--num-classes", "4"]) == 0
    assert main(["data", "check", str(tmp_path / "e.h5")]) == 0
    assert f"{tmp_path / 'e.h5'}: OK" in capsys.readouterr().out
    np.savez(tmp_path / "bad.npz", x_train=arrays["x_train"])
    with pytest.raises(ValueError, match="bad.npz"):
        galapagos.import_data(tmp_path / "bad.npz", tmp_path / "bad.h5")
