"""Evolution against its baseline, random search: same space, same evaluation budget, same seeds.

    python -m bench.search --seeds 0 1 2 --evaluations 40 --workers 2

Runs `galapagos evolve` on the bundled shapes classification example once per (seed, strategy) and reports the
best validation accuracy of each, and how often evolution's best is at least random search's.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from examples import shapes


def run(data: Path, out: Path, strategy: str, seed: int, evaluations: int, workers: int, config: str) -> dict:
    cmd = [sys.executable, "-m", "galapagos.cli", "evolve", "--data", str(data), "--out", str(out),
           "--config", config, "--evaluations", str(evaluations), "--workers", str(workers), "--strategy", strategy,
           "--set", f"run.seed={seed}", "--set", f"evolution.seed={seed}"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads((out / "summary.json").read_text())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--evaluations", type=int, default=40)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--config", default="examples/demo.toml")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "shapes.h5"
        shapes.generate(data)
        for seed in args.seeds:
            row = {"seed": seed}
            for strategy in ("evolution", "random"):
                s = run(data, Path(tmp) / f"{strategy}-{seed}", strategy, seed, args.evaluations, args.workers,
                        args.config)
                row[strategy] = s["best"]["fitness"] if s["best"] else None
                row[f"{strategy}_minutes"] = round(s["wall_seconds"] / 60, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    wins = sum(r["evolution"] >= r["random"] for r in rows)
    print(json.dumps({"evaluations": args.evaluations, "seeds": len(rows),
                      "evolution_mean": round(statistics.mean(r["evolution"] for r in rows), 4),
                      "random_mean": round(statistics.mean(r["random"] for r in rows), 4),
                      "evolution_at_least_random": f"{wins}/{len(rows)}"}))


if __name__ == "__main__":
    main()
