"""A training split larger than a node's shared memory: what is shared instead, and the chunks a worker streams.

In the ``shard`` and ``stream`` modes the validation split stays resident and whole on every node (read from the
file's ``val``, or the carved rows read once by rank 0 and sent from its memory as ``val/x`` and ``val/y``), so
every candidate is scored on the same samples. The training split is either shared by row ranges, one per node
(``shard``: every worker asks for ``train/x``, ``train/y`` and ``train/keep`` as :data:`NODE`, resolved by
:func:`datashare.share.share`), or not shared at all (``stream``): each worker reads chunks of the file's train
rows on a thread, at most ``depth`` chunks ahead (:class:`ChunkStream`). With val carved from train,
``train/keep`` (one byte per row of the file's train split: 1 trains, 0 is a val row) says which rows train.
Here too: what each rank asks the transfer for (:func:`request`: arrays whole, a row range, or :data:`NODE`) and
what its node's leader then needs (:func:`union`).
"""
from __future__ import annotations

import dataclasses
import queue
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping

import h5py
import numpy as np

from .carve import carve_indices
from .format import DatasetInfo, check_values, inspect, open_file, split_datasets, y_dtype
from .plan import DataShareError, Plan, Source, array_name

__all__ = ["NODE", "StreamSpec", "partial_plan", "worker_want", "chunk_order", "ChunkStream"]

#: a row request for "this node's share of the rows" (datashare.share.share resolves it on each node's leader)
NODE = "node"


@dataclass(frozen=True)
class StreamSpec:
    """Where a worker streams the training split from: the file's train datasets and how it reads them."""

    path: str
    x: str  # HDF5 dataset names of the file's train split
    y: str
    rows: int  # rows of the file's train split
    chunk_rows: int  # rows per chunk (a contiguous read)
    depth: int = 4  # chunks read ahead: the bounded buffer

    def __post_init__(self) -> None:
        if self.chunk_rows < 1 or self.depth < 1:
            raise ValueError(f"stream of {self.path}: chunk_rows ({self.chunk_rows}) and depth ({self.depth}) "
                             "must be at least 1")


def partial_plan(path: str, mode: str, *, val_fraction: float = 0.1, seed: int = 0, chunk_rows: int = 1024,
                 depth: int = 4, **kw: Any) -> tuple[Plan, dict[str, np.ndarray], DatasetInfo, StreamSpec]:
    """The plan of the ``shard`` or ``stream`` mode, rank 0's in-memory arrays, the info and the stream's source.

    Val stays whole; in ``shard`` mode the file's train split is shared too (each node gets its rows by asking
    :data:`NODE`); in ``stream`` mode it is not shared (``StreamSpec`` says where workers read it).
    """
    if mode not in ("shard", "stream"):
        raise ValueError(f"partial_plan: mode must be shard or stream, got {mode!r}")
    info = inspect(path)
    n = info.splits["train"]
    x_dtype, t_dtype = np.dtype(info.x_dtype), y_dtype(info.task)
    targets = info.y_sample_shape  # as datashare.plan: () labels, (T,) targets, a label or T targets per pixel
    sources, memory = [], {}
    with open_file(path) as f:
        x, y = split_datasets(f, str(path), "train")
        spec = StreamSpec(str(path), x.name, y.name, n, chunk_rows, depth)
        if mode == "shard":
            sources += [Source(array_name("train", "x"), (n, *info.sample_shape), x_dtype.str, x.name),
                        Source(array_name("train", "y"), (n, *targets), t_dtype.str, y.name)]
        if "val" in info.splits:
            xv, yv = split_datasets(f, str(path), "val")
            m = info.splits["val"]
            sources += [Source(array_name("val", "x"), (m, *info.sample_shape), x_dtype.str, xv.name),
                        Source(array_name("val", "y"), (m, *targets), t_dtype.str, yv.name)]
            sizes = {"train": n, "val": m}
        else:
            try:
                train_idx, val_idx = carve_indices(n, val_fraction=val_fraction, seed=seed)
            except ValueError as exc:
                raise DataShareError(f"{path}: /train: {exc}") from None
            keep = np.ones(n, np.uint8)
            keep[val_idx] = 0
            memory = {array_name("train", "keep"): keep, array_name("val", "x"): _rows(x, val_idx, x_dtype),
                      array_name("val", "y"): _rows(y, val_idx, t_dtype)}
            # the readers check file pieces only: these rows are checked here
            check_values(info, "train", memory[array_name("val", "x")], memory[array_name("val", "y")])
            sizes = {"train": len(train_idx), "val": len(val_idx)}
    sources += [Source(k, a.shape, a.dtype.str) for k, a in memory.items()]
    info = dataclasses.replace(info, splits=sizes, val_from_train="val" not in info.splits)
    return Plan(str(path), tuple(sources), info, **kw), memory, info, spec


def _rows(ds: h5py.Dataset, rows: np.ndarray, dtype: np.dtype, step: int = 4096) -> np.ndarray:
    """The sorted ``rows`` of a dataset, read a block of rows at a time (never the whole dataset)."""
    out = np.empty((len(rows), *ds.shape[1:]), dtype)
    for i in range(0, len(rows), step):
        part = rows[i:i + step]
        out[i:i + len(part)] = ds[int(part[0]):int(part[-1]) + 1][part - part[0]]
    return out


