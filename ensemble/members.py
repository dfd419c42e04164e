"""Which networks an ensemble trains, chosen from an evolution run's results (the `[ensemble]` table that says
how many and how lives with the application's config, galapagos/config.py).

Strategies: `distinct` trains the K best distinct genomes of the run; `seeds` trains the best genome K times with
different seeds; `mixed` (the default) trains the ceil(K/2) best distinct genomes and fills the rest with the best
genome under new seeds. When a run has fewer distinct genomes than asked for, the list is filled by retraining the
best ones again with new seeds. Every member has its own seed, none equal to a seed the search used.

`kept` trains nothing: the members are the best distinct networks whose weights the run kept (`run.keep_models`),
as the search trained them, up to `members` of them: an ensemble in seconds, at the end of the search's own
budget (bench/RESULTS.md measures it against the search's single pick). Their seed is the search's own. A network
the run finished (`[evolution] finish`: trained on from its weights at the end of the budget) stands for its genome
with its finished weights, whatever its parent's validation score: the longest-trained weights of a network.

The run's journal records are read by attribute (the application's journal records are such objects): `id`,
`status`, `fitness`, `key`, `genome` (its JSON) and, where there is one, `origin`.
"""
from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from typing import Any

STRATEGIES = ("distinct", "seeds", "mixed", "kept")
SEED_BASE = 2 ** 31  # member seeds start here; the search's are run.seed * 1_000_003 + evaluation id
FINISHED = "finish"  # the origin of a finishing task's record (galapagos/flows/finish.py)


@dataclass(frozen=True)
class MemberSpec:
    """One member to train: its directory name, genome, seed and where it came from."""

    name: str
    genome: dict
    key: str
    seed: int
    origin: dict = field(default_factory=dict)  # run, id (evaluation), kind (distinct | reseed), fitness (search)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> MemberSpec:
        return cls(**d)


def ranked_genomes(records: list[Any]) -> list[Any]:
    """The run's finished (`ok`) evaluations, best first, one per genome (its best rung's, with rungs)."""
    ok = sorted((r for r in records if r.status == "ok" and r.fitness is not None), key=lambda r: (-r.fitness, r.id))
    seen: set[str] = set()
    out = []
    for r in ok:
        if r.key not in seen:
            seen.add(r.key)
            out.append(r)
    return out


def choose_members(records: list[Any], *, members: int, strategy: str, seed: int, run: str = "",
                   kept: Collection[int] = (), search_seed: int = 0) -> list[MemberSpec]:
    """The plan: `members` member specs from a run's journal records, picked by `strategy`, seeded from `seed`
    (`kept`: from the evaluations whose weights the run kept, with the seed `search_seed` gave their training)."""
    if members < 1 or strategy not in STRATEGIES:
        raise ValueError(f"choose_members: expected members >= 1 and a strategy of {', '.join(STRATEGIES)}, "
                         f"got {members!r} and {strategy!r}")
    tops = ranked_genomes(records)
    if not tops:
        raise ValueError(f"{run or 'the run'}: no evaluation finished with status ok; nothing to build an "
                         "ensemble from")
    if strategy == "kept":
        return kept_members(records, members, kept, search_seed, run)
    k = members
    if strategy == "seeds":
        picks = [tops[0]] * k
    elif strategy == "distinct":
        picks = [tops[i % len(tops)] for i in range(k)]
    else:
        d = min(len(tops), math.ceil(k / 2))
        picks = tops[:d] + [tops[0]] * (k - d)
    specs, used = [], set()
    for i, r in enumerate(picks):
        kind = "reseed" if r.key in used else "distinct"
        used.add(r.key)
        specs.append(MemberSpec(name=f"m{i:02d}-e{r.id}", genome=r.genome, key=r.key,
                                seed=SEED_BASE + seed * 1_000_003 + i,
                                origin={"run": run, "id": r.id, "kind": kind, "fitness": r.fitness}))
    return specs


def kept_members(records: list[Any], members: int, kept: Collection[int], search_seed: int,
                 run: str) -> list[MemberSpec]:
    """The `kept` plan: the best `members` distinct networks among the evaluations in `kept`, best first; a
    genome the run finished by its finished weights."""
    ids = set(kept)
    with_weights = [r for r in records if r.id in ids]
    finished = [r for r in with_weights if getattr(r, "origin", None) == FINISHED and r.status == "ok"]
    keys = {r.key for r in finished}
    tops = ranked_genomes(finished + [r for r in with_weights if r.key not in keys])
    if not tops:
        raise ValueError(f"{run or 'the run'}: no finished evaluation's weights are kept in its models/ folder; "
                         "the kept strategy has nothing to build from (train members: --strategy mixed)")
    return [MemberSpec(name=f"m{i:02d}-e{r.id}", genome=r.genome, key=r.key, seed=search_seed * 1_000_003 + r.id,
                       origin={"run": run, "id": r.id, "kind": "kept", "fitness": r.fitness})
            for i, r in enumerate(tops[:members])]
