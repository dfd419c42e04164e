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

CASES = [(heldout.spectra, (1, 256), 8), (heldout.fields, (1, 32, 32), 6), (heldout.lightcurves, (1, 256), 6),
         (heldout.tracks, (1, 32, 32), 6), (heldout.seismograms, (1, 256), 6), (heldout.galaxies, (1, 32, 32), 6),
         (heldout.pulses, (1, 128), 6), (heldout.pulses_permuted, (1, 128), 6),
         (heldout.heartbeats, (1, 128), 6), (heldout.heartbeats_permuted, (1, 128), 6)]


def _arrays(generate, path, **kwargs) -> dict:
    _, arrays = load(validate(generate(path, **kwargs).path).path)
    return arrays


@pytest.mark.parametrize("generate, shape, classes", CASES, ids=[g.__name__ for g, _, _ in CASES])
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


def _skew(v: np.ndarray) -> np.ndarray:
    """Each row's skewness (over its last axis)."""
    v = v - v.mean(axis=-1, keepdims=True)
    return (v ** 3).mean(axis=-1) / (v ** 2).mean(axis=-1) ** 1.5


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
    skew = _skew(x.reshape(len(x), -1))
    n = len(heldout.FIELD_SLOPES)
    for kind in (0, 1):  # gaussian, lognormal: steeper slopes put more power on large scales
        by_slope = [steepness[y == kind * n + s].mean() for s in range(n)]
        assert all(b - a > 0.5 for a, b in zip(by_slope, by_slope[1:]))
    for s in range(n):  # lognormal fields are skewed, Gaussian ones not
        assert skew[y == n + s].mean() > 0.5 > abs(skew[y == s].mean())


def test_lightcurves_classes_differ_by_the_shape_of_their_cycle(tmp_path):
    x, y = _arrays(heldout.lightcurves, tmp_path / "l.h5", samples=3000)["train"]
    x = x[:, 0].astype(float)
    t = np.stack([np.ones(x.shape[1]), np.arange(x.shape[1])], axis=1)
    r = x - (t @ np.linalg.lstsq(t, x.T, rcond=None)[0]).T  # without the baseline's linear drift
    names = list(heldout.LIGHTCURVES)
    skew = _skew(r)
    # eclipses and transits are dips below the light's level, flares rises above it, a sinusoid neither
    assert skew[y == names.index("flares")].mean() > 0.1 > abs(skew[y == names.index("sinusoid")].mean())
    assert max(skew[y == names.index(n)].mean() for n in ("detached", "transit")) < -0.2
    smooth = np.stack([np.convolve(row, np.ones(5) / 5, "valid") for row in r])
    rises = _skew(np.diff(smooth))  # a sawtooth rises faster than it falls
    assert rises[y == names.index("sawtooth")].mean() > 0.05 > abs(rises[y == names.index("sinusoid")].mean())
    # every two classes differ beyond their noise in these and in their spectrum: how much power its strongest
    # frequency holds, and which frequency that is (a contact binary's two minima a cycle double it)
    power = np.abs(np.fft.rfft(r)) ** 2
    power[:, :3] = 0
    features = np.stack([skew, (r - r.mean(axis=1, keepdims=True)).std(axis=1), rises,
                         power.max(axis=1) / power.sum(axis=1), np.log(power.argmax(axis=1))], axis=1)
    shuffled = np.random.default_rng(0).permutation(y)
    pairs = [(c, d) for c in range(len(names)) for d in range(c)]
    assert min(_chi2(features, y, c, d) for c, d in pairs) > 100 > max(_chi2(features, shuffled, c, d)
                                                                         for c, d in pairs)


