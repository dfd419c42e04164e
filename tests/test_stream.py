"""Data larger than a node's shared memory: the memory plan and its refusal, the stream's seeded order, the batch
paths against the resident one, and evolution runs through shard and stream over real MPI ranks and HDF5 files."""
from __future__ import annotations

import json
import random
import types
from pathlib import Path

import numpy as np
import pytest

from galapagos.datashare.budget import memory_plan
from galapagos.datashare.format import inspect
from galapagos.datashare.plan import DataShareError, dataset_plan, split_arrays
from galapagos.datashare.stream import ChunkStream, chunk_order, partial_plan
from galapagos.datashare.write import write_dataset
from galapagos.evolve.batches import DataAccess, HostRows
from galapagos.evolve.problem import Problem
from galapagos.evolve.space import SearchSpace
from galapagos.evolve.train import TrainConfig, TrainTask, train_task
from tests.mpirun import REPO, describe_run, run_mpi
from tests.test_evolve_run import SMALL, galapagos, journal

# 1300 train samples of 1x16x16 float32 (about 1.3 MiB) and no val split (10% carved): bigger than 1 MiB of shared
# memory; val (130 samples) fits, and so does half the train split (a shard of two nodes).
LIMIT_MIB = 1


@pytest.fixture(scope="module")
def big_file(tmp_path_factory) -> Path:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1300, 1, 16, 16)).astype(np.float32)
    y = (x[:, 0, :8].mean(axis=(1, 2)) > 0).astype(np.int64)
    x[np.arange(1300), 0, 0, 0] += 3 * y  # a signal to learn
    path = tmp_path_factory.mktemp("data") / "big.h5"
    write_dataset(path, {"train": (x, y)}, task="classification", num_classes=2)
    return path


def _arrays(plan, memory) -> dict:
    """What the shared copy of a plan holds, read here in one process (the file's arrays, the in-memory ones)."""
    import h5py
    out = dict(memory)
    with h5py.File(plan.path) as f:
        for s in plan.sources:
            if s.dataset is not None:
                out[s.name] = f[s.dataset][:].astype(s.dtype)
    return out


def test_auto_picks_resident_when_it_fits(big_file):
    plan = memory_plan(inspect(big_file), "auto", workers=2, limit_mib=64)
    assert plan.mode == "resident"
    assert plan.needs["resident"][0] == 1300 * (1024 + 8) + 8 * 1300  # both splits' rows and the carved indices


def test_the_plan_counts_dense_targets_per_pixel(tmp_path):
    from galapagos.examples import cosmoflow_field, shapes_seg

    seg, field = tmp_path / "seg.h5", tmp_path / "field.h5"
    shapes_seg.generate(seg, samples=100, size=12, seed=0)  # train 70, val 15: 1x12x12 float32, int64 per pixel
    cosmoflow_field.generate(field, samples=100, size=4, seed=0)  # 1x4x4x4 float32, 2 float32 per voxel
    assert memory_plan(inspect(seg), "auto", limit_mib=64).needs["resident"][0] == (70 + 15) * (144 * 4 + 144 * 8)
    assert memory_plan(inspect(field), "auto", limit_mib=64).needs["resident"][0] == (70 + 15) * (64 * 4 + 128 * 4)
    for mode in ("shard", "stream"):  # and the shard and stream plans share y with its per-pixel shape
        shapes = {s.name: s.shape for s in partial_plan(str(seg), mode)[0].sources}
        assert shapes["val/y"] == (15, 12, 12) and shapes.get("train/y", (70, 12, 12)) == (70, 12, 12)


def test_auto_streams_past_the_limit_and_shards_over_nodes(big_file):
    info = inspect(big_file)
    assert memory_plan(info, "auto", workers=2, nodes=1, limit_mib=LIMIT_MIB).mode == "stream"
    assert memory_plan(info, "auto", workers=2, nodes=2, limit_mib=LIMIT_MIB).mode == "shard"


def test_a_mode_that_does_not_fit_is_refused_with_the_numbers(big_file, monkeypatch):
    monkeypatch.setenv("GALAPAGOS_SHM_LIMIT_MIB", str(LIMIT_MIB))
    with pytest.raises(DataShareError) as err:
        memory_plan(inspect(big_file), "resident", workers=2)
    msg = str(err.value)
    assert "data.mode resident does not fit" in msg and "resident 1.29 MiB shared" in msg
    assert "1.00 MiB of shared memory" in msg
    assert "GALAPAGOS_SHM_LIMIT_MIB" in msg and "\n" not in msg


def test_evolve_refuses_before_any_rank_starts(big_file, tmp_path):
    proc = galapagos("evolve", "--data", big_file, "--out", tmp_path / "run", "--evaluations", 2, "--workers", 1,
                     "--set", "data.mode=\"resident\"", "--set", f"data.shm_limit_mib={LIMIT_MIB}", timeout=60)
    assert proc.returncode == 2, describe_run(proc)
    assert "data.mode resident does not fit: per node" in proc.stderr, describe_run(proc)
    assert "resident 1.29 MiB shared" in proc.stderr and "stream 132.29 KiB shared" in proc.stderr, describe_run(proc)
    assert not (tmp_path / "run" / "results.jsonl").exists()


def test_an_unknown_mode_names_the_key():
    from galapagos.evolve.errors import ConfigError
    from galapagos.flows.datamode import DataConfig
    with pytest.raises(ConfigError, match=r"^data.mode: expected one of auto, resident, shard, stream, got 'huge'$"):
        DataConfig.from_dict({"mode": "huge"})


