"""Rules that weight a final ensemble's members, compared offline on saved ensembles (bench/PROTOCOL.md, round 3's
secondary question).

    python -m bench.selection_rules KEEP/*-evolution-ensemble-*/final [--results FILE]
    python -m bench.selection_rules --results FILE --table-only      # the report of FILE's rows, nothing run

Each directory is an ensemble built by `galapagos ensemble` (a run's final/ is one). Every member predicts val and
test once; each rule weights the members from their val predictions only; the ensemble is scored on test
(accuracy, or mean R^2: bench/search.py's score). Rules:

- `greedy`: the built ensemble's own rule, greedy forward selection with replacement on val (ensemble/selection.py)
  with the ensemble's config;
- `uniform`: every member at the same weight, no selection;
- `bagged`: the greedy rule in BAGS bags of half the members each, the bags' weights averaged (Caruana et al.,
  "Getting the most out of ensemble selection", ICDM 2006): `ensemble.bags = BAGS` (seed 0).

Each rule is paired with `greedy` over the directories: the mean difference, its 95% bootstrap interval and the
one-sided exact Wilcoxon p-value (bench/paired.py); with the ensembles of more than one set, each set's mean
difference and 95% bootstrap interval under it (a set is the dataset of the run directory bench/search.py's
`--keep` names `DATASET-CONTESTANT-SEED`). Dense tasks (segmentation, fields) are not handled.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Callable

import numpy as np

from bench.paired import bootstrap_ci, group_line, wilcoxon_greater
from bench.search import DATASETS, headline
from galapagos.config import load_config
from galapagos.ensemble.selection import combine, select
from galapagos.flows.ensembling import member_predictions
from galapagos.flows.prediction import score
from galapagos.store.ensembledir import EnsembleDir, load_manifest

BAGS = 20


def greedy(val: np.ndarray, y: np.ndarray, task: str, cfg) -> np.ndarray:
    return select(val, y, task, max_rounds=cfg.max_rounds, init=cfg.init).weights


def uniform(val: np.ndarray, y: np.ndarray, task: str, cfg) -> np.ndarray:
    return np.full(len(val), 1.0 / len(val))


def bagged(val: np.ndarray, y: np.ndarray, task: str, cfg) -> np.ndarray:
    return select(val, y, task, max_rounds=cfg.max_rounds, init=cfg.init, bags=BAGS, seed=0).weights


RULES = {"greedy": greedy, "uniform": uniform, "bagged": bagged}


def compare_rules(path: Path) -> dict:
    """The test score of each rule's weighting of the ensemble in `path`, and the members it used."""
    manifest = load_manifest(path)
    problem = manifest.problem
    if problem.is_dense:
        raise SystemExit(f"{path}: a {problem.task} ensemble; only classification and regression are compared")
    config = load_config(path / "config.toml")
    names = [m.name for m in manifest.members if m.status == "ok"]
    info, splits, preds = member_predictions(EnsembleDir(path), names, problem, manifest.sources["data"], config)
    val = np.asarray(preds["val"], dtype=np.float64)
    row = {"ensemble": str(path), "members": len(names)}
    for rule, weigh in RULES.items():
        w = weigh(val, splits["val"][1], problem.task, config.ensemble)
        row[rule] = round(headline(score(problem.task, combine(preds["test"], w), splits["test"][1], info)), 4)
        row[f"{rule}_used"] = int((w > 0).sum())
    return row


def report(rows: list[dict]) -> str:
    lines = ["| ensemble | members | " + " | ".join(RULES) + " |", "|---|---|" + "---|" * len(RULES)]
    lines += [f"| {r['ensemble']} | {r['members']} | " + " | ".join(f"{r[k]:.4f} ({r[k + '_used']})" for k in RULES)
              + " |" for r in rows]
    for rule in list(RULES)[1:]:
        lines += paired_lines(f"{rule} - greedy", [r[rule] - r["greedy"] for r in rows], rows)
    return "\n".join(lines)


def paired_lines(name: str, d: list[float], rows: list[dict]) -> list[str]:
    """The paired test of the differences `d`, one per row: mean, 95% bootstrap interval, ahead and behind, the
    one-sided exact Wilcoxon p; under it each set's line where the rows are of more than one."""
    lo, hi = bootstrap_ci(d)
    lines = [f"{name}: mean {statistics.mean(d):+.4f} (95% {lo:+.4f}..{hi:+.4f}), {sum(x > 0 for x in d)} ahead, "
             f"{sum(x < 0 for x in d)} behind, one-sided Wilcoxon p = {wilcoxon_greater(d):.4f}"]
    sets = [_dataset(r["ensemble"]) for r in rows]
    if len(set(sets)) > 1:
        lines += [group_line(group, [x for x, s in zip(d, sets) if s == group]) for group in dict.fromkeys(sets)]
    return lines


def _dataset(ensemble: str) -> str:
    """The set of an ensemble in a run directory DATASET-CONTESTANT-SEED (bench/search.py --keep); else that
    directory's name."""
    run = Path(ensemble).parent.name
    return max((d for d in DATASETS if run.startswith(d + "-")), key=len, default=run)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ensembles", nargs="*", type=Path, help="ensemble directories (a run's final/)")
    p.add_argument("--results", type=Path, help="append each directory's row to this JSONL file")
    p.add_argument("--table-only", action="store_true", help="report the rows already in --results; compare nothing")
    args = p.parse_args(argv)
    measure_or_report(p, args, args.ensembles, "ensemble directories", compare_rules, report)


def measure_or_report(p: argparse.ArgumentParser, args: argparse.Namespace, items: list[Path], what: str,
                      measure: Callable[[Path], dict], report: Callable[[list[dict]], str]) -> None:
    """A row per item, each printed and added to `--results` as it comes, then the report of them; with
    `--table-only`, the report of the rows already in `--results`, nothing measured."""
    if args.table_only:
        if not args.results or not args.results.is_file() or items:
            p.error(f"--table-only reads the rows of an existing --results FILE and takes no {what}")
        print(report([json.loads(line) for line in args.results.read_text().splitlines() if line.strip()]))
        return
    if not items:
        p.error(f"name at least one of the {what}, or --table-only with --results")
    rows = []
    for item in items:
        rows.append(measure(item))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        if args.results:
            with args.results.open("a") as f:
                f.write(json.dumps(rows[-1]) + "\n")
    print(report(rows))


if __name__ == "__main__":
    main()
