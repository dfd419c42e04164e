"""Training one candidate in-process: finite fitness, the best epoch kept, normalisation saved, divergence caught."""
import numpy as np
import pytest
import torch

from evolve.build import build_model
from evolve.genome import Genome
from evolve.problem import Problem
from evolve.train import NonFiniteLoss, TrainConfig, train_candidate
from launch.protocol import Status
from launch.trainer import status_of


def genome(layers, **kw):
    return Genome.from_json({"layers": layers, "optimizer": kw.get("optimizer", "adam"), "lr": kw.get("lr", 3e-3),
                             "batch_size": 32, "weight_decay": 0.0, "head": kw.get("head", "avg")})


def blobs(n, shape, classes, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = rng.normal(size=(n, *shape)).astype(np.float32) + y.reshape(-1, *[1] * len(shape)) * 1.5 + 10.0
    return torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))


def test_classification_learns_and_state_dict_reproduces_val_score():
    problem = Problem((1, 8, 8), "classification", 3)
    g = genome([{"type": "conv", "channels": 4, "kernel": 3, "stride": 1, "act": "relu"}], lr=1e-2)
    data = {"train": blobs(192, (1, 8, 8), 3), "val": blobs(64, (1, 8, 8), 3, seed=1)}
    reports = []
    summary, state = train_candidate(g, problem, data, TrainConfig(epochs=6), report=reports.append)
    assert [r["epoch"] for r in reports] == [1, 2, 3, 4, 5, 6]
    assert summary["fitness"] == max(r["fitness"] for r in reports) > 0.6
    model = build_model(g, problem)
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():
        acc = (model(data["val"][0]).argmax(1) == data["val"][1]).float().mean().item()
    assert acc == pytest.approx(summary["val_accuracy"])
    assert model.x_mean.item() == pytest.approx(data["train"][0].mean().item(), rel=1e-3)  # normalisation saved


def test_regression_3d_and_tabular():
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.normal(size=(128, 1, 4, 4, 4)).astype(np.float32))
    y = torch.stack([x.mean((1, 2, 3, 4)) * 100 + 50, x.std((1, 2, 3, 4))], 1)
    problem = Problem((1, 4, 4, 4), "regression", 2)
    g = genome([{"type": "conv", "channels": 4, "kernel": 3, "stride": 1, "act": "relu"}])
    summary, _ = train_candidate(g, problem, {"train": (x[:96], y[:96]), "val": (x[96:], y[96:])},
                                 TrainConfig(epochs=2))
    assert np.isfinite(summary["fitness"]) and "val_r2" in summary
    tab = Problem((5,), "classification", 2)
    xt, yt = blobs(100, (5,), 2)
    summary, _ = train_candidate(genome([{"type": "dense", "units": 8, "act": "gelu"}]), tab,
                                 {"train": (xt, yt), "val": (xt, yt)}, TrainConfig(epochs=2))
    assert summary["fitness"] > 0.5


def test_divergence_raises_nonfinite():
    problem = Problem((4,), "regression", 1)
    x = torch.randn(64, 4)
    y = x.sum(1, keepdim=True) * 1e3
    g = genome([{"type": "dense", "units": 16, "act": "relu"}], optimizer="sgd", lr=1e30)
    with pytest.raises(NonFiniteLoss) as err:
        train_candidate(g, problem, {"train": (x, y), "val": (x, y)}, TrainConfig(epochs=3, grad_clip=0.0))
    assert status_of(err.value) == Status.NAN  # how the trainer child records it


def test_uint8_and_float16_inputs():
    problem = Problem((1, 6, 6), "classification", 2)
    x, y = blobs(64, (1, 6, 6), 2)
    g = genome([{"type": "conv", "channels": 4, "kernel": 3, "stride": 1, "act": "relu"}])
    for xs in (x.clamp(0, 255).to(torch.uint8), x.half()):
        summary, _ = train_candidate(g, problem, {"train": (xs, y), "val": (xs, y)}, TrainConfig(epochs=1))
        assert np.isfinite(summary["fitness"])