def test_tracks_classes_differ_by_their_topology_and_bend(tmp_path):
    x, y = _arrays(heldout.tracks, tmp_path / "t.h5")["train"]
    x = x[:, 0].astype(float)
    n, size = x.shape[:2]
    names = list(heldout.TRACKS)
    # the brightest pixel is the vertex: the pixels well above the noise (4 sigma) around it are the event
    rows, cols = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    vertex = x.reshape(n, -1).argmax(axis=1)
    dr, dc = rows[None] - (vertex // size)[:, None, None], cols[None] - (vertex % size)[:, None, None]
    w = np.where(x > 1.2, x, 0.0)
    bright, t = (w > 0).sum(axis=(1, 2)), w.sum(axis=(1, 2)) + 1e-9
    reach = np.sqrt((w * (dr ** 2 + dc ** 2)).sum(axis=(1, 2)) / t)
    mean = {name: (bright[y == c].mean(), reach[y == c].mean()) for c, name in enumerate(names)}
    assert mean["three_prong"][0] > mean["two_prong"][0] + 3 > mean["straight"][0] + 6  # more prongs, more track
    assert mean["shower"][1] < min(m[1] for name, m in mean.items() if name != "shower") - 1  # short segments
    # the bend: the event's offset across its direction (vertex to centroid) fitted as a * along + b * along^2, and b's
    # sign, positive for a track bending left, negative for one bending right, either for a straight one
    ur, uc = (w * dr).sum(axis=(1, 2)) / t, (w * dc).sum(axis=(1, 2)) / t
    norm = np.hypot(ur, uc) + 1e-9
    along = (dr * ur[:, None, None] + dc * uc[:, None, None]) / norm[:, None, None]
    across = (dr * uc[:, None, None] - dc * ur[:, None, None]) / norm[:, None, None]
    design = np.stack([along, along ** 2], axis=-1).reshape(n, -1, 2)
    weighted = design.transpose(0, 2, 1) * w.reshape(n, 1, -1)
    fit = np.linalg.solve(weighted @ design + 1e-6 * np.eye(2), weighted @ across.reshape(n, -1, 1))
    bend = {name: np.sign(fit[y == c, 1, 0]).mean() for c, name in enumerate(names)}
    assert bend["left"] > 0.25 > abs(bend["straight"]) and bend["right"] < -0.25


def _pairs_apart(features: np.ndarray, y: np.ndarray, classes: int, floor: float) -> None:
    """Every two classes differ beyond their noise in `features` (chi^2 above `floor`), and with shuffled labels none
    does."""
    shuffled = np.random.default_rng(0).permutation(y)
    pairs = [(c, d) for c in range(classes) for d in range(c)]
    assert min(_chi2(features, y, c, d) for c, d in pairs) > floor > max(_chi2(features, shuffled, c, d)
                                                                          for c, d in pairs)


def test_seismograms_classes_differ_by_their_phases(tmp_path):
    x, y = _arrays(heldout.seismograms, tmp_path / "s.h5", samples=3000)["train"]
    x = x[:, 0].astype(float)
    x = x - np.stack([np.convolve(row, np.ones(15) / 15, "same") for row in x])  # without the slow wander
    names = list(heldout.SEISMOGRAMS)
    power, freq = np.abs(np.fft.rfft(x)) ** 2, np.fft.rfftfreq(x.shape[1])
    centroid = (power * freq).sum(axis=1) / power.sum(axis=1)  # a teleseism's one arrival is of low frequency
    energy = np.stack([np.convolve(row ** 2, np.ones(9) / 9, "same") for row in x])
    energy = np.maximum(energy - 2 * np.median(energy, axis=1, keepdims=True), 0.0)  # above the noise's
    t = np.arange(x.shape[1])[None]
    at = (energy * t).sum(axis=1, keepdims=True) / (energy.sum(axis=1, keepdims=True) + 1e-9)
    spread = np.sqrt((energy * (t - at) ** 2).sum(axis=1) / (energy.sum(axis=1) + 1e-9))  # S-P delay, a doublet
    peaky = energy.max(axis=1) / (energy.sum(axis=1) + 1e-9)
    mean = {n: (centroid[y == c].mean(), spread[y == c].mean()) for c, n in enumerate(names)}
    assert mean["teleseism"][0] < min(m[0] for n, m in mean.items() if n != "teleseism") - 0.01
    assert mean["doublet"][1] > mean["regional"][1] > mean["local"][1] + 3
    _pairs_apart(np.stack([centroid, spread, peaky], axis=1), y, len(names), 25)


def test_galaxies_classes_differ_by_the_shape_of_their_light(tmp_path):
    x, y = _arrays(heldout.galaxies, tmp_path / "g.h5", samples=2400)["train"]
    x = x[:, 0].astype(float)
    n, size = x.shape[:2]
    names = list(heldout.GALAXIES)

    def smooth(v: np.ndarray, sigma: float) -> np.ndarray:
        k = np.exp(-0.5 * (np.arange(-8, 9) / sigma) ** 2)
        v = np.apply_along_axis(lambda r: np.convolve(r, k / k.sum(), "same"), 1, v)
        return np.apply_along_axis(lambda r: np.convolve(r, k / k.sum(), "same"), 2, v)

    sm, big = smooth(x, 1.0), smooth(x, 2.5)
    rows, cols = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    w = np.clip(sm - 0.1, 0.0, None)
    total = w.sum(axis=(1, 2)) + 1e-9
    cr, cc = (w * rows).sum(axis=(1, 2)) / total, (w * cols).sum(axis=(1, 2)) / total
    dr, dc = rows[None] - cr[:, None, None], cols[None] - cc[:, None, None]
    mrr, mcc, mrc = ((w * m).sum(axis=(1, 2)) / total for m in (dr ** 2, dc ** 2, dr * dc))
    half, root = (mrr + mcc) / 2, np.sqrt(np.maximum(((mrr - mcc) / 2) ** 2 + mrc ** 2, 0.0))
    elongation = np.log((half + root) / (half - root + 1e-9))  # the light's axis ratio: a bar's is long
    central = (w * (np.hypot(dr, dc) < 2)).sum(axis=(1, 2)) / total  # an elliptical's light is concentrated
    at_centre = sm[np.arange(n), np.clip(cr.round().astype(int), 0, size - 1),
                   np.clip(cc.round().astype(int), 0, size - 1)] / sm.reshape(n, -1).max(axis=1)  # a ring's is dark
    inside = big > 0.15
    rough = (((sm - big) ** 2) * inside).sum(axis=(1, 2)) / ((big ** 2) * inside).sum(axis=(1, 2)).clip(1e-9)
    mean = {name: (elongation[y == c].mean(), central[y == c].mean(), at_centre[y == c].mean(), rough[y == c].mean())
            for c, name in enumerate(names)}
    assert mean["barred"][0] > max(m[0] for name, m in mean.items() if name != "barred")
    assert mean["elliptical"][1] > max(mean[n][1] for n in ("disk", "spiral", "barred", "ring")) + 0.05
    assert mean["ring"][2] < 0.5 < min(m[2] for name, m in mean.items() if name != "ring")
    assert mean["spiral"][3] > mean["disk"][3]  # arms: light that a wider blur smooths away
    _pairs_apart(np.stack([elongation, central, np.sqrt(mrr + mcc), at_centre, rough], axis=1), y, len(names), 25)


def test_pulses_classes_differ_by_their_shape(tmp_path):
    x, y = _arrays(heldout.pulses, tmp_path / "p.h5", samples=3000)["train"]
    x = x[:, 0].astype(float)
    x = x - x[:, :6].mean(axis=1, keepdims=True)  # the pedestal, before the earliest arrival
    smooth = np.stack([np.convolve(row, np.ones(3) / 3, "same") for row in x])
    top = smooth.max(axis=1, keepdims=True)
    after = np.arange(x.shape[1])[None] - smooth.argmax(axis=1)[:, None]
    tail = (smooth * ((after >= 10) & (after < 45))).sum(axis=1) / 35 / top[:, 0]  # the slow light, for the peak
    rising = ((smooth > 0.2 * top) & (after < 0) & (after > -10)).sum(axis=1)  # an alpha rises slowly
    flat = (smooth > 0.95 * top).sum(axis=1)  # a clipped top is wide
    below = -smooth.min(axis=1) / top[:, 0]  # pick-up rings below the pedestal
    late = (smooth * (after > 3) * (smooth > 0.25 * top)).sum(axis=1) / top[:, 0]  # a second pulse's light
    mean = {n: [v[y == c].mean() for v in (tail, rising, flat, below, late)] for c, n in enumerate(heldout.PULSES)}
    assert mean["neutron"][0] > mean["gamma"][0] + 0.02  # pulse-shape discrimination: the stronger slow tail
    assert mean["alpha"][1] > mean["gamma"][1] + 1.5
    assert mean["saturated"][2] > mean["gamma"][2] + 1.5
    assert mean["pickup"][3] > 0.4 > max(m[3] for n, m in mean.items() if n != "pickup")
    assert mean["pileup"][4] > mean["gamma"][4] + 2
    _pairs_apart(np.stack([tail, rising, flat, below, late], axis=1), y, len(heldout.PULSES), 40)


def test_heartbeats_classes_differ_by_their_waves(tmp_path):
    x, y = _arrays(heldout.heartbeats, tmp_path / "h.h5", samples=3000)["train"]
    smooth = np.stack([np.convolve(row, np.ones(3) / 3, "same") for row in x[:, 0].astype(float)])
    rows = np.arange(len(smooth))
    r = smooth[:, 20:92].argmax(axis=1) + 20  # the R wave (a ventricular beat's wide one, a block's taller peak)
    top = smooth[rows, r]

    def around(a: int, b: int) -> np.ndarray:  # samples r+a .. r+b-1 of each trace
        return smooth[rows[:, None], np.clip(r[:, None] + np.arange(a, b)[None], 0, smooth.shape[1] - 1)]

    base = around(-26, -22).mean(axis=1)
    p_wave, early = (around(-20, -13).mean(axis=1) - base) / top, (around(-12, -8).mean(axis=1) - base) / top
    wide = (around(-6, 7) > 0.5 * top[:, None]).sum(axis=1)  # the QRS complex's width
    st, t_wave = (around(10, 18).mean(axis=1) - base) / top, (around(22, 36).mean(axis=1) - base) / top
    features = np.stack([p_wave, early, wide, st, t_wave], axis=1)
    mean = {n: features[y == c].mean(axis=0) for c, n in enumerate(heldout.HEARTBEATS)}
    assert min(mean[n][0] for n in ("normal", "st_elevation", "bundle_block")) > 0.05 > mean["fibrillation"][0]
    assert mean["ventricular"][0] < 0.05 and mean["atrial"][1] < -0.1 < mean["normal"][1]  # the early inverted P
    assert min(mean["ventricular"][2], mean["bundle_block"][2]) > mean["normal"][2] + 2
    assert mean["st_elevation"][3] > mean["normal"][3] + 0.1
    assert max(mean["ventricular"][4], mean["bundle_block"][4]) < 0 < mean["normal"][4]  # the inverted T
    _pairs_apart(features, y, len(heldout.HEARTBEATS), 40)


@pytest.mark.parametrize("name", ["pulses", "heartbeats"])
def test_a_permuted_set_is_its_set_with_one_fixed_permutation(tmp_path, name):
    perm = None
    for seed in (0, 1):
        plain = _arrays(getattr(heldout, name), tmp_path / f"p{seed}.h5", samples=120, seed=seed)
        permuted = _arrays(getattr(heldout, f"{name}_permuted"), tmp_path / f"q{seed}.h5", samples=120, seed=seed)
        if perm is None:  # where each position went, read off one trace (its values are all distinct)
            a, b = plain["train"][0][0, 0], permuted["train"][0][0, 0]
            perm = np.argsort(b)[np.argsort(np.argsort(a))]
            assert not np.array_equal(perm, np.arange(len(perm)))
        for split in ("train", "val", "test"):
            assert np.array_equal(permuted[split][1], plain[split][1])
            assert np.array_equal(permuted[split][0][..., perm], plain[split][0])


@pytest.mark.parametrize("name, problem, config", [
    ("spectra", Problem((1, 256), "classification", 8), "spectra"),
    ("fields", Problem((1, 32, 32), "classification", 6), "fields"),
    ("lightcurves", Problem((1, 256), "classification", 6), "spectra"),  # round 2: round 1's config and expert
    ("tracks", Problem((1, 32, 32), "classification", 6), "fields"),
    ("seismograms", Problem((1, 256), "classification", 6), "spectra"),  # round 3: the same rule
    ("galaxies", Problem((1, 32, 32), "classification", 6), "fields"),
    ("pulses", Problem((1, 128), "classification", 6), "signals"),  # round 4: the bundled 1D set's
    ("pulses-permuted", Problem((1, 128), "classification", 6), "signals-permuted"),
    ("heartbeats", Problem((1, 128), "classification", 6), "signals"),  # round 6: round 4's rule
    ("heartbeats-permuted", Problem((1, 128), "classification", 6), "signals-permuted")])
def test_bench_search_runs_the_heldout_sets_with_their_configs_and_experts(tmp_path, name, problem, config):
    from bench.search import DATASETS, HELD_OUT, config_path, expert_path

    generate, kwargs, its_config = DATASETS[name]
    assert generate is getattr(heldout, name.replace("-", "_")) and its_config == config and name in HELD_OUT
    assert Problem.of_dataset(generate(tmp_path / "d.h5", **{**kwargs, "samples": 120})) == problem
    assert config_path(name).exists() and load_config(config_path(name)).train.epochs > 0
    genome = Genome.from_json(expert_path(name).read_text())
    assert count_params(genome, problem) > 10_000
    assert any(g.type == ("dense" if "permuted" in name else "conv") for g in genome.layers)
    assert any(g.type == "norm" for g in genome.layers)
    model = build_model(genome, problem, "meta")
    assert sum(p.numel() for p in model.parameters()) == count_params(genome, problem)


def test_the_ceilings_set_trains_on_more_draws_and_keeps_the_sets_validation_and_test(tmp_path):
    from bench.ceiling import ceiling, more_data

    _, mine = load(heldout.heartbeats(tmp_path / "set.h5").path)
    _, more = load(validate(more_data("heartbeats", 2, tmp_path)).path)
    draws = [_arrays(heldout.heartbeats, tmp_path / f"draw{s}.h5", seed=s) for s in (1, 2)]
    for split in ("val", "test"):
        for a, b in zip(more[split], mine[split]):
            assert np.array_equal(a, b)
    x, y = more["train"]
    assert len(y) == len(mine["train"][1]) + 2 * 2000
    assert np.array_equal(x[:1200], mine["train"][0]) and np.array_equal(y[:1200], mine["train"][1])
    assert np.array_equal(x[1200:], np.concatenate([d[s][0] for d in draws for s in ("train", "val", "test")]))
    assert not np.array_equal(draws[0]["test"][0], mine["test"][0])  # another draw, not the set again
    row = ceiling("heartbeats", 1, 1, seed=0)  # one epoch on 3200 rows, scored by `galapagos predict`: far from
    assert (row["train_rows"], row["epochs"]) == (3200, 1) and 0.4 < row["test"] <= 1  # chance's 1/6
