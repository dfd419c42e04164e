"""The configuration of a run: the TOML file, its seven sections, and how they resolve (defaults <- file <- --set
<- command-line flags).

This module owns the file and the tables only the application reads: `[run]` (budget, limits, the master's
bookkeeping), `[ensemble]`, `[report]` (experiment tracking) and `[data]` (how the data is held, in datamode.py).
The tables the algorithms take as parameters live beside them: `[space]` (evolve/space.py), `[evolution]`
(evolve/engine.py) and `[train]` (evolve/task.py). All seven share one validation style, evolve/settings.py's
`Table`: field defaults give the types, `checks()` the ranges, and every error names `section.key`.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import tomli_w

from galapagos.ensemble.members import STRATEGIES
from galapagos.evolve.engine import EvolutionConfig
from galapagos.evolve.errors import ConfigError
from galapagos.evolve.settings import Check, Table
from galapagos.evolve.space import SearchSpace
from galapagos.evolve.task import TrainConfig
from galapagos.flows.datamode import DataConfig
from galapagos.launch.protocol import Liveness
from galapagos.options import TRAIN_TASK

if TYPE_CHECKING:
    from galapagos.options import EvolveOptions

ALIVE_RATE = 2000  # run.heartbeat = "auto": the most Alive messages a second that workers saying nothing else send


@dataclass(frozen=True)
class RunConfig(Table):
    """The `[run]` table: budget, limits and the bookkeeping of the master."""

    section = "run"

    evaluations: int = 0  # 0 = no limit by count (then budget_minutes must be set)
    budget_minutes: float = 0.0  # 0 = no limit by time
    task_timeout: float = 1800.0  # seconds one candidate may take before it is killed
    seed: int = 0  # seeds the val split carved from train, and each candidate's weights and data order
    val_fraction: float = 0.1  # carved from train when the file has no val split
    prune: bool = True  # stop candidates below the median of finished ones at the same epoch
    prune_after: int = 2  # epochs a candidate always gets
    prune_min_results: int = 6  # finished candidates needed before pruning starts
    keep_models: int = 16  # weights of the top evaluations kept in models/ (the final ensemble's pool)
    # at the end of each job the kept networks become an ensemble in OUT/final (galapagos ensemble --strategy kept:
    # selected on val, nothing trained), beside best/ (bench/RESULTS.md: the kept-ensemble pilot)
    final_ensemble: bool = True
    task: str = TRAIN_TASK  # the function a trainer child runs for each candidate
    chunk_mib: int = 64  # bytes per piece of the dataset sent between nodes
    readers: int = 1  # node leaders that read the dataset file, each a disjoint part; 0 = every node's leader
    prefetch: int = -1  # tasks queued on a worker beyond the one it runs; -1 = one while tasks are short
    lost_grace: float = 360.0  # seconds past task_timeout after which a rank that never ends its task is given up
    # Signs of life (launch/heartbeat.py): a worker rank that has sent nothing else for `heartbeat` seconds says it is
    # alive, and rank 0 touches log/master.alive as often. "auto" (stored as 0): 10 s, and from 20,000 workers on
    # as long as keeps those messages to ALIVE_RATE a second (64 s at 127,488): each one costs rank 0 a pass of its
    # loop, and at 127,488 simulated workers the 10 s beats were a seventh of its time (bench/RESULTS.md). A worker
    # silent for `worker_timeout` seconds is given up: three beats missed (at least, under "auto"), which a node's
    # scheduling hiccups and a slow network do not reach; a frozen node costs 30 s, not a task's limit (Slurm itself
    # sets a silent node DOWN after 300 s by default, https://slurm.schedmd.com/slurm.conf.html#OPT_SlurmdTimeout).
    # Rank 0's file untouched for `master_timeout` seconds ends the job: longer, since rank 0's loop may wait on a
    # busy shared file system (the journal, best/).
    heartbeat: float = 0.0
    worker_timeout: float = 30.0
    master_timeout: float = 60.0
    pack: int = 1  # candidates each worker rank trains at once on its device, each in a trainer child of its own;
    # "auto" (stored as 0): on a GPU as many as the first candidate's measured memory lets fit, at most 8 and one per
    # core of the rank; on a CPU-only worker 1, its node's cores being split between its ranks (launch/packing.py)

    spread: int = 1  # devices each candidate trains on at once, data-parallel with the same recipe (a trainer child
    # each, one torch.distributed group): on GPUs at most those the worker rank owns (a node with fewer worker ranks
    # than GPUs); on the CPU each child gets its share of the rank's cores. "auto" (stored as 0): on GPUs, every GPU the
    # rank owns for a candidate whose estimated memory does not fit in one, or whose training on one, projected from
    # a few timed steps, would take more than half its time limit; one GPU for the rest (launch/spread.py)

    spread_ranks: int = 1  # worker ranks each candidate trains on at once, on other nodes too: neighbouring ranks
    # make gangs of this many, the first one's and the others' children (run.spread of each rank's devices) one
    # torch.distributed group that meets over TCP; the others take no task of their own (launch/gang.py)

    def normalise(self) -> dict:
        return {key: 0 for key in ("pack", "spread", "heartbeat") if getattr(self, key) == "auto"}

    @property
    def packing(self) -> int | str:
        """run.pack as the workers' Setup takes it: a count, or "auto"."""
        return self.pack or "auto"

    @property
    def spreading(self) -> int | str:
        """run.spread as the workers' Setup takes it: a count, or "auto"."""
        return self.spread or "auto"

    def liveness(self, master_file: Path | str, workers: int) -> Liveness:
        """The heartbeat settings the workers get with their setup, for a job of `workers`; `master_file`:
        RunDir.master_heartbeat ("": none)."""
        if self.heartbeat:
            return Liveness(self.heartbeat, self.worker_timeout, self.master_timeout, str(master_file))
        beat = max(Liveness.interval, workers / ALIVE_RATE)
        return Liveness(beat, max(self.worker_timeout, 3 * beat), max(self.master_timeout, 3 * beat), str(master_file))

    def checks(self) -> list[Check]:
        return [("evaluations", self.evaluations >= 0, "at least 0 (0 = no limit by count)"),
                ("budget_minutes", self.budget_minutes >= 0, "at least 0 (0 = no limit by time)"),
                ("task_timeout", self.task_timeout > 0, "more than 0 seconds"),
                ("val_fraction", 0 < self.val_fraction < 1, "a fraction strictly between 0 and 1"),
                ("prune_after", self.prune_after >= 1, "at least 1"),
                ("prune_min_results", self.prune_min_results >= 1, "at least 1"),
                ("keep_models", self.keep_models >= 1, "at least 1"),
                ("chunk_mib", 1 <= self.chunk_mib <= 2047, "an integer in [1, 2047]"),
                ("readers", self.readers >= 0, "at least 0 (0 = every node's leader)"),
                ("prefetch", self.prefetch >= -1, "at least -1 (-1 = one while tasks are short)"),
                ("pack", self.pack >= 0, 'at least 1, or "auto"'),
                ("spread", self.spread >= 0, 'at least 1, or "auto"'),
                ("spread_ranks", self.spread_ranks >= 1, "at least 1"),
                ("lost_grace", self.lost_grace > 0, "more than 0 seconds"),
                ("heartbeat", self.heartbeat >= 0, 'more than 0 seconds, or "auto"'),
                ("worker_timeout", self.worker_timeout >= 3 * self.heartbeat,
                 f"at least 3 heartbeats (run.heartbeat = {self.heartbeat:g} s)"),
                ("master_timeout", self.master_timeout >= 3 * self.heartbeat,
                 f"at least 3 heartbeats (run.heartbeat = {self.heartbeat:g} s)"),
                ("task", ":" in self.task, "module:function")]


