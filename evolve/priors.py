"""The networks a careful practitioner writes first, fitted to the search space: the start of an evolution run.

A search that begins from random networks spends its first evaluations finding what an expert writes down in a
minute: for signals, images and volumes, stages of a residual block (or conv -> batch norm) and a pool, channels
growing as the input halves, wide kernels along sequences, a global average head, AdamW at a step that networks
with batch norm take (3e-3) on small batches; for a classifier of a small input, two residual stages that never
pool under a global max head (pools would blur a small pattern away; the max finds it anywhere); and an MLP on the
flattened input in case the layout is not what convolutions assume; for tabular data, two-layer MLPs.
Configuration search tools begin the same way: SMAC evaluates the default configuration first, auto-sklearn and
AutoGluon begin from a portfolio of known-good configurations. Evolution breeds from these and the random rest of
its initial population, so a run starts where the expert would and spends its budget improving on that; random
search stays purely random.

Every value comes from the ``[space]`` table (the channels, kernels, units, activations, norms, heads, optimizers and
batch sizes it lists; the learning rate and weight decay clipped into its ranges), so a user's space is respected.
Measured on bench/search.py's four datasets (validation score after one training, next to the best of a one-minute
evolution from random networks): signals 0.87 (0.84), shapes 0.96 (0.97), cosmoflow 0.94-0.96 (0.95), tabular 0.86
(0.93). The never-pooling one: shapes 0.974 against 0.959 for the first prior (five trainings each), signals 0.866
against 0.875 (three).
"""
from __future__ import annotations

import math

from .genome import Gene, Genome, make_gene
from .problem import Problem
from .space import SearchSpace, spatial_shape_after

__all__ = ["prior_genomes"]

# The training recipes, boldest first: Adam(W) steps for networks with batch norm, momentum SGD's should the space
# allow no Adam; batches small enough for many steps in a short training.
RECIPES = ((3e-3, 32), (1e-3, 64))
SGD_LR = 0.05
WEIGHT_DECAY = 1e-4
MLP_UNITS = 256  # the widest layer of a first MLP
MIN_SIDE = 4  # a stage pools only while the input's smallest side is at least this (then 2 or more after it)
KERNEL_1D = 9  # sequences want a wider view per layer than images do (3)
FULL_RES_POSITIONS = 4096  # inputs with at most this many positions also get a network that never pools


def _pick(values: tuple[int, ...], want: int) -> int:
    """The listed value nearest `want` on a log scale (the first of two as near)."""
    return min(values, key=lambda v: abs(math.log(v / want)))


def _clip(value: float, low: float, high: float) -> float:
    return min(max(value, low), high)


def _training(space: SearchSpace, head: str, lr: float, batch: int) -> dict:
    optimizer = next((o for o in ("adamw", "adam") if o in space.optimizers), space.optimizers[0])
    decay = 0.0 if space.weight_decay == (0.0, 0.0) else _clip(WEIGHT_DECAY, *space.weight_decay)
    return {"optimizer": optimizer, "lr": _clip(SGD_LR if optimizer == "sgd" else lr, *space.lr),
            "batch_size": _pick(space.batch_sizes, batch), "weight_decay": decay, "head": head}


def _act(space: SearchSpace) -> str:
    return "relu" if "relu" in space.activations else space.activations[0]


def _norm(space: SearchSpace) -> Gene:
    return make_gene("norm", kind="batch" if "batch" in space.norms else space.norms[0])


