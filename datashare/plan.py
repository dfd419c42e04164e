"""What rank 0 shares and under which names: the plan of a transfer, and the names of a dataset's shared arrays.

A dataset is shared as arrays named ``split/part`` (:func:`array_name`): ``x`` and ``y`` of every split read from
the file and, when val is carved from train, ``train/index`` and ``val/index``, the rows of the file's train split
that make up each. :func:`dataset_plan` makes these names and :func:`split_arrays` reads them back; nothing else
spells them. Like the rest of datashare, this module never imports mpi4py.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import h5py
import numpy as np

from .carve import carve_indices
from .format import SPLITS, DatasetInfo, inspect, open_file, split_datasets, y_dtype

log = logging.getLogger(__name__)

__all__ = ["DataShareError", "Source", "Plan", "dataset_plan", "PARTS", "array_name", "array_parts", "SplitArrays",
           "split_arrays"]

#: the arrays of a split: inputs, targets, (val carved from train) its rows of the file's train split, and (shard
#: and stream modes, val carved) one byte per row of the file's train split, 1 for a training row (datashare.stream)
PARTS = ("x", "y", "index", "keep")


class DataShareError(RuntimeError):
    """The data could not be delivered; the message names the file, piece, rank or array and what went wrong."""


# -- the names of the shared arrays -----------------------------------------------------------------------------
def array_name(split: str, part: str) -> str:
    """The name under which ``part`` (one of :data:`PARTS`) of ``split`` is shared."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    if part not in PARTS:
        raise ValueError(f"unknown part {part!r} of split {split!r}; expected one of {', '.join(PARTS)}")
    return f"{split}/{part}"


def array_parts(name: str) -> tuple[str, str]:
    """The (split, part) that :func:`array_name` made ``name`` of."""
    split, _, part = name.partition("/")
    array_name(split, part)
    return split, part


@dataclass(frozen=True)
class SplitArrays:
    """One split of a shared dataset: the rows ``index`` of ``x`` and ``y`` (``index`` None: every row)."""

    x: np.ndarray
    y: np.ndarray
    index: np.ndarray | None = None


def split_arrays(arrays: Mapping[str, np.ndarray], splits: Iterable[str] = ("train", "val")
                 ) -> dict[str, SplitArrays]:
    """The ``splits`` of a dataset shared by :func:`dataset_plan`, without copying a row.

    - A split stored whole in the file: ``x`` and ``y`` are its own ``split/x`` and ``split/y``, ``index`` is None.
    - A split carved from train (``split/index`` is shared): ``x`` and ``y`` are the FILE's train arrays,
      ``train/x`` and ``train/y``, and ``index`` holds the rows of them that belong to the split, so its samples
      are ``x[index]`` and ``y[index]``. When val was carved, train itself is one of these: ``train/x``,
      ``train/y`` and ``train/index``.
    - A split with a ``split/keep`` mask (datashare/stream.py, shard mode): its own ``x`` and ``y`` (a node's
      rows of the file's train split) and ``index`` the rows whose mask is 1.

    A missing array, or an index that is not a 1-D integer array, raises :class:`DataShareError` naming it.
    """
    out: dict[str, SplitArrays] = {}
    for split in splits:
        index_name = array_name(split, "index")
        index = arrays.get(index_name)
        rows_of = split if index is None else "train"
        x_name, y_name = array_name(rows_of, "x"), array_name(rows_of, "y")
        missing = [k for k in (x_name, y_name) if k not in arrays]
        if missing:
            carved = f" (carved from train: {index_name} is shared)" if index is not None else ""
            raise DataShareError(f"split {split!r}{carved} needs shared array(s) {', '.join(missing)}; "
                                 f"the shared arrays are: {', '.join(arrays) or 'none'}")
        if index is not None and (np.ndim(index) != 1 or np.asarray(index).dtype.kind not in "iu"):
            raise DataShareError(f"{index_name} must be a 1-D array of integer row numbers, got "
                                 f"{np.asarray(index).dtype} of shape {np.shape(index)}")
        keep = arrays.get(array_name(split, "keep")) if index is None else None
        if keep is not None:
            index = np.flatnonzero(np.asarray(keep))
        out[split] = SplitArrays(arrays[x_name], arrays[y_name], index)
    return out


