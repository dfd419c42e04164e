"""The errors a user sees: one clear line, exit code 2, nothing written."""
from __future__ import annotations

EXIT_USAGE = 2  # the exit code of a command (and of every rank of its job) for bad input


class UsageError(ValueError):
    """A bad argument, config or file: one clear line, exit code 2, nothing written."""
