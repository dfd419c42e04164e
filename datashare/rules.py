"""The format's shape and dtype rules, shared by the reader (h5py datasets) and the writer (numpy arrays).

x is ``(N, C, *spatial)`` (0 to 3 spatial axes) or ``(N, F)``; y holds per sample a class label
(``classification``, y ``(N,)`` int64), a vector of targets (``regression``, y ``(N, T)`` float32), a class
per pixel/voxel (``segmentation``, y ``(N, *spatial)`` int64, ``spatial`` as x's, with an optional
``ignore_index`` label for unlabelled pixels) or T target channels per pixel (``field``, y ``(N, T, *spatial)``
float32). The last two are the *dense* tasks. Every problem is a one-line :class:`DataError`;
:mod:`datashare.format` re-exports everything here.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["DataError", "TASKS", "CLASS_TASKS", "DENSE_TASKS", "X_DTYPES", "MAX_SPATIAL_DIMS", "data_error",
           "dtype_name", "shape_str", "check_x", "check_y", "check_dense_y", "check_task", "check_ignore_index",
           "y_dtype"]

TASKS = ("classification", "regression", "segmentation", "field")
#: tasks whose y holds class labels (and whose files carry num_classes)
CLASS_TASKS = ("classification", "segmentation")
#: tasks with an output per pixel/voxel: y keeps x's spatial axes
DENSE_TASKS = ("segmentation", "field")
#: allowed input dtypes (numpy names); anything else must be converted by the user (e.g. with write.import_npz)
X_DTYPES = ("float32", "float16", "uint8")
MAX_SPATIAL_DIMS = 3


class DataError(ValueError):
    """A dataset file (or array about to become one) that breaks the format; the message is one line."""


def data_error(fname: str, where: str, what: str) -> DataError:
    """The one-line error for a problem ``what`` at ``where`` (a dataset path, or an .npz key) of file ``fname``."""
    return DataError(f"{fname}: {where}: {what}")


def dtype_name(dt: np.dtype) -> str:
    """Byte-order free name ('float32', 'int64', ...); h5py may report big-endian dtypes."""
    dt = np.dtype(dt)
    if dt.fields is not None or dt.kind in "OSUV":
        return str(dt)
    return dt.newbyteorder("=").name


def shape_str(shape: Sequence[int]) -> str:
    """A shape as Python writes a tuple: ``(3,)``, ``(2, 5)``."""
    return "(" + ", ".join(str(int(s)) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def check_x(fname: str, split: str, shape: tuple[int, ...], dtype: np.dtype) -> tuple[tuple[int, ...], int]:
    """Check an x shape/dtype; return (sample_shape, spatial_dims)."""
    where = f"/{split}/x"
    name = dtype_name(dtype)
    if name not in X_DTYPES:
        raise data_error(fname, where, f"expected dtype float32, float16 or uint8, got {name} {shape_str(shape)}"
                    + ("; convert it to float32" if np.dtype(dtype).kind in "fiub" else ""))
    if len(shape) < 2:
        raise data_error(fname, where, f"expected shape (N, F) or (N, C, *spatial), got {shape_str(shape)}")
    spatial = len(shape) - 2
    if spatial > MAX_SPATIAL_DIMS:
        raise data_error(fname, where, f"expected at most {MAX_SPATIAL_DIMS} spatial dims in (N, C, *spatial), "
                                  f"got shape {shape_str(shape)} ({spatial} spatial dims)")
    sample = tuple(int(s) for s in shape[1:])
    if any(s == 0 for s in sample):
        raise data_error(fname, where, f"empty sample shape in {shape_str(shape)}")
    return sample, spatial


def check_y(fname: str, split: str, shape: tuple[int, ...], dtype: np.dtype, task: str) -> int | None:
    """Check a y shape/dtype; return the number of regression or field targets (None for class labels)."""
    where = f"/{split}/y"
    dt = np.dtype(dtype)
    got = f"{dtype_name(dt)} {shape_str(shape)}"
    if task == "classification":
        # int64 is the format; other integer widths are read and widened to int64 by load()
        if dt.kind not in "iu" or len(shape) != 1:
            raise data_error(fname, where, f"expected int64 class labels of shape (N,), got {got}")
        return None
    if task == "segmentation":
        if dt.kind not in "iu" or len(shape) < 2:
            raise data_error(fname, where, f"expected int64 class labels per pixel of shape (N, *spatial), got {got}")
        return None
    if task == "field":
        if dt.kind != "f" or len(shape) < 3:
            raise data_error(fname, where, f"expected float32 target fields of shape (N, T, *spatial), got {got}")
        if shape[1] < 1:
            raise data_error(fname, where, f"expected at least one target channel, got {got}")
        return int(shape[1])
    if dt.kind != "f" or len(shape) != 2:
        hint = "; store a single target as shape (N, 1)" if len(shape) == 1 and dt.kind == "f" else ""
        raise data_error(fname, where, f"expected float32 regression targets of shape (N, T), got {got}{hint}")
    if shape[1] < 1:
        raise data_error(fname, where, f"expected at least one regression target, got {got}")
    return int(shape[1])


def check_dense_y(fname: str, split: str, x_shape: tuple[int, ...], y_shape: tuple[int, ...], task: str) -> None:
    """For the dense tasks: y's spatial axes must be x's (x of (N, C, *spatial), never tabular (N, F))."""
    if task not in DENSE_TASKS:
        return
    x_spatial = tuple(x_shape[2:])
    if not x_spatial:
        raise data_error(fname, f"/{split}/x", f"{task} needs inputs with spatial axes (N, C, *spatial), got "
                                          f"{shape_str(x_shape)}")
    y_spatial = tuple(y_shape[1:] if task == "segmentation" else y_shape[2:])
    if task == "field" and tuple(y_shape[1:]) == x_spatial:
        raise data_error(fname, f"/{split}/y", f"expected target fields of shape (N, T, *spatial), got "
                                              f"{shape_str(y_shape)}; store a single field as (N, 1, *spatial)")
    if y_spatial != x_spatial:
        want = "(N, *spatial)" if task == "segmentation" else "(N, T, *spatial)"
        raise data_error(fname, f"/{split}/y", f"spatial shape {shape_str(y_spatial)} of y {want} differs from "
                                          f"/{split}/x spatial shape {shape_str(x_spatial)}")


def check_task(fname: str, task: object, num_classes: object) -> tuple[str, int | None]:
    """Check the root attributes ``task`` and ``num_classes``; return them (num_classes None without classes)."""
    if task is None:
        raise data_error(fname, "/", f"missing root attribute 'task' (one of {', '.join(TASKS)})")
    if isinstance(task, bytes):
        task = task.decode("utf-8", "replace")
    if not isinstance(task, str) or task not in TASKS:
        raise data_error(fname, "/", f"attribute 'task' must be one of {', '.join(TASKS)}, got {task!r}")
    if task not in CLASS_TASKS:
        return task, None
    if num_classes is None:
        raise data_error(fname, "/", f"attribute 'num_classes' is required for {task}")
    n = _integer(fname, "num_classes", num_classes)
    if n < 2:
        raise data_error(fname, "/", f"attribute 'num_classes' must be at least 2, got {n}")
    return task, n


def _integer(fname: str, name: str, value: object) -> int:
    arr = np.asarray(value)
    if arr.size != 1 or arr.dtype.kind not in "iuf" or not float(arr.reshape(-1)[0]).is_integer():
        raise data_error(fname, "/", f"attribute {name!r} must be an integer, got {value!r}")
    return int(arr.reshape(-1)[0])


def check_ignore_index(fname: str, task: str, num_classes: int | None, value: object) -> int | None:
    """The optional ``ignore_index`` attribute: a segmentation label outside [0, num_classes) that marks
    unlabelled pixels (no loss, no metric); None when absent."""
    if value is None:
        return None
    if task != "segmentation":
        raise data_error(fname, "/", f"attribute 'ignore_index' is only meaningful for segmentation, not {task}")
    n = _integer(fname, "ignore_index", value)
    assert num_classes is not None
    if 0 <= n < num_classes:
        raise data_error(fname, "/", f"attribute 'ignore_index' {n} is one of the classes [0, {num_classes}); "
                                 "use a label outside them (e.g. -1 or 255)")
    return n


def y_dtype(task: str) -> np.dtype:
    """The dtype of y in memory for a task: int64 class labels or float32 targets."""
    return np.dtype(np.int64) if task in CLASS_TASKS else np.dtype(np.float32)
