"""The search benchmark's held-out datasets (issue 40): made for bench/search.py and never used for a tuning decision.

Two scientific sets unlike the bundled ones, written and committed before any run on them (bench/PROTOCOL.md):
- `spectra`: 1x256 spectra of eight kinds of source that differ by which emission and absorption lines they show,
  at which rest positions, widths and ratios, under a random redshift-like stretch, a drifting continuum and noise.
  The class is in the ratios of the lines' positions (a stretch keeps them) and strengths, not in where they are.
- `fields`: 1x32x32 periodic random fields of six kinds: three power-spectrum slopes, each Gaussian or lognormal
  (skewed), every field scaled to zero mean and unit variance, in white noise. The class is in global statistics
  (how power spreads over scales, the one-point distribution's skew), not in any local shape.
Round 2 (bench/PROTOCOL.md), two more, drafted while the shrunk-inheritance pilot ran and committed with round 2's
protocol, before any run on them:
- `lightcurves`: 1x256 brightness time series of six kinds of variable source that differ by the shape of one
  cycle (a sinusoid, a sawtooth, detached or contact eclipses, a transit) or by having none (flares), at a random
  period, phase and amplitude, on a drifting baseline in noise. The class is in the shape, not in the period.
- `tracks`: 1x32x32 detector images of six kinds of event from a vertex: one straight track, one track bending left
  or right, two or three prongs, or a shower of short segments, among noise hits; a bright deposit marks the
  vertex. The class is in the topology and the handedness of local shapes, not in a global statistic.
Round 3 (bench/PROTOCOL.md), two more, written after the kept-ensemble pilot's verdict and committed with round 3's
protocol, before any run on them:
- `seismograms`: 1x256 ground-motion traces of six kinds of event that differ by their phases: a local or a
  regional earthquake (the S wave 8-30 or 34-80 samples after the P wave, and stronger), an explosion (a
  compressional P wave, a weak S wave), a teleseism (one low-frequency arrival with a long coda), a doublet (two
  local earthquakes) or an emergent noise burst, at a random onset in noise that drifts. The class is in the
  phases' order, spacing, strengths and frequency, not in the onset.
- `galaxies`: 1x32x32 images of six morphologies: an elliptical (a de Vaucouleurs profile), a plain disk (an
  exponential one), a two-armed spiral, a barred disk, a ring around a small bulge, or a merger of two cores, at a
  random size, ellipticity, orientation and brightness, blurred by a seeing disk, among faint field stars, in
  noise. The class is in the light's shape, not in where or how bright it is.
Round 4 (bench/PROTOCOL.md), a 1D set and its position-permuted variant (the shape of issue 40's held-out check),
committed with round 4's protocol, before any run on them:
- `pulses`: 1x128 digitised detector pulses of six kinds: a gamma (a fast scintillation decay with a weak slow
  tail), a neutron (the same rise and fast decay, a stronger slow tail: pulse-shape discrimination), an alpha (a
  slower rise and decay), a pile-up of two gammas, a saturated gamma (clipped at the digitiser's ceiling) or a burst
  of ringing pick-up, at a random arrival time and amplitude, on a pedestal, in noise of a level drawn per pulse.
  The class is in the pulse's shape, not in when it arrives.
- `pulses-permuted`: the same pulses with the positions of every trace permuted by one fixed permutation:
  convolutions the wrong prior, an MLP on the flattened trace the right one.
Round 6 (bench/PROTOCOL.md), a 1D pair at the difficulty of issue 40's held-out check, committed with round 6's
protocol, before any search on them:
- `heartbeats`: 1x128 single heartbeats of six kinds: a normal beat (P wave, QRS complex, ST segment, T wave), a
  ventricular one (no P wave, a wide QRS, an inverted T), an ectopic atrial one (an early inverted P wave), a bundle
  branch block (a notched QRS of two R peaks, an inverted T), ST elevation (the segment raised 0.1-0.25) or atrial
  fibrillation (no P wave, small fast fibrillatory waves), at a random position, rate and amplitude, on a wandering
  baseline, in noise of a level drawn per trace. The class is in the waves, not where the beat is.
- `heartbeats-permuted`: the same traces under one fixed permutation of their positions: an MLP must learn the
  beat at every position from 1200 traces.
The difficulty of the first six was set by reasoning alone (no network trained on them): per-sample line strengths
down to about one noise sigma, line ratios and slopes jittered towards the neighbouring class, noise that hides the
small scales where slopes differ most, skews as weak as a few tenths; cycle shapes jittered towards their neighbour
(eclipse depths, a sawtooth's rise) under noise near a third of the amplitude; bends as gentle as a radius of 30
pixels and prongs as close as 0.35 radians, among noise hits; S-P delays and S/P ratios that nearly meet between
neighbouring kinds, arrivals as weak as twice the noise; spiral arms of a contrast down to 0.4 and discs as flat
as an axis ratio of 0.45 beside bars, mergers as close as 3 pixels, under seeing of up to 1.6 pixels and noise of
0.15 against peaks of 0.6-1.2; so that no network should reach every sample. The pulses' was set by reasoning and
one simulation of a hand-made statistic (no network), easier on purpose, since the held-out check's 1D set is one
a good network nearly solves: slow-tail fractions of the light of 0.04-0.12 (gammas) against 0.25-0.40 (neutrons)
under one scintillator's time constants jittered by a tenth, noise up to a twentieth of the smallest peak,
pile-ups as close as 4 samples. That statistic (the light after the peak over all of it, with the arrival time and
the pedestal known) tells gammas from neutrons of the same noise 97.5% of the time. The heartbeats' was set by
reasoning (P waves of a few noise sigmas, fibrillatory waves near the noise, the beat anywhere in 64 of 128
samples), then checked, not changed, by the expert's 2-minute runs: 0.98 on heartbeats, 0.755 permuted, where the
check's hand-written networks scored 0.993 and 0.76.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from galapagos.datashare.format import DatasetInfo, load
from galapagos.datashare.write import consecutive_splits, write_dataset

# Rest positions of the lines, as fractions of the band (a stretch by 1 + z moves them to position * (1 + z)).
LINES = (0.16, 0.22, 0.31, 0.45, 0.52, 0.64)
# Each kind of source: lines as (line index, strength relative to the first, sign: +1 emission, -1 absorption),
# and a width factor. Pairs of kinds differ in one thing: a ratio, a sign, a width, a line more or a doublet.
SPECTRA = {
    "pair": (((0, 1.0, 1), (2, 1.0, 1)), 1.0),
    "pair_weak": (((0, 1.0, 1), (2, 0.5, 1)), 1.0),          # the ratio differs
    "pair_absorbed": (((0, 1.0, -1), (2, 1.0, -1)), 1.0),    # the sign differs
    "pair_broad": (((0, 1.0, 1), (2, 1.0, 1)), 2.5),         # the width differs
    "triple": (((0, 1.0, 1), (2, 1.0, 1), (5, 0.7, 1)), 1.0),  # a line more
    "mixed": (((0, 1.0, 1), (2, 1.0, -1)), 1.0),             # one line emitted, one absorbed
    "red_pair": (((3, 1.0, 1), (4, 1.0, 1)), 1.0),           # other lines, closer together
    "doublet": (((1, 1.0, 1), (1, 0.8, 1), (2, 1.0, 1)), 1.0),  # line 1 split in two (see DOUBLET)
}
DOUBLET = 0.018  # separation of the doublet's two components, fraction of the band (at rest)
FIELD_SLOPES = (1.5, 2.25, 3.0)  # P(k) ~ k^-slope
FIELD_CLASSES = tuple(f"{kind}_{slope:g}" for kind in ("gaussian", "lognormal") for slope in FIELD_SLOPES)
# Round 2 (bench/PROTOCOL.md): the kinds of variable source and of detector event
LIGHTCURVES = ("sinusoid", "sawtooth", "detached", "contact", "transit", "flares")
TRACKS = ("straight", "left", "right", "two_prong", "three_prong", "shower")
# Round 3: the kinds of seismic event and of galaxy
SEISMOGRAMS = ("local", "regional", "explosion", "teleseism", "doublet", "burst")
GALAXIES = ("elliptical", "disk", "spiral", "barred", "ring", "merger")
# Round 4: the kinds of detector pulse
PULSES = ("gamma", "neutron", "alpha", "pileup", "saturated", "pickup")
# Round 6: the kinds of heartbeat
HEARTBEATS = ("normal", "ventricular", "atrial", "bundle_block", "st_elevation", "fibrillation")


def spectra(out_path: str | Path, *, samples: int = 5000, length: int = 256, noise: float = 0.25, seed: int = 0,
            fractions: tuple[float, float, float] = (0.6, 0.2, 0.2)) -> DatasetInfo:
    """Write the spectra (train/val/test, balanced classes) to ``out_path``; deterministic for a given seed."""
    if length < 128:
        raise ValueError(f"length must be at least 128 points, got {length}")
    rng = np.random.default_rng(seed)
    names = tuple(SPECTRA)
    label = rng.permutation(np.arange(samples) % len(names))
    # every sample draws all parameters, so the stream of random numbers does not depend on the labels
    stretch = 1.0 + rng.uniform(0.0, 0.25, samples)[:, None]               # redshift-like: positions times 1 + z
    strength = rng.uniform(0.25, 1.2, samples)[:, None]                   # the first line's amplitude
    jitter = rng.uniform(0.75, 1.3, (samples, 3))                         # each line's ratio, jittered
    width = rng.uniform(1.2, 2.4, samples)[:, None] / length              # Gaussian sigma, fraction of the band
    t = (np.arange(length) + 0.5) / length
    slope, curve = rng.normal(0.0, 0.3, samples)[:, None], rng.normal(0.0, 0.3, samples)[:, None]
    wiggle = rng.uniform(0.0, 0.3, samples)[:, None] * np.sin(
        2.0 * np.pi * rng.uniform(0.5, 1.5, samples)[:, None] * t + rng.uniform(0.0, 2.0 * np.pi, samples)[:, None])
    continuum = 1.0 + slope * (t - 0.5) + curve * (t - 0.5) ** 2 + wiggle

    x = continuum.copy()
    for c, name in enumerate(names):
        rows = np.flatnonzero(label == c)
        lines, broad = SPECTRA[name]
        for j, (line, ratio, sign) in enumerate(lines):
            rest = LINES[line] + (DOUBLET if name == "doublet" and j == 1 else 0.0)
            centre = rest * stretch[rows]
            sigma = broad * width[rows] * stretch[rows]
            amplitude = sign * strength[rows] * (ratio * jitter[rows, j:j + 1] if j else 1.0) / np.sqrt(broad)
            x[rows] += amplitude * np.exp(-0.5 * ((t - centre) / sigma) ** 2)
    x = (x + rng.normal(0.0, noise, x.shape)).astype(np.float32)[:, None]
    return write_dataset(
        out_path, consecutive_splits(x, label, fractions), task="classification", num_classes=len(names),
        name="spectra", target_names=names,
        description=(f"1x{length} spectra of {len(names)} kinds of line sources, stretched by 1 + z (z up to 0.25), "
                     f"drifting continuum, Gaussian noise sigma {noise:g} (seed {seed}); bench/heldout.py"))


def _gaussian_fields(rng: np.random.Generator, slope: np.ndarray, size: int) -> np.ndarray:
    """Periodic Gaussian random fields (N, size, size) with P(k) ~ k^-slope, each at zero mean and unit variance."""
    k = np.hypot(*np.meshgrid(np.fft.fftfreq(size), np.fft.rfftfreq(size), indexing="ij"))
    k[0, 0] = np.inf  # no mean
    white = np.fft.rfft2(rng.normal(0.0, 1.0, (len(slope), size, size)))
    g = np.fft.irfft2(white * k[None] ** (-slope[:, None, None] / 2.0), s=(size, size))
    return _standard(g)


def _standard(f: np.ndarray) -> np.ndarray:
    f = f - f.mean(axis=(1, 2), keepdims=True)
    return f / f.std(axis=(1, 2), keepdims=True)


def fields(out_path: str | Path, *, samples: int = 4000, size: int = 32, noise: float = 0.4, seed: int = 0,
           fractions: tuple[float, float, float] = (0.6, 0.2, 0.2)) -> DatasetInfo:
    """Write the fields (train/val/test, balanced classes) to ``out_path``; deterministic for a given seed."""
    if size < 16:
        raise ValueError(f"size must be at least 16 pixels, got {size}")
    rng = np.random.default_rng(seed)
    k = len(FIELD_CLASSES)
    label = rng.permutation(np.arange(samples) % k)
    # every sample draws all parameters, so the stream of random numbers does not depend on the labels
    slope = np.asarray(FIELD_SLOPES)[label % len(FIELD_SLOPES)] + rng.uniform(-0.3, 0.3, samples)
    skew = rng.uniform(0.15, 0.7, samples)[:, None, None]  # lognormal strength: skewness about 3 times it
    sigma = rng.uniform(0.5, 1.5, samples)[:, None, None] * noise  # each field's own noise level
    g = _gaussian_fields(rng, slope, size)
    lognormal = (label >= len(FIELD_SLOPES))[:, None, None]
    f = np.where(lognormal, _standard(np.exp(skew * g)), g)
    x = (f + rng.normal(0.0, 1.0, f.shape) * sigma).astype(np.float32)[:, None]
    return write_dataset(
        out_path, consecutive_splits(x, label, fractions), task="classification", num_classes=k, name="fields",
        target_names=FIELD_CLASSES,
        description=(f"{size}x{size} periodic random fields, P(k) ~ k^-slope for slopes {FIELD_SLOPES} (+-0.3), "
                     f"Gaussian or lognormal, unit variance, white noise sigma about {noise:g} (seed {seed}); "
                     "bench/heldout.py"))


def _cycle(name: str, phase: np.ndarray, shape: np.ndarray, depth2: np.ndarray) -> np.ndarray:
    """One kind's brightness at ``phase`` (0-1 in its cycle), peak to peak about 1. ``shape`` (0-1) and ``depth2``
    (0-1) jitter each kind towards its neighbour: the sawtooth's rise, the eclipses' widths, the second minimum."""
    if name == "sinusoid":
        return 0.5 * np.cos(2.0 * np.pi * phase)
    if name == "sawtooth":  # a fast rise over 8-30% of the cycle, then a slow linear decline
        rise = 0.08 + 0.22 * shape
        return np.where(phase < rise, phase / rise, (1.0 - phase) / (1.0 - rise)) - 0.5
    if name == "detached":  # two narrow eclipses half a cycle apart, the second 15-70% as deep
        w = 0.025 + 0.035 * shape
        dip = lambda c: np.exp(-0.5 * (np.minimum(np.abs(phase - c), 1.0 - np.abs(phase - c)) / w) ** 2)
        return 0.5 - dip(0.0) - (0.15 + 0.55 * depth2) * dip(0.5)
    if name == "contact":  # continuous light variation with two minima per cycle, the second 70-95% as deep
        weight = 1.0 - (0.3 - 0.25 * depth2) * (1.0 - np.cos(2.0 * np.pi * phase)) / 2.0
        return -0.5 * np.cos(4.0 * np.pi * phase) * weight
    if name == "transit":  # one flat-bottomed dip per cycle, 5-12% of it long, nothing at half a cycle
        half = 0.025 + 0.035 * shape
        edge = np.clip((half - np.minimum(phase, 1.0 - phase)) / (0.3 * half), 0.0, 1.0)
        return 0.5 - edge
    raise ValueError(f"unknown light curve kind {name!r}")


def lightcurves(out_path: str | Path, *, samples: int = 5000, length: int = 256, noise: float = 0.3, seed: int = 0,
                fractions: tuple[float, float, float] = (0.6, 0.2, 0.2)) -> DatasetInfo:
    """Write the light curves (train/val/test, balanced classes) to ``out_path``; deterministic for a given seed."""
    if length < 128:
        raise ValueError(f"length must be at least 128 points, got {length}")
    rng = np.random.default_rng(seed)
    label = rng.permutation(np.arange(samples) % len(LIGHTCURVES))
    # every sample draws all parameters, so the stream of random numbers does not depend on the labels
    t = (np.arange(length) + 0.5) / length
    period = rng.uniform(1.0 / 10.0, 1.0 / 3.0, samples)[:, None]          # 3-10 cycles in the window
    phase = (t / period + rng.uniform(0.0, 1.0, samples)[:, None]) % 1.0
    amplitude = rng.uniform(0.4, 1.2, samples)[:, None]
    shape, depth2 = rng.uniform(0.0, 1.0, (2, samples, 1))
    flare_at = rng.uniform(-0.05, 1.0, (samples, 4))                       # up to four flares, some before the window
    flare_on = rng.uniform(0.0, 1.0, (samples, 4)) < 0.6
    flare_decay = rng.uniform(0.01, 0.04, (samples, 4))
    drift = rng.normal(0.0, 0.3, samples)[:, None] * (t - 0.5) + rng.uniform(0.0, 0.3, samples)[:, None] * np.sin(
        2.0 * np.pi * rng.uniform(0.3, 1.2, samples)[:, None] * t + rng.uniform(0.0, 2.0 * np.pi, samples)[:, None])
    x = np.zeros((samples, length))
    for c, name in enumerate(LIGHTCURVES):
        rows = np.flatnonzero(label == c)
        if name == "flares":  # aperiodic: a sudden rise and an exponential decay, at least one flare each
            on = flare_on[rows] | (np.arange(4) == 0)
            since = t[None, None, :] - flare_at[rows][:, :, None]
            burst = np.where(since >= 0, np.exp(-np.maximum(since, 0) / flare_decay[rows][:, :, None]), 0.0)
            x[rows] = (burst * on[:, :, None]).sum(axis=1) - 0.5
        else:
            x[rows] = _cycle(name, phase[rows], shape[rows], depth2[rows])
    x = amplitude * x + drift + rng.normal(0.0, noise, x.shape)
    return write_dataset(
        out_path, consecutive_splits(x.astype(np.float32)[:, None], label, fractions), task="classification",
        num_classes=len(LIGHTCURVES), name="lightcurves", target_names=LIGHTCURVES,
        description=(f"1x{length} light curves of {len(LIGHTCURVES)} kinds of variable source, 3-10 cycles or "
                     f"aperiodic flares, drifting baseline, Gaussian noise sigma {noise:g} (seed {seed}); "
                     "bench/heldout.py"))


def _direction(heading):
    """Unit (row, column) steps along ``heading`` (radians; an array of them gives one row each)."""
    return np.stack([np.sin(heading), np.cos(heading)], axis=-1)


def _paths(rng: np.random.Generator, name: str, vertex: np.ndarray) -> list[np.ndarray]:
    """One event's tracks as arrays of (row, column) points 0.25 pixels apart, from ``vertex``."""
    step = 0.25
    angle = rng.uniform(0.0, 2.0 * np.pi)
    if name in ("straight", "left", "right"):
        length = rng.uniform(10.0, 20.0)
        turn = {"straight": 0.0, "left": 1.0, "right": -1.0}[name] / rng.uniform(8.0, 30.0)  # 1 / radius, pixels
        heading = angle + turn * np.arange(0.0, length, step)
        return [vertex + np.cumsum(step * _direction(heading), axis=0)]
    if name in ("two_prong", "three_prong"):
        prongs = 2 if name == "two_prong" else 3
        spread = rng.uniform(0.35, 1.2)  # radians between neighbouring prongs
        headings = angle + spread * (np.arange(prongs) - (prongs - 1) / 2) + rng.normal(0.0, 0.1, prongs)
        return [vertex + np.arange(step, rng.uniform(8.0, 18.0), step)[:, None] * _direction(h) for h in headings]
    if name == "shower":  # 6-12 short segments in a cone, starting 2-8 pixels down its axis
        pieces = []
        for _ in range(rng.integers(6, 13)):
            h = angle + rng.normal(0.0, 0.35)
            start = vertex + rng.uniform(2.0, 8.0) * _direction(angle)
            pieces.append(start + np.arange(0.0, rng.uniform(2.0, 5.0), step)[:, None] * _direction(h))
        return pieces
    raise ValueError(f"unknown track kind {name!r}")


