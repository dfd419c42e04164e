"""The HDF5 dataset format: round trips, every kind of bad file, val carving, .npz import, example generators."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from galapagos.datashare import format as fmt
from galapagos.datashare.format import DataError, check_values, describe, inspect, load, validate
from galapagos.datashare.write import import_npz, write_dataset
from galapagos.examples import cosmoflow, shapes

REPO = Path(__file__).resolve().parent.parent


def raw_h5(path: Path, splits: dict, **attrs) -> Path:
    """Write a file exactly as given (no checks), to build bad files that write_dataset would refuse."""
    attrs = {"task": "classification", "num_classes": 3, **attrs}
    with h5py.File(path, "w") as f:
        for k, v in attrs.items():
            if v is not None:
                f.attrs[k] = v
        for split, arrays in splits.items():
            g = f.create_group(split)
            for key, a in arrays.items():
                g.create_dataset(key, data=a)
    return path


def good_split(n: int = 20, sample=(1, 4, 4), classes: int = 3, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((n, *sample)).astype(np.float32), "y": rng.integers(0, classes, n)}


def data_error(fn, *args, **kwargs) -> str:
    with pytest.raises(DataError) as exc:
        fn(*args, **kwargs)
    msg = str(exc.value)
    assert "\n" not in msg, f"DataError message spans lines: {msg!r}"
    return msg


# ---------------------------------------------------------------------------------------------- round trips

SAMPLE_SHAPES = {0: (5,), 1: (2, 7), 2: (1, 4, 6), 3: (2, 3, 4, 5)}


@pytest.mark.parametrize("dtype", ["float32", "float16", "uint8"])
@pytest.mark.parametrize("spatial", [0, 1, 2, 3])
def test_round_trip_every_dtype_and_rank(tmp_path: Path, dtype: str, spatial: int) -> None:
    rng = np.random.default_rng(spatial)
    sample = SAMPLE_SHAPES[spatial]
    splits = {}
    for split, n in (("train", 30), ("val", 6), ("test", 5)):
        x = (rng.integers(0, 256, (n, *sample)) if dtype == "uint8" else rng.standard_normal((n, *sample)))
        splits[split] = (x.astype(dtype), rng.integers(0, 4, n))
    path = tmp_path / "d.h5"
    written = write_dataset(path, splits, task="classification", num_classes=4, name="rt", description="test")
    info = inspect(path)
    assert info == written
    assert (info.task, info.num_classes, info.num_targets) == ("classification", 4, 4)
    assert info.sample_shape == sample and info.spatial_dims == spatial
    assert info.x_dtype == dtype and info.splits == {"train": 30, "val": 6, "test": 5}
    assert (info.name, info.description, info.target_names) == ("rt", "test", None)
    assert validate(path) == info
    info2, data = load(path)
    assert info2 == info and list(data) == ["train", "val", "test"]
    for split, (x, y) in splits.items():
        gx, gy = data[split]
        assert gx.dtype == np.dtype(dtype) and gy.dtype == np.int64
        assert gx.flags.c_contiguous and gy.flags.c_contiguous
        assert gx.tobytes() == x.tobytes() and np.array_equal(gy, y)


def test_regression_round_trip_with_target_names(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((40, 3)).astype(np.float32)
    y = rng.standard_normal((40, 2))  # float64 targets are stored as float32
    path = tmp_path / "r.h5"
    write_dataset(path, {"train": (x, y)}, task="regression", target_names=["mass", "spin"])
    info = validate(path)
    assert (info.task, info.num_classes, info.num_targets) == ("regression", None, 2)
    assert info.target_names == ("mass", "spin") and info.sample_shape == (3,) and info.spatial_dims == 0
    _, data = load(path, ("train", "test"), val_fraction=0.25)
    assert "test" not in data
    assert data["train"][1].dtype == np.float32 and data["train"][0].shape == (40, 3)
    text = describe(info)
    assert "regression, 2 targets" in text and "mass, spin" in text and "train 40" in text


def test_reader_accepts_chunked_compressed_big_endian_and_narrow_labels(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((64, 1, 8)).astype(">f4")
    y = rng.integers(0, 5, 64).astype(np.int32)
    path = tmp_path / "c.h5"
    with h5py.File(path, "w") as f:
        f.attrs["task"] = np.bytes_(b"classification")  # fixed-length bytes, as some writers store strings
        f.attrs["num_classes"] = np.int32(5)
        f.create_dataset("train/x", data=x, chunks=(7, 1, 8), compression="gzip")
        f.create_dataset("train/y", data=y, chunks=(10,))
    info = validate(path, chunk_bytes=100)
    assert info.x_dtype == "float32" and info.num_classes == 5
    _, data = load(path, ("train",))
    gx, gy = data["train"]
    assert gx.dtype == np.dtype("float32") and gx.dtype.isnative and gy.dtype == np.int64
    np.testing.assert_array_equal(gx, x.astype(np.float32))
    np.testing.assert_array_equal(gy, y)


# ---------------------------------------------------------------------------------------------- bad files

def test_missing_file(tmp_path: Path) -> None:
    msg = data_error(inspect, tmp_path / "nope.h5")
    assert "nope.h5" in msg and "no such file" in msg


def test_not_hdf5(tmp_path: Path) -> None:
    path = tmp_path / "text.h5"
    path.write_text("x,y\n1,2\n")
    for fn in (inspect, validate, load):
        msg = data_error(fn, path)
        assert "text.h5" in msg and "not an HDF5 file" in msg


def test_missing_train(tmp_path: Path) -> None:
    path = raw_h5(tmp_path / "d.h5", {"test": good_split()})
    msg = data_error(inspect, path)
    assert "d.h5: /train:" in msg and "missing" in msg


def test_missing_y_dataset(tmp_path: Path) -> None:
    path = raw_h5(tmp_path / "d.h5", {"train": {"x": good_split()["x"]}})
    assert "d.h5: /train/y: missing dataset" in data_error(inspect, path)


def test_wrong_y_dtype(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    path = raw_h5(tmp_path / "data.h5", {"train": {"x": rng.standard_normal((100, 4)).astype(np.float32),
                                                   "y": rng.random((100, 1)).astype(np.float32)}})
    msg = data_error(inspect, path)
    assert msg == f"{path}: /train/y: expected int64 class labels of shape (N,), got float32 (100, 1)"


def test_wrong_x_dtype(tmp_path: Path) -> None:
    split = good_split()
    split["x"] = split["x"].astype(np.float64)
    msg = data_error(inspect, raw_h5(tmp_path / "d.h5", {"train": split}))
    assert "d.h5: /train/x:" in msg and "float64" in msg and "float32" in msg


def test_regression_targets_need_two_dims(tmp_path: Path) -> None:
    split = {"x": good_split()["x"], "y": np.zeros(20, np.float32)}
    msg = data_error(inspect, raw_h5(tmp_path / "d.h5", {"train": split}, task="regression", num_classes=None))
    assert "d.h5: /train/y:" in msg and "(N, T)" in msg and "(N, 1)" in msg


def test_length_mismatch(tmp_path: Path) -> None:
    split = good_split(20)
    split["y"] = split["y"][:19]
    msg = data_error(inspect, raw_h5(tmp_path / "d.h5", {"train": split}))
    assert "d.h5: /train/y: has 19 samples but /train/x has 20" in msg


def test_splits_must_agree(tmp_path: Path) -> None:
    path = raw_h5(tmp_path / "d.h5", {"train": good_split(sample=(1, 4, 4)), "test": good_split(sample=(1, 4, 5))})
    msg = data_error(inspect, path)
    assert "d.h5: /test/x:" in msg and "(1, 4, 5)" in msg and "/train/x" in msg
    split = good_split()
    path = raw_h5(tmp_path / "e.h5", {"train": split, "val": {"x": split["x"].astype(np.float16), "y": split["y"]}})
    assert "e.h5: /val/x: dtype float16 differs" in data_error(inspect, path)


def test_empty_train(tmp_path: Path) -> None:
    msg = data_error(inspect, raw_h5(tmp_path / "d.h5", {"train": good_split(0)}))
    assert "d.h5: /train/x:" in msg and "empty" in msg


def test_four_spatial_dims(tmp_path: Path) -> None:
    split = {"x": np.zeros((4, 1, 2, 2, 2, 2), np.float32), "y": np.zeros(4, np.int64)}
    msg = data_error(inspect, raw_h5(tmp_path / "d.h5", {"train": split}))
    assert "d.h5: /train/x:" in msg and "4 spatial dims" in msg


def test_one_dimensional_x(tmp_path: Path) -> None:
    split = {"x": np.zeros(4, np.float32), "y": np.zeros(4, np.int64)}
    assert "d.h5: /train/x: expected shape (N, F)" in data_error(inspect, raw_h5(tmp_path / "d.h5", {"train": split}))


@pytest.mark.parametrize("attrs, expected", [
    ({"task": "detection"}, "attribute 'task' must be one of classification, regression, segmentation, field, "
                            "got 'detection'"),
    ({"task": None}, "missing root attribute 'task'"),
    ({"num_classes": None}, "attribute 'num_classes' is required"),
    ({"num_classes": 1}, "attribute 'num_classes' must be at least 2, got 1"),
    ({"num_classes": 2.5}, "attribute 'num_classes' must be an integer"),
])
def test_bad_root_attributes(tmp_path: Path, attrs: dict, expected: str) -> None:
    msg = data_error(inspect, raw_h5(tmp_path / "d.h5", {"train": good_split()}, **attrs))
    assert msg.startswith(str(tmp_path / "d.h5") + ": /: ") and expected in msg


def test_target_names_must_match_outputs(tmp_path: Path) -> None:
    path = raw_h5(tmp_path / "d.h5", {"train": good_split()}, target_names=np.array(["a", "b"], dtype=object))
    assert "target_names' has 2 names, expected 3" in data_error(inspect, path)


def test_nan_in_x_names_split_and_sample(tmp_path: Path) -> None:
    split = good_split(50)
    split["x"][37, 0, 2, 1] = np.nan
    path = raw_h5(tmp_path / "d.h5", {"train": good_split(10), "val": split})
    assert inspect(path).splits == {"train": 10, "val": 50}  # inspect does not read values
    for fn, kwargs in ((validate, {"chunk_bytes": 64}), (validate, {}), (load, {})):
        msg = data_error(fn, path, **kwargs)
        assert msg == f"{path}: /val/x: non-finite value (nan) in sample 37"


def test_inf_in_regression_targets(tmp_path: Path) -> None:
    y = np.zeros((20, 2), np.float32)
    y[4, 1] = -np.inf
    path = raw_h5(tmp_path / "d.h5", {"train": {"x": good_split()["x"], "y": y}}, task="regression")
    assert data_error(validate, path) == f"{path}: /train/y: non-finite target in sample 4"


def test_label_out_of_range(tmp_path: Path) -> None:
    split = good_split(30)
    split["y"][12] = 3
    split["y"][20] = -1
    path = raw_h5(tmp_path / "d.h5", {"train": split})
    msg = data_error(validate, path)
    assert msg == f"{path}: /train/y: label 3 of sample 12 is outside [0, 3)"
    assert data_error(load, path) == msg


def test_check_values_reports_offset_indices() -> None:
    info = fmt.DatasetInfo(path="mem.h5", task="classification", num_classes=2, num_targets=2, sample_shape=(3,),
                           spatial_dims=0, x_dtype="float16", splits={"train": 5})
    x = np.zeros((5, 3), np.float16)
    x[4, 2] = np.inf
    msg = data_error(check_values, info, "train", x, np.zeros(5, np.int64), offset=100, chunk_bytes=6)
    assert msg == "mem.h5: /train/x: non-finite value (inf) in sample 104"
    check_values(info, "train", x[:4], np.ones(4, np.int64))  # clean data passes


# ---------------------------------------------------------------------------------------------- val carving

def indexed_file(path: Path, n: int = 200, **splits) -> Path:
    """Train x holds each sample's index, so carved splits can be traced back."""
    x = np.arange(n, dtype=np.float32).reshape(n, 1)
    return raw_h5(path, {"train": {"x": x, "y": np.arange(n) % 3}, **splits})


