"""The Galapagos HDF5 dataset format: its definition, inspection, validation and loading.

One file per dataset, groups ``train`` (required), ``val`` and ``test`` (optional), each holding ``x`` and ``y``.
Validation happens here, once, so that nothing downstream trains on data that did not validate; every problem is
reported as a one-line :class:`DataError` naming the file, the dataset inside it and what is wrong. Files are
written (and ``.npz`` archives imported) by :mod:`datashare.write`, with the same shape and dtype rules.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import h5py
import numpy as np

from .carve import carve_val
from .rules import (CLASS_TASKS, DENSE_TASKS, TASKS, X_DTYPES, DataError, check_dense_y, check_ignore_index, check_task,
                    check_x, check_y, data_error, dtype_name, shape_str, y_dtype)

log = logging.getLogger(__name__)

__all__ = ["DataError", "DatasetInfo", "SPLITS", "TASKS", "X_DTYPES", "inspect", "check_values", "load", "validate",
           "describe", "data_error", "dtype_name", "shape_str", "check_x", "check_y", "check_task", "open_file",
           "split_datasets", "inspect_file", "y_dtype", "CLASS_TASKS", "DENSE_TASKS", "check_dense_y",
           "check_ignore_index"]

SPLITS = ("train", "val", "test")
FORMAT_VERSION = 1
#: bytes of x (or y) looked at per step when checking values, so big splits need no big temporaries
CHECK_CHUNK_BYTES = 16 << 20


@dataclass(frozen=True)
class DatasetInfo:
    """What a dataset file holds, known without reading its arrays."""

    path: str
    task: str
    num_classes: int | None
    num_targets: int
    sample_shape: tuple[int, ...]
    spatial_dims: int
    x_dtype: str
    splits: dict[str, int]
    name: str | None = None
    description: str | None = None
    target_names: tuple[str, ...] | None = None
    #: set by load() when val was carved from train (splits then gives the sizes load returned)
    val_from_train: bool = False
    #: segmentation only: the label of unlabelled pixels (outside [0, num_classes)), or None
    ignore_index: int | None = None

    @property
    def is_dense(self) -> bool:
        """True for segmentation and field data: an output per pixel/voxel."""
        return self.task in DENSE_TASKS

    @property
    def y_sample_shape(self) -> tuple[int, ...]:
        """One sample's y: () a label, (T,) targets, (*spatial) labels per pixel, (T, *spatial) target fields."""
        return {"classification": (), "regression": (self.num_targets,), "segmentation": self.sample_shape[1:],
                "field": (self.num_targets, *self.sample_shape[1:])}[self.task]

    @property
    def is_classification(self) -> bool:
        return self.task == "classification"

    @property
    def in_channels(self) -> int:
        """Channels of an image-like sample; for tabular data, the number of features."""
        return self.sample_shape[0]


def _text_attr(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray) and value.size == 1:
        return _text_attr(value.reshape(-1)[0])
    return str(value)


def _names_attr(fname: str, value: object, expected: int) -> tuple[str, ...] | None:
    if value is None:
        return None
    items = [value] if isinstance(value, (str, bytes)) else list(np.asarray(value, dtype=object).reshape(-1))
    names = tuple(v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in items)
    if len(names) != expected:
        raise data_error(fname, "/", f"attribute 'target_names' has {len(names)} names, expected {expected}")
    return names


# ----------------------------------------------------------------------------------------------------------------
# reading


def open_file(path: str | os.PathLike) -> h5py.File:
    """Open a dataset file read-only; a missing, non-HDF5 or unreadable file is a DataError, not an OSError."""
    fname = str(path)
    p = Path(path)
    if not p.exists():
        raise DataError(f"{fname}: no such file: it does not exist (check the path; `galapagos data import X.npz "
                        "X.h5` converts NumPy arrays, `python -m galapagos.examples.shapes --out shapes.h5` writes an "
                        "example)")
    if p.is_dir():
        raise data_error(fname, "/", "is a directory, expected an HDF5 file")
    try:
        if not h5py.is_hdf5(fname):
            if p.suffix.lower() == ".npz" or zipfile.is_zipfile(fname):
                raise DataError(f"{fname}: a NumPy .npz archive, not the HDF5 format Galapagos reads: convert it "
                                f"with `galapagos data import {fname} {p.with_suffix('.h5')}`, then give the .h5")
            raise data_error(fname, "/", "not an HDF5 file")
        return h5py.File(fname, "r")
    except DataError:
        raise
    except OSError as e:
        raise data_error(fname, "/", f"cannot open as HDF5: {str(e).splitlines()[0] if str(e) else type(e).__name__}")


