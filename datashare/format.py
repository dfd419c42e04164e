"""The Galapagos HDF5 dataset format: inspection, validation, loading and writing.

One file per dataset, groups ``train`` (required), ``val`` and ``test`` (optional), each holding ``x`` and ``y``.
Validation happens here, once, so that nothing downstream trains on data that did not validate; every problem is
reported as a one-line :class:`DataError` naming the file, the dataset inside it and what is wrong.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import h5py
import numpy as np

log = logging.getLogger(__name__)

__all__ = [
    "DataError",
    "DatasetInfo",
    "SPLITS",
    "TASKS",
    "X_DTYPES",
    "inspect",
    "check_values",
    "load",
    "validate",
    "describe",
    "import_npz",
    "write_dataset",
    "carve_val",
    "carve_indices",
    "split_sizes",
]

SPLITS = ("train", "val", "test")
TASKS = ("classification", "regression")
#: allowed input dtypes (numpy names); anything else must be converted by the user (e.g. with import_npz)
X_DTYPES = ("float32", "float16", "uint8")
MAX_SPATIAL_DIMS = 3
FORMAT_VERSION = 1
#: bytes of x (or y) looked at per step when checking values, so big splits need no big temporaries
CHECK_CHUNK_BYTES = 16 << 20


class DataError(ValueError):
    """A dataset file (or array about to become one) that breaks the format; the message is one line."""


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

    @property
    def output_size(self) -> int:
        """Width of a network's output layer: classes for classification, targets for regression."""
        return self.num_targets

    @property
    def is_classification(self) -> bool:
        return self.task == "classification"

    @property
    def is_tabular(self) -> bool:
        """True for (N, F) inputs, which have features but no channels or spatial axes."""
        return self.spatial_dims == 0

    @property
    def in_channels(self) -> int:
        """Channels of an image-like sample; for tabular data, the number of features."""
        return self.sample_shape[0]

    @property
    def num_features(self) -> int:
        """Values per sample (what a flattening first layer sees)."""
        return math.prod(self.sample_shape)


# ----------------------------------------------------------------------------------------------------------------
# shape / dtype rules shared by the reader (h5py datasets) and the writer (numpy arrays)


def _fail(fname: str, where: str, what: str) -> DataError:
    return DataError(f"{fname}: {where}: {what}")


def _dtype_name(dt: np.dtype) -> str:
    """Byte-order free name ('float32', 'int64', ...); h5py may report big-endian dtypes."""
    dt = np.dtype(dt)
    if dt.fields is not None or dt.kind in "OSUV":
        return str(dt)
    return dt.newbyteorder("=").name


