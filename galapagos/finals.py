"""The end of a timed run: its best networks trained again, longer (`[run] final_share`).

A search trains every candidate briefly (`train.epochs`) so that it can try many; the best of them would score
higher trained for longer. Once only `final_share` of the time budget is left, the run breeds no more children:
each free worker instead trains one of the best evaluations again from scratch, the best first, for as many epochs
as fit in the time left (at most MAX_FACTOR times `train.epochs`, at least MIN_FACTOR times, else that network is
passed over). These evaluations have origin "final" and their parent is the evaluation they repeat; they count for
the run's best network like any other, and join no population (evolve.engine.Engine.final). A run whose
candidates report no `train_seconds` (a task function of its own) has no final training.
"""
from __future__ import annotations

MAX_FACTOR = 8  # a final training has at most this many times train.epochs
MIN_FACTOR = 2  # and at least this many, else it is not worth a worker
MARGIN = 0.8  # of the time left: a final training that runs past the deadline is cancelled and lost
START_SECONDS = 1.0  # a task's own start, besides its epochs (the data is on the device already)


class Finals:
    """Which evaluation to train again, and for how many epochs, once the final share of the budget has come."""

    def __init__(self, share: float, budget_seconds: float, deadline: float | None, epochs: int, workers: int):
        self.start = deadline - share * budget_seconds if share and deadline is not None else None
        self.deadline, self.epochs, self.workers = deadline, epochs, workers
        self.records: dict[int, dict] = {}  # the best evaluations (run.keep_models of them): what a final needs
        self.repeated: set[int] = set()  # evaluations trained again
        self.finals: set[int] = set()  # ids of the final trainings, this job's and earlier jobs' of the run

    @property
    def issued(self) -> int:
        return len(self.finals)

    def due(self, now: float) -> bool:
        return self.start is not None and now >= self.start

    def learn(self, record: dict, best: set[int]) -> None:
        """Take in a finished evaluation; `best` is the ids of the best ones now (the rest are forgotten)."""
        if record.get("origin") == "final":
            self.started(record.get("parents") or (), record["id"])
        elif record["id"] in best:
            self.records[record["id"]] = record
        for i in [i for i in self.records if i not in best]:
            del self.records[i]

    def pick(self, top: list[tuple[float, int]], now: float) -> tuple[dict, int] | None:
        """(record, epochs) of the best evaluation in `top` ((-fitness, id), best first) not trained again yet whose
        final training fits in the time left; None when none does, or every worker has had one."""
        if not self.due(now) or self.issued >= self.workers:
            return None
        left = MARGIN * (self.deadline - now) - START_SECONDS
        for _, i in top:
            record = self.records.get(i)
            if record is None or i in self.repeated:
                continue
            metrics = record.get("metrics") or {}
            seconds, epochs = metrics.get("train_seconds"), metrics.get("epochs")
            if not (isinstance(seconds, (int, float)) and seconds > 0 and isinstance(epochs, int) and epochs > 0):
                continue
            fit = min(int(left / (seconds / epochs)), MAX_FACTOR * self.epochs)
            if fit >= MIN_FACTOR * self.epochs:
                return record, fit
        return None

    def started(self, repeats: tuple[int, ...] | list[int], final: int) -> None:
        """Final training `final` (an id) repeats the evaluations `repeats`."""
        self.repeated.update(repeats)
        self.finals.add(final)
