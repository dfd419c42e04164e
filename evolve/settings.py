"""Config tables -> frozen dataclasses, with errors that name the key (`train.epochs: expected int, got 'x'`)."""
from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any, TypeVar

from evolve.errors import ConfigError

T = TypeVar("T")


def _expected_type(default: Any) -> type:
    return bool if isinstance(default, bool) else type(default)


def from_table(cls: type[T], section: str, table: dict) -> T:
    """Build `cls` from a TOML table; unknown keys and values of the wrong type are ConfigErrors.

    The type of each field is the type of its default (ints are accepted where floats are expected).
    """
    if not isinstance(table, dict):
        raise ConfigError(f"{section}: expected a table, got {table!r}")
    known = {f.name: f for f in fields(cls)}
    values = {}
    for key, value in table.items():
        if key not in known:
            raise ConfigError(f"{section}.{key}: unknown key (known: {', '.join(known)})")
        default = known[key].default
        if default is not MISSING and default is not None:
            want = _expected_type(default)
            if want is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, want) or (want is int and isinstance(value, bool)):
                raise ConfigError(f"{section}.{key}: expected {want.__name__}, got {value!r}")
        values[key] = value
    return cls(**values)