def tracks(out_path: str | Path, *, samples: int = 4000, size: int = 32, noise: float = 0.3, seed: int = 0,
           fractions: tuple[float, float, float] = (0.6, 0.2, 0.2)) -> DatasetInfo:
    """Write the detector images (train/val/test, balanced classes) to ``out_path``; deterministic for a given
    seed."""
    if size < 24:
        raise ValueError(f"size must be at least 24 pixels, got {size}")
    rng = np.random.default_rng(seed)
    label = rng.permutation(np.arange(samples) % len(TRACKS))
    x = np.zeros((samples, size, size))
    for i in range(samples):  # each event draws its own tracks: ragged, so one at a time
        vertex = rng.uniform(0.3 * size, 0.7 * size, 2)
        # the recoil's deposit at the vertex tells a track's start from its end: without it an arc bending left, read
        # from its far end, bends right, and the two classes would be one
        x[i, int(vertex[0]), int(vertex[1])] += rng.uniform(1.5, 2.5)
        for path in _paths(rng, TRACKS[label[i]], vertex):
            charge = rng.gamma(4.0, 0.25, len(path)) * rng.uniform(0.4, 1.0)  # fluctuating deposit along the track
            r, c = np.floor(path).astype(int).T
            keep = (r >= 0) & (r < size) & (c >= 0) & (c < size)
            np.add.at(x[i], (r[keep], c[keep]), 0.4 * charge[keep])
        hits = rng.poisson(6)  # noise hits: single bright pixels anywhere
        x[i, rng.integers(0, size, hits), rng.integers(0, size, hits)] += rng.uniform(0.3, 1.0, hits)
    x = np.minimum(x, 3.0) + rng.normal(0.0, noise, x.shape)  # the pixels saturate
    return write_dataset(
        out_path, consecutive_splits(x.astype(np.float32)[:, None], label, fractions), task="classification",
        num_classes=len(TRACKS), name="tracks", target_names=TRACKS,
        description=(f"{size}x{size} detector images of {len(TRACKS)} kinds of event from a vertex, noise hits, "
                     f"Gaussian noise sigma {noise:g} (seed {seed}); bench/heldout.py"))


