"""A CosmoFlow-like field-to-field regression: from a 3D density cube to its gravitational potential and its
smoothed density, voxel by voxel.

The input is a Gaussian random density contrast field delta (examples/cosmoflow.py's generator, with a random
amplitude and spectral slope per cube). The two target channels are the Newtonian potential phi, solving the
Poisson equation laplacian(phi) = delta on the periodic box (phi_k = -delta_k / k^2), and delta smoothed with a
Gaussian of width ``SMOOTHING`` voxels. The smoothing is local; the potential depends on the whole cube, so networks
that downsample and come back up (an encoder-decoder) do better than a few convolutions at full resolution.

    python -m galapagos.examples.cosmoflow_field --out cosmo_field.h5 [--samples 600] [--size 16] [--seed 0]
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from galapagos.datashare.format import DatasetInfo
from galapagos.datashare.write import consecutive_splits, write_dataset
from galapagos.examples.cli import generator_main
from galapagos.examples.cosmoflow import LOG10_AMPLITUDE_RANGE, SLOPE_RANGE, draw_cubes

TARGET_NAMES = ("potential", "smoothed_density")
SMOOTHING = 1.5  # voxels
_BATCH = 128


def targets(delta: np.ndarray) -> np.ndarray:
    """(B, 2, n, n, n) float32: the potential and the smoothed density of cubes (B, n, n, n), by FFT."""
    n = delta.shape[-1]
    k1 = 2 * np.pi * np.fft.fftfreq(n)
    kz = 2 * np.pi * np.fft.rfftfreq(n)
    k2 = k1[:, None, None] ** 2 + k1[None, :, None] ** 2 + kz[None, None, :] ** 2
    modes = np.fft.rfftn(delta, axes=(1, 2, 3))
    inv = np.where(k2 > 0, -1.0 / np.where(k2 > 0, k2, 1.0), 0.0)  # the mean of phi is free: set to 0
    phi = np.fft.irfftn(modes * inv, s=(n, n, n), axes=(1, 2, 3))
    smooth = np.fft.irfftn(modes * np.exp(-0.5 * k2 * SMOOTHING ** 2), s=(n, n, n), axes=(1, 2, 3))
    return np.stack([phi, smooth], axis=1).astype(np.float32)


def generate(out_path: str | Path, *, samples: int = 600, size: int = 16, seed: int = 0,
             fractions: tuple[float, float, float] = (0.7, 0.15, 0.15)) -> DatasetInfo:
    """Write the dataset (train/val/test) to ``out_path``; deterministic for a given seed and size."""
    if size < 4:
        raise ValueError(f"size must be at least 4, got {size}")
    x, _, _ = draw_cubes(np.random.default_rng(seed), samples, size)
    y = np.empty((samples, 2, size, size, size), dtype=np.float32)
    for a in range(0, samples, _BATCH):  # in batches: the FFTs work in float64
        y[a:a + _BATCH] = targets(x[a:a + _BATCH, 0].astype(np.float64))
    return write_dataset(
        out_path, consecutive_splits(x, y, fractions), task="field", name="cosmoflow-field",
        description=(f"Gaussian random density fields on a {size}^3 grid (log10 A in {LOG10_AMPLITUDE_RANGE}, n in "
                     f"{SLOPE_RANGE}); targets per voxel: Poisson potential, density smoothed over {SMOOTHING:g} "
                     f"voxels (seed {seed})"),
        target_names=TARGET_NAMES)


def main(argv: list[str] | None = None) -> None:
    generator_main(argv, "cosmoflow_field", __doc__, generate,
                   {"samples": (int, 600, "number of cubes"), "size": (int, 16, "cube edge length in voxels")},
                   lambda info: f"field, x {info.sample_shape} {info.x_dtype}, targets per voxel "
                                f"{', '.join(TARGET_NAMES)}")


if __name__ == "__main__":
    main()