def _shape_str(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(int(s)) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def _check_x(fname: str, split: str, shape: tuple[int, ...], dtype: np.dtype) -> tuple[tuple[int, ...], int]:
    """Check an x shape/dtype; return (sample_shape, spatial_dims)."""
    where = f"/{split}/x"
    name = _dtype_name(dtype)
    if name not in X_DTYPES:
        raise _fail(fname, where, f"expected dtype float32, float16 or uint8, got {name} {_shape_str(shape)}"
                    + ("; convert it to float32" if np.dtype(dtype).kind in "fiub" else ""))
    if len(shape) < 2:
        raise _fail(fname, where, f"expected shape (N, F) or (N, C, *spatial), got {_shape_str(shape)}")
    spatial = len(shape) - 2
    if spatial > MAX_SPATIAL_DIMS:
        raise _fail(fname, where, f"expected at most {MAX_SPATIAL_DIMS} spatial dims in (N, C, *spatial), "
                                  f"got shape {_shape_str(shape)} ({spatial} spatial dims)")
    sample = tuple(int(s) for s in shape[1:])
    if any(s == 0 for s in sample):
        raise _fail(fname, where, f"empty sample shape in {_shape_str(shape)}")
    return sample, spatial


def _check_y(fname: str, split: str, shape: tuple[int, ...], dtype: np.dtype, task: str) -> int | None:
    """Check a y shape/dtype; return the number of regression targets (None for classification)."""
    where = f"/{split}/y"
    dt = np.dtype(dtype)
    got = f"{_dtype_name(dt)} {_shape_str(shape)}"
    if task == "classification":
        # int64 is the format; other integer widths are read and widened to int64 by load()
        if dt.kind not in "iu" or len(shape) != 1:
            raise _fail(fname, where, f"expected int64 class labels of shape (N,), got {got}")
        return None
    if dt.kind != "f" or len(shape) != 2:
        hint = "; store a single target as shape (N, 1)" if len(shape) == 1 and dt.kind == "f" else ""
        raise _fail(fname, where, f"expected float32 regression targets of shape (N, T), got {got}{hint}")
    if shape[1] < 1:
        raise _fail(fname, where, f"expected at least one regression target, got {got}")
    return int(shape[1])


def _check_task(fname: str, task: object, num_classes: object) -> tuple[str, int | None]:
    if task is None:
        raise _fail(fname, "/", f"missing root attribute 'task' (one of {', '.join(TASKS)})")
    if isinstance(task, bytes):
        task = task.decode("utf-8", "replace")
    if not isinstance(task, str) or task not in TASKS:
        raise _fail(fname, "/", f"attribute 'task' must be one of {', '.join(TASKS)}, got {task!r}")
    if task == "regression":
        return task, None
    if num_classes is None:
        raise _fail(fname, "/", "attribute 'num_classes' is required for classification")
    arr = np.asarray(num_classes)
    if arr.size != 1 or arr.dtype.kind not in "iuf" or not float(arr.reshape(-1)[0]).is_integer():
        raise _fail(fname, "/", f"attribute 'num_classes' must be an integer, got {num_classes!r}")
    n = int(arr.reshape(-1)[0])
    if n < 2:
        raise _fail(fname, "/", f"attribute 'num_classes' must be at least 2, got {n}")
    return task, n


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
        raise _fail(fname, "/", f"attribute 'target_names' has {len(names)} names, expected {expected}")
    return names


# ----------------------------------------------------------------------------------------------------------------
# reading


def _open(path: str | os.PathLike) -> h5py.File:
    fname = str(path)
    p = Path(path)
    if not p.exists():
        raise _fail(fname, "/", "no such file")
    if p.is_dir():
        raise _fail(fname, "/", "is a directory, expected an HDF5 file")
    try:
        if not h5py.is_hdf5(fname):
            raise _fail(fname, "/", "not an HDF5 file")
        return h5py.File(fname, "r")
    except DataError:
        raise
    except OSError as e:
        raise _fail(fname, "/", f"cannot open as HDF5: {str(e).splitlines()[0] if str(e) else type(e).__name__}")


def _split_datasets(f: h5py.File, fname: str, split: str) -> tuple[h5py.Dataset, h5py.Dataset]:
    if split not in f:
        raise _fail(fname, f"/{split}", "missing group")
    grp = f[split]
    if not isinstance(grp, h5py.Group):
        raise _fail(fname, f"/{split}", "expected a group holding datasets 'x' and 'y', found a dataset")
    out = []
    for key in ("x", "y"):
        if key not in grp:
            raise _fail(fname, f"/{split}/{key}", "missing dataset")
        ds = grp[key]
        if not isinstance(ds, h5py.Dataset):
            raise _fail(fname, f"/{split}/{key}", "expected a dataset, found a group")
        out.append(ds)
    return out[0], out[1]


def _inspect_open(f: h5py.File, fname: str) -> DatasetInfo:
    task, num_classes = _check_task(fname, f.attrs.get("task"), f.attrs.get("num_classes"))
    if "train" not in f:
        raise _fail(fname, "/train", "missing group (a dataset needs at least a train split)")
    extra = [k for k in f.keys() if k not in SPLITS]
    if extra:
        log.warning("%s: ignoring groups %s (only %s are read)", fname, extra, ", ".join(SPLITS))

    splits: dict[str, int] = {}
    ref: tuple[str, tuple[int, ...], str, int | None] | None = None  # split, sample shape, dtype, targets
    spatial = 0
    for split in SPLITS:
        if split not in f:
            continue
        x, y = _split_datasets(f, fname, split)
        sample, spatial = _check_x(fname, split, x.shape, x.dtype)
        targets = _check_y(fname, split, y.shape, y.dtype, task)
        n = int(x.shape[0])
        if int(y.shape[0]) != n:
            raise _fail(fname, f"/{split}/y", f"has {y.shape[0]} samples but /{split}/x has {n}")
        if n == 0:
            raise _fail(fname, f"/{split}/x", "split is empty (0 samples)")
        xdt = _dtype_name(x.dtype)
        if ref is None:
            ref = (split, sample, xdt, targets)
        else:
            rsplit, rsample, rdt, rtargets = ref
            if sample != rsample:
                raise _fail(fname, f"/{split}/x", f"sample shape {_shape_str(sample)} differs from "
                                                  f"/{rsplit}/x sample shape {_shape_str(rsample)}")
            if xdt != rdt:
                raise _fail(fname, f"/{split}/x", f"dtype {xdt} differs from /{rsplit}/x dtype {rdt}")
            if targets != rtargets:
                raise _fail(fname, f"/{split}/y", f"{targets} targets differ from {rtargets} in /{rsplit}/y")
        splits[split] = n
    assert ref is not None
    _, sample_shape, x_dtype, targets = ref
    num_targets = num_classes if task == "classification" else targets
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
    )


