"""Surrogate-assisted breeding (evolve/surrogate.py, `[evolution] surrogate`): the model predicts from the nearest
results, keeps the most recent, and an engine that breeds several children per ask hands out better ones than one
that breeds one, on the same seeds."""
from __future__ import annotations

import random
import statistics

import pytest

from galapagos.evolve import surrogate as surrogate_module
from galapagos.evolve.check import count_params
from galapagos.evolve.engine import Engine, EvolutionConfig
from galapagos.evolve.surrogate import K, Surrogate, features
from tests.test_engine import IMAGE, SPACE, synthetic_fitness


def genomes(n: int, seed: int = 0) -> list:
    engine = Engine(SPACE, IMAGE, EvolutionConfig(strategy="random", seed=seed))
    return [engine.ask().genome for _ in range(n)]


def test_the_model_predicts_from_the_nearest_results():
    model, pool = Surrogate(), genomes(200)
    assert not model.ready
    for g in pool[:150]:
        model.add(g, count_params(g, IMAGE), synthetic_fitness(g))
    assert model.ready
    for g in pool[:10]:  # a point it holds: its own value dominates
        assert model.predict(g, count_params(g, IMAGE)) == pytest.approx(synthetic_fitness(g), abs=0.05)
    unseen = pool[150:]
    predicted = [model.predict(g, count_params(g, IMAGE)) for g in unseen]
    truth = [synthetic_fitness(g) for g in unseen]
    assert statistics.correlation(predicted, truth) > 0.5  # it ranks networks it never saw
    assert features(pool[0], 10) == features(pool[0].to_json(), 10)


def test_the_model_keeps_the_most_recent_points(monkeypatch):
    monkeypatch.setattr(surrogate_module, "CAPACITY", K + 1)
    model, g = Surrogate(), genomes(1)[0]
    for value in range(20):
        model.add(g, 100, float(value))
    assert model.count == 20 and sorted(model.values) == [float(v) for v in range(20 - K - 1, 20)]
    assert model.predict(g, 100) == pytest.approx(statistics.mean(range(20 - K, 20)), abs=1.0)


def children_fitness(surrogate: int, seed: int) -> float:
    engine = Engine(SPACE, IMAGE, EvolutionConfig(seed=seed, population_size=16, tournament_size=2,
                                                  surrogate=surrogate, immigrants=0.0))
    bred = []
    rng = random.Random(seed)
    for _ in range(150):
        c = engine.ask()
        fitness = synthetic_fitness(c.genome) + rng.gauss(0, 0.1)
        engine.tell(c.id, fitness)
        if c.origin in ("mutation", "crossover"):
            bred.append(synthetic_fitness(c.genome))
    return statistics.mean(bred)


def test_breeding_several_children_and_asking_the_best_predicted_pays_on_a_smooth_landscape():
    with_model = [children_fitness(8, seed) for seed in range(4)]
    without = [children_fitness(0, seed) for seed in range(4)]
    assert all(a > b for a, b in zip(with_model, without)), (with_model, without)
