"""A dict of numpy arrays in one POSIX shared-memory segment.

A worker rank receives the dataset once into shared memory (:func:`bcast_shared`, i.e. ``bcast_arrays`` with
a shared-memory ``allocate``); the trainer child processes it starts map the same pages read-only via a small
picklable descriptor, so restarting a trainer costs no copy and no second broadcast.
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
import threading
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory
from typing import Any, Iterable, Mapping

import numpy as np

from .broadcast import ArraySpec, _spec, bcast_arrays, layout, views

log = logging.getLogger(__name__)

__all__ = ["SharedArrays", "bcast_shared"]

_patch_lock = threading.Lock()


def _attach_untracked(name: str) -> SharedMemory:
    """Open an existing segment without registering it with this process's resource tracker.

    Before Python 3.13 every SharedMemory registers, so the tracker would unlink (and warn about) the segment
    when an attaching process exits. Unregistering afterwards is not enough: a child started by
    multiprocessing shares its parent's tracker, and its unregister would cancel the creator's registration.
    """
    if sys.version_info >= (3, 13):
        return SharedMemory(name=name, create=False, track=False)  # type: ignore[call-arg]
    with _patch_lock:
        original = resource_tracker.register

        def register(rname: str, rtype: str) -> None:
            if rtype != "shared_memory":
                original(rname, rtype)

        resource_tracker.register = register  # type: ignore[assignment]
        try:
            return SharedMemory(name=name, create=False)
        finally:
            resource_tracker.register = original  # type: ignore[assignment]


def _release(shm: SharedMemory) -> None:
    """Drop a SharedMemory's own handles without unmapping memory that live arrays may still use."""
    shm._buf = None  # type: ignore[attr-defined]
    shm._mmap = None  # type: ignore[attr-defined]
    fd = getattr(shm, "_fd", -1)
    if fd >= 0:
        os.close(fd)
        shm._fd = -1  # type: ignore[attr-defined]


