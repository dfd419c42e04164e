"""An ensemble directory on disk: the contract between `galapagos ensemble` (writes) and `predict` (reads). Every
path inside it is :class:`EnsembleDir`'s.

```
DIR/ensemble.json           format, problem, members (name, weight, seed, origin, status), selection, sources
DIR/plan.json               the members to train (MemberSpec), for --resume
DIR/members/<name>/         a network directory (evolve/netdir.py), as a run's best/
DIR/results.jsonl           one line per member training (failed ones too), as a run's journal (store/journal.py)
DIR/metrics.json            ensemble and per-member metrics on val (and test when the file has one)
DIR/config.toml, DIR/log/   the resolved config and the logs, as a run's
```

Weights are the selection's (they sum to 1 over the members used); a trained member that selection did not
pick stays on disk with weight 0 and is not used for prediction.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from galapagos.evolve.files import write_json
from galapagos.evolve.netdir import NetworkDir
from galapagos.evolve.problem import Problem
from galapagos.store.rundir import JournalDir

FORMAT = 1
MANIFEST = "ensemble.json"


class EnsembleError(ValueError):
    """A missing or malformed ensemble directory."""


class EnsembleDir(JournalDir):
    """One ensemble directory's files; its journal, config and logs are kept as a run's (JournalDir)."""

    def __init__(self, path: str | Path):
        super().__init__(path)
        self.manifest = self.path / MANIFEST
        self.plan = self.path / "plan.json"
        self.members = self.path / "members"
        self.metrics = self.path / "metrics.json"

    def member(self, name: str) -> Path:
        """A member's network directory."""
        return self.members / name


@dataclass(frozen=True)
class Member:
    name: str  # directory under members/
    weight: float  # selection weight; 0 = trained but not picked
    seed: int = 0
    origin: dict = field(default_factory=dict)  # e.g. {"run": ..., "id": 12, "kind": "distinct"|"reseed"}
    status: str = "ok"


@dataclass(frozen=True)
class Manifest:
    problem: Problem
    members: tuple[Member, ...]
    selection: dict = field(default_factory=dict)  # method, metric, rounds, val scores
    sources: dict = field(default_factory=dict)  # run and data it was built from

    @property
    def used(self) -> tuple[Member, ...]:
        """The members prediction averages: weight > 0."""
        return tuple(m for m in self.members if m.weight > 0)


def is_ensemble(path: str | Path) -> bool:
    return EnsembleDir(path).manifest.is_file()


def save_manifest(root: str | Path, manifest: Manifest) -> Path:
    """Write ensemble.json atomically (a reader never sees half a file)."""
    path = EnsembleDir(root).manifest
    doc = {"format": FORMAT, "problem": manifest.problem.to_dict(),
           "members": [asdict(m) for m in manifest.members], "selection": manifest.selection,
           "sources": manifest.sources}
    write_json(path, doc)
    return path


def load_manifest(root: str | Path) -> Manifest:
    """Read and check ensemble.json: every used member's files exist and the weights sum to 1."""
    ensemble = EnsembleDir(root)
    path = ensemble.manifest
    if not path.is_file():
        raise EnsembleError(f"{root}: no {MANIFEST} (not an ensemble directory)")
    try:
        doc: dict[str, Any] = json.loads(path.read_text())
        if doc.get("format") != FORMAT:
            raise EnsembleError(f"{path}: format {doc.get('format')!r}, expected {FORMAT}")
        members = tuple(Member(**m) for m in doc["members"])
        manifest = Manifest(Problem.from_dict(doc["problem"]), members, doc.get("selection", {}),
                            doc.get("sources", {}))
    except EnsembleError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise EnsembleError(f"{path}: malformed: {exc}") from None
    if not manifest.used:
        raise EnsembleError(f"{path}: no member has a positive weight")
    total = sum(m.weight for m in manifest.used)
    if abs(total - 1.0) > 1e-6:
        raise EnsembleError(f"{path}: member weights sum to {total:g}, expected 1")
    for m in manifest.used:
        if (missing := NetworkDir(ensemble.member(m.name)).missing()) is not None:
            raise EnsembleError(f"{path}: member {m.name}: {missing} is missing")
    return manifest