def _arrival(t: np.ndarray, onset: np.ndarray, freq: np.ndarray, decay: np.ndarray, polarity: np.ndarray) -> np.ndarray:
    """A phase arriving at ``onset`` (samples): a sinusoid of ``freq`` cycles a sample, rising over a quarter cycle and
    decaying over ``decay`` samples, first motion up for ``polarity`` +1; peak about 1. One row per trace."""
    since = t[None] - onset
    rise = np.clip(since * freq * 4.0, 0.0, 1.0)
    return np.where(since > 0, polarity * rise * np.sin(2.0 * np.pi * freq * np.maximum(since, 0.0))
                    * np.exp(-np.maximum(since, 0.0) / decay), 0.0)


def _of_label(kinds: dict[str, np.ndarray], names: tuple[str, ...], label: np.ndarray) -> np.ndarray:
    """Each trace as its class draws it: row i of ``kinds[names[label[i]]]`` (every kind drawn for every trace)."""
    return np.stack([kinds[name] for name in names])[label, np.arange(len(label))]


def _traces(names: tuple[str, ...], samples: int, length: int, least: int, seed: int):
    """What a 1D generator of traces draws first: its random stream, balanced labels of ``names`` in random order,
    the sample positions, and ``col(low, high)``, one uniform draw per trace (a column). Every trace draws every
    parameter, so the stream of random numbers does not depend on the labels."""
    if length < least:
        raise ValueError(f"length must be at least {least} samples, got {length}")
    rng = np.random.default_rng(seed)
    label = rng.permutation(np.arange(samples) % len(names))
    return rng, label, np.arange(length, dtype=float), lambda low, high: rng.uniform(low, high, samples)[:, None]


