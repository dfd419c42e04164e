"""A CosmoFlow-like 3D regression dataset: recover the power spectrum of Gaussian random fields.

CosmoFlow regresses cosmological parameters from 3D dark-matter density cubes. Here each sample is a 1-channel
cube of a Gaussian random field with power spectrum ``P(k) = A * (k / k_pivot) ** -n`` and the targets are
``log10(A)`` and the spectral slope ``n``: the same kind of task (global parameters from 3D texture, where a
3D CNN with pooling does well), small enough to evolve networks for on a laptop CPU.

    python -m galapagos.examples.cosmoflow --out cosmoflow.h5 [--samples 1500] [--size 16] [--seed 0]
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from galapagos.datashare.format import DatasetInfo
from galapagos.datashare.write import consecutive_splits, write_dataset
from galapagos.examples.cli import generator_main

log = logging.getLogger(__name__)

LOG10_AMPLITUDE_RANGE = (-1.0, 1.0)
SLOPE_RANGE = (1.0, 3.0)
TARGET_NAMES = ("log10_amplitude", "spectral_slope")
_BATCH = 128  # fields per FFT batch: bounds memory, and is fixed so results do not depend on it


def _log_k(size: int) -> np.ndarray:
    """log(|k| / k_pivot) on the rfftn grid of a size**3 cube (k in cycles per box; k_pivot = size / 4)."""
    k1 = np.fft.fftfreq(size, d=1.0 / size)
    kz = np.fft.rfftfreq(size, d=1.0 / size)
    k = np.sqrt(k1[:, None, None] ** 2 + k1[None, :, None] ** 2 + kz[None, None, :] ** 2)
    k[0, 0, 0] = 1.0  # the mean (k = 0) is zeroed below
    return np.log(k / (size / 4.0))


def gaussian_fields(rng: np.random.Generator, log10_amplitude: np.ndarray, slope: np.ndarray, size: int
                    ) -> np.ndarray:
    """Zero-mean Gaussian random cubes (B, size, size, size) with P(k) = A (k/k_pivot)^-n, as float32.

    White noise is coloured in Fourier space by sqrt(P(k)); with numpy's FFT normalisation the field's
    variance is the mean of P over the grid's modes.
    """
    logk = _log_k(size)
    noise = rng.standard_normal((len(slope), size, size, size))
    modes = np.fft.rfftn(noise, axes=(1, 2, 3))
    log_sqrt_p = 0.5 * (np.log(10.0) * log10_amplitude[:, None, None, None] - slope[:, None, None, None] * logk)
    modes *= np.exp(log_sqrt_p)
    modes[:, 0, 0, 0] = 0.0
    return np.fft.irfftn(modes, s=(size, size, size), axes=(1, 2, 3)).astype(np.float32)


def draw_cubes(rng: np.random.Generator, samples: int, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`samples` cubes (samples, 1, size, size, size) float32 and the log10 A and n each was drawn with."""
    log_a = rng.uniform(*LOG10_AMPLITUDE_RANGE, size=samples)
    slope = rng.uniform(*SLOPE_RANGE, size=samples)
    x = np.empty((samples, 1, size, size, size), dtype=np.float32)
    for a in range(0, samples, _BATCH):
        b = min(samples, a + _BATCH)
        x[a:b, 0] = gaussian_fields(rng, log_a[a:b], slope[a:b], size)
    return x, log_a, slope


def generate(out_path: str | Path, *, samples: int = 1500, size: int = 16, seed: int = 0,
             fractions: tuple[float, float, float] = (0.7, 0.15, 0.15)) -> DatasetInfo:
    """Write the dataset (train/val/test) to ``out_path``; deterministic for a given seed and size."""
    if size < 4:
        raise ValueError(f"size must be at least 4, got {size}")
    x, log_a, slope = draw_cubes(np.random.default_rng(seed), samples, size)
    y = np.stack([log_a, slope], axis=1).astype(np.float32)

    splits = consecutive_splits(x, y, fractions)
    return write_dataset(
        out_path, splits, task="regression", name="cosmoflow-grf",
        description=(f"Gaussian random fields on a {size}^3 grid with P(k) = A (k/k_pivot)^-n, k_pivot = {size / 4:g} "
                     f"cycles/box; targets log10 A in {LOG10_AMPLITUDE_RANGE}, n in {SLOPE_RANGE} (seed {seed})"),
        target_names=TARGET_NAMES)


def main(argv: list[str] | None = None) -> None:
    generator_main(argv, "cosmoflow", __doc__, generate,
                   {"samples": (int, 1500, "number of cubes"), "size": (int, 16, "cube edge length in voxels")},
                   lambda info: f"regression, x {info.sample_shape} {info.x_dtype}, targets {', '.join(TARGET_NAMES)}")


if __name__ == "__main__":
    main()
