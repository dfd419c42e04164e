"""The errors a user sees: one clear line, exit code 2, nothing written."""
from __future__ import annotations

from launch.protocol import EXIT_BAD_INPUT as EXIT_USAGE  # the exit code of a command and its ranks on bad input

__all__ = ["EXIT_USAGE", "UsageError"]


class UsageError(ValueError):
    """A bad argument, config or file: one clear line, exit code 2, nothing written."""
