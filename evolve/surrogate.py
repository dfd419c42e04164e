"""Surrogate-assisted breeding (the idea of DeepHyper's centralized Bayesian optimisation, kept cheap): the engine
breeds several children per ask and hands out the one a model of the results so far predicts best
(``[evolution] surrogate``).

The model is a k-nearest-neighbour regression in a feature space of the genome (layer counts by type, widths,
kernels, pooling, dropout, optimiser, head, learning rate, batch size, weight decay, parameters), each feature
scaled by its spread over the points: no fitting, a prediction costs a pass over at most ``CAPACITY`` points, and it
follows a landscape of any shape as the results come in. Its points are the first trainings that finished (rung 0
with multi-fidelity: later rungs' scores are of longer trainings), the most recent ``CAPACITY``.
bench/landscape.py fits its simulated landscapes in the same feature space.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .genome import HEADS, LAYER_TYPES, OPTIMIZERS, Genome

__all__ = ["CAPACITY", "K", "Surrogate", "features"]

K = 7  # neighbours a prediction averages over
CAPACITY = 4096  # points kept, the most recent


def features(genome: Genome | dict[str, Any], params: int) -> list[float]:
    """A genome (or its JSON) with `params` parameters as numbers: per layer type its count, the log2 widths and
    the kernels summed, pooling and strides, dropout, and the training genes."""
    g = genome.to_json() if isinstance(genome, Genome) else genome
    layers = g.get("layers", [])
    out = [float(len(layers)), math.log10(max(params, 1))]
    out += [float(sum(layer["type"] == kind for layer in layers)) for kind in LAYER_TYPES]
    out.append(sum(math.log2(layer.get("channels", layer.get("units", 1))) for layer in layers))
    out.append(float(sum(layer.get("kernel", 0) for layer in layers)))
    out.append(sum(math.log2(layer.get("size", 1)) + math.log2(layer.get("stride", 1)) for layer in layers))
    out.append(float(sum(layer.get("rate", 0.0) for layer in layers)))
    out += [float(g.get("optimizer") == o) for o in OPTIMIZERS]
    out += [float(g.get("head") == h) for h in HEADS]
    out += [math.log10(g["lr"]), math.log2(g["batch_size"]), math.log10(g.get("weight_decay", 0.0) + 1e-6)]
    return out


def knn(points: np.ndarray, values: np.ndarray, scale: np.ndarray, x: list[float], k: int = K) -> np.ndarray:
    """The inverse-distance weighted mean of the values (one row per point, or one value) of the `k` points nearest
    `x`, features divided by `scale`."""
    d = np.sqrt((((points - np.asarray(x)) / scale) ** 2).sum(1))
    near = np.argpartition(d, min(k, len(d) - 1))[:k]
    w = 1.0 / (d[near] + 1e-3)
    return w @ values[near] / w.sum()


class Surrogate:
    """The predicted fitness of a genome from the finished first trainings told so far."""

    def __init__(self) -> None:
        self.points: np.ndarray | None = None  # CAPACITY x features, a ring
        self.values = np.zeros(CAPACITY)
        self.count = 0  # points added in all

    def add(self, genome: Genome, params: int, fitness: float) -> None:
        x = features(genome, params)
        if self.points is None:
            self.points = np.zeros((CAPACITY, len(x)))
        self.points[self.count % CAPACITY] = x
        self.values[self.count % CAPACITY] = fitness
        self.count += 1

    @property
    def ready(self) -> bool:
        """Enough points to predict from."""
        return self.count >= K

    def predict(self, genome: Genome, params: int) -> float:
        n = min(self.count, CAPACITY)
        points = self.points[:n]
        spread = points.std(0)
        return float(knn(points, self.values[:n], np.where(spread > 0, spread, 1.0), features(genome, params)))
