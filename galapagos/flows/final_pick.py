"""An evolution run's final pick, on rank 0 at the end of each job: its best networks by validation score are
scored again on the validation rows that no training saw (`[train] holdout`), and the best there is the run's.

Hundreds of close relatives scored on one validation split make the best of them an optimistic pick (its own best
epoch chosen on it too): a fresh split ranks the few best without that bias. The candidates are the best
`run.keep_models` distinct networks whose weights the run kept, of any rung (a rung's score is a finished training's:
evolve/rungs.py).
"""
from __future__ import annotations

import logging
import os

import torch

from galapagos.config import Config
from galapagos.datashare.carve import holdout_indices
from galapagos.datashare.format import load
from galapagos.evolve.build import build_model
from galapagos.evolve.dense import evaluate_dense
from galapagos.evolve.genome import Genome
from galapagos.evolve.problem import Problem
from galapagos.evolve.steps import autocast_for, evaluate
from galapagos.flows.finish import FINISH
from galapagos.launch.protocol import Status
from galapagos.store.journal import JournalRecord
from galapagos.store.rundir import RunDir

__all__ = ["final_pick"]

log = logging.getLogger(__name__)

def candidates(run: RunDir, records: list[JournalRecord], pick: int) -> list[JournalRecord]:
    """The best `pick` distinct networks whose weights are in models/, best first: of those finished at the end of
    the time budget where there are any (galapagos/flows/finish.py)."""
    ok = [r for r in records if r.status == Status.OK and r.fitness is not None]
    ok = [r for r in ok if r.origin == FINISH] or ok
    out, keys = [], set()
    for r in sorted(ok, key=lambda r: r.fitness, reverse=True):
        if r.key not in keys and os.path.exists(run.model_path(r.id)):
            keys.add(r.key)
            out.append(r)
        if len(out) == pick:
            break
    return out


def held_back(config: Config, data: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The validation rows no training saw, as the trainers' validation split is made (carved from train with
    `[run] val_fraction` and seed where the file has none)."""
    _, arrays = load(data, ("val",), val_fraction=config.run.val_fraction, seed=config.run.seed)
    x, y = arrays["val"]
    rows = holdout_indices(len(y), config.train.holdout)[1]
    return torch.from_numpy(x[rows]), torch.from_numpy(y[rows])


def score(record: JournalRecord, path: str, problem: Problem, config: Config, x: torch.Tensor,
          y: torch.Tensor) -> float:
    """A kept network's score on the held-back rows, as its fitness is computed (accuracy, mean R^2, mean IoU)."""
    model = build_model(Genome.from_json(record.genome), problem, builder=config.train.builder)
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    _, autocast = autocast_for(torch.device("cpu"), False)
    batch = config.train.eval_batch_size
    metrics = evaluate_dense(model, x, y, problem, batch, autocast) if problem.is_dense else \
        evaluate(model, x, y, problem.task, batch, autocast)
    return metrics["fitness"]


def final_pick(run: RunDir, config: Config, problem: Problem, data: str, records: list[JournalRecord]
               ) -> tuple[JournalRecord, dict] | None:
    """(the picked record, what summary.json says of the pick), or None where nothing is held back or no network
    was kept. The candidates' scores on the held-back rows; the best there is picked (the better by validation on a
    tie)."""
    if not config.train.holdout or not (found := candidates(run, records, config.run.keep_models)):
        return None
    x, y = held_back(config, data)
    scores = {}
    with torch.no_grad():
        for r in found:
            try:
                scores[r.id] = score(r, run.model_path(r.id), problem, config, x, y)
            except (OSError, RuntimeError, ValueError) as exc:  # a file cut short: the others still compete
                log.warning("final pick: evaluation %d left out: %s", r.id, exc)
    if not scores:
        return None
    picked = max((r for r in found if r.id in scores), key=lambda r: scores[r.id])  # first (best by val) on ties
    log.info("final pick: evaluation %d, %.4f on the %d held-back validation rows (%.4f by validation); "
             "the best by validation, %d, %.4f there", picked.id, scores[picked.id], len(y), picked.fitness,
             found[0].id, scores.get(found[0].id, float("nan")))
    return picked, {"id": picked.id, "holdout_rows": len(y), "holdout_score": scores[picked.id],
                    "scored": [{"id": r.id, "fitness": r.fitness, "holdout_score": scores[r.id]}
                               for r in found if r.id in scores]}
