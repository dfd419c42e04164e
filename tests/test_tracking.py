"""Experiment tracking ([report]): a run's evaluations in TensorBoard event files and in MLflow runs, read back with
each tool's own reader; a missing package refused before the run starts."""
from __future__ import annotations

import importlib.util

import pytest

from galapagos.config import load_config
from galapagos.errors import UsageError
from galapagos.reports.tracking import check_tracking
from tests.test_evolve_run import SMALL, galapagos, shapes_file  # noqa: F401 - fixture

pytestmark = pytest.mark.mpi


def test_tensorboard_and_mlflow_get_every_evaluation(shapes_file, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # a file store for the test; sites use a server
    pytest.importorskip("tensorboard")
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, store = tmp_path / "run", (tmp_path / "mlruns").as_uri()
    proc = galapagos("evolve", "--data", shapes_file, "--out", out, "--evaluations", 5, "--workers", 2, *SMALL,
                     "--set", "report.tensorboard=true", "--set", f'report.mlflow_uri="{store}"',
                     "--set", 'report.mlflow_experiment="shapes"', timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "tracking is off" not in proc.stderr
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    fitness = events.Scalars("fitness")
    assert sorted(e.step for e in fitness) == list(range(5))
    curves = [t for t in events.Tags()["scalars"] if t.startswith("curve/")]
    assert len(curves) == 5 and all(len(events.Scalars(t)) == 2 for t in curves)  # train.epochs=2 in SMALL
    client = MlflowClient(tracking_uri=store)
    runs = client.search_runs([client.get_experiment_by_name("shapes").experiment_id])
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(runs) == 6 and len(children) == 5
    assert all("fitness" in r.data.metrics and "lr" in r.data.params for r in children)
    assert len(client.get_metric_history(children[0].info.run_id, "curve")) == 2


def test_a_tracker_whose_package_is_missing_is_refused(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    config = load_config(None, ['report.mlflow_uri="http://mlflow.example:5000"'])
    with pytest.raises(UsageError, match="report.mlflow_uri needs the mlflow package, which is not installed"):
        check_tracking(config.report)
    check_tracking(load_config(None).report)  # nothing asked, nothing needed
