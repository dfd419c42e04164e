"""Several objectives at once: what each measures, Pareto dominance, NSGA-II ranking, and picking a network.

`[evolution] objectives` lists what the search optimises. `fitness` (the validation score, maximised) is always
one of them; `params` (the parameter count, minimised) and `latency` (milliseconds for one sample's forward pass
on the worker's device, minimised) are the others. With more than one, the engine keeps an elitist NSGA-II
population (Deb et al., 2002; DEAP's `selNSGA2`) and the run keeps its Pareto front: the evaluations no other
evaluation beats on every objective at once.

A pick (`predict --pick`, `ensemble --pick`) names one evaluation by id, or constraints such as
`params<=100000,latency<=2`: the best fitness among the networks that meet them.

Evaluations are read by attribute (:class:`Scored`: the application's journal records,
galapagos/store/journal.py, or anything else with those attributes).
"""
from __future__ import annotations

import functools
import math
import operator
import random
import re
from typing import Any, Callable, Hashable, Iterable, Protocol, Sequence

from deap import base, tools

__all__ = ["OBJECTIVES", "Front", "best_pick", "crowded_tournament", "dominates", "nsga2_rank", "nsga2_survivors",
           "objective_values", "parse_pick", "weights", "Scored"]


class Scored(Protocol):
    """What objectives and picks read of an evaluation."""

    id: int
    fitness: float | None
    params: int | None
    metrics: dict | None  # latency_ms among them, when the task function measured it


#: objective -> (weight: +1 maximised, -1 minimised; where an evaluation holds it; unit for people)
OBJECTIVES: dict[str, tuple[float, Callable[[Scored], Any], str]] = {
    "fitness": (1.0, lambda r: r.fitness, "validation score"),
    "params": (-1.0, lambda r: r.params, "parameters"),
    "latency": (-1.0, lambda r: (r.metrics or {}).get("latency_ms"), "ms per sample"),
}

Values = tuple[float, ...]


def weights(objectives: Sequence[str]) -> tuple[float, ...]:
    return tuple(OBJECTIVES[o][0] for o in objectives)


def objective_values(record: Scored, objectives: Sequence[str]) -> Values | None:
    """The record's value of each objective, or None when one is missing or not a finite number (a failed
    evaluation, or a task function that does not measure it)."""
    out = []
    for name in objectives:
        value = OBJECTIVES[name][1](record)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return None
        out.append(float(value))
    return tuple(out)


def dominates(a: Values, b: Values, w: Sequence[float]) -> bool:
    """a is at least as good as b on every objective and better on one."""
    better = False
    for x, y, s in zip(a, b, w):
        if x * s < y * s:
            return False
        better = better or x * s > y * s
    return better


class Front:
    """The nondominated set of everything added, kept incrementally (an addition costs one pass over the front).
    Of equal points the first added stays."""

    def __init__(self, objectives: Sequence[str]):
        self.objectives = tuple(objectives)
        self.w = weights(objectives)
        self.members: dict[Hashable, Values] = {}

    def add(self, key: Hashable, values: Values) -> list[Hashable] | None:
        """None if `values` is dominated by (or equal to) a member; else the keys it pushed off the front."""
        if any(v == values or dominates(v, values, self.w) for v in self.members.values()):
            return None
        removed = [k for k, v in self.members.items() if dominates(values, v, self.w)]
        for k in removed:
            del self.members[k]
        self.members[key] = values
        return removed


class _Point:
    """What DEAP's NSGA-II needs of an individual: a `fitness` with weighted values (and room for the crowding
    distance it assigns)."""

    def __init__(self, item: Any, values: Values, fitness_type: type):
        self.item = item
        self.fitness = fitness_type(values)


@functools.cache
def _fitness_type(objectives: tuple[str, ...]) -> type:
    return type("ObjectivesFitness", (base.Fitness,), {"weights": weights(objectives)})


def _points(population: Sequence[tuple[Any, Values]], objectives: Sequence[str]) -> list[_Point]:
    fitness_type = _fitness_type(tuple(objectives))
    return [_Point(item, values, fitness_type) for item, values in population]


def nsga2_survivors(population: Sequence[tuple[Any, Values]], k: int, objectives: Sequence[str]) -> list[Any]:
    """The `k` items NSGA-II keeps: whole nondominated fronts in order, the last one cut by crowding distance."""
    if len(population) <= k:
        return [item for item, _ in population]
    return [p.item for p in tools.selNSGA2(_points(population, objectives), k)]


def nsga2_rank(population: Sequence[tuple[Any, Values]], objectives: Sequence[str]) -> list[tuple[Any, int, float]]:
    """(item, front number from 0, crowding distance) for each: what NSGA-II's crowded tournament compares."""
    out = []
    for rank, front in enumerate(tools.sortNondominated(_points(population, objectives), len(population))):
        tools.emo.assignCrowdingDist(front)
        out.extend((p.item, rank, p.fitness.crowding_dist) for p in front)
    return out


def crowded_tournament(ranked: Sequence[tuple[Any, int, float]], k: int, size: int, rng: random.Random) -> list[Any]:
    """`k` winners of tournaments of `size` (with replacement): the lower front wins, then the larger crowding
    distance (the less crowded region of the front)."""
    return [min(rng.sample(list(ranked), min(size, len(ranked))), key=lambda r: (r[1], -r[2]))[0]
            for _ in range(k)]


_CONSTRAINT = re.compile(r"^\s*(fitness|params|latency)\s*(<=|>=|<|>)\s*([-+0-9.eE_]+)\s*$")
_OPS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}


def parse_pick(spec: str, flag: str = "--pick") -> Callable[[Scored], bool]:
    """A test on evaluations from `ID` or from constraints `OBJ<=VALUE[,OBJ>=VALUE...]` (OBJ one of fitness,
    params, latency); a spec that is neither is a ValueError naming `flag` and the accepted forms."""
    spec = spec.strip()
    if re.fullmatch(r"\d+", spec):
        wanted = int(spec)
        return lambda r: r.id == wanted
    tests = []
    for part in spec.split(","):
        m = _CONSTRAINT.match(part)
        try:
            bound = float(m.group(3)) if m else None
        except ValueError:
            bound = None
        if bound is None:
            raise ValueError(f"{flag} {spec!r}: expected an evaluation id or constraints like "
                             f"'params<=100000,latency<=2' (objectives: {', '.join(OBJECTIVES)}); "
                             f"cannot read {part.strip()!r}")
        name, op = m.group(1), _OPS[m.group(2)]
        tests.append(lambda r, name=name, op=op, bound=bound: (
            (v := objective_values(r, (name,))) is not None and op(v[0], bound)))
    return lambda r: all(t(r) for t in tests)


def best_pick(records: Iterable[Scored], spec: str, flag: str = "--pick") -> Scored | None:
    """The evaluation with the highest fitness among those the pick accepts (lowest id on ties), or None."""
    test = parse_pick(spec, flag)
    chosen = [r for r in records if r.fitness is not None and test(r)]
    return min(chosen, key=lambda r: (-r.fitness, r.id), default=None)
