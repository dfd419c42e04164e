"""A 2D segmentation dataset: the shapes of examples/shapes.py, several per image, labelled pixel by pixel.

Each 16x16 single-channel image holds one to three shapes (disk, ring, horizontal bar, vertical bar, cross, two
blobs) at random places, sizes and brightness, in noise. Every pixel is labelled with the class of the shape that
covers it (1..6; a later shape covers an earlier one) or 0 for background; the anti-aliased edge pixels, half
covered, are unlabelled (``ignore_index`` 255), as VOC-style segmentation data marks object boundaries. Telling a
disk from a ring, or a bar from a cross, needs context around a pixel: an encoder-decoder has something to find.

    python -m galapagos.examples.shapes_seg --out shapes_seg.h5 [--samples 1500] [--size 16] [--noise 0.25] [--seed 0]
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from galapagos.datashare.format import DatasetInfo
from galapagos.datashare.write import consecutive_splits, write_dataset
from galapagos.examples.cli import generator_main
from galapagos.examples.shapes import CLASS_NAMES, _render

IGNORE = 255
MAX_SHAPES = 3
#: coverage between these two is an edge pixel: unlabelled
EDGE = (0.2, 0.8)


def generate(out_path: str | Path, *, samples: int = 1500, size: int = 16, noise: float = 0.25, seed: int = 0,
             fractions: tuple[float, float, float] = (0.7, 0.15, 0.15)) -> DatasetInfo:
    """Write the dataset (train/val/test) to ``out_path``; deterministic for a given seed."""
    if size < 12:
        raise ValueError(f"size must be at least 12 pixels, got {size}")
    rng = np.random.default_rng(seed)
    k = len(CLASS_NAMES)
    count = rng.integers(1, MAX_SHAPES + 1, samples)
    x = rng.normal(0.0, noise, (samples, size, size))
    y = np.zeros((samples, size, size), np.int64)
    for layer in range(MAX_SHAPES):  # every sample draws every layer, so the random stream ignores the counts
        label = rng.integers(0, k, samples)
        brightness = rng.uniform(0.5, 1.0, samples)[:, None, None]
        cover = _render(label, rng, size) * (count > layer)[:, None, None]
        x = x * (1 - cover) + cover * brightness  # the shape covers what is behind it, noise included
        y = np.where(cover >= EDGE[1], label[:, None, None] + 1, y)
        y = np.where((cover > EDGE[0]) & (cover < EDGE[1]), IGNORE, y)
    splits = consecutive_splits(x.astype(np.float32)[:, None], y, fractions)
    return write_dataset(
        out_path, splits, task="segmentation", num_classes=k + 1, ignore_index=IGNORE, name="shapes-seg",
        description=(f"{size}x{size} images of 1 to {MAX_SHAPES} of {k} shapes, labelled per pixel (0 background, "
                     f"{IGNORE} edges), Gaussian noise sigma {noise:g} (seed {seed})"),
        target_names=("background", *CLASS_NAMES))


def main(argv: list[str] | None = None) -> None:
    generator_main(argv, "shapes_seg", __doc__, generate,
                   {"samples": (int, 1500, "number of images"), "size": (int, 16, "image edge length in pixels"),
                    "noise": (float, 0.25, "Gaussian noise sigma")},
                   lambda info: f"segmentation, {info.num_classes} classes per pixel, x {info.sample_shape} "
                                f"{info.x_dtype}")


if __name__ == "__main__":
    main()
