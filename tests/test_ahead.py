"""Children bred ahead in a helper process (evolve/ahead.py): a real helper, real pipes."""
from __future__ import annotations

import logging
import os
import signal

import pytest

from galapagos.evolve.ahead import AHEAD, Ahead
from galapagos.evolve.engine import Engine, EvolutionConfig
from galapagos.evolve.errors import SearchExhausted
from galapagos.evolve.space import SearchSpace
from tests.test_engine import IMAGE, SPACE, TABULAR, synthetic_fitness


def run(ahead: Ahead, n: int) -> list:
    out = []
    for _ in range(n):
        c = ahead.ask()
        ahead.tell(c.id, synthetic_fitness(c.genome))
        out.append(c)
    return out


def test_children_bred_ahead_are_adopted_and_hear_the_tells():
    engine = Engine(SPACE, IMAGE, EvolutionConfig(population_size=8, tournament_size=3, seed=2))
    ahead = Ahead(engine)
    try:
        cands = run(ahead, 200)
    finally:
        ahead.close()
    assert [c.id for c in cands] == list(range(200))
    assert len({c.genome.key for c in cands}) == 200
    assert all(c.params is not None and c.params > 0 for c in cands)  # counted by the helper
    assert engine.num_told == 200 and engine.pending == ()
    assert engine.seed([c.genome for c in cands]) == 0  # every child is seen: a warm start would skip them all
    assert engine.ask().id == 200  # ids go on after the adopted children
    assert all(p < c.id for c in cands for p in c.parents)
    assert [c.origin for c in cands[:2]] == ["prior", "prior"]  # the helper asks its engine's priors first
    bred = [c for c in cands if c.parents]
    assert len(bred) > 100 and {c.origin for c in bred} == {"mutation", "crossover"}
    # The helper heard the tells: the children come from a population that learned, as the engine's own do.
    late = [synthetic_fitness(c.genome) for c in cands[-50:] if c.parents]
    early = [synthetic_fitness(c.genome) for c in cands[:AHEAD] if c.origin == "random"]  # bred before any tell
    assert sum(late) / len(late) > sum(early) / len(early)
    assert ahead.population == engine.population  # everything but the asks is the local engine's


def test_a_failed_helper_leaves_rank_0_breeding_on_its_own(caplog):
    engine = Engine(SPACE, TABULAR, EvolutionConfig(population_size=4, tournament_size=2, seed=3))
    ahead = Ahead(engine)
    first = run(ahead, 10)
    os.kill(ahead.proc.pid, signal.SIGKILL)
    ahead.proc.wait()
    with caplog.at_level(logging.WARNING, logger="galapagos.evolve.ahead"):
        rest = run(ahead, AHEAD + 20)  # the children it had sent are used up, then rank 0 breeds
    ahead.close()
    assert "breeding helper failed" in caplog.text and "exited with code -9" in caplog.text
    cands = first + rest
    assert [c.id for c in cands] == list(range(len(cands)))
    assert len({c.genome.key for c in cands}) == len(cands)
    assert engine.num_told == len(cands) and engine.pending == ()


def test_an_exhausted_space_is_said_through_the_helper():
    tiny = SearchSpace(
        layer_types=("dense",), min_layers=1, max_layers=1, units=(8,), activations=("relu",), optimizers=("adam",),
        lr=(1e-3, 1e-3), batch_sizes=(32,), weight_decay=(0, 0), heads=("avg",),
    )
    ahead = Ahead(Engine(tiny, TABULAR, EvolutionConfig(population_size=2, tournament_size=1)))
    try:
        c = ahead.ask()
        ahead.tell(c.id, 0.5)
        with pytest.raises(SearchExhausted, match="exhausted"):
            ahead.ask()
    finally:
        ahead.close()
    assert ahead.proc.returncode == 0
