"""What each job is asked to do: the options of `evolve`, `design`, `ensemble` and `predict`, as the Python API
takes them and as the command line gives them (``from_args``). Small and picklable: started ranks get them as JSON."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any

TRAIN_TASK = "galapagos.evolve.train:train_task"  # Galapagos's own task function ([run] task's default)


class _Options:
    @classmethod
    def from_args(cls, args: Any):
        """From an argparse namespace of the same command (options it lacks keep their defaults)."""
        return cls(**{f.name: _tuple(getattr(args, f.name)) for f in fields(cls) if hasattr(args, f.name)
                      and getattr(args, f.name) is not None})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict):
        return cls(**{k: _tuple(v) for k, v in d.items()})


def _tuple(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


@dataclass(frozen=True)
class EvolveOptions(_Options):
    """`evolve` and `design` (which also trains `members`)."""

    data: str
    out: str
    config: str | None = None
    set: tuple[str, ...] = ()  # section.key=value overrides
    evaluations: int | None = None
    budget_minutes: float | None = None
    workers: int | None = None
    strategy: str | None = None
    resume: bool = False
    members: int | None = None
    seed_from: str | None = None  # a run directory or a JSON file of genomes that start the population
    max_restarts: int = 3  # started as one process: restarts of the job after a lost rank (flows/recovery.py)


@dataclass(frozen=True)
class EnsembleOptions(_Options):
    from_run: str
    data: str
    out: str
    members: int | None = None
    strategy: str | None = None  # distinct | seeds | mixed
    set: tuple[str, ...] = ()
    workers: int | None = None
    resume: bool = False
    pick: str | None = None  # only evaluations that meet it (evolve/pareto.py: an id or constraints)
    max_restarts: int = 3  # started as one process: restarts of the job after a lost rank (flows/recovery.py)


@dataclass(frozen=True)
class PredictOptions(_Options):
    model: str
    data: str
    split: str = "test"
    save: str | None = None
    batch: int = 1024
    ranks: int | None = None
    member_outputs: bool = True
    pick: str | None = None  # a network of the run's Pareto front (evolve/pareto.py: an id or constraints)
