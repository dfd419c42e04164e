"""What a run shows while it goes.

Rank 0 makes a Snapshot about once a second. Where the user's terminal is, a live bar (tqdm) is drawn from it: by
the process the user started, which runs the job under mpiexec and reads rank 0's snapshots from a file
(GALAPAGOS_PROGRESS_FILE), printing the ranks' own output above the bar. Without a terminal (a batch job, a pipe)
rank 0 logs a plain line per finished task, at most every `every` seconds otherwise.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

log = logging.getLogger("galapagos")

PROGRESS_FILE = "GALAPAGOS_PROGRESS_FILE"  # set by the starting process: where rank 0 leaves its snapshots
STATUS_ORDER = ("ok", "pruned", "failed", "timeout", "crashed", "lost")


@dataclass
class Snapshot:
    done: int
    total: int | None  # evaluation budget, if any
    best: float | None
    busy: int  # workers with a task
    workers: int
    elapsed: float
    remaining: float | None  # seconds of the time budget left, if any
    by_status: dict[str, int] = field(default_factory=dict)  # finished tasks by status
    rate: float = 0.0  # tasks finished per minute by this job


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def counts(s: Snapshot) -> str:
    order = [k for k in STATUS_ORDER if k in s.by_status] + sorted(set(s.by_status) - set(STATUS_ORDER))
    return " ".join(f"{k} {s.by_status[k]}" for k in order) or "none finished"


def time_left(s: Snapshot) -> str:
    if s.remaining is not None:
        return f"{_clock(s.remaining)} left"
    if s.total and s.rate > 0:
        return f"~{_clock(60 * (s.total - s.done) / s.rate)} left"
    return ""


def line(s: Snapshot) -> str:
    done = f"{s.done}/{s.total}" if s.total else f"{s.done}"
    best = "-" if s.best is None else f"{s.best:.4g}"
    left = f" | {time_left(s)}" if time_left(s) else ""
    return (f"evals {done} | {counts(s)} | best {best} | {s.rate:.1f}/min | busy {s.busy}/{s.workers}"
            f" | {_clock(s.elapsed)} elapsed{left}")


# Seconds between redraws of the bar that new results force: at thousands of results a second, a snapshot file
# per result would cost the master more than a terminal can show (bench/scale.py).
MIN_REDRAW = 0.1


class ProgressView:
    """Rank 0's side: snapshots to the starting process's file when it draws the bar, else log lines."""

    def __init__(self, every: float = 30.0, relay: str | None = None):
        self.relay = Path(relay) if relay else (Path(os.environ[PROGRESS_FILE]) if PROGRESS_FILE in os.environ
                                                 else None)
        self.every, self.last = every, 0.0

    def due(self, force: bool = False) -> bool:
        """Whether show() would show a snapshot now: the master asks before making one, at every event."""
        elapsed = time.time() - self.last
        if self.relay is not None:
            return elapsed >= (MIN_REDRAW if force else 0.5)
        return log.isEnabledFor(logging.INFO) and (force or elapsed >= self.every)

    def show(self, s: Snapshot, force: bool = False, final: bool = False) -> None:
        """Show `s` if due (`force`: a new result; `final`: the run's last snapshot, always shown)."""
        if not (final or self.due(force)):
            return
        if self.relay is not None:
            tmp = self.relay.with_name(self.relay.name + ".tmp")
            try:
                tmp.write_text(json.dumps(asdict(s)))
                os.replace(tmp, self.relay)
            except OSError:  # the starting process is gone: nobody to draw for
                self.relay = None
        else:
            log.info("%s", line(s))
        self.last = time.time()

    def message(self, text: str, level: int = logging.WARNING) -> None:
        log.log(level, "%s", text)


class ProgressBar:
    """The starting process's side: a tqdm bar on its terminal, redrawn from rank 0's latest snapshot; the ranks'
    output lines are printed above it (write)."""

    def __init__(self, path: Path, stream: TextIO | None = None):
        self.path, self.stream, self.bar, self.seen = path, stream or sys.stderr, None, 0.0

    def refresh(self) -> None:
        try:
            mtime = self.path.stat().st_mtime
            if mtime == self.seen:
                return
            s = Snapshot(**json.loads(self.path.read_text()))
            self.seen = mtime
        except (OSError, ValueError, TypeError):
            return
        if self.bar is None:
            from tqdm import tqdm

            # The window's size as the terminal reports it (a fallback where it reports none, which tqdm reads as
            # "no room" and draws nothing).
            self.bar = tqdm(total=s.total, file=self.stream, unit="eval", nrows=self._window().lines,
                            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} {postfix}" if s.total else
                            "{desc}{n_fmt} evals {postfix}")
        self.bar.ncols = self._window().columns
        self.bar.n = s.done
        best = "-" if s.best is None else f"{s.best:.4g}"
        left = time_left(s)
        self.bar.set_postfix_str(f"{counts(s)} | best {best} | {s.rate:.1f}/min | busy {s.busy}/{s.workers} | "
                                 f"{_clock(s.elapsed)}" + (f" | {left}" if left else ""), refresh=False)
        self.bar.refresh()

    def _window(self) -> os.terminal_size:
        try:
            size = os.get_terminal_size(self.stream.fileno())
        except (AttributeError, OSError, ValueError):
            size = os.terminal_size((0, 0))
        return os.terminal_size((size.columns or 120, size.lines or 24))

    def write(self, text: str) -> None:
        if self.bar is None:
            self.stream.write(text)
            self.stream.flush()
        else:
            self.bar.write(text.rstrip("\n"), file=self.stream)

    def close(self) -> None:
        if self.bar is not None:
            self.refresh()
            self.bar.close()
