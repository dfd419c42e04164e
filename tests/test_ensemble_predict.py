"""Ensemble prediction: the weighted average, its uncertainty and metrics, in one process and over 2-4 MPI ranks."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from galapagos.cli import main
from galapagos.ensemble.average import assigned, average
from galapagos.ensemble.metrics import classification_metrics, regression_metrics
from galapagos.examples import cosmoflow, shapes
from galapagos.examples.random_ensemble import write_random_ensemble
from galapagos.flows.prediction import _device, predict, predict_ensemble
from galapagos.models import load_network, predict_outputs
from galapagos.store.ensembledir import EnsembleDir, EnsembleError, load_manifest, save_manifest
from tests.mpirun import describe_run, run_mpi
from tests.test_evolve_run import galapagos

# MPI vs one process: members run float32 forward passes whose rounding may depend on each rank's thread count;
# the averaging itself differs only in float64 summation order. On a GPU (only with GALAPAGOS_TEST_GPUS=1, which
# also turns TF32 off: tests/conftest.py), kernels picked per batch shape round differently for other batch sizes:
# the tolerance of float32 work there. ON_GPU: whether predict runs on a GPU in this session, as it decides.
ON_GPU = _device(None, 1) != "cpu"
RTOL, ATOL = (2e-3, 2e-4) if ON_GPU else (1e-5, 1e-6)
EXACT = ATOL if ON_GPU else 1e-12  # the same outputs averaged by two formulas
# Unequal weights, and one member trained but not picked (weight 0): it must not count anywhere.
SHAPES_WEIGHTS = [0.4, 0.25, 0.0, 0.2, 0.1, 0.05]


@pytest.fixture(scope="module")
def shapes_ens(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("shapes")
    shapes.generate(d / "data.h5", samples=600, size=12, seed=1)
    write_random_ensemble(d / "ens", d / "data.h5", len(SHAPES_WEIGHTS), seed=1, steps=8, weights=SHAPES_WEIGHTS)
    return d / "ens", d / "data.h5"


@pytest.fixture(scope="module")
def cosmo_ens(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("cosmo")
    cosmoflow.generate(d / "data.h5", samples=240, size=8, seed=1)
    write_random_ensemble(d / "ens", d / "data.h5", 3, seed=2, steps=8)
    return d / "ens", d / "data.h5"


def read_h5(path: Path) -> tuple[dict[str, np.ndarray], dict]:
    with h5py.File(path) as f:
        return {k: f[k][()] for k in f}, dict(f.attrs)


def member_outputs(ens: Path, data: Path, split: str, batch: int) -> tuple[np.ndarray, np.ndarray, list]:
    """Each used member's outputs, computed one network at a time the way `predict` does for a best/ dir (same
    batch size: float32 kernels may round differently for other batch shapes)."""
    from galapagos.datashare.format import load

    manifest = load_manifest(ens)
    _, splits = load(data, (split,))
    x, y = splits[split]
    device = _device(None, len(manifest.used))  # where predict_ensemble runs them in one process
    outs = []
    for m in manifest.used:
        model, _, problem = load_network(EnsembleDir(ens).member(m.name), device)
        outs.append(predict_outputs(model, x, problem, batch=batch, device=device))
    return np.stack(outs).astype(np.float64), y, manifest.used


def test_assigned_spreads_members_round_robin():
    assert [list(assigned(5, r, 2)) for r in range(2)] == [[0, 2, 4], [1, 3]]
    assert [list(assigned(3, r, 4)) for r in range(4)] == [[0], [1], [2], []]
    assert sorted(i for r in range(3) for i in assigned(8, r, 3)) == list(range(8))


def test_average_checks_its_inputs():
    lin = torch.nn.Linear(3, 2)
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    with pytest.raises(ValueError, match=r"holds members \[1\], expected \[0, 1\]"):
        average(None, [(1, lin)], [0.5, 0.5], x, "regression", 2)
    with pytest.raises(ValueError, match="batch size"):
        average(None, [(0, lin)], [1.0], x, "regression", 2, batch=0)
    one = average(None, [(0, lin)], [1.0], x, "regression", 2, batch=2, per_member=False)
    assert one.members is None and one.ranks == 1
    np.testing.assert_allclose(one.mean, lin(torch.from_numpy(x)).detach().numpy(), rtol=1e-6)
    assert (one.std == 0).all()  # a single member has no spread


def test_classification_average_in_one_process(shapes_ens, tmp_path):
    ens, data = shapes_ens
    res = predict_ensemble(ens, data, "test", save=tmp_path / "p.h5", batch=32)
    outs, y, used = member_outputs(ens, data, "test", 32)
    assert [m.name for m in used] == ["m000", "m001", "m003", "m004", "m005"]  # m002 has weight 0
    w = np.array([m.weight for m in used])
    mean = np.tensordot(w, outs, 1)
    saved, attrs = read_h5(tmp_path / "p.h5")
    np.testing.assert_allclose(saved["probabilities"], mean, rtol=0, atol=EXACT)
    np.testing.assert_allclose(saved["member_probabilities"], outs.astype(np.float32), rtol=0, atol=EXACT)
    np.testing.assert_array_equal(saved["y"], y)
    entropy = -(mean * np.log(mean)).sum(1)
    member_entropy = np.tensordot(w, -(outs * np.log(outs)).sum(2), 1)
    np.testing.assert_allclose(saved["entropy"], entropy, atol=1e-9)
    np.testing.assert_allclose(saved["mutual_information"], np.clip(entropy - member_entropy, 0, None), atol=1e-9)
    assert (saved["mutual_information"] >= 0).all() and saved["mutual_information"].max() > 0
    assert list(attrs["members"]) == [m.name for m in used] and np.allclose(attrs["weights"], w)
    assert attrs["task"] == "classification" and attrs["split"] == "test" and attrs["ranks"] == 1

    expected = classification_metrics(mean, y)
    for k in ("accuracy", "nll", "ece", "samples"):
        assert res[k] == pytest.approx(expected[k], abs=1e-9)
    assert res["samples"] == 90 and res["task"] == "classification" and res["ranks"] == 1
    assert res["uncertainty"]["entropy"] == pytest.approx(entropy.mean())
    assert res["uncertainty"]["mutual_information"] == pytest.approx(saved["mutual_information"].mean())
    assert set(res["members"]) == {m.name for m in used}
    for m in used:  # a member's scores in the ensemble are its scores as a single network
        alone = predict(EnsembleDir(ens).member(m.name), data, "test", batch=32, device=_device(None, len(used)))
        got = res["members"][m.name]
        assert got["weight"] == m.weight
        for k in ("accuracy", "nll", "ece"):
            assert got[k] == pytest.approx(alone[k], abs=max(ATOL, 1e-6))
    assert len({round(res["members"][m.name]["nll"], 6) for m in used}) == len(used)  # members really differ


def test_regression_average_in_one_process(cosmo_ens, tmp_path):
    ens, data = cosmo_ens
    res = predict_ensemble(ens, data, "val", save=tmp_path / "p.h5", batch=7)
    outs, y, used = member_outputs(ens, data, "val", 7)
    w = np.array([m.weight for m in used])
    mean = np.tensordot(w, outs, 1)
    std = np.sqrt(np.tensordot(w, (outs - mean) ** 2, 1))
    saved, attrs = read_h5(tmp_path / "p.h5")
    np.testing.assert_allclose(saved["predictions"], mean, atol=max(EXACT, 1e-9))
    np.testing.assert_allclose(saved["std"], std, atol=max(EXACT, 1e-6))
    assert saved["std"].shape == (36, 2) and (saved["std"] > 0).all()
    np.testing.assert_allclose(saved["member_predictions"], outs.astype(np.float32), rtol=0, atol=EXACT)
    assert list(attrs["target_names"]) == list(cosmoflow.TARGET_NAMES)

    expected = regression_metrics(mean, y, list(cosmoflow.TARGET_NAMES))
    for k in ("mse", "mae", "r2"):
        assert res[k] == pytest.approx(expected[k])
    assert set(res["per_target"]) == set(cosmoflow.TARGET_NAMES)
    for name, per in expected["per_target"].items():
        assert res["per_target"][name] == pytest.approx(per)
    unc = res["uncertainty"]
    assert unc["std"] == pytest.approx(std.mean())
    assert [unc["per_target"][n]["std"] for n in cosmoflow.TARGET_NAMES] == pytest.approx(list(std.mean(0)))
    for i, m in enumerate(used):
        got = res["members"][m.name]
        alone = regression_metrics(outs[i], y, list(cosmoflow.TARGET_NAMES))
        assert got["mse"] == pytest.approx(alone["mse"]) and got["r2"] == pytest.approx(alone["r2"])
        assert got["per_target"]["spectral_slope"]["mae"] == pytest.approx(alone["per_target"]["spectral_slope"]["mae"])


def _mpi_predict(n: int, ens: Path, data: Path, save: Path, *extra) -> dict:
    proc = run_mpi(n, ["-m", "galapagos.cli", "predict", "--model", ens, "--data", data, "--json", "--save", save,
                       "--batch", 16, *extra], timeout=180)
    assert proc.returncode == 0, describe_run(proc)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, describe_run(proc)  # only rank 0 prints
    return json.loads(lines[0])


def assert_close_nested(a, b, where: str = "") -> None:
    """JSON-like results equal: same keys and values, floats to the MPI tolerance."""
    if isinstance(b, dict):
        assert set(a) == set(b), where
        for k in b:
            assert_close_nested(a[k], b[k], f"{where}/{k}")
    elif isinstance(b, float):
        assert a == pytest.approx(b, rel=RTOL, abs=ATOL, nan_ok=True), where
    else:
        assert a == b, where


@pytest.mark.mpi
@pytest.mark.parametrize("task,ranks", [("classification", 2), ("classification", 4), ("regression", 2),
                                        ("regression", 4)])
def test_mpi_average_equals_one_process(task, ranks, shapes_ens, cosmo_ens, tmp_path):
    """Members spread over 2-4 ranks (4 ranks with 3 regression members: one idle rank) give the same result."""
    ens, data = shapes_ens if task == "classification" else cosmo_ens
    ref = predict_ensemble(ens, data, "test", save=tmp_path / "one.h5", batch=16)
    res = _mpi_predict(ranks, ens, data, tmp_path / "mpi.h5")
    assert res["ranks"] == min(ranks, len(load_manifest(ens).used))
    assert_close_nested({k: v for k, v in res.items() if k != "ranks"}, {k: v for k, v in ref.items() if k != "ranks"})
    a, attrs = read_h5(tmp_path / "mpi.h5")
    b, _ = read_h5(tmp_path / "one.h5")
    assert set(a) == set(b) and attrs["ranks"] == res["ranks"]
    for k in b:
        np.testing.assert_allclose(a[k], b[k], rtol=RTOL, atol=ATOL, err_msg=k)


@pytest.mark.mpi
def test_mpi_without_member_outputs(shapes_ens, tmp_path):
    ens, data = shapes_ens
    ref = predict_ensemble(ens, data, "test", save=tmp_path / "one.h5")
    res = _mpi_predict(2, ens, data, tmp_path / "mpi.h5", "--no-member-outputs")
    assert "members" not in res
    assert res["nll"] == pytest.approx(ref["nll"], rel=RTOL)
    assert res["accuracy"] == pytest.approx(ref["accuracy"], abs=0.02 if ON_GPU else 0)  # a sample on a boundary
    assert res["uncertainty"] == pytest.approx(ref["uncertainty"], rel=RTOL, abs=ATOL)
    a, _ = read_h5(tmp_path / "mpi.h5")
    b, _ = read_h5(tmp_path / "one.h5")
    assert "member_probabilities" not in a
    np.testing.assert_allclose(a["probabilities"], b["probabilities"], rtol=RTOL, atol=ATOL)


@pytest.mark.mpi
def test_self_start_and_single_network_under_mpi(cosmo_ens, tmp_path):
    """Outside a launcher an ensemble starts itself under mpiexec; a best/ dir under MPI is scored by rank 0 only."""
    ens, data = cosmo_ens
    ref = predict_ensemble(ens, data, "test", save=tmp_path / "one.h5")
    proc = galapagos("predict", "--model", ens, "--data", data, "--ranks", 2, "--json", "--save", tmp_path / "p.h5",
                     timeout=180)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["ranks"] == 2 and res["mse"] == pytest.approx(ref["mse"], rel=RTOL)
    np.testing.assert_allclose(read_h5(tmp_path / "p.h5")[0]["std"], read_h5(tmp_path / "one.h5")[0]["std"],
                               rtol=RTOL, atol=ATOL)

    single = run_mpi(2, ["-m", "galapagos.cli", "predict", "--model", EnsembleDir(ens).member("m001"), "--data", data,
                         "--json"], timeout=120)
    assert single.returncode == 0, describe_run(single)
    lines = single.stdout.strip().splitlines()
    assert len(lines) == 1, describe_run(single)
    assert json.loads(lines[0])["mse"] == pytest.approx(ref["members"]["m001"]["mse"], rel=1e-6)


def _broken_copy(ens: Path, tmp_path: Path) -> Path:
    out = tmp_path / "ens"
    shutil.copytree(ens, out)
    return out


def _cli(capsys, *args) -> tuple[int, str, str]:
    code = main(["predict", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_missing_member_file_is_a_clear_error(cosmo_ens, tmp_path, capsys):
    ens = _broken_copy(cosmo_ens[0], tmp_path)
    (EnsembleDir(ens).member("m001") / "model.pt").unlink()
    code, out, err = _cli(capsys, "--model", ens, "--data", cosmo_ens[1])
    assert code == 2 and not out
    assert err.startswith("galapagos predict: error:") and "m001" in err and "model.pt is missing" in err
    with pytest.raises(EnsembleError, match="m001"):
        predict_ensemble(ens, cosmo_ens[1])


def test_weights_not_summing_to_one(cosmo_ens, tmp_path, capsys):
    ens = _broken_copy(cosmo_ens[0], tmp_path)
    m = load_manifest(ens)
    from dataclasses import replace

    save_manifest(ens, replace(m, members=tuple(replace(x, weight=0.5) for x in m.members)))
    code, _, err = _cli(capsys, "--model", ens, "--data", cosmo_ens[1], "--ranks", 1)
    assert code == 2 and "weights sum to 1.5, expected 1" in err and len(err.strip().splitlines()) == 1


def test_data_not_matching_the_model(shapes_ens, cosmo_ens, capsys):
    code, out, err = _cli(capsys, "--model", shapes_ens[0], "--data", cosmo_ens[1], "--ranks", 1)
    assert code == 2 and not out
    assert "the model expects classification with samples of shape (1, 12, 12)" in err
    with pytest.raises(SystemExit) as exit_:
        _cli(capsys, "--model", shapes_ens[0], "--data", shapes_ens[1], "--split", "nope", "--ranks", 1)
    assert exit_.value.code == 2 and "invalid choice: 'nope'" in capsys.readouterr().err
    code, _, err = _cli(capsys, "--model", shapes_ens[0], "--data", shapes_ens[1], "--batch", 0)
    assert code == 2 and "--batch 0" in err


@pytest.mark.mpi
def test_errors_under_mpi_reach_rank_0_and_no_rank_hangs(shapes_ens, cosmo_ens, tmp_path):
    """A member that only rank 1 loads is broken, and a data file that only rank 0 reads does not fit: every rank
    stops, rank 0 alone reports the error, exit code 2."""
    ens = _broken_copy(shapes_ens[0], tmp_path)
    (EnsembleDir(ens).member("m001") / "model.pt").write_bytes(b"not a state dict")
    proc = run_mpi(2, ["-m", "galapagos.cli", "predict", "--model", ens, "--data", shapes_ens[1]], timeout=120)
    assert proc.returncode == 2, describe_run(proc)
    assert proc.stderr.count("galapagos predict: error:") == 1 and "m001" in proc.stderr, describe_run(proc)
    assert "model.pt is unreadable" in proc.stderr

    proc = run_mpi(2, ["-m", "galapagos.cli", "predict", "--model", shapes_ens[0], "--data", cosmo_ens[1]], timeout=120)
    assert proc.returncode == 2, describe_run(proc)
    assert proc.stderr.count("galapagos predict: error:") == 1 and "the model expects" in proc.stderr
