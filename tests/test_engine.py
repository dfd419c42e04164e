"""The asynchronous steady-state engine: ask/tell, ageing, dedup, replay for --resume, and that it optimises."""

from __future__ import annotations

import collections
import json
import math
import statistics
from types import SimpleNamespace

import pytest

from galapagos.evolve.engine import AUTO, Candidate, Engine, EvolutionConfig
from galapagos.evolve.errors import ConfigError, SearchExhausted
from galapagos.evolve.genome import Genome
from galapagos.evolve.priors import prior_genomes
from galapagos.evolve.problem import Problem
from galapagos.evolve.space import SearchSpace
from galapagos.store.journal import JournalRecord

SPACE = SearchSpace(channels=(4, 8, 16), units=(8, 16, 32), max_layers=8)
TABULAR = Problem((10,), "classification", 3)
IMAGE = Problem((3, 8, 8), "regression", 2)


def synthetic_fitness(genome: Genome) -> float:
    """Cheap stand-in for training: best at 6 layers and lr = 10**-2.5 (ten times that for SGD, as in training)."""
    return -abs(genome.num_layers - 6) - abs(math.log10(genome.lr) + 2.5 - (genome.optimizer == "sgd"))


def record(c: Candidate, fitness: float | None, status: str = "ok") -> JournalRecord:
    """A results.jsonl line as the launcher writes it, read back (through JSON, as on disk)."""
    return JournalRecord.from_dict(json.loads(json.dumps(
        {"id": c.id, "genome": c.genome.to_json(), "parents": list(c.parents), "fitness": fitness, "status": status}
    )))


def drive(engine: Engine, n: int, fitness=synthetic_fitness, fail_every: int = 0) -> list[JournalRecord]:
    """Ask and tell n times sequentially; every fail_every-th evaluation fails."""
    out = []
    for i in range(n):
        c = engine.ask()
        f = None if fail_every and i % fail_every == fail_every - 1 else fitness(c.genome)
        engine.tell(c.id, f, "ok" if f is not None else "failed")
        out.append(record(c, f, "ok" if f is not None else "failed"))
    return out


# --- config ---
def test_config_defaults_and_round_trip():
    cfg = EvolutionConfig()
    assert (cfg.strategy, cfg.population_size, cfg.tournament_size, cfg.crossover_prob, cfg.mutations, cfg.seed) == (
        "evolution", AUTO, AUTO, 0.3, (1, 2), 0,
    )
    assert EvolutionConfig.from_dict({"population_size": "auto", "tournament_size": "auto"}) == cfg
    assert (cfg.sized(1).population_size, cfg.sized(1).tournament_size) == (16, 4)  # small runs: as always
    assert EvolutionConfig.from_dict(cfg.to_dict()) == cfg
    assert EvolutionConfig.from_dict({}) == cfg
    assert EvolutionConfig.from_dict({"mutations": 3}).mutations == (3, 3)
    assert json.loads(json.dumps(cfg.to_dict())) == cfg.to_dict()
    with pytest.raises(ConfigError, match="^evolution: expected a table"):
        EvolutionConfig.from_dict([1])


@pytest.mark.parametrize(
    "table, key",
    [
        ({"strategy": "annealing"}, "strategy"),
        ({"population_size": 0}, "population_size"),
        ({"population_size": "big"}, "population_size"),
        ({"tournament_size": -2}, "tournament_size"),
        ({"cost_tolerance": -0.1}, "cost_tolerance"),
        ({"population_size": 2.5}, "population_size"),
        ({"tournament_size": 0}, "tournament_size"),
        ({"population_size": 8, "tournament_size": 9}, "tournament_size"),
        ({"crossover_prob": 1.5}, "crossover_prob"),
        ({"crossover_prob": "0.3"}, "crossover_prob"),
        ({"immigrants": 1.0}, "immigrants"),
        ({"breeder_workers": -1}, "breeder_workers"),
        ({"mutations": [2, 1]}, "mutations"),
        ({"mutations": 0}, "mutations"),
        ({"seed": "abc"}, "seed"),
        ({"popsize": 10}, "popsize"),
    ],
)
def test_config_errors_name_the_key(table, key):
    with pytest.raises(ConfigError, match=rf"^evolution\.{key}:"):
        EvolutionConfig.from_dict(table)


