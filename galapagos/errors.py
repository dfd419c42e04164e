"""The errors a user sees: one clear line, nothing written (their exit codes: galapagos/launch/protocol.py)."""
from __future__ import annotations

__all__ = ["NoResult", "RunDirError", "UsageError"]


class UsageError(ValueError):
    """A bad argument, config or file: one clear line, exit code 2, nothing written."""


class RunDirError(ValueError):
    """A run or ensemble directory that cannot hold this run, or that another live run holds."""


class NoResult(Exception):
    """The run is over and no evaluation succeeded (every candidate failed, was rejected, or none finished): there
    is no best network. `master` raises it after writing summary.json; `summary` is what it would have returned
    (with "best_dir": None). The command prints the one line str() gives and exits with
    EXIT_NO_RESULT (launch/protocol.py)."""

    def __init__(self, summary: dict):
        super().__init__(summary)
        self.summary = summary

    def __str__(self) -> str:
        s = self.summary
        counts = ", ".join(f"{k} {v}" for k, v in sorted(s["by_status"].items())) or "none finished"
        why = f"; {s['ended_early']}" if s.get("ended_early") else ""
        return (f"no evaluation of {s['run']} succeeded ({s['evaluations']} evaluation(s): {counts}{why}), so there "
                "is no best network; see its journal and log/")