def _cnn(space: SearchSpace, problem: Problem, residual: bool, first: int, pools: bool = True) -> list[Gene]:
    """Stages of (conv, norm, pool) or (residual, pool), channels rising through the space's list from its
    `first` as the input halves, within space.max_layers. Without `pools`: two stages at full resolution."""
    choices = space.kernel_choices(problem)
    kernels = [k for k in choices if k <= KERNEL_1D] or [min(choices)]
    kernel = max(kernels) if problem.spatial_dims == 1 else _pick(choices, 3)
    channels = sorted(space.channels)
    has = set(space.layer_types)
    use_norm = "norm" in has and not residual  # a residual block has its own batch norms
    pool = pools and "pool" in has and 2 in space.pool_sizes
    op = "max" if "max" in space.pool_ops else space.pool_ops[0]
    shape = tuple(problem.spatial_shape)
    layers: list[Gene] = []
    stage = first
    while len(layers) + 1 + use_norm <= space.max_layers:
        fields = {"channels": channels[min(stage, len(channels) - 1)], "kernel": kernel, "act": _act(space)}
        layers.append(make_gene("residual", **fields) if residual else make_gene("conv", stride=1, **fields))
        if use_norm:
            layers.append(_norm(space))
        if not pools and stage == first:
            stage += 1
            continue
        if not pool or min(shape) < MIN_SIDE or len(layers) == space.max_layers:
            break
        layers.append(make_gene("pool", op=op, size=2))
        shape = spatial_shape_after(layers[-1], shape)
        stage += 1
    return layers


def _mlp(space: SearchSpace, width: int, act: str, norm: bool) -> list[Gene]:
    """Two dense layers (with batch norm after each where `norm`), within space.max_layers."""
    block = [make_gene("dense", units=width, act=act)]
    if norm and "norm" in space.layer_types:
        block.append(_norm(space))
    return (block * 2)[:space.max_layers]


def prior_genomes(space: SearchSpace, problem: Problem) -> list[Genome]:
    """The practitioner's first networks for this problem, best guess first; not yet checked against the space's
    parameter limit or repaired (the engine does that, and leaves out any that cannot build)."""
    has = set(space.layer_types)
    bold, bold_batch = RECIPES[0]
    widest = max((u for u in space.units if u <= MLP_UNITS), default=min(space.units))
    smooth = next((a for a in ("silu", "gelu") if a in space.activations), _act(space))
    if problem.spatial_dims == 0:
        if "dense" not in has:
            return []
        head = space.heads[0]
        return [Genome(layers=tuple(_mlp(space, widest, smooth, True)), **_training(space, head, bold, bold_batch)),
                Genome(layers=tuple(_mlp(space, _pick(space.units, MLP_UNITS // 2), _act(space), False)),
                       **_training(space, head, bold, bold_batch))]
    out = _cnns(space, problem)
    # Where the data's layout may not be what convolutions assume (positions permuted, channels that are features),
    # the practitioner's baseline is an MLP on the flattened input: last, and only where that vector is small.
    flat = problem.channels * math.prod(problem.spatial_shape)
    if (not problem.is_dense and "dense" in has and "flatten" in space.heads
            and flat <= space.max_flatten_features):
        out.append(Genome(layers=tuple(_mlp(space, widest, smooth, True)),
                          **_training(space, "flatten", bold, bold_batch)))
    return out


def _cnns(space: SearchSpace, problem: Problem) -> list[Genome]:
    """Residual, conv + batch norm, and residual again at the safer recipe, as far as the space has their layers.
    A classifier of a small input also gets two residual stages that never pool, under a global max head: a class
    told by a local pattern anywhere in the input (a shape in an image, a burst in a trace) is what a max over
    full-resolution features detects, and pools first blur a small input's pattern away."""
    has = set(space.layer_types)
    (bold, bold_batch), (safe, safe_batch) = RECIPES
    head = "avg" if "avg" in space.heads else space.heads[0]
    small = problem.is_classification and math.prod(problem.spatial_shape) <= FULL_RES_POSITIONS
    has_res, has_conv = "residual" in has, "conv" in has
    recipes = [(True, 0, True, head, bold, bold_batch)] * has_res  # (residual, first channel step, pools, ...)
    recipes += [(True, 1, False, "max", bold, bold_batch)] * (has_res and small and "max" in space.heads)
    recipes += [(False, 1, True, head, bold, bold_batch)] * has_conv
    recipes += [(True, 0, True, head, safe, safe_batch)] * has_res
    out = []
    for residual, first, pools, top, lr, batch in recipes:
        if layers := _cnn(space, problem, residual, first, pools):
            out.append(Genome(layers=tuple(layers), **_training(space, top, lr, batch)))
    return out