def seismograms(out_path: str | Path, *, samples: int = 5000, length: int = 256, noise: float = 0.2, seed: int = 0,
                fractions: tuple[float, float, float] = (0.6, 0.2, 0.2)) -> DatasetInfo:
    """Write the seismograms (train/val/test, balanced classes) to ``out_path``; deterministic for a given seed."""
    rng, label, t, col = _traces(SEISMOGRAMS, samples, length, 256, seed)
    onset, amplitude = col(15.0, 100.0), col(0.8, 1.6)
    freq, decay = col(0.1, 0.22), col(4.0, 10.0)
    polarity = np.where(rng.uniform(0.0, 1.0, samples) < 0.5, -1.0, 1.0)[:, None]
    near, far = col(8.0, 30.0), col(34.0, 80.0)                 # S-P delays of a local and a regional event
    s_ratio, weak_s = col(1.3, 3.0), col(0.15, 0.9)               # S/P amplitude of an earthquake, of an explosion
    second, second_size = col(40.0, 110.0), col(0.4, 1.0)         # a doublet's second event: delay, relative size
    tele_freq, coda = col(0.03, 0.07), col(30.0, 70.0)
    p = lambda on, f=freq, d=decay, pol=polarity: _arrival(t, on, f, d, pol)  # noqa: E731
    s_wave = lambda on, delay, ratio: ratio * _arrival(t, on + delay, 0.7 * freq, 1.5 * decay, polarity)  # noqa: E731
    kinds = {
        "local": p(onset) + s_wave(onset, near, s_ratio),
        "regional": p(onset) + s_wave(onset, far, s_ratio),
        "explosion": p(onset, pol=1.0) * 1.4 + s_wave(onset, near, weak_s),
        "teleseism": p(onset, f=tele_freq, d=coda),
        "doublet": (p(onset) + s_wave(onset, near, s_ratio)
                    + second_size * (p(onset + second) + s_wave(onset + second, near, s_ratio))),
    }
    # an emergent burst: noise of the earthquakes' band under an envelope that rises over 25 samples, no phases
    envelope = np.clip((t[None] - onset) / 25.0, 0.0, 1.0) * np.exp(-np.maximum(t[None] - onset - 25.0, 0.0) / 40.0)
    white = rng.normal(0.0, 1.0, (samples, length))
    kinds["burst"] = envelope * (white + np.roll(white, 1, axis=1) + np.roll(white, 2, axis=1))
    x = _of_label(kinds, SEISMOGRAMS, label)
    scale = np.abs(x).max(axis=1, keepdims=True) + 1e-9  # each event's peak at its amplitude
    drift = np.cumsum(rng.normal(0.0, 0.012, (samples, length)), axis=1)  # microseisms: a slow wander
    drift -= drift.mean(axis=1, keepdims=True)
    x = amplitude * x / scale + drift + rng.normal(0.0, noise, x.shape)
    return write_dataset(
        out_path, consecutive_splits(x.astype(np.float32)[:, None], label, fractions), task="classification",
        num_classes=len(SEISMOGRAMS), name="seismograms", target_names=SEISMOGRAMS,
        description=(f"1x{length} seismograms of {len(SEISMOGRAMS)} kinds of event at a random onset, drifting "
                     f"noise, Gaussian noise sigma {noise:g} (seed {seed}); bench/heldout.py"))