# --- ask / tell ---
def test_random_phase_then_bred_children_with_parents():
    engine = Engine(SPACE, IMAGE, EvolutionConfig(population_size=8, tournament_size=3, seed=1))
    first = [engine.ask() for _ in range(8)]
    assert [c.id for c in first] == list(range(8))
    priors = len(prior_genomes(SPACE, IMAGE))
    assert priors >= 2 and [c.origin for c in first] == ["prior"] * priors + ["random"] * (8 - priors)
    assert all(c.parents == () for c in first)
    assert engine.pending == tuple(range(8))
    for c in first:
        engine.tell(c.id, synthetic_fitness(c.genome))
    assert engine.num_told == 8 and engine.pending == ()
    told = {c.id for c in first}
    origins = collections.Counter()
    for _ in range(200):
        c = engine.ask()
        assert len(c.parents) == {"random": 0, "mutation": 1, "crossover": 2}[c.origin]  # no prior after the first 8
        assert set(c.parents) <= told  # parents are told results
        origins[c.origin] += 1
        engine.tell(c.id, synthetic_fitness(c.genome))
        told.add(c.id)
    assert set(origins) == {"random", "mutation", "crossover"}
    assert 0.15 < origins["random"] / 200 < 0.35  # immigrants: 0.25 of the asks after the initial population


def test_no_immigrants_breeds_every_child():
    engine = Engine(SPACE, IMAGE, EvolutionConfig(population_size=8, tournament_size=3, seed=1, immigrants=0.0))
    for _ in range(60):
        c = engine.ask()
        assert (c.origin in ("prior", "random")) == (c.id < 8)
        engine.tell(c.id, synthetic_fitness(c.genome))


def test_pending_asks_count_towards_the_random_phase():
    engine = Engine(SPACE, TABULAR, EvolutionConfig(population_size=4, tournament_size=2, immigrants=0.0))
    cands = [engine.ask() for _ in range(6)]  # more workers than the population: nothing told yet
    assert all(c.origin in ("prior", "random") for c in cands)
    engine.tell(cands[0].id, 1.0)
    assert engine.ask().origin in ("prior", "random")  # one result: no tournament of 2 to breed from yet
    engine.tell(cands[1].id, 0.5)
    assert engine.ask().origin in ("mutation", "crossover")  # 8 asked >= 4 and a tournament's worth of results


def test_no_duplicate_keys_and_failures_are_worst():
    engine = Engine(SPACE, IMAGE, EvolutionConfig(population_size=10, seed=3))
    records = drive(engine, 400, fail_every=5)
    keys = [r.genome for r in records]
    assert len({json.dumps(k, sort_keys=True) for k in keys}) == 400
    best_id, best_genome, best_fit = engine.best
    oks = [r for r in records if r.fitness is not None]
    assert best_fit == max(r.fitness for r in oks)
    assert best_genome == Genome.from_json(records[best_id].genome)
    # a failure (None) or NaN never becomes the best; tell accepts all of them
    c = engine.ask()
    engine.tell(c.id, float("nan"), "nan")
    c = engine.ask()
    engine.tell(c.id, None, "timeout")
    assert engine.best[2] == best_fit and engine.num_told == 402


def test_tell_errors():
    engine = Engine(SPACE, TABULAR)
    c = engine.ask()
    with pytest.raises(KeyError, match="never asked"):
        engine.tell(99, 1.0)
    engine.tell(c.id, 1.0)
    with pytest.raises(KeyError, match="already told"):
        engine.tell(c.id, 1.0)
    assert engine.best == (c.id, c.genome, 1.0)


def test_population_ages():
    engine = Engine(SPACE, TABULAR, EvolutionConfig(population_size=5, tournament_size=2))
    drive(engine, 12)
    assert [c.id for c, _ in engine.population] == list(range(7, 12))  # the 5 most recent told; oldest died


def test_only_finished_trainings_join_the_population():
    engine = Engine(SPACE, TABULAR, EvolutionConfig(population_size=3, tournament_size=2))
    cands = [engine.ask() for _ in range(5)]
    engine.tell(cands[0].id, 0.9)
    engine.tell(cands[1].id, 0.5, "pruned")  # a partial training: it does not age the finished ones out
    engine.tell(cands[2].id, None, "crashed")
    engine.tell(cands[3].id, float("nan"), "nan")
    engine.tell(cands[4].id, 0.4)
    assert [c.id for c, _ in engine.population] == [0, 4]
    assert engine.num_told == 5 and engine.best[0] == 0
    assert engine.seed([cands[1].genome]) == 0  # the pruned genome is seen all the same: never proposed again


def test_out_of_order_tells():
    engine = Engine(SPACE, TABULAR, EvolutionConfig(population_size=4, tournament_size=2))
    cands = [engine.ask() for _ in range(6)]
    for c in reversed(cands):
        engine.tell(c.id, synthetic_fitness(c.genome))
    assert [c.id for c, _ in engine.population] == [3, 2, 1, 0]  # told order, not id order


