"""Cost-aware selection ([evolution] cost_aware): at a nearly equal fitness the cheaper network wins its tournament,
a clearly fitter one still wins, and the draws are those of the plain tournament."""
from __future__ import annotations

import random
import statistics

import pytest

from galapagos.evolve.check import count_params
from galapagos.evolve.engine import Engine, EvolutionConfig
from galapagos.evolve.errors import ConfigError
from galapagos.evolve.operators import select
from galapagos.evolve.problem import Problem
from galapagos.evolve.space import SearchSpace

COST = {"big": 1_000_000, "small": 1_000, "mystery": None}.get
SPACE = SearchSpace(channels=(4, 8, 16, 32), units=(8, 16, 32, 64), max_layers=8)
IMAGE = Problem((3, 8, 8), "classification", 4)


def test_a_tie_goes_to_the_cheaper_network():
    pop = [("big", 0.9), ("small", 0.9)]
    plain = select(pop, 200, 2, random.Random(0))
    aware = select(pop, 200, 2, random.Random(0), cost=COST)
    assert set(plain) == {"big", "small"}  # the plain tournament takes the first drawn of the fittest
    drawn_both = [p != a for p, a in zip(plain, aware)]
    assert any(drawn_both) and all(a == "small" for p, a in zip(plain, aware) if p == "big" and a != p)
    assert set(select(pop, 50, 30, random.Random(1), cost=COST)) == {"small"}  # both drawn: the cheaper wins


def test_nearly_equal_is_within_the_tolerance():
    pop = [("big", 0.9008), ("small", 0.9)]
    assert set(select(pop, 50, 30, random.Random(2), cost=COST, tolerance=0.001)) == {"small"}
    assert set(select(pop, 50, 30, random.Random(2), cost=COST, tolerance=0.0)) == {"big"}
    assert set(select(pop, 50, 30, random.Random(2), cost=COST, tolerance=0.0005)) == {"big"}


def test_a_clearly_fitter_big_network_still_wins():
    pop = [("big", 0.95), ("small", 0.90), ("small", 0.90)]
    assert set(select(pop, 50, 30, random.Random(3), cost=COST, tolerance=0.001)) == {"big"}


def test_of_equal_cost_the_fitter_wins_and_an_unknown_cost_is_the_dearest():
    assert set(select([("small", 0.9), ("small", 0.8999)], 20, 30, random.Random(4), cost=lambda _: 5,
                      tolerance=0.01)) == {"small"}
    winners = select([("a", 0.8999), ("b", 0.9)], 20, 30, random.Random(4), cost=lambda _: 5, tolerance=0.01)
    assert set(winners) == {"b"}  # within the tolerance, same cost: the fitter
    assert set(select([("mystery", 0.9), ("big", 0.9)], 20, 30, random.Random(5), cost=COST)) == {"big"}


def test_the_draws_are_the_plain_tournament_s():
    pop = [(f"n{i}", i / 10) for i in range(10)]
    a, b = random.Random(6), random.Random(6)
    select(pop, 7, 3, a)
    select(pop, 7, 3, b, cost=lambda _: 1.0, tolerance=0.05)
    assert a.random() == b.random()
    assert select(pop, 7, 3, random.Random(7)) == select(pop, 7, 3, random.Random(7), cost=lambda _: 1.0)


def test_the_config_keys():
    cfg = EvolutionConfig()
    assert cfg.cost_aware is False and cfg.cost_tolerance == 0.001  # off until the search benchmark says
    assert EvolutionConfig.from_dict({"cost_aware": True, "cost_tolerance": 0}).cost_tolerance == 0.0
    with pytest.raises(ConfigError, match=r"^evolution\.cost_tolerance:"):
        EvolutionConfig(cost_tolerance=float("nan"))
    with pytest.raises(ConfigError, match=r"^evolution\.cost_aware:"):
        EvolutionConfig.from_dict({"cost_aware": "yes"})


def _parents_params(cost_aware: bool, seed: int) -> float:
    """Every network scores the same: the median parameter count of the parents of the last 100 children."""
    engine = Engine(SPACE, IMAGE, EvolutionConfig(population_size=16, tournament_size=4, seed=seed,
                                                  immigrants=0.0, cost_aware=cost_aware, cost_tolerance=0.0))
    params, parents = {}, []
    for _ in range(250):
        c = engine.ask()
        params[c.id] = count_params(c.genome, IMAGE)
        parents += [params[p] for p in c.parents[:1]]
        engine.tell(c.id, 0.5)
    return statistics.median(parents[-100:])


def test_at_equal_fitness_the_engine_breeds_from_the_cheaper():
    aware = [_parents_params(True, s) for s in range(3)]
    plain = [_parents_params(False, s) for s in range(3)]
    assert all(a < p for a, p in zip(aware, plain)), (aware, plain)


def test_the_engine_still_follows_fitness_and_forgets_aged_costs():
    """Fitness that grows with the parameter count (well beyond the tolerance): cost-aware evolution climbs it as
    the plain one does."""
    def climb(cost_aware: bool, seed: int) -> tuple[Engine, list[int]]:
        engine = Engine(SPACE, IMAGE, EvolutionConfig(population_size=8, tournament_size=3, seed=seed,
                                                      immigrants=0.0, cost_aware=cost_aware))
        told = []
        for _ in range(200):
            c = engine.ask()
            told.append(count_params(c.genome, IMAGE))
            engine.tell(c.id, told[-1] / 1e6)
        return engine, told

    for seed in range(3):
        engine, aware = climb(True, seed)
        _, plain = climb(False, seed)
        assert statistics.median(aware[-50:]) > 20 * statistics.median(aware[:8])  # the random start's
        assert statistics.median(aware[-50:]) >= 0.9 * statistics.median(plain[-50:])
        assert set(engine._costs) == {c.id for c, _ in engine.population}  # the members' costs only


def test_several_objectives_ignore_it():
    cfg = EvolutionConfig(population_size=6, tournament_size=2, objectives=("fitness", "params"), cost_aware=True)
    engine = Engine(SPACE, IMAGE, cfg)
    for _ in range(20):
        c = engine.ask()
        engine.tell(c.id, 0.5, values=(0.5, float(count_params(c.genome, IMAGE))))
    assert engine._costs == {}