def _light(name: str, r: np.ndarray, theta: np.ndarray, scale: float, rng: np.random.Generator) -> np.ndarray:
    """One galaxy's light on the polar grid (``r`` in pixels, ``theta`` in radians, in its own frame: ellipticity and
    orientation already applied), for its kind and scale length."""
    disk = np.exp(-r / scale)
    if name == "elliptical":
        return np.exp(-7.67 * ((r / (1.7 * scale) + 1e-3) ** 0.25 - 1.0))  # de Vaucouleurs, half light at 1.7 scale
    if name == "disk":
        return disk
    if name == "spiral":  # two logarithmic arms, pitch 15-35 degrees, a contrast of 0.4-0.9 between arm and gap
        pitch, contrast = np.deg2rad(rng.uniform(15.0, 35.0)), rng.uniform(0.4, 0.9)
        arms = np.cos(2.0 * (theta - np.log(r + 1.0) / np.tan(pitch)))
        return disk * (1.0 + contrast * arms)
    if name == "barred":  # a bar along the frame's x axis, 1.5-3 scale lengths long
        length, width = rng.uniform(1.5, 3.0) * scale, rng.uniform(0.25, 0.45) * scale
        bar = np.exp(-0.5 * ((r * np.cos(theta) / length) ** 2 + (r * np.sin(theta) / width) ** 2))
        return disk + rng.uniform(0.4, 1.0) * bar
    if name == "ring":  # a ring at 1.5-2.5 scale lengths around a bulge
        radius = rng.uniform(1.5, 2.5) * scale
        return 0.6 * np.exp(-r / (0.4 * scale)) + np.exp(-0.5 * ((r - radius) / (0.35 * scale)) ** 2)
    raise ValueError(f"unknown galaxy kind {name!r}")


