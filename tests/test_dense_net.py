"""Dense (per-pixel) networks: the encoder-decoder a genome builds for segmentation and fields in 1D/2D/3D, its
exact parameter count, repair, the segmentation loss gene, and training them with their losses and metrics."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from galapagos.evolve.build import build_model
from galapagos.evolve.check import check_genome, count_params
from galapagos.evolve.dense import confusion, field_scores, field_sums, segmentation_scores
from galapagos.evolve.genome import Genome
from galapagos.evolve.operators import crossover, mutate
from galapagos.evolve.problem import Problem
from galapagos.evolve.space import SearchSpace
from galapagos.evolve.train import TrainConfig, normalization_stats, train_candidate

CONV = {"type": "conv", "channels": 8, "kernel": 3, "stride": 1, "act": "relu"}
DOWN = {"type": "conv", "channels": 16, "kernel": 3, "stride": 2, "act": "relu"}
POOL = {"type": "pool", "op": "max", "size": 2}


def genome(layers, **kw) -> Genome:
    return Genome(layers=tuple(layers), lr=kw.pop("lr", 1e-2), batch_size=kw.pop("batch_size", 16), **kw)


@pytest.mark.parametrize("shape, task, outputs", [((2, 17), "segmentation", 3), ((1, 15, 12), "field", 2),
                                                  ((1, 9, 8, 7), "segmentation", 4), ((3, 6, 5, 4), "field", 1)])
def test_random_dense_genomes_build_count_exactly_and_keep_the_input_size(shape, task, outputs) -> None:
    problem, space, rng = Problem(shape, task, outputs), SearchSpace(max_layers=6), random.Random(1)
    built = 0
    for i in range(60):
        g = mutate(space.random_genome(rng, problem), space, problem, rng, 2)
        if i % 2:
            g = crossover(g, space.random_genome(rng, problem), rng)
        g = check_genome(g, problem, space)
        assert all(gene.type != "dense" for gene in g.layers) and g.head == space.heads[0]
        assert (g.loss != "ce") <= (task == "segmentation")
        model = build_model(g, problem)
        assert count_params(g, problem) == sum(p.numel() for p in model.parameters()), g.describe()
        if i % 10 == 0:
            assert tuple(model(torch.randn(2, *shape)).shape) == (2, outputs, *shape[1:])
        built += 1
    assert built == 60


def test_decoder_has_one_stage_per_downsampling_with_its_skip() -> None:
    problem = Problem((1, 9, 9), "segmentation", 3)
    model = build_model(genome([CONV, POOL, DOWN]), problem)
    assert model.skip_at == {1, 2} and len(model.decoder.stages) == 2
    # each stage takes the 16 channels coming up and its skip's 8 (before the pool, before the strided conv)
    assert [(s[0].in_channels, s[0].out_channels) for s in model.decoder.stages] == [(16 + 8, 16)] * 2
    assert tuple(model(torch.randn(3, 1, 9, 9)).shape) == (3, 3, 9, 9)  # odd sizes come back exactly
    flat = build_model(genome([CONV]), problem)
    assert len(flat.decoder.stages) == 0 and count_params(genome([CONV]), problem) == 8 * 9 + 8 + 8 * 3 + 3


def test_repair_of_dense_genomes() -> None:
    problem, space = Problem((1, 8, 8), "segmentation", 2), SearchSpace(min_layers=2)
    g = genome([CONV, {"type": "dense", "units": 16, "act": "relu"}, {"type": "dropout", "rate": 0.2}],
               head="flatten", loss="dice")
    fixed = check_genome(g, problem, space)
    assert [x.type for x in fixed.layers] == ["conv", "dropout"] and fixed.head == "avg" and fixed.loss == "dice"
    assert check_genome(genome([]), problem, space).layers[0].type == "conv"  # too short: filled with convs
    assert check_genome(g, Problem((1, 8, 8), "classification", 2), space).loss == "ce"  # seg-only gene
    with pytest.raises(Exception, match=r"layer 1 \(dense16-relu\) has no place in a network with an output per "
                                        r"pixel \(segmentation\)"):
        count_params(g, problem)


def test_loss_gene_keeps_old_genomes_and_keys() -> None:
    plain = genome([CONV])
    assert "loss" not in plain.to_json() and Genome.from_json(plain.to_json()) == plain
    dice = plain.replace(loss="dice")
    assert dice.to_json()["loss"] == "dice" and Genome.from_json(dice.to_json()) == dice and dice.key != plain.key
    assert dice.describe().endswith("loss=dice")
    with pytest.raises(Exception, match="genome.loss: expected one of ce, weighted_ce, dice, got 'focal'"):
        plain.replace(loss="focal")
    with pytest.raises(ValueError, match="problem.sample_shape: segmentation needs spatial axes"):
        Problem((5,), "segmentation", 2)
    p = Problem((1, 4, 4), "segmentation", 2, ignore_index=255)
    assert Problem.from_dict(p.to_dict()) == p and "ignore_index" not in Problem((4,), "regression", 1).to_dict()


def test_metrics_by_hand() -> None:
    y = torch.tensor([[0, 0, 1, 1, 2, 9]])
    pred = torch.tensor([[0, 1, 1, 1, 0, 2]])
    conf = confusion(pred, y, 3, ignore_index=9)
    assert conf.tolist() == [[1, 1, 0], [0, 2, 0], [1, 0, 0]]
    m = segmentation_scores(conf)
    assert m["iou"] == [pytest.approx(1 / 3), pytest.approx(2 / 3), 0.0] and m["pixel_accuracy"] == 0.6
    assert m["miou"] == pytest.approx(1 / 3)
    yf = torch.tensor([[[1.0, 2.0, 3.0], [5.0, 5.0, 5.0]]])  # (N=1, T=2, L=3)
    s = field_scores(field_sums(yf + torch.tensor([[[0.0], [1.0]]]), yf), 3)
    assert s["mse"] == [0.0, 1.0] and s["r2"][0] == 1.0 and np.isnan(s["r2"][1]) and s["mean_r2"] == 1.0


def squares(n: int, size: int = 12, seed: int = 0, ignore: int | None = None):
    """Images with one bright square (class 1) and a dim one (class 2) on background 0: a per-pixel task."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 0.3, (n, 1, size, size)).astype(np.float32)
    y = np.zeros((n, size, size), np.int64)
    for i in range(n):
        for cls, level in ((1, 2.0), (2, -2.0)):
            r, c = rng.integers(0, size - 4, 2)
            x[i, 0, r:r + 4, c:c + 4] += level
            y[i, r:r + 4, c:c + 4] = cls
        if ignore is not None:
            y[i, 0, :] = ignore
    return torch.from_numpy(x), torch.from_numpy(y)


