"""The last share of an evolution run's time budget (`[evolution] finish`): the search stops breeding and its best
networks train on for as long as the time left allows.

Every candidate of the search trains the same short `[train] epochs`: enough to rank networks, not to finish any.
A practitioner's network trained for the whole budget beats the search's pick where longer training pays
(bench/RESULTS.md). So, from `finish` of the budget before its end, each free worker takes the best network by
validation not yet finished, starts from its kept weights as they are, and trains it on one new learning-rate cycle
over the epochs its own training time says fit in what is left of the budget (with a margin, `SAFETY`). The run's
best network is then the best of these by validation: a choice among a few long-trained networks, not among
hundreds of short ones. A network whose epochs would not exceed `[train] epochs` is not finished; once none is
left, the run ends as soon as its last finishing task does.
"""
from __future__ import annotations

from dataclasses import replace

from galapagos.evolve.task import TrainConfig
from galapagos.store.journal import JournalRecord

__all__ = ["FINISH", "SAFETY", "Finish", "epoch_seconds"]

FINISH = "finish"  # the origin of a finishing task's journal record
SAFETY = 0.8  # the share of the time left that a finishing task's epochs are planned to take


class Finish:
    """Which network a free worker finishes, and over how many epochs."""

    def __init__(self, share: float, budget_seconds: float, deadline: float | None, train: TrainConfig,
                 time_limit: float, records: list[JournalRecord] = ()) -> None:
        """`time_limit`: the seconds a task may take (`run.task_timeout`). `records`: an earlier job's finishing
        tasks are not run again."""
        self.start = deadline - share * budget_seconds if share and deadline is not None else None
        self.deadline, self.train, self.time_limit = deadline, train, time_limit
        self.keys = {r.key for r in records if r.origin == FINISH}  # networks finished or being finished
        self.over = False  # no network is left worth finishing in the time left

    def begun(self, now: float) -> bool:
        return self.start is not None and now >= self.start

    def next(self, best: list[JournalRecord], now: float, end: float | None = None
             ) -> tuple[JournalRecord, TrainConfig] | None:
        """The best of `best` (the kept networks, best first) not finished yet, and its training; None when none is
        left or the time left is too short for it (the phase is then over). `end`: when the search's time ends, if
        before the deadline (the final ensemble's build comes after it)."""
        for record in best:
            if record.key in self.keys:  # finished (a finishing record's key is its parent's), or being finished
                continue
            epochs = self.epochs(record, now, end)
            if epochs <= self.train.epochs:
                break
            self.keys.add(record.key)
            return record, replace(self.train, epochs=epochs, inherited_epochs=0, inherit_shrink=1.0)
        self.over = True
        return None

    def epochs(self, record: JournalRecord, now: float, end: float | None = None) -> int:
        """The epochs of `record`'s network that fit in the time left, by its own training's seconds per epoch."""
        per_epoch = epoch_seconds(record)
        if not per_epoch:
            return 0
        left = (self.deadline if end is None else end) - now
        return int(SAFETY * min(left, self.time_limit) / per_epoch)


def epoch_seconds(record: JournalRecord) -> float:
    """A finished evaluation's seconds per epoch trained, its task's start-up included; 0 where it trained none."""
    if not record.curve or record.start is None or record.end is None:
        return 0.0
    return max(record.end - record.start, 1e-3) / len(record.curve)