def galaxies(out_path: str | Path, *, samples: int = 4000, size: int = 32, noise: float = 0.15, seed: int = 0,
             fractions: tuple[float, float, float] = (0.6, 0.2, 0.2)) -> DatasetInfo:
    """Write the galaxy images (train/val/test, balanced classes) to ``out_path``; deterministic for a given seed."""
    if size < 24:
        raise ValueError(f"size must be at least 24 pixels, got {size}")
    rng = np.random.default_rng(seed)
    label = rng.permutation(np.arange(samples) % len(GALAXIES))
    rows, cols = np.meshgrid(np.arange(size) + 0.5, np.arange(size) + 0.5, indexing="ij")
    freq = np.hypot(*np.meshgrid(np.fft.fftfreq(size), np.fft.rfftfreq(size), indexing="ij"))
    x = np.zeros((samples, size, size))
    for i in range(samples):  # each galaxy draws its own shape: one at a time
        centre = size / 2 + rng.uniform(-3.0, 3.0, 2)
        scale, q, angle = rng.uniform(2.5, 5.0), rng.uniform(0.45, 1.0), rng.uniform(0.0, np.pi)

        def frame(at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            dr, dc = rows - at[0], cols - at[1]
            u = dc * np.cos(angle) + dr * np.sin(angle)
            v = (-dc * np.sin(angle) + dr * np.cos(angle)) / q
            return np.hypot(u, v), np.arctan2(v, u)

        name = GALAXIES[label[i]]
        if name == "merger":  # two cores 3-8 pixels apart, the second 30-100% as bright
            offset = rng.uniform(3.0, 8.0) * _direction(rng.uniform(0.0, 2.0 * np.pi))
            light = sum(w * np.exp(-7.67 * ((frame(centre + d)[0] / (1.2 * scale) + 1e-3) ** 0.25 - 1.0))
                        for w, d in ((1.0, -offset / 2), (rng.uniform(0.3, 1.0), offset / 2)))
        else:
            light = _light(name, *frame(centre), scale, rng)
        seeing = rng.uniform(0.7, 1.6)  # the blur's sigma, pixels
        light = np.fft.irfft2(np.fft.rfft2(light) * np.exp(-2.0 * (np.pi * seeing * freq) ** 2), s=(size, size))
        x[i] = rng.uniform(0.6, 1.2) * light / light.max()
        stars = rng.poisson(2)  # faint field stars, blurred as the galaxy
        for _ in range(stars):
            at = rng.uniform(0.0, size, 2)
            x[i] += rng.uniform(0.1, 0.5) * np.exp(-0.5 * ((rows - at[0]) ** 2 + (cols - at[1]) ** 2) / seeing ** 2)
    x = x + rng.normal(0.0, noise, x.shape)
    return write_dataset(
        out_path, consecutive_splits(x.astype(np.float32)[:, None], label, fractions), task="classification",
        num_classes=len(GALAXIES), name="galaxies", target_names=GALAXIES,
        description=(f"{size}x{size} images of {len(GALAXIES)} galaxy morphologies, random size, ellipticity and "
                     f"orientation, seeing, field stars, Gaussian noise sigma {noise:g} (seed {seed}); "
                     "bench/heldout.py"))


def _pulse(t: np.ndarray, onset: np.ndarray, rise: np.ndarray, fast: np.ndarray, slow: np.ndarray,
           tail: np.ndarray) -> np.ndarray:
    """A scintillation pulse arriving at ``onset`` (samples): a rise over ``rise`` samples, then a fast decay over
    ``fast`` samples carrying ``1 - tail`` of the light and a slow one over ``slow`` carrying ``tail``; peak 1. One
    row per trace."""
    since = np.maximum(t[None] - onset, 0.0)
    shape = (1.0 - np.exp(-since / rise)) * ((1.0 - tail) * np.exp(-since / fast) / fast
                                               + tail * np.exp(-since / slow) / slow)
    return shape / (shape.max(axis=1, keepdims=True) + 1e-12)


def pulses(out_path: str | Path, *, samples: int = 3000, length: int = 128, noise: float = 0.025, seed: int = 0,
           fractions: tuple[float, float, float] = (0.6, 0.2, 0.2)) -> DatasetInfo:
    """Write the detector pulses (train/val/test, balanced classes) to ``out_path``; deterministic for a given seed.
    ``noise``: the largest noise sigma, each pulse drawing its own between half of it and it."""
    rng, label, t, col = _traces(PULSES, samples, length, 128, seed)
    onset, amplitude = col(8.0, 0.45 * length), col(0.5, 1.5)
    rise, fast, slow = col(0.6, 1.4), col(4.5, 5.5), col(30.0, 36.0)
    gamma_tail, neutron_tail = col(0.04, 0.12), col(0.25, 0.40)
    alpha_rise, alpha_fast = col(2.5, 4.5), col(9.0, 12.0)
    delay, second = col(4.0, 40.0), col(0.3, 1.0)  # a pile-up's second pulse: how late, how big
    ceiling = col(0.45, 0.75)  # a saturated pulse is clipped at this fraction of its unclipped peak
    ring_freq, ring_decay = col(0.06, 0.16), col(8.0, 20.0)
    gamma = _pulse(t, onset, rise, fast, slow, gamma_tail)
    since = np.maximum(t[None] - onset, 0.0)
    kinds = {
        "gamma": gamma,
        "neutron": _pulse(t, onset, rise, fast, slow, neutron_tail),
        "alpha": _pulse(t, onset, alpha_rise, alpha_fast, slow, gamma_tail),
        "pileup": gamma + second * _pulse(t, onset + delay, rise, fast, slow, gamma_tail),
        "saturated": np.minimum(gamma, ceiling),
        "pickup": np.where(t[None] > onset, np.sin(2.0 * np.pi * ring_freq * since) * np.exp(-since / ring_decay),
                           0.0),
    }
    x = _of_label(kinds, PULSES, label)
    x = amplitude * x / (np.abs(x).max(axis=1, keepdims=True) + 1e-12)
    x = x + col(-0.1, 0.1) + col(0.5 * noise, noise) * rng.normal(0.0, 1.0, x.shape)
    return write_dataset(
        out_path, consecutive_splits(x.astype(np.float32)[:, None], label, fractions), task="classification",
        num_classes=len(PULSES), name="pulses", target_names=PULSES,
        description=(f"1x{length} detector pulses of {len(PULSES)} kinds at a random arrival time and amplitude, "
                     f"pedestal, Gaussian noise sigma up to {noise:g} (seed {seed}); "
                     "bench/heldout.py"))


def _wave(t: np.ndarray, centre: np.ndarray, width: np.ndarray, height) -> np.ndarray:
    """A Gaussian deflection of each trace: one row per ``centre`` and ``width`` (columns), ``height`` its peak."""
    return height * np.exp(-0.5 * ((t[None] - centre) / width) ** 2)


def heartbeats(out_path: str | Path, *, samples: int = 2000, length: int = 128, noise: float = 0.05, seed: int = 0,
               fractions: tuple[float, float, float] = (0.6, 0.2, 0.2)) -> DatasetInfo:
    """Write the heartbeats (train/val/test, balanced classes) to ``out_path``; deterministic for a given seed.
    ``noise``: the largest noise sigma, each trace drawing its own between half of it and it."""
    rng, label, t, col = _traces(HEARTBEATS, samples, length, 128, seed)
    r, rate = col(24.0, length - 40.0), col(0.8, 1.25)  # where the R wave peaks; the beat's time scale
    amplitude = col(0.6, 1.4)
    p_height, p_width = col(0.12, 0.2), col(2.0, 3.0) * rate
    qrs, wide = col(1.0, 1.5), col(2.6, 3.6)  # the QRS complex's width: conducted, ventricular
    t_height, t_width, t_delay = col(0.25, 0.4), col(4.5, 6.5) * rate, col(24.0, 30.0) * rate
    st_level, st_raised = col(-0.03, 0.05), col(0.1, 0.25)  # the ST segment's level: normal, raised
    notch = col(2.2, 3.5)  # a bundle branch block's two R peaks, this far apart
    f_height, f_freq, f_phase = col(0.04, 0.08), col(0.12, 0.25), col(0.0, 2.0 * np.pi)
    wander, wander_period, wander_phase = col(0.0, 0.15), col(150.0, 400.0), col(0.0, 2.0 * np.pi)
    p = _wave(t, r - 16.0 * rate, p_width, p_height)
    conducted = _wave(t, r - 2.5 * qrs, qrs, -0.15) + _wave(t, r, qrs, 1.0) + _wave(t, r + 2.5 * qrs, qrs, -0.25)
    t_wave = _wave(t, r + t_delay, t_width, t_height)
    st = lambda level: _wave(t, r + 0.55 * t_delay, 0.22 * t_delay, level)  # noqa: E731  (between S and T)
    kinds = {
        "normal": p + conducted + st(st_level) + t_wave,
        "ventricular": _wave(t, r, wide, 1.2) - 1.3 * _wave(t, r + 0.8 * t_delay, t_width, t_height),
        "atrial": _wave(t, r - 9.0 * rate, p_width, -p_height) + conducted + st(st_level) + t_wave,
        "bundle_block": p + _wave(t, r - notch / 2, 1.6, 0.8) + _wave(t, r + notch / 2, 1.6, 0.9) - t_wave,
        "st_elevation": p + conducted + st(st_raised) + t_wave,
        "fibrillation": f_height * np.sin(2.0 * np.pi * f_freq * t[None] + f_phase) + conducted + st(st_level)
                        + t_wave,
    }
    x = amplitude * _of_label(kinds, HEARTBEATS, label)
    x = x + wander * np.sin(2.0 * np.pi * t[None] / wander_period + wander_phase)
    x = x + col(0.5 * noise, noise) * rng.normal(0.0, 1.0, x.shape)
    return write_dataset(
        out_path, consecutive_splits(x.astype(np.float32)[:, None], label, fractions), task="classification",
        num_classes=len(HEARTBEATS), name="heartbeats", target_names=HEARTBEATS,
        description=(f"1x{length} single heartbeats of {len(HEARTBEATS)} kinds at a random position, rate and "
                     f"amplitude, baseline wander, Gaussian noise sigma up to {noise:g} (seed {seed}); "
                     "bench/heldout.py"))


def permuted(generate, out_path: str | Path, name: str, **kwargs) -> DatasetInfo:
    """The set ``generate(**kwargs)`` writes, with the positions of every sample permuted by one fixed permutation
    (the same for every seed), written to ``out_path`` as ``name``: convolutions the wrong prior there."""
    with tempfile.TemporaryDirectory() as tmp:
        info = generate(Path(tmp) / "original.h5", **kwargs)
        _, arrays = load(info.path)
    perm = np.random.default_rng(0).permutation(info.sample_shape[-1])
    return write_dataset(out_path, {split: (x[..., perm], y) for split, (x, y) in arrays.items()}, task=info.task,
                         num_classes=info.num_classes, name=name, target_names=info.target_names,
                         description=info.description and info.description + "; positions permuted")


def pulses_permuted(out_path: str | Path, **kwargs) -> DatasetInfo:
    """`pulses` (its arguments) with the positions of every trace permuted by one fixed permutation."""
    return permuted(pulses, out_path, "pulses-permuted", **kwargs)


def heartbeats_permuted(out_path: str | Path, **kwargs) -> DatasetInfo:
    """`heartbeats` (its arguments) with the positions of every trace permuted by one fixed permutation."""
    return permuted(heartbeats, out_path, "heartbeats-permuted", **kwargs)
