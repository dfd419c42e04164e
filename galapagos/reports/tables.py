"""A run's journal (results.jsonl) as a flat table: one row per evaluation (or ensemble member), one column per
field, the metrics spread into columns of their own; for CSV files, spreadsheets and pandas."""
from __future__ import annotations

import csv
from pathlib import Path

from galapagos.errors import RunDirError
from galapagos.evolve.genome import Genome
from galapagos.store.rundir import JournalDir

FIRST = ("id", "name", "status", "fitness", "params", "seconds", "epochs", "origin", "parents", "rank", "host")
SKIP = ("curve", "genome", "metrics", "error", "describe")


def rows(path: str | Path) -> list[dict]:
    """Every record of the journal in `path` (a run or ensemble directory), flattened."""
    run = JournalDir(path)
    if not run.journal.exists():
        raise RunDirError(f"{path}: no {run.journal.name} (not a run or ensemble directory)")
    out = []
    for r in run.read_journal():
        row = {k: v for k, v in r.to_dict().items() if k not in SKIP and not isinstance(v, (dict, list))}
        row["parents"] = ";".join(map(str, r.parents or []))
        row["seconds"] = round(r.end - r.start, 3) if r.end and r.start else None
        row["epochs"] = len(r.curve or [])
        row["genome"] = Genome.from_json(r.genome).describe() if r.genome else None
        row["error"] = r.error.strip().splitlines()[-1] if r.error else None
        row.update({f"metric_{k}": v for k, v in (r.metrics or {}).items()
                    if isinstance(v, (int, float, str)) or v is None})
        out.append(row)
    return out


def columns(table: list[dict]) -> list[str]:
    seen = list(dict.fromkeys(k for row in table for k in row))
    first = [k for k in FIRST if k in seen]
    metrics = sorted(k for k in seen if k.startswith("metric_"))
    return first + sorted(set(seen) - set(first) - set(metrics)) + metrics


def write_csv(path: str | Path, out: str | Path) -> int:
    """The flat table of `path`'s journal as a CSV file; returns the number of rows."""
    table = rows(path)
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns(table), restval="")
        writer.writeheader()
        writer.writerows(table)
    return len(table)


def frame(path: str | Path):
    """The flat table as a pandas DataFrame (pandas must be installed)."""
    try:
        import pandas as pd
    except ImportError:
        raise RunDirError("a DataFrame needs pandas (pip install pandas); galapagos.api.results(..., as_frame=False) "
                          "gives the same rows as dicts") from None
    table = rows(path)
    return pd.DataFrame(table, columns=columns(table))
