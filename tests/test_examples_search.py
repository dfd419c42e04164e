"""The bundled signals and tabular generators, bench/search.py's permuted signals, its Optuna peers (bench/peers.py:
their trials draw genomes of Galapagos's search space that check_genome accepts, and TPE at its best starts from
evolution's prior networks) and its expert."""

from __future__ import annotations

import dataclasses
import json
import os
import time

import numpy as np
import pytest

from galapagos.config import load_config
from galapagos.datashare.format import load, validate
from galapagos.evolve.check import check_genome, count_params
from galapagos.evolve.errors import InvalidGenome
from galapagos.evolve.genome import GENE_FIELDS, Genome
from galapagos.evolve.netdir import NetworkDir
from galapagos.evolve.problem import Problem
from galapagos.evolve.space import SearchSpace
from galapagos.examples import signals, tabular


@pytest.mark.parametrize("module, shape, task, classes", [(signals, (1, 128), "classification", 10),
                                                          (tabular, (24,), "regression", None)])
def test_generators_write_valid_files_deterministic_by_seed(tmp_path, module, shape, task, classes):
    info = validate(module.generate(tmp_path / "a.h5", samples=200, seed=3).path)
    assert (info.task, info.num_classes, tuple(info.sample_shape)) == (task, classes, shape)
    assert info.splits == {"train": 140, "val": 30, "test": 30}
    _, a = load(tmp_path / "a.h5")
    _, again = load(module.generate(tmp_path / "b.h5", samples=200, seed=3).path)
    _, other = load(module.generate(tmp_path / "c.h5", samples=200, seed=4).path)
    for split in ("train", "val", "test"):
        assert all(np.array_equal(u, v) for u, v in zip(a[split], again[split]))
        assert not np.array_equal(a[split][0], other[split][0])
    if classes:
        assert set(np.unique(a["train"][1])) == set(range(classes))


def test_the_permuted_signals_are_the_signals_with_one_permutation_of_their_positions(tmp_path):
    from bench.search import signals_permuted

    signals_permuted(tmp_path / "permuted.h5")
    info, permuted = load(validate(tmp_path / "permuted.h5").path)
    _, plain = load(signals.generate(tmp_path / "plain.h5").path)
    x, xp = plain["train"][0][:, 0], permuted["train"][0][:, 0]
    perm = [int(np.flatnonzero((x == xp[:, [j]]).all(axis=0))[0]) for j in range(x.shape[1])]
    assert sorted(perm) == list(range(128)) and perm != list(range(128))
    for split in ("train", "val", "test"):
        assert np.array_equal(permuted[split][0], plain[split][0][..., perm])
        assert np.array_equal(permuted[split][1], plain[split][1])
    assert (info.task, info.num_classes) == ("classification", 10)


BENCH_PROBLEMS = [
    ("signals", Problem((1, 128), "classification", 10)),
    ("signals-clean", Problem((1, 128), "classification", 10)),
    ("signals-permuted", Problem((1, 128), "classification", 10)),
    ("shapes", Problem((1, 16, 16), "classification", 6)),
    ("shapes-noisy", Problem((1, 16, 16), "classification", 6)),
    ("cosmoflow", Problem((1, 12, 12, 12), "regression", 2)),
    ("tabular", Problem((24,), "regression", 1)),
    ("spectra", Problem((1, 256), "classification", 8)),
    ("fields", Problem((1, 32, 32), "classification", 6)),
    ("lightcurves", Problem((1, 256), "classification", 6)),
    ("tracks", Problem((1, 32, 32), "classification", 6)),
    ("seismograms", Problem((1, 256), "classification", 6)),
    ("galaxies", Problem((1, 32, 32), "classification", 6)),
    ("pulses", Problem((1, 128), "classification", 6)),
    ("pulses-permuted", Problem((1, 128), "classification", 6)),
    ("heartbeats", Problem((1, 128), "classification", 6)),
    ("heartbeats-permuted", Problem((1, 128), "classification", 6)),
]


def test_the_bench_problems_list_every_benchmark_dataset():
    from bench.search import DATASETS

    assert [name for name, _ in BENCH_PROBLEMS] == list(DATASETS)


def _space(name: str, default: bool | str) -> SearchSpace:
    """The dataset's space, the default one, or the default with a choice of shifts (the shift gene drawn)."""
    from bench.search import config_path

    if default == "shifts":
        return dataclasses.replace(SearchSpace(), shifts=(0.0, 0.125))
    return SearchSpace() if default else load_config(config_path(name)).space


