"""The refit of a final ensemble's members (`ensemble.refit_epochs`, ensemble/refit.py), paired within each run
(bench/PROTOCOL.md, the refit pilot of stop 85).

    python -m bench.refit KEEP/*-evolution-ensemble-* [--epochs 3] [--results FILE]
    python -m bench.refit --results FILE --table-only      # the report of FILE's rows, nothing run

Each directory is an evolution run with its kept weights (bench/search.py's `--keep` keeps them). Its kept networks
are made an ensemble again (`galapagos ensemble --strategy kept`, the run's own config and members) with the refit
on, in a fresh directory: the same selection as the run's final/, then each used member trained on from its weights
on the training and validation rows. Its metrics.json holds the test score before the refit and after: one pair
per run, nothing between them but the refit. Scores are bench/search.py's (accuracy, or mean R^2); the report pairs
them as bench/selection_rules.py does (mean difference, 95% bootstrap interval, one-sided exact Wilcoxon).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.search import headline
from bench.selection_rules import measure_or_report, paired_lines
from galapagos.config import load_config
from galapagos.store.ensembledir import load_manifest


def refit_run(run: Path, epochs: int, lr: float) -> dict:
    """The run's kept ensemble before and after the refit, on test; the refit's seconds and members."""
    config, final = load_config(run / "config.toml"), load_manifest(run / "final")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "final"
        subprocess.run([sys.executable, "-m", "galapagos.cli", "ensemble", "--from", str(run), "--data",
                        final.sources["data"], "--out", str(out), "--strategy", "kept",
                        "--members", str(config.run.keep_models), "--set", f"ensemble.refit_epochs={epochs}",
                        "--set", f"ensemble.refit_lr={lr}"], check=True, stdout=subprocess.DEVNULL)
        metrics = json.loads((out / "metrics.json").read_text())
    refit = metrics["refit"]
    if metrics["selection"] != json.loads((run / "final" / "metrics.json").read_text())["selection"]:
        raise SystemExit(f"{run}: the kept ensemble's selection is not its final/'s: no pair")
    return {"ensemble": str(run / "final"), "epochs": epochs, "lr": lr,
            "before": round(headline(refit["test_before"]), 4),
            "after": round(headline(metrics["test"]["ensemble"]), 4),
            "nll_before": refit["test_before"].get("nll"), "nll_after": metrics["test"]["ensemble"].get("nll"),
            "refit": len(refit["members"]), "seconds": refit["seconds"]}


def report(rows: list[dict]) -> str:
    lines = ["| run | refit members | seconds | before | after |", "|---|---|---|---|---|"]
    lines += [f"| {Path(r['ensemble']).parent.name} | {r['refit']} | {r['seconds']} | {r['before']:.4f} | "
              f"{r['after']:.4f} |" for r in rows]
    return "\n".join(lines + paired_lines("refit - before", [r["after"] - r["before"] for r in rows], rows))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="*", type=Path, help="evolution run directories with their kept weights")
    p.add_argument("--epochs", type=int, default=3, help="ensemble.refit_epochs (default 3)")
    p.add_argument("--lr", type=float, default=0.2, help="ensemble.refit_lr (default 0.2)")
    p.add_argument("--results", type=Path, help="append each run's row to this JSONL file")
    p.add_argument("--table-only", action="store_true", help="report the rows already in --results; refit nothing")
    args = p.parse_args(argv)
    measure_or_report(p, args, args.runs, "run directories", lambda run: refit_run(run, args.epochs, args.lr),
                      report)


if __name__ == "__main__":
    main()
