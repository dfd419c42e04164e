"""bench/scale.py at a small size, so that the whole-machine benchmark cannot rot: it runs the real master loop to
the end and says what it measured. No timings are checked (the machine is shared), only what the run did."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import scale
from galapagos.launch.protocol import Cancel, Status

REPO = Path(__file__).resolve().parents[1]
KEYS = {"workers", "virtual_minutes", "tasks", "master_cpu_us_per_task", "breeder_cpu_us_per_task", "utilization",
        "ramp_seconds", "steady_utilization", "stop_seconds", "steady_tasks_per_s", "master_cpu_share_steady",
        "breeder_cpu_share", "journal_lines_per_s", "master_peak_rss_mib", "by_status", "mix", "pruned_at_epoch",
        "lost"}


def test_the_mix_is_a_distribution_over_the_fates_the_master_can_meet():
    assert abs(sum(f.share for f in scale.MIX) - 1.0) < 1e-9
    pruned = [f.epochs for f in scale.MIX if f.name.startswith("pruned")]
    assert min(pruned) == scale.PRUNE_AFTER  # as short as the pruning rule allows
    assert max(pruned) < scale.EPOCHS and {f.name for f in scale.MIX} >= {"full", "crash", "timeout"}


class PruneRecording(scale.SimComm):
    """The simulation, also keeping which tasks the master pruned (the benchmark counts them by epoch only, so as
    not to hold a million ids in the process whose memory it measures)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.pruned: dict[int, int] = {}  # task id -> epochs it had reported when the master pruned it

    def _receive(self, obj, dest: int) -> None:
        if isinstance(obj, Cancel) and obj.status == Status.PRUNED:
            self.pruned[obj.id] = self.reported.get(obj.id, 0)
        super()._receive(obj, dest)


@pytest.mark.timeout(120)
def test_the_simulated_run_journals_every_task_once(tmp_path):
    out = scale.one(200, 0.3, 6.0, 0.6, keep=str(tmp_path), comm_class=PruneRecording,
                    report=lambda comm, *_: {"pruned_ids": comm.pruned})
    sent = out.pop("pruned_ids")
    assert set(out) == KEYS and out["workers"] == 200 and out["lost"] == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    ids = [r["id"] for r in records]
    assert len(ids) == len(set(ids)) == out["tasks"] > 200  # every worker finished tasks; each id journalled once
    assert sum(out["by_status"].values()) == out["tasks"]
    assert sum(out["mix"].values()) >= out["tasks"]  # drawn for every task sent, finished or still running
    # the master's own median rule pruned the candidates drawn to be pruned, each after the epoch it was drawn for,
    # and journalled each with the curve it had reported; a prune whose answer the deadline overtook is cancelled
    # with the other running tasks (not journalled: a resumed run breeds afresh)
    pruned = {r["id"]: len(r["curve"]) for r in records if r["status"] == "pruned"}
    assert out["by_status"]["pruned"] == len(pruned) > 0 and sum(out["pruned_at_epoch"].values()) == len(sent)
    assert pruned == {i: sent[i] for i in pruned} and not (sent.keys() - pruned.keys()) & set(ids)
    assert len(sent) - len(pruned) < len(pruned) // 100 + 2  # overtaken: the last moment's prunes only
    assert set(out["pruned_at_epoch"]) <= {f.epochs for f in scale.MIX if f.name.startswith("pruned")}
    assert min(pruned.values()) >= scale.PRUNE_AFTER
    assert {r["status"] for r in records} >= {"ok", "pruned"}
    assert 0 < out["utilization"] <= 1 and out["master_cpu_share_steady"] >= 0 and out["steady_tasks_per_s"] > 0


@pytest.mark.timeout(180)
def test_the_command_runs_each_scale_in_its_own_process():
    proc = subprocess.run([sys.executable, "-m", "bench.scale", "--workers", "100", "150", "--minutes", "0.2",
                           "--median", "6"], cwd=REPO, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["workers"] for r in rows] == [100, 150] and all(set(r) == KEYS and r["tasks"] > 0 for r in rows)


def test_the_start_up_model_takes_the_path_datashare_takes():
    from bench.startup_scale import data_seconds

    # 10,000 node leaders: the chain's fill, 9,998 blocks of 4 MiB, is longer than 1 GiB and shorter than 100 GiB
    assert data_seconds(1 << 30, 10_000, 1e-6, 1e-10)["data_path"] == "Bcast, depth 14"
    assert data_seconds(100 << 30, 10_000, 1e-6, 1e-10)["data_path"] == "chain"
    assert data_seconds(1 << 30, 2, 1e-6, 1e-10)["data_path"] == "chain"  # one hop: the whole piece at once
