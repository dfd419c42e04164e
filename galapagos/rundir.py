"""The run directory: resolved config, the append-only journal of evaluations, the best network, logs; the
fingerprint of the data it was evolved on (data.json), the search time spent over all its jobs (clock.json) and the
lock a live run holds (.lock).

An ensemble directory keeps its journal the same way. One journal line (results.jsonl) per finished task:
what ran (an evaluation: parents, origin; an ensemble member: name, seed, origin; both: id, genome, key, params),
how it ended (status, fitness, metrics, the fitness after each epoch as `curve`, error) and where and when (rank,
host, start, end). Only :func:`journal_record` makes one.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Iterable

import h5py
import numpy as np

from datashare.format import DatasetInfo
from evolve.files import write_json
from evolve.netdir import NetworkDir
from launch.protocol import Result, Status

log = logging.getLogger(__name__)

JOURNAL = "results.jsonl"
EDGE_BYTES = 1 << 20  # the data's content hash reads the first and the last MiB of the file,
BLOCKS, BLOCK_BYTES = 16, 64 << 10  # and 16 evenly spaced blocks of 64 KiB between them (cheap on a multi-TB file)
STRUCTURE = {"task": "task", "sample_shape": "sample shape", "x_dtype": "input dtype", "outputs": "classes/targets",
             "splits": "split sizes"}  # what a resumed run must find unchanged in its data, and how it is named
JOB_VARIABLES = ("SLURM_JOB_ID", "LSB_JOBID", "PBS_JOBID", "FLUX_JOB_ID")


class RunDirError(ValueError):
    pass


def journal_record(result: Result, curve: list[float], what: dict) -> dict:
    """One journal line: `what` ran, and how, where and when it ended."""
    return {"id": result.id, **what, "status": Status(result.status).value, "fitness": result.fitness,
            "metrics": result.metrics, "curve": curve, "rank": result.rank, "host": result.host,
            "start": result.started, "end": result.ended, "error": result.error}


def data_fingerprint(info: DatasetInfo, path: str | Path) -> dict:
    """What a run is evolved on, for `--resume` to compare: the data as the run sees it (task, sample shape, input
    dtype, classes or targets, split sizes) and a sha256 over the file's HDF5 structure (dataset names, shapes,
    dtypes, root attributes), its size and a sample of its bytes (:func:`sample_ranges`). A rewritten or edited file
    changes the hash, except for an edit of a large file that misses every sampled block: the hash guards against
    the wrong file, it is no checksum."""
    path = Path(path).resolve()
    size = path.stat().st_size
    with h5py.File(path, "r") as f:
        datasets: dict[str, list] = {}
        f.visititems(lambda name, obj: datasets.update({name: [list(obj.shape), obj.dtype.str]})
                     if isinstance(obj, h5py.Dataset) else None)
        attrs = {k: np.asarray(v).tolist() for k, v in f.attrs.items()}
    digest = hashlib.sha256(json.dumps([datasets, attrs, size], sort_keys=True, default=str).encode())
    with open(path, "rb") as f:
        for offset, length in sample_ranges(size):
            f.seek(offset)
            digest.update(f.read(length))
    return {"path": str(path), "size": size, "task": info.task, "sample_shape": list(info.sample_shape),
            "x_dtype": info.x_dtype, "outputs": info.num_targets, "splits": dict(info.splits),
            "sha256": digest.hexdigest()}


def sample_ranges(size: int) -> list[tuple[int, int]]:
    """The (offset, length) pieces of a file of `size` bytes that its content hash reads: a small file whole, a
    large one's first and last MiB and BLOCKS evenly spaced blocks between them."""
    if size <= 2 * EDGE_BYTES + BLOCKS * BLOCK_BYTES:
        return [(0, size)]
    step = (size - 2 * EDGE_BYTES - BLOCK_BYTES) // (BLOCKS - 1)
    return [(0, EDGE_BYTES), *((EDGE_BYTES + i * step, BLOCK_BYTES) for i in range(BLOCKS)),
            (size - EDGE_BYTES, EDGE_BYTES)]


def describe_data(fp: dict) -> str:
    """A fingerprint's structure in words: "classification, float32 samples (1, 16, 16), 6 classes, splits ..."."""
    outputs = f"{fp['outputs']} {'classes' if fp['task'] == 'classification' else 'targets'}"
    splits = ", ".join(f"{k} {v}" for k, v in fp["splits"].items())
    return f"{fp['task']}, {fp['x_dtype']} samples {tuple(fp['sample_shape'])}, {outputs}, splits {splits}"


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
    def take(cls, path: Path, name: str) -> "RunLock":
        """Hold the lock at `path` for this process, or raise RunDirError naming the live run on `name`."""
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


