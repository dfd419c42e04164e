"""The search benchmark's held-out datasets (issue 40): made for bench/search.py and never used for a tuning decision.

Two scientific sets unlike the bundled ones, written and committed before any run on them (bench/PROTOCOL.md):
- `spectra`: 1x256 spectra of eight kinds of source that differ by which emission and absorption lines they show,
  at which rest positions, widths and ratios, under a random redshift-like stretch, a drifting continuum and noise.
  The class is in the ratios of the lines' positions (a stretch keeps them) and strengths, not in where they are.
- `fields`: 1x32x32 periodic random fields of six kinds: three power-spectrum slopes, each Gaussian or lognormal
  (skewed), every field scaled to zero mean and unit variance, in white noise. The class is in global statistics
  (how power spreads over scales, the one-point distribution's skew), not in any local shape.
Their difficulty was set by reasoning alone (no network trained on them): per-sample line strengths down to about
one noise sigma, line ratios and slopes jittered towards the neighbouring class, noise that hides the small scales
where slopes differ most, skews as weak as a few tenths, so that no network should reach every sample.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from galapagos.datashare.format import DatasetInfo
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
