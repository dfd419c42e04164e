"""What master and workers say to each other: small, explicit, never model weights."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Statuses of a finished task. Only `ok` and `pruned` carry a fitness; the others count as the worst.
OK, PRUNED, FAILED, NAN, OOM, CRASHED, TIMEOUT, CANCELLED = (
    "ok", "pruned", "failed", "nan", "oom", "crashed", "timeout", "cancelled")
STATUSES = (OK, PRUNED, FAILED, NAN, OOM, CRASHED, TIMEOUT, CANCELLED)


@dataclass(frozen=True)
class Task:
    id: int
    payload: Any
    time_limit: float | None = None


@dataclass(frozen=True)
class Cancel:
    id: int
    status: str = CANCELLED


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class Ready:
    rank: int
    host: str
    device: str


@dataclass(frozen=True)
class Progress:
    id: int
    rank: int
    metrics: dict


@dataclass(frozen=True)
class Result:
    id: int
    rank: int
    host: str
    status: str
    fitness: float | None
    started: float
    ended: float
    metrics: dict = field(default_factory=dict)
    error: str | None = None

    @property
    def seconds(self) -> float:
        return self.ended - self.started
