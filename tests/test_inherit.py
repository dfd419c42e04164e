"""Weight inheritance: children start from a parent's trained weights where the layers match."""
from __future__ import annotations

import json

import pytest
import torch

from galapagos.evolve.build import build_model
from galapagos.evolve.errors import ConfigError
from galapagos.evolve.genome import Gene, Genome
from galapagos.evolve.inherit import inherit_weights
from galapagos.evolve.problem import Problem
from galapagos.evolve.train import TrainConfig, TrainTask, train_task
from tests.test_evolve_run import SMALL, galapagos, shapes_file  # noqa: F401 - fixture

IMAGE = Problem((1, 12, 12), "classification", 3)
PARENT = Genome(layers=(Gene("conv", channels=4, kernel=3, stride=1, act="relu"),
                        Gene("conv", channels=8, kernel=3, stride=2, act="relu"),
                        Gene("dense", units=16, act="relu")), optimizer="adam", lr=1e-3, batch_size=32)


def trained(genome: Genome) -> dict:
    """A parent's weights: random, distinct from any fresh initialisation of the seed used below."""
    torch.manual_seed(123)
    model = build_model(genome, IMAGE)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    return model.state_dict()


def child_of(genome: Genome) -> tuple[torch.nn.Module, float]:
    torch.manual_seed(0)
    model = build_model(genome, IMAGE)
    return model, inherit_weights(model, trained(PARENT))


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a, b)


def test_a_training_gene_mutation_inherits_every_layer():
    model, fraction = child_of(PARENT.replace(lr=3e-3, optimizer="sgd"))
    parent = trained(PARENT)
    assert fraction == 1.0
    assert all(same(v, parent[k]) for k, v in model.state_dict().items() if "." in k)


def test_an_inserted_layer_shifts_the_rest_without_losing_them():
    inserted = Gene("conv", channels=4, kernel=3, stride=1, act="gelu")
    model, fraction = child_of(PARENT.replace(layers=PARENT.layers[:1] + (inserted,) + PARENT.layers[1:]))
    parent = trained(PARENT)
    state = model.state_dict()
    assert 0.5 < fraction < 1.0
    assert same(state["features.0.0.weight"], parent["features.0.0.weight"])
    assert same(state["features.2.0.weight"], parent["features.1.0.weight"])  # shifted by one
    assert same(state["dense.2.weight"], parent["dense.2.weight"])


def test_a_wider_layer_starts_fresh_and_its_neighbours_inherit():
    wider = PARENT.layers[1].replace(channels=16)
    model, fraction = child_of(PARENT.replace(layers=(PARENT.layers[0], wider, PARENT.layers[2])))
    parent = trained(PARENT)
    state = model.state_dict()
    assert 0.0 < fraction < 1.0
    assert same(state["features.0.0.weight"], parent["features.0.0.weight"])
    assert state["features.1.0.weight"].shape[0] == 16
    assert same(state["dense.2.weight"], parent["dense.2.weight"])  # the output layer: same shape again


def test_a_shrunk_inheritance_starts_between_the_parent_and_a_fresh_network():
    normed = PARENT.replace(layers=(PARENT.layers[0], Gene("norm", kind="batch"), *PARENT.layers[1:]))
    parent = trained(normed)
    buffers = [k for k in parent if k.endswith("running_mean")]
    for k in buffers:
        parent[k] += 2.0  # running statistics of its own, unlike a fresh network's
    torch.manual_seed(0)
    fresh = build_model(normed, IMAGE).state_dict()
    torch.manual_seed(0)
    model = build_model(normed, IMAGE)
    assert inherit_weights(model, parent, shrink=0.25) == 1.0
    state, params = model.state_dict(), dict(model.named_parameters())
    assert all(torch.allclose(state[k], 0.25 * parent[k] + 0.75 * fresh[k]) for k in params)
    assert buffers and all(same(state[k], parent[k]) for k in buffers)  # buffers as they are
    with pytest.raises(ConfigError, match="train.inherit_shrink: expected a share above 0"):
        TrainConfig(inherit_shrink=0.0)


def test_nothing_in_common_inherits_nothing():
    model = build_model(Genome(layers=(Gene("dense", units=8, act="tanh"),), optimizer="adam", lr=1e-3,
                               batch_size=32), Problem((5,), "regression", 2))
    assert inherit_weights(model, trained(PARENT)) == 0.0


class Ctx:
    def __init__(self, data: dict):
        self.data, self.cache, self.device = data, {}, "cpu"
        self.report = None


