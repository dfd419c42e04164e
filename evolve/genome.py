"""What a network is: an immutable, hashable genome of layer genes plus training genes.

A genome is a flat stack of layer genes followed by training genes. The stack has two parts: the *spatial part*
(every gene before the first ``dense`` gene) works on ``(N, C, *spatial)`` tensors; the *head* (``avg``, ``max``
or ``flatten``) turns it into a vector; the *dense part* (from the first ``dense`` gene on) works on ``(N, F)``.
For tabular problems there is no spatial part: every gene works on features.

Genes are :class:`Gene` objects: immutable mappings, so ``gene["type"]``, ``gene["channels"]``, ``gene.type``,
``gene.channels``, ``dict(gene)`` and ``gene.get("stride")`` all work; ``gene.replace(channels=64)`` makes a
changed copy.

Floats are made canonical on construction (lr and weight decay to 3 significant digits, dropout rate to 2
decimals) so that the same network always has the same :attr:`Genome.key`, in any process and any Python run.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from .errors import InvalidGenome
from .settings import is_int

__all__ = [
    "ACTIVATIONS",
    "DENSE_PART_TYPES",
    "GENE_FIELDS",
    "Gene",
    "make_gene",
    "Genome",
    "HEADS",
    "LAYER_TYPES",
    "LOSSES",
    "MAX_SHIFT",
    "NORM_KINDS",
    "OPTIMIZERS",
    "OPTIONAL_GENES",
    "POOL_OPS",
    "SPATIAL_TYPES",
    "TRAINING_GENES",
    "dense_start",
]

ACTIVATIONS = ("relu", "gelu", "silu", "tanh", "elu", "leaky_relu")
OPTIMIZERS = ("adam", "adamw", "sgd")
HEADS = ("avg", "max", "flatten")
POOL_OPS = ("max", "avg")
NORM_KINDS = ("batch", "group")
#: segmentation losses: cross-entropy, cross-entropy weighted by inverse class frequency, soft Dice
LOSSES = ("ce", "weighted_ce", "dice")
MAX_DROPOUT = 0.9
MAX_SHIFT = 0.5  # the farthest a training sample may be translated, as a fraction of each spatial axis

#: Fields of each layer gene type, in display order.
GENE_FIELDS: dict[str, tuple[str, ...]] = {
    "conv": ("channels", "kernel", "stride", "act"),
    "residual": ("channels", "kernel", "act"),
    "pool": ("op", "size"),
    "norm": ("kind",),
    "dropout": ("rate",),
    "dense": ("units", "act"),
}
LAYER_TYPES = tuple(GENE_FIELDS)
#: Genes that need spatial axes (only in the spatial part of a problem with spatial_dims > 0).
SPATIAL_TYPES = frozenset({"conv", "residual", "pool"})
#: Genes allowed after the head.
DENSE_PART_TYPES = frozenset({"dense", "norm", "dropout"})
TRAINING_GENES = ("optimizer", "lr", "batch_size", "weight_decay", "head")
OPTIONAL_GENES = ("loss", "shift")  # training genes a genome's JSON holds only when they are not their default


def _as_int(where: str, value: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not is_int(value) or value < 1:
        raise InvalidGenome(f"{where}: expected a positive integer, got {value!r}")
    return int(value)


def _as_choice(where: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise InvalidGenome(f"{where}: expected one of {', '.join(choices)}, got {value!r}")
    return str(value)


def _as_float(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidGenome(f"{where}: expected a finite number, got {value!r}")
    return float(value)


def round_sig(x: float, digits: int = 3) -> float:
    """Round to ``digits`` significant digits; the canonical form of log-scale genes."""
    return float(f"{x:.{digits}g}") if x != 0 else 0.0


def _check_field(gene_type: str, name: str, value: Any, where: str) -> Any:
    where = f"{where}.{name}"
    if name in ("channels", "kernel", "stride", "size", "units"):
        return _as_int(where, value)
    if name == "act":
        return _as_choice(where, value, ACTIVATIONS)
    if name == "op":
        return _as_choice(where, value, POOL_OPS)
    if name == "kind":
        return _as_choice(where, value, NORM_KINDS)
    if name == "rate":
        rate = round(_as_float(where, value), 2)
        if not 0.0 <= rate <= MAX_DROPOUT:
            raise InvalidGenome(f"{where}: expected a dropout rate in [0, {MAX_DROPOUT}], got {value!r}")
        return rate + 0.0  # no -0.0
    raise AssertionError(name)  # pragma: no cover - GENE_FIELDS and this function go together


class Gene(Mapping):
    """One layer: an immutable mapping with a ``type`` key and that type's fields (see :data:`GENE_FIELDS`)."""

    __slots__ = ("_type", "_fields", "_hash", "_canonical")

    def __init__(self, type: str, _where: str = "gene", **fields: Any) -> None:
        if type not in GENE_FIELDS:
            raise InvalidGenome(f"{_where}: unknown gene type {type!r} (expected one of {', '.join(LAYER_TYPES)})")
        expected = GENE_FIELDS[type]
        missing = [f for f in expected if f not in fields]
        if missing:
            raise InvalidGenome(f"{_where} ({type}): missing field {missing[0]!r} "
                                f"(a {type} gene has {', '.join(expected)})")
        extra = sorted(set(fields) - set(expected))
        if extra:
            raise InvalidGenome(f"{_where} ({type}): unknown field {extra[0]!r} "
                                f"(a {type} gene has {', '.join(expected)})")
        values = tuple((f, _check_field(type, f, fields[f], _where)) for f in expected)
        object.__setattr__(self, "_type", type)
        object.__setattr__(self, "_fields", values)
        object.__setattr__(self, "_hash", hash((type, values)))
        object.__setattr__(self, "_canonical", None)

    # --- mapping protocol: gene["type"], gene["channels"], dict(gene) ---
    def __getitem__(self, key: str) -> Any:
        if key == "type":
            return self._type
        for name, value in self._fields:
            if name == key:
                return value
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        yield "type"
        for name, _ in self._fields:
            yield name

    def __len__(self) -> int:
        return 1 + len(self._fields)

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: expose fields as attributes (gene.channels).
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"{self._type} gene has no field {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"Gene is immutable; use gene.replace({name}=...)")

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError("Gene is immutable")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Gene):
            return self._type == other._type and self._fields == other._fields
        return NotImplemented

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):
        return (_interned, (self._type, self._fields))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._fields)
        return f"Gene({self._type!r}, {inner})"

    @property
    def type(self) -> str:
        return self._type

    @property
    def fields(self) -> dict[str, Any]:
        """The type's fields without ``type``."""
        return dict(self._fields)

    def replace(self, **changes: Any) -> "Gene":
        return make_gene(self._type, **{**dict(self._fields), **changes})

    def to_json(self) -> dict[str, Any]:
        return {"type": self._type, **dict(self._fields)}

    def canonical(self) -> str:
        """The gene's JSON with sorted keys and no spaces (made once): its part of the genome's key."""
        if self._canonical is None:
            object.__setattr__(self, "_canonical", _canonical_json(self.to_json()))
        return self._canonical

    @classmethod
    def from_json(cls, d: Any, where: str = "gene") -> "Gene":
        if isinstance(d, Gene):
            return d
        if not isinstance(d, Mapping):
            raise InvalidGenome(f"{where}: expected a JSON object, got {d!r}")
        if "type" not in d:
            raise InvalidGenome(f"{where}: missing field 'type'")
        fields = {k: v for k, v in d.items() if k != "type"}
        return cls(d["type"], _where=where, **fields)

    def describe(self) -> str:
        f = dict(self._fields)
        t = self._type
        if t == "conv":
            return f"conv{f['channels']}k{f['kernel']}s{f['stride']}-{f['act']}"
        if t == "residual":
            return f"res{f['channels']}k{f['kernel']}-{f['act']}"
        if t == "pool":
            return f"pool-{f['op']}{f['size']}"
        if t == "norm":
            return f"norm-{f['kind']}"
        if t == "dropout":
            return f"drop{f['rate']:g}"
        return f"dense{f['units']}-{f['act']}"


