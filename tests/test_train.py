"""Training one candidate in-process: finite fitness, the best epoch kept, normalisation saved, divergence caught."""
import numpy as np
import pytest
import torch

from galapagos.evolve.build import build_model
from galapagos.evolve.errors import ConfigError
from galapagos.evolve.genome import Genome
from galapagos.evolve.problem import Problem
from galapagos.evolve.steps import memory_format
from galapagos.evolve.train import NonFiniteLoss, TrainConfig, train_candidate
from galapagos.launch.protocol import Status
from galapagos.launch.trainer import status_of


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


def test_keep_last_keeps_the_last_epoch_whatever_its_score():
    """An ensemble member's refit (ensemble/refit.py) keeps its last epoch: its validation rows are in its training.
    Validation labels shifted by one class make the first epoch the best by validation (the more the network learns,
    the lower it scores there); keep_last returns the last epoch's weights and metrics all the same."""
    problem = Problem((1, 8, 8), "classification", 3)
    g = genome([{"type": "conv", "channels": 4, "kernel": 3, "stride": 1, "act": "relu"}], lr=1e-2)
    x, y = blobs(64, (1, 8, 8), 3, seed=1)
    data = {"train": blobs(192, (1, 8, 8), 3), "val": (x, (y + 1) % 3)}
    best, _ = train_candidate(g, problem, data, TrainConfig(epochs=4))
    assert best["best_epoch"] < 4
    reports = []
    summary, state = train_candidate(g, problem, data, TrainConfig(epochs=4), report=reports.append, keep_last=True)
    assert summary["best_epoch"] == 4 and summary["fitness"] == reports[-1]["fitness"] <= best["fitness"]
    model = build_model(g, problem)
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():
        acc = (model(x).argmax(1) == data["val"][1]).float().mean().item()
    assert acc == pytest.approx(reports[-1]["val_accuracy"])


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


def test_memory_format_and_compile_options_are_checked():
    with pytest.raises(ConfigError, match=r"train\.memory_format: expected one of auto, channels_last, contiguous, "
                                        r"got 'nhwc'"):
        TrainConfig.from_dict({"memory_format": "nhwc"})
    with pytest.raises(ConfigError, match=r"train\.compile: expected true or false, got 'yes'"):
        TrainConfig.from_dict({"compile": "yes"})
    assert TrainConfig().memory_format == "auto" and TrainConfig().compile is False
    assert TrainConfig().cuda_graphs is True  # on CUDA GPUs only, where compile is false
    with pytest.raises(ConfigError, match=r"train\.cuda_graphs: expected true or false, got 1"):
        TrainConfig.from_dict({"cuda_graphs": 1})


def test_cuda_graphs_leave_training_on_the_cpu_as_it_was():
    """train.cuda_graphs acts on CUDA devices only (tests/test_gpu.py captures on one): on the CPU the same
    training to the last bit, and no `cuda_graphs` in the summary."""
    problem = Problem((1, 8, 8), "classification", 3)
    g = genome([{"type": "conv", "channels": 4, "kernel": 3, "stride": 1, "act": "relu"},
                {"type": "norm", "kind": "batch"}, {"type": "dense", "units": 8, "act": "relu"}], lr=1e-2)
    data = {"train": blobs(100, (1, 8, 8), 3), "val": blobs(32, (1, 8, 8), 3, seed=1)}
    (plain, plain_state), (graphs, graphs_state) = (
        train_candidate(g, problem, data, TrainConfig(epochs=2, cuda_graphs=on)) for on in (False, True))
    assert "cuda_graphs" not in graphs and graphs["val_loss"] == plain["val_loss"]
    for k, v in plain_state.items():
        assert torch.equal(graphs_state[k], v), k