def test_a_parent_whose_weights_are_gone_trains_from_scratch(tmp_path, shapes_file):  # noqa: F811
    from galapagos.datashare.format import load
    _, splits = load(shapes_file, ("train", "val"))
    arrays = {f"{split}/{k}": a for split, xy in splits.items() for k, a in zip("xy", xy)}
    task = TrainTask(PARENT, Problem((1, 12, 12), "classification", 6), TrainConfig(epochs=1),
                     inherit=str(tmp_path / "pruned.pt"))
    out = train_task(task, Ctx(arrays))
    assert out["fitness"] >= 0 and "inherited" not in out["metrics"]


def test_children_of_a_run_inherit_and_the_population_keeps_its_weights(shapes_file, tmp_path):  # noqa: F811
    for inherit in (True, False):
        run = tmp_path / f"run-{inherit}"
        proc = galapagos("evolve", "--data", shapes_file, "--out", run, "--evaluations", 10, "--workers", 1, *SMALL,
                         "--set", f"evolution.inherit={str(inherit).lower()}", "--set", "run.keep_models=1",
                         "--set", "run.prune=false", timeout=300)
        assert proc.returncode == 0, proc.stderr
        records = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
        heirs = [r for r in records if "inherits" in r]
        kept = {int(p.stem) for p in (run / "models").glob("*.pt")}
        if inherit:
            assert heirs and all(r["inherits"] in r["parents"] and 0 <= r["metrics"]["inherited"] <= 1
                                 for r in heirs)
            assert len(kept) > 1  # the population's (4), not only the best one
        else:
            assert not heirs and all("inherited" not in r["metrics"] for r in records) and len(kept) == 1


def test_an_adaptive_shrink_follows_the_parents_fit():
    config = TrainConfig(adaptive_shrink=True, inherit_shrink=0.5)
    assert config.shrink_after({"train_loss": 0.1, "val_loss": 0.5}) == 0.5  # memorising: the floor
    assert config.shrink_after({"train_loss": 0.45, "val_loss": 0.6}) == 0.75
    assert config.shrink_after({"train_loss": 0.9, "val_loss": 0.6}) == 1.0  # fits no better than val: as it is
    for metrics in ({}, {"train_loss": 0.3}, {"train_loss": 0.0, "val_loss": 0.5}, {"train_loss": None, "val_loss": 1}):
        assert config.shrink_after(metrics) is None  # the child takes inherit_shrink
    assert TrainConfig(inherit_shrink=0.5).shrink_after({"train_loss": 0.45, "val_loss": 0.6}) is None


def test_a_run_with_an_adaptive_shrink_starts_each_child_at_its_parents_share(shapes_file, tmp_path):  # noqa: F811
    run = tmp_path / "run"
    proc = galapagos("evolve", "--data", shapes_file, "--out", run, "--evaluations", 12, "--workers", 1, *SMALL,
                     "--set", "train.adaptive_shrink=true", "--set", "train.inherit_shrink=0.3",
                     "--set", "run.prune=false", timeout=300)
    assert proc.returncode == 0, proc.stderr
    records = {r["id"]: r for r in map(json.loads, (run / "results.jsonl").read_text().splitlines())}
    heirs = [r for r in records.values() if "inherits" in r]
    assert heirs
    for r in heirs:
        parent = records[r["inherits"]]["metrics"]
        share = min(1.0, max(0.3, parent["train_loss"] / parent["val_loss"]))
        assert r["metrics"]["shrink"] == pytest.approx(share, abs=0.005)
    assert all("shrink" not in r["metrics"] for r in records.values() if "inherits" not in r)


def test_a_child_that_inherits_most_of_its_parent_trains_inherited_epochs(shapes_file):  # noqa: F811
    from galapagos.datashare.format import load
    from galapagos.evolve.train import train_candidate
    _, splits = load(shapes_file, ("train", "val"))
    data = {split: tuple(torch.from_numpy(a) for a in xy) for split, xy in splits.items()}
    problem = Problem((1, 12, 12), "classification", 6)
    config = TrainConfig(epochs=3, inherited_epochs=1)
    fresh, state = train_candidate(PARENT, problem, data, config)
    child, _ = train_candidate(PARENT.replace(lr=2e-3), problem, data, config, parent=state)
    assert fresh["epochs"] == 3 and "inherited" not in fresh
    assert child["epochs"] == 1 and child["inherited"] == 1.0
    with pytest.raises(ConfigError, match="train.inherited_epochs: expected 0 to epochs"):
        TrainConfig(epochs=3, inherited_epochs=4)
