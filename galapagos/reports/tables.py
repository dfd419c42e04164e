"""A run's journal (results.jsonl) as a flat table: one row per evaluation (or ensemble member), one column per
field, the genome's parameters (`params_<name>`) and the metrics (`metric_<name>`) spread into columns of their own,
start and end as ISO-8601 UTC times; for CSV files, spreadsheets and pandas."""
from __future__ import annotations

import csv
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from galapagos.errors import RunDirError
from galapagos.evolve.genome import GENE_FIELDS, Genome
from galapagos.store.rundir import JournalDir

FIRST = ("id", "name", "status", "fitness", "params", "seconds", "epochs", "start", "end", "origin", "parents",
         "rung", "rank", "host")
SKIP = ("curve", "genome", "metrics", "error", "describe")
# A genome's layers are a list of any length: the table gives what can be compared across genomes of different
# lengths (how many layers of each type, the widest, the largest kernel, the highest dropout rate).
WIDEST = (("channels", ("conv", "residual")), ("units", ("dense",)), ("kernel", ("conv", "residual")),
          ("dropout", ("dropout",)))


def iso(seconds: float | None) -> str | None:
    """Seconds since the epoch as an ISO-8601 UTC time ("2026-11-27T02:14:24.123Z")."""
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def genome_params(genome: Mapping | Genome | None) -> dict[str, Any]:
    """A genome's parameters as plain values, one per column: the training genes (optimizer, lr, batch_size,
    weight_decay, head, and loss where a segmentation genome has one), the number of layers in all and of each
    type, and the widest conv/residual channels, dense units, largest kernel and highest dropout rate (None where a
    genome has no such layer)."""
    if genome is None:
        return {}
    g = Genome.from_json(genome)
    out: dict[str, Any] = {"optimizer": g.optimizer, "lr": g.lr, "batch_size": g.batch_size,
                           "weight_decay": g.weight_decay, "head": g.head}
    if g.loss != "ce":
        out["loss"] = g.loss
    out["layers"] = len(g.layers)
    for kind in GENE_FIELDS:
        out[f"{kind}_layers"] = sum(gene.type == kind for gene in g.layers)
    for name, kinds in WIDEST:
        field = "rate" if name == "dropout" else name
        values = [gene[field] for gene in g.layers if gene.type in kinds]
        out[f"max_{name}"] = max(values) if values else None
    return out


def row(r) -> dict:
    """One journal record (JournalRecord) flattened."""
    out = {k: v for k, v in r.to_dict().items() if k not in SKIP and not isinstance(v, (dict, list))}
    out["parents"] = ";".join(map(str, r.parents or []))
    out["seconds"] = round(r.end - r.start, 3) if r.end and r.start else None
    out["start"], out["end"] = iso(r.start), iso(r.end)
    out["epochs"] = len(r.curve or [])
    out["genome"] = Genome.from_json(r.genome).describe() if r.genome else None
    out["error"] = r.error.strip().splitlines()[-1] if r.error else None
    out.update({f"params_{k}": v for k, v in genome_params(r.genome).items()})
    out.update({f"metric_{k}": v for k, v in (r.metrics or {}).items()
                if isinstance(v, (int, float, str)) or v is None})
    return out


def rows(path: str | Path) -> list[dict]:
    """Every record of the journal in `path` (a run or ensemble directory), flattened."""
    run = JournalDir(path)
    if not run.journal.exists():
        raise RunDirError(f"{path}: no {run.journal.name} (not a run or ensemble directory)")
    return [row(r) for r in run.read_journal()]


def columns(table: list[dict]) -> list[str]:
    """The columns in order: the record's own fields, the rest, then params_* (in genome order) and metric_*."""
    seen = list(dict.fromkeys(k for row in table for k in row))
    first = [k for k in FIRST if k in seen]
    params = [k for k in seen if k.startswith("params_")]
    metrics = sorted(k for k in seen if k.startswith("metric_"))
    return first + sorted(set(seen) - set(first) - set(params) - set(metrics)) + params + metrics


def write_csv(path: str | Path, out: str | Path) -> int:
    """The flat table of `path`'s journal as a CSV file; returns the number of rows."""
    table = rows(path)
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns(table), restval="")
        writer.writeheader()
        writer.writerows(table)
    return len(table)


def frame(path: str | Path):
    """The flat table as a pandas DataFrame (pandas must be installed: pip install galapagos-nas[pandas]); start
    and end stay ISO-8601 strings, as in the CSV (pd.to_datetime(df.end) makes them times)."""
    try:
        import pandas as pd
    except ImportError:
        raise RunDirError("a DataFrame needs pandas (pip install galapagos-nas[pandas], or pip install pandas); "
                          "galapagos.api.results(..., as_frame=False) gives the same rows as dicts") from None
    table = rows(path)
    return pd.DataFrame(table, columns=columns(table))