@dataclass(frozen=True)
class EnsembleConfig(Table):
    """The `[ensemble]` table: how many members, from which genomes, trained how long, selected how."""

    section = "ensemble"
    choices = {"strategy": STRATEGIES}

    members: int = 8  # networks in the ensemble
    strategy: str = "mixed"  # distinct | seeds | mixed | kept (ensemble.members.choose_members)
    epochs: int = 0  # epochs per member; 0 = twice train.epochs (members train to completion, no pruning)
    task_timeout: float = 0.0  # seconds per member; 0 = run.task_timeout scaled by epochs / train.epochs
    max_rounds: int = 50  # selection: the most picks (with replacement)
    init: int = 1  # selection: start from up to this many best members (sorted initialisation)
    bags: int = 0  # selection: 0 = greedy over every member; N = greedy in N bags of half the members, averaged
    seed: int = 0  # seeds the members' training (the seeds strategy adds one per member) and the bags
    refit_epochs: int = 0  # after selection, each used member trains on for this many epochs on the training and
    # validation rows together, from its weights (ensemble/refit.py); 0 = no refit
    refit_lr: float = 0.2  # the refit's peak learning rate, a share of each member's genome's

    def checks(self) -> list[Check]:
        return [("members", self.members >= 1, "at least 1"), ("epochs", self.epochs >= 0, "at least 0"),
                ("task_timeout", self.task_timeout >= 0, "at least 0"),
                ("max_rounds", self.max_rounds >= 1, "at least 1"), ("init", self.init >= 1, "at least 1"),
                ("bags", self.bags >= 0, "at least 0 (0 = no bagging)"), ("seed", self.seed >= 0, "at least 0"),
                ("refit_epochs", self.refit_epochs >= 0, "at least 0 (0 = no refit)"),
                ("refit_lr", 0 < self.refit_lr <= 1, "a share above 0, up to 1 (the genome's own)")]

    def member_epochs(self, train_epochs: int) -> int:
        return self.epochs or 2 * train_epochs

    def member_timeout(self, run_timeout: float, train_epochs: int) -> float:
        return self.task_timeout or run_timeout * self.member_epochs(train_epochs) / train_epochs