def test_val_is_carved_deterministically_and_disjointly(tmp_path: Path) -> None:
    path = indexed_file(tmp_path / "d.h5")
    info, data = load(path, val_fraction=0.1, seed=5)
    assert info.val_from_train and info.splits == {"train": 180, "val": 20}
    train_ids, val_ids = data["train"][0][:, 0], data["val"][0][:, 0]
    assert len(set(train_ids) & set(val_ids)) == 0
    assert sorted(np.concatenate([train_ids, val_ids])) == list(range(200))
    assert np.all(np.diff(train_ids) > 0) and np.all(np.diff(val_ids) > 0)  # original order kept
    np.testing.assert_array_equal(data["train"][1], train_ids.astype(np.int64) % 3)  # labels follow their inputs
    _, again = load(path, val_fraction=0.1, seed=5)
    assert all(np.array_equal(again[s][0], data[s][0]) for s in ("train", "val"))
    _, other = load(path, val_fraction=0.1, seed=6)
    assert not np.array_equal(other["val"][0], data["val"][0])
    info_only_val, only_val = load(path, ("val",), seed=5)
    assert list(only_val) == ["val"] and np.array_equal(only_val["val"][0], data["val"][0])
    _, tiny = load(path, val_fraction=0.001)
    assert len(tiny["val"][1]) == 1 and len(tiny["train"][1]) == 199