def inspect(path: str | os.PathLike) -> DatasetInfo:
    """Check a file's structure, attributes, shapes and dtypes without reading its arrays (cheap on any size)."""
    with _open(path) as f:
        return _inspect_open(f, str(path))


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
                raise _fail(fname, f"/{split}/x", f"non-finite value ({v}) in sample {offset + a + bad}")
    if y is not None and len(y):
        step = _rows_per_chunk(max(1, y[0].nbytes), chunk_bytes=chunk_bytes)
        for a in range(0, len(y), step):
            block = y[a:a + step]
            if info.task == "classification":
                assert info.num_classes is not None
                bad = _first_bad_row((block < 0) | (block >= info.num_classes))
                if bad is not None:
                    raise _fail(fname, f"/{split}/y", f"label {int(block[bad])} of sample {offset + a + bad} "
                                                      f"is outside [0, {info.num_classes})")
            else:
                bad = _first_bad_row(~np.isfinite(block))
                if bad is not None:
                    raise _fail(fname, f"/{split}/y", f"non-finite target in sample {offset + a + bad}")


def _y_dtype(info: DatasetInfo) -> np.dtype:
    return np.dtype(np.int64) if info.task == "classification" else np.dtype(np.float32)


def _read(ds: h5py.Dataset, dtype: np.dtype) -> np.ndarray:
    """Read a whole dataset into a fresh native-endian contiguous array (h5py converts in place)."""
    out = np.empty(ds.shape, dtype=dtype)
    if out.size:
        ds.read_direct(out)
    return out


def validate(path: str | os.PathLike, *, chunk_bytes: int = CHECK_CHUNK_BYTES) -> DatasetInfo:
    """Inspect a file and check every value of every split, reading slices so memory stays small."""
    fname = str(path)
    with _open(path) as f:
        info = _inspect_open(f, fname)
        ydt = _y_dtype(info)
        for split in info.splits:
            x, y = _split_datasets(f, fname, split)
            xdt = np.dtype(info.x_dtype)
            step = _rows_per_chunk(math.prod(info.sample_shape) * xdt.itemsize,
                                   x.chunks[0] if x.chunks else None, chunk_bytes)
            for a in range(0, len(x) if xdt.kind == "f" else 0, step):  # uint8 has no bad values
                b = min(len(x), a + step)
                check_values(info, split, x[a:b].astype(xdt, copy=False), None, offset=a, chunk_bytes=chunk_bytes)
            step = _rows_per_chunk(max(1, info.num_targets * 8), y.chunks[0] if y.chunks else None, chunk_bytes)
            for a in range(0, len(y), step):
                b = min(len(y), a + step)
                check_values(info, split, None, y[a:b].astype(ydt, copy=False), offset=a, chunk_bytes=chunk_bytes)
    return info