_canonical_json = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode


def make_gene(type: str, **fields: Any) -> Gene:
    """``Gene(type, **fields)``, the same object for the same values: the space of genes is small and breeding
    (and unpickling every task's genome) makes the same ones over and over (bench/scale.py)."""
    try:
        return _interned(type, tuple(fields.items()))
    except TypeError:  # a value that cannot be hashed: Gene says what is wrong with it
        return Gene(type, **fields)


@functools.lru_cache(maxsize=4096)
def _interned(type: str, items: tuple) -> Gene:
    return Gene(type, **dict(items))


def _fmt_float(x: float) -> str:
    """Short human form: 0.001 -> 1e-3, 0.000316 -> 3.16e-4, 0 -> 0."""
    if x == 0:
        return "0"
    mantissa, exp = f"{x:.2e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exp)}"


def dense_start(layers: Sequence[Gene]) -> int:
    """Index of the first dense gene in `layers` (their length if none)."""
    return next((i for i, gene in enumerate(layers) if gene.type == "dense"), len(layers))


@dataclass(frozen=True, eq=False)
class Genome:
    """A network hyper-architecture and how to train it; equal and hashed by :attr:`key`."""

    layers: tuple[Gene, ...] = ()
    optimizer: str = "adam"
    lr: float = 1e-3
    batch_size: int = 64
    weight_decay: float = 0.0
    head: str = "avg"
    loss: str = "ce"  # a training gene of segmentation only; in the JSON (and the key) only when not "ce"
    shift: float = 0.0  # how far each training sample is translated at random (fraction of each spatial axis, edge
    # values repeated): a training gene of classification and regression on spatial inputs; in the JSON only when > 0

    def __post_init__(self) -> None:
        layers = self.layers
        if isinstance(layers, (str, bytes, Mapping)) or not hasattr(layers, "__iter__"):
            raise InvalidGenome(f"genome.layers: expected a list of genes, got {layers!r}")
        genes = tuple(Gene.from_json(g, where=f"genome.layers[{i}]") for i, g in enumerate(layers))
        object.__setattr__(self, "layers", genes)
        object.__setattr__(self, "optimizer", _as_choice("genome.optimizer", self.optimizer, OPTIMIZERS))
        lr = _as_float("genome.lr", self.lr)
        if lr <= 0:
            raise InvalidGenome(f"genome.lr: expected a positive number, got {self.lr!r}")
        object.__setattr__(self, "lr", round_sig(lr))
        object.__setattr__(self, "batch_size", _as_int("genome.batch_size", self.batch_size))
        wd = _as_float("genome.weight_decay", self.weight_decay)
        if wd < 0:
            raise InvalidGenome(f"genome.weight_decay: expected a number >= 0, got {self.weight_decay!r}")
        object.__setattr__(self, "weight_decay", round_sig(wd) + 0.0)
        object.__setattr__(self, "head", _as_choice("genome.head", self.head, HEADS))
        object.__setattr__(self, "loss", _as_choice("genome.loss", self.loss, LOSSES))
        shift = round(_as_float("genome.shift", self.shift), 3)
        if not 0.0 <= shift <= MAX_SHIFT:
            raise InvalidGenome(f"genome.shift: expected a fraction in [0, {MAX_SHIFT}], got {self.shift!r}")
        object.__setattr__(self, "shift", shift + 0.0)

    # --- identity ---
    @property
    def key(self) -> str:
        """16 hex chars of sha256 over the canonical JSON (:meth:`canonical`): the genome's identity for
        deduplication and files. Made when first asked for: breeding makes several genomes per child that nobody
        asks the key of (bench/scale.py)."""
        key = self.__dict__.get("_key")
        if key is None:
            key = hashlib.sha256(self.canonical().encode("utf-8")).hexdigest()[:16]
            object.__setattr__(self, "_key", key)
        return key

    def canonical(self) -> str:
        """:meth:`to_json` as JSON text with sorted keys and no spaces, made once from the genes' own: what the
        key hashes, and how a genome travels in a task and is written in the journal."""
        text = self.__dict__.get("_canonical")
        if text is None:
            c = _canonical_json
            layers = ",".join(g.canonical() for g in self.layers)
            loss = "" if self.loss == "ce" else f'"loss":{c(self.loss)},'
            shift = "" if not self.shift else f',"shift":{c(self.shift)}'
            text = (f'{{"batch_size":{c(self.batch_size)},"head":{c(self.head)},"layers":[{layers}],{loss}'
                    f'"lr":{c(self.lr)},"optimizer":{c(self.optimizer)}{shift},"weight_decay":{c(self.weight_decay)}}}')
            object.__setattr__(self, "_canonical", text)
        return text

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Genome):
            return self.key == other.key
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.key)

    # --- structure ---
    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def dense_start(self) -> int:
        """Index of the first dense gene (``num_layers`` if none): where the head sits for spatial problems."""
        return dense_start(self.layers)

    def sections(self) -> tuple[tuple[Gene, ...], tuple[Gene, ...]]:
        """(genes before the first dense gene, genes from it on)."""
        i = self.dense_start
        return self.layers[:i], self.layers[i:]

    def replace(self, **changes: Any) -> "Genome":
        return dataclasses.replace(self, **changes)

    # --- serialisation ---
    def to_json(self) -> dict[str, Any]:
        d = {
            "layers": [g.to_json() for g in self.layers],
            "optimizer": self.optimizer,
            "lr": self.lr,
            "batch_size": self.batch_size,
            "weight_decay": self.weight_decay,
            "head": self.head,
        }
        if self.loss != "ce":
            d["loss"] = self.loss
        if self.shift:
            d["shift"] = self.shift
        return d

    @classmethod
    def from_json(cls, d: Any) -> "Genome":
        """Parse :meth:`to_json` output (or its JSON text; a Genome is returned as it is); every problem raises
        :class:`InvalidGenome`."""
        if isinstance(d, Genome):
            return d
        if isinstance(d, (str, bytes)):
            try:
                d = json.loads(d)
            except ValueError as e:
                raise InvalidGenome(f"genome: not valid JSON ({e})") from None
        if not isinstance(d, Mapping):
            raise InvalidGenome(f"genome: expected a JSON object, got {type(d).__name__}")
        known = ("layers",) + TRAINING_GENES
        missing = [k for k in known if k not in d]
        if missing:
            raise InvalidGenome(f"genome: missing field {missing[0]!r}")
        extra = sorted(set(d) - set(known) - set(OPTIONAL_GENES))
        if extra:
            raise InvalidGenome(f"genome: unknown field {extra[0]!r} (expected {', '.join(known + OPTIONAL_GENES)})")
        if not isinstance(d["layers"], (list, tuple)):
            raise InvalidGenome(f"genome.layers: expected a list of genes, got {d['layers']!r}")
        return cls(**{k: d[k] for k in known}, **{k: d[k] for k in OPTIONAL_GENES if k in d})

    def describe(self, spatial: bool | None = None) -> str:
        """One line, e.g. ``conv32k3s1-relu > pool-max2 > avg > dense128-gelu | adam lr=1e-3 bs=64 wd=1e-5``.

        The head is shown where it acts (before the first dense gene) when the network is spatial; pass
        ``spatial`` (``problem.spatial_dims > 0``) to say so, otherwise it is inferred from the genes.
        """
        if spatial is None:
            spatial = any(g.type in SPATIAL_TYPES for g in self.layers)
        parts = [g.describe() for g in self.layers]
        if spatial:
            parts.insert(self.dense_start, self.head)
        arch = " > ".join(parts) if parts else "(no layers)"
        return (
            f"{arch} | {self.optimizer} lr={_fmt_float(self.lr)} bs={self.batch_size} "
            f"wd={_fmt_float(self.weight_decay)}" + ("" if self.loss == "ce" else f" loss={self.loss}")
            + (f" shift={self.shift:g}" if self.shift else "")
        )

    def __repr__(self) -> str:
        return f"Genome<{self.key}: {self.describe()}>"
