"""A 1D signal classification dataset: ten kinds of short waveform bursts at random places in long noisy traces.

Each sample is a single-channel trace of 128 points holding one burst (a windowed sine of low or high frequency,
a rising or falling chirp, a square or sawtooth wave, a bump, a biphasic spike, a double pulse or a ringing
onset) of random width, position, phase and amplitude, on a slow random baseline in white noise. The class is
in the burst's local shape, not in where it is, so translation-equivariant 1D convolutions with pooling do well
while a fully-connected network on the raw trace must learn every position separately: a dataset on which
architecture search has something to find.

    python -m galapagos.examples.signals --out signals.h5 [--samples 4000] [--length 128] [--noise 0.3] [--seed 0]
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from galapagos.datashare.format import DatasetInfo
from galapagos.datashare.write import consecutive_splits, write_dataset
from galapagos.examples.cli import generator_main

CLASS_NAMES = ("sine_low", "sine_high", "chirp_up", "chirp_down", "square", "sawtooth", "bump", "biphasic",
               "double_pulse", "ringing")


def _bursts(label: np.ndarray, u: np.ndarray, phase: np.ndarray) -> np.ndarray:
    """Each class's waveform at local time ``u`` in [-0.5, 0.5] across its burst (before the window)."""
    v = u + 0.5  # 0 -> 1 across the burst
    two_pi = 2.0 * np.pi
    waves = np.stack([
        np.sin(two_pi * 2.0 * u + phase),                   # sine, 2 cycles
        np.sin(two_pi * 5.0 * u + phase),                   # sine, 5 cycles
        np.sin(two_pi * (1.5 * v + 2.5 * v * v) + phase),   # chirp up: 1.5 -> 6.5 cycles per burst
        np.sin(two_pi * (6.5 * v - 2.5 * v * v) + phase),   # chirp down: 6.5 -> 1.5
        np.sign(np.sin(two_pi * 3.0 * u + phase)),          # square, 3 cycles
        2.0 * ((3.0 * v + phase / two_pi) % 1.0) - 1.0,     # sawtooth, 3 cycles
        np.ones_like(u),                                    # bump: the window alone
        -np.sin(two_pi * u) * 1.5,                          # biphasic: down then up
        np.exp(-((np.abs(u) - 0.25) / 0.07) ** 2) * 1.5,    # two short pulses
        np.exp(-4.0 * v) * np.sin(two_pi * 4.0 * v) * 2.0,  # ringing from a sharp onset
    ])
    return waves[label, np.arange(len(label))]


def generate(out_path: str | Path, *, samples: int = 4000, length: int = 128, noise: float = 0.3, seed: int = 0,
             fractions: tuple[float, float, float] = (0.7, 0.15, 0.15)) -> DatasetInfo:
    """Write the dataset (train/val/test, balanced classes) to ``out_path``; deterministic for a given seed."""
    if length < 64:
        raise ValueError(f"length must be at least 64 points, got {length}")
    rng = np.random.default_rng(seed)
    k = len(CLASS_NAMES)
    label = rng.permutation(np.arange(samples) % k)
    # every sample draws all parameters, so the stream of random numbers does not depend on the labels
    width = rng.uniform(0.2, 0.35, samples)[:, None] * length
    centre = rng.uniform(0.0, 1.0, samples)[:, None] * (length - width) + width / 2
    phase = rng.uniform(0.0, 2.0 * np.pi, samples)[:, None]
    amplitude = rng.uniform(0.7, 1.3, samples)[:, None]
    drift_freq = rng.uniform(0.2, 1.0, samples)[:, None]  # cycles per trace: slower than any burst
    drift = rng.uniform(0.0, 0.6, samples)[:, None] * np.sin(
        2.0 * np.pi * drift_freq * np.arange(length) / length + rng.uniform(0.0, 2.0 * np.pi, samples)[:, None])

    u = (np.arange(length) + 0.5 - centre) / width
    window = np.where(np.abs(u) < 0.5, np.cos(np.pi * u) ** 2, 0.0)
    x = amplitude * window * _bursts(label, np.clip(u, -0.5, 0.5), phase) + drift
    x = (x + rng.normal(0.0, noise, x.shape)).astype(np.float32)[:, None]

    splits = consecutive_splits(x, label, fractions)
    return write_dataset(
        out_path, splits, task="classification", num_classes=k, name="signals",
        description=(f"1x{length} traces with one burst of {k} kinds at random position, width, phase and amplitude, "
                     f"slow baseline drift, Gaussian noise sigma {noise:g} (seed {seed})"),
        target_names=CLASS_NAMES)


def main(argv: list[str] | None = None) -> None:
    generator_main(argv, "signals", __doc__, generate,
                   {"samples": (int, 4000, "number of traces"), "length": (int, 128, "points per trace"),
                    "noise": (float, 0.3, "Gaussian noise sigma")},
                   lambda info: f"classification, {info.num_classes} classes, x {info.sample_shape} {info.x_dtype}")


if __name__ == "__main__":
    main()
