"""Where a candidate's training batches come from when the training split is not moved whole to the device.

- :class:`HostRows`: the split stays in the node's shared memory; each batch's rows are gathered on the host and
  copied to the device. On a GPU the rows are gathered into page-locked (pinned) buffers and copied with
  ``non_blocking=True``, so the copy runs asynchronously to the host ("Use pinned memory buffers",
  https://docs.pytorch.org/docs/stable/notes/cuda.html#use-pinned-memory-buffers; the pinned-memory and
  non_blocking tutorial, https://docs.pytorch.org/tutorials/intermediate/pinmem_nonblock.html). Two buffers take
  turns, and a CUDA event recorded after each copy says when its buffer may be filled again. On the CPU the same
  path runs without pinning.
- :class:`StreamBatches`: the split is read from the file chunk by chunk (datashare.stream.ChunkStream); batches
  are cut from each chunk in its shuffled order and a remainder carries over to the next chunk.
"""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import torch

from galapagos.datashare.plan import array_name, split_arrays
from galapagos.datashare.stream import ChunkStream
from galapagos.evolve.task import DEVICE_MODES, DataAccess

__all__ = ["DataAccess", "DEVICE_MODES", "HostRows", "StreamBatches", "epoch_batches", "stats_sample",
           "fits_device", "resident_fits", "batch_data", "child_device", "GPU_TYPES", "shifted"]


def fits_device(nbytes: int, device: torch.device, setting: str) -> bool:
    """Whether ``nbytes`` of training data goes to ``device`` whole (CPU: always, there is nothing to move)."""
    if setting != "auto":
        return setting == "whole"
    if device.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info(device)  # https://docs.pytorch.org/docs/stable/generated/torch.cuda.mem_get_info.html
    return nbytes <= free // 2  # the other half for the network, its activations and the optimiser


class HostRows:
    """Rows ``index`` (None: all) of a host array, gathered batch by batch and copied to ``device``."""

    def __init__(self, data: np.ndarray, index: np.ndarray | None, device: torch.device):
        self.data = torch.from_numpy(data)  # a view of the shared memory, no copy
        self.index = None if index is None else torch.from_numpy(np.asarray(index, np.int64))
        self.device = device
        self.pin = device.type == "cuda"
        self.buffers: list[torch.Tensor] = []
        self.events: list[Any] = []
        self.turn = 0

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self), *self.data.shape[1:])

    index_device = torch.device("cpu")  # where batch row numbers are kept (epoch_batches)

    def __len__(self) -> int:
        return len(self.data) if self.index is None else len(self.index)

    def __getitem__(self, rows) -> torch.Tensor:
        if isinstance(rows, slice):
            rows = torch.arange(len(self))[rows]
        rows = rows.to("cpu")
        if self.index is not None:
            rows = self.index[rows]
        if not self.pin:
            return self.data.index_select(0, rows).to(self.device)
        return self._pinned(rows)

    def _pinned(self, rows: torch.Tensor) -> torch.Tensor:
        k = len(rows)
        if not self.buffers or self.buffers[0].shape[0] < k:
            self.buffers = [torch.empty((k, *self.data.shape[1:]), dtype=self.data.dtype).pin_memory()
                            for _ in range(2)]
            self.events = [None, None]
        i = self.turn
        self.turn ^= 1
        if self.events[i] is not None:
            self.events[i].synchronize()  # the copy that last read this buffer is done
        buf = self.buffers[i][:k]
        torch.index_select(self.data, 0, rows, out=buf)
        out = buf.to(self.device, non_blocking=True)
        self.events[i] = torch.cuda.Event()
        self.events[i].record()
        return out


