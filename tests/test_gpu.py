"""The GPU path, on a machine with a GPU (skipped elsewhere): the rest of the suite runs on the CPU there too
(tests/conftest.py), so these tests are where candidates train on a GPU: mixed precision, channels-last, and a
whole evolution whose trainer children run on it."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ALL_ON_GPUS
from tests.mpirun import REPO
from tests.test_evolve_run import SMALL, journal, shapes_file  # noqa: F401 - a fixture

pytestmark = pytest.mark.gpu


def child_training(device: str | None = None) -> None:
    """Run in a process of its own: one 2D and one 3D candidate on this process's GPU (or `device`), each with the
    default layout ("auto": channels-last for 2D there) and the contiguous one; their summaries as one JSON line."""
    from launch.placement import place
    from evolve.problem import Problem
    from evolve.train import TrainConfig, train_candidate
    from tests.test_train import blobs, genome

    device = device or place(0, 1).device
    layers = [{"type": "conv", "channels": 8, "kernel": 3, "stride": 1, "act": "relu"},
              {"type": "residual", "channels": 16, "kernel": 3, "act": "relu"}]
    out = {"device": device}
    for shape in ((1, 8, 8), (1, 6, 6, 6)):
        data = {"train": blobs(256, shape, 3), "val": blobs(64, shape, 3, seed=1)}
        for setting in ("auto", "contiguous"):
            summary, _ = train_candidate(genome(layers, lr=1e-2), Problem(shape, "classification", 3), data,
                                         TrainConfig(epochs=3, memory_format=setting), device=device)
            out[f"{len(shape) - 1}d {setting}"] = summary
    print(json.dumps(out))


def _python(args: list, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, args)], cwd=REPO, env={**env, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=300)


def test_candidates_train_on_the_gpu_in_mixed_precision_and_channels_last(gpu_env):
    if not ALL_ON_GPUS:  # the session's default: its processes see no GPU
        hidden = _python(["-c", "from launch.placement import place; print(place(0, 1).device)"], dict(os.environ))
        assert hidden.returncode == 0 and hidden.stdout.strip() == "cpu", hidden.stderr
    proc = _python(["-c", "from tests.test_gpu import child_training; child_training()"], gpu_env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["device"].startswith(("cuda:", "xpu:")), out
    for dims, fmt in (("2d", "channels_last"), ("3d", None)):  # 3D: contiguous, faster there (evolve/train.py)
        auto, plain = out[f"{dims} auto"], out[f"{dims} contiguous"]
        assert auto.get("memory_format") == fmt and "memory_format" not in plain
        assert auto["precision"] in ("bfloat16", "float16") and plain["precision"] == auto["precision"]
        assert auto["fitness"] > 0.6 and plain["fitness"] > 0.6  # both learn the blobs
        assert auto["val_loss"] == pytest.approx(plain["val_loss"], rel=0.25)  # the same training, other rounding


def test_an_evolution_trains_its_candidates_on_the_gpu(gpu_env, shapes_file, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    proc = _python(["-m", "galapagos.cli", "evolve", "--data", shapes_file, "--out", out, "--evaluations", 4,
                    "--workers", 2, *SMALL], gpu_env)
    assert proc.returncode == 0, proc.stderr
    records = journal(out)
    assert len(records) == 4 and all(r["status"] in ("ok", "pruned") for r in records), records
    assert {r["metrics"].get("precision") for r in records if r["status"] == "ok"} <= {"bfloat16", "float16"}
    assert any(r["metrics"].get("precision") for r in records)  # mixed precision: only on a GPU
