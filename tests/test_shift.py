"""The shift gene (augmentation by translation): its genome field, its choices in the space, its draws and
mutations only where the space offers a choice, and the batches a candidate trains on moved sample by sample."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch

from galapagos.evolve.batches import epoch_batches, shifted
from galapagos.evolve.check import check_genome
from galapagos.evolve.errors import ConfigError, InvalidGenome
from galapagos.evolve.genome import Gene, Genome
from galapagos.evolve.operators import crossover, mutate
from galapagos.evolve.problem import Problem
from galapagos.evolve.space import SearchSpace
from galapagos.evolve.train import TrainConfig, train_candidate

SPACE = SearchSpace(channels=(4, 8), units=(8, 16), max_layers=5, max_params=100_000)
SHIFTS = dataclasses.replace(SPACE, shifts=(0.0, 0.125, 0.25))
SEQUENCE, IMAGE = Problem((1, 32), "classification", 2), Problem((2, 8, 8), "regression", 1)
NOT_SHIFTABLE = [Problem((6,), "classification", 3), Problem((1, 8, 8), "segmentation", 3),
                 Problem((1, 8, 8), "field", 1)]


def test_a_genome_without_a_shift_keeps_its_json_and_key():
    plain = Genome(layers=(Gene("dense", units=8, act="relu"),))
    assert "shift" not in plain.to_json() and Genome.from_json(plain.to_json()) == plain
    moved = plain.replace(shift=0.125)
    assert moved.to_json()["shift"] == 0.125 and Genome.from_json(moved.to_json()) == moved
    assert moved.key != plain.key and moved.describe().endswith("shift=0.125")
    assert plain.replace(shift=0.12500001) == moved  # canonical to 3 decimals
    for bad in (-0.1, 0.75, "0.1", float("nan")):
        with pytest.raises(InvalidGenome, match="genome.shift"):
            plain.replace(shift=bad)


def test_the_space_checks_its_shifts():
    assert SearchSpace.from_dict({"shifts": [0.0, 0.25]}).shifts == (0.0, 0.25)
    for bad in ([], [0.6], [-0.1], ["a"]):
        with pytest.raises(ConfigError, match="space.shifts"):
            SearchSpace.from_dict({"shifts": bad})


def test_a_space_without_a_choice_draws_its_genomes_as_before():
    """One value: no draw, so a run's random stream and so its genomes are those of a space without the gene."""
    without, one = SPACE, dataclasses.replace(SPACE, shifts=(0.25,))
    a, b = random.Random(3), random.Random(3)
    for _ in range(30):
        g, h = without.random_genome(a, SEQUENCE), one.random_genome(b, SEQUENCE)
        assert g.shift == 0.0 and h == g.replace(shift=0.25)


def test_genomes_draw_and_mutate_their_shift_where_the_space_offers_a_choice():
    rng = random.Random(0)
    drawn = {SHIFTS.random_genome(rng, p).shift for p in (SEQUENCE, IMAGE) for _ in range(40)}
    assert drawn == set(SHIFTS.shifts)
    for problem in NOT_SHIFTABLE:  # nothing to translate, or a target that would move with the sample
        assert {SHIFTS.random_genome(rng, problem).shift for _ in range(20)} == {0.0}
    parent = check_genome(SHIFTS.random_genome(random.Random(1), SEQUENCE), SEQUENCE, SHIFTS)
    seen = {mutate(parent, SHIFTS, SEQUENCE, random.Random(s)).shift for s in range(200)}
    assert seen == set(SHIFTS.shifts)
    assert {mutate(parent.replace(shift=0.0), SPACE, SEQUENCE, random.Random(s)).shift for s in range(200)} == {0.0}


def test_crossover_takes_the_shift_of_a_parent_and_repair_drops_it_where_it_cannot_apply():
    a = check_genome(SPACE.random_genome(random.Random(2), SEQUENCE), SEQUENCE, SPACE)
    b = a.replace(shift=0.25)
    assert {crossover(a, b, random.Random(s)).shift for s in range(40)} == {0.0, 0.25}
    assert crossover(b, b.replace(lr=0.01), random.Random(0)).shift == 0.25
    tabular = Genome(layers=(Gene("dense", units=8, act="relu"),), shift=0.25)
    assert check_genome(tabular, NOT_SHIFTABLE[0], SPACE).shift == 0.0
    assert check_genome(b, SEQUENCE, SPACE).shift == 0.25


def test_shifted_moves_each_sample_as_a_whole_within_its_bound_edges_repeated():
    x = torch.arange(64 * 3 * 40, dtype=torch.float32).view(64, 3, 40)
    y = shifted(x, 0.25, torch.Generator().manual_seed(0))
    offsets = set()
    for sample, moved in zip(x, y):
        found = [d for d in range(-10, 11)
                 if torch.equal(moved, sample[:, (torch.arange(40) - d).clamp(0, 39)])]
        assert len(found) == 1  # one offset for all of a sample's channels, at most 10 = 0.25 * 40
        offsets.add(found[0])
    assert len(offsets) > 10 and min(offsets) < 0 < max(offsets)
    assert torch.equal(shifted(x, 0.01, torch.Generator()), x)  # less than one position: as it was
    image = torch.randn(8, 2, 12, 16)
    moved = shifted(image, 0.25, torch.Generator().manual_seed(1))
    assert moved.shape == image.shape and not torch.equal(moved, image)
    assert torch.equal(moved, shifted(image, 0.25, torch.Generator().manual_seed(1)))  # by the generator alone


def test_an_epochs_batches_are_shifted_only_with_a_shift():
    x, y = torch.randn(50, 1, 32), torch.arange(50)
    plain = list(epoch_batches(x, y, 50, 16, torch.Generator().manual_seed(0), torch.device("cpu")))
    moved = list(epoch_batches(x, y, 50, 16, torch.Generator().manual_seed(0), torch.device("cpu"), 0.25))
    assert torch.equal(plain[0][1], moved[0][1])  # the same rows in the same order
    assert torch.equal(plain[0][0], x[plain[0][1]]) and not torch.equal(moved[0][0], plain[0][0])


def _bumps(n: int, low: int, high: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A bump up (class 1) or down (class 0), its peak at a position in [low, high), in noise."""
    rng = np.random.default_rng(seed)
    y, t, at = rng.integers(0, 2, n), np.arange(32), rng.integers(low, high, n)[:, None]
    x = np.where(y[:, None] == 1, 1.0, -1.0) * np.exp(-0.5 * ((t - at) / 1.5) ** 2) + rng.normal(0, 0.1, (n, 32))
    return torch.from_numpy(x[:, None].astype(np.float32)), torch.from_numpy(y)


def test_a_shift_lets_a_network_find_a_pattern_where_training_never_showed_it():
    """Bumps at positions 8-11 in training, 18-23 in validation: a dense network on the raw trace has never seen
    the validation's positions; trained with samples moved by up to half the trace, it has."""
    data = {"train": _bumps(256, 8, 12, 0), "val": _bumps(128, 18, 24, 1)}
    net = Genome(layers=(Gene("dense", units=16, act="relu"),), lr=3e-3, batch_size=32, head="flatten")
    fitness = {shift: train_candidate(net.replace(shift=shift), SEQUENCE, data, TrainConfig(epochs=8),
                                      seed=0)[0]["fitness"] for shift in (0.0, 0.5)}
    assert fitness[0.5] > 0.95 and fitness[0.0] < fitness[0.5] - 0.15  # seeds 0-3 without: 0.18-0.77