class StreamBatches:
    """The training split streamed from its file: ``shape`` like a tensor's, batches through :meth:`epoch`."""

    def __init__(self, stream: ChunkStream, sample_shape: tuple[int, ...], device: torch.device):
        self.stream, self.device = stream, device
        self.shape = (stream.rows, *sample_shape)

    def epoch(self, seed: int, n: int, batch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Batches of ``batch`` rows until ``n`` rows have been used (chunk order and row order by ``seed``)."""
        left, carry = n, None
        for xs, ys in self.stream.epoch(seed):
            if carry is not None:
                xs, ys = np.concatenate([carry[0], xs]), np.concatenate([carry[1], ys])
            xs, ys = xs[:left], ys[:left]
            whole = len(xs) - len(xs) % batch
            for i in range(0, whole, batch):
                yield self._to(xs[i:i + batch]), self._to(ys[i:i + batch])
            left -= whole
            carry = (xs[whole:], ys[whole:])
            if left <= len(carry[0]):
                break
        if carry is not None and len(carry[0]) >= 2:  # batch norm needs two samples
            yield self._to(carry[0]), self._to(carry[1])

    def _to(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(self.device)

    def sample(self, rows: int = 65536) -> tuple[torch.Tensor, torch.Tensor]:
        """Up to ``rows`` training rows read in the order of seed 0: the same for every candidate (its
        normalisation statistics)."""
        xs, ys = [], []
        for x, y in self.stream.epoch(0):
            xs.append(x)
            ys.append(y)
            if sum(map(len, xs)) >= rows:
                break
        return self._to(np.concatenate(xs)[:rows]), self._to(np.concatenate(ys)[:rows])


def batches_per_epoch(n: int, batch: int) -> int:
    """How many batches an epoch of ``n`` rows yields (epoch_batches, StreamBatches.epoch): the full ones and a
    last, shorter one unless it would hold a single row."""
    return n // batch + (n % batch >= 2)


def epoch_batches(x: Any, y: Any, n: int, batch: int, gen: torch.Generator, device: torch.device,
                  shift: float = 0.0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch's training batches of ``n`` rows of (x, y) in a random order drawn from ``gen``, each sample
    translated at random by up to ``shift`` of each spatial axis (:func:`shifted`; 0: as they are)."""
    batches = _batches(x, y, n, batch, gen, device)
    return batches if not shift else ((shifted(xb, shift, gen), yb) for xb, yb in batches)


def _batches(x: Any, y: Any, n: int, batch: int, gen: torch.Generator, device: torch.device
             ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    if isinstance(x, StreamBatches):
        yield from x.epoch(int(torch.randint(2**31 - 1, (), generator=gen)), n, batch)
        return
    order = torch.randperm(x.shape[0], generator=gen)[:n].to(getattr(x, "index_device", device))
    for i in range(0, n, batch):
        idx = order[i:i + batch]
        if idx.numel() < 2:
            break  # batch norm needs two samples
        yield x[idx], y[idx]


def shifted(x: torch.Tensor, fraction: float, gen: torch.Generator) -> torch.Tensor:
    """The batch ``x`` (N, C, *spatial) with each sample moved along each spatial axis by its own whole number of
    positions, drawn from ``gen`` up to ``fraction`` of the axis either way, its edge values repeated into the
    positions it leaves: data augmentation by translation, for data whose target does not depend on where a
    pattern is (the ``shift`` gene)."""
    n = x.shape[0]
    for axis, size in enumerate(x.shape[2:], start=2):
        most = int(fraction * size)
        if most == 0:
            continue
        offsets = torch.randint(-most, most + 1, (n, 1), generator=gen).to(x.device)
        index = (torch.arange(size, device=x.device) - offsets).clamp_(0, size - 1)  # (n, size): where each reads
        view = [n] + [1] * (x.dim() - 1)
        view[axis] = size
        x = x.gather(axis, index.view(view).expand(x.shape))
    return x


def stats_sample(x: Any, y: Any) -> tuple[Any, Any]:
    """What the normalisation statistics are computed from: the split, or a fixed sample of a streamed one."""
    return x.sample() if isinstance(x, StreamBatches) else (x, y)


GPU_TYPES = ("cuda", "xpu")  # NVIDIA and AMD (ROCm's torch keeps the name "cuda"), Intel (torch's XPU backend)


def child_device(ctx: Any) -> torch.device:
    """This trainer child's device, made its current one on a GPU."""
    device = torch.device(ctx.device)
    if device.type in GPU_TYPES:
        getattr(torch, device.type).set_device(device)
    return device


def resident_fits(ctx: Any, splits: tuple[str, ...], access: DataAccess) -> bool:
    """Whether the shared arrays of ``splits`` go to this child's device whole (evolve.train.device_data)."""
    arrays = {id(a): a for s in split_arrays(ctx.data, splits).values() for a in (s.x, s.y)}
    return fits_device(sum(a.nbytes for a in arrays.values()), child_device(ctx), access.device)


def _rows_to(x: np.ndarray, index: np.ndarray | None, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(x if index is None else x[index]).to(device)


def batch_data(ctx: Any, splits: tuple[str, ...], access: DataAccess) -> dict:
    """The splits of a trainer child whose training split does not go to its device whole: streamed from its file
    (``access.stream``) or gathered batch by batch from the shared copy; the other splits are moved whole (their
    rows only)."""
    device = child_device(ctx)
    others = tuple(s for s in splits if s != "train")
    tensors = {s: (_rows_to(a.x, a.index, device), _rows_to(a.y, a.index, device))
               for s, a in split_arrays(ctx.data, others).items()}
    if access.stream is not None:
        val = split_arrays(ctx.data, ("val",))["val"]
        stream = ChunkStream(access.stream, ctx.data.get(array_name("train", "keep")), val.x.dtype, val.y.dtype)
        tensors["train"] = (StreamBatches(stream, val.x.shape[1:], device), None)
    else:
        train = split_arrays(ctx.data, ("train",))["train"]
        tensors["train"] = (HostRows(train.x, train.index, device), _rows_to(train.y, train.index, device))
    return tensors
