"""The lock a live run holds on its directory (RUN/.lock)."""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path

from galapagos.errors import RunDirError

log = logging.getLogger(__name__)

JOB_VARIABLES = ("SLURM_JOB_ID", "LSB_JOBID", "PBS_JOBID", "FLUX_JOB_ID")

class RunLock:
    """A live run's hold on its directory, so that a second job on it (an overlapping chained job, a second
    --resume) refuses instead of journalling the same evaluations twice.

    The lock is an exclusive flock on DIR/.lock, which also records who holds it (host, pid, start time, scheduler
    job). The kernel releases a flock when its process ends, however it ends (a crash, kill -9), so a dead run never
    blocks. flock works on local file systems and on Lustre or GPFS mounted with flock support (Lustre's `flock`
    mount option: https://doc.lustre.org/lustre_manual.xhtml). Where flock is not supported (ENOLCK, EOPNOTSUPP),
    the file itself is the lock: created with O_EXCL, removed on release. That file outlives a crash, so a lock
    whose pid is not alive on this same host (or that is empty) is stale and replaced; one from another host is
    taken as live, since whether its process lives cannot be seen from here: delete it by hand once that run is
    over.
    """

    def __init__(self, path: Path, fd: int, flocked: bool):
        self.path, self.fd, self.flocked = path, fd, flocked

    @classmethod
    def take(cls, path: Path, name: str, *, record: bool = True) -> "RunLock":
        """Hold the lock at `path` for this process, or raise RunDirError naming the live run on `name`. `record`:
        write this process in the file as its holder (False for a check that gives the lock back at once)."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise RunDirError(f"{name}: cannot open its lock file {path.name}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise in_use(name, path) from None
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP):
                raise
            log.warning("%s: this file system does not support flock (%s); locking by creating the file instead, "
                        "and a lock left by a dead process on this host is replaced", path, exc.strerror)
            return cls.create(path, name)
        if record:
            os.ftruncate(fd, 0)
            os.write(fd, holder_line())
        return cls(path, fd, True)

    @classmethod
    def create(cls, path: Path, name: str) -> "RunLock":
        """The lock without flock: the file created with O_EXCL; a stale one is replaced (see the class)."""
        for _ in range(3):
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                if not stale(read_holder(path)):
                    raise in_use(name, path) from None
                log.warning("%s: replacing a stale lock (%s)", path, path.read_text(errors="replace").strip())
                path.unlink(missing_ok=True)
                continue
            os.write(fd, holder_line())
            return cls(path, fd, False)
        raise in_use(name, path)

    def release(self) -> None:
        if self.fd < 0:
            return
        if not self.flocked and path_inode(self.path) == os.fstat(self.fd).st_ino:
            self.path.unlink()
        os.close(self.fd)
        self.fd = -1

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def holder_line() -> bytes:
    """Who holds a lock: host, pid, since when, and the scheduler's job id if any."""
    job = next((os.environ[v] for v in JOB_VARIABLES if os.environ.get(v)), None)
    return (json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "job": job,
                        "since": time.strftime("%Y-%m-%d %H:%M:%S %Z")}) + "\n").encode()


def read_holder(path: Path) -> dict:
    """A lock file's holder; {} for an empty or unreadable one."""
    try:
        holder = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def stale(holder: dict) -> bool:
    """A lock without flock that no live process holds: empty, or its pid is dead on this host."""
    if not holder:
        return True
    if holder.get("host") != socket.gethostname():
        return False
    try:
        os.kill(int(holder["pid"]), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, KeyError, TypeError, ValueError):
        return False
    return False


def path_inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return None


def in_use(name: str, path: Path) -> RunDirError:
    h = read_holder(path)
    job = f", job {h['job']}" if h.get("job") else ""
    return RunDirError(f"{name} is in use by a live run (host {h.get('host', '?')}, pid {h.get('pid', '?')}{job}, "
                       f"since {h.get('since', '?')}); wait for it to end or use another --out")
