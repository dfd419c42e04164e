"""Warm start (`--seed-from`): the genomes a new run's population starts from, from an earlier run or a file."""
from __future__ import annotations

import json
from pathlib import Path

from galapagos.errors import UsageError
from galapagos.evolve.errors import InvalidGenome
from galapagos.evolve.genome import Genome
from galapagos.store.rundir import RunDir


def seed_genomes(source: str, limit: int) -> list[Genome]:
    """Warm start genomes: the best `limit` distinct genomes of a run directory, or a JSON file of genomes (a list,
    {"genomes": [...]}, or one genome such as a best/genome.json)."""
    path, run = Path(source), RunDir(source)
    if run.journal.exists():
        ranked = sorted((r for r in run.read_journal() if r.status == "ok" and r.fitness is not None),
                        key=lambda r: r.fitness, reverse=True)
        keys, raw = set(), []
        for r in ranked:
            if r.key not in keys and len(raw) < limit:
                keys.add(r.key)
                raw.append(r.genome)
        if not raw:
            raise UsageError(f"--seed-from {source}: the run has no successful evaluation to start from")
    elif path.is_file():
        try:
            loaded = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise UsageError(f"--seed-from {source}: not a JSON file of genomes: {exc}") from None
        raw = loaded.get("genomes", [loaded]) if isinstance(loaded, dict) else loaded
        if not isinstance(raw, list) or not raw:
            raise UsageError(f"--seed-from {source}: expected a list of genomes, {{\"genomes\": [...]}} or one genome")
    else:
        raise UsageError(f"--seed-from {source}: no such run directory ({run.journal.name}) or JSON file")
    genomes = []
    for i, g in enumerate(raw):
        try:
            genomes.append(Genome.from_json(g))
        except (InvalidGenome, TypeError, ValueError) as exc:
            raise UsageError(f"--seed-from {source}: genome {i}: {exc}") from None
    return genomes
