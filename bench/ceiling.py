"""How much of a benchmark set's test split a network can get right with far more data than the set has: the
dataset's hand-written network (bench/search_configs/NAME.expert.json) trained on the set's training split and
every trace of K more draws of the same generator (data seeds 1..K), then scored on the set's own validation and
test splits by `galapagos predict`, as bench/search.py scores its contestants. `--draws 0` is the control: the same
network and epochs on the set's own training split.

    python -m bench.ceiling --dataset heartbeats --draws 15 --epochs 12 --seeds 0 1

A reading aid for a fixed figure on a set (bench/PROTOCOL.md, round 6), not a contestant: where a network that has
seen 26 times the training data stays below the figure on the test split, the figure is out of reach of any search
on the set's own training split, and a shortfall there measures the split as much as the search.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path

import numpy as np
import torch

from galapagos.config import load_config
from galapagos.datashare.format import load
from galapagos.datashare.write import write_dataset
from galapagos.evolve.genome import Genome
from galapagos.evolve.train import train_candidate

from bench.peers import save_best, training_data
from bench.search import DATASETS, config_path, expert_path, test_score


def more_data(name: str, draws: int, tmp: Path) -> Path:
    """The set (data seed 0) with every trace of `draws` other draws of its generator added to its training
    split; its validation and test splits unchanged."""
    generate, kwargs, _ = DATASETS[name]
    generate(tmp / "set.h5", **kwargs)
    info, arrays = load(tmp / "set.h5")
    xs, ys = [arrays["train"][0]], [arrays["train"][1]]
    for seed in range(1, draws + 1):
        generate(tmp / "draw.h5", **kwargs, seed=seed)
        for x, y in load(tmp / "draw.h5")[1].values():
            xs.append(x)
            ys.append(y)
    splits = {"train": (np.concatenate(xs), np.concatenate(ys)), "val": arrays["val"], "test": arrays["test"]}
    return write_dataset(tmp / "more.h5", splits, task=info.task, num_classes=info.num_classes, name=info.name,
                         target_names=info.target_names, description=f"{info.description}; training split: "
                         f"{draws} more draws").path


def ceiling(name: str, draws: int, epochs: int, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        data = more_data(name, draws, Path(tmp))
        problem, tensors, stats = training_data(data)
        genome = json.loads(expert_path(name).read_text())
        train = dataclasses.replace(load_config(config_path(name)).train, epochs=epochs)
        summary, state = train_candidate(Genome.from_json(genome), problem, tensors, train, seed=seed, stats=stats)
        torch.save(state, Path(tmp) / "weights.pt")
        model = save_best(Path(tmp), data, genome, summary["fitness"], Path(tmp) / "weights.pt")
        return {"dataset": name, "draws": draws, "train_rows": len(tensors["train"][1]), "epochs": epochs,
                "seed": seed, "val": round(summary["fitness"], 4), "test": test_score(model, data)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.ceiling", description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", required=True, choices=sorted(DATASETS))
    p.add_argument("--draws", type=int, default=15, help="more draws of the generator to train on (default 15)")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="training seeds, one network each")
    args = p.parse_args(argv)
    for seed in args.seeds:
        print(json.dumps(ceiling(args.dataset, args.draws, args.epochs, seed)), flush=True)


if __name__ == "__main__":
    main()
