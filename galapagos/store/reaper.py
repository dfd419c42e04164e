"""Files deleted off rank 0's path: a thread that unlinks what it is given, in order.

A run drops the weights of every evaluation that leaves the kept set (run.keep_models, the population): at
whole-machine scale hundreds a second. On a parallel file system an unlink is a round trip to its metadata server, a
millisecond or more under load, which rank 0 would wait for once per task; the thread waits instead (the call
releases the GIL). A run killed before the thread got to a file leaves it behind, and the next job's start deletes it
(RunDir.prune_models)."""
from __future__ import annotations

import logging
import os
import queue
import threading

log = logging.getLogger(__name__)


class Reaper:
    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def delete(self, path: str) -> None:
        """`path` deleted soon (already gone is fine)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="galapagos-reaper", daemon=True)
            self._thread.start()
        self._queue.put(path)

    def wait(self) -> None:
        """Every file given so far deleted (the thread ends; a later delete starts another)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while (path := self._queue.get()) is not None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as exc:  # left for the next start's prune (RunDir.prune_models)
                log.warning("could not delete %s: %s", path, exc)