def test_auto_layout_is_channels_last_for_2d_convolutions_on_gpus_only():
    """The choice alone (no GPU needed: it reads the device's type): "auto" gives 2D networks channels-last on a GPU,
    keeps 3D ones contiguous (faster there, evolve/train.py), and keeps every layout on the CPU."""
    conv = [{"type": "conv", "channels": 4, "kernel": 3, "stride": 1, "act": "relu"}]
    net2d, net3d = (build_model(genome(conv), Problem(shape, "classification", 3))
                    for shape in ((2, 8, 8), (1, 6, 6, 6)))
    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    assert memory_format(net2d, gpu, "auto") == torch.channels_last and memory_format(net3d, gpu, "auto") is None
    assert memory_format(net3d, gpu, "channels_last") == torch.channels_last_3d
    assert memory_format(net2d, cpu, "auto") is None and memory_format(net2d, gpu, "contiguous") is None


@pytest.mark.parametrize("shape,fmt", [((2, 8, 8), "channels_last"), ((1, 6, 6, 6), "channels_last_3d")])
def test_channels_last_trains_as_the_contiguous_layout(shape, fmt):
    """Forced on the CPU (where "auto" keeps the contiguous layout), channels-last gives the same training within
    float32 rounding: same losses, same weights; the saved weights are contiguous either way."""
    problem = Problem(shape, "classification", 3)
    g = genome([{"type": "conv", "channels": 4, "kernel": 3, "stride": 1, "act": "relu"},
                {"type": "residual", "channels": 8, "kernel": 3, "act": "relu"}], lr=1e-2)
    data = {"train": blobs(96, shape, 3), "val": blobs(32, shape, 3, seed=1)}
    runs = {}
    for setting in ("auto", "channels_last", "contiguous"):
        reports = []
        runs[setting] = train_candidate(g, problem, data, TrainConfig(epochs=2, memory_format=setting),
                                        report=reports.append) + (reports,)
    (auto, auto_state, _), (cl, cl_state, cl_reports), (co, co_state, co_reports) = runs.values()
    assert cl["memory_format"] == fmt and "memory_format" not in auto and "memory_format" not in co
    for a, b in zip(cl_reports, co_reports):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-4)
    for k, v in co_state.items():
        assert cl_state[k].is_contiguous() and auto_state[k].is_contiguous()
        torch.testing.assert_close(cl_state[k], v, rtol=1e-3, atol=1e-4)
        torch.testing.assert_close(auto_state[k], v, rtol=0, atol=0)  # auto is contiguous on the CPU
    dense = train_candidate(genome([{"type": "dense", "units": 8, "act": "relu"}]), Problem((5,), "classification", 2),
                            {"train": blobs(64, (5,), 2), "val": blobs(32, (5,), 2)},
                            TrainConfig(epochs=1, memory_format="channels_last"))[0]
    assert "memory_format" not in dense  # no 2D/3D convolution: nothing to change


@pytest.fixture(scope="module")
def inductor():
    """torch.compile on this CPU, or a skip saying why not (it needs a working C++ compiler)."""
    try:
        torch.compile(lambda t: t * 2 + 1)(torch.ones(3))
    except Exception as exc:  # noqa: BLE001 - any failure of the compiler stack means: cannot test here
        pytest.skip(f"torch.compile does not work on this machine: {type(exc).__name__}: {str(exc)[:200]}")


def test_a_compiled_candidate_trains_and_records_its_compile_time(inductor):
    x, y = blobs(100, (5,), 2)  # 3 full batches of 32 (compiled) and one of 4 (the module itself)
    g = genome([{"type": "dense", "units": 8, "act": "relu"}])
    summary, state = train_candidate(g, Problem((5,), "classification", 2), {"train": (x, y), "val": (x, y)},
                                     TrainConfig(epochs=2, compile=True))
    assert np.isfinite(summary["fitness"]) and summary["fitness"] > 0.5
    assert summary["compile_seconds"] > 0 and summary["train_seconds"] >= summary["compile_seconds"]
    assert not any(k.startswith("_orig_mod") for k in state)  # the module's own names: loadable without compile
