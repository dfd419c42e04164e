"""A 2D image classification dataset of simple shapes at random places, sizes and brightness, in noise.

Six classes (disk, ring, horizontal bar, vertical bar, cross, two blobs) on 16x16 single-channel images. The
shapes move around the image, so translation-equivariant convolutions with pooling do well while a small
fully-connected network does clearly worse: a dataset on which architecture search has something to find.

    python -m galapagos.examples.shapes --out shapes.h5 [--samples 3000] [--noise 0.25] [--seed 0]
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from galapagos.datashare.format import DatasetInfo
from galapagos.datashare.write import consecutive_splits, write_dataset
from galapagos.examples.cli import generator_main

log = logging.getLogger(__name__)

CLASS_NAMES = ("disk", "ring", "horizontal_bar", "vertical_bar", "cross", "two_blobs")


def _soft(d: np.ndarray) -> np.ndarray:
    """Coverage of a pixel by a shape from its signed distance to the edge (a one-pixel anti-aliased edge)."""
    return np.clip(0.5 - d, 0.0, 1.0)


def _render(label: np.ndarray, rng: np.random.Generator, size: int) -> np.ndarray:
    """Noise-free images (N, size, size) in [0, 1] for the given labels."""
    n = len(label)
    s = size / 16.0  # shape sizes are defined for 16 pixels and scale with the image
    grid = np.arange(size, dtype=np.float64) + 0.5
    # every sample draws all parameters, so the stream of random numbers does not depend on the labels
    cx = rng.uniform(5.0 * s, size - 5.0 * s, n)[:, None, None]
    cy = rng.uniform(5.0 * s, size - 5.0 * s, n)[:, None, None]
    radius = rng.uniform(2.5 * s, 4.5 * s, n)[:, None, None]
    half_len = rng.uniform(3.0 * s, 5.0 * s, n)[:, None, None]
    half_width = rng.uniform(0.6 * s, 1.1 * s, n)[:, None, None]
    angle = rng.uniform(0.0, np.pi, n)[:, None, None]
    sep = rng.uniform(2.0 * s, 3.5 * s, n)[:, None, None]
    blob = rng.uniform(1.2 * s, 1.8 * s, n)[:, None, None]

    dx = grid[None, None, :] - cx
    dy = grid[None, :, None] - cy
    dist = np.hypot(dx, dy)
    hbar = np.maximum(np.abs(dx) - half_len, np.abs(dy) - half_width)
    vbar = np.maximum(np.abs(dy) - half_len, np.abs(dx) - half_width)
    ox, oy = sep * np.cos(angle), sep * np.sin(angle)
    blobs = np.minimum(np.hypot(dx - ox, dy - oy), np.hypot(dx + ox, dy + oy)) - blob
    sdf = np.stack([
        dist - radius,                       # disk
        np.abs(dist - radius) - half_width,  # ring
        hbar,                                # horizontal bar
        vbar,                                # vertical bar
        np.minimum(hbar, vbar),              # cross
        blobs,                               # two blobs
    ])
    return _soft(sdf[label, np.arange(n)])


def generate(out_path: str | Path, *, samples: int = 3000, size: int = 16, noise: float = 0.25, seed: int = 0,
             fractions: tuple[float, float, float] = (0.7, 0.15, 0.15)) -> DatasetInfo:
    """Write the dataset (train/val/test, balanced classes) to ``out_path``; deterministic for a given seed."""
    if size < 12:
        raise ValueError(f"size must be at least 12 pixels, got {size}")
    rng = np.random.default_rng(seed)
    k = len(CLASS_NAMES)
    label = rng.permutation(np.arange(samples) % k)
    brightness = rng.uniform(0.5, 1.0, samples)[:, None, None]
    x = _render(label, rng, size) * brightness + rng.normal(0.0, noise, (samples, size, size))
    x = x.astype(np.float32)[:, None]

    splits = consecutive_splits(x, label, fractions)
    return write_dataset(
        out_path, splits, task="classification", num_classes=k, name="shapes",
        description=(f"{size}x{size} images of {k} shapes at random position, size and brightness, "
                     f"Gaussian noise sigma {noise:g} (seed {seed})"),
        target_names=CLASS_NAMES)


def main(argv: list[str] | None = None) -> None:
    generator_main(argv, "shapes", __doc__, generate,
                   {"samples": (int, 3000, "number of images"), "size": (int, 16, "image edge length in pixels"),
                    "noise": (float, 0.25, "Gaussian noise sigma")},
                   lambda info: f"classification, {info.num_classes} classes, x {info.sample_shape} {info.x_dtype}")


if __name__ == "__main__":
    main()
