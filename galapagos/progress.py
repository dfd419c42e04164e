"""What rank 0 shows while a run goes: a live bar on a terminal, plain log lines otherwise."""
from __future__ import annotations

import logging
import shutil
import sys
import time
from dataclasses import dataclass
from typing import TextIO

log = logging.getLogger("galapagos")


@dataclass
class Snapshot:
    done: int
    total: int | None  # evaluation budget, if any
    best: float | None
    busy: int
    workers: int
    failures: int
    elapsed: float
    remaining: float | None  # seconds of the time budget left, if any


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def line(s: Snapshot) -> str:
    done = f"{s.done}/{s.total}" if s.total else f"{s.done}"
    best = "-" if s.best is None else f"{s.best:.4g}"
    left = ""
    if s.remaining is not None:
        left = f" | {_clock(s.remaining)} left"
    elif s.total and s.done:
        left = f" | ~{_clock(s.elapsed / s.done * (s.total - s.done))} left"
    return (f"evals {done} | best {best} | busy {s.busy}/{s.workers} | failed {s.failures}"
            f" | {_clock(s.elapsed)} elapsed{left}")


class ProgressView:
    """Redraws one status line on a terminal; elsewhere logs it every `every` seconds."""

    def __init__(self, stream: TextIO | None = None, every: float = 30.0, live: bool | None = None):
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.every, self.last, self.drawn = every, 0.0, False

    def show(self, s: Snapshot, force: bool = False) -> None:
        now = time.time()
        text = line(s)
        if self.live:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            if s.total:
                bar = 20
                filled = int(bar * min(1.0, s.done / s.total))
                text = f"[{'#' * filled}{'.' * (bar - filled)}] " + text
            self.stream.write("\r" + text[:width].ljust(width))
            self.stream.flush()
            self.drawn = True
        elif force or now - self.last >= self.every:
            log.info("%s", text)
            self.last = now

    def message(self, text: str, level: int = logging.WARNING) -> None:
        """A log line that does not tear the live bar."""
        self.clear()
        log.log(level, "%s", text)

    def clear(self) -> None:
        if self.live and self.drawn:
            self.stream.write("\r" + " " * (shutil.get_terminal_size((100, 20)).columns - 1) + "\r")
            self.stream.flush()
            self.drawn = False