def split_datasets(f: h5py.File, fname: str, split: str) -> tuple[h5py.Dataset, h5py.Dataset]:
    """The ``x`` and ``y`` datasets of a split of an open file."""
    if split not in f:
        raise data_error(fname, f"/{split}", "missing group")
    grp = f[split]
    if not isinstance(grp, h5py.Group):
        raise data_error(fname, f"/{split}", "expected a group holding datasets 'x' and 'y', found a dataset")
    out = []
    for key in ("x", "y"):
        if key not in grp:
            raise data_error(fname, f"/{split}/{key}", "missing dataset")
        ds = grp[key]
        if not isinstance(ds, h5py.Dataset):
            raise data_error(fname, f"/{split}/{key}", "expected a dataset, found a group")
        out.append(ds)
    return out[0], out[1]


def inspect_file(f: h5py.File, fname: str) -> DatasetInfo:
    """:func:`inspect` of an already open file; errors (and the info's path) name it ``fname``."""
    task, num_classes = check_task(fname, f.attrs.get("task"), f.attrs.get("num_classes"))
    if "train" not in f:
        raise data_error(fname, "/train", "missing group (a dataset needs at least a train split)")
    extra = [k for k in f.keys() if k not in SPLITS]
    if extra:
        log.warning("%s: ignoring groups %s (only %s are read)", fname, extra, ", ".join(SPLITS))

    splits: dict[str, int] = {}
    ref: tuple[str, tuple[int, ...], str, int | None] | None = None  # split, sample shape, dtype, targets
    spatial = 0
    for split in SPLITS:
        if split not in f:
            continue
        x, y = split_datasets(f, fname, split)
        sample, spatial = check_x(fname, split, x.shape, x.dtype)
        targets = check_y(fname, split, y.shape, y.dtype, task)
        check_dense_y(fname, split, x.shape, y.shape, task)
        n = int(x.shape[0])
        if int(y.shape[0]) != n:
            raise data_error(fname, f"/{split}/y", f"has {y.shape[0]} samples but /{split}/x has {n}")
        if n == 0:
            raise data_error(fname, f"/{split}/x", "split is empty (0 samples)")
        xdt = dtype_name(x.dtype)
        if ref is None:
            ref = (split, sample, xdt, targets)
        else:
            rsplit, rsample, rdt, rtargets = ref
            if sample != rsample:
                raise data_error(fname, f"/{split}/x", f"sample shape {shape_str(sample)} differs from "
                                                  f"/{rsplit}/x sample shape {shape_str(rsample)}")
            if xdt != rdt:
                raise data_error(fname, f"/{split}/x", f"dtype {xdt} differs from /{rsplit}/x dtype {rdt}")
            if targets != rtargets:
                raise data_error(fname, f"/{split}/y", f"{targets} targets differ from {rtargets} in /{rsplit}/y")
        splits[split] = n
    assert ref is not None
    _, sample_shape, x_dtype, targets = ref
    num_targets = num_classes if task in CLASS_TASKS else targets
    assert num_targets is not None
    return DatasetInfo(
        path=fname,
        task=task,
        num_classes=num_classes,
        num_targets=int(num_targets),
        sample_shape=sample_shape,
        spatial_dims=len(sample_shape) - 1,
        x_dtype=x_dtype,
        splits=splits,
        name=_text_attr(f.attrs.get("name")),
        description=_text_attr(f.attrs.get("description")),
        target_names=_names_attr(fname, f.attrs.get("target_names"), int(num_targets)),
        ignore_index=check_ignore_index(fname, task, num_classes, f.attrs.get("ignore_index")),
    )


