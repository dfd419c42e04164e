"""`galapagos export`: networks and ensembles as TorchScript, torch.export (.pt2) and ONNX files, loaded in a fresh
process that cannot import Galapagos, giving what `predict` gives."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from galapagos import api
from tests.test_ensemble_predict import cosmo_ens, shapes_ens  # noqa: F401 - fixtures
from tests.test_evolve_run import galapagos

# The exported file is run where Galapagos is not installed: its packages cannot be imported in the child.
LOADER = """
import sys
for name in ("galapagos", "evolve", "ensemble", "launch", "datashare", "examples"):
    sys.modules[name] = None
import numpy as np, torch
fmt, path, x_file, out_file = sys.argv[1:]
x = np.load(x_file)
if fmt == "onnx":
    import onnxruntime
    y = onnxruntime.InferenceSession(path).run(None, {"x": x})[0]
else:
    model = torch.jit.load(path) if fmt == "torchscript" else torch.export.load(path).module()
    with torch.no_grad():
        y = model(torch.from_numpy(x)).numpy()
np.save(out_file, y)
"""


def run_exported(fmt: str, path: Path, x: np.ndarray, tmp_path: Path) -> np.ndarray:
    np.save(tmp_path / "x.npy", x)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", LOADER, fmt, str(path), str(tmp_path / "x.npy"),
                           str(tmp_path / "y.npy")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return np.load(tmp_path / "y.npy")


def predicted(model: Path, data: Path, tmp_path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The test split's x, and what `predict` saves for it."""
    save = tmp_path / "p.h5"
    result = api.predict(model, data, "test", save=save, ranks=1)
    with h5py.File(save) as f:
        out = f["probabilities" if result["task"] == "classification" else "predictions"][()]
    with h5py.File(data) as f:
        x = f["test/x"][()]
    return x, out


def formats() -> list:
    try:
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
        onnx = "onnx"
    except ImportError as exc:
        onnx = pytest.param("onnx", marks=pytest.mark.skip(reason=f"{exc.name} is not installed"))
    return ["torchscript", "pt2", onnx]


@pytest.mark.parametrize("fmt", formats())
@pytest.mark.parametrize("what", ["shapes ensemble", "cosmoflow ensemble", "one network"])
def test_export_matches_predict(what, fmt, shapes_ens, cosmo_ens, tmp_path):  # noqa: F811
    ens, data = cosmo_ens if what.startswith("cosmoflow") else shapes_ens
    model = sorted((ens / "members").iterdir())[0] if what == "one network" else ens
    x, expected = predicted(model, data, tmp_path)
    info = api.export(model, tmp_path / f"model.{fmt}", fmt)
    assert info["input"] == [None, *x.shape[1:]] and info["output"] == [None, expected.shape[1]]
    for rows in (slice(None), slice(0, 1)):  # the batch size is free, down to one sample
        got = run_exported(fmt, tmp_path / f"model.{fmt}", x[rows], tmp_path)
        np.testing.assert_allclose(got, expected[rows], rtol=1e-4, atol=1e-5)


def test_export_command(shapes_ens, tmp_path):  # noqa: F811
    ens, _ = shapes_ens
    proc = galapagos("export", "--model", ens, "--format", "pt2", "--out", tmp_path / "ens.pt2", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["outputs"] == "probabilities" and (tmp_path / "ens.pt2").stat().st_size > 0


@pytest.mark.parametrize("args, words", [
    (["--format", "keras"], "invalid choice: 'keras'"),
    (["--out", "/no/such/dir/m.pt"], "directory /no/such/dir does not exist"),
])
def test_export_bad_input_is_one_line(shapes_ens, tmp_path, args, words):  # noqa: F811
    ens, _ = shapes_ens
    full = ["export", "--model", ens, "--format", "torchscript", "--out", tmp_path / "m.pt", *args]
    proc = galapagos(*full)
    assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_export_of_something_that_is_not_a_network(tmp_path):
    proc = galapagos("export", "--model", tmp_path, "--format", "torchscript", "--out", tmp_path / "m.pt")
    assert proc.returncode == 2 and "genome.json is missing" in proc.stderr and "Traceback" not in proc.stderr
