"""The names of a dataset's shared arrays: array_name makes them, split_arrays reads them back (no MPI here)."""
from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from galapagos.datashare.format import load
from galapagos.datashare.plan import DataShareError, SplitArrays, array_name, array_parts, dataset_plan, split_arrays
from galapagos.datashare.write import write_dataset


def test_array_name_and_its_parts() -> None:
    assert array_name("train", "x") == "train/x"
    assert array_name("val", "index") == "val/index"
    assert array_parts("test/y") == ("test", "y")
    with pytest.raises(ValueError, match="unknown split 'validation'; expected one of train, val, test"):
        array_name("validation", "x")
    with pytest.raises(ValueError, match="unknown part 'z' of split 'train'; expected one of x, y, index"):
        array_name("train", "z")
    with pytest.raises(ValueError, match="unknown part ''"):
        array_parts("train")


def test_a_split_stored_whole_is_its_own_arrays() -> None:
    arrays = {"train/x": np.zeros((5, 2)), "train/y": np.arange(5), "val/x": np.ones((3, 2)), "val/y": np.arange(3)}
    got = split_arrays(arrays)
    assert sorted(got) == ["train", "val"]
    for split in ("train", "val"):
        assert isinstance(got[split], SplitArrays) and got[split].index is None
        assert got[split].x is arrays[f"{split}/x"] and got[split].y is arrays[f"{split}/y"]  # views, no copies


def test_a_carved_val_is_rows_of_the_files_train_arrays() -> None:
    x, y = np.arange(20.0).reshape(10, 2), np.arange(10)
    train_idx, val_idx = np.array([0, 1, 3, 4, 6, 7, 9]), np.array([2, 5, 8])
    arrays = {"train/x": x, "train/y": y, "train/index": train_idx, "val/index": val_idx}
    got = split_arrays(arrays, ("train", "val"))
    assert got["val"].x is x and got["val"].y is y and got["val"].index is val_idx
    assert got["train"].x is x and got["train"].y is y and got["train"].index is train_idx
    assert got["val"].y[got["val"].index].tolist() == [2, 5, 8]


def test_missing_or_bad_arrays_are_named() -> None:
    arrays = {"train/x": np.zeros((4, 1)), "train/y": np.zeros(4, np.int64)}
    with pytest.raises(DataShareError, match=r"split 'val' needs shared array\(s\) val/x, val/y; "
                                             r"the shared arrays are: train/x, train/y"):
        split_arrays(arrays)
    carved = {"train/x": np.zeros((4, 1)), "val/index": np.array([1])}
    with pytest.raises(DataShareError, match=r"split 'val' \(carved from train: val/index is shared\) needs shared "
                                             r"array\(s\) train/y"):
        split_arrays(carved, ("val",))
    with pytest.raises(DataShareError, match=r"split 'train' needs shared array\(s\) train/x, train/y; "
                                             r"the shared arrays are: none"):
        split_arrays({}, ("train",))
    with pytest.raises(DataShareError, match="val/index must be a 1-D array of integer row numbers, got float64"):
        split_arrays({**arrays, "val/index": np.array([0.0, 1.0])}, ("val",))
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        split_arrays(arrays, ("dev",))


def test_dataset_plan_names_are_what_split_arrays_reads(tmp_path: Path) -> None:
    """The arrays a dataset plan delivers, read back by split_arrays, are the splits load() gives."""
    rng = np.random.default_rng(1)
    path = tmp_path / "d.h5"
    write_dataset(path, {"train": (rng.standard_normal((40, 3)).astype(np.float32), rng.integers(0, 3, 40)),
                         "test": (rng.standard_normal((9, 3)).astype(np.float32), rng.integers(0, 3, 9))},
                  task="classification", num_classes=3)
    plan, memory, info = dataset_plan(str(path), ("train", "val", "test"), val_fraction=0.25, seed=2)
    assert info.val_from_train and info.splits == {"train": 30, "val": 10, "test": 9}
    with h5py.File(path, "r") as f:  # what the readers deliver: file datasets, and rank 0's index arrays
        delivered = {s.name: f[s.dataset][()] if s.dataset else memory[s.name] for s in plan.sources}
    assert sorted(delivered) == ["test/x", "test/y", "train/index", "train/x", "train/y", "val/index"]
    got = split_arrays(delivered, ("train", "val", "test"))
    _, ref = load(path, ("train", "val", "test"), val_fraction=0.25, seed=2)
    for split, (x, y) in ref.items():
        part = got[split]
        rows = slice(None) if part.index is None else part.index
        assert np.array_equal(part.x[rows], x) and np.array_equal(part.y[rows], y), split
    assert got["test"].index is None and got["val"].index is not None
