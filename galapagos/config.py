"""The resolved configuration of a run: defaults, then the TOML file, then `--set key=value`, then flags."""
from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import tomli_w

from ensemble.members import EnsembleConfig
from evolve.engine import EvolutionConfig
from evolve.errors import ConfigError
from evolve.settings import from_table
from evolve.space import SearchSpace
from evolve.train import TrainConfig

if TYPE_CHECKING:
    from galapagos.options import EvolveOptions


@dataclass(frozen=True)
class RunConfig:
    """The `[run]` table: budget, limits and the bookkeeping of the master."""

    evaluations: int = 0  # 0 = no limit by count (then budget_minutes must be set)
    budget_minutes: float = 0.0  # 0 = no limit by time
    task_timeout: float = 1800.0  # seconds one candidate may take before it is killed
    seed: int = 0
    val_fraction: float = 0.1  # carved from train when the file has no val split
    prune: bool = True  # stop candidates below the median of finished ones at the same epoch
    prune_after: int = 2  # epochs a candidate always gets
    prune_min_results: int = 6  # finished candidates needed before pruning starts
    keep_models: int = 5  # weights of the top evaluations kept in models/
    task: str = "evolve.train:train_task"  # the function a trainer child runs for each candidate
    chunk_mib: int = 64  # bytes per piece of the dataset sent between nodes
    readers: int = 1  # node leaders that read the dataset file, each a disjoint part; 0 = every node's leader
    prefetch: int = -1  # tasks queued on a worker beyond the one it runs; -1 = one while tasks are short

    @classmethod
    def from_dict(cls, d: dict) -> "RunConfig":
        cfg = from_table(cls, "run", d)
        checks = [("evaluations", cfg.evaluations >= 0), ("budget_minutes", cfg.budget_minutes >= 0),
                  ("task_timeout", cfg.task_timeout > 0), ("val_fraction", 0 < cfg.val_fraction < 1),
                  ("prune_after", cfg.prune_after >= 1), ("prune_min_results", cfg.prune_min_results >= 1),
                  ("keep_models", cfg.keep_models >= 1), ("chunk_mib", 1 <= cfg.chunk_mib <= 2047), ("readers", cfg.readers >= 0),
                  ("prefetch", cfg.prefetch >= -1), ("task", ":" in cfg.task)]
        for key, ok in checks:
            if not ok:
                raise ConfigError(f"run.{key}: value {getattr(cfg, key)!r} is out of range")
        return cfg


SECTIONS = {"space": SearchSpace, "evolution": EvolutionConfig, "train": TrainConfig, "run": RunConfig,
            "ensemble": EnsembleConfig}


@dataclass(frozen=True)
class Config:
    space: SearchSpace
    evolution: EvolutionConfig
    train: TrainConfig
    run: RunConfig
    ensemble: EnsembleConfig

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        for key in d:
            if key not in SECTIONS:
                raise ConfigError(f"{key}: unknown section (known: {', '.join(SECTIONS)})")
        return cls(**{name: kind.from_dict(d.get(name, {})) for name, kind in SECTIONS.items()})

    def to_dict(self) -> dict:
        out = {}
        for name in SECTIONS:
            section = getattr(self, name)
            out[name] = section.to_dict() if hasattr(section, "to_dict") else asdict(section)
        return out

    def dumps(self) -> str:
        return tomli_w.dumps(self.to_dict())


def parse_value(text: str):
    """A `--set` value as TOML (numbers, booleans, lists, quoted strings), else the bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_set(d: dict, assignment: str) -> None:
    key, sep, value = assignment.partition("=")
    parts = key.strip().split(".")
    if not sep or len(parts) != 2 or not all(parts):
        raise ConfigError(f"--set {assignment!r}: expected section.key=value, e.g. train.epochs=4")
    d.setdefault(parts[0], {})
    if not isinstance(d[parts[0]], dict):
        raise ConfigError(f"{parts[0]}: expected a table")
    d[parts[0]][parts[1]] = parse_value(value.strip())


def load_config(path: str | Path | None, sets: list[str] = (), overrides: dict | None = None) -> Config:
    """Defaults <- file <- --set <- command-line flags (`overrides`, as {"section.key": value})."""
    d: dict = {}
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"--config {p}: no such file")
        try:
            d = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"--config {p}: not valid TOML: {exc}") from None
    for s in sets:
        apply_set(d, s)
    for key, value in (overrides or {}).items():
        section, name = key.split(".")
        d.setdefault(section, {})[name] = value
    return Config.from_dict(d)


def ensemble_overrides(members: int | None, strategy: str | None = None) -> dict:
    """--members (ensemble and design) and the ensemble's --strategy as config overrides."""
    if members is not None and members < 1:
        raise ConfigError(f"--members {members}: an ensemble needs at least one member")
    flags = {"ensemble.members": members, "ensemble.strategy": strategy}
    return {k: v for k, v in flags.items() if v is not None}


def evolve_config(opts: "EvolveOptions") -> Config:
    """An evolution run's config: its file (with --resume the run's own), --set, then the flags; it must have a
    budget."""
    from galapagos.rundir import RunDir

    overrides = {}
    if opts.evaluations is not None:
        overrides["run.evaluations"] = opts.evaluations
    if opts.budget_minutes is not None:
        overrides["run.budget_minutes"] = opts.budget_minutes
    if opts.strategy is not None:
        overrides["evolution.strategy"] = opts.strategy
    overrides.update(ensemble_overrides(opts.members))
    path = opts.config
    if opts.resume:
        if opts.config:
            raise ConfigError("--resume uses the run's own config.toml; change it with --set instead of --config")
        path = RunDir.check(opts.out, resume=True).config
    config = load_config(path, opts.set, overrides)
    if not config.run.evaluations and not config.run.budget_minutes:
        raise ConfigError("no budget: give --evaluations N or --budget-minutes M (or run.evaluations / "
                          "run.budget_minutes in the config)")
    return config