def test_existing_val_is_not_carved(tmp_path: Path) -> None:
    val = {"x": np.full((7, 1), -1, np.float32), "y": np.zeros(7, np.int64)}
    path = indexed_file(tmp_path / "d.h5", val=val)
    info, data = load(path)
    assert not info.val_from_train and info.splits == {"train": 200, "val": 7}
    assert np.all(data["val"][0] == -1)
    assert "train" not in load(path, ("val", "test"))[1]


def test_carving_needs_two_train_samples(tmp_path: Path) -> None:
    path = indexed_file(tmp_path / "d.h5", n=1)
    assert "d.h5: /train: cannot carve" in data_error(load, path)
    with pytest.raises(ValueError, match="unknown split"):
        load(path, ("training",))


# ---------------------------------------------------------------------------------------------- writing, .npz

def test_write_is_checked_and_atomic(tmp_path: Path) -> None:
    out = tmp_path / "w.h5"
    x = np.zeros((10, 2), np.float32)
    x[3, 1] = np.nan
    msg = data_error(write_dataset, out, {"train": (x, np.zeros(10, np.int64))}, task="classification",
                     num_classes=2)
    assert msg == f"{out}: /train/x: non-finite value (nan) in sample 3"
    assert list(tmp_path.iterdir()) == []  # neither the file nor a temporary is left behind
    assert "w.h5: /train/x: expected dtype" in data_error(
        write_dataset, out, {"train": (x.astype(np.float64), np.zeros(10))}, task="regression")
    assert "w.h5: /validation: unknown split" in data_error(
        write_dataset, out, {"train": (x, np.zeros(10, np.int64)), "validation": (x, np.zeros(10, np.int64))},
        task="classification", num_classes=2)


