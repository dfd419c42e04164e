"""A tabular regression dataset: a target made of feature interactions, among correlated and irrelevant features.

Each sample is a row of 24 features in mixed units (every column has its own scale and offset): 7 informative
ones, 2 noisy copies of informative ones, and 15 irrelevant ones. The target extends Friedman's benchmark
function #1 (``10 sin(pi x0 x1) + 20 (x2 - 0.5)^2 + 10 x3 + 5 x4``) with a sign-gated oscillation
``4 sin(2 pi x5) sign(x6 - 0.5)``, plus Gaussian noise. A linear model explains only part of it (R^2 near 0.55);
the products, the parabola and the gate need hidden layers of some width and depth, and the irrelevant columns
reward regularisation: a dataset on which architecture search has something to find.

    python -m galapagos.examples.tabular --out tabular.h5 [--samples 6000] [--noise 1.0] [--seed 0]
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from galapagos.datashare.format import DatasetInfo
from galapagos.datashare.write import consecutive_splits, write_dataset
from galapagos.examples.cli import generator_main

INFORMATIVE = 7
COPIES = 2  # noisy copies of x0 and x3
IRRELEVANT = 15
FEATURES = INFORMATIVE + COPIES + IRRELEVANT


def target(u: np.ndarray) -> np.ndarray:
    """The noise-free target from the informative features in [0, 1] (columns 0..6 of ``u``)."""
    return (10.0 * np.sin(np.pi * u[:, 0] * u[:, 1]) + 20.0 * (u[:, 2] - 0.5) ** 2 + 10.0 * u[:, 3]
            + 5.0 * u[:, 4] + 4.0 * np.sin(2.0 * np.pi * u[:, 5]) * np.sign(u[:, 6] - 0.5))


def generate(out_path: str | Path, *, samples: int = 6000, noise: float = 1.0, seed: int = 0,
             fractions: tuple[float, float, float] = (0.7, 0.15, 0.15)) -> DatasetInfo:
    """Write the dataset (train/val/test) to ``out_path``; deterministic for a given seed."""
    if samples < 10:
        raise ValueError(f"samples must be at least 10, got {samples}")
    rng = np.random.default_rng(seed)
    u = rng.uniform(0.0, 1.0, (samples, INFORMATIVE))
    copies = u[:, [0, 3]] + rng.normal(0.0, 0.1, (samples, COPIES))
    irrelevant = rng.uniform(0.0, 1.0, (samples, IRRELEVANT))
    y = (target(u) + rng.normal(0.0, noise, samples)).astype(np.float32)[:, None]
    columns = np.concatenate([u, copies, irrelevant], axis=1)[:, rng.permutation(FEATURES)]  # no telling order
    scale = 10.0 ** rng.uniform(-2.0, 3.0, FEATURES)  # mixed units: the network's input normalisation must cope
    offset = rng.normal(0.0, 1.0, FEATURES) * scale
    x = (columns * scale + offset).astype(np.float32)

    splits = consecutive_splits(x, y, fractions)
    return write_dataset(
        out_path, splits, task="regression", name="tabular",
        description=(f"{FEATURES} features in mixed units ({INFORMATIVE} informative, {COPIES} noisy copies, "
                     f"{IRRELEVANT} irrelevant); target: Friedman #1 plus a gated oscillation, Gaussian noise "
                     f"sigma {noise:g} (seed {seed})"),
        target_names=("y",))


def main(argv: list[str] | None = None) -> None:
    generator_main(argv, "tabular", __doc__, generate,
                   {"samples": (int, 6000, "number of rows"),
                    "noise": (float, 1.0, "Gaussian noise sigma of the target")},
                   lambda info: f"regression, x {info.sample_shape} {info.x_dtype}, target y")


if __name__ == "__main__":
    main()
