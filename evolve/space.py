"""Where the search may go: the ``[space]`` table of the config, and random sampling inside it.

Everything random here takes an explicit ``random.Random`` so that a run is reproducible from its seed.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError
from .genome import (ACTIVATIONS, GENE_FIELDS, HEADS, LAYER_TYPES, LOSSES, MAX_DROPOUT, MAX_SHIFT, NORM_KINDS,
                     OPTIMIZERS, POOL_OPS, SPATIAL_TYPES, Gene, Genome, make_gene)
from .problem import Problem
from .settings import Check, Table, is_int

__all__ = ["SearchSpace", "SECTIONS", "spatial_shape_after"]

#: "spatial": genes before the head (need spatial_dims > 0 for conv/residual/pool); "dense": genes after it.
SECTIONS = ("spatial", "dense")
_SECTION_TYPES = {
    "spatial": ("conv", "residual", "pool", "norm", "dropout"),
    "dense": ("dense", "norm", "dropout"),
}
# How often each gene type is drawn when a section grows: mostly compute layers, some regularisers.
_TYPE_WEIGHTS = {"conv": 3.0, "residual": 2.0, "pool": 1.5, "norm": 1.0, "dropout": 0.7, "dense": 3.0}
# The most genes a random network puts after the head.
_MAX_RANDOM_DENSE = 3
# `kernels = []` (the default) by the data's spatial dims: a sequence's patterns span more positions than an image's
# or a volume's, and a kernel of 9 costs along one axis what one of 3 costs in 2D.
KERNELS_BY_DIMS = {1: (1, 3, 5, 9)}
KERNELS = (1, 3, 5)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _positive_ints(values: tuple) -> bool:
    return bool(values) and all(is_int(v) and v >= 1 for v in values)


def _range_ok(value: tuple, low: float, high: float, log: bool) -> bool:
    if len(value) != 2 or not all(_is_num(v) for v in value):
        return False
    lo, hi = value
    return lo <= hi and (lo > low if log else lo >= low) and hi <= high


_INT_LISTS = ("channels", "strides", "pool_sizes", "units", "batch_sizes")
_POSITIVE_INTS = "a non-empty list of positive integers"
_LOG_RANGE = "a log-range [low, high] with 0 < low <= high"
# A gene's categorical field -> the space's list of its values (a convolution's kernel: kernel_choices).
_FIELD_LISTS = {"channels": "channels", "stride": "strides", "size": "pool_sizes", "units": "units",
                "act": "activations", "op": "pool_ops", "kind": "norms"}


@dataclass(frozen=True)
class SearchSpace(Table):
    """The choices a genome may take; defaults suit small-to-medium scientific datasets.

    ``lr`` and ``weight_decay`` are log-uniform ranges ``[low, high]``; a genome gets no weight decay with
    probability ``zero_weight_decay_prob`` (``weight_decay = [0, 0]``: never any). ``dropout`` is a uniform range.
    ``max_flatten_features`` bounds the vector a ``flatten`` head may produce (larger ones switch to a pooling head).
    ``kernels`` empty (the default) means (1, 3, 5, 9) along sequences and (1, 3, 5) on images and volumes
    (:meth:`kernel_choices`). ``shifts``: the random translations a genome may train with (the ``shift`` gene, a
    fraction of each spatial axis; 0 none), for classification and regression on spatial inputs only.
    """

    section = "space"
    choices = {"layer_types": LAYER_TYPES, "pool_ops": POOL_OPS, "activations": ACTIVATIONS, "norms": NORM_KINDS,
               "heads": HEADS, "optimizers": OPTIMIZERS, "losses": LOSSES}

    layer_types: tuple[str, ...] = LAYER_TYPES
    min_layers: int = 1
    max_layers: int = 10  # the most hidden layers a genome may have
    channels: tuple[int, ...] = (8, 16, 32, 64)  # filter counts a convolution may have
    kernels: tuple[int, ...] = ()
    strides: tuple[int, ...] = (1, 2)
    pool_sizes: tuple[int, ...] = (2,)
    pool_ops: tuple[str, ...] = POOL_OPS
    units: tuple[int, ...] = (16, 32, 64, 128, 256)  # widths a dense layer may have
    activations: tuple[str, ...] = ("relu", "gelu", "silu", "tanh")
    dropout: tuple[float, float] = (0.0, 0.5)
    norms: tuple[str, ...] = NORM_KINDS
    heads: tuple[str, ...] = HEADS
    optimizers: tuple[str, ...] = OPTIMIZERS
    losses: tuple[str, ...] = LOSSES  # segmentation only
    shifts: tuple[float, ...] = (0.0,)  # random translations to train with (fraction of each spatial axis; 0: none)
    lr: tuple[float, float] = (1e-4, 3e-2)
    batch_sizes: tuple[int, ...] = (32, 64, 128, 256)  # training batch sizes a genome may choose
    weight_decay: tuple[float, float] = (1e-6, 1e-2)
    zero_weight_decay_prob: float = 0.2
    max_params: int = 2_000_000  # a genome with more parameters is repaired (smaller) or never trained
    max_flatten_features: int = 16384

    def normalise(self) -> dict[str, Any]:
        # A value listed twice counts once (in lists of plain ints or strings: anything else fails its check).
        lists = {name: getattr(self, name) for name in (*self.choices, *_INT_LISTS, "kernels")}
        return {name: tuple(dict.fromkeys(v)) for name, v in lists.items()
                if isinstance(v, (list, tuple)) and all(is_int(x) or isinstance(x, str) for x in v)}

    def checks(self) -> list[Check]:
        wd = self.weight_decay
        no_decay = len(wd) == 2 and all(_is_num(v) and v == 0 for v in wd)
        return [
            ("min_layers", self.min_layers >= 0, "an integer >= 0"),
            ("max_layers", self.max_layers >= 1, "an integer >= 1"),
            ("max_params", self.max_params >= 1, "an integer >= 1"),
            ("max_flatten_features", self.max_flatten_features >= 1, "an integer >= 1"),
            ("max_layers", self.max_layers >= self.min_layers, f"an integer >= space.min_layers ({self.min_layers})"),
            *((name, _positive_ints(getattr(self, name)), _POSITIVE_INTS) for name in _INT_LISTS),
            ("kernels", not self.kernels or _positive_ints(self.kernels), f"{_POSITIVE_INTS}, or [] for the default"),
            ("dropout", _range_ok(self.dropout, 0.0, MAX_DROPOUT, log=False),
             f"a range [low, high] with 0.0 <= low <= high <= {MAX_DROPOUT}"),
            ("lr", _range_ok(self.lr, 0.0, math.inf, log=True), _LOG_RANGE),
            ("weight_decay", no_decay or _range_ok(wd, 0.0, math.inf, log=True), f"{_LOG_RANGE}, or [0, 0] for none"),
            ("zero_weight_decay_prob", 0.0 <= self.zero_weight_decay_prob <= 1.0, "a probability in [0, 1]"),
            ("shifts", len(self.shifts) > 0 and all(_is_num(v) and 0.0 <= v <= MAX_SHIFT for v in self.shifts),
             f"a non-empty list of fractions in [0, {MAX_SHIFT}]"),
        ]

    def kernel_choices(self, problem: Problem) -> tuple[int, ...]:
        """The kernel sizes a convolution may take: ``kernels``, or when it is empty the default for the data."""
        return self.kernels or KERNELS_BY_DIMS.get(problem.spatial_dims, KERNELS)

    def field_choices(self, problem: Problem, field: str) -> tuple:
        """The values a gene's categorical field (any but dropout's ``rate``) may take for this problem."""
        return self.kernel_choices(problem) if field == "kernel" else getattr(self, _FIELD_LISTS[field])

    def shift_choices(self, problem: Problem) -> tuple[float, ...]:
        """The ``shift`` genes a genome may have for this problem: ``shifts`` where it is shiftable, else none."""
        return self.shifts if problem.shiftable else (0.0,)

    # --- sampling ---
    def section_types(self, problem: Problem, section: str) -> tuple[str, ...]:
        """Gene types allowed in a section for this problem (tabular problems have no conv/residual/pool; dense
        problems, which end in a decoder, have no dense section)."""
        if section not in SECTIONS:
            raise ValueError(f"section must be one of {SECTIONS}, got {section!r}")
        if section == "dense" and problem.is_dense:
            return ()
        allowed = _SECTION_TYPES[section]
        if problem.spatial_dims == 0:
            allowed = tuple(t for t in allowed if t not in SPATIAL_TYPES)
        return tuple(t for t in allowed if t in self.layer_types)

    def random_value(self, rng: random.Random, problem: Problem, gene_type: str, field: str) -> Any:
        """A random value for one field of one gene type, from this space."""
        if field == "rate":
            return round(rng.uniform(*self.dropout), 2)
        if field == "kernel" or field in _FIELD_LISTS:
            return rng.choice(self.field_choices(problem, field))
        raise ValueError(f"unknown field {field!r} of gene type {gene_type!r}")

    def random_gene(
        self,
        rng: random.Random,
        problem: Problem,
        section: str,
        gene_type: str | None = None,
        spatial_shape: tuple[int, ...] | None = None,
    ) -> Gene:
        """A random gene for a section; with ``spatial_shape`` (the input size there) pools and strides fit it."""
        if gene_type is None:
            types = self.section_types(problem, section)
            if spatial_shape is not None and not self._pool_sizes_fitting(spatial_shape):
                types = tuple(t for t in types if t != "pool") or types
            if not types:
                raise ConfigError(
                    f"space.layer_types: no {section} gene type is allowed for a problem with "
                    f"{problem.spatial_dims} spatial dims (layer_types = {list(self.layer_types)})"
                )
            gene_type = rng.choices(types, weights=[_TYPE_WEIGHTS[t] for t in types])[0]
        values = {f: self.random_value(rng, problem, gene_type, f) for f in GENE_FIELDS[gene_type]}
        if spatial_shape is not None:
            if gene_type == "pool":
                fitting = self._pool_sizes_fitting(spatial_shape)
                if fitting and values["size"] not in fitting:
                    values["size"] = rng.choice(fitting)
            elif gene_type == "conv" and max(spatial_shape) <= 1:
                values["stride"] = 1
        return make_gene(gene_type, **values)

    def _pool_sizes_fitting(self, spatial_shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(s for s in self.pool_sizes if s <= min(spatial_shape))

    def random_lr(self, rng: random.Random, optimizer: str = "adam") -> float:
        """Log-uniform over ``lr``; for SGD over its upper half only. Momentum SGD needs steps about ten times Adam's
        (its step is the learning rate times the gradient, Adam's about the learning rate itself): in bench/search.py's
        random searches on signals and shapes, none of 85 SGD networks below the default range's geometric middle
        reached the top quartile, against 26 of 173 Adam(W) ones. Mutations still move it over the whole range."""
        low, high = self.lr
        return _log_uniform(rng, math.sqrt(low * high) if optimizer == "sgd" else low, high)

    def random_weight_decay(self, rng: random.Random) -> float:
        if self.weight_decay == (0.0, 0.0) or rng.random() < self.zero_weight_decay_prob:
            return 0.0
        return _log_uniform(rng, *self.weight_decay)

    def random_genome(self, rng: random.Random, problem: Problem) -> Genome:
        """A sensible random network: a spatial section (conv first) then a short dense section (dense first).

        Pools and strides are chosen to fit the shrinking input, so most samples need no repair; the engine still
        runs :func:`evolve.check.check_genome` on every genome.
        """
        n = rng.randint(self.min_layers, self.max_layers)
        spatial_types = self.section_types(problem, "spatial")
        dense_types = self.section_types(problem, "dense")
        if problem.spatial_dims == 0 or not spatial_types:
            n_dense, n_spatial = n, 0
        elif "dense" in dense_types:
            n_dense = rng.randint(0, min(_MAX_RANDOM_DENSE, n))
            n_spatial = n - n_dense
        else:
            n_dense, n_spatial = 0, n
        if n_dense and not dense_types:
            raise ConfigError(
                f"space.layer_types: no gene type usable for a tabular problem (layer_types = {list(self.layer_types)})"
            )
        layers: list[Gene] = []
        shape = tuple(problem.spatial_shape)
        for i in range(n_spatial):
            first = i == 0 and ("conv" in spatial_types or "residual" in spatial_types)
            gene_type = rng.choice([t for t in ("conv", "residual") if t in spatial_types]) if first else None
            gene = self.random_gene(rng, problem, "spatial", gene_type, spatial_shape=shape)
            layers.append(gene)
            shape = spatial_shape_after(gene, shape)
        for i in range(n_dense):
            gene_type = "dense" if i == 0 and "dense" in dense_types else None
            layers.append(self.random_gene(rng, problem, "dense", gene_type))
        head = rng.choice(self.heads) if problem.spatial_dims > 0 and not problem.is_dense else self.heads[0]
        optimizer = rng.choice(self.optimizers)
        return Genome(
            layers=tuple(layers),
            optimizer=optimizer,
            lr=self.random_lr(rng, optimizer),
            batch_size=rng.choice(self.batch_sizes),
            weight_decay=self.random_weight_decay(rng),
            head=head,
            loss=rng.choice(self.losses) if problem.task == "segmentation" else "ce",
            shift=_one_of(rng, self.shift_choices(problem)),
        )


def _one_of(rng: random.Random, values: tuple) -> Any:
    """A random one of ``values``, with no draw when there is one: a space without the choice draws as before."""
    return values[0] if len(values) == 1 else rng.choice(values)


def _log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def spatial_shape_after(gene: Gene, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Spatial size after a gene (conv pads kernel//2; residual keeps the size; pools use stride = size).

    Shared by sampling here and by repair in :mod:`evolve.build`, so both agree with the built model.
    """
    if gene.type == "conv":
        k, s = gene["kernel"], gene["stride"]
        return tuple((n + 2 * (k // 2) - k) // s + 1 for n in shape)
    if gene.type == "pool":
        return tuple(n // gene["size"] for n in shape)
    return shape