def test_deterministic_for_seed_and_tells():
    def run(seed):
        engine = Engine(SPACE, IMAGE, EvolutionConfig(population_size=8, seed=seed))
        return [(r.id, json.dumps(r.genome, sort_keys=True), r.parents) for r in drive(engine, 60)]

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_random_strategy():
    engine = Engine(SPACE, IMAGE, EvolutionConfig(strategy="random", population_size=4, seed=2))
    records = drive(engine, 80)
    assert all(r.parents == [] for r in records)
    assert len({json.dumps(r.genome, sort_keys=True) for r in records}) == 80


def test_exhausted_space_raises_clearly():
    tiny = SearchSpace(
        layer_types=("dense",), min_layers=1, max_layers=1, units=(8,), activations=("relu",), optimizers=("adam",),
        lr=(1e-3, 1e-3), batch_sizes=(32,), weight_decay=(0, 0), heads=("avg",),
    )
    engine = Engine(tiny, TABULAR, EvolutionConfig(population_size=2, tournament_size=1))
    c = engine.ask()
    engine.tell(c.id, 0.5)
    with pytest.raises(SearchExhausted, match="exhausted"):
        engine.ask()


# --- replay (--resume) ---
def test_replay_reproduces_state_and_continues():
    cfg = EvolutionConfig(population_size=8, tournament_size=3, seed=11)
    original = Engine(SPACE, IMAGE, cfg)
    records = drive(original, 50, fail_every=7)

    resumed = Engine(SPACE, IMAGE, cfg)
    assert resumed.replay(records) == 50
    assert resumed.num_told == original.num_told == 50
    assert resumed.pending == ()  # and its ids go on from 50 (below)
    assert [(c.id, c.genome.key, f) for c, f in resumed.population] == [
        (c.id, c.genome.key, f) for c, f in original.population
    ]
    assert resumed.best[0] == original.best[0] and resumed.best[2] == original.best[2]

    # the resumed engine proposes exactly what the uninterrupted one would have
    more_original = drive(original, 30)
    more_resumed = drive(resumed, 30)
    assert more_resumed == more_original
    seen = {json.dumps(r.genome, sort_keys=True) for r in records}
    assert all(json.dumps(r.genome, sort_keys=True) not in seen for r in more_resumed)
    assert [r.id for r in more_resumed] == list(range(50, 80))


def test_replay_skips_lost_pending_ids_and_never_reproposes_seen_keys():
    cfg = EvolutionConfig(population_size=6, tournament_size=2, seed=4)
    engine = Engine(SPACE, TABULAR, cfg)
    records = drive(engine, 20)
    lost = [engine.ask() for _ in range(3)]  # in flight when the job died: not in the journal
    finished = lost[1]
    engine.tell(finished.id, 0.0)
    records.append(record(finished, 0.0))

    resumed = Engine(SPACE, TABULAR, cfg)
    resumed.replay(records)
    seen = {json.dumps(r.genome, sort_keys=True) for r in records}
    for i in range(60):
        c = resumed.ask()
        assert c.id == finished.id + 1 + i  # ids go on after the largest told
        assert json.dumps(c.genome.to_json(), sort_keys=True) not in seen
        resumed.tell(c.id, synthetic_fitness(c.genome))


def test_replay_of_short_journal_stays_in_random_phase_and_ignores_duplicates():
    cfg = EvolutionConfig(population_size=10, seed=0)
    first = Engine(SPACE, TABULAR, cfg)
    records = drive(first, 4)
    resumed = Engine(SPACE, TABULAR, cfg)
    assert resumed.replay(records + records[:2]) == 4
    assert all(resumed.ask().origin == "random" for _ in range(6))  # 4 told + 6 asked = population_size
    assert resumed.ask().origin in ("mutation", "crossover")
    with pytest.raises(ValueError, match="record 0"):
        Engine(SPACE, TABULAR, cfg).replay([SimpleNamespace(genome=records[0].genome)])


# --- it optimises ---
@pytest.mark.parametrize("problem, seeds", [(TABULAR, range(8)), (IMAGE, range(5))], ids=["tabular", "2d"])
def test_evolution_beats_random_search(problem, seeds):
    """Same budget of 300 evaluations: regularized evolution finds a better best than random search. Without
    immigrants: the synthetic fitness has no inherited weights, whose lineages they keep the population from
    closing on."""
    space = SearchSpace(max_layers=10)

    def best(strategy, seed):
        engine = Engine(space, problem, EvolutionConfig(strategy=strategy, seed=seed, immigrants=0.0))
        drive(engine, 300)
        return engine.best[2]

    evo = [best("evolution", s) for s in seeds]
    rnd = [best("random", s) for s in seeds]
    wins = sum(e > r for e, r in zip(evo, rnd))
    assert wins >= 0.75 * len(seeds), (evo, rnd)
    assert statistics.median(evo) > statistics.median(rnd)
