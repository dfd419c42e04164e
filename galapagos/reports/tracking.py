"""Experiment tracking (`[report]`): every finished evaluation, as the master journals it, to TensorBoard and/or
MLflow, for users whose lab already watches runs there.

TensorBoard: event files in OUT/tensorboard (`tensorboard --logdir OUT/tensorboard`): the fitness and each numeric
metric by evaluation id, and each evaluation's learning curve by epoch (torch.utils.tensorboard, which needs the
tensorboard package). MLflow: one parent run per job and a nested run per evaluation with its genome's
hyperparameters as params, its fitness, metrics and curve (https://mlflow.org/docs/latest/tracking.html; the
MlflowClient API, so any tracking URI works). Only where the package is installed: a config that asks for one
without it is refused before the run starts. The journal stays the record; a tracker that fails mid-run is
switched off with one warning, never taking the run down.
"""
from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from galapagos.errors import UsageError
from galapagos.evolve.genome import Genome
from galapagos.store.journal import JournalRecord
from galapagos.store.rundir import RunDir

log = logging.getLogger(__name__)


def check_tracking(report) -> None:
    """Refuse [report] settings whose package is missing here, naming it."""
    for wanted, package, key in ((report.tensorboard, "tensorboard", "report.tensorboard = true"),
                                 (report.mlflow_uri, "mlflow", "report.mlflow_uri")):
        if wanted and importlib.util.find_spec(package) is None:
            raise UsageError(f"{key} needs the {package} package, which is not installed: pip install {package} "
                             f"(or drop {key.split(' ')[0]})")


def _numbers(metrics: dict) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class Tracker:
    def __init__(self, report, run_dir: Path, name: str):
        self.tb = self.ml = None
        if report.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(RunDir(run_dir).tensorboard))
        if report.mlflow_uri:
            from mlflow.tracking import MlflowClient

            self.ml = MlflowClient(tracking_uri=report.mlflow_uri)
            found = self.ml.get_experiment_by_name(report.mlflow_experiment)
            self.experiment = found.experiment_id if found else self.ml.create_experiment(report.mlflow_experiment)
            self.parent = self.ml.create_run(self.experiment, run_name=name,
                                             tags={"galapagos.run_dir": str(run_dir)}).info.run_id

    @classmethod
    def open(cls, report, run_dir: Path, name: str) -> "Tracker | None":
        if not (report.tensorboard or report.mlflow_uri):
            return None
        try:
            return cls(report, run_dir, name)
        except Exception as exc:  # noqa: BLE001 - a tracking server that is down must not stop the search
            log.warning("experiment tracking is off for this job: %s: %s", type(exc).__name__, exc)
            return None

    def log(self, record: JournalRecord) -> None:
        try:
            self._log(record)
        except Exception as exc:  # noqa: BLE001 - as above
            log.warning("experiment tracking is off from now on: %s: %s", type(exc).__name__, exc)
            self.tb = self.ml = None

    def _log(self, r: JournalRecord) -> None:
        metrics = _numbers(r.metrics or {})
        if r.fitness is not None:
            metrics["fitness"] = r.fitness
        if self.tb is not None:
            for k, v in metrics.items():
                self.tb.add_scalar(k if k == "fitness" else f"metrics/{k}", v, r.id)
            for epoch, f in enumerate(r.curve or [], 1):
                self.tb.add_scalar(f"curve/{r.id:06d}", f, epoch)
            self.tb.flush()
        if self.ml is not None:
            from mlflow.entities import Metric, Param

            genome = Genome.from_json(r.genome)
            run = self.ml.create_run(self.experiment, run_name=f"eval-{r.id}",
                                     tags={"mlflow.parentRunId": self.parent, "status": r.status,
                                           "origin": "" if r.origin is None else str(r.origin)}).info.run_id
            params = {"genome": genome.describe()[:500], "lr": genome.lr, "batch_size": genome.batch_size,
                      "optimizer": genome.optimizer, "weight_decay": genome.weight_decay, "layers": len(genome.layers),
                      "params": r.params}
            ms = [Metric(k, v, 0, 0) for k, v in metrics.items()]
            ms += [Metric("curve", f, 0, epoch) for epoch, f in enumerate(r.curve or [], 1)]
            self.ml.log_batch(run, metrics=ms, params=[Param(k, str(v)) for k, v in params.items()])
            self.ml.set_terminated(run, "FINISHED" if r.status == "ok" else "FAILED")

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.ml is not None:
            self.ml.set_terminated(self.parent)
