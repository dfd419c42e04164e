"""Genome -> torch module (the master's check of the same genomes, without torch, is evolve/check.py).

The built model carries its own input (and, for regression, target) normalisation as buffers (evolve/normalize.py),
so a saved ``state_dict`` predicts in original units with no extra files. Networks for the dense tasks end in a
U-Net decoder (evolve/dense.py) instead of a head and dense part.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .check import no_dense_part, skip_points
from .dense import Decoder
from .errors import InvalidGenome
from .genome import DENSE_PART_TYPES, Gene, Genome
from .normalize import BuiltNet, Normalized, set_normalization
from .problem import Problem
from .settings import load_function
from .space import spatial_shape_after

__all__ = ["BuiltNet", "GenomeNet", "Normalized", "build_model", "set_normalization"]

_ACTIVATIONS = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "tanh": nn.Tanh,
    "elu": nn.ELU,
    "leaky_relu": nn.LeakyReLU,
}
_CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
_BATCHNORM = {0: nn.BatchNorm1d, 1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}
_POOL = {("max", 1): nn.MaxPool1d, ("max", 2): nn.MaxPool2d, ("max", 3): nn.MaxPool3d,
         ("avg", 1): nn.AvgPool1d, ("avg", 2): nn.AvgPool2d, ("avg", 3): nn.AvgPool3d}


def _activation(name: str) -> nn.Module:
    return _ACTIVATIONS[name]()


def _group_count(channels: int) -> int:
    """GroupNorm groups: up to 8, each with at least 2 channels where possible (1 channel per group would
    normalise a pooled feature to zero)."""
    for g in (8, 4, 2):
        if channels % g == 0 and channels // g >= 2:
            return g
    return 1


def _norm(kind: str, channels: int, spatial_dims: int) -> nn.Module:
    if kind == "batch":
        return _BATCHNORM[spatial_dims](channels)
    return nn.GroupNorm(_group_count(channels), channels)


class ResidualBlock(nn.Module):
    """conv-BN-act-conv-BN plus a skip (1x1 conv + BN when the channel count changes), activation after the sum."""

    def __init__(self, in_channels: int, channels: int, kernel: int, act: str, spatial_dims: int) -> None:
        super().__init__()
        conv = _CONV[spatial_dims]
        bn = _BATCHNORM[spatial_dims]
        self.conv1 = conv(in_channels, channels, kernel, padding="same", bias=False)
        self.bn1 = bn(channels)
        self.act1 = _activation(act)
        self.conv2 = conv(channels, channels, kernel, padding="same", bias=False)
        self.bn2 = bn(channels)
        if in_channels == channels:
            self.skip: nn.Module = nn.Identity()
        else:
            self.skip = nn.Sequential(conv(in_channels, channels, 1, bias=False), bn(channels))
        self.act = _activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn2(self.conv2(self.act1(self.bn1(self.conv1(x)))))
        return self.act(y + self.skip(x))


class GlobalPool(nn.Module):
    """Global average or max over all spatial axes: (N, C, *spatial) -> (N, C)."""

    def __init__(self, op: str) -> None:
        super().__init__()
        self.op = op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(2)
        return x.mean(dim=2) if self.op == "avg" else x.amax(dim=2)

    def extra_repr(self) -> str:
        return self.op


class GenomeNet(Normalized):
    """The network a genome describes: normalise input -> spatial part -> head -> dense part -> output layer; for a
    dense problem: normalise input -> spatial part (the encoder) -> decoder with skips -> a 1x1 conv per pixel."""

    def __init__(self, genome: Genome, problem: Problem) -> None:
        super().__init__(problem)
        self.genome = genome
        nd = problem.spatial_dims
        channels, shape = problem.channels, tuple(problem.spatial_shape)
        split = genome.dense_start if nd > 0 else 0
        spatial_genes, dense_genes = genome.layers[:split], genome.layers[split:]

        features: list[nn.Module] = []
        for i, gene in enumerate(spatial_genes):
            features.append(self._spatial_layer(i, gene, channels, shape, nd))
            if gene.type in ("conv", "residual"):
                channels = gene["channels"]
            shape = spatial_shape_after(gene, shape)
        self.features = nn.Sequential(*features)
        self.decoder: Decoder | None = None
        if problem.is_dense:
            no_dense_part(genome.layers, split, problem)
            points = skip_points(spatial_genes, problem.channels, tuple(problem.spatial_shape))
            self.skip_at = frozenset(i for i, _ in points)
            self.decoder = Decoder([c for _, c in points], channels, problem.num_outputs, nd)
            return

        if nd == 0:
            self.head: nn.Module = nn.Identity()
            width = channels
        elif genome.head == "flatten":
            self.head = nn.Flatten(1)
            width = channels * math.prod(shape)
        else:
            self.head = GlobalPool(genome.head)
            width = channels

        dense: list[nn.Module] = []
        for i, gene in enumerate(dense_genes, start=split):
            if gene.type not in DENSE_PART_TYPES:
                raise InvalidGenome(
                    f"layer {i} ({gene.describe()}) needs spatial axes but comes after the head "
                    f"(tabular input or after a dense layer)"
                )
            if gene.type == "dense":
                dense += [nn.Linear(width, gene["units"]), _activation(gene["act"])]
                width = gene["units"]
            elif gene.type == "norm":
                dense.append(_norm(gene["kind"], width, 0))
            else:
                dense.append(nn.Dropout(gene["rate"]))
        dense.append(nn.Linear(width, problem.num_outputs))
        self.dense = nn.Sequential(*dense)

    @staticmethod
    def _spatial_layer(i: int, gene: Gene, channels: int, shape: tuple[int, ...], nd: int) -> nn.Module:
        if gene.type == "conv":
            k = gene["kernel"]
            return nn.Sequential(
                _CONV[nd](channels, gene["channels"], k, stride=gene["stride"], padding=k // 2),
                _activation(gene["act"]),
            )
        if gene.type == "residual":
            return ResidualBlock(channels, gene["channels"], gene["kernel"], gene["act"], nd)
        if gene.type == "pool":
            size = gene["size"]
            if min(shape) < size:
                raise InvalidGenome(
                    f"layer {i} ({gene.describe()}) would shrink spatial size {list(shape)} below 1"
                )
            return _POOL[(gene["op"], nd)](size)
        if gene.type == "norm":
            return _norm(gene["kind"], channels, nd)
        if gene.type == "dropout":
            return nn.Dropout(gene["rate"])
        raise InvalidGenome(f"layer {i} ({gene.describe()}) cannot come before the head")  # pragma: no cover

    def body(self, x: torch.Tensor) -> torch.Tensor:
        if self.decoder is None:
            return self.dense(self.head(self.features(x)))
        skips = []
        for i, layer in enumerate(self.features):
            if i in self.skip_at:
                skips.append(x)
            x = layer(x)
        return self.decoder(x, skips)


def build_model(genome: Genome, problem: Problem, device: torch.device | str | None = None, *,
                builder: str = "") -> Normalized:
    """The torch module for a genome; classification gives logits (N, classes), regression (N, T) in target units.
    With `builder` ("module:function", train.builder) the user's function makes the module from the genome.

    Raises :class:`InvalidGenome` when the genome does not fit the problem (e.g. conv genes for tabular data).
    """
    def make() -> Normalized:
        if not builder:
            return GenomeNet(genome, problem)
        return BuiltNet(load_function(builder, "train.builder")(genome, problem), problem)

    if device is None:
        return make()
    with torch.device(device):
        return make()