def test_the_memory_plan_counts_the_batch_jobs_nodes(tmp_path, monkeypatch):
    from galapagos.flows.datamode import worker_nodes

    for var in ("GALAPAGOS_RANKS_PER_NODE", "SLURM_JOB_NUM_NODES", "FLUX_JOB_NNODES", "PBS_NODEFILE"):
        monkeypatch.delenv(var, raising=False)
    assert worker_nodes(8) == 1  # nothing said: the cautious plan
    nodefile = tmp_path / "nodes"
    nodefile.write_text("x1\nx1\nx2\nx3\n")  # PBS: one line per slot
    monkeypatch.setenv("PBS_NODEFILE", str(nodefile))
    assert worker_nodes(8) == 3
    monkeypatch.setenv("FLUX_JOB_NNODES", "5")
    assert worker_nodes(8) == 5
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "4")
    assert worker_nodes(8) == 4
    assert worker_nodes(8, setting=2) == 2


def test_stream_order_is_seeded_and_covers_every_training_row_once(big_file):
    plan, memory, info, spec = partial_plan(str(big_file), "stream", chunk_rows=100, depth=2)
    keep = memory["train/keep"]
    orders = [[(s, tuple(r)) for s, r in chunk_order(spec.rows, 100, seed, keep)] for seed in (7, 7, 8)]
    assert orders[0] == orders[1] and orders[0] != orders[2]
    rows = np.concatenate([s + np.array(r, int) for s, r in orders[0]])
    assert sorted(rows) == list(np.flatnonzero(keep)) and info.splits == {"train": 1170, "val": 130}
    import h5py
    with h5py.File(big_file) as f:
        x = f["train/x"][:]
    stream = ChunkStream(spec, keep, np.float32, np.int64)
    got = np.concatenate([c for c, _ in stream.epoch(7)])
    assert np.array_equal(got, x[rows])  # the chunks read are the rows of that order, in it


def _train(arrays: dict, info, access: DataAccess | None) -> tuple[dict, dict]:
    ctx = types.SimpleNamespace(data=arrays, device="cpu", cache={}, report=None)
    problem = Problem.of_dataset(info)
    genome = SearchSpace(max_layers=3, channels=(4, 8), units=(16,)).random_genome(random.Random(1), problem)
    out = train_task(TrainTask(genome, problem, TrainConfig(epochs=2), seed=5, data=access), ctx)
    return out, ctx.cache["tensors"]


def test_batches_from_the_host_train_like_the_resident_split(big_file):
    """The GPU fallback's path (rows gathered on the host, then copied) on the CPU, without pinning."""
    plan, memory, info = dataset_plan(str(big_file))
    arrays = _arrays(plan, memory)
    resident, _ = _train(arrays, info, None)
    batched, tensors = _train(arrays, info, DataAccess(device="batches"))
    assert isinstance(tensors["train"][0], HostRows)
    assert batched["fitness"] == resident["fitness"]
    assert batched["metrics"]["train_loss"] == pytest.approx(resident["metrics"]["train_loss"], rel=1e-5)


def test_a_stream_trains_on_every_training_row_and_the_same_val(big_file):
    plan, memory, info, spec = partial_plan(str(big_file), "stream", chunk_rows=128, depth=2)
    arrays = _arrays(plan, memory)
    out, tensors = _train(arrays, info, DataAccess(spec))
    assert tensors["train"][0].shape == (1170, 1, 16, 16) and len(tensors["val"][1]) == 130
    resident = split_arrays(_arrays(*dataset_plan(str(big_file))[:2]), ("val",))["val"]
    assert np.array_equal(tensors["val"][0].numpy(), resident.x[resident.index])  # val as in the resident mode
    assert 0 <= out["fitness"] <= 1 and out["metrics"]["epochs"] == 2


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["shard", "stream"])
def test_evolution_past_the_shared_memory_limit(big_file, tmp_path, mode):
    """Two workers, each on a "node" of its own; 1 MiB of shared memory each: auto picks shard (stream: asked)."""
    out = tmp_path / "run"
    asked = ["--set", "data.mode=\"stream\"", "--set", "data.chunk_mib=1"] if mode == "stream" else []
    proc = run_mpi(3, ["-m", "galapagos.cli", "evolve", "--data", big_file, "--out", out, "--evaluations", 4,
                       *SMALL, *asked], timeout=300,
                   env={"GALAPAGOS_RANKS_PER_NODE": "1", "GALAPAGOS_SHM_LIMIT_MIB": str(LIMIT_MIB)})
    assert proc.returncode == 0, describe_run(proc)
    assert f"data: {mode} mode" in (out / "log" / "master.log").read_text()
    records = journal(out)
    assert len(records) == 4 and {r["rank"] for r in records} <= {1, 2}
    assert all(r["status"] in ("ok", "pruned") and "val_accuracy" in r["metrics"] for r in records), records
    assert sorted(p.name for p in (out / "best").iterdir()) == ["genome.json", "metrics.json", "model.pt"]
    assert json.loads((out / "best" / "metrics.json").read_text())["fitness"] == max(r["fitness"] for r in records)


@pytest.mark.mpi
def test_node_requests_split_the_rows_over_the_nodes_that_ask():
    proc = run_mpi(4, [REPO / "tests" / "mpi_scripts" / "node_rows.py"], timeout=120,
                   env={"GALAPAGOS_RANKS_PER_NODE": "1"})
    assert proc.returncode == 0 and "NODE_ROWS_OK" in proc.stdout, describe_run(proc)
