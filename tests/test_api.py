"""The Python API: a whole tour (evolve, ensemble, predict, load) from a plain process, the result objects, functions
and dicts where the command line takes strings, load giving probabilities, the public surface, the same call
under mpiexec on every rank, and bad input refused before anything is written."""
from __future__ import annotations

import dataclasses
import json
import pydoc
import subprocess
import sys
import tomllib

import pytest
import torch

import galapagos
from galapagos.examples import api_tour, custom_task, shapes
from tests.mpirun import REPO, describe_run, run_mpi

pytestmark = pytest.mark.mpi
TINY = ("train.epochs=1", "space.max_layers=3", "evolution.population_size=2", "evolution.tournament_size=2")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("api") / "shapes.h5"
    shapes.generate(path, samples=600)
    return path


@pytest.fixture(scope="module")
def run(data, tmp_path_factory):
    """A run whose config comes as dicts, with the user's network builder given as the function itself, and two
    objectives (a Pareto front of fitness and size)."""
    out = tmp_path_factory.mktemp("api-run") / "run"
    return galapagos.evolve(data, out, evaluations=3, workers=1,
                            config={"space": {"max_layers": 3},
                                    "evolution": {"population_size": 2, "objectives": ["fitness", "params"]}},
                            set={"train.epochs": 1, "evolution.tournament_size": 2, "train.builder": custom_task.build})


def test_api_tour_evolves_ensembles_predicts_and_loads(tmp_path):
    out = api_tour.tour(tmp_path, evaluations=6, members=2, workers=2)
    run, ens = out["run"], out["ensemble"]
    assert isinstance(run, galapagos.Run) and run.finished and len(run.trials) == 6
    assert run.best.path == tmp_path / "run" / "best" and (run.best.path / "model.pt").exists()
    assert out["report"]["evaluations"] == 6 and out["report"]["top"][0]["fitness"] == run.best.fitness
    assert isinstance(ens, galapagos.Ensemble) and ens.path == tmp_path / "ensemble" and ens.stopped_by is None
    assert sum(ens.weights.values()) == pytest.approx(1) and {m.name for m in ens.members} <= set(ens.weights)
    assert all(m.path.is_dir() and m.status == "ok" for m in ens.members)
    assert galapagos.load_run(ens.path) == ens and galapagos.load_run(run.path) == run and run.pareto == [run.best]
    final = run.final  # the kept networks as an ensemble (run.final_ensemble)
    assert isinstance(final, galapagos.Ensemble) and final.path == run.path / "final" and final.members
    assert galapagos.load_run(final.path) == final and {m.name for m in final.members} <= set(final.weights)
    assert 0 <= out["predict"]["accuracy"] <= 1 and out["predict"]["samples"] == 180
    # the loaded ensemble, run in plain torch, predicts what `predict` scored
    assert out["torch_accuracy"] == pytest.approx(out["predict"]["accuracy"], abs=1e-6)
    assert out["predict"]["accuracy"] == pytest.approx(ens.metrics["test"]["ensemble"]["accuracy"], abs=1e-9)
    with pytest.raises(galapagos.UsageError, match="has no logits"):
        galapagos.load(ens, logits=True)


def test_a_run_is_an_object_with_its_trials_best_and_table(run):
    assert isinstance(run, galapagos.Run) and run.finished and run.summary["evaluations"] == 3
    trials = run.trials
    assert len(trials) == 3 and all(t.status in ("ok", "pruned") for t in trials)
    best = run.best
    assert best.fitness == max(t.fitness for t in trials if t.fitness is not None) == run.summary["best"]["fitness"]
    assert best.path == run.path / "best" and run.trial(best.id) == best
    front = run.pareto
    saved = json.loads((run.path / "pareto.json").read_text())["members"]
    assert best in front and [t.id for t in front] == [m["id"] for m in saved] and run.summary["pareto_front"] > 0
    assert all(t.path is not None for t in front) and all(t.path is None for t in trials if t not in front)
    assert {"lr", "batch_size", "optimizer", "layers"} <= set(best.params) and best.genome["lr"] == best.params["lr"]
    assert best.metrics["val_accuracy"] == best.fitness and len(best.curve) == 1 and best.start <= best.end
    frame = run.results()
    assert list(frame["id"]) == [t.id for t in trials] and "metric_val_accuracy" in frame.columns
    assert {"params_lr", "params_batch_size"} <= set(frame.columns)
    assert galapagos.load_run(run.path) == run and repr(run) == f"Run({str(run.path)!r})"
    with pytest.raises(galapagos.UsageError, match="no evaluation 99"):
        run.trial(99)


def test_config_and_set_as_dicts_and_a_function_as_its_name(run):
    config = tomllib.loads((run.path / "config.toml").read_text())
    assert config["train"]["builder"] == "galapagos.examples.custom_task:build" == run.config["train"]["builder"]
    assert config["train"]["epochs"] == 1 and config["space"]["max_layers"] == 3
    assert config["evolution"]["population_size"] == 2 and config["evolution"]["tournament_size"] == 2


