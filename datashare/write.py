"""Writing the Galapagos HDF5 format: arrays into a checked file, and ``.npz`` archives converted into one.

A file appears on disk only once it passed the same checks :mod:`datashare.format` makes when reading, so every
file written here loads.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import zipfile
from pathlib import Path
from typing import Mapping, Sequence

import h5py
import numpy as np

from . import mistakes
from .format import (DENSE_TASKS, FORMAT_VERSION, SPLITS, TASKS, DataError, DatasetInfo, check_dense_y,
                     check_ignore_index, check_task, check_values, check_x, check_y, data_error, dtype_name,
                     inspect_file, shape_str, validate, y_dtype)

log = logging.getLogger(__name__)

__all__ = ["write_dataset", "import_npz", "split_sizes", "consecutive_splits"]


def write_dataset(out_path: str | os.PathLike, splits: Mapping[str, tuple[np.ndarray, np.ndarray]], *, task: str,
                  num_classes: int | None = None, name: str | None = None, description: str | None = None,
                  target_names: Sequence[str] | None = None, compression: str | None = None,
                  ignore_index: int | None = None) -> DatasetInfo:
    """Write arrays in the format, atomically, after checking them (so a bad file never appears on disk).

    Labels of any integer dtype are stored as int64 and regression targets of any float dtype as float32;
    x must already be float32, float16 or uint8. `ignore_index` (segmentation) marks unlabelled pixels.
    Returns the info of the written file.
    """
    fname = str(out_path)
    unknown = [s for s in splits if s not in SPLITS]
    if unknown:
        raise data_error(fname, f"/{unknown[0]}", f"unknown split; expected some of {', '.join(SPLITS)}")
    task, num_classes = check_task(fname, task, num_classes)
    ignore_index = check_ignore_index(fname, task, num_classes, ignore_index)
    if "train" not in splits:
        raise data_error(fname, "/train", "missing group (a dataset needs at least a train split)")
    ydt = y_dtype(task)

    prepared: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for split in SPLITS:
        if split not in splits:
            continue
        x, y = (np.asarray(a) for a in splits[split])
        check_x(fname, split, x.shape, x.dtype)
        check_y(fname, split, y.shape, y.dtype, task)
        check_dense_y(fname, split, x.shape, y.shape, task)
        if len(y) != len(x):
            raise data_error(fname, f"/{split}/y", f"has {len(y)} samples but /{split}/x has {len(x)}")
        if len(x) == 0:
            raise data_error(fname, f"/{split}/x", "split is empty (0 samples)")
        prepared[split] = (x, y.astype(ydt, copy=False))

    Path(fname).parent.mkdir(parents=True, exist_ok=True)
    # a hidden temporary beside the target (same file system, so the rename is atomic); created by HDF5 itself
    # so it gets the usual umask permissions (mkstemp's 0600 would hide the dataset from a project group)
    tmp = str(Path(fname).parent / f".{Path(fname).name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with h5py.File(tmp, "x") as f:
            f.attrs["task"] = task
            f.attrs["format_version"] = FORMAT_VERSION
            if num_classes is not None:
                f.attrs["num_classes"] = np.int64(num_classes)
            if ignore_index is not None:
                f.attrs["ignore_index"] = np.int64(ignore_index)
            if name is not None:
                f.attrs["name"] = str(name)
            if description is not None:
                f.attrs["description"] = str(description)
            if target_names is not None:
                f.attrs["target_names"] = np.array([str(t) for t in target_names], dtype=h5py.string_dtype())
            for split, (x, y) in prepared.items():
                g = f.create_group(split)
                opts = {"compression": compression, "chunks": True} if compression else {}
                g.create_dataset("x", data=x, **opts)
                g.create_dataset("y", data=y, **opts)
        # validate the structure (and attrs) of what was written, then the values, naming the final path
        with h5py.File(tmp, "r") as f:
            info = dataclasses.replace(inspect_file(f, fname), path=fname)
        for split, (x, y) in prepared.items():
            check_values(info, split, x, y)
        os.replace(tmp, fname)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    log.info("wrote %s: %s", fname, ", ".join(f"{k} {v}" for k, v in info.splits.items()))
    return info


def _npz_pair(fname: str, data: Mapping[str, np.ndarray], split: str) -> tuple[np.ndarray, np.ndarray] | None:
    kx, ky = f"x_{split}", f"y_{split}"
    if kx not in data and ky not in data:
        return None
    for have, miss in ((kx, ky), (ky, kx)):
        if have in data and miss not in data:
            raise data_error(fname, miss, f"missing array ({have} is present)")
    x, y = data[kx], data[ky]
    if x.ndim == 0 or y.ndim == 0:
        raise data_error(fname, kx if x.ndim == 0 else ky, "expected an array with a sample axis, got a scalar")
    if len(x) != len(y):
        raise data_error(fname, ky, f"has {len(y)} samples but {kx} has {len(x)}")
    return x, y


def _npz_x(fname: str, key: str, x: np.ndarray) -> np.ndarray:
    if x.dtype.kind == "b":
        return x.astype(np.uint8)
    if x.dtype == np.uint8 or dtype_name(x.dtype) in ("float32", "float16"):
        return x.astype(x.dtype.newbyteorder("="), copy=False)
    if x.dtype.kind in "iuf":
        return x.astype(np.float32)
    raise data_error(fname, key, f"expected numeric inputs, got dtype {x.dtype}")


def _load_npz(src: str, out_path: str | os.PathLike, overwrite: bool) -> dict[str, np.ndarray]:
    """The archive's arrays, once it is known to be a readable .npz and the output may be written."""
    p = Path(src)
    if not p.is_file():
        raise DataError(f"{src}: no such file: it does not exist (check the path)")
    if Path(out_path).exists() and not overwrite:
        raise data_error(str(out_path), "/", "already exists; give another output file, or --force to replace it")
    if not zipfile.is_zipfile(src):
        raise data_error(src, "/", "not a .npz archive (numpy.savez writes one; this file is not a zip archive)")
    try:
        with np.load(src, allow_pickle=False) as z:
            raw = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError) as e:
        raise data_error(src, "/", f"cannot read as .npz: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    known = {f"{a}_{s}" for a in "xy" for s in SPLITS}
    extra = sorted(set(raw) - known)
    if extra:
        log.warning("%s: ignoring arrays %s", src, extra)
    return raw


def _npz_pairs(src: str, raw: Mapping[str, np.ndarray]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each split's (x, y), train among them, none empty."""
    pairs = {s: pair for s in SPLITS if (pair := _npz_pair(src, raw, s)) is not None}
    if "train" not in pairs:
        raise data_error(src, "x_train", "missing array (x_train and y_train are required)")
    for s, (x, _) in pairs.items():
        if len(x) == 0:
            raise data_error(src, f"x_{s}", "has 0 samples")
    return pairs


def _infer_task(src: str, pairs: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> str:
    """Integer labels mean classification, floats regression; every split's labels must agree with train's."""
    kinds = {s: y.dtype.kind for s, (_, y) in pairs.items()}
    task = "classification" if kinds["train"] in "iub" else "regression"
    for s, k in kinds.items():
        if (k in "iub") != (task == "classification"):
            raise data_error(src, f"y_{s}", f"dtype {pairs[s][1].dtype} disagrees with y_train dtype "
                                       f"{pairs['train'][1].dtype}; pass task= explicitly")
    return task


def _class_y(src: str, key: str, y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Class labels as int64 of shape (N,): whole, non-negative numbers."""
    if y.ndim == 2 and y.shape[1] == 1:
        y = y.reshape(-1)
    if y.dtype.kind == "f":
        if not np.all(np.isfinite(y)) or not np.all(y == np.round(y)):
            raise data_error(src, key, "classification labels must be whole numbers")
    elif y.dtype.kind not in "iub":
        raise data_error(src, key, f"expected integer class labels, got dtype {y.dtype}")
    if y.ndim != 1:
        hint = "; pass --task segmentation for labels per pixel" if y.shape[1:] == x.shape[2:] else ""
        raise data_error(src, key, f"expected class labels of shape (N,), got {shape_str(y.shape)}" + hint)
    if len(y) and y.min() < 0:
        first = int(np.flatnonzero(y < 0)[0])
        raise data_error(src, key, f"negative label {int(y[first])} at sample {first}")
    return y.astype(np.int64)


def _regression_y(src: str, key: str, y: np.ndarray) -> np.ndarray:
    """Regression targets as float32 of shape (N, T)."""
    if y.dtype.kind not in "iubf":
        raise data_error(src, key, f"expected numeric regression targets, got dtype {y.dtype}")
    y = y.astype(np.float32)
    return y.reshape(-1, 1) if y.ndim == 1 else y


def _checked_labels(src: str, out: dict[str, tuple[np.ndarray, np.ndarray]], inferred: bool, relabel: bool,
                    num_classes: int | None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The classification splits, their labels checked for layout mistakes (datashare.mistakes) and mapped to
    0..K-1 if `relabel`; a strong class imbalance is a warning."""
    labels = np.unique(np.concatenate([y for _, y in out.values()]))
    if inferred and (why := mistakes.many_classes(f"{src}: y", labels)):
        raise DataError(why)
    if relabel:
        out = {s: (x, np.searchsorted(labels, y).astype(np.int64)) for s, (x, y) in out.items()}
    elif num_classes is None and (why := mistakes.label_gaps(f"{src}: y", labels)):
        raise DataError(why)
    counts = dict(zip(*np.unique(out["train"][1], return_counts=True)))
    if why := mistakes.imbalance(f"{src}: y_train", {int(k): int(v) for k, v in counts.items()}):
        log.warning("%s", why)
    return out


def import_npz(npz_path: str | os.PathLike, out_path: str | os.PathLike, *, task: str | None = None,
               num_classes: int | None = None, name: str | None = None, description: str | None = None,
               target_names: Sequence[str] | None = None, overwrite: bool = False,
               channels_last: bool | None = None, relabel: bool = False, ignore_index: int | None = None
               ) -> DatasetInfo:
    """Convert a .npz (x_train, y_train and optional x_val/y_val, x_test/y_test) into the format.

    The task is inferred from the labels unless given: integers mean classification with max label + 1
    classes, floats mean regression; (N,) inputs or regression targets become (N, 1); float64 inputs become
    float32. The output is written atomically and validated; an existing output file is kept unless `overwrite`.

    Layout mistakes are refused with the fix rather than guessed (datashare.mistakes): samples that look
    channels-last (`channels_last=True` moves the last axis first, False keeps them as they are), labels that
    start at 1 or skip values (`relabel` maps the distinct labels to 0..K-1; `num_classes` keeps them), and
    hundreds of distinct integer targets when the task was only inferred. A strong class imbalance is a warning.
    The dense tasks are never inferred: `task="segmentation"` (y (N, *spatial) labels, `ignore_index` for
    unlabelled pixels) or `task="field"` (y (N, T, *spatial), moved channels-first with x by `channels_last`).
    """
    src = str(npz_path)
    raw = _load_npz(src, out_path, overwrite)
    inferred = task is None
    if task is not None and task not in TASKS:
        raise data_error(src, "/", f"task must be one of {', '.join(TASKS)}, got {task!r}")
    pairs = _npz_pairs(src, raw)
    if task is None:
        task = _infer_task(src, pairs)

    suspect = mistakes.channels_last(f"{src}: x_train", pairs["train"][0].shape[1:])
    if suspect and channels_last is None:
        raise DataError(suspect)
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for s, (x, y) in pairs.items():
        x = _npz_x(src, f"x_{s}", x)
        if x.ndim == 1:
            x = x.reshape(-1, 1)
        if channels_last and x.ndim >= 3:
            x = np.ascontiguousarray(np.moveaxis(x, -1, 1))
        if task in DENSE_TASKS:
            y = _dense_y(src, f"y_{s}", y, task, bool(channels_last))
        elif task == "classification":
            y = _class_y(src, f"y_{s}", y, x)
        else:
            y = _regression_y(src, f"y_{s}", y)
        out[s] = (x, y)

    if task == "classification":
        out = _checked_labels(src, out, inferred, relabel, num_classes)
    if task == "classification" and num_classes is None:
        num_classes = max(int(y.max()) for _, y in out.values()) + 1
        if num_classes < 2:
            raise data_error(src, "y_train", "every label is 0; classification needs at least 2 classes")
    if task == "segmentation" and num_classes is None:
        labelled = [y[y != ignore_index] if ignore_index is not None else y for _, y in out.values()]
        num_classes = max(int(y.max()) for y in labelled if y.size) + 1
    write_dataset(out_path, out, task=task, num_classes=num_classes, name=name, description=description,
                  target_names=target_names, ignore_index=ignore_index)
    return validate(out_path)


def _dense_y(src: str, key: str, y: np.ndarray, task: str, channels_last: bool) -> np.ndarray:
    """Labels per pixel as int64, or target fields as float32 (channels-last fields moved like x)."""
    if task == "segmentation":
        if y.dtype.kind == "f" and not np.all(y == np.round(y)):
            raise data_error(src, key, "segmentation labels must be whole numbers")
        if y.dtype.kind not in "iubf":
            raise data_error(src, key, f"expected integer class labels per pixel, got dtype {y.dtype}")
        return y.astype(np.int64)
    if y.dtype.kind not in "iubf":
        raise data_error(src, key, f"expected numeric target fields, got dtype {y.dtype}")
    if channels_last and y.ndim >= 3:
        y = np.moveaxis(y, -1, 1)
    return np.ascontiguousarray(y, dtype=np.float32)


def split_sizes(n: int, fractions: Sequence[float] = (0.7, 0.15, 0.15)) -> tuple[int, ...]:
    """Sizes of consecutive splits of ``n`` samples by ``fractions`` (each at least 1; the first takes the rest)."""
    if n < len(fractions):
        raise ValueError(f"{n} samples cannot fill {len(fractions)} splits")
    total = float(sum(fractions))
    rest = [max(1, int(round(n * f / total))) for f in fractions[1:]]
    first = n - sum(rest)
    if first < 1:
        raise ValueError(f"{n} samples are too few for split fractions {tuple(fractions)}")
    return (first, *rest)


def consecutive_splits(x: np.ndarray, y: np.ndarray, fractions: Sequence[float] = (0.7, 0.15, 0.15)
                       ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """train, val and test as consecutive slices of (x, y), sized by :func:`split_sizes` (views, not copies)."""
    n_train, n_val, _ = split_sizes(len(x), fractions)
    cut = (0, n_train, n_train + n_val, len(x))
    return {name: (x[cut[i]:cut[i + 1]], y[cut[i]:cut[i + 1]]) for i, name in enumerate(("train", "val", "test"))}