def inspect(path: str | os.PathLike) -> DatasetInfo:
    """Check a file's structure, attributes, shapes and dtypes without reading its arrays (cheap on any size)."""
    with open_file(path) as f:
        return inspect_file(f, str(path))


def _rows_per_chunk(sample_nbytes: int, hdf5_chunk_rows: int | None = None, chunk_bytes: int = CHECK_CHUNK_BYTES
                    ) -> int:
    rows = max(1, chunk_bytes // max(1, sample_nbytes))
    if hdf5_chunk_rows:  # whole HDF5 chunks per read, so no chunk is decompressed twice
        rows = max(hdf5_chunk_rows, rows // hdf5_chunk_rows * hdf5_chunk_rows)
    return rows


def _first_bad_row(bad: np.ndarray) -> int | None:
    rows = bad.reshape(len(bad), -1).any(axis=1) if bad.ndim > 1 else bad
    idx = np.flatnonzero(rows)
    return int(idx[0]) if idx.size else None


def check_values(info: DatasetInfo, split: str, x: np.ndarray | None, y: np.ndarray | None, *,
                 offset: int = 0, chunk_bytes: int = CHECK_CHUNK_BYTES) -> None:
    """Reject NaN/inf inputs or targets and labels outside [0, num_classes), naming the first bad sample.

    Works in slices of about ``chunk_bytes`` so the check of a huge split needs no huge temporaries; ``offset``
    is added to reported indices (for callers that pass a slice of a split).
    """
    fname = info.path
    if x is not None and x.dtype.kind == "f" and len(x):
        step = _rows_per_chunk(x[0].nbytes, chunk_bytes=chunk_bytes)
        for a in range(0, len(x), step):
            block = x[a:a + step]
            if np.isfinite(block.min()) and np.isfinite(block.max()):  # NaN and inf show in min/max: one cheap pass
                continue
            bad = _first_bad_row(~np.isfinite(block))
            if bad is not None:
                v = np.asarray(block[bad]).reshape(-1)
                v = v[~np.isfinite(v)][0]
                raise data_error(fname, f"/{split}/x", f"non-finite value ({v}) in sample {offset + a + bad}")
    if y is not None and len(y):
        step = _rows_per_chunk(max(1, y[0].nbytes), chunk_bytes=chunk_bytes)
        for a in range(0, len(y), step):
            block = y[a:a + step]
            if info.task in CLASS_TASKS:
                assert info.num_classes is not None
                outside = (block < 0) | (block >= info.num_classes)
                if info.ignore_index is not None:
                    outside &= block != info.ignore_index
                bad = _first_bad_row(outside)
                if bad is not None and info.task == "segmentation":
                    at = tuple(int(i) for i in np.argwhere(outside[bad])[0])
                    raise data_error(fname, f"/{split}/y", f"label {int(block[bad][at])} at pixel {at} of sample "
                                     f"{offset + a + bad} is outside [0, {info.num_classes})"
                                     + ("" if info.ignore_index is None else f" and not ignore_index "
                                        f"{info.ignore_index}"))
                if bad is not None:
                    raise data_error(fname, f"/{split}/y", f"label {int(block[bad])} of sample {offset + a + bad} "
                                                      f"is outside [0, {info.num_classes})")
            else:
                bad = _first_bad_row(~np.isfinite(block))
                if bad is not None:
                    raise data_error(fname, f"/{split}/y", f"non-finite target in sample {offset + a + bad}")


def _read(ds: h5py.Dataset, dtype: np.dtype) -> np.ndarray:
    """Read a whole dataset into a fresh native-endian contiguous array (h5py converts in place)."""
    out = np.empty(ds.shape, dtype=dtype)
    if out.size:
        ds.read_direct(out)
    return out


def validate(path: str | os.PathLike, *, chunk_bytes: int = CHECK_CHUNK_BYTES) -> DatasetInfo:
    """Inspect a file and check every value of every split, reading slices so memory stays small."""
    fname = str(path)
    with open_file(path) as f:
        info = inspect_file(f, fname)
        ydt = y_dtype(info.task)
        for split in info.splits:
            x, y = split_datasets(f, fname, split)
            xdt = np.dtype(info.x_dtype)
            step = _rows_per_chunk(math.prod(info.sample_shape) * xdt.itemsize,
                                   x.chunks[0] if x.chunks else None, chunk_bytes)
            for a in range(0, len(x) if xdt.kind == "f" else 0, step):  # uint8 has no bad values
                b = min(len(x), a + step)
                check_values(info, split, x[a:b].astype(xdt, copy=False), None, offset=a, chunk_bytes=chunk_bytes)
            y_bytes = info.num_targets * 8 if not info.is_dense else math.prod(info.y_sample_shape) * 8
            step = _rows_per_chunk(max(1, y_bytes), y.chunks[0] if y.chunks else None, chunk_bytes)
            for a in range(0, len(y), step):
                b = min(len(y), a + step)
                check_values(info, split, None, y[a:b].astype(ydt, copy=False), offset=a, chunk_bytes=chunk_bytes)
    return info


def load(path: str | os.PathLike, splits: Iterable[str] = SPLITS, *, val_fraction: float = 0.1, seed: int = 0
         ) -> tuple[DatasetInfo, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Read and validate the requested splits (x in its file dtype, y as int64 labels or float32 targets).

    If ``val`` is requested but the file has none, it is carved from train with a fixed seed (and removed
    from train). Requested splits that the file lacks (``test``) are absent from the result. The returned
    info's ``splits`` gives the sizes of the returned arrays.
    """
    wanted = list(dict.fromkeys(splits))
    unknown = [s for s in wanted if s not in SPLITS]
    if unknown:
        raise ValueError(f"unknown split(s) {unknown}; expected some of {SPLITS}")
    fname = str(path)
    with open_file(path) as f:
        info = inspect_file(f, fname)
        carve = "val" in wanted and "val" not in info.splits
        to_read = [s for s in SPLITS if s in info.splits and (s in wanted or (carve and s == "train"))]
        xdt, ydt = np.dtype(info.x_dtype), y_dtype(info.task)
        data: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for split in to_read:
            xs, ys = split_datasets(f, fname, split)
            x, y = _read(xs, xdt), _read(ys, ydt)
            check_values(info, split, x, y)
            data[split] = (x, y)
            log.debug("%s: read %s: x %s %s, y %s", fname, split, x.shape, x.dtype, y.shape)
    if carve:
        x, y = data.pop("train")
        try:
            train, val = carve_val(x, y, val_fraction=val_fraction, seed=seed)
        except ValueError as e:
            raise data_error(fname, "/train", str(e)) from None
        if "train" in wanted:
            data["train"] = train
        data["val"] = val
        log.info("%s: no val split; carved %d of %d train samples (seed %d)", fname, len(val[1]), len(y), seed)
    data = {s: data[s] for s in SPLITS if s in data}
    info = dataclasses.replace(info, splits={s: len(v[1]) for s, v in data.items()}, val_from_train=carve)
    return info, data


def describe(info: DatasetInfo) -> str:
    """A short human summary of a dataset (for ``galapagos data check/info``)."""
    lines = [f"{info.path}: {info.name or '(unnamed)'}"]
    if info.description:
        lines.append(f"  description: {info.description}")
    if info.task in CLASS_TASKS:
        what = f"{info.task}, {info.num_classes} classes" + (" per pixel" if info.is_dense else "")
        if info.ignore_index is not None:
            what += f", label {info.ignore_index} ignored"
    else:
        what = f"{info.task}, {info.num_targets} target{'s' if info.num_targets != 1 else ''}" + (
            " per pixel" if info.is_dense else "")
    lines.append(f"  task:        {what}")
    if info.target_names:
        label = "classes" if info.task in CLASS_TASKS else "targets"
        lines.append(f"  {label + ':':12} {', '.join(info.target_names)}")
    kind = "tabular (N, F)" if info.spatial_dims == 0 else f"{info.spatial_dims}-D, {info.in_channels} channel(s)"
    lines.append(f"  sample:      {shape_str(info.sample_shape)} {info.x_dtype}, {kind}")
    sizes = ", ".join(f"{k} {v}" for k, v in info.splits.items())
    lines.append(f"  splits:      {sizes}" + (" (val carved from train)" if info.val_from_train else ""))
    return "\n".join(lines)
