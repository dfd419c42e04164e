"""The search-quality simulation (bench/landscape.py, bench/search_scale.py): a landscape fitted to journals gives
nearby genomes nearby values and reads inheritance and promotions from them; the real master searches it with
simulated workers, promotions and the final pick included, and the run's best network is scored by its true value."""
from __future__ import annotations

import json
import math
import statistics

import pytest

from bench.landscape import K, Landscape, features, fit
from bench.search_scale import PROBLEM, run_one
from galapagos.evolve.check import count_params
from galapagos.evolve.engine import Engine, EvolutionConfig
from galapagos.evolve.space import SearchSpace


def synthetic_run(tmp_path, n: int = 60) -> tuple:
    """A journal of `n` fresh networks scored by a smooth function of their learning rate, a child that inherited,
    and a promotion."""
    engine = Engine(SearchSpace(), PROBLEM, EvolutionConfig(strategy="random", seed=2))
    lines, truth = [], {}
    for i in range(n):
        g = engine.ask().genome
        params = count_params(g, PROBLEM)
        score = 0.9 - 0.1 * abs(math.log10(g.lr) + 2.5)
        truth[i] = (json.loads(g.canonical()), params, score)
        lines.append({"id": i, "genome": json.loads(g.canonical()), "params": params, "status": "ok",
                      "fitness": score, "metrics": {"train_seconds": 2.0 + params / 1e5}, "origin": "random"})
    lines.append({**lines[0], "id": n, "inherits": 0, "fitness": lines[0]["fitness"] + 0.03, "origin": "mutation"})
    lines.append({**lines[1], "id": n + 1, "origin": "promoted", "parents": [1], "rung": 1,
                  "fitness": 1 - (1 - lines[1]["fitness"]) * 0.5})
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run, truth


def test_a_landscape_interpolates_the_journal_and_reads_its_bonuses(tmp_path):
    run, truth = synthetic_run(tmp_path)
    data = fit("synthetic", [run], val_rows=600)
    assert len(data["scores"]) == 60 and data["promoted_pairs"] == 1 and data["inherited"] == 1
    assert data["rung_shrink"] == pytest.approx(0.5)
    land = Landscape(data)
    fresh = statistics.median(score - land.value(g, p)[0] for g, p, score in truth.values())
    assert data["inherit_bonus"] == pytest.approx(0.03 + truth[0][2] - land.value(*truth[0][:2])[0] - fresh)
    for genome, params, score in list(truth.values())[:10]:  # a point's own value dominates its neighbours'
        value, seconds = land.value(genome, params)
        assert value == pytest.approx(score, abs=0.02) and seconds == pytest.approx(2.0 + params / 1e5, rel=0.05)
    assert len(features(*truth[0][:2])) == len(data["features"][0])
    with pytest.raises(SystemExit, match="too few"):
        fit("few", [_first(run, K, tmp_path)], val_rows=600)


def _first(run, n: int, tmp_path):
    few = tmp_path / "few"
    few.mkdir()
    (few / "results.jsonl").write_text("".join((run / "results.jsonl").read_text().splitlines(True)[:n]))
    return few


@pytest.mark.parametrize("contestant", ["evolution-rungs", "evolution-holdout", "random"])
def test_the_master_searches_the_landscape(tmp_path, contestant):
    run, _ = synthetic_run(tmp_path)
    landscape = tmp_path / "land.json"
    landscape.write_text(json.dumps(fit("synthetic", [run], val_rows=600)))
    result = run_one(40, contestant, minutes=3, time_scale=10, seed=0, landscape=landscape)
    assert result["tasks"] > 100 and result["utilization"] > 0.9
    scores = [result[f"best_true_{s}"] for s in ("0.25", "0.5", "1")]
    assert all(0.5 < s <= 1 for s in scores) and scores[-1] <= result["evaluated_true_max"]
    assert (result["promoted"] > 0) == (contestant == "evolution-rungs")
