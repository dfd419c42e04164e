"""What the evolution run and the ensemble build share as task sources of the master loop: every finished task
journalled the moment it arrives, the learning curve of each running task, and the progress display."""
from __future__ import annotations

import time
from collections import Counter, deque

from galapagos.evolve.genome import Genome
from galapagos.launch.protocol import Progress, Result, Status
from galapagos.launch.runtime import MasterState
from galapagos.reports.progress import ProgressView, Snapshot
from galapagos.store.journal import JournalRecord, journal_record
from galapagos.store.rundir import FLUSH_EVERY, JournalDir


class JournalSource:
    """Subclasses hand out the tasks (next_task, finished) and say what each record holds (on_result)."""

    def __init__(self, journal: JournalDir, records: list[JournalRecord] = (), *, view: ProgressView | None = None,
                 deadline: float | None = None, keep: bool = True):
        """`records`: what earlier jobs of the run finished. `keep`: keep every record in `records` (False: only
        count them; the journal on disk has them, and a million evaluations would fill the master's memory)."""
        self.journal, self.keep = journal, keep
        self.records = list(records) if keep else []
        self.view, self.deadline = view or ProgressView(), deadline
        self.curves: dict[int, list[float]] = {}  # running task -> its fitness after each epoch
        self.started = time.time()
        self.state: MasterState | None = None
        self.shown = -1
        self.done = self.resumed = len(records)  # finished in all; by earlier jobs of the run
        self.by_status = Counter(str(r.status) for r in records)
        self.again: deque[int] = deque()  # tasks whose worker rank was lost, to be sent again before any new one
        self.tries: Counter = Counter()  # task -> times it went back to the queue

    def running(self, task_id: int) -> None:
        self.curves[task_id] = []

    def lost_again(self, r: Result) -> bool:
        """A task whose worker rank was lost (its node died or froze) goes back to the queue, once: True, and it is
        not journalled. Lost a second time, it is journalled as lost: the task itself may be what kills nodes."""
        if r.status != Status.LOST or self.tries[r.id] >= 1:
            return False
        self.tries[r.id] += 1
        self.curves.pop(r.id, None)
        self.again.append(r.id)
        self.view.message(f"task {r.id} was running on rank {r.rank}, lost ({r.error}): it goes back to the queue")
        return True

    def journal_result(self, r: Result, what: dict) -> JournalRecord | None:
        """Journal a finished task; None for a cancelled one (the job is ending: nothing is kept, a resume redoes
        it). A Genome in `what` is written as its canonical JSON, made once, and stays a Genome in the record
        returned (Genome.from_json and NetworkDir.write take either): its dict is made only where it is needed."""
        curve = self.curves.pop(r.id, [])
        if r.status == Status.CANCELLED:
            return None
        if r.status == Status.DISK:  # the disk's fault, not the task's: nothing is journalled, and the run stops
            raise self.journal.refused(r.error or "the disk refused a write", task=r.id)
        record = journal_record(r, curve, what)
        self.journal.append(record)
        if self.keep:
            genome = record.genome
            self.records.append(record.replace(genome=genome.to_json())
                                if isinstance(genome, Genome) else record)
        self.done += 1
        self.by_status[record.status] += 1
        return record

    def warn(self, what: str, r: Result) -> None:
        """A log line for a task that did not end well, which does not tear the live bar."""
        self.view.message(f"{what} {r.status} in {r.seconds:.1f}s on rank {r.rank}"
                          + (f": {r.error.splitlines()[-1]}" if r.error else ""))

    def on_progress(self, p: Progress) -> Status | None:
        fit = p.metrics.get("fitness")
        if not isinstance(fit, (int, float)) or p.id not in self.curves:
            return None
        self.curves[p.id].append(fit)
        return self.judge(p.id)

    def judge(self, task_id: int) -> Status | None:
        """After each epoch of a running task: a status to stop it with (e.g. pruned), or None to let it go on."""
        return None

    def _snapshot(self, *, total: int | None, best: float | None) -> Snapshot:
        state, elapsed = self.state, time.time() - self.started
        return Snapshot(done=self.done, total=total, best=best, busy=state.busy if state else 0,
                        workers=state.workers if state else 0, elapsed=elapsed,
                        remaining=None if self.deadline is None else max(0.0, self.deadline - time.time()),
                        by_status=dict(self.by_status),
                        rate=60 * (self.done - self.resumed) / max(elapsed, 1e-9))

    def snapshot(self) -> Snapshot:
        raise NotImplementedError

    def on_tick(self, state: MasterState) -> None:
        """At most every launch.runtime.TICK_BUSY seconds while tasks come and go: a log line per finished task, or a
        live bar redraw (at most every progress.MIN_REDRAW seconds); the run's last snapshot is always shown. The
        journal's lines are written through every FLUSH_EVERY seconds."""
        self.journal.flush(every=FLUSH_EVERY)
        self.state = state
        force = self.done != self.shown
        if state.ended or self.view.due(force):
            self.view.show(self.snapshot(), force, final=state.ended)
            self.shown = self.done
