"""Dense targets in the HDF5 format: segmentation (a class per pixel/voxel) and field (T targets per pixel)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from galapagos.datashare.format import DataError, describe, inspect, load, validate
from galapagos.datashare.plan import dataset_plan
from galapagos.datashare.write import import_npz, write_dataset


def one_line_error(fn, *args, **kwargs) -> str:
    with pytest.raises(DataError) as exc:
        fn(*args, **kwargs)
    assert "\n" not in str(exc.value)
    return str(exc.value)


def raw_h5(path: Path, x: np.ndarray, y: np.ndarray, **attrs) -> Path:
    """A file written as given (no checks), for the bad files write_dataset refuses."""
    with h5py.File(path, "w") as f:
        for k, v in attrs.items():
            f.attrs[k] = v
        g = f.create_group("train")
        g.create_dataset("x", data=x)
        g.create_dataset("y", data=y)
    return path


def seg_arrays(n: int = 12, spatial=(6, 5), classes: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 2, *spatial)).astype(np.float32), rng.integers(0, classes, (n, *spatial))


@pytest.mark.parametrize("spatial", [(9,), (6, 5), (3, 4, 5)])
def test_segmentation_round_trip_1d_2d_3d(tmp_path: Path, spatial) -> None:
    x, y = seg_arrays(spatial=spatial)
    y[0, (0,) * len(spatial)] = 255
    path = tmp_path / "seg.h5"
    info = write_dataset(path, {"train": (x, y.astype(np.int32)), "val": seg_arrays(4, spatial, seed=1)},
                         task="segmentation", num_classes=3, ignore_index=255)
    assert (info.task, info.num_classes, info.num_targets, info.ignore_index) == ("segmentation", 3, 3, 255)
    assert info.is_dense and info.y_sample_shape == spatial
    info, data = load(path)
    assert data["train"][1].dtype == np.int64 and np.array_equal(data["train"][1], y)
    assert "segmentation, 3 classes per pixel, label 255 ignored" in describe(info)
    plan, _, _ = dataset_plan(str(path))
    assert {s.name: s.shape for s in plan.sources}["train/y"] == (12, *spatial)


def test_field_round_trip_and_plan(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((10, 1, 4, 4, 4)).astype(np.float32)
    y = rng.standard_normal((10, 2, 4, 4, 4))  # float64 is stored as float32
    path = tmp_path / "field.h5"
    info = write_dataset(path, {"train": (x, y)}, task="field", target_names=["rho", "T"])
    assert (info.task, info.num_classes, info.num_targets, info.y_sample_shape) == ("field", None, 2, (2, 4, 4, 4))
    info, data = load(path, ("train", "val"))
    assert data["val"][1].shape[1:] == (2, 4, 4, 4) and data["train"][1].dtype == np.float32
    assert "field, 2 targets per pixel" in describe(inspect(path))
    plan, _, _ = dataset_plan(str(path))
    assert {s.name: s.shape for s in plan.sources}["train/y"] == (10, 2, 4, 4, 4)


def test_segmentation_shape_and_dtype_errors(tmp_path: Path) -> None:
    x, y = seg_arrays()
    p = tmp_path / "d.h5"
    assert one_line_error(write_dataset, p, {"train": (x, y[:, :5])}, task="segmentation", num_classes=3) == (
        f"{p}: /train/y: spatial shape (5, 5) of y (N, *spatial) differs from /train/x spatial shape (6, 5)")
    assert one_line_error(write_dataset, p, {"train": (x, y.astype(np.float32))}, task="segmentation",
                          num_classes=3) == (f"{p}: /train/y: expected int64 class labels per pixel of shape "
                                             "(N, *spatial), got float32 (12, 6, 5)")
    assert one_line_error(write_dataset, p, {"train": (x[:, :, 0, 0], y[:, 0, 0])}, task="segmentation",
                          num_classes=3) == (f"{p}: /train/y: expected int64 class labels per pixel of shape "
                                             "(N, *spatial), got int64 (12,)")
    assert one_line_error(write_dataset, p, {"train": (x[:, :, :, 0], y[:, :, 0])}, task="segmentation") == (
        f"{p}: /: attribute 'num_classes' is required for segmentation")
    assert not p.exists()


def test_field_shape_errors(tmp_path: Path) -> None:
    x = np.zeros((4, 1, 8, 8), np.float32)
    p = tmp_path / "d.h5"
    assert one_line_error(write_dataset, p, {"train": (x, np.zeros((4, 8, 8), np.float32))}, task="field") == (
        f"{p}: /train/y: expected target fields of shape (N, T, *spatial), got (4, 8, 8); store a single field as "
        "(N, 1, *spatial)")
    assert one_line_error(write_dataset, p, {"train": (x, np.zeros((4, 3, 8, 4), np.float32))}, task="field") == (
        f"{p}: /train/y: spatial shape (8, 4) of y (N, T, *spatial) differs from /train/x spatial shape (8, 8)")
    assert one_line_error(write_dataset, p, {"train": (x, np.zeros((4, 1, 8, 8), np.int64))}, task="field") == (
        f"{p}: /train/y: expected float32 target fields of shape (N, T, *spatial), got int64 (4, 1, 8, 8)")
    tab = np.zeros((4, 6), np.float32)
    assert one_line_error(write_dataset, p, {"train": (tab, np.zeros((4, 1, 6), np.float32))}, task="field") == (
        f"{p}: /train/x: field needs inputs with spatial axes (N, C, *spatial), got (4, 6)")


def test_labels_out_of_range_name_the_pixel(tmp_path: Path) -> None:
    x, y = seg_arrays()
    y[7, 2, 3] = 3
    path = raw_h5(tmp_path / "d.h5", x, y, task="segmentation", num_classes=3)
    msg = f"{path}: /train/y: label 3 at pixel (2, 3) of sample 7 is outside [0, 3)"
    assert one_line_error(validate, path) == msg
    assert one_line_error(validate, path, chunk_bytes=64) == msg
    y[7, 2, 3] = -1  # the ignore label is not a class, and is allowed only where declared
    path = raw_h5(tmp_path / "e.h5", x, y, task="segmentation", num_classes=3, ignore_index=-1)
    assert validate(path).ignore_index == -1
    y[1, 0, 0] = 255
    path = raw_h5(tmp_path / "f.h5", x, y, task="segmentation", num_classes=3, ignore_index=-1)
    assert one_line_error(load, path) == (f"{path}: /train/y: label 255 at pixel (0, 0) of sample 1 is outside "
                                          "[0, 3) and not ignore_index -1")


def test_bad_ignore_index_and_field_nan(tmp_path: Path) -> None:
    x, y = seg_arrays()
    path = raw_h5(tmp_path / "d.h5", x, y, task="segmentation", num_classes=3, ignore_index=1)
    assert one_line_error(inspect, path) == (f"{path}: /: attribute 'ignore_index' 1 is one of the classes [0, 3); "
                                             "use a label outside them (e.g. -1 or 255)")
    assert one_line_error(write_dataset, tmp_path / "e.h5", {"train": (x, y)}, task="classification",
                          num_classes=3, ignore_index=255) == (
        f"{tmp_path / 'e.h5'}: /: attribute 'ignore_index' is only meaningful for segmentation, not classification")
    f = np.zeros((12, 1, 6, 5), np.float32)
    f[3, 0, 1, 1] = np.nan
    path = raw_h5(tmp_path / "g.h5", x, f, task="field")
    assert one_line_error(validate, path) == f"{path}: /train/y: non-finite target in sample 3"


def test_import_npz_dense(tmp_path: Path) -> None:
    x, y = seg_arrays(20, (8, 8))
    y[0, 0, 0] = 255
    npz = tmp_path / "seg.npz"
    np.savez(npz, x_train=x, y_train=y)
    hint = one_line_error(import_npz, npz, tmp_path / "a.h5")
    assert hint.endswith("expected class labels of shape (N,), got (20, 8, 8); pass --task segmentation for "
                         "labels per pixel")
    info = import_npz(npz, tmp_path / "s.h5", task="segmentation", ignore_index=255)
    assert (info.num_classes, info.ignore_index) == (3, 255)
    xl = np.ascontiguousarray(np.moveaxis(x, 1, -1))  # channels-last x and field: both moved
    np.savez(npz, x_train=xl, y_train=np.moveaxis(np.stack([x[:, 0], 2 * x[:, 1]], 1), 1, -1))
    info, data = load(import_npz(npz, tmp_path / "f.h5", task="field", channels_last=True).path, ("train",))
    assert info.y_sample_shape == (2, 8, 8) and np.allclose(data["train"][1][:, 1], 2 * x[:, 1])
