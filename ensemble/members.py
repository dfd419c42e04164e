"""Which networks an ensemble trains, chosen from an evolution run's results: the `[ensemble]` table and the plan.

Strategies: `distinct` trains the K best distinct genomes of the run; `seeds` trains the best genome K times with
different seeds; `mixed` (the default) trains the ceil(K/2) best distinct genomes and fills the rest with the best
genome under new seeds. When a run has fewer distinct genomes than asked for, the list is filled by retraining the
best ones again with new seeds. Every member has its own seed, none equal to a seed the search used.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from evolve.errors import ConfigError
from evolve.settings import from_table

STRATEGIES = ("distinct", "seeds", "mixed")
SEED_BASE = 2 ** 31  # member seeds start here; the search's are run.seed * 1_000_003 + evaluation id


@dataclass(frozen=True)
class EnsembleConfig:
    """The `[ensemble]` table: how many members, from which genomes, trained how long, selected how."""

    members: int = 8
    strategy: str = "mixed"  # distinct | seeds | mixed
    epochs: int = 0  # epochs per member; 0 = twice train.epochs (members train to completion, no pruning)
    task_timeout: float = 0.0  # seconds per member; 0 = run.task_timeout scaled by epochs / train.epochs
    max_rounds: int = 50  # selection: the most picks (with replacement)
    init: int = 1  # selection: start from up to this many best members (sorted initialisation)
    seed: int = 0

    @classmethod
    def from_dict(cls, d: dict) -> EnsembleConfig:
        cfg = from_table(cls, "ensemble", d)
        checks = [("members", cfg.members >= 1), ("strategy", cfg.strategy in STRATEGIES),
                  ("epochs", cfg.epochs >= 0), ("task_timeout", cfg.task_timeout >= 0),
                  ("max_rounds", cfg.max_rounds >= 1), ("init", cfg.init >= 1), ("seed", cfg.seed >= 0)]
        for key, ok in checks:
            if not ok:
                hint = f" (expected one of {', '.join(STRATEGIES)})" if key == "strategy" else ""
                raise ConfigError(f"ensemble.{key}: value {getattr(cfg, key)!r} is out of range{hint}")
        return cfg

    def to_dict(self) -> dict:
        return asdict(self)

    def member_epochs(self, train_epochs: int) -> int:
        return self.epochs or 2 * train_epochs

    def member_timeout(self, run_timeout: float, train_epochs: int) -> float:
        return self.task_timeout or run_timeout * self.member_epochs(train_epochs) / train_epochs


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


def ranked_genomes(records: list[dict]) -> list[dict]:
    """The run's finished (`ok`) evaluations, best first, one per genome."""
    ok = sorted((r for r in records if r.get("status") == "ok" and r.get("fitness") is not None),
                key=lambda r: (-r["fitness"], r["id"]))
    seen: set[str] = set()
    out = []
    for r in ok:
        if r["key"] not in seen:
            seen.add(r["key"])
            out.append(r)
    return out


def choose_members(records: list[dict], config: EnsembleConfig, *, run: str = "") -> list[MemberSpec]:
    """The plan: `config.members` member specs from a run's journal records."""
    tops = ranked_genomes(records)
    if not tops:
        raise ValueError(f"{run or 'the run'}: no evaluation finished with status ok; nothing to build an "
                         "ensemble from")
    k = config.members
    if config.strategy == "seeds":
        picks = [tops[0]] * k
    elif config.strategy == "distinct":
        picks = [tops[i % len(tops)] for i in range(k)]
    else:
        d = min(len(tops), math.ceil(k / 2))
        picks = tops[:d] + [tops[0]] * (k - d)
    specs, used = [], set()
    for i, r in enumerate(picks):
        kind = "reseed" if r["key"] in used else "distinct"
        used.add(r["key"])
        specs.append(MemberSpec(name=f"m{i:02d}-e{r['id']}", genome=r["genome"], key=r["key"],
                                seed=SEED_BASE + config.seed * 1_000_003 + i,
                                origin={"run": run, "id": r["id"], "kind": kind, "fitness": r["fitness"]}))
    return specs
