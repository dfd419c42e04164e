"""One journal line (results.jsonl): a finished task as a typed record, its writer and its reader.

A run directory and an ensemble directory keep their journals alike, one JSON line per finished task, keys sorted:
what ran (an evaluation: parents, origin, inherits when it started from a parent's weights; an ensemble member:
name, seed, origin as a dict; both: id, genome, key, params), how it ended (status, fitness, metrics, the fitness
after each epoch as `curve`, error) and where and when (rank, host, start, end). Only :func:`journal_record` makes
a new one; :meth:`JournalRecord.from_dict` reads any line written so far (the keys of one kind only, and keys a
line lacks take their defaults).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from galapagos.evolve.genome import Genome
from galapagos.launch.protocol import Result, Status

_encode = json.JSONEncoder(sort_keys=True, allow_nan=False).encode  # one encoder for every line, not one per line


class JournalRecord(NamedTuple):
    """One finished task. `genome` is the genome's JSON (a dict) as read back; in a record just made it may be the
    Genome itself, written as its canonical JSON (Genome.from_json and NetworkDir.write take either).

    Immutable and typed, a NamedTuple rather than a frozen dataclass: rank 0 makes one per finished task, and a
    frozen dataclass of its (then) 18 fields took 2.4 us to make against 0.9 us (bench/master_cost.py's path)."""

    id: int
    genome: Any
    status: str
    fitness: float | None = None
    metrics: Mapping = MappingProxyType({})  # an immutable default: the records are shared, never changed
    curve: list | tuple = ()
    key: str | None = None
    params: int | None = None
    origin: Any = None  # an evaluation's: "random", "mutation", ...; a member's: {"run", "id", "kind", "fitness"}
    rank: int | None = None
    host: str | None = None
    start: float | None = None
    end: float | None = None
    error: str | None = None
    # written only by the kind of task that has them:
    parents: list | None = None  # an evaluation's parent ids
    inherits: int | None = None  # the parent whose weights an evaluation started from
    name: str | None = None  # an ensemble member's directory name
    seed: int | None = None  # an ensemble member's training seed
    rung: int | None = None  # a multi-fidelity evaluation's rung (evolve/rungs.py), from the first on

    @classmethod
    def from_dict(cls, d: Mapping) -> JournalRecord:
        """A parsed journal line; keys it does not know are left out, a missing id, genome or status is a
        TypeError."""
        if not isinstance(d, Mapping):
            raise TypeError(f"expected a JSON object, got {type(d).__name__}")
        return cls(**{k: d[k] for k in cls._fields if k in d})

    def replace(self, **changes: Any) -> JournalRecord:
        """The same record with `changes`."""
        return self._replace(**changes)

    def to_dict(self) -> dict:
        """The line's keys and values: every field but those of the other kind of task."""
        d = {"id": self.id, "genome": self.genome, "status": self.status, "fitness": self.fitness,
             "metrics": self.metrics if type(self.metrics) is dict else dict(self.metrics), "curve": self.curve,
             "key": self.key, "params": self.params,
             "origin": self.origin, "rank": self.rank, "host": self.host, "start": self.start, "end": self.end,
             "error": self.error}
        for k in _OPTIONAL:
            if (v := getattr(self, k)) is not None:
                d[k] = v
        return d

    def to_line(self) -> str:
        """The journal line (without its newline). A Genome is written as its canonical JSON, made once, after the
        other keys; a NaN or infinity is a ValueError (JSON has none)."""
        d = self.to_dict()
        if not isinstance(self.genome, Genome):
            return _encode(d)
        del d["genome"]
        return "{" + _encode(d)[1:-1] + ', "genome": ' + self.genome.canonical() + "}"


_OPTIONAL = ("parents", "inherits", "name", "seed", "rung")


def journal_record(result: Result, curve: list[float], what: Mapping) -> JournalRecord:
    """One journal line: `what` ran (the fields that say so: genome, key, params, origin and parents or name and
    seed, inherits), and how, where and when it ended."""
    return JournalRecord(id=result.id, **what, status=Status(result.status).value, fitness=result.fitness,
                         metrics=result.metrics, curve=curve, rank=result.rank, host=result.host,
                         start=result.started, end=result.ended, error=result.error)
