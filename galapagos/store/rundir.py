"""The run directory: every path inside it. The resolved config, the append-only journal of evaluations
(results.jsonl, one :class:`~galapagos.store.journal.JournalRecord` a line), summary.json, the best network (best/),
the Pareto front (pareto.json, front/ID/), the kept weights (models/), logs and crash files (log/), the fingerprint
of the data it was evolved on (data.json, galapagos/store/fingerprint.py), the search time spent over all its jobs
(clock.json), the lock a live run holds (.lock, galapagos/store/runlock.py), TensorBoard's event files
(tensorboard/), and a design's report.json and ensemble/ (an ensemble directory, galapagos/store/ensembledir.py).

An ensemble directory keeps its journal, config and logs the same way: both are a :class:`JournalDir`.
"""
from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shlex
import shutil
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator

from galapagos.datashare.format import DatasetInfo
from galapagos.errors import RunDirError
from galapagos.evolve.files import write_json
from galapagos.evolve.netdir import NetworkDir
from galapagos.store.fingerprint import STRUCTURE, data_fingerprint, describe_data, what_changed
from galapagos.store.journal import JournalRecord
from galapagos.store.reaper import Reaper
from galapagos.store.runlock import RunLock

# Seconds between fsyncs of the journal. An fsync per evaluation costs milliseconds on a parallel file system; at
# whole-machine rates (Summit: 460 tasks/s) it alone would fill the master's time (bench/master_cost.py).
FSYNC_EVERY = 1.0
# Seconds between writes of the journal's buffer by rank 0's loop (JournalSource.on_tick): a write per result was a
# tenth of rank 0's time per task at whole-machine scale (bench/scale.py). A rank 0 killed outright loses at most the
# results of that long, which --resume trains again; every other end of a run writes them.
FLUSH_EVERY = 0.2
MODEL_OVERHEAD = 64 << 10  # bytes of a torch.save file beyond its tensors (archive headers, names, buffers)

log = logging.getLogger(__name__)

JOURNAL = "results.jsonl"
_BEGUN = frozenset({"<begun>"})  # RunDir._found of a job that began, or did not open the directory: kept whole