def worker_want(mode: str, memory: dict[str, np.ndarray]) -> dict[str, Any] | None:
    """What every worker asks of the shared arrays in a mode (None: every array whole, the resident mode)."""
    if mode == "resident":
        return None
    want: dict[str, Any] = {array_name("val", "x"): None, array_name("val", "y"): None}
    keep = array_name("train", "keep")
    if mode == "shard":
        want.update({array_name("train", "x"): NODE, array_name("train", "y"): NODE})
        if keep in memory:
            want[keep] = NODE
    elif keep in memory:
        want[keep] = None
    return want


def node_rows(plan: Plan, leaders: Any, requests: list[Mapping[str, Any]]) -> dict[str, tuple[int, int]]:
    """Collective over the node leaders: the rows of each array asked for as NODE, split evenly over the nodes
    whose ranks ask for it (in leader order), so the nodes that train hold the whole array between them."""
    asked = sorted({k for r in requests for k, v in r.items() if v == NODE})
    flags = leaders.allgather(bool(asked))
    i, k = sum(flags[:leaders.Get_rank()]), sum(flags)
    n = {s.name: s.shape[0] if s.shape else 1 for s in plan.sources}
    return {name: (i * n[name] // k, (i + 1) * n[name] // k) for name in asked}


def resolve(request: Mapping[str, Any], rows: Mapping[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """A rank's request with its NODE entries replaced by its node's rows."""
    return {k: rows[k] if v == NODE else v for k, v in request.items()}


def chunk_order(rows: int, chunk_rows: int, seed: int, keep: np.ndarray | None = None
                ) -> Iterator[tuple[int, np.ndarray]]:
    """One epoch's order: (first file row, offsets of its training rows within the chunk) per chunk, the chunks
    in a seeded random order and the rows of each shuffled by the same generator."""
    rng = np.random.default_rng(seed)
    for start in rng.permutation(np.arange(0, rows, chunk_rows)):
        start = int(start)
        end = min(rows, start + chunk_rows)
        local = np.arange(end - start) if keep is None else np.flatnonzero(keep[start:end])
        yield start, rng.permutation(local)


class ChunkStream:
    """The training split read chunk by chunk from its file on a thread, at most ``spec.depth`` chunks ahead."""

    def __init__(self, spec: StreamSpec, keep: np.ndarray | None, x_dtype: np.dtype, y_dtype: np.dtype):
        self.spec, self.keep = spec, keep
        self.dtypes = (np.dtype(x_dtype), np.dtype(y_dtype))

    @property
    def rows(self) -> int:
        """Training rows (the file's train rows less the carved val rows)."""
        return self.spec.rows if self.keep is None else int(np.count_nonzero(self.keep))

    def epoch(self, seed: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """One epoch's chunks as (x, y) arrays of training rows, in :func:`chunk_order` order for ``seed``."""
        out: queue.Queue = queue.Queue(maxsize=self.spec.depth)
        stop = threading.Event()
        reader = threading.Thread(target=self._read, args=(seed, out, stop), name="chunk-stream", daemon=True)
        reader.start()
        try:
            while (item := out.get()) is not None:
                if isinstance(item, BaseException):
                    raise DataShareError(f"{self.spec.path}: streaming {self.spec.x}: {item}") from item
                yield item
        finally:
            stop.set()
            while reader.is_alive():  # a reader blocked on a full queue must see the stop
                try:
                    out.get(timeout=0.05)
                except queue.Empty:
                    pass

    def _read(self, seed: int, out: queue.Queue, stop: threading.Event) -> None:
        spec = self.spec
        try:
            with h5py.File(spec.path, "r") as f:
                x, y = f[spec.x], f[spec.y]
                for start, local in chunk_order(spec.rows, spec.chunk_rows, seed, self.keep):
                    end = min(spec.rows, start + spec.chunk_rows)
                    xs = np.asarray(x[start:end], dtype=self.dtypes[0])[local]
                    ys = np.asarray(y[start:end], dtype=self.dtypes[1])[local]
                    while not stop.is_set():
                        try:
                            out.put((xs, ys), timeout=0.05)
                            break
                        except queue.Full:
                            pass
                    if stop.is_set():
                        return
            out.put(None)
        except Exception as exc:  # noqa: BLE001 - the consumer raises it with the file's name
            out.put(exc)


def request(plan: Plan, want: Mapping[str, Any] | None) -> dict[str, tuple[int, int]]:
    """A rank's request as {array: (first row, end row)}; None means every array whole."""
    full = {s.name: (0, s.shape[0] if s.shape else 1) for s in plan.sources}
    if want is None:
        return full
    out = {}
    for name, rows in want.items():
        if name not in full:
            raise DataShareError(f"requested array {name!r} is not shared (there are: {', '.join(full)})")
        if isinstance(rows, str):
            if rows != NODE:
                raise DataShareError(f"requested rows {rows!r} of {name!r}: expected (start, stop), None or {NODE!r}")
            out[name] = NODE  # resolved by the node's leader (_node_rows)
            continue
        a, b = full[name] if rows is None else (int(rows[0]), int(rows[1]))
        if not 0 <= a <= b <= full[name][1]:
            raise DataShareError(f"requested rows {a}:{b} of {name!r}, which has {full[name][1]}")
        out[name] = (a, b)
    return out


def union(requests: Iterable[Mapping[str, tuple[int, int]]]) -> dict[str, tuple[int, int]]:
    """What a node needs: per array, the rows covering every local request."""
    out: dict[str, tuple[int, int]] = {}
    for req in requests:
        for name, (a, b) in req.items():
            lo, hi = out.get(name, (a, b))
            out[name] = (min(lo, a), max(hi, b))
    return out
