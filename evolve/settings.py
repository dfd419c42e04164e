"""One validation style for every table of the TOML config, with errors that name the key.

A table is a frozen dataclass that subclasses `Table` and names its `section`. The default of each field gives its
type (ints are accepted where floats are expected, lists become tuples where the default is a tuple); `choices`
names the values a field may take; `checks()` says what else must hold, as (key, ok, expected) triples; and
`normalise()` turns a shorthand into the canonical form first. `Table(...)` and `Table.from_dict(toml_table)`
validate alike: `train.epochs: expected at least 1, got 0`.
"""
from __future__ import annotations

import importlib
from dataclasses import MISSING, Field, fields
from typing import Any, ClassVar, Iterable, Mapping, TypeVar

from galapagos.evolve.errors import ConfigError

__all__ = ["Check", "Table", "is_int"]

T = TypeVar("T", bound="Table")

#: (key, ok, expected): when ok is false, `section.key: expected <expected>, got <value as given>`.
Check = tuple[str, bool, str]

_TYPE_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", tuple: "a list"}


def is_int(x: Any) -> bool:
    """An int that is not a bool (TOML and JSON keep them apart; Python does not)."""
    return isinstance(x, int) and not isinstance(x, bool)


class Table:
    """Base of the config tables: from_dict, to_dict and the one place a table's values are checked."""

    section: ClassVar[str] = ""
    #: key -> the values allowed: for a tuple field, each entry must be one of them (and there must be one).
    choices: ClassVar[Mapping[str, tuple[str, ...]]] = {}

    def normalise(self) -> dict[str, Any]:
        """Values that replace the given ones before they are checked (a shorthand's canonical form)."""
        return {}

    def checks(self) -> Iterable[Check]:
        """What must hold beyond the types and the choices; runs on values of the right type."""
        return ()

    def __post_init__(self) -> None:
        given = {f.name: getattr(self, f.name) for f in fields(self)}
        for key, value in self.normalise().items():
            object.__setattr__(self, key, value)
        for f in fields(self):
            object.__setattr__(self, f.name, self._typed(f, given[f.name]))
        for key, allowed in self.choices.items():
            self._check_choice(key, allowed, given[key])
        for key, ok, expected in self.checks():
            if not ok:
                raise ConfigError(f"{self.section}.{key}: expected {expected}, got {given[key]!r}")

    def _typed(self, f: Field, given: Any) -> Any:
        value, default = getattr(self, f.name), f.default
        if default is MISSING or default is None:
            return value
        want = bool if isinstance(default, bool) else type(default)
        if want is float and is_int(value):
            value = float(value)
        if want is tuple and isinstance(value, list):
            value = tuple(value)
        if want is tuple and isinstance(value, tuple) and default and all(isinstance(d, float) for d in default):
            value = tuple(float(v) if is_int(v) else v for v in value)
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            raise ConfigError(f"{self.section}.{f.name}: expected {_TYPE_NAMES.get(want, want.__name__)}, "
                              f"got {given!r}")
        return value

    def _check_choice(self, key: str, allowed: tuple[str, ...], given: Any) -> None:
        value, names = getattr(self, key), ", ".join(allowed)
        if not isinstance(value, tuple):
            if value not in allowed:
                raise ConfigError(f"{self.section}.{key}: expected one of {names}, got {given!r}")
        elif not value:
            raise ConfigError(f"{self.section}.{key}: expected a non-empty list of {names}, got {given!r}")
        elif bad := [v for v in value if v not in allowed]:
            raise ConfigError(f"{self.section}.{key}: unknown value {bad[0]!r} (expected a non-empty list of {names})")

    @classmethod
    def from_dict(cls: type[T], table: Mapping[str, Any] | None) -> T:
        """Build from the TOML table; unknown keys and bad values are ConfigErrors naming `section.key`."""
        if table is None:
            table = {}
        if not isinstance(table, Mapping):
            raise ConfigError(f"{cls.section}: expected a table, got {table!r}")
        known = [f.name for f in fields(cls)]
        for key in table:
            if key not in known:
                raise ConfigError(f"{cls.section}.{key}: unknown key (known: {', '.join(known)})")
        return cls(**table)

    def to_dict(self) -> dict[str, Any]:
        """Plain TOML/JSON types (lists, not tuples)."""
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v for f in fields(self)}


def load_function(spec: str, key: str = "function") -> Any:
    """A config value naming a function, 'package.module:function' (run.task, train.builder) -> the function."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"{key} {spec!r}: expected 'module:function'")
    return getattr(importlib.import_module(module), name)