def test_import_npz_classification(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    npz = tmp_path / "d.npz"
    np.savez(npz, x_train=rng.standard_normal((50, 3, 8)), y_train=rng.integers(0, 4, 50).astype(np.int32),
             x_test=rng.standard_normal((10, 3, 8)), y_test=rng.integers(0, 5, 10).astype(np.int32))
    info = import_npz(npz, tmp_path / "d.h5", name="imported")
    assert (info.task, info.num_classes, info.x_dtype, info.sample_shape) == ("classification", 5, "float32", (3, 8))
    assert info.splits == {"train": 50, "test": 10} and info.name == "imported" and info.spatial_dims == 1
    _, data = load(tmp_path / "d.h5")
    with np.load(npz) as z:
        np.testing.assert_array_equal(data["test"][0], z["x_test"].astype(np.float32))
        np.testing.assert_array_equal(data["test"][1], z["y_test"])
    assert data["test"][1].dtype == np.int64 and info.splits["train"] == 50
    assert len(data["val"][1]) == 5  # carved at load time


def test_import_npz_regression_and_reshapes(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    npz = tmp_path / "r.npz"
    np.savez(npz, x_train=rng.random(30), y_train=rng.random(30), x_val=rng.random(5), y_val=rng.random(5))
    info = import_npz(npz, tmp_path / "r.h5")
    assert (info.task, info.num_targets, info.sample_shape) == ("regression", 1, (1,))
    assert info.splits == {"train": 30, "val": 5}
    uint = tmp_path / "u.npz"
    np.savez(uint, x_train=rng.integers(0, 255, (20, 1, 4, 4)).astype(np.uint8), y_train=rng.random((20, 3)))
    info = import_npz(uint, tmp_path / "u.h5", description="images")
    assert info.x_dtype == "uint8" and info.num_targets == 3 and info.description == "images"


def test_import_npz_errors(tmp_path: Path) -> None:
    out = tmp_path / "out.h5"
    assert "missing.npz: no such file: it does not exist" in data_error(import_npz, tmp_path / "missing.npz", out)
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    assert "bad.npz: /: not a .npz archive" in data_error(import_npz, bad, out)

    cases = {
        "no_train.npz": ({"x_test": np.zeros((3, 2)), "y_test": np.zeros(3, int)}, "x_train: missing array"),
        "no_y.npz": ({"x_train": np.zeros((3, 2))}, "y_train: missing array (x_train is present)"),
        "no_yval.npz": ({"x_train": np.zeros((3, 2)), "y_train": np.arange(3), "x_val": np.zeros((2, 2))},
                        "y_val: missing array (x_val is present)"),
        "mismatch.npz": ({"x_train": np.zeros((3, 2)), "y_train": np.arange(4)},
                         "y_train: has 4 samples but x_train has 3"),
        "negative.npz": ({"x_train": np.zeros((3, 2)), "y_train": np.array([0, -1, 1])},
                         "y_train: negative label -1 at sample 1"),
        "one_class.npz": ({"x_train": np.zeros((3, 2)), "y_train": np.zeros(3, int)},
                          "y_train: every label is 0"),
        "mixed.npz": ({"x_train": np.zeros((3, 2)), "y_train": np.arange(3), "x_test": np.zeros((2, 2)),
                       "y_test": np.zeros(2)}, "y_test: dtype float64 disagrees"),
        "strings.npz": ({"x_train": np.array([["a"], ["b"]]), "y_train": np.arange(2)},
                        "x_train: expected numeric inputs"),
    }
    for name, (arrays, expected) in cases.items():
        np.savez(tmp_path / name, **arrays)
        msg = data_error(import_npz, tmp_path / name, out)
        assert expected in msg, (name, msg)
    assert "out.h5: /train/y: label 5 of sample 0" in data_error(
        import_npz, _npz(tmp_path / "c.npz", x_train=np.zeros((2, 2)), y_train=np.array([5, 0])), out,
        num_classes=3)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".npz") == []


def _npz(path: Path, **arrays) -> Path:
    np.savez(path, **arrays)
    return path


# ---------------------------------------------------------------------------------------------- examples

def test_cosmoflow_example(tmp_path: Path) -> None:
    out = tmp_path / "cf.h5"
    info = cosmoflow.generate(out, samples=40, size=8, seed=1)
    assert validate(out) == info
    assert (info.task, info.num_targets, info.sample_shape, info.spatial_dims) == ("regression", 2, (1, 8, 8, 8), 3)
    assert info.target_names == ("log10_amplitude", "spectral_slope")
    assert info.splits == {"train": 28, "val": 6, "test": 6}
    _, data = load(out)
    x, y = data["train"]
    lo, hi = np.array([cosmoflow.LOG10_AMPLITUDE_RANGE, cosmoflow.SLOPE_RANGE]).T
    assert np.all(y >= lo) and np.all(y <= hi)
    assert abs(float(x.mean())) < 0.1 and np.all(x.std(axis=(1, 2, 3, 4)) > 0)
    # a larger amplitude means a larger field variance, all else equal
    rng = np.random.default_rng(0)
    f = cosmoflow.gaussian_fields(rng, np.array([-1.0, 1.0]), np.array([2.0, 2.0]), 8)
    assert f[1].std() > 3 * f[0].std()
    cosmoflow.generate(tmp_path / "again.h5", samples=40, size=8, seed=1)
    _, again = load(tmp_path / "again.h5")
    assert again["test"][0].tobytes() == data["test"][0].tobytes()


def test_shapes_example(tmp_path: Path) -> None:
    out = tmp_path / "shapes.h5"
    info = shapes.generate(out, samples=120, seed=2)
    assert validate(out) == info
    assert (info.task, info.num_classes, info.sample_shape, info.x_dtype) == ("classification", 6, (1, 16, 16),
                                                                             "float32")
    assert info.target_names == shapes.CLASS_NAMES and info.splits == {"train": 84, "val": 18, "test": 18}
    _, data = load(out)
    labels = np.concatenate([y for _, y in data.values()])
    assert np.bincount(labels).tolist() == [20] * 6
    shapes.generate(tmp_path / "b.h5", samples=120, seed=3)
    _, other = load(tmp_path / "b.h5")
    assert other["train"][0].tobytes() != data["train"][0].tobytes()


def test_example_command_line(tmp_path: Path) -> None:
    out = tmp_path / "s.h5"
    proc = subprocess.run([sys.executable, "-m", "galapagos.examples.shapes", "--out", str(out), "--samples", "60",
                           "--seed", "1"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"wrote {out}") and len(proc.stdout.strip().splitlines()) == 1
    assert validate(out).splits == {"train": 42, "val": 9, "test": 9}
