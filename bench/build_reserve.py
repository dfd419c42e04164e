"""The final ensemble's build against the time the search left it (galapagos/flows/evolution_source.py's
build_seconds), on kept runs of `galapagos evolve` with `run.final_ensemble` (bench/search.py's `--keep DIR`).

    python -m bench.build_reserve DIR/*-evolution-ensemble-*

For each run: the build's measured seconds (summary.json), the estimate made from the run's own journal as rank 0
makes it at the search's end (the best `run.keep_models` evaluations' training seconds per epoch, the data's split
sizes), and the build over the estimate. A ratio above 1 is a build that ran past the run's time budget; the
estimate is sized so that none does. Runs from before the search left the time (no `build_reserve` in their
summary.json) are estimated the same way.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

from galapagos.config import load_config
from galapagos.flows.evolution import build_share
from galapagos.flows.evolution_source import build_seconds
from galapagos.store.rundir import RunDir


def measure(path: Path) -> dict:
    """One run's build seconds, its estimate and their ratio."""
    run = RunDir(path)
    if not run.summary.is_file():
        raise SystemExit(f"{path}: no summary.json (not the directory of a finished `galapagos evolve` run)")
    summary = json.loads(run.summary.read_text())
    final = summary.get("final_ensemble")
    if not final or "seconds" not in final:
        raise SystemExit(f"{path}: summary.json has no final ensemble's build")
    config = load_config(run.config)
    datasets = json.loads(run.data.read_text())["datasets"]
    splits = {name.split("/")[0]: shape[0] for name, (shape, _) in datasets.items() if name.endswith("/x")}
    ok = sorted((r for r in run.read_journal() if r.status == "ok" and r.fitness is not None),
                key=lambda r: (-r.fitness, r.id))
    estimate = build_seconds(ok[:config.run.keep_models], build_share(config, SimpleNamespace(splits=splits)))
    return {"run": path.name, "kept": min(len(ok), config.run.keep_models), "build_s": final["seconds"],
            "reserved_s": summary.get("build_reserve"), "estimate_s": round(estimate, 1),
            "ratio": round(final["seconds"] / estimate, 2)}


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(prog="python -m bench.build_reserve", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="run directories of `galapagos evolve` with a final ensemble")
    args = p.parse_args(argv)
    rows = [measure(path) for path in args.runs]
    print("| run | kept | build (s) | reserved (s) | estimate (s) | build / estimate |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['kept']} | {r['build_s']} | {r['reserved_s'] if r['reserved_s'] is not None else '-'}"
              f" | {r['estimate_s']} | {r['ratio']} |")
    over = [r for r in rows if r["ratio"] > 1]
    print(f"\n{len(rows)} build(s): build / estimate {min(r['ratio'] for r in rows)}-{max(r['ratio'] for r in rows)}; "
          f"{len(over)} past the estimate")
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