def test_load_gives_probabilities_like_predict_and_logits_on_request(run, data):
    import h5py

    with h5py.File(data, "r") as f:
        x = torch.from_numpy(f["test/x"][:50])
    model = galapagos.load(run)
    assert isinstance(model, torch.nn.Module) and not model.training
    with torch.no_grad():
        probs, logits = model(x), galapagos.load(run.path, logits=True)(x)
    assert probs.shape == (50, 6) and torch.allclose(probs.sum(1), torch.ones(50), atol=1e-5)
    assert torch.allclose(logits.softmax(1), probs, atol=1e-6) and not torch.allclose(logits, probs)
    with torch.no_grad():
        assert torch.allclose(run.best.load()(x), probs) and torch.allclose(run.load()(x), probs)
    scores = galapagos.predict(run, data, "test")
    with h5py.File(data, "r") as f:
        x, y = torch.from_numpy(f["test/x"][:]), torch.from_numpy(f["test/y"][:])
    with torch.no_grad():
        assert (model(x).argmax(1) == y).float().mean().item() == pytest.approx(scores["accuracy"], abs=1e-6)
    with pytest.raises(galapagos.UsageError, match="its network was not kept"):
        dataclasses.replace(run.best, path=None).load()


def test_design_gives_its_run_ensemble_and_comparison(data, tmp_path):
    design = galapagos.design(data, tmp_path / "d", evaluations=2, workers=1, members=1,
                              set=[*TINY, "ensemble.epochs=1"])
    assert isinstance(design, galapagos.Design) and design.finished and len(design.trials) == 2
    ens = design.ensemble
    assert isinstance(ens, galapagos.Ensemble) and ens.path == tmp_path / "d" / "ensemble"
    assert [m.name for m in ens.members] == list(ens.weights) and ens.members[0].path.is_dir()
    split = design.comparison["split"]
    assert design.comparison["ensemble_metrics"] == ens.metrics[split]["ensemble"]
    assert galapagos.load_run(design.path) == design and galapagos.load_run(ens.path) == ens


def test_the_html_report_of_a_run_object(run, tmp_path):
    out = run.report(tmp_path / "r.html")
    assert out == tmp_path / "r.html" and "<html" in out.read_text().lower()


def test_functions_no_other_process_can_import_are_refused_with_the_fix(data, tmp_path):
    def nested(task, ctx):
        return {"fitness": 0.0}

    for fn, words in ((lambda task, ctx: None, "<lambda> is not a top-level function"),
                      (nested, "<locals>.nested is not a top-level function of .* (a lambda, a function defined")):
        with pytest.raises(galapagos.UsageError, match="run.task: .*" + words.replace("(", r"\(")):
            galapagos.evolve(data, tmp_path / "run", evaluations=2, set={"run.task": fn})
    # a script's own function, or an interactive session's: __main__, which no rank can import
    code = ("import galapagos, sys\n"
            "def my_task(task, ctx):\n    return {'fitness': 1.0}\n"
            "try:\n"
            "    galapagos.evolve(sys.argv[1], sys.argv[2], evaluations=2, set={'run.task': my_task})\n"
            "except galapagos.UsageError as exc:\n    print(exc)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(data), str(tmp_path / "run")], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("run.task: my_task is defined in __main__ (the script being run, or an interactive "
                                  "session), which the ranks cannot import; define it at the top level of a module "
                                  "of its own"), proc.stdout
    assert not (tmp_path / "run").exists()


def test_the_public_surface_is_all_and_only_all():
    assert dir(galapagos) == sorted(galapagos.__all__)
    assert {"evolve", "design", "ensemble", "load", "load_run", "predict", "Run", "Trial", "Ensemble", "Design",
            "UsageError", "__version__"} <= set(galapagos.__all__)
    for name in galapagos.__all__:
        assert getattr(galapagos, name) is not None
    text = pydoc.render_doc(galapagos, renderer=pydoc.plaintext)
    assert "class Run(" in text and "load_run(path" in text and "run.best" in text.split("PACKAGE CONTENTS")[0]
    with pytest.raises(AttributeError):
        galapagos.html_reports  # noqa: B018 - a name outside the API


def test_bad_input_raises_before_anything_is_written(tmp_path, data):
    with pytest.raises(ValueError, match="no-such.h5"):
        galapagos.evolve(tmp_path / "no-such.h5", tmp_path / "run", evaluations=2)
    with pytest.raises(ValueError, match="train.epochs"):
        galapagos.evolve(data, tmp_path / "run", evaluations=2, set=("train.epochs=0",))
    with pytest.raises(ValueError, match="train.epochs"):
        galapagos.evolve(data, tmp_path / "run", evaluations=2, set={"train.epochs": 0})
    with pytest.raises(galapagos.UsageError, match="expected a key 'section.key'"):
        galapagos.evolve(data, tmp_path / "run", evaluations=2, set={"epochs": 4})
    with pytest.raises(galapagos.UsageError, match="expected a table of keys"):
        galapagos.evolve(data, tmp_path / "run", evaluations=2, config={"train": 4})
    with pytest.raises(galapagos.UsageError, match="keeps its own config.toml"):
        galapagos.evolve(data, tmp_path / "run", evaluations=2, config={"train": {"epochs": 2}}, resume=True)
    with pytest.raises(ValueError, match="no budget"):
        galapagos.evolve(data, tmp_path / "run")
    with pytest.raises(ValueError, match="not a run, design or ensemble directory"):
        galapagos.report(tmp_path)
    with pytest.raises(ValueError, match="not a run, design or ensemble directory"):
        galapagos.load_run(tmp_path)
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
