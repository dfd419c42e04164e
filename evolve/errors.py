"""Errors raised by the search: bad configuration versus genomes that cannot become a network."""

from __future__ import annotations

__all__ = ["ConfigError", "InvalidGenome", "SearchExhausted"]


class ConfigError(ValueError):
    """A configuration value is wrong; the message starts with the dotted key (e.g. ``space.channels``)."""


class InvalidGenome(ValueError):
    """A genome is malformed, or cannot be built into a network for the problem at hand."""


class SearchExhausted(RuntimeError):
    """The engine could not find a genome it has not proposed before: the search space is (nearly) used up."""