def carve_indices(n: int, *, val_fraction: float = 0.1, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (train, val) row indices of a split of ``n`` training samples by a fixed-seed permutation."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    if n < 2:
        raise ValueError(f"cannot carve a validation split from {n} training sample(s)")
    n_val = min(n - 1, max(1, int(round(val_fraction * n))))
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def carve_val(x: np.ndarray, y: np.ndarray, *, val_fraction: float = 0.1, seed: int = 0
              ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Split train into (train, val) by a fixed-seed permutation, so every rank and every run agree on it.

    Both parts keep the original sample order. Train is compacted in place (its memory is reused), so the
    arrays passed in must not be used afterwards.
    """
    n = len(x)
    train_idx, val_idx = carve_indices(n, val_fraction=val_fraction, seed=seed)
    x_val, y_val = x[val_idx], y[val_idx]
    # in-place compaction: train_idx is sorted and train_idx[k] >= k, so block k..k+s only reads rows >= k
    step = _rows_per_chunk(max(1, x[0].nbytes if n else 1))
    for a in range(0, len(train_idx), step):
        idx = train_idx[a:a + step]
        if idx[0] == a and idx[-1] == a + len(idx) - 1:
            continue  # already in place
        x[a:a + len(idx)] = x[idx]
        y[a:a + len(idx)] = y[idx]
    n_train = len(train_idx)
    return (x[:n_train], y[:n_train]), (x_val, y_val)


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
    with _open(path) as f:
        info = _inspect_open(f, fname)
        carve = "val" in wanted and "val" not in info.splits
        to_read = [s for s in SPLITS if s in info.splits and (s in wanted or (carve and s == "train"))]
        xdt, ydt = np.dtype(info.x_dtype), _y_dtype(info)
        data: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for split in to_read:
            xs, ys = _split_datasets(f, fname, split)
            x, y = _read(xs, xdt), _read(ys, ydt)
            check_values(info, split, x, y)
            data[split] = (x, y)
            log.debug("%s: read %s: x %s %s, y %s", fname, split, x.shape, x.dtype, y.shape)
    if carve:
        x, y = data.pop("train")
        try:
            train, val = carve_val(x, y, val_fraction=val_fraction, seed=seed)
        except ValueError as e:
            raise _fail(fname, "/train", str(e)) from None
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
    if info.task == "classification":
        what = f"classification, {info.num_classes} classes"
    else:
        what = f"regression, {info.num_targets} target{'s' if info.num_targets != 1 else ''}"
    lines.append(f"  task:        {what}")
    if info.target_names:
        label = "classes" if info.task == "classification" else "targets"
        lines.append(f"  {label + ':':12} {', '.join(info.target_names)}")
    kind = "tabular (N, F)" if info.spatial_dims == 0 else f"{info.spatial_dims}-D, {info.in_channels} channel(s)"
    lines.append(f"  sample:      {_shape_str(info.sample_shape)} {info.x_dtype}, {kind}")
    sizes = ", ".join(f"{k} {v}" for k, v in info.splits.items())
    lines.append(f"  splits:      {sizes}" + (" (val carved from train)" if info.val_from_train else ""))
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------------
# writing


def write_dataset(out_path: str | os.PathLike, splits: Mapping[str, tuple[np.ndarray, np.ndarray]], *, task: str,
                  num_classes: int | None = None, name: str | None = None, description: str | None = None,
                  target_names: Sequence[str] | None = None, compression: str | None = None) -> DatasetInfo:
    """Write arrays in the format, atomically, after checking them (so a bad file never appears on disk).

    Labels of any integer dtype are stored as int64 and regression targets of any float dtype as float32;
    x must already be float32, float16 or uint8. Returns the info of the written file.
    """
    fname = str(out_path)
    unknown = [s for s in splits if s not in SPLITS]
    if unknown:
        raise _fail(fname, f"/{unknown[0]}", f"unknown split; expected some of {', '.join(SPLITS)}")
    task, num_classes = _check_task(fname, task, num_classes)
    if "train" not in splits:
        raise _fail(fname, "/train", "missing group (a dataset needs at least a train split)")
    ydt = np.dtype(np.int64) if task == "classification" else np.dtype(np.float32)

    prepared: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for split in SPLITS:
        if split not in splits:
            continue
        x, y = (np.asarray(a) for a in splits[split])
        _check_x(fname, split, x.shape, x.dtype)
        _check_y(fname, split, y.shape, y.dtype, task)
        if len(y) != len(x):
            raise _fail(fname, f"/{split}/y", f"has {len(y)} samples but /{split}/x has {len(x)}")
        if len(x) == 0:
            raise _fail(fname, f"/{split}/x", "split is empty (0 samples)")
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
            info = dataclasses.replace(_inspect_open(f, fname), path=fname)
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
            raise _fail(fname, miss, f"missing array ({have} is present)")
    x, y = data[kx], data[ky]
    if x.ndim == 0 or y.ndim == 0:
        raise _fail(fname, kx if x.ndim == 0 else ky, "expected an array with a sample axis, got a scalar")
    if len(x) != len(y):
        raise _fail(fname, ky, f"has {len(y)} samples but {kx} has {len(x)}")
    return x, y


def _npz_x(fname: str, key: str, x: np.ndarray) -> np.ndarray:
    if x.dtype.kind == "b":
        return x.astype(np.uint8)
    if x.dtype == np.uint8 or _dtype_name(x.dtype) in ("float32", "float16"):
        return x.astype(x.dtype.newbyteorder("="), copy=False)
    if x.dtype.kind in "iuf":
        return x.astype(np.float32)
    raise _fail(fname, key, f"expected numeric inputs, got dtype {x.dtype}")


def import_npz(npz_path: str | os.PathLike, out_path: str | os.PathLike, *, task: str | None = None,
               num_classes: int | None = None, name: str | None = None, description: str | None = None,
               target_names: Sequence[str] | None = None) -> DatasetInfo:
    """Convert a .npz (x_train, y_train and optional x_val/y_val, x_test/y_test) into the format.

    The task is inferred from the labels unless given: integers mean classification with max label + 1
    classes, floats mean regression; (N,) inputs or regression targets become (N, 1); float64 inputs become
    float32. The output is written atomically and validated.
    """
    src = str(npz_path)
    p = Path(src)
    if not p.is_file():
        raise _fail(src, "/", "no such file")
    try:
        with np.load(src, allow_pickle=False) as z:
            raw = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError) as e:
        raise _fail(src, "/", f"cannot read as .npz: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    known = {f"{a}_{s}" for a in "xy" for s in SPLITS}
    extra = sorted(set(raw) - known)
    if extra:
        log.warning("%s: ignoring arrays %s", src, extra)
    if task is not None and task not in TASKS:
        raise _fail(src, "/", f"task must be one of {', '.join(TASKS)}, got {task!r}")

    pairs = {s: pair for s in SPLITS if (pair := _npz_pair(src, raw, s)) is not None}
    if "train" not in pairs:
        raise _fail(src, "x_train", "missing array (x_train and y_train are required)")
    for s, (x, _) in pairs.items():
        if len(x) == 0:
            raise _fail(src, f"x_{s}", "has 0 samples")
    if task is None:
        kinds = {s: y.dtype.kind for s, (_, y) in pairs.items()}
        task = "classification" if kinds["train"] in "iub" else "regression"
        for s, k in kinds.items():
            if (k in "iub") != (task == "classification"):
                raise _fail(src, f"y_{s}", f"dtype {pairs[s][1].dtype} disagrees with y_train dtype "
                                           f"{pairs['train'][1].dtype}; pass task= explicitly")

    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for s, (x, y) in pairs.items():
        x = _npz_x(src, f"x_{s}", x)
        if x.ndim == 1:
            x = x.reshape(-1, 1)
        if task == "classification":
            if y.ndim == 2 and y.shape[1] == 1:
                y = y.reshape(-1)
            if y.dtype.kind == "f":
                if not np.all(np.isfinite(y)) or not np.all(y == np.round(y)):
                    raise _fail(src, f"y_{s}", "classification labels must be whole numbers")
            elif y.dtype.kind not in "iub":
                raise _fail(src, f"y_{s}", f"expected integer class labels, got dtype {y.dtype}")
            if y.ndim != 1:
                raise _fail(src, f"y_{s}", f"expected class labels of shape (N,), got {_shape_str(y.shape)}")
            if len(y) and y.min() < 0:
                first = int(np.flatnonzero(y < 0)[0])
                raise _fail(src, f"y_{s}", f"negative label {int(y[first])} at sample {first}")
            y = y.astype(np.int64)
        else:
            if y.dtype.kind not in "iubf":
                raise _fail(src, f"y_{s}", f"expected numeric regression targets, got dtype {y.dtype}")
            y = y.astype(np.float32)
            if y.ndim == 1:
                y = y.reshape(-1, 1)
        out[s] = (x, y)

    if task == "classification" and num_classes is None:
        num_classes = max(int(y.max()) for _, y in out.values()) + 1
        if num_classes < 2:
            raise _fail(src, "y_train", "every label is 0; classification needs at least 2 classes")
    write_dataset(out_path, out, task=task, num_classes=num_classes, name=name, description=description,
                  target_names=target_names)
    return validate(out_path)
