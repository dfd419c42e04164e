"""bench/heldout.py's held-out sets (issue 40): valid files, deterministic by seed, classes that differ in their data
by a cheap statistic (no network is trained on them: that would be a tuning decision), and bench/search.py runs them
with their own configs and experts."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from galapagos.config import load_config
from galapagos.datashare.format import load, validate
from galapagos.evolve.build import build_model
from galapagos.evolve.check import count_params
from galapagos.evolve.genome import Genome
from galapagos.evolve.problem import Problem

from bench import heldout

CASES = [(heldout.spectra, (1, 256), 8), (heldout.fields, (1, 32, 32), 6)]


def _arrays(generate, path, **kwargs) -> dict:
    _, arrays = load(validate(generate(path, **kwargs).path).path)
    return arrays


@pytest.mark.parametrize("generate, shape, classes", CASES, ids=["spectra", "fields"])
def test_generators_write_valid_files_deterministic_by_seed(tmp_path, generate, shape, classes):
    info = validate(generate(tmp_path / "a.h5", samples=200, seed=3).path)
    assert (info.task, info.num_classes, tuple(info.sample_shape)) == ("classification", classes, shape)
    assert info.splits == {"train": 120, "val": 40, "test": 40}
    a = _arrays(generate, tmp_path / "b.h5", samples=200, seed=3)
    again = _arrays(generate, tmp_path / "c.h5", samples=200, seed=3)
    other = _arrays(generate, tmp_path / "d.h5", samples=200, seed=4)
    for split in ("train", "val", "test"):
        assert all(np.array_equal(u, v) for u, v in zip(a[split], again[split]))
        assert not np.array_equal(a[split][0], other[split][0])
        assert np.isfinite(a[split][0]).all() and a[split][0].dtype == np.float32
    assert set(np.unique(a["train"][1])) == set(range(classes))
    digest = [hashlib.sha256(np.ascontiguousarray(x[split][0]).tobytes()).hexdigest() for x in (a, again)
              for split in ("train", "test")]
    assert digest[:2] == digest[2:]


def _chi2(x: np.ndarray, y: np.ndarray, c: int, d: int) -> float:
    """How far apart classes c and d's mean spectra are: squared z-scores of the difference, summed over points."""
    a, b = x[y == c], x[y == d]
    return float(((a.mean(axis=0) - b.mean(axis=0)) ** 2 / (a.var(axis=0) / len(a) + b.var(axis=0) / len(b))).sum())


def test_spectra_classes_differ_by_their_lines(tmp_path):
    x, y = _arrays(heldout.spectra, tmp_path / "s.h5", samples=6400)["train"]
    names = list(heldout.SPECTRA)
    # against the continuum (a running mean over 41 points), emission lines rise above it and absorption lines dip
    # below: the highest point outweighs the lowest (noise alone is symmetric)
    padded = np.pad(x[:, 0], ((0, 0), (20, 20)), mode="edge")
    residual = x[:, 0] - np.stack([np.convolve(row, np.ones(41) / 41, "valid") for row in padded])
    asymmetry = residual.max(axis=1) + residual.min(axis=1)
    emit, absorb = asymmetry[y == names.index("pair")], asymmetry[y == names.index("pair_absorbed")]
    assert emit.mean() > 0.1 > -0.1 > absorb.mean()
    # every two classes' mean spectra differ beyond their noise (smoothed at a line's width, every 4th point: 64
    # nearly independent points, so about 64 where classes do not differ, as with shuffled labels)
    window = np.exp(-0.5 * (np.arange(-8, 9) / 3.0) ** 2)
    smooth = np.stack([np.convolve(row, window, "same") for row in residual])[:, ::4]
    shuffled = np.random.default_rng(0).permutation(y)
    pairs = [(c, d) for c in range(len(names)) for d in range(c)]
    assert min(_chi2(smooth, y, c, d) for c, d in pairs) > 150 > max(_chi2(smooth, shuffled, c, d) for c, d in pairs)


def test_fields_classes_differ_by_their_spectral_slope_and_skew(tmp_path):
    x, y = _arrays(heldout.fields, tmp_path / "f.h5", samples=1200)["train"]
    x = x[:, 0]
    power = np.abs(np.fft.rfft2(x)) ** 2
    k = np.hypot(*np.meshgrid(np.fft.fftfreq(x.shape[1]), np.fft.rfftfreq(x.shape[2]), indexing="ij"))
    steepness = np.log(power[:, (k > 0) & (k < 0.1)].mean(axis=1) / power[:, k > 0.25].mean(axis=1))
    centred = x - x.mean(axis=(1, 2), keepdims=True)
    skew = (centred ** 3).mean(axis=(1, 2)) / (centred ** 2).mean(axis=(1, 2)) ** 1.5
    n = len(heldout.FIELD_SLOPES)
    for kind in (0, 1):  # gaussian, lognormal: steeper slopes put more power on large scales
        by_slope = [steepness[y == kind * n + s].mean() for s in range(n)]
        assert all(b - a > 0.5 for a, b in zip(by_slope, by_slope[1:]))
    for s in range(n):  # lognormal fields are skewed, Gaussian ones not
        assert skew[y == n + s].mean() > 0.5 > abs(skew[y == s].mean())


@pytest.mark.parametrize("name, problem", [("spectra", Problem((1, 256), "classification", 8)),
                                           ("fields", Problem((1, 32, 32), "classification", 6))])
def test_bench_search_runs_the_heldout_sets_with_their_configs_and_experts(tmp_path, name, problem):
    from bench.search import DATASETS, config_path, expert_path

    generate, kwargs, config = DATASETS[name]
    assert generate is getattr(heldout, name) and config == name
    assert Problem.of_dataset(generate(tmp_path / "d.h5", **{**kwargs, "samples": 120})) == problem
    assert config_path(name).exists() and load_config(config_path(name)).train.epochs > 0
    genome = Genome.from_json(expert_path(name).read_text())
    assert count_params(genome, problem) > 10_000
    assert any(g.type == "conv" for g in genome.layers) and any(g.type == "norm" for g in genome.layers)
    model = build_model(genome, problem, "meta")
    assert sum(p.numel() for p in model.parameters()) == count_params(genome, problem)
