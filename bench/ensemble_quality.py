"""The ensemble against its best single member on the test split, on the bundled examples, over several seeds.

    python -m bench.ensemble_quality --seeds 0 1 2 --evaluations 12 --members 6 --workers 2

For each example (shapes: image classification; cosmoflow: 3D regression) and seed, runs `galapagos design`
(a short evolution, then an ensemble of `--members` members selected on val) and reports, on the test split, the
ensemble, its best single member (the member with the best validation score: the one a user would otherwise
keep) and the search's best network (best/). Classification: accuracy and NLL; regression: MSE (mean over the
targets, in the targets' units) and mean R^2.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from galapagos.examples import cosmoflow, shapes

EXAMPLES = {
    # name: (generator, generator arguments, config overrides that keep a run small on a few cores)
    "shapes": (shapes.generate, {"samples": 3000}, []),
    "cosmoflow": (cosmoflow.generate, {"samples": 800, "size": 12}, ["space.max_params=100000"]),
}


def design(data: Path, out: Path, seed: int, args: argparse.Namespace, sets: list[str]) -> dict:
    cmd = [sys.executable, "-m", "galapagos.cli", "design", "--data", str(data), "--out", str(out), "--config",
           args.config, "--evaluations", str(args.evaluations), "--members", str(args.members), "--workers",
           str(args.workers)]
    for s in [f"run.seed={seed}", f"evolution.seed={seed}", f"ensemble.seed={seed}", *sets]:
        cmd += ["--set", s]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads((out / "ensemble" / "metrics.json").read_text())


def row(example: str, seed: int, m: dict) -> dict:
    test = m["test"]
    best = test["members"][m["best_member"]]
    keys = ("accuracy", "nll") if m["task"] == "classification" else ("mse", "r2")
    out = {"example": example, "seed": seed, "members_used": sum(w > 0 for w in m["weights"].values()),
           "members_ok": m["status"].get("ok", 0)}
    for name, scores in (("ensemble", test["ensemble"]), ("best_member", best), ("run_best", test["run_best"])):
        out.update({f"{name}_{k}": round(scores[k], 4) for k in keys})
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--evaluations", type=int, default=12)
    p.add_argument("--members", type=int, default=6)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--config", default="examples/demo.toml")
    p.add_argument("--examples", nargs="+", default=list(EXAMPLES), choices=list(EXAMPLES))
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for example in args.examples:
            generate, kw, sets = EXAMPLES[example]
            data = Path(tmp) / f"{example}.h5"
            generate(data, **kw)
            for seed in args.seeds:
                rows.append(row(example, seed, design(data, Path(tmp) / f"{example}-{seed}", seed, args, sets)))
                print(json.dumps(rows[-1]), flush=True)
    for example in args.examples:
        rs = [r for r in rows if r["example"] == example]
        key, better = ("nll", min) if "ensemble_nll" in rs[0] else ("mse", min)
        wins = sum(better(r[f"ensemble_{key}"], r[f"best_member_{key}"]) == r[f"ensemble_{key}"] for r in rs)
        print(json.dumps({"example": example, "seeds": len(rs), f"ensemble_{key}_mean":
                          round(statistics.mean(r[f"ensemble_{key}"] for r in rs), 4), f"best_member_{key}_mean":
                          round(statistics.mean(r[f"best_member_{key}"] for r in rs), 4),
                          f"ensemble_{key}_at_most_best_member": f"{wins}/{len(rs)}"}))


if __name__ == "__main__":
    main()
