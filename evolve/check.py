"""The master's repair-or-reject check of every genome before it goes to a worker, and its parameter count: shape
arithmetic alone, without torch, so that the starting command and rank 0 check genomes without importing it
(evolve/build.py builds the torch modules the same genomes describe; tests/test_genome.py holds the two together).
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

from .errors import InvalidGenome
from .genome import DENSE_PART_TYPES, SPATIAL_TYPES, Gene, Genome, dense_start
from .problem import Problem
from .settings import load_function
from .space import SearchSpace, spatial_shape_after

__all__ = ["check_genome", "count_params", "decoder_params", "skip_points"]

# check_genome is called for every child the master makes; most genomes are checked once, a few (repairs that
# land on the same genome) more often.
_CHECK_CACHE_SIZE = 4096
DECODER_KERNEL = 3  # the U-Net decoder's convolutions (evolve/dense.py)


def skip_points(genes: Sequence[Gene], channels: int, shape: tuple[int, ...]) -> list[tuple[int, int]]:
    """(index of the gene, channels entering it) for each spatial gene that changes the spatial size."""
    points = []
    for i, gene in enumerate(genes):
        after = spatial_shape_after(gene, shape)
        if after != shape:
            points.append((i, channels))
        if gene.type in ("conv", "residual"):
            channels = gene["channels"]
        shape = after
    return points


def decoder_params(skips: Sequence[int], channels: int, outputs: int, nd: int) -> int:
    """Parameters of evolve.dense.Decoder (what count_params adds for a dense problem)."""
    k = DECODER_KERNEL ** nd
    return sum((channels + c) * channels * k + channels for c in skips) + channels * outputs + outputs


def count_params(genome: Genome, problem: Problem, builder: str = "") -> int:
    """The trainable parameter count of the network `genome` describes for `problem`, by shape arithmetic alone
    (tens of microseconds: the master counts every candidate it sends). Raises InvalidGenome where GenomeNet would
    refuse to build: tests/test_genome.py checks both against built modules on thousands of random genomes. A
    user's `builder` network is built on the meta device and counted (the one case that imports torch)."""
    if builder:
        import torch

        with torch.device("meta"):
            net = load_function(builder, "train.builder")(genome, problem)
        return sum(p.numel() for p in net.parameters())
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
        no_dense_part(genome.layers, split, problem)
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


def no_dense_part(layers: Sequence[Gene], split: int, problem: Problem) -> None:
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
        kernels = space.kernel_choices(problem)
        kernel = 3 if 3 in kernels else kernels[0]
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
    shift = genome.shift if problem.shiftable else 0.0  # nothing to translate, or a target that would move too
    if tuple(layers) == genome.layers and head == genome.head and loss == genome.loss and shift == genome.shift:
        return genome  # most children need no repair: no new genome to make and validate
    return genome.replace(layers=tuple(layers), head=head, loss=loss, shift=shift)


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
