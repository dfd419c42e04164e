"""What `evolve`, `design` and `ensemble` return, and `load_run` reads back: a run, a design or an ensemble
directory as an object, and each finished evaluation as a Trial.

The objects hold the directory's path only and read its files when asked (summary.json, results.jsonl, best/, the
Pareto front, the ensemble's metrics), so one made while a run is going shows the evaluations finished so far.
Reading needs neither MPI nor torch; `load()` and `results()` import torch and pandas when called.
"""
from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from galapagos.errors import RunDirError, UsageError
from galapagos.evolve.netdir import NetworkDir
from galapagos.reports.tables import genome_params
from galapagos.store.ensembledir import EnsembleDir, is_ensemble
from galapagos.store.journal import JournalRecord
from galapagos.store.rundir import RunDir

if TYPE_CHECKING:
    import pandas
    import torch

PathLike = str | Path


@dataclass(frozen=True)
class Trial:
    """One finished evaluation of a run, or one trained member of an ensemble, as its journal line has it.

    `params` are the genome's parameters as flat values (the `params_<name>` columns of `results()`), `genome` the
    whole genome as saved, `curve` the fitness after each epoch (what pruning compared), `num_params` the network's
    parameter count, `path` its network directory when one was kept (best/, a Pareto front member, an ensemble
    member), else None."""

    id: int
    status: str
    fitness: float | None
    params: dict = field(repr=False)
    metrics: dict = field(repr=False)
    genome: dict = field(repr=False)
    curve: tuple[float, ...] = field(repr=False)
    num_params: int | None = None
    origin: Any = field(default=None, repr=False)
    parents: tuple[int, ...] = field(default=(), repr=False)
    start: datetime | None = field(default=None, repr=False)
    end: datetime | None = field(default=None, repr=False)
    error: str | None = field(default=None, repr=False)
    rung: int = field(default=0, repr=False)  # multi-fidelity: the rung it trained to (evolution.rungs)
    name: str | None = None  # an ensemble member's
    path: Path | None = None

    @classmethod
    def of(cls, record: JournalRecord, path: Path | None = None) -> Trial:
        genome = record.genome.to_json() if hasattr(record.genome, "to_json") else dict(record.genome or {})
        return cls(id=record.id, status=record.status, fitness=record.fitness, params=genome_params(genome or None),
                   metrics=dict(record.metrics or {}), genome=genome, curve=tuple(record.curve or ()),
                   num_params=record.params, origin=record.origin, parents=tuple(record.parents or ()),
                   start=_time(record.start), end=_time(record.end), error=record.error, rung=record.rung or 0,
                   name=record.name,
                   path=path)

    def load(self, device: str = "cpu", *, logits: bool = False) -> torch.nn.Module:
        """The trained network as a torch module, as `galapagos.load` gives it (class probabilities unless
        `logits`)."""
        if self.path is None:
            raise UsageError(f"evaluation {self.id}: its network was not kept (a run keeps best/ and, with several "
                             "objectives, its Pareto front; train it again, or seed a run with its genome)")
        from galapagos.models import load_model

        return load_model(self.path, device, logits=logits)


def _time(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, timezone.utc)


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


class _Directory:
    """What every kind of directory offers: its journal as Trials and as a table, and its HTML report."""

    _dir: RunDir | EnsembleDir

    def __init__(self, path: PathLike):
        self._path = Path(path)

    @property
    def path(self) -> Path:
        return self._path

    def _trial(self, record: JournalRecord) -> Trial:
        return Trial.of(record)

    @property
    def trials(self) -> list[Trial]:
        """Every finished evaluation (member), in the journal's order."""
        return [self._trial(r) for r in self._dir.read_journal()]

    def results(self) -> pandas.DataFrame:
        """The journal as a pandas DataFrame, one row per evaluation: id, status, fitness, one `params_<name>`
        column per genome parameter, one `metric_<name>` column per metric, start and end times (needs pandas:
        pip install galapagos-nas[pandas])."""
        from galapagos.reports.tables import frame

        return frame(self._path)

    def report(self, out: PathLike | None = None, *, compare: PathLike | Run | None = None) -> Path:
        """Write the self-contained HTML report to `out` (default: beside the directory, DIR.html), with the run
        `compare` (e.g. a random search) beside it; returns the file written."""
        from galapagos.reports.html import write_report

        out = self._path.parent / f"{self._path.name}.html" if out is None else Path(out)
        compare = compare.path if isinstance(compare, Run) else compare
        return Path(write_report(self._path, out, compare=compare))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self._path)!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.path == self._path

    def __hash__(self) -> int:
        return hash((type(self), self._path))