@pytest.mark.parametrize("loss", ["ce", "weighted_ce", "dice"])
def test_segmentation_trains_with_each_loss(loss) -> None:
    problem = Problem((1, 12, 12), "segmentation", 3, ignore_index=255)
    data = {"train": squares(96, ignore=255), "val": squares(32, seed=1, ignore=255)}
    g = genome([CONV, POOL, CONV], loss=loss)
    summary, state = train_candidate(g, problem, data, TrainConfig(epochs=4))
    assert summary["fitness"] == summary["val_miou"] > 0.4, summary
    assert len(summary["val_iou"]) == 3 and 0 < summary["val_pixel_accuracy"] <= 1
    model = build_model(g, problem)
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():
        pred = model(data["val"][0]).argmax(1)
    keep = data["val"][1] != 255
    assert (pred[keep] == data["val"][1][keep]).float().mean().item() == pytest.approx(
        summary["val_pixel_accuracy"])


def test_field_trains_and_predicts_in_target_units() -> None:
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.normal(size=(128, 1, 6, 6, 6)).astype(np.float32))
    y = torch.cat([3 * x + 100, -x * 0.01], 1)  # two target channels on very different scales
    stats = normalization_stats(x, y, "field")
    assert stats["y_mean"].tolist() == pytest.approx([100, 0], abs=0.05) and stats["y_std"][0].item() == pytest.approx(
        3 * x.std().item(), rel=1e-3)
    problem = Problem((1, 6, 6, 6), "field", 2)
    g = genome([CONV, DOWN, CONV])
    summary, state = train_candidate(g, problem, {"train": (x[:96], y[:96]), "val": (x[96:], y[96:])},
                                     TrainConfig(epochs=6))
    assert summary["fitness"] == summary["val_r2"] > 0.5 and len(summary["val_mse_per_target"]) == 2, summary
    model = build_model(g, problem)
    model.load_state_dict(state)
    with torch.no_grad():
        assert model.eval()(x[96:]).mean((0, 2, 3, 4))[0].item() == pytest.approx(100, abs=1)


def test_ensemble_average_per_pixel_in_one_process() -> None:
    from galapagos.ensemble.average import average, member_output
    from galapagos.ensemble.selection import pixel_samples

    seg, field = Problem((1, 6, 5), "segmentation", 3), Problem((1, 6, 5), "field", 2)
    x = np.random.default_rng(0).normal(size=(7, 1, 6, 5)).astype(np.float32)
    for problem in (seg, field):
        torch.manual_seed(0)
        models = [build_model(genome([CONV, POOL]), problem).eval() for _ in range(2)]
        outs = [member_output(m, x, problem.task) for m in models]
        avg = average(None, list(enumerate(models)), [0.25, 0.75], x, problem.task, problem.num_outputs, batch=3)
        assert avg.mean.shape == (7, problem.num_outputs, 6, 5) and avg.members.shape == (2, 7, problem.num_outputs,
                                                                                          6, 5)
        assert np.allclose(avg.mean, 0.25 * outs[0] + 0.75 * outs[1], atol=1e-6)
        if problem is seg:  # probabilities per pixel, and their entropy per pixel
            assert np.allclose(avg.mean.sum(1), 1) and avg.entropy.shape == avg.mutual_information.shape == (7, 6, 5)
        else:
            assert avg.std.shape == (7, 2, 6, 5) and (avg.std > 0).any()
    y = np.zeros((7, 6, 5), np.int64)
    y[:, 0] = 255
    p, t, task = pixel_samples(outs, y, "segmentation", 255)  # outs: the field members' (2, 7, 2, 6, 5)
    assert p.shape == (2, 7 * 5 * 5, 2) and t.shape == (7 * 5 * 5,) and task == "classification"
