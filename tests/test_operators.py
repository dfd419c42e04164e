"""Mutation, crossover and selection: always valid offspring, reproducible from the passed generator."""

from __future__ import annotations

import dataclasses
import importlib
import random
import warnings

import pytest
import torch

from galapagos.evolve import operators
from galapagos.evolve.build import build_model
from galapagos.evolve.check import check_genome
from galapagos.evolve.genome import Gene, Genome
from galapagos.evolve.operators import MUTATIONS, crossover, make_toolbox, mutate, select
from galapagos.evolve.problem import Problem
from galapagos.evolve.space import SearchSpace

SPACE = SearchSpace(channels=(4, 8, 16), units=(8, 16, 32), max_layers=8, max_params=500_000)
PROBLEMS = [
    Problem((6,), "classification", 3),
    Problem((2, 16), "regression", 2),
    Problem((3, 8, 8), "classification", 4),
    Problem((1, 8, 8, 8), "regression", 1),
]
IDS = ["tabular", "1d", "2d", "3d"]


def _population(problem: Problem, n: int, seed: int) -> list[Genome]:
    rng = random.Random(seed)
    return [check_genome(SPACE.random_genome(rng, problem), problem, SPACE) for _ in range(n)]


@pytest.mark.parametrize("problem", PROBLEMS, ids=IDS)
def test_mutation_always_gives_a_valid_different_genome(problem):
    parents = _population(problem, 10, seed=1)
    for seed in range(150):
        rng = random.Random(seed)
        parent = parents[seed % len(parents)]
        child = mutate(parent, SPACE, problem, rng, n=1 + seed % 3)
        assert isinstance(child, Genome)
        assert child.key != parent.key
        fixed = check_genome(child, problem, SPACE)  # repairable and buildable: never raises
        assert SPACE.min_layers <= fixed.num_layers <= SPACE.max_layers
        if problem.spatial_dims == 0:
            assert all(g.type in ("dense", "norm", "dropout") for g in child.layers)
        assert SPACE.lr[0] * 0.999 <= child.lr <= SPACE.lr[1] * 1.001


@pytest.mark.parametrize("problem", PROBLEMS, ids=IDS)
def test_crossover_always_gives_a_valid_genome_from_its_parents(problem):
    parents = _population(problem, 12, seed=2)
    for seed in range(150):
        rng = random.Random(seed)
        a, b = parents[seed % 12], parents[(seed * 7 + 1) % 12]
        child = crossover(a, b, rng)
        for name in ("optimizer", "lr", "batch_size", "weight_decay", "head"):
            assert getattr(child, name) in (getattr(a, name), getattr(b, name))
        parent_genes = set(a.layers) | set(b.layers)
        assert set(child.layers) <= parent_genes
        fixed = check_genome(child, problem, SPACE)
        if problem.spatial_dims > 0:  # spatial genes stay before the head
            assert all(g.type not in ("conv", "residual", "pool") for g in fixed.layers[fixed.dense_start:])


def test_offspring_build_real_models():
    problem = PROBLEMS[2]
    parents = _population(problem, 6, seed=3)
    rng = random.Random(0)
    for i in range(12):
        child = crossover(parents[i % 6], parents[(i + 1) % 6], rng) if i % 2 else parents[i % 6]
        child = check_genome(mutate(child, SPACE, problem, rng, n=2), problem, SPACE)
        out = build_model(child, problem)(torch.randn(2, *problem.sample_shape))
        assert out.shape == (2, problem.num_outputs) and torch.isfinite(out).all()


def test_crossover_is_one_point_per_section():
    conv = [Gene("conv", channels=c, kernel=3, stride=1, act="relu") for c in (1, 2, 3)]
    dense = [Gene("dense", units=u, act="relu") for u in (10, 20)]
    a = Genome(layers=tuple(conv[:2] + dense[:1]))
    b = Genome(layers=tuple(conv[2:] + dense[1:]))
    seen = set()
    for seed in range(200):
        child = crossover(a, b, random.Random(seed))
        spatial, dense_part = child.sections()
        # prefix of a's spatial genes + suffix of b's; likewise for dense genes
        assert any(spatial == a.layers[:i] + b.layers[j:1] for i in range(3) for j in range(2))
        assert any(dense_part == a.layers[2:2 + i] + b.layers[1 + j:] for i in range(2) for j in range(2))
        seen.add(child.key)
    assert len(seen) > 4


def test_every_mutation_kind_is_used_and_changes_something():
    problem = PROBLEMS[2]
    genome = _population(problem, 1, seed=5)[0]
    genome = genome.replace(layers=genome.layers + (Gene("dense", units=8, act="relu"),) * 2)
    for name, (op, weight) in MUTATIONS.items():
        assert weight > 0
        changed = 0
        space = dataclasses.replace(SPACE, shifts=(0.0, 0.125)) if name == "shift" else SPACE  # a choice to make
        for seed in range(20):
            child = op(genome, space, problem, random.Random(seed))
            if child is not None and child.key != genome.key:
                changed += 1
        assert changed > 0, name


