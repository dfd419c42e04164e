"""Genome -> torch module, and the repair-or-reject check the master runs on every child before sending it.

The built model carries its own input (and, for regression, target) normalisation as buffers (evolve/normalize.py),
so a saved ``state_dict`` predicts in original units with no extra files. Networks for the dense tasks end in a
U-Net decoder (evolve/dense.py) instead of a head and dense part.
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import torch
from torch import nn

from .dense import Decoder, decoder_params, skip_points
from .errors import InvalidGenome
from .genome import DENSE_PART_TYPES, SPATIAL_TYPES, Gene, Genome, dense_start
from .normalize import BuiltNet, Normalized, set_normalization
from .problem import Problem
from .settings import load_function
from .space import SearchSpace, spatial_shape_after

__all__ = ["BuiltNet", "GenomeNet", "Normalized", "build_model", "check_genome", "count_params",
           "set_normalization"]

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
# check_genome is called for every child the master makes; most genomes are checked once, a few (repairs that
# land on the same genome) more often.
_CHECK_CACHE_SIZE = 4096


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
            _no_dense_part(genome.layers, split, problem)
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


def count_params(genome: Genome, problem: Problem, builder: str = "") -> int:
    """The trainable parameter count of the network `genome` describes for `problem`, by shape arithmetic alone
    (tens of microseconds: the master counts every candidate it sends). Raises InvalidGenome where GenomeNet would
    refuse to build: tests/test_genome.py checks both against built modules on thousands of random genomes. A
    user's `builder` network is built on the meta device and counted."""
    if builder:
        return sum(p.numel() for p in build_model(genome, problem, "meta", builder=builder).parameters())
    return _shape_count(genome, problem)


@functools.lru_cache(maxsize=_CHECK_CACHE_SIZE)  # the master counts each child twice: checking it, journalling it
def _shape_count(genome: Genome, problem: Problem) -> int:
    nd = problem.spatial_dims
    c, shape = problem.channels, tuple(problem.spatial_shape)
    split = genome.dense_start if nd > 0 else 0
    params = 0
    for i, gene in enumerate(genome.layers[:split]):
        if gene.type == "conv":
            out = gene["channels"]
            params += c * out * gene["kernel"] ** nd + out
            c = out
        elif gene.type == "residual":
            out, k = gene["channels"], gene["kernel"]
            params += c * out * k ** nd + out * out * k ** nd + 4 * out + (0 if c == out else c * out + 2 * out)
            c = out
        elif gene.type == "pool":
            if min(shape) < gene["size"]:
                raise InvalidGenome(f"layer {i} ({gene.describe()}) would shrink spatial size {list(shape)} below 1")
        elif gene.type == "norm":
            params += 2 * c
        elif gene.type != "dropout":
            raise InvalidGenome(f"layer {i} ({gene.describe()}) cannot come before the head")
        shape = spatial_shape_after(gene, shape)
    if problem.is_dense:
        _no_dense_part(genome.layers, split, problem)
        skips = [ch for _, ch in skip_points(genome.layers, problem.channels, tuple(problem.spatial_shape))]
        return params + decoder_params(skips, c, problem.num_outputs, nd)
    width = c * math.prod(shape) if nd > 0 and genome.head == "flatten" else c
    for i, gene in enumerate(genome.layers[split:], start=split):
        if gene.type not in DENSE_PART_TYPES:
            raise InvalidGenome(f"layer {i} ({gene.describe()}) needs spatial axes but comes after the head "
                                "(tabular input or after a dense layer)")
        if gene.type == "dense":
            params += width * gene["units"] + gene["units"]
            width = gene["units"]
        elif gene.type == "norm":
            params += 2 * width
    return params + width * problem.num_outputs + problem.num_outputs


def _no_dense_part(layers: Sequence[Gene], split: int, problem: Problem) -> None:
    """A network with an output per pixel ends in its decoder: a gene after the spatial part is invalid."""
    if split < len(layers):
        raise InvalidGenome(f"layer {split} ({layers[split].describe()}) has no place in a network with an output "
                            f"per pixel ({problem.task})")


def _head_features(channels: int, shape: Sequence[int], head: str) -> int:
    return channels * math.prod(shape) if head == "flatten" else channels


