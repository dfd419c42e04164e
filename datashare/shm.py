"""A dict of numpy arrays in one POSIX shared-memory segment (a file under /dev/shm), mapped by many processes.

A node's leader rank creates the segment and fills it; the other ranks of the node map it read-only; the trainer
processes they start map it through an inherited file descriptor. Once every local rank holds a descriptor, the
leader removes the segment's name: the memory then lives exactly as long as the processes that map it, so a job
that dies in any way (even SIGKILL) leaves nothing behind in /dev/shm.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import secrets
import socket
from typing import Any, Iterable, Mapping

import numpy as np

from .layout import ArraySpec, array_spec, layout, views

log = logging.getLogger(__name__)

__all__ = ["SharedArrays", "SharedMemoryError", "SHM_DIR", "free_bytes", "remove_stale", "segment_stem"]

SHM_DIR = "/dev/shm"


class SharedMemoryError(OSError):
    """Not enough shared memory on a node, or a segment that cannot be made or mapped."""


def free_bytes(directory: str = SHM_DIR) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def _gib(n: int) -> str:
    """A size in the unit that shows it (a tmpfs of a few MiB is not "0.00 GiB")."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} bytes"


class SharedArrays:
    """Arrays laid out by :func:`datashare.layout.layout` in one shared-memory segment.

    The creator owns the segment (writable; it removes the name); attached processes get read-only views.
    """

    def __init__(self, fd: int, name: str, specs: list[ArraySpec], *, owner: bool) -> None:
        self._specs = specs
        self._offsets, self._total = layout(specs)
        self._owner, self._name, self._fd = owner, name, fd
        self._linked = owner
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if owner else 0)
        # Readers map every (written) page at once rather than one fault at a time; the creator's pages are
        # reserved but not yet zeroed, which its first writes do anyway, so populating them would cost a pass.
        flags = mmap.MAP_SHARED | (0 if owner else getattr(mmap, "MAP_POPULATE", 0))
        mm = mmap.mmap(fd, max(1, self._total), flags=flags, prot=prot)
        self._buffer: np.ndarray | None = np.frombuffer(mm, dtype=np.uint8, count=self._total)
        self._arrays: dict[str, np.ndarray] | None = views(self._buffer, specs)

    # -- construction

    @classmethod
    def create(cls, specs: Iterable[Iterable[Any]], *, prefix: str = "galapagos") -> "SharedArrays":
        """A new zeroed segment for ``specs`` ((name, shape, dtype) triples), its memory reserved up front.

        Fails with the numbers, before anything is written, if /dev/shm has too little room: a tmpfs that runs
        out while being written kills the writer with SIGBUS instead.
        """
        specs = [array_spec(s) for s in specs]
        _, total = layout(specs)
        free = free_bytes()
        host = socket.gethostname()
        if total > free:
            raise SharedMemoryError(errno.ENOSPC, f"node {host}: {SHM_DIR} has {_gib(free)} free, the dataset "
                                    f"needs {_gib(total)} (one copy per node): free it, or use nodes with more memory")
        name = segment_stem(prefix, os.getpid()) + secrets.token_hex(4)
        path = os.path.join(SHM_DIR, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            if total:
                os.posix_fallocate(fd, 0, total)
            else:
                os.ftruncate(fd, 1)
            sa = cls(fd, name, specs, owner=True)
        except OSError as exc:
            os.close(fd)
            os.unlink(path)
            raise SharedMemoryError(exc.errno, f"node {host}: cannot reserve {_gib(total)} in {SHM_DIR} "
                                    f"({_gib(free)} free): {exc.strerror}") from None
        log.debug("created shared memory %s (%d bytes, %d arrays)", name, total, len(specs))
        return sa

    @classmethod
    def attach(cls, descriptor: Mapping[str, Any]) -> "SharedArrays":
        """Map a segment read-only: through the inherited descriptor ``fd`` if this process has it, else by name."""
        specs = [array_spec(s) for s in descriptor["specs"]]
        offsets, total = layout(specs)
        if dict(descriptor.get("offsets", offsets)) != offsets:
            raise SharedMemoryError(errno.EINVAL, f"shared memory {descriptor['name']}: layout differs from the "
                                    "creator's")
        fd = descriptor.get("fd")
        if fd is not None and _same_file(fd, descriptor):
            fd = os.dup(fd)
        else:
            try:
                fd = os.open(os.path.join(SHM_DIR, descriptor["name"]), os.O_RDONLY)
            except FileNotFoundError:
                raise SharedMemoryError(errno.ENOENT, f"shared memory {descriptor['name']} is gone (its name is "
                                        "removed once the node's ranks have mapped it; pass its fd)") from None
        size = os.fstat(fd).st_size
        if size < total:
            os.close(fd)
            raise SharedMemoryError(errno.EINVAL, f"shared memory {descriptor['name']}: {size} bytes, "
                                    f"{total} expected")
        return cls(fd, descriptor["name"], specs, owner=False)

    # -- access

    @property
    def name(self) -> str:
        return self._name

    @property
    def nbytes(self) -> int:
        return self._total

    @property
    def offsets(self) -> dict[str, int]:
        return dict(self._offsets)

    @property
    def buffer(self) -> np.ndarray:
        """The whole segment as flat uint8 (writable for the creator)."""
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
        """A small picklable description for :meth:`attach`; a child started with ``pass_fds=[d['fd']]`` maps it
        even after the name is gone."""
        st = os.fstat(self._fd) if self._fd >= 0 else None
        return {"name": self._name, "fd": self._fd if self._fd >= 0 else None,
                "inode": (st.st_dev, st.st_ino) if st else None,
                "specs": [(s.name, s.shape, s.dtype.str) for s in self._specs],
                "offsets": dict(self._offsets), "nbytes": self._total}

    # -- lifetime

    def unlink(self) -> None:
        """Remove the segment's name (creator only); every existing mapping and descriptor stays valid."""
        if not self._owner:
            raise PermissionError(f"shared memory {self._name} was attached, not created, here; only its "
                                  "creator unlinks it")
        if self._linked:
            self._linked = False
            try:
                os.unlink(os.path.join(SHM_DIR, self._name))
            except FileNotFoundError:
                pass
            log.debug("unlinked shared memory %s", self._name)

    def close(self) -> None:
        """Let go of the segment. The mapping goes when the last view of it is garbage (unmapping under live
        numpy views would make them segfault); the descriptor is closed and the name removed now."""
        self._arrays = None
        self._buffer = None
        if self._owner:
            self.unlink()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

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
        state = "closed" if self._fd < 0 else ("owner" if self._owner else "attached")
        return f"SharedArrays({self._name!r}, {len(self._specs)} arrays, {self._total} bytes, {state})"


def _same_file(fd: int, descriptor: Mapping[str, Any]) -> bool:
    """Whether ``fd`` in this process is the segment (a child inherits it; elsewhere the number means nothing)."""
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    inode = descriptor.get("inode")
    return inode is not None and (st.st_dev, st.st_ino) == tuple(inode)


def segment_stem(prefix: str, pid: int) -> str:
    """How the names of process `pid`'s segments begin: a segment is named `{prefix}_{pid}_{token}`."""
    return f"{prefix}_{pid}_"


def remove_stale(prefix: str = "galapagos", directory: str = SHM_DIR) -> list[str]:
    """Unlink segments `{prefix}_{pid}_*` whose creating process is gone (a run killed while it shared data).

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