class RunDir:
    """One run's files. The journal is the truth: `--resume` rebuilds everything else from it."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.journal = self.path / JOURNAL
        self.config = self.path / "config.toml"
        self.summary = self.path / "summary.json"
        self.best = self.path / "best"
        self.models = self.path / "models"
        self.logs = self.path / "log"
        self.data = self.path / "data.json"
        self.clock = self.path / "clock.json"
        self.lock_file = self.path / ".lock"

    @classmethod
    def check(cls, path: str | Path, *, resume: bool) -> "RunDir":
        """Refuse a directory that cannot hold this run (before anything is written or any rank starts), or that a
        live run holds (its lock is taken and given back at once)."""
        run = cls(path)
        if not run.path.parent.exists():
            raise RunDirError(f"--out {run.path}: parent directory {run.path.parent} does not exist")
        if run.path.exists() and not run.path.is_dir():
            raise RunDirError(f"--out {run.path}: exists and is not a directory")
        if resume:
            if not run.config.exists():
                raise RunDirError(f"--resume: {run.path} holds no run to resume (no config.toml)")
        elif run.journal.exists() and run.journal.stat().st_size > 0:
            raise RunDirError(f"--out {run.path} already holds a run ({JOURNAL}); use --resume or a new --out")
        if run.lock_file.exists():
            run.lock().release()
        return run

    def lock(self) -> RunLock:
        """This process's hold on the run directory until release() or its end (see RunLock)."""
        return RunLock.take(self.lock_file, str(self.path))

    def check_data(self, info: DatasetInfo, path: str | Path) -> dict:
        """--resume: refuse data other than the run's own (data.json), which would mix two problems in one journal;
        a copy or a moved file with the same contents is fine. Returns the data's fingerprint for record_data. A run
        from before data.json is taken on trust."""
        new = data_fingerprint(info, path)
        if not self.data.exists():
            return new
        old = json.loads(self.data.read_text())
        was = f"--resume: {self.path} was evolved on {old['path']}"
        if differ := [name for key, name in STRUCTURE.items() if old.get(key) != new[key]]:
            raise RunDirError(f"{was} ({describe_data(old)}); {new['path']} has {describe_data(new)} "
                              f"(what differs: {', '.join(differ)})")
        if old.get("sha256") != new["sha256"]:
            raise RunDirError(f"{was}; {new['path']} has the same structure but the file's contents differ (size "
                              f"{old['size']:,} vs {new['size']:,} bytes)")
        return new

    def record_data(self, fingerprint: dict, *, resume: bool) -> None:
        """Keep the data's fingerprint (its path as of this job) for the next --resume to compare."""
        old = json.loads(self.data.read_text()) if resume and self.data.exists() else None
        if resume and old is None:
            log.info("%s: recording the data's fingerprint (the run is older than %s)", self.path, self.data.name)
        elif old and old["path"] != fingerprint["path"]:
            log.info("%s: the data moved from %s to %s (same contents)", self.path, old["path"], fingerprint["path"])
        write_json(self.data, fingerprint)

    def spent_seconds(self) -> float:
        """Search time spent by the run's jobs so far (clock.json; 0 for a run from before it was kept)."""
        return float(json.loads(self.clock.read_text())["seconds"]) if self.clock.exists() else 0.0

    def record_seconds(self, seconds: float) -> None:
        write_json(self.clock, {"seconds": round(seconds, 3)})

    @classmethod
    def open(cls, path: str | Path, *, resume: bool) -> "RunDir":
        """A new run directory, or (resume) the existing one; refuses to mix two runs in one directory."""
        run = cls.check(path, resume=resume)
        for d in (run.path, run.models, run.logs):
            d.mkdir(parents=True, exist_ok=True)
        return run

    def read_journal(self) -> list[dict]:
        """Every finished evaluation so far; a torn last line (the run was killed mid-write) is cut off."""
        if not self.journal.exists():
            return []
        records, good = [], 0
        with open(self.journal, "rb") as f:
            for number, line in enumerate(f, 1):
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    if f.read(1):  # not the last line: the journal was edited or corrupted
                        raise RunDirError(f"{self.journal}:{number}: not a JSON line") from None
                    log.warning("%s:%d: dropping a torn last line (the run was killed while writing it)",
                                self.journal, number)
                    break
                good += len(line)
        if good != self.journal.stat().st_size:
            with open(self.journal, "r+b") as f:
                f.truncate(good)
        return records

    def append(self, record: dict) -> None:
        """One finished evaluation, on disk before the run goes on (flushed and fsynced)."""
        with open(self.journal, "a") as f:
            f.write(json.dumps(record, sort_keys=True, allow_nan=False) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def model_path(self, eval_id: int) -> Path:
        return self.models / f"{eval_id}.pt"

    def save_best(self, record: dict, extra: dict) -> None:
        """Copy an evaluation's weights, genome and metrics into best/ (each file replaced atomically)."""
        src = self.model_path(record["id"])
        NetworkDir(self.best).write(record["genome"], {**extra, "id": record["id"], "fitness": record["fitness"],
                                                       "metrics": record["metrics"], "params": record["params"],
                                                       "key": record["key"]},
                                    weights_from=src if src.exists() else None)

    def prune_models(self, keep: Iterable[int]) -> None:
        keep = {f"{i}.pt" for i in keep}
        for f in self.models.glob("*.pt"):
            if f.name not in keep:
                f.unlink(missing_ok=True)