def _repair(genome: Genome, problem: Problem, space: SearchSpace) -> Genome:
    """Structural repair: spatial genes only where they can act, pools that fit, layer count within bounds."""
    nd = problem.spatial_dims
    layers = list(genome.layers)
    head = genome.head
    if problem.is_dense:  # the decoder is the head: dense genes have no place, the head gene is canonical
        layers = [g for g in layers if g.type != "dense"]
        head = space.heads[0]
    if nd == 0:
        layers = [g for g in layers if g.type not in SPATIAL_TYPES]
        head = space.heads[0]  # no head on tabular data: one canonical value, so no duplicate genomes
    else:
        split = dense_start(layers)
        spatial = []
        shape = tuple(problem.spatial_shape)
        for gene in layers[:split]:
            if gene.type == "pool" and min(shape) < gene["size"]:
                fitting = [s for s in space.pool_sizes if 2 <= s <= min(shape)]
                if not fitting:
                    continue  # drop: any pool here would shrink a spatial dim below 1
                gene = gene.replace(size=max(fitting))
            elif gene.type == "conv" and gene["stride"] > 1 and max(shape) <= 1:
                gene = gene.replace(stride=1)  # a stride on a 1-sized input does nothing
            spatial.append(gene)
            shape = spatial_shape_after(gene, shape)
        layers = spatial + [g for g in layers[split:] if g.type not in SPATIAL_TYPES]

    # Too many layers: drop regularisers first (latest first), then the last gene of the longer section.
    while len(layers) > space.max_layers:
        light = [i for i, g in enumerate(layers) if g.type in ("norm", "dropout")]
        if light:
            del layers[light[-1]]
            continue
        split = dense_start(layers)
        del layers[split - 1 if split > len(layers) - split else len(layers) - 1]
    if len(layers) < space.min_layers and problem.is_dense and "conv" in space.layer_types:
        kernel = 3 if 3 in space.kernels else space.kernels[0]
        filler = Gene("conv", channels=space.channels[len(space.channels) // 2], kernel=kernel, stride=1,
                      act=space.activations[0])
        layers += [filler] * (space.min_layers - len(layers))
    if len(layers) < space.min_layers:
        if "dense" not in space.layer_types or problem.is_dense:
            raise InvalidGenome(
                f"genome {genome.key} has {len(layers)} usable layers, fewer than space.min_layers={space.min_layers}"
            )
        filler = Gene("dense", units=space.units[len(space.units) // 2], act=space.activations[0])
        layers += [filler] * (space.min_layers - len(layers))

    if nd > 0 and head == "flatten" and not problem.is_dense:
        channels, shape = problem.channels, tuple(problem.spatial_shape)
        split = dense_start(layers)
        for gene in layers[:split]:
            if gene.type in ("conv", "residual"):
                channels = gene["channels"]
            shape = spatial_shape_after(gene, shape)
        if _head_features(channels, shape, head) > space.max_flatten_features:
            head = _pooling_head(space) or head
    loss = genome.loss if problem.task == "segmentation" else "ce"  # a gene of segmentation only
    if tuple(layers) == genome.layers and head == genome.head and loss == genome.loss:
        return genome  # most children need no repair: no new genome to make and validate
    return genome.replace(layers=tuple(layers), head=head, loss=loss)


def _pooling_head(space: SearchSpace) -> str | None:
    return next((h for h in ("avg", "max") if h in space.heads), None)


def _counted(genome: Genome, problem: Problem) -> int:
    try:
        return count_params(genome, problem)
    except InvalidGenome as e:
        raise InvalidGenome(f"genome {genome.key} ({genome.describe()}): {e}") from None


@functools.lru_cache(maxsize=_CHECK_CACHE_SIZE)
def _check_cached(genome: Genome, problem: Problem, space: SearchSpace) -> Genome:
    repaired = _repair(genome, problem, space)
    params = _counted(repaired, problem)
    if params > space.max_params and repaired.head == "flatten" and problem.spatial_dims > 0 and not problem.is_dense:
        pooled = _pooling_head(space)
        if pooled is not None:
            repaired = repaired.replace(head=pooled)
            params = _counted(repaired, problem)
    if params > space.max_params:
        raise InvalidGenome(
            f"genome {repaired.key} ({repaired.describe()}) has {params:,} parameters, "
            f"more than space.max_params={space.max_params:,}"
        )
    return repaired


def check_genome(genome: Genome, problem: Problem, space: SearchSpace) -> Genome:
    """Repair-or-reject a genome before it goes to a worker; returns the (possibly repaired) genome.

    Repairs: spatial genes dropped for tabular data and after a dense gene; pools that would shrink a spatial
    dim below 1 shrunk or dropped; useless strides removed; layer count clipped to the space; a flatten head
    whose vector is too large (or too many parameters) swapped for a pooling head. Then its shapes and
    parameters are worked out layer by layer (count_params). Raises :class:`InvalidGenome` if it still cannot
    build or has more than ``space.max_params`` parameters.
    """
    return _check_cached(genome, problem, space)