def test_lr_mutation_is_log_scale_and_in_range():
    problem = PROBLEMS[0]
    g = Genome(layers=(Gene("dense", units=8, act="relu"),), lr=1e-3)
    rng = random.Random(0)
    ratios = []
    for _ in range(300):
        child = MUTATIONS["lr"][0](g, SPACE, problem, rng)
        assert SPACE.lr[0] <= child.lr <= SPACE.lr[1]
        ratios.append(child.lr / g.lr)
    assert min(ratios) < 0.8 and max(ratios) > 1.25  # steps both ways, multiplicative
    assert sum(0.95 < r < 1.05 for r in ratios) > 30  # and many small ones for fine tuning


def test_operators_are_reproducible_and_leave_global_random_alone():
    problem = PROBLEMS[2]
    a, b = _population(problem, 2, seed=6)
    random.seed(99)
    before = random.getstate()
    r1, r2 = random.Random(42), random.Random(42)
    c1 = [mutate(crossover(a, b, r1), SPACE, problem, r1, n=2) for _ in range(10)]
    c2 = [mutate(crossover(a, b, r2), SPACE, problem, r2, n=2) for _ in range(10)]
    assert [c.key for c in c1] == [c.key for c in c2]
    pop = [(i, float(i)) for i in range(10)]
    assert select(pop, 5, 3, random.Random(1)) == select(pop, 5, 3, random.Random(1))
    assert random.getstate() == before
    assert r1.getstate() == r2.getstate()  # the passed generator advanced, identically


def test_select_prefers_fitter_and_treats_none_as_worst():
    pop = [("a", 1.0), ("b", 5.0), ("c", None), ("d", float("nan")), ("e", -100.0)]
    rng = random.Random(0)
    winners = select(pop, 200, 3, rng)
    counts = {k: winners.count(k) for k in "abcde"}
    assert counts["b"] > counts["a"] > counts["c"]
    assert counts["b"] > 80
    # with a huge tournament the best nearly always wins; failures never beat a real result
    assert set(select(pop, 20, 50, rng)) == {"b"}
    assert select([("x", None), ("y", -1e300)], 1, 20, rng) == ["y"]
    with pytest.raises(ValueError):
        select([], 1, 2, rng)


def test_toolbox_and_deap_creator_guard():
    tb = make_toolbox(SPACE, PROBLEMS[0])
    rng = random.Random(0)
    a, b = _population(PROBLEMS[0], 2, seed=7)
    child = tb.mutate(tb.mate(a, b, rng), rng)
    assert isinstance(child, Genome)
    assert tb.select([(a, 1.0), (b, 2.0)], 1, 2, rng)[0] in (a, b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # re-creating DEAP creator classes would warn
        importlib.reload(operators)
    ind = operators.Individual([1, 2])
    ind.fitness.values = (1.0,)
    assert ind.fitness.weights == (1.0,)


def test_crossover_draws_as_deap_does():
    """crossover cuts each section as DEAP's cxMessyOnePoint does on the global generator set to the same state:
    the same children, and the generator left in the same state."""
    from deap import tools

    for problem in PROBLEMS:
        pop = _population(problem, 40, seed=3)
        for i in range(200):
            a, b, seed = pop[i % 40], pop[(7 * i + 1) % 40], 1000 + i
            ours, rng = crossover(a, b, random.Random(seed)), random.Random(seed)
            saved = random.getstate()
            random.setstate(rng.getstate())
            try:
                (sa, da), (sb, db) = a.sections(), b.sections()
                spatial, _ = tools.cxMessyOnePoint(list(sa), list(sb))
                dense, _ = tools.cxMessyOnePoint(list(da), list(db))
                rng.setstate(random.getstate())
            finally:
                random.setstate(saved)
            theirs = {name: getattr(a if rng.random() < 0.5 else b, name)
                      for name in ("optimizer", "lr", "batch_size", "weight_decay", "head")}
            assert ours == Genome(layers=tuple(spatial) + tuple(dense), **theirs)


def test_optimizer_mutation_retunes_the_learning_rate_between_sgd_and_adam():
    problem = PROBLEMS[0]
    space = SearchSpace(optimizers=("adam", "sgd"), lr=(1e-4, 3e-2))
    adam = Genome(layers=(Gene("dense", units=8, act="relu"),), optimizer="adam", lr=1e-3)
    sgd = MUTATIONS["optimizer"][0](adam, space, problem, random.Random(0))
    assert (sgd.optimizer, sgd.lr) == ("sgd", 1e-2)
    back = MUTATIONS["optimizer"][0](sgd, space, problem, random.Random(0))
    assert (back.optimizer, back.lr) == ("adam", 1e-3)
    high = MUTATIONS["optimizer"][0](adam.replace(lr=2e-2), space, problem, random.Random(0))
    assert high.lr == 3e-2  # clipped to the space
