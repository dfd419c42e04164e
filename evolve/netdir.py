"""A saved network on disk: the one format for a run's best/, an ensemble's members/NAME/ and `predict --model`.

```
DIR/genome.json    the genome (evolve.genome.Genome.to_json)
DIR/model.pt       the trained weights, a torch state_dict
DIR/metrics.json   {"problem": Problem.to_dict(), "fitness", "metrics", "params", "builder" (if a user's), ...}
```
"""
from __future__ import annotations

import json
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from galapagos.evolve.files import replace_atomically, write_json
from galapagos.evolve.genome import Genome
from galapagos.evolve.problem import Problem

GENOME, MODEL, METRICS = "genome.json", "model.pt", "metrics.json"
FILES = (GENOME, MODEL, METRICS)

if TYPE_CHECKING:
    import torch


class ModelError(ValueError):
    """A network directory that is missing a file or cannot be read; the message names the file."""


@dataclass(frozen=True)
class NetworkDir:
    path: Path

    def __init__(self, path: str | Path):
        object.__setattr__(self, "path", Path(path))

    @property
    def genome_file(self) -> Path:
        return self.path / GENOME

    @property
    def model_file(self) -> Path:
        return self.path / MODEL

    @property
    def metrics_file(self) -> Path:
        return self.path / METRICS

    def missing(self) -> Path | None:
        """The first of the three files that is not there, or None."""
        return next((self.path / f for f in FILES if not (self.path / f).is_file()), None)

    def complete(self) -> bool:
        return self.missing() is None

    def write(self, genome: dict | Genome, metrics: dict, *, weights_from: str | Path | None = None) -> None:
        """Save genome (its JSON dict, or the Genome) and metrics (with "problem" inside) and, when given, copy the
        weights from a file; each file is replaced atomically."""
        self.path.mkdir(parents=True, exist_ok=True)
        if weights_from is not None:
            replace_atomically(self.model_file, lambda tmp: shutil.copyfile(weights_from, tmp))
        write_json(self.genome_file, genome.to_json() if isinstance(genome, Genome) else genome)
        write_json(self.metrics_file, metrics)

    def problem(self) -> Problem:
        try:
            return Problem.from_dict(json.loads(self.metrics_file.read_text())["problem"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelError(f"{self.path}: unreadable {METRICS}: {exc}") from None

    def load(self, device: str = "cpu") -> tuple[torch.nn.Module, Genome, Problem]:
        """The network with its weights, in eval mode on `device`, with its genome and problem."""
        import torch  # here, not at the top: rank 0 writes network directories without torch

        from galapagos.evolve.build import build_model

        if (missing := self.missing()) is not None:
            raise ModelError(f"{missing} is missing")
        try:
            genome = Genome.from_json(json.loads(self.genome_file.read_text()))
        except ValueError as exc:
            raise ModelError(f"{self.path}: unreadable {GENOME}: {exc}") from None
        problem = self.problem()
        try:
            model = build_model(genome, problem, builder=json.loads(self.metrics_file.read_text()).get("builder", ""))
        except (ImportError, AttributeError, ValueError) as exc:
            raise ModelError(f"{self.path}: the network's builder in {METRICS} cannot be used here: {exc}") from None
        try:
            with warnings.catch_warnings():  # torch warns about what it finds in a damaged file before it fails
                warnings.simplefilter("ignore")
                state = torch.load(self.model_file, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - a damaged file fails deep inside the unpickler, in any way
            # Not torch's own advice (load with weights_only=False): nothing here should unpickle arbitrary objects.
            raise ModelError(f"{self.path}: {MODEL} is unreadable: not a state_dict saved by torch.save "
                             f"({type(exc).__name__}); it may be truncated or corrupt") from None
        try:
            model.load_state_dict(state)
        except (RuntimeError, TypeError, AttributeError) as exc:
            raise ModelError(f"{self.path}: {MODEL} does not fit the genome in {GENOME}: "
                             f"{str(exc).splitlines()[0]}") from None
        return model.to(device).eval(), genome, problem


def save_weights(state: dict, path: str | Path) -> None:
    """A state_dict to `path`, atomically (a trainer saving a candidate's best epoch). Written through a Python file
    object, not a path: a write the disk refuses then raises its OSError (ENOSPC, EDQUOT, EROFS), which tells a full
    disk from a failed candidate; torch's own writer loses the errno ("inline_container.cc ... unexpected pos")."""
    import torch

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            torch.save(state, f)

    replace_atomically(path, write)