class Run(_Directory):
    """An evolution run's directory: its summary, every evaluation, the best network and the Pareto front.

    `finished` (from `evolve`; None when read back with load_run): whether the run spent its budget, rather than
    stopping at a signal or a failure (it can then be resumed)."""

    def __init__(self, path: PathLike, *, finished: bool | None = None):
        super().__init__(path)
        self._dir = RunDir(path)
        self._finished = finished

    @property
    def finished(self) -> bool | None:
        return self._finished

    @property
    def summary(self) -> dict:
        """summary.json as written at the end of the run's last job ({} while its first job is going)."""
        return _json(self._dir.summary)

    @property
    def config(self) -> dict:
        """The run's resolved configuration (config.toml), section by section."""
        return tomllib.loads(self._dir.config.read_text()) if self._dir.config.exists() else {}

    def _best_id(self) -> int | None:
        return _json(NetworkDir(self._dir.best).metrics_file).get("id")

    def _network(self, eval_id: int, best: int | None) -> Path | None:
        if eval_id == best:
            return self._dir.best
        front = self._dir.front_dir(eval_id)
        return front if front.is_dir() else None

    @property
    def trials(self) -> list[Trial]:
        best = self._best_id()
        return [Trial.of(r, self._network(r.id, best)) for r in self._dir.read_journal()]

    def trial(self, eval_id: int) -> Trial:
        """The evaluation `eval_id`."""
        found = [r for r in self._dir.iter_journal() if r.id == eval_id]
        if not found:
            raise UsageError(f"{self._path}: no evaluation {eval_id} in its journal")
        return Trial.of(found[-1], self._network(eval_id, self._best_id()))

    @property
    def best(self) -> Trial | None:
        """The evaluation with the best fitness (its network in best/); None before any succeeded."""
        best = self._best_id()
        return None if best is None else self.trial(best)

    @property
    def pareto(self) -> list[Trial]:
        """With several objectives, the evaluations of the Pareto front (pareto.json); with one, the best."""
        front = self._dir.read_front()
        if front is None:
            return [] if (best := self.best) is None else [best]
        by_id = {t.id: t for t in self.trials}
        return [by_id[m["id"]] for m in front["members"] if m["id"] in by_id]

    @property
    def final(self) -> Ensemble | None:
        """The kept networks as an ensemble (final/, run.final_ensemble); None where the run has none."""
        return Ensemble(self._dir.final) if EnsembleDir(self._dir.final).manifest.exists() else None

    def load(self, device: str = "cpu", *, logits: bool = False) -> torch.nn.Module:
        """The best network as a torch module (see `galapagos.load`)."""
        from galapagos.models import load_model

        return load_model(self._path, device, logits=logits)


class Ensemble(_Directory):
    """An ensemble directory: its members, their weights and the ensemble's scores on val and test.

    `stopped_by` (from `ensemble`): the signal that ended the build before every member was trained, else None."""

    def __init__(self, path: PathLike, *, stopped_by: str | None = None):
        super().__init__(path)
        self._dir = EnsembleDir(path)
        self._stopped_by = stopped_by

    @property
    def stopped_by(self) -> str | None:
        return self._stopped_by

    @property
    def metrics(self) -> dict:
        """metrics.json: the ensemble, the run's best network and each member on val and test, the weights ({}
        until the build is done)."""
        return _json(self._dir.metrics)

    @property
    def weights(self) -> dict[str, float]:
        """Each trained member's selection weight (0: trained, not used)."""
        return dict(self.metrics.get("weights", {}))

    def _trial(self, record: JournalRecord) -> Trial:
        member = self._dir.member(record.name) if record.name else None
        return Trial.of(record, member if member is not None and member.is_dir() else None)

    @property
    def members(self) -> list[Trial]:
        """The members the ensemble averages (weight above 0), heaviest first."""
        weights = self.weights
        latest = {t.name: t for t in self.trials}  # a resumed build may have trained a member again
        return sorted((latest[n] for n, w in weights.items() if w > 0 and n in latest), key=lambda t: -weights[t.name])

    def load(self, device: str = "cpu") -> torch.nn.Module:
        """The ensemble as one torch module: inputs -> the members' weighted mean class probabilities (or
        regression outputs)."""
        from galapagos.models import load_model

        return load_model(self._path, device)


class Design(Run):
    """A design's directory: its evolution run, the ensemble built from it (DIR/ensemble) and how the two
    compare on test."""

    @property
    def ensemble(self) -> Ensemble | None:
        """The ensemble, once its build began; None before."""
        return Ensemble(self._dir.ensemble) if self._dir.ensemble.is_dir() else None

    @property
    def comparison(self) -> dict:
        """The design's report (report.json): the best single network, the best member and the ensemble on test
        (val without a test split); {} until the ensemble is built."""
        return _json(self._dir.report)


def load_run(path: PathLike) -> Run | Design | Ensemble:
    """A run, design or ensemble directory as its object, by what it holds."""
    if is_ensemble(path) or EnsembleDir(path).plan.exists():  # built, or being built
        return Ensemble(path)
    run = RunDir(path)
    if not run.journal.exists():
        raise RunDirError(f"{path}: no {run.journal.name} (not a run, design or ensemble directory)")
    return Design(path) if run.ensemble.is_dir() else Run(path)
