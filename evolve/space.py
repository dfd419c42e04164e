"""Where the search may go: the ``[space]`` table of the config, and random sampling inside it.

Everything random here takes an explicit ``random.Random`` so that a run is reproducible from its seed.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, fields
from typing import Any, Mapping

from .errors import ConfigError
from .genome import (
    ACTIVATIONS,
    GENE_FIELDS,
    HEADS,
    LAYER_TYPES,
    MAX_DROPOUT,
    NORM_KINDS,
    OPTIMIZERS,
    POOL_OPS,
    SPATIAL_TYPES,
    Gene,
    Genome,
)
from .problem import Problem

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


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class SearchSpace:
    """The choices a genome may take; defaults suit small-to-medium scientific datasets.

    ``lr`` and ``weight_decay`` are log-uniform ranges ``[low, high]``; a genome gets no weight decay with
    probability ``zero_weight_decay_prob``. ``dropout`` is a uniform range. ``max_flatten_features`` bounds the
    vector a ``flatten`` head may produce (larger ones switch to a pooling head).
    """

    layer_types: tuple[str, ...] = LAYER_TYPES
    min_layers: int = 1
    max_layers: int = 10
    channels: tuple[int, ...] = (8, 16, 32, 64)
    kernels: tuple[int, ...] = (1, 3, 5)
    strides: tuple[int, ...] = (1, 2)
    pool_sizes: tuple[int, ...] = (2,)
    pool_ops: tuple[str, ...] = POOL_OPS
    units: tuple[int, ...] = (16, 32, 64, 128, 256)
    activations: tuple[str, ...] = ("relu", "gelu", "silu", "tanh")
    dropout: tuple[float, float] = (0.0, 0.5)
    norms: tuple[str, ...] = NORM_KINDS
    heads: tuple[str, ...] = HEADS
    optimizers: tuple[str, ...] = OPTIMIZERS
    lr: tuple[float, float] = (1e-4, 3e-2)
    batch_sizes: tuple[int, ...] = (32, 64, 128, 256)
    weight_decay: tuple[float, float] = (1e-6, 1e-2)
    zero_weight_decay_prob: float = 0.2
    max_params: int = 2_000_000
    max_flatten_features: int = 16384

    def __post_init__(self) -> None:
        # One validation path for both SearchSpace(...) and from_dict(): lists become tuples, bad values raise.
        self._set("layer_types", self._choices("layer_types", LAYER_TYPES))
        for name in ("min_layers", "max_layers", "max_params", "max_flatten_features"):
            value = getattr(self, name)
            low = 0 if name == "min_layers" else 1
            if not _is_int(value) or value < low:
                raise ConfigError(f"space.{name}: expected an integer >= {low}, got {value!r}")
        if self.max_layers < self.min_layers:
            raise ConfigError(
                f"space.max_layers: must be >= space.min_layers ({self.min_layers}), got {self.max_layers}"
            )
        for name in ("channels", "kernels", "strides", "pool_sizes", "units", "batch_sizes"):
            self._set(name, self._positive_ints(name))
        self._set("pool_ops", self._choices("pool_ops", POOL_OPS))
        self._set("activations", self._choices("activations", ACTIVATIONS))
        self._set("norms", self._choices("norms", NORM_KINDS))
        self._set("heads", self._choices("heads", HEADS))
        self._set("optimizers", self._choices("optimizers", OPTIMIZERS))
        self._set("dropout", self._range("dropout", 0.0, MAX_DROPOUT, log=False))
        self._set("lr", self._range("lr", 0.0, math.inf, log=True))
        wd = self.weight_decay
        if isinstance(wd, (list, tuple)) and len(wd) == 2 and all(_is_num(v) and v == 0 for v in wd):
            self._set("weight_decay", (0.0, 0.0))  # [0, 0]: never any weight decay
        else:
            self._set("weight_decay", self._range("weight_decay", 0.0, math.inf, log=True))
        p = self.zero_weight_decay_prob
        if not _is_num(p) or not 0.0 <= p <= 1.0:
            raise ConfigError(f"space.zero_weight_decay_prob: expected a probability in [0, 1], got {p!r}")
        self._set("zero_weight_decay_prob", float(p))

    # --- validation helpers ---
    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def _list(self, name: str, what: str) -> list:
        value = getattr(self, name)
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value:
            raise ConfigError(f"space.{name}: expected a non-empty list of {what}, got {value!r}")
        return list(value)

    def _positive_ints(self, name: str) -> tuple[int, ...]:
        values = self._list(name, "positive integers")
        if not all(_is_int(v) and v >= 1 for v in values):
            raise ConfigError(f"space.{name}: expected a non-empty list of positive integers, got {values!r}")
        return tuple(dict.fromkeys(values))

    def _choices(self, name: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
        what = "of " + ", ".join(allowed)
        values = self._list(name, what)
        bad = [v for v in values if v not in allowed]
        if bad:
            raise ConfigError(f"space.{name}: unknown value {bad[0]!r} (expected a non-empty list {what})")
        return tuple(dict.fromkeys(values))

    def _range(self, name: str, low: float, high: float, log: bool) -> tuple[float, float]:
        value = getattr(self, name)
        kind = "log-range" if log else "range"
        ok = isinstance(value, (list, tuple)) and len(value) == 2 and all(_is_num(v) for v in value)
        if ok:
            lo, hi = float(value[0]), float(value[1])
            ok = lo <= hi and (lo > low if log else lo >= low) and hi <= high
        if not ok:
            bound = "0 < low <= high" if log else f"{low} <= low <= high <= {high}"
            raise ConfigError(f"space.{name}: expected a {kind} [low, high] with {bound}, got {value!r}")
        return (lo, hi)

    # --- config round trip ---
    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "SearchSpace":
        """Build from the ``[space]`` TOML table; unknown keys and bad values raise ConfigError naming the key."""
        if d is not None and not isinstance(d, Mapping):
            raise ConfigError(f"space: expected a table, got {d!r}")
        d = dict(d or {})
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise ConfigError(f"space.{unknown[0]}: unknown key (known keys: {', '.join(known)})")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        """Plain TOML/JSON types (lists, not tuples)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    # --- sampling ---
    def section_types(self, problem: Problem, section: str) -> tuple[str, ...]:
        """Gene types allowed in a section for this problem (tabular problems have no conv/residual/pool)."""
        if section not in SECTIONS:
            raise ValueError(f"section must be one of {SECTIONS}, got {section!r}")
        allowed = _SECTION_TYPES[section]
        if problem.spatial_dims == 0:
            allowed = tuple(t for t in allowed if t not in SPATIAL_TYPES)
        return tuple(t for t in allowed if t in self.layer_types)

    def random_value(self, rng: random.Random, gene_type: str, field: str) -> Any:
        """A random value for one field of one gene type, from this space."""
        if field == "channels":
            return rng.choice(self.channels)
        if field == "kernel":
            return rng.choice(self.kernels)
        if field == "stride":
            return rng.choice(self.strides)
        if field == "size":
            return rng.choice(self.pool_sizes)
        if field == "units":
            return rng.choice(self.units)
        if field == "act":
            return rng.choice(self.activations)
        if field == "op":
            return rng.choice(self.pool_ops)
        if field == "kind":
            return rng.choice(self.norms)
        if field == "rate":
            return round(rng.uniform(*self.dropout), 2)
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
        values = {f: self.random_value(rng, gene_type, f) for f in GENE_FIELDS[gene_type]}
        if spatial_shape is not None:
            if gene_type == "pool":
                fitting = self._pool_sizes_fitting(spatial_shape)
                if fitting and values["size"] not in fitting:
                    values["size"] = rng.choice(fitting)
            elif gene_type == "conv" and max(spatial_shape) <= 1:
                values["stride"] = 1
        return Gene(gene_type, **values)

    def _pool_sizes_fitting(self, spatial_shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(s for s in self.pool_sizes if s <= min(spatial_shape))

    def random_lr(self, rng: random.Random) -> float:
        return _log_uniform(rng, *self.lr)

    def random_weight_decay(self, rng: random.Random) -> float:
        if self.weight_decay == (0.0, 0.0) or rng.random() < self.zero_weight_decay_prob:
            return 0.0
        return _log_uniform(rng, *self.weight_decay)

    def random_genome(self, rng: random.Random, problem: Problem) -> Genome:
        """A sensible random network: a spatial section (conv first) then a short dense section (dense first).

        Pools and strides are chosen to fit the shrinking input, so most samples need no repair; the engine still
        runs :func:`evolve.build.check_genome` on every genome.
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
        head = rng.choice(self.heads) if problem.spatial_dims > 0 else self.heads[0]
        return Genome(
            layers=tuple(layers),
            optimizer=rng.choice(self.optimizers),
            lr=self.random_lr(rng),
            batch_size=rng.choice(self.batch_sizes),
            weight_decay=self.random_weight_decay(rng),
            head=head,
        )


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

