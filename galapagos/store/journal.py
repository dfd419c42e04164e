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
from dataclasses import dataclass, field, fields
from typing import Any

from galapagos.evolve.genome import Genome
from galapagos.launch.protocol import Result, Status

_encode = json.JSONEncoder(sort_keys=True, allow_nan=False).encode  # one encoder for every line, not one per line


@dataclass(frozen=True, slots=True)
class JournalRecord:
    """One finished task. `genome` is the genome's JSON (a dict) as read back; in a record just made it may be the
    Genome itself, written as its canonical JSON (Genome.from_json and NetworkDir.write take either)."""

    id: int
    genome: Any
    status: str
    fitness: float | None = None
    metrics: dict = field(default_factory=dict)
    curve: list = field(default_factory=list)
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

    @classmethod
    def from_dict(cls, d: Mapping) -> JournalRecord:
        """A parsed journal line; keys it does not know are left out, a missing id, genome or status is a
        TypeError."""
        if not isinstance(d, Mapping):
            raise TypeError(f"expected a JSON object, got {type(d).__name__}")
        return cls(**{k: d[k] for k in _FIELDS if k in d})

    def to_dict(self) -> dict:
        """The line's keys and values: every field but those of the other kind of task."""
        d = {"id": self.id, "genome": self.genome, "status": self.status, "fitness": self.fitness,
             "metrics": self.metrics, "curve": self.curve, "key": self.key, "params": self.params,
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


_FIELDS = tuple(f.name for f in fields(JournalRecord))
_OPTIONAL = ("parents", "inherits", "name", "seed")


def journal_record(result: Result, curve: list[float], what: Mapping) -> JournalRecord:
    """One journal line: `what` ran (the fields that say so: genome, key, params, origin and parents or name and
    seed, inherits), and how, where and when it ended."""
    return JournalRecord(id=result.id, **what, status=Status(result.status).value, fitness=result.fitness,
                         metrics=result.metrics, curve=curve, rank=result.rank, host=result.host,
                         start=result.started, end=result.ended, error=result.error)
