"""Dense targets end to end over real MPI ranks: segmentation and field regression evolve on the bundled examples
with 1 and 3 workers, and `predict --json`, `predict --save` and `report` give their per-pixel metrics."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from galapagos.datashare.format import validate
from galapagos.examples import cosmoflow_field, shapes_seg
from tests.mpirun import REPO, describe_run, run_mpi
from tests.test_evolve_run import SMALL, galapagos, journal  # SMALL's space.units: no dense genes here

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def seg_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "seg.h5"
    shapes_seg.generate(path, samples=240, size=12, seed=1)
    return path


@pytest.fixture(scope="module")
def field_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "field.h5"
    cosmoflow_field.generate(path, samples=120, size=8, seed=1)
    return path


def test_examples_write_valid_dense_files(seg_file, field_file, tmp_path) -> None:
    seg = validate(seg_file)
    assert (seg.task, seg.num_classes, seg.ignore_index, seg.y_sample_shape) == ("segmentation", 7, 255, (12, 12))
    field = validate(field_file)
    assert (field.task, field.num_targets, field.y_sample_shape) == ("field", 2, (2, 8, 8, 8))
    assert field.target_names == ("potential", "smoothed_density")
    out = tmp_path / "s.h5"
    proc = subprocess.run([sys.executable, "-m", "galapagos.examples.shapes_seg", "--out", out, "--samples", "40", "--size",
                           "12"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith(f"wrote {out}: segmentation, 7 classes"), proc.stderr


def evolved(data: Path, out: Path, workers: int) -> list[dict]:
    """Five evaluations on `workers` worker ranks, every one journalled by one of them; the records that succeeded."""
    proc = run_mpi(workers + 1, ["-m", "galapagos.cli", "evolve", "--data", data, "--out", out, "--evaluations", 5,
                                 *SMALL], timeout=240)
    assert proc.returncode == 0, describe_run(proc)
    records = journal(out)
    assert len(records) == 5 and {r["rank"] for r in records} <= set(range(1, workers + 1))
    return [r for r in records if r["status"] == "ok"]


@pytest.mark.parametrize("workers", [1, 3])
def test_segmentation_evolves_predicts_and_reports(seg_file, tmp_path, workers) -> None:
    out = tmp_path / "run"
    ok = evolved(seg_file, out, workers)
    assert ok and all(r["fitness"] == r["metrics"]["val_miou"] and len(r["metrics"]["val_iou"]) == 7 for r in ok)
    pred = galapagos("predict", "--model", out, "--data", seg_file, "--json", "--save", tmp_path / "p.h5")
    assert pred.returncode == 0, pred.stderr
    scores = json.loads(pred.stdout)
    assert scores["task"] == "segmentation" and set(scores) >= {"miou", "pixel_accuracy", "nll", "per_class"}
    assert set(scores["per_class"]) == {"background", *shapes_seg.CLASS_NAMES}  # json.dumps sorts the keys
    with h5py.File(tmp_path / "p.h5") as f:
        assert f["probabilities"].shape == (36, 7, 12, 12) and f["labels"].shape == f["y"].shape == (36, 12, 12)
    report = galapagos("report", out)
    assert report.returncode == 0 and "best on val: mean IoU" in report.stdout, report.stderr
    if workers == 1:  # the exported file gives the same per-pixel probabilities
        exp = galapagos("export", "--model", out, "--format", "torchscript", "--out", tmp_path / "net.pt")
        assert exp.returncode == 0 and "probabilities (N, 7, 12, 12)" in exp.stdout, exp.stderr
        with h5py.File(tmp_path / "p.h5") as f, h5py.File(seg_file) as d, torch.no_grad():
            got = torch.jit.load(str(tmp_path / "net.pt"))(torch.from_numpy(d["test/x"][:4])).numpy()
            assert np.allclose(got, f["probabilities"][:4], atol=1e-5)
    if workers == 3:  # an ensemble of two networks: per-pixel probabilities averaged over 2 ranks
        ens = galapagos("ensemble", "--from", out, "--data", seg_file, "--out", tmp_path / "ens", "--members", 2,
                        "--workers", 2, "--set", "train.epochs=2", timeout=240)
        assert ens.returncode == 0 and "ensemble             miou" in ens.stdout, ens.stderr
        pred = galapagos("predict", "--model", tmp_path / "ens", "--data", seg_file, "--json", "--ranks", 2,
                         "--save", tmp_path / "e.h5", timeout=240)
        assert pred.returncode == 0, pred.stderr
        scores = json.loads(pred.stdout)
        assert {"miou", "per_class", "uncertainty", "members"} <= set(scores) and scores["ranks"] >= 1
        with h5py.File(tmp_path / "e.h5") as f:
            assert f["probabilities"].shape == (36, 7, 12, 12) and f["entropy"].shape == (36, 12, 12)


@pytest.mark.parametrize("workers", [1, 3])
def test_field_regression_evolves_predicts_and_reports(field_file, tmp_path, workers) -> None:
    out = tmp_path / "run"
    ok = evolved(field_file, out, workers)
    assert ok and all(r["fitness"] == r["metrics"]["val_r2"] and len(r["metrics"]["val_mse_per_target"]) == 2
                      for r in ok)
    pred = galapagos("predict", "--model", out, "--data", field_file, "--json")
    assert pred.returncode == 0, pred.stderr
    scores = json.loads(pred.stdout)
    assert scores["task"] == "field" and set(scores["per_target"]) == {"potential", "smoothed_density"}
    assert all(set(m) == {"mse", "mae", "r2"} for m in scores["per_target"].values())
    report = galapagos("report", out)
    assert report.returncode == 0 and "best on val: mean R^2" in report.stdout, report.stderr