@pytest.mark.parametrize("default", [False, True, "shifts"], ids=["its-space", "default-space", "shifts"])
@pytest.mark.parametrize("name, problem", BENCH_PROBLEMS)
def test_optuna_trials_draw_genomes_of_the_galapagos_space(name, problem, default):
    optuna = pytest.importorskip("optuna", reason="Optuna is a benchmark extra: pip install -e '.[bench]'")
    from bench.peers import genome_from_trial

    space = _space(name, default)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    accepted, shifts = 0, set()
    for _ in range(100):
        trial = study.ask()
        genome = genome_from_trial(trial, space, problem)
        shifts.add(genome.shift)
        assert space.min_layers <= genome.num_layers <= space.max_layers
        for gene in genome.layers:
            assert gene.type in space.layer_types
            for field in GENE_FIELDS[gene.type]:
                if field == "rate":
                    assert space.dropout[0] <= gene[field] <= space.dropout[1]
                else:
                    assert gene[field] in space.field_choices(problem, field)
        assert space.lr[0] <= genome.lr * 1.001 and genome.lr <= space.lr[1] * 1.001
        try:
            check_genome(genome, problem, space)
            accepted += 1
        except InvalidGenome:
            pass
        study.tell(trial, 0.0)
    assert accepted >= 90 and shifts == set(space.shift_choices(problem))


@pytest.mark.parametrize("name, problem", BENCH_PROBLEMS)
def test_every_benchmark_dataset_has_an_expert_network_that_builds_for_it(name, problem):
    from bench.search import DATASETS, expert_path

    genome = Genome.from_json(expert_path(name).read_text())
    assert count_params(genome, problem) > 10_000
    convolutional = any(g.type in ("conv", "residual") for g in genome.layers)
    # where an MLP is the expert's choice: the permuted sets (they run the permuted signals' expert) and tabular
    assert convolutional == (DATASETS[name][2] not in ("signals-permuted", "tabular"))


def test_the_expert_trains_its_network_then_a_longer_run_and_saves_the_best(tmp_path):
    from bench.search import CONFIGS, expert_path, run_expert

    data = signals.generate(tmp_path / "signals.h5", samples=300).path
    core = sorted(os.sched_getaffinity(0))[0]
    row = run_expert(data, CONFIGS / "signals.toml", expert_path("signals"), tmp_path / "expert", seed=0, workers=1,
                     cores=[core], deadline=time.time() + 25, sets=["train.epochs=1"])
    assert row["by_status"]["ok"] >= 1 and row["epochs"][0] == 1
    assert max(row["epochs"]) > 1  # the time left goes to a longer training
    runs = [json.loads(p.read_text()) for p in (tmp_path / "expert").glob("0-*.json")]
    assert row["val"] == max(r["fitness"] for r in runs if "fitness" in r) and 0.0 < row["val"] <= 1.0
    model, genome, _ = NetworkDir(row["model"]).load()
    assert genome == Genome.from_json(expert_path("signals").read_text())


@pytest.mark.parametrize("default", [False, True, "shifts"], ids=["its-space", "default-space", "shifts"])
@pytest.mark.parametrize("name, problem", BENCH_PROBLEMS)
def test_tpe_at_its_best_starts_from_the_prior_networks_evolution_starts_from(name, problem, default):
    """bench/peers.py's trial_params: the parameters of a trial that genome_from_trial turns into each prior network
    (evolve/priors.py), for study.enqueue_trial. Every prior a trial can draw comes back as itself; at least one per
    dataset does, so the warm start is never empty."""
    optuna = pytest.importorskip("optuna", reason="Optuna is a benchmark extra: pip install -e '.[bench]'")
    from bench.peers import genome_from_trial, trial_params
    from galapagos.evolve.priors import prior_genomes

    space = _space(name, default)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0, multivariate=True))
    priors = prior_genomes(space, problem)
    enqueued = [g for g in priors if (params := trial_params(g, space, problem)) is not None
                and study.enqueue_trial(params) is None]
    assert enqueued, f"no prior network of {name} is a trial of its space"
    for genome in enqueued:
        trial = study.ask()
        assert genome_from_trial(trial, space, problem) == genome
        study.tell(trial, 0.0)


def test_every_contestant_of_the_protocol_is_one_bench_search_runs():
    from bench.peers import OPTUNA
    from bench.search import CONTESTANTS

    assert {"evolution", "evolution-no-priors", "tpe-best", "expert"} <= set(CONTESTANTS)
    assert set(OPTUNA) <= set(CONTESTANTS)
