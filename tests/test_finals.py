"""The end of a timed run: its best networks trained again, longer (galapagos/finals.py, [run] final_share)."""
from __future__ import annotations

import pytest

from evolve.engine import Engine, EvolutionConfig
from evolve.errors import ConfigError
from evolve.genome import Genome
from evolve.problem import Problem
from evolve.space import SearchSpace
from galapagos.config import Config
from galapagos.finals import MAX_FACTOR, Finals
from tests.mpirun import describe_run, run_mpi
from tests.test_evolve_run import SMALL, journal, shapes_file  # noqa: F401 - a fixture

GENOME = Genome.from_json({"layers": [{"type": "dense", "units": 16, "act": "relu"}], "optimizer": "adam",
                           "lr": 1e-3, "batch_size": 32, "weight_decay": 0.0, "head": "flatten"})


def record(i: int, fitness: float, seconds: float = 6.0, epochs: int = 6, **extra) -> dict:
    return {"id": i, "fitness": fitness, "genome": GENOME, "params": 100, "origin": "random", "parents": [],
            "metrics": {"train_seconds": seconds, "epochs": epochs}, **extra}


def test_the_final_share_starts_late_and_retrains_the_best_that_fits():
    # 100 s budget, deadline at t=100: the final share (20%) starts at t=80
    finals = Finals(0.2, 100.0, 100.0, epochs=6, workers=2)
    top = [(-0.9, 3), (-0.8, 1), (-0.7, 2)]
    for r in (record(1, 0.8, seconds=0.6), record(2, 0.7, seconds=3.0), record(3, 0.9, seconds=60.0)):
        finals.learn(r, {i for _, i in top})
    assert not finals.due(79.9) and finals.pick(top, 79.9) is None and finals.due(80.0)
    # id 3 (the best) needs 10 s per epoch: not even 2x its 6 epochs fit in 0.8 * 20 - 1 = 15 s; id 1 needs 0.1 s
    picked, epochs = finals.pick(top, 80.0)
    assert picked["id"] == 1 and epochs == MAX_FACTOR * 6  # capped: 150 epochs would fit
    finals.started([1], 10)
    picked, epochs = finals.pick(top, 90.0)  # id 2: 0.5 s per epoch, 0.8 * 10 - 1 = 7 s left
    assert picked["id"] == 2 and epochs == 14
    assert finals.pick(top, 92.0) is None  # 5.4 s left: fewer than 2 x 6 epochs fit
    finals.started([2], 11)
    assert finals.issued == 2 and finals.pick(top, 80.0) is None  # one per worker


def test_no_final_share_without_a_time_budget_or_a_trainer_that_reports_its_time():
    assert not Finals(0.2, 0.0, None, epochs=6, workers=2).due(1e12)
    assert not Finals(0.0, 100.0, 100.0, epochs=6, workers=2).due(99.0)
    finals = Finals(0.5, 100.0, 100.0, epochs=2, workers=4)
    custom = record(1, 0.9)
    custom["metrics"] = {"accuracy": 0.9}  # a task function of its own: no train_seconds
    finals.learn(custom, {1})
    assert finals.pick([(-0.9, 1)], 60.0) is None


def test_a_resumed_run_knows_which_networks_were_trained_again():
    finals = Finals(0.5, 100.0, 100.0, epochs=2, workers=4)
    finals.learn(record(1, 0.8), {1})
    finals.learn(record(5, 0.85, origin="final", parents=[1]), {1, 5})
    assert finals.issued == 1 and finals.pick([(-0.85, 5), (-0.8, 1)], 60.0) is None  # 5 is a final itself
    finals.learn(record(2, 0.1), {5})  # the best are now 5 alone: 1 and 2 are forgotten
    assert set(finals.records) == set()


def test_a_final_candidate_joins_no_population_and_its_id_follows_the_children():
    engine = Engine(SearchSpace(), Problem((5,), "classification", 2), EvolutionConfig(population_size=4, priors=False))
    first = engine.ask()
    engine.tell(first.id, 0.5)
    final = engine.final(first.genome, first.id)
    assert (final.id, final.parents, final.origin) == (1, (0,), "final") and final.id in engine.pending
    engine.tell(final.id, 0.9)
    assert [c.id for c, _ in engine.population] == [0] and engine.best[0] == 1
    again = Engine(SearchSpace(), Problem((5,), "classification", 2), EvolutionConfig(population_size=4, priors=False))
    again.replay([{"id": 0, "genome": first.genome.to_json(), "fitness": 0.5, "status": "ok"},
                  {"id": 1, "genome": first.genome.to_json(), "fitness": 0.9, "status": "ok", "origin": "final",
                   "parents": [0]}])
    assert [c.id for c, _ in again.population] == [0] and again.ask().id == 2


def test_final_share_is_checked():
    with pytest.raises(ConfigError, match=r"run\.final_share: expected a share in \[0, 0\.5\]"):
        Config.from_dict({"run": {"final_share": 0.9}})


@pytest.mark.mpi
def test_a_timed_run_ends_by_training_its_best_networks_longer(shapes_file, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    proc = run_mpi(3, ["-m", "galapagos.cli", "evolve", "--data", shapes_file, "--out", out, "--budget-minutes", 0.5,
                       *SMALL, "--set", "run.final_share=0.5"], timeout=300)
    assert proc.returncode == 0, describe_run(proc)
    records = journal(out)
    finals = [r for r in records if r["origin"] == "final"]
    assert 1 <= len(finals) <= 2, [(r["id"], r["origin"]) for r in records]  # at most one per worker
    by_id = {r["id"]: r for r in records}
    first_final = min(r["id"] for r in finals)
    assert all(r["origin"] != "final" for r in records if r["id"] < first_final)  # no child bred after them
    for r in finals:
        (parent,) = r["parents"]
        assert by_id[parent]["key"] == r["key"] and by_id[parent]["origin"] != "final"
        assert r["status"] == "ok" and r["metrics"]["epochs"] >= 2 * 2 and "inherits" not in r
        assert len(r["curve"]) == r["metrics"]["epochs"]  # never pruned
    assert len({r["parents"][0] for r in finals}) == len(finals)