class JournalDir:
    """A directory with a journal of finished tasks, its resolved config and its logs: a run directory, or an
    ensemble directory (galapagos/store/ensembledir.py)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.journal = self.path / JOURNAL
        self.config = self.path / "config.toml"
        self.logs = self.path / "log"
        self.master_log = self.logs / "master.log"  # rank 0's log
        # rank 0's heartbeat: touched while it serves, watched from outside the job (galapagos.launch.heartbeat)
        self.master_heartbeat = self.logs / "master.alive"
        self.lost_record = self.logs / "lost.json"  # the hosts of the ranks a job gave up (flows/recovery.py)
        self._out = None  # the journal, open for appending while the job goes
        self._synced = 0.0  # when it was last fsynced (time.monotonic)
        self._flushed = 0.0  # when its buffer was last written

    def crash_file(self, rank: int) -> Path:
        """Where the traceback of a rank that failed unexpectedly goes."""
        return self.logs / f"crash-rank{rank}.txt"

    def record_lost(self, hosts: dict[int, str], nodes: Iterable[str] = (), when: dict[int, float] | None = None
                    ) -> None:
        """Rank 0, before it ends a job that lost worker ranks: their hosts (and the nodes given up whole), which the
        job's supervisor probes before it starts the ranks again (galapagos/flows/recovery.py), and when each rank
        was given up."""
        self.save(self.lost_record, {"time": time.time(), "ranks": {str(r): h for r, h in sorted(hosts.items())},
                                     "nodes": sorted(nodes),
                                     "given_up": {str(r): t for r, t in sorted((when or {}).items())}})

    def lost_hosts(self, since: float) -> list[str] | None:
        """The hosts record_lost wrote at `since` or later, or None (no record, or an older job's)."""
        try:
            found = json.loads(self.lost_record.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(found, dict) or found.get("time", 0) < since:
            return None
        return sorted({*found.get("ranks", {}).values(), *found.get("nodes", [])} - {""}) or None

    def read_journal(self, repair: bool = False) -> list[JournalRecord]:
        """Every finished task so far, without a torn last line (see iter_journal)."""
        return list(self.iter_journal(repair))

    def iter_journal(self, repair: bool = False) -> Iterator[JournalRecord]:
        """read_journal one record at a time (for a pass over a journal too big to hold). A torn last line (the run
        was killed while writing it, or a live run is writing it now) is not read; `repair` (only the job that is
        about to write the journal: --resume) cuts it off, which a mere reader of a live run must never do."""
        self.flush()
        if not self.journal.exists():
            return
        good = 0
        with open(self.journal, "rb") as f:
            for number, line in enumerate(f, 1):
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    if f.read(1):  # not the last line: the journal was edited or corrupted
                        raise self.damaged(number, "not a JSON line") from None
                    if repair:
                        log.warning("%s:%d: dropping a torn last line (the run was killed while writing it)",
                                    self.journal, number)
                    break
                try:
                    record = JournalRecord.from_dict(record)
                except TypeError as exc:
                    raise self.damaged(number, f"not a journal record: {exc}") from None
                good += len(line)
                yield record
        if repair and good != self.journal.stat().st_size:
            with open(self.journal, "r+b") as f:
                f.truncate(good)

    def damaged(self, number: int, what: str) -> RunDirError:
        """A line of the journal that cannot be read, with lines after it (an edit, or a crash of the file system):
        where it is, and how to go on without the one task it held (the lines after it are read as they are)."""
        where = shlex.quote(str(self.journal))
        return RunDirError(f"{self.journal}:{number}: {what}; to go on without the task on that line, keep a copy "
                           f"and remove the line (cp {where} {where}.bak && sed -i {number}d {where}), then run the "
                           "command again (--resume trains another task in its place)")

    def append(self, record: JournalRecord) -> None:
        """One finished task, into the journal's buffer until flush()."""
        line = record.to_line()
        try:
            if self._out is None:
                self._out = open(self.journal, "a", buffering=1 << 20)
            self._out.write(line + "\n")
        except OSError as exc:  # a torn last line is cut off by the next --resume (read_journal)
            raise self.write_error(self.journal, exc) from None

    def flush(self, every: float = 0.0) -> None:
        """What append() buffered, written through to the kernel (it then survives the death of this process), if
        `every` seconds have passed since the last write; fsynced at most every FSYNC_EVERY seconds and by close()
        (a node that crashes loses at most that much, which --resume trains again)."""
        if self._out is None or time.monotonic() - self._flushed < every:
            return
        try:
            self._out.flush()
            self._flushed = time.monotonic()
            if time.monotonic() - self._synced >= FSYNC_EVERY:
                os.fsync(self._out.fileno())
                self._synced = time.monotonic()
        except OSError as exc:
            raise self.write_error(self.journal, exc) from None

    def close(self) -> None:
        """The journal on disk (fsynced) and closed; append opens it again if needed."""
        if self._out is not None:
            out, self._out = self._out, None
            try:
                out.flush()
                os.fsync(out.fileno())
                out.close()
            except OSError as exc:
                raise self.write_error(self.journal, exc) from None

    def save(self, path: Path, obj: dict) -> None:
        """A JSON file of the run, replaced atomically; a failed write is one line (write_error)."""
        try:
            write_json(path, obj)
        except OSError as exc:
            raise self.write_error(path, exc) from None

    def write_error(self, path: Path, exc: OSError) -> RunDirError:
        """A write into the run that failed (a full or read-only disk): one line with the path and the room left;
        what the journal holds is kept, and `--resume` continues once there is room."""
        return self.refused(f"{path}: {exc.strerror or exc}")

    def refused(self, why: str, *, task: int | None = None) -> RunDirError:
        """The disk refused a write into the run (`why`: "PATH: No space left on device"), here or in the trainer of
        `task`, which is then recorded nowhere (not the candidate's failure) and trained again by --resume."""
        free = _free_bytes(self.path)
        room = "" if free is None else f", {free / 2**20:.1f} MiB free under {self.path}"
        what = "" if task is None else f"the files of task {task} ("
        nothing = "" if task is None else ", nothing is recorded against it"
        return RunDirError(f"cannot write {what}{why}{')' if what else ''}{room}; the run stops here{nothing}; "
                           f"everything in {self.journal.name} is kept: continue with --resume once there is room")


class RunDir(JournalDir):
    """One run's files. The journal is the truth: `--resume` rebuilds everything else from it."""

    def __init__(self, path: str | Path):
        super().__init__(path)
        self.summary = self.path / "summary.json"
        self.best = self.path / "best"
        self.front = self.path / "front"  # several objectives: one network directory per member of the Pareto front
        self.pareto = self.path / "pareto.json"
        self.models = self.path / "models"
        self._models = str(self.models)
        self.checkpoints = self.path / "checkpoints"  # multi-fidelity: training states a promotion goes on from
        self._checkpoints = str(self.checkpoints)
        self.data = self.path / "data.json"
        self.clock = self.path / "clock.json"
        self.lock_file = self.path / ".lock"
        self.tensorboard = self.path / "tensorboard"  # [report] tensorboard's event files
        self.report = self.path / "report.json"  # a design's report
        self.ensemble = self.path / "ensemble"  # a design's ensemble directory
        self.final = self.path / "final"  # the ensemble of the kept networks (run.final_ensemble)
        self._found: set[str] | None = _BEGUN  # what open() found in the directory (None: no directory yet)
        self._made: list[Path] = []  # the missing parent directories open() made, deepest first
        self._lock = None  # this job's lock (hold)
        self._reaper = Reaper()  # drop_model's deletions

    @classmethod
    def check(cls, path: str | Path, *, resume: bool) -> "RunDir":
        """Refuse a directory that cannot hold this run (before anything is written or any rank starts), or that a
        live run holds (its lock is taken and given back at once)."""
        run = cls(path)
        if run.path.exists() and not run.path.is_dir():
            raise RunDirError(f"--out {run.path}: exists and is not a directory")
        if resume:
            if not run.config.exists():
                raise RunDirError(f"--resume: {run.path} holds no run to resume (no config.toml)")
        elif run.journal.exists() and run.journal.stat().st_size > 0:
            raise RunDirError(f"--out {run.path} already holds a run ({JOURNAL}); use --resume or a new --out")
        where = next(p for p in (run.path, *run.path.parents) if p.exists())  # open() makes the missing parents
        if not where.is_dir():
            raise RunDirError(f"--out {run.path}: {where} is not a directory")
        if not os.access(where, os.W_OK | os.X_OK):  # EROFS for root too (access(2))
            readonly = _statvfs_flags(where) & os.ST_RDONLY
            why = os.strerror(errno.EROFS if readonly else errno.EACCES)
            raise RunDirError(f"--out {run.path}: cannot write in {where}: {why}; choose another --out")
        if run.lock_file.exists():
            RunLock.take(run.lock_file, str(run.path), record=False).release()
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
            raise RunDirError(f"{was}; {new['path']} has the same structure but the file's contents differ "
                              f"({what_changed(old, new)})")
        return new

    def record_data(self, fingerprint: dict, *, resume: bool) -> None:
        """Keep the data's fingerprint (its path as of this job) for the next --resume to compare."""
        old = json.loads(self.data.read_text()) if resume and self.data.exists() else None
        if resume and old is None:
            log.info("%s: recording the data's fingerprint (the run is older than %s)", self.path, self.data.name)
        elif old and old["path"] != fingerprint["path"]:
            log.info("%s: the data moved from %s to %s (same contents)", self.path, old["path"], fingerprint["path"])
        self.save(self.data, fingerprint)

    def spent_seconds(self) -> float:
        """Search time spent by the run's jobs so far (clock.json; 0 for a run from before it was kept)."""
        return float(json.loads(self.clock.read_text())["seconds"]) if self.clock.exists() else 0.0

    def record_seconds(self, seconds: float) -> None:
        self.save(self.clock, {"seconds": round(seconds, 3)})

    @classmethod
    def open(cls, path: str | Path, *, resume: bool) -> "RunDir":
        """A new run directory, or (resume) the existing one; refuses to mix two runs in one directory. What it
        holds already is noted, for `discard`."""
        run = cls.check(path, resume=resume)
        run._found = set(os.listdir(run.path)) if run.path.is_dir() else None
        run._made = [p for p in run.path.absolute().parents if not p.exists()]
        for d in (run.path, run.models, run.logs):
            d.mkdir(parents=True, exist_ok=True)
        return run

    def hold(self) -> Callable[[], None]:
        """This job's lock on the run directory (see RunLock); returns what gives it back."""
        self._lock = self.lock()
        return self._lock.release

    def begin(self, config: str, data: dict, *, resume: bool) -> None:
        """The job has started (its workers set up, the data shared): the resolved config and the data's
        fingerprint are written, and what the job writes from now on is the run's."""
        self.record_data(data, resume=resume)
        try:
            self.config.write_text(config)
        except OSError as exc:
            raise self.write_error(self.config, exc) from None
        self._found = _BEGUN

    def discard(self) -> None:
        """A job refused before it began (`begin`): remove what it added to the directory (its lock, log/, models/,
        the directory itself if it made it), so that a refused new run leaves --out as it found it and a refused
        --resume leaves the run as it was. Nothing is removed unless this job holds the lock: another live job's
        files stay."""
        found = self._found
        if found is _BEGUN or self._lock is None:
            return
        self.close()
        if found is None:
            shutil.rmtree(self.path, ignore_errors=True)
            for parent in self._made:  # deepest first; one that holds something else now stays
                with contextlib.suppress(OSError):
                    parent.rmdir()
            return
        for name in set(os.listdir(self.path)) - found:
            entry = self.path / name
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)

    def model_path(self, eval_id: int) -> str:
        """Where an evaluation's weights go: a string, made for every task at whole-machine scale (a Path's parsing
        cost rank 0 more than the rest of the task's bookkeeping, bench/scale.py)."""
        return f"{self._models}/{eval_id}.pt"

    def close(self) -> None:
        self._reaper.wait()
        super().close()

    def drop_model(self, eval_id: int) -> None:
        """Delete an evaluation's weights, if any, off the caller's path (store/reaper.py); close() waits for it."""
        self._reaper.delete(self.model_path(eval_id))

    def checkpoint_path(self, eval_id: int) -> str:
        """Where an evaluation's whole training state goes at the end of its rung (multi-fidelity, evolve/rungs.py),
        for its promotion to go on from."""
        return f"{self._checkpoints}/{eval_id}.pt"

    def drop_checkpoint(self, eval_id: int) -> None:
        """Delete an evaluation's checkpoint, if any, off the caller's path; close() waits for it."""
        self._reaper.delete(self.checkpoint_path(eval_id))

    def front_dir(self, eval_id: int) -> Path:
        """The network directory of a member of the Pareto front (front/ID)."""
        return self.front / str(eval_id)

    def save_front(self, objectives: list[list[str]], members: list[dict]) -> None:
        """pareto.json: the objectives ([name, "max" or "min"]) and a row per member of the front (id, its network
        directory `dir` relative to the run, fitness and the other objectives' values)."""
        self.save(self.pareto, {"objectives": objectives, "members": members})

    def read_front(self) -> dict | None:
        """pareto.json as saved; None when the run keeps no Pareto front."""
        if not self.pareto.exists():
            return None
        try:
            front = json.loads(self.pareto.read_text())
            if not isinstance(front.get("members"), list):
                raise ValueError("no list of members")
        except (OSError, ValueError, AttributeError) as exc:
            raise RunDirError(f"unreadable {self.pareto}: {exc!r}") from None
        return front

    def front_member(self, row: dict) -> Path:
        """The network directory a row of pareto.json names."""
        return self.path / row["dir"]

    def save_network(self, dest: Path, record: JournalRecord, extra: dict) -> None:
        """Copy an evaluation's weights, genome and metrics into a network directory, best/ or front/ID (each file
        replaced atomically). The journal is flushed first: it holds every evaluation a network directory shows.
        Weights gone from models/ leave the directory without model.pt, never with another network's."""
        self.flush()
        src, net = self.model_path(record.id), NetworkDir(dest)
        weights = src if os.path.exists(src) else None
        try:
            if weights is None:
                net.model_file.unlink(missing_ok=True)
            net.write(record.genome, {**extra, "id": record.id, "fitness": record.fitness, "metrics": record.metrics,
                                      "params": record.params, "key": record.key},
                      weights_from=weights)
        except OSError as exc:
            raise self.write_error(dest, exc) from None

    def check_room(self, files: int, params: int) -> None:
        """Refuse to start when the disk under the run cannot hold `files` weights files of up to `params`
        float32 parameters each (the kept models, those being written and best/): better now than mid-run."""
        needed = files * (4 * params + MODEL_OVERHEAD)
        free = _free_bytes(self.path)
        if free is not None and free < needed:
            raise RunDirError(f"--out {self.path}: {free / 2**20:.1f} MiB free, the run may need "
                              f"{needed / 2**20:.1f} MiB for {files} weights files of up to {params:,} parameters "
                              "each: free some room, or lower run.keep_models or space.max_params")

    def prune_models(self, keep: Iterable[int]) -> None:
        """Delete every weights file but those of `keep`, and any a killed trainer left half-written."""
        self._prune(self.models, keep)

    def prune_checkpoints(self, keep: Iterable[int]) -> None:
        """Delete every checkpoint but those of `keep`, and any a killed trainer left half-written."""
        self._prune(self.checkpoints, keep)

    def _prune(self, folder: Path, keep: Iterable[int]) -> None:
        keep = {f"{i}.pt" for i in keep}
        self._reaper.wait()
        for f in [*folder.glob("*.pt"), *folder.glob(".*.pt.tmp*")]:
            if f.name not in keep:
                f.unlink(missing_ok=True)


def _free_bytes(path: Path) -> int | None:
    """Bytes this user may still write under `path`, or where it would be made (None when the file system cannot
    say)."""
    try:
        st = os.statvfs(_existing(path))
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _statvfs_flags(path: Path) -> int:
    try:
        return os.statvfs(path).f_flag
    except OSError:
        return 0


def _existing(path: Path) -> Path:
    """`path`, or its nearest parent that exists."""
    return next((p for p in (path, *path.parents) if p.exists()), path)