@dataclass(frozen=True)
class ReportConfig(Table):
    """The `[report]` table: experiment tracking of every finished evaluation, where the package is installed."""

    section = "report"

    tensorboard: bool = False  # event files in OUT/tensorboard (needs the tensorboard package)
    mlflow_uri: str = ""  # an MLflow tracking URI (http://host:5000, databricks, ...); "" = no MLflow
    mlflow_experiment: str = "galapagos"  # the MLflow experiment the evaluations are logged to

    def checks(self) -> list[Check]:
        return [("mlflow_experiment", bool(self.mlflow_experiment.strip()), "a name")]


SECTIONS = {table.section: table for table in (SearchSpace, EvolutionConfig, TrainConfig, RunConfig, EnsembleConfig,
                                                 ReportConfig, DataConfig)}


@dataclass(frozen=True)
class Config:
    space: SearchSpace
    evolution: EvolutionConfig
    train: TrainConfig
    run: RunConfig
    ensemble: EnsembleConfig
    report: ReportConfig
    data: DataConfig

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        for key in d:
            if key not in SECTIONS:
                raise ConfigError(f"{key}: unknown section (known: {', '.join(SECTIONS)})")
        config = cls(**{name: kind.from_dict(d.get(name, {})) for name, kind in SECTIONS.items()})
        if config.evolution.rungs > 1 and config.train.inherited_epochs:
            raise ConfigError(f"evolution.rungs = {config.evolution.rungs} with train.inherited_epochs = "
                              f"{config.train.inherited_epochs}: a network trained in rungs follows one schedule; "
                              "set train.inherited_epochs = 0")
        if config.evolution.rungs > 1 and config.train.epochs < 2:
            raise ConfigError(f"evolution.rungs = {config.evolution.rungs} with train.epochs = 1: a rung's learning "
                              "rate decays over its last epochs after at least one at the stable rate; set "
                              "train.epochs = 2 or more")
        return config

    def to_dict(self) -> dict:
        return {name: getattr(self, name).to_dict() for name in SECTIONS}

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


# Galapagos's own task function as configs written before the one `galapagos` namespace name it (it was the default
# of [run] task, so every run directory of then has it in its config.toml, which --resume reads).
OLD_TRAIN_TASK = "evolve.train:train_task"


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
        if d.get("run", {}).get("task") == OLD_TRAIN_TASK:  # a run directory's config.toml written before 0.2
            d["run"]["task"] = TRAIN_TASK
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
    from galapagos.store.rundir import RunDir

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
    if config.evolution.finish and not config.run.budget_minutes:
        raise ConfigError(f"evolution.finish = {config.evolution.finish:g}: a share of the time budget, and the run "
                          "has none: give --budget-minutes M (or run.budget_minutes), or set evolution.finish = 0")
    return config