class SharedArrays:
    """Arrays laid out by :func:`datashare.broadcast.layout` in one shared-memory segment.

    The creator owns the segment and unlinks it on :meth:`close`; attached processes get read-only views and
    only unmap it.
    """

    def __init__(self, shm: SharedMemory, specs: list[ArraySpec], *, owner: bool) -> None:
        self._shm: SharedMemory | None = shm
        self._specs = specs
        self._offsets, self._total = layout(specs)
        self._owner = owner
        self._name = shm.name
        self._buffer: np.ndarray | None = np.ndarray((self._total,), dtype=np.uint8, buffer=shm.buf)
        if not owner:
            self._buffer.flags.writeable = False
        self._arrays: dict[str, np.ndarray] | None = views(self._buffer, specs)

    # -- construction

    @classmethod
    def create(cls, specs: Iterable[Iterable[Any]], *, prefix: str = "galapagos") -> "SharedArrays":
        """Allocate a segment for ``specs`` ((name, shape, dtype) triples); its contents start as zeros."""
        specs = [_spec(s) for s in specs]
        _, total = layout(specs)
        name = f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"
        shm = SharedMemory(name=name, create=True, size=max(1, total))  # size 0 is rejected by the OS API
        log.debug("created shared memory %s (%d bytes, %d arrays)", name, total, len(specs))
        return cls(shm, specs, owner=True)

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], *, prefix: str = "galapagos") -> "SharedArrays":
        """A shared copy of local arrays (e.g. on a rank that read the file itself)."""
        specs = [(k, np.shape(a), np.asarray(a).dtype) for k, a in arrays.items()]
        sa = cls.create(specs, prefix=prefix)
        for k, a in arrays.items():
            sa.arrays[k][...] = a
        return sa

    @classmethod
    def attach(cls, descriptor: Mapping[str, Any]) -> "SharedArrays":
        """Map a segment described by :meth:`descriptor` (from another process) read-only."""
        specs = [_spec(s) for s in descriptor["specs"]]
        offsets, total = layout(specs)
        if dict(descriptor.get("offsets", offsets)) != offsets:
            raise ValueError(f"shared memory {descriptor['name']}: layout differs from the creator's")
        shm = _attach_untracked(descriptor["name"])
        if shm.size < total:
            shm.close()
            raise ValueError(f"shared memory {descriptor['name']}: {shm.size} bytes, {total} expected")
        return cls(shm, specs, owner=False)

    # -- access

    @property
    def name(self) -> str:
        """The segment's name (as under /dev/shm on Linux)."""
        return self._name

    @property
    def owner(self) -> bool:
        return self._owner

    @property
    def nbytes(self) -> int:
        return self._total

    @property
    def specs(self) -> list[ArraySpec]:
        return list(self._specs)

    @property
    def buffer(self) -> np.ndarray:
        """The whole segment as flat uint8 (writable for the creator): pass ``lambda n: sa.buffer`` as allocate."""
        if self._buffer is None:
            raise ValueError(f"shared memory {self._name} is closed")
        return self._buffer

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """Views of the arrays (read-only in attached processes)."""
        if self._arrays is None:
            raise ValueError(f"shared memory {self._name} is closed")
        return self._arrays

    def descriptor(self) -> dict[str, Any]:
        """A small picklable description that :meth:`attach` turns back into views in another process."""
        return {
            "name": self._name,
            "specs": [(s.name, s.shape, s.dtype.str) for s in self._specs],
            "offsets": dict(self._offsets),
            "nbytes": self._total,
        }

    # -- lifetime

    def close(self) -> None:
        """Let go of the segment: memory is unmapped once no view of it remains; the creator also unlinks it."""
        shm, self._shm = self._shm, None
        if shm is None:
            return
        self._arrays = None
        self._buffer = None
        # Do not munmap here: numpy views made from shm.buf keep no buffer export, so SharedMemory.close()
        # would succeed and leave any view a caller still holds pointing at unmapped memory (a segfault).
        # Instead the mapping is left to the views (via the memoryview they reference) and is unmapped when
        # the last of them is garbage; the file descriptor is closed now.
        _release(shm)
        if self._owner:
            self.unlink(shm)

    def unlink(self, _shm: SharedMemory | None = None) -> None:
        """Remove the segment's name (creator only); mappings that exist stay valid until closed."""
        if not self._owner:
            raise PermissionError(f"shared memory {self._name} was attached, not created, here; only its "
                                  "creator unlinks it")
        shm = _shm or self._shm
        if shm is None:
            return
        try:
            shm.unlink()
        except FileNotFoundError:
            pass
        log.debug("unlinked shared memory %s", self._name)

    def __enter__(self) -> "SharedArrays":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self._shm is None else ("owner" if self._owner else "attached")
        return f"SharedArrays({self._name!r}, {len(self._specs)} arrays, {self._total} bytes, {state})"


def bcast_shared(comm: Any, arrays: Mapping[str, np.ndarray] | None, *, root: int = 0, prefix: str = "galapagos",
                 chunk_bytes: int = 64 << 20) -> tuple[dict[str, np.ndarray], SharedArrays | None]:
    """Broadcast ``arrays`` from ``root``; every other rank receives them straight into a new shared segment.

    Returns (arrays, holder): on the root the given arrays and None; elsewhere the shared views and the
    :class:`SharedArrays` that owns them (close it when done; pass its ``descriptor()`` to child processes).
    """
    holder: list[SharedArrays] = []

    def allocate(total: int, specs: list[ArraySpec]) -> np.ndarray:
        sa = SharedArrays.create(specs, prefix=prefix)
        holder.append(sa)
        return sa.buffer

    try:
        out = bcast_arrays(comm, arrays, root=root, chunk_bytes=chunk_bytes, allocate=allocate)
    except BaseException:
        for sa in holder:
            sa.close()
        raise
    if not holder:
        return out, None
    return holder[0].arrays, holder[0]


def remove_stale(prefix: str = "galapagos", directory: str = "/dev/shm") -> list[str]:
    """Unlink segments `{prefix}_{pid}_*` whose creating process is gone (a run killed with SIGKILL).

    Returns the names removed. Segments of live processes, and anything not named by this module, are left alone.
    """
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        parts = name.split("_")
        if len(parts) != 3 or parts[0] != prefix or not parts[1].isdigit():
            continue
        try:
            os.kill(int(parts[1]), 0)
            continue  # its creator still runs
        except ProcessLookupError:
            pass
        except PermissionError:
            continue  # another user's live process
        try:
            os.unlink(os.path.join(directory, name))
            removed.append(name)
        except OSError:
            pass
    if removed:
        log.warning("removed %d stale shared-memory segment(s) of killed runs: %s", len(removed), ", ".join(removed))
    return removed
