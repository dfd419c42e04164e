"""A search landscape fitted to real evaluations, for simulating a search at a size no test machine has
(bench/search_scale.py).

    python -m bench.landscape --name NAME --val-rows N RUN_DIR... [--more RUN_DIR...] > bench/landscapes/NAME.json

The points are the finished first trainings (rung 0, `ok`, not inherited) of real runs' journals: each network's
genome, its validation score after `[train] epochs` and its training seconds. Runs of random search without
pruning (`--strategy random --set run.prune=false`) sample the space without the bias of a search or a pruner;
the runs given with `--more` only add their children and promotions to the figures below. A genome's *true score*
is the inverse-distance weighted mean of its K nearest points' scores, in the feature space of the engine's
surrogate (evolve/surrogate.py: layer counts by type, widths, kernels, pooling, the training genes, parameters;
each feature scaled by its spread over the points); its seconds the same over the log of theirs. Three more
figures come from the journals:
- `inherit_bonus`: how much further a child that started from its parent's weights scores above the landscape's
  value of its genome than the fresh networks of the same searches do (medians over those that finished; both
  passed the searches' pruning, and the fresh ones' lead, from the pruning and the priors, is taken off);
- `rung_shrink`: a promotion's error against its parent's, (1 - score) after against before, per rung (median over
  the promoted pairs of runs in rungs; 1.0, no gain, without them);
- `val_rows`: the validation rows a score was measured on, for the binomial noise of an observed score.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

import numpy as np

from galapagos.evolve.genome import Genome
from galapagos.evolve.surrogate import K, features, knn

class Landscape:
    """True scores and training seconds of any genome, from the points of real runs."""

    def __init__(self, data: dict) -> None:
        self.data = data
        self.points = np.asarray(data["features"], dtype=np.float64)
        spread = self.points.std(0)
        self.scale = np.where(spread > 0, spread, 1.0)
        # per point: its score and the log of its seconds, averaged over the same neighbours
        self.targets = np.column_stack([data["scores"], np.log(data["seconds"])]).astype(np.float64)

    def value(self, genome: dict | Genome, params: int) -> tuple[float, float]:
        """(true score, training seconds of [train] epochs) of a genome (or its JSON) with `params` parameters."""
        score, log_seconds = knn(self.points, self.targets, self.scale, features(genome, params))
        return float(score), math.exp(log_seconds)

    @property
    def inherit_bonus(self) -> float:
        return self.data["inherit_bonus"]

    @property
    def rung_shrink(self) -> float:
        return self.data["rung_shrink"]

    @property
    def val_rows(self) -> int:
        return self.data["val_rows"]


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines() if line.strip()]


def fit(name: str, runs: list[Path], val_rows: int, more: list[Path] = ()) -> dict:
    """The landscape's JSON from the journals of `runs`, its inheritance and promotion figures from those of
    `more` too."""
    fresh, inherited, peers, pairs = [], [], [], []
    for run in [*runs, *more]:
        records = _records(run)
        by_id = {r["id"]: r for r in records}
        ok = [r for r in records if r["status"] == "ok" and r["fitness"] is not None]
        for r in ok:
            if r.get("origin") == "promoted":
                parent = by_id.get(r["parents"][0])
                if parent is not None and parent["fitness"] < 1:
                    pairs.append((1 - r["fitness"]) / (1 - parent["fitness"]))
        first = [r for r in ok if r.get("origin") != "promoted"]
        inherited += [r for r in first if r.get("inherits") is not None]
        if any(r.get("inherits") is not None for r in first):  # a search's own: past its pruner as its children are
            peers += [r for r in first if r.get("inherits") is None]
        if run in runs:
            fresh += [r for r in first if r.get("inherits") is None]
    if len(fresh) <= K:
        raise SystemExit(f"{len(fresh)} fresh first trainings in {', '.join(map(str, runs))}: too few to fit")
    data = {"name": name, "runs": [str(r) for r in runs], "more": [str(r) for r in more], "val_rows": val_rows,
            "features": [features(r["genome"], r["params"]) for r in fresh],
            "scores": [r["fitness"] for r in fresh],
            "seconds": [r["metrics"]["train_seconds"] for r in fresh],
            "inherit_bonus": 0.0, "rung_shrink": statistics.median(pairs) if pairs else 1.0,
            "promoted_pairs": len(pairs), "inherited": len(inherited)}
    land = Landscape(data)
    if inherited and peers:
        def residual(rs: list[dict]) -> float:
            return statistics.median(r["fitness"] - land.value(r["genome"], r["params"])[0] for r in rs)

        data["inherit_bonus"] = residual(inherited) - residual(peers)
    return data


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.landscape", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="run directories whose journals give the points")
    p.add_argument("--name", required=True)
    p.add_argument("--val-rows", type=int, required=True, help="validation rows the scores were measured on")
    p.add_argument("--more", nargs="*", type=Path, default=[], help="runs that add only children and promotions")
    args = p.parse_args(argv)
    print(json.dumps(fit(args.name, args.runs, args.val_rows, args.more)))


if __name__ == "__main__":
    main()