# -- the plan ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Source:
    """One array to deliver: read from an HDF5 dataset, or (``dataset=None``) held in memory by rank 0."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    dataset: str | None = None
    offset: int | None = None  # byte offset of a contiguous, unfiltered dataset already in `dtype`: read raw

    @property
    def row_bytes(self) -> int:
        return math.prod(self.shape[1:]) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class Plan:
    """What rank 0 sends: the file, its arrays, and how (chunk size, which leaders read)."""

    path: str | None
    sources: tuple[Source, ...]
    info: DatasetInfo | None = None  # when given, readers check values (NaN, labels) of every piece they read
    chunk_bytes: int = 64 << 20
    readers: int | str = 1  # how many node leaders read the file: a count, or "node" for every one

    @classmethod
    def of_arrays(cls, arrays: Mapping[str, np.ndarray], **kw: Any) -> "Plan":
        return cls(None, tuple(Source(k, tuple(np.shape(a)), np.asarray(a).dtype.str) for k, a in arrays.items()),
                   **kw)

    @property
    def nbytes(self) -> int:
        return sum(s.shape[0] * s.row_bytes if s.shape else np.dtype(s.dtype).itemsize for s in self.sources)


def dataset_plan(path: str, splits: Iterable[str] = ("train", "val"), *, val_fraction: float = 0.1, seed: int = 0,
                 **kw: Any) -> tuple[Plan, dict[str, np.ndarray], DatasetInfo]:
    """The plan that delivers ``splits`` of a dataset file as ``split/x`` and ``split/y``, and what rank 0 adds.

    Without a val split in the file, ``train/x`` and ``train/y`` hold the file's whole train split and
    ``train/index`` / ``val/index`` (computed here, sent from memory) say which rows belong to which split.
    """
    info = inspect(path)
    wanted = list(dict.fromkeys(splits))
    carve = "val" in wanted and "val" not in info.splits
    reads = [s for s in info.splits if s in wanted or (carve and s == "train")]
    sources, memory, sizes = [], {}, {}
    x_dtype = np.dtype(info.x_dtype)
    targets = info.y_sample_shape  # () labels, (T,) targets, or a label or T targets per pixel
    with open_file(path) as f:
        for split in reads:
            n = info.splits[split]
            x, y = split_datasets(f, str(path), split)
            for part, ds, shape, dtype in (("x", x, (n, *info.sample_shape), x_dtype),
                                           ("y", y, (n, *targets), y_dtype(info.task))):
                sources.append(Source(array_name(split, part), shape, dtype.str, ds.name, _raw_offset(ds, dtype)))
            sizes[split] = n
    if carve:
        try:
            train_idx, val_idx = carve_indices(info.splits["train"], val_fraction=val_fraction, seed=seed)
        except ValueError as exc:
            raise DataShareError(f"{path}: /train: {exc}") from None
        memory = {array_name("train", "index"): train_idx, array_name("val", "index"): val_idx}
        sources += [Source(k, a.shape, a.dtype.str) for k, a in memory.items()]
        sizes.update(train=len(train_idx), val=len(val_idx))
        log.info("%s: no val split; carving %d of %d train samples (seed %d)", path, len(val_idx),
                 info.splits["train"], seed)
    info = dataclasses.replace(info, splits={s: sizes[s] for s in sizes if s in wanted}, val_from_train=carve)
    return Plan(str(path), tuple(sources), info, **kw), memory, info


def _raw_offset(ds: h5py.Dataset, dtype: np.dtype) -> int | None:
    """Where a dataset's bytes start in the file, if they can be read as they are (else None: read via HDF5)."""
    if ds.chunks is not None or ds.compression is not None or ds.dtype != dtype or ds.external:
        return None
    return ds.id.get_offset()
