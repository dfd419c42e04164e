"""The practitioner's first networks (evolve/priors.py): built from the space, valid, asked first by evolution."""
from __future__ import annotations

import pytest

from galapagos.evolve.check import check_genome, count_params
from galapagos.evolve.engine import Engine, EvolutionConfig
from galapagos.evolve.genome import SPATIAL_TYPES
from galapagos.evolve.priors import prior_genomes
from galapagos.evolve.problem import Problem
from galapagos.evolve.space import SearchSpace
from galapagos.store.journal import JournalRecord
from tests.test_engine import synthetic_fitness

PROBLEMS = {
    "1d": Problem((1, 128), "classification", 10),
    "2d": Problem((3, 32, 32), "classification", 10),
    "2d-small": Problem((1, 5, 5), "classification", 3),
    "3d": Problem((1, 12, 12, 12), "regression", 2),
    "tabular": Problem((24,), "regression", 2),
    "segmentation": Problem((1, 32, 32), "segmentation", 4),
}
NARROW = SearchSpace(channels=(4, 12), kernels=(5, 7), units=(24, 48), activations=("gelu", "tanh"),
                     optimizers=("adam", "sgd"), lr=(1e-4, 2e-3), batch_sizes=(16, 128), weight_decay=(0.0, 0.0),
                     max_layers=5, heads=("max", "flatten"))


@pytest.mark.parametrize("space", [SearchSpace(), NARROW], ids=["default", "narrow"])
@pytest.mark.parametrize("name", list(PROBLEMS))
def test_priors_build_and_keep_to_the_space(name, space):
    problem = PROBLEMS[name]
    priors = prior_genomes(space, problem)
    full_res = problem.is_classification and problem.spatial_dims > 0 and "max" in space.heads
    assert len(priors) == (2 if problem.spatial_dims == 0 else 3 + (not problem.is_dense) + full_res)
    assert len({g.key for g in priors}) == len(priors)
    for genome in priors:
        checked = check_genome(genome, problem, space)
        assert 0 < count_params(checked, problem) <= space.max_params
        assert len(genome.layers) <= space.max_layers
        assert genome.optimizer in space.optimizers and genome.batch_size in space.batch_sizes
        assert space.lr[0] <= genome.lr <= space.lr[1] and genome.head in space.heads
        assert genome.weight_decay == 0.0 if space.weight_decay == (0.0, 0.0) else genome.weight_decay > 0
        for gene in genome.layers:
            assert gene.type in space.layer_types
            assert gene.get("channels", space.channels[0]) in space.channels
            assert gene.get("kernel") in (None, *space.kernel_choices(problem))
            assert gene.get("units", space.units[0]) in space.units
            assert gene.get("act", space.activations[0]) in space.activations
        if problem.spatial_dims == 0:
            assert not any(g.type in SPATIAL_TYPES for g in genome.layers)
    if problem.spatial_dims:
        expected = ["residual"] * (1 + full_res) + ["conv", "residual"]
        assert [g.layers[0].type for g in priors[:3 + full_res]] == expected
        if not problem.is_dense:  # the last: an MLP on the flattened input
            assert priors[-1].head == "flatten" and {g.type for g in priors[-1].layers} <= {"dense", "norm"}
        assert priors[0].optimizer == ("adamw" if "adamw" in space.optimizers else "adam")


def test_priors_widen_the_view_along_sequences_and_pool_as_the_channels_grow():
    space = SearchSpace(kernels=(3, 5, 9, 15), channels=(8, 16, 32), max_layers=8)
    seq, image = (prior_genomes(space, PROBLEMS[n])[0] for n in ("1d", "2d"))
    assert {g["kernel"] for g in seq.layers if g.type == "residual"} == {9}
    assert {g["kernel"] for g in image.layers if g.type == "residual"} == {3}
    channels = [g["channels"] for g in image.layers if g.type == "residual"]
    assert channels == sorted(channels) and channels[0] == 8 and channels[-1] == 32
    assert sum(g.type == "pool" for g in image.layers) == 4 and len(image.layers) == 8  # 32 -> 2 in 8 layers


def test_a_small_input_classifier_also_gets_a_network_that_never_pools_under_a_max_head():
    space = SearchSpace(channels=(8, 16, 32), max_layers=6)
    for problem in (Problem((1, 16, 16), "classification", 6), PROBLEMS["1d"]):
        full = prior_genomes(space, problem)[1]
        assert full.head == "max" and [g.type for g in full.layers] == ["residual", "residual"]
        assert [g["channels"] for g in full.layers] == [16, 32]  # one channel step up, then the next
    big = Problem((3, 128, 128), "classification", 10)
    for problem in (PROBLEMS["3d"], Problem((1, 16, 16), "regression", 1), big):
        assert all(any(g.type == "pool" for g in genome.layers) for genome in prior_genomes(space, problem)
                   if genome.head != "flatten")  # regression, or a large input: every conv prior pools
    assert "max" not in {g.head for g in prior_genomes(SearchSpace(heads=("avg", "flatten")), PROBLEMS["2d"])}


def test_priors_only_of_the_layers_the_space_has():
    assert [g.head for g in prior_genomes(SearchSpace(layer_types=("norm", "dense")), PROBLEMS["2d"])] == ["flatten"]
    assert prior_genomes(SearchSpace(layer_types=("norm", "dense"), heads=("avg",)), PROBLEMS["2d"]) == []
    assert prior_genomes(SearchSpace(layer_types=("norm", "dropout", "conv")), PROBLEMS["tabular"]) == []
    assert [g.layers[0].type for g in prior_genomes(SearchSpace(layer_types=("conv", "pool", "norm")),
                                                    PROBLEMS["2d"])] == ["conv"]
    big = Problem((3, 128, 128), "classification", 10)  # 49,152 features flattened: no MLP on them
    assert [g.head for g in prior_genomes(SearchSpace(), big)] == ["avg"] * 3


def test_evolution_asks_them_first_then_random_and_random_search_never():
    problem = PROBLEMS["2d"]
    n = len(prior_genomes(SearchSpace(), problem))
    engine = Engine(SearchSpace(), problem, EvolutionConfig(population_size=6, tournament_size=2))
    first = [engine.ask() for _ in range(6)]
    assert [c.origin for c in first] == ["prior"] * n + ["random"] * (6 - n)
    for strategy, priors in (("random", True), ("evolution", False)):
        other = Engine(SearchSpace(), problem, EvolutionConfig(strategy=strategy, priors=priors))
        assert {other.ask().origin for _ in range(6)} == {"random"}


def test_priors_fill_only_the_initial_population_after_seeds_and_are_not_repeated_on_resume():
    problem, space = PROBLEMS["1d"], SearchSpace()
    config = EvolutionConfig(population_size=3, tournament_size=2, immigrants=0.0)
    engine = Engine(space, problem, config)
    engine.seed([prior_genomes(space, PROBLEMS["1d"])[2].replace(lr=0.02)])
    asked = [engine.ask() for _ in range(3)]
    assert [c.origin for c in asked] == ["seed", "prior", "prior"]  # the population is full before the third prior
    records = []
    for c in asked:
        engine.tell(c.id, synthetic_fitness(c.genome))
        records.append(JournalRecord(c.id, c.genome.to_json(), "ok", synthetic_fitness(c.genome),
                                     parents=list(c.parents), origin=c.origin))
    assert engine.ask().origin in ("mutation", "crossover")
    resumed = Engine(space, problem, config)
    resumed.replay(records[:2])  # the run stopped after the first prior: the second is asked, not the first again
    again = resumed.ask()
    assert again.origin == "prior" and again.genome.key == asked[2].genome.key
