"""How the search moves: mutation, crossover and tournament selection, registered on a DEAP toolbox.

Selection and crossover are DEAP's ``selTournament`` and ``cxMessyOnePoint``, drawn from the ``random.Random``
passed in (so that a run depends only on its seed) exactly as DEAP draws from the global generator: the same
winners and children for the same state (tests/test_operators.py checks it against DEAP), without DEAP's
per-call individuals, which cost the master a fifth of its time per child at scale (bench/scale.py).

Operators return raw offspring; :func:`evolve.check.check_genome` repairs and validates them.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
from typing import Callable, Sequence, TypeVar

from deap import base, creator

from .genome import GENE_FIELDS, OPTIONAL_GENES, Gene, Genome
from .problem import Problem
from .space import SearchSpace

__all__ = [
    "MUTATIONS",
    "POPULATION_CAP",
    "POPULATION_FLOOR",
    "Individual",
    "auto_population",
    "auto_tournament",
    "crossover",
    "make_toolbox",
    "mutate",
    "select",
]

T = TypeVar("T")

# --- DEAP types, created once per process (creator classes are global) ---
if not hasattr(creator, "GalapagosFitness"):
    creator.create("GalapagosFitness", base.Fitness, weights=(1.0,))
if not hasattr(creator, "GalapagosIndividual"):
    creator.create("GalapagosIndividual", list, fitness=creator.GalapagosFitness, payload=None)

#: A DEAP individual: a list of genes with a ``fitness`` (maximised) and a ``payload`` (what it stands for).
Individual = creator.GalapagosIndividual

_WORST = -math.inf


# --- selection, and the sizes that "auto" gives it (evolve/engine.py's EvolutionConfig.sized) ---
POPULATION_FLOOR = 16  # the population of small runs, as it always was
# The largest "auto" population: its members' weights stay on disk (inherit) and rank 0 goes over them for every
# finished result. A tournament of 64 picks from its top 2%; a member ageing out before its children are told is
# how regularized evolution works (Real et al. ran 100 with 450 workers), now that a pending child keeps its
# parent's weights (Engine.pending_parents).
POPULATION_CAP = 4096


def auto_population(workers: int) -> int:
    """About the results told in one training time (each of W workers tells one), within [FLOOR, CAP]."""
    return min(max(POPULATION_FLOOR, workers), POPULATION_CAP)


def auto_tournament(population: int) -> int:
    """The square root of the population, at least 2: selection's takeover time (ln P / ln S generations,
    Goldberg & Deb 1991) stays the 2 of 16/4 at any size (1,000 -> 32, 4,096 -> 64)."""
    return min(population, max(2, round(math.sqrt(population))))


def select(
    population: Sequence[tuple[T, float | None]], k: int, tournament_size: int, rng: random.Random,
    cost: Callable[[T], float | None] | None = None, tolerance: float = 0.0, level: Callable[[T], int] | None = None,
) -> list[T]:
    """``k`` tournament winners (with replacement) from ``(item, fitness)`` pairs: DEAP's ``selTournament`` on
    ``rng``, draw for draw (``tournament_size`` uniform picks, the first of the fittest wins), without wrapping
    the whole population in DEAP individuals for every child (a fifth of the master's time per task, bench/scale.py)
    or going over it: a draw indexes ``population`` (a list or a deque), so a tournament costs its size, not the
    population's.

    Items may be genomes or anything else (the engine passes candidates, to know parent ids). A fitness of
    None or NaN counts as the worst.

    With ``cost`` (item -> a number, lower is cheaper; None where unknown, which counts as the dearest) the
    tournament is cost-aware: of the drawn entries whose fitness is within ``tolerance`` of the fittest drawn, the
    cheapest wins (then the fitter, then the first drawn), so that a search does not drift to big networks that
    score no better; one fitter by more than ``tolerance`` still wins. The draws are the same either way.

    With ``level`` (item -> an integer: a multi-fidelity rung) only the drawn entries of the highest level compete:
    a network trained longer is compared with its peers, not with networks trained less.
    """
    if not population:
        raise ValueError("select: empty population")
    winners = []
    for _ in range(k):
        drawn = [rng.choice(population) for _ in range(tournament_size)]
        if level is not None:
            high = max(level(d[0]) for d in drawn)
            drawn = [d for d in drawn if level(d[0]) == high]
        if cost is None:
            winners.append(max(drawn, key=_fitness)[0])
            continue
        floor = max(map(_fitness, drawn)) - tolerance
        near = (d for d in drawn if _fitness(d) >= floor)
        winners.append(min(near, key=lambda d: (_cost(cost(d[0])), -_fitness(d)))[0])
    return winners


def _fitness(entry: tuple[object, float | None]) -> float:
    fitness = entry[1]
    return _WORST if fitness is None or not math.isfinite(fitness) else float(fitness)


def _cost(value: float | None) -> float:
    return math.inf if value is None or not math.isfinite(value) else float(value)


# --- crossover ---
def crossover(a: Genome, b: Genome, rng: random.Random) -> Genome:
    """One child of two parents: DEAP's variable-length one-point crossover (``cxMessyOnePoint``) applied to
    the spatial sections and to the dense sections separately (so convs stay before the head), and each
    training gene (optimizer, lr, batch size, weight decay, head) taken from one parent or the other.
    """
    (sa, da), (sb, db) = a.sections(), b.sections()
    spatial, dense = _messy_one_point(sa, sb, rng), _messy_one_point(da, db, rng)
    training = {name: getattr(a if rng.random() < 0.5 else b, name)
                for name in ("optimizer", "lr", "batch_size", "weight_decay", "head")}
    for name in OPTIONAL_GENES:  # a draw only where the parents differ: runs without the genes draw as they always did
        mine, theirs = getattr(a, name), getattr(b, name)
        training[name] = mine if mine == theirs or rng.random() < 0.5 else theirs
    return Genome(layers=tuple(spatial) + tuple(dense), **training)


def _messy_one_point(a: Sequence[Gene], b: Sequence[Gene], rng: random.Random) -> tuple[Gene, ...]:
    """The first child of DEAP's ``cxMessyOnePoint`` (a's genes up to one random point, then b's from another),
    drawn from ``rng`` as DEAP draws from the global generator: the same children for the same state, without
    swapping the generators' states and making DEAP individuals for every child (bench/scale.py)."""
    i, j = rng.randint(0, len(a)), rng.randint(0, len(b))
    return tuple(a[:i]) + tuple(b[j:])


# --- mutation ---
def _insert_positions(genome: Genome, problem: Problem, section: str, gene_type: str) -> range:
    """Where a new gene of a section may go without crossing the head."""
    if problem.spatial_dims == 0:
        return range(0, genome.num_layers + 1)  # tabular: everything acts on features
    split = genome.dense_start
    if section == "spatial":
        return range(0, split + 1)
    if gene_type == "dense":
        return range(split, genome.num_layers + 1)
    # norm/dropout after the head need a dense gene before them
    return range(split + 1, genome.num_layers + 1)


def _add_layer(genome: Genome, space: SearchSpace, problem: Problem, rng: random.Random) -> Genome | None:
    if genome.num_layers >= space.max_layers:
        return None
    sections = [s for s in ("spatial", "dense") if space.section_types(problem, s)]
    if problem.spatial_dims == 0:
        sections = ["dense"] if "dense" in sections else []
    if not sections:
        return None
    section = rng.choice(sections)
    gene = space.random_gene(rng, problem, section)
    positions = _insert_positions(genome, problem, section, gene.type)
    if len(positions) == 0:  # a norm/dropout for a dense part that has no dense gene yet
        return None
    i = rng.choice(positions)
    return genome.replace(layers=genome.layers[:i] + (gene,) + genome.layers[i:])


def _remove_layer(genome: Genome, space: SearchSpace, problem: Problem, rng: random.Random) -> Genome | None:
    if genome.num_layers <= space.min_layers or genome.num_layers == 0:
        return None
    i = rng.randrange(genome.num_layers)
    return genome.replace(layers=genome.layers[:i] + genome.layers[i + 1:])


def _change_layer(genome: Genome, space: SearchSpace, problem: Problem, rng: random.Random) -> Genome | None:
    if genome.num_layers == 0:
        return None
    i = rng.randrange(genome.num_layers)
    gene = genome.layers[i]
    field = rng.choice(GENE_FIELDS[gene.type])
    if field == "rate":
        # small steps mostly, sometimes a fresh draw
        lo, hi = space.dropout
        value = gene["rate"] + rng.gauss(0.0, 0.1) if rng.random() < 0.7 else rng.uniform(lo, hi)
        value = min(max(value, lo), hi)
    else:
        value = space.random_value(rng, problem, gene.type, field)
    return genome.replace(layers=genome.layers[:i] + (gene.replace(**{field: value}),) + genome.layers[i + 1:])


def _replace_layer(genome: Genome, space: SearchSpace, problem: Problem, rng: random.Random) -> Genome | None:
    if genome.num_layers == 0:
        return None
    i = rng.randrange(genome.num_layers)
    old = genome.layers[i]
    section = "dense" if (problem.spatial_dims == 0 or i >= genome.dense_start) else "spatial"
    types = [t for t in space.section_types(problem, section) if t != old.type]
    if section == "dense" and i == genome.dense_start and problem.spatial_dims > 0:
        return None  # the first dense gene marks the head; replacing it would move the head
    if not types:
        return None
    gene = space.random_gene(rng, problem, section, rng.choice(types))
    return genome.replace(layers=genome.layers[:i] + (gene,) + genome.layers[i + 1:])


def _move_layer(genome: Genome, space: SearchSpace, problem: Problem, rng: random.Random) -> Genome | None:
    """Move one gene to another place in its own section (spatial genes stay before the head)."""
    split = genome.dense_start if problem.spatial_dims > 0 else 0
    spatial, dense = list(genome.layers[:split]), list(genome.layers[split:])
    choices = [s for s in (spatial, dense) if len(s) >= 2]
    if not choices:
        return None
    part = rng.choice(choices)
    i, j = rng.sample(range(len(part)), 2)
    part.insert(j, part.pop(i))
    return genome.replace(layers=tuple(spatial + dense))


def _choose_other(rng: random.Random, options: Sequence[T], current: T) -> T | None:
    others = [o for o in options if o != current]
    return rng.choice(others) if others else None


SGD_LR_FACTOR = 10.0  # momentum SGD's learning rate against Adam's for the same steps (evolve.space.random_lr)


def _mutate_optimizer(genome: Genome, space: SearchSpace, problem: Problem, rng: random.Random) -> Genome | None:
    """Another optimiser; between SGD and Adam(W) the learning rate moves by SGD_LR_FACTOR (within the space), as
    one would retune it, so that the child is not judged on a learning rate meant for the other."""
    new = _choose_other(rng, space.optimizers, genome.optimizer)
    if new is None:
        return None
    factor = SGD_LR_FACTOR if new == "sgd" else 1 / SGD_LR_FACTOR if genome.optimizer == "sgd" else 1.0
    return genome.replace(optimizer=new, lr=min(max(genome.lr * factor, space.lr[0]), space.lr[1]))


def _log_step(rng: random.Random, value: float, low: float, high: float, sigma: float = 0.5) -> float:
    """Multiply by 10**N(0, s), clipped to [low, high]: learning rates live on a log scale.

    The step scale s is itself random, log-uniform in [sigma/30, sigma], so the search both jumps (a factor of
    ~3) and fine-tunes (a few percent) without a schedule.
    """
    scale = sigma * 10 ** rng.uniform(-1.5, 0.0)
    return min(max(value * 10 ** rng.gauss(0.0, scale), low), high)


def _mutate_lr(genome: Genome, space: SearchSpace, problem: Problem, rng: random.Random) -> Genome | None:
    return genome.replace(lr=_log_step(rng, genome.lr, *space.lr))


def _mutate_batch_size(genome: Genome, space: SearchSpace, problem: Problem, rng: random.Random) -> Genome | None:
    sizes = sorted(space.batch_sizes)
    if genome.batch_size in sizes and rng.random() < 0.7:
        i = sizes.index(genome.batch_size)  # mostly a neighbour: halve or double
        near = [sizes[j] for j in (i - 1, i + 1) if 0 <= j < len(sizes)]
        return genome.replace(batch_size=rng.choice(near)) if near else None
    new = _choose_other(rng, sizes, genome.batch_size)
    return None if new is None else genome.replace(batch_size=new)


def _mutate_weight_decay(genome: Genome, space: SearchSpace, problem: Problem, rng: random.Random) -> Genome | None:
    if space.weight_decay == (0.0, 0.0):
        return None
    if genome.weight_decay == 0.0:
        return genome.replace(weight_decay=space.random_weight_decay(rng) or space.weight_decay[0])
    if rng.random() < space.zero_weight_decay_prob:
        return genome.replace(weight_decay=0.0)
    return genome.replace(weight_decay=_log_step(rng, genome.weight_decay, *space.weight_decay, sigma=0.6))


def _mutate_head(genome: Genome, space: SearchSpace, problem: Problem, rng: random.Random) -> Genome | None:
    if problem.spatial_dims == 0 or problem.is_dense:
        return None  # tabular data has no head; dense problems end in a decoder
    new = _choose_other(rng, space.heads, genome.head)
    return None if new is None else genome.replace(head=new)


def _mutate_loss(genome: Genome, space: SearchSpace, problem: Problem, rng: random.Random) -> Genome | None:
    new = _choose_other(rng, space.losses, genome.loss)
    return None if new is None else genome.replace(loss=new)


def _mutate_shift(genome: Genome, space: SearchSpace, problem: Problem, rng: random.Random) -> Genome | None:
    new = _choose_other(rng, space.shift_choices(problem), genome.shift)
    return None if new is None else genome.replace(shift=new)


_Mutation = Callable[[Genome, SearchSpace, Problem, random.Random], "Genome | None"]
#: name -> (operator, relative weight). Architecture changes dominate; training genes still move often.
MUTATIONS: dict[str, tuple[_Mutation, float]] = {
    "add_layer": (_add_layer, 2.0),
    "remove_layer": (_remove_layer, 1.5),
    "change_layer": (_change_layer, 3.0),
    "replace_layer": (_replace_layer, 1.0),
    "move_layer": (_move_layer, 1.0),
    "optimizer": (_mutate_optimizer, 0.5),
    "lr": (_mutate_lr, 1.5),
    "batch_size": (_mutate_batch_size, 0.7),
    "weight_decay": (_mutate_weight_decay, 0.7),
    "head": (_mutate_head, 0.5),
    "loss": (_mutate_loss, 0.5),  # segmentation only (see _mutate_once)
    "shift": (_mutate_shift, 0.5),  # where the space offers more than one shift
}
_MAX_TRIES = 30


# The mutations a problem draws from (the loss gene for segmentation only, the shift gene where the space offers a
# choice), with the cumulative weights that rng.choices(weights=) would make on every call:
# {(segmentation?, shifts?): (names, cumulative weights)}.
_CHOICES = {(seg, shifts): (names, tuple(itertools.accumulate(MUTATIONS[n][1] for n in names)))
            for seg in (False, True) for shifts in (False, True)
            for names in [tuple(n for n in MUTATIONS if (n != "loss" or seg) and (n != "shift" or shifts))]}


def _mutate_once(genome: Genome, space: SearchSpace, problem: Problem, rng: random.Random) -> Genome:
    names, cum_weights = _CHOICES[problem.task == "segmentation", len(space.shift_choices(problem)) > 1]
    for _ in range(_MAX_TRIES):
        name = rng.choices(names, cum_weights=cum_weights)[0]
        child = MUTATIONS[name][0](genome, space, problem, rng)
        if child is not None and child.key != genome.key:
            return child
    return genome


def mutate(genome: Genome, space: SearchSpace, problem: Problem, rng: random.Random, n: int = 1) -> Genome:
    """Apply ``n`` random mutations (add/remove/change/replace/move a layer, optimizer, lr, batch size,
    weight decay, head, and where they apply the loss and the shift). The child differs from the parent unless no
    mutation applies at all (a later mutation may undo an earlier one; then more are applied)."""
    child = genome
    for _ in range(n):
        child = _mutate_once(child, space, problem, rng)
    for _ in range(_MAX_TRIES):
        if child.key != genome.key:
            break
        child = _mutate_once(child, space, problem, rng)
    return child


# --- toolbox ---
def make_toolbox(space: SearchSpace, problem: Problem) -> base.Toolbox:
    """A DEAP toolbox with ``mate``, ``mutate`` and ``select`` bound to this space and problem, for code that
    prefers DEAP's idiom; each takes the ``random.Random`` to draw from as its last argument."""
    tb = base.Toolbox()
    tb.register("mate", crossover)
    tb.register("mutate", functools.partial(_mutate_with, space, problem))
    tb.register("select", select)
    return tb


def _mutate_with(space: SearchSpace, problem: Problem, genome: Genome, rng: random.Random, n: int = 1) -> Genome:
    return mutate(genome, space, problem, rng, n)

