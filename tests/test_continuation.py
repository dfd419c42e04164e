"""Training in parts (evolve/checkpoint.py, `until`/`resume`/`checkpoint` of a TrainTask): a candidate trained to an
epoch, checkpointed and resumed in another task trains as it would have in one go (metrics, weights, learning rate
schedule), a bad checkpoint is a clear error naming its file, a stopped task leaves none, and a task without the new
fields trains and travels as before. Real training on the CPU, small data."""
from __future__ import annotations

import pickle

import pytest
import torch

from galapagos.evolve.checkpoint import CheckpointError, load_checkpoint
from galapagos.evolve.drawn import Drawn
from galapagos.evolve.problem import Problem
from galapagos.evolve.task import TrainConfig, TrainTask
from galapagos.evolve.train import train_candidate, train_task
from galapagos.launch.protocol import Status, Task
from tests.test_engine import IMAGE, SPACE
from tests.test_spread import GENOME, PROBLEM, Here, group, until_result
from tests.test_train import blobs, genome

SHAPE = (1, 8, 8)
# batch norm and dropout: the resumed part must go on with the running statistics and the random generators too
LAYERS = [{"type": "conv", "channels": 6, "kernel": 3, "stride": 1, "act": "relu"}, {"type": "norm", "kind": "batch"},
          {"type": "dense", "units": 16, "act": "relu"}, {"type": "dropout", "rate": 0.3}]
DATA = {"train": blobs(192, SHAPE, 3), "val": blobs(64, SHAPE, 3, seed=1)}
CONFIG = TrainConfig(epochs=4)
STEPS_PER_EPOCH = 192 // 32  # full batches of 32 (tests.test_train.genome): the schedule counts these


def train(g, **kw) -> tuple[list[dict], dict, dict]:
    reports: list[dict] = []
    summary, state = train_candidate(g, Problem(SHAPE, "classification", 3), DATA, CONFIG, seed=5,
                                     report=reports.append, **kw)
    return reports, summary, state


def same_numbers(a, b) -> None:
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_two_epochs_then_two_resumed_train_as_four_in_one_go(tmp_path):
    for optimizer in ("adam", "sgd"):  # Adam's moments, SGD's momentum and the cycled betas/momentum go on
        g = genome(LAYERS, lr=1e-2, optimizer=optimizer)
        whole, whole_summary, whole_best = train(g, checkpoint=tmp_path / f"{optimizer}-whole.pt")
        first, first_summary, _ = train(g, until=2, checkpoint=tmp_path / f"{optimizer}-2.pt")
        rest, summary, best = train(g, resume=tmp_path / f"{optimizer}-2.pt",
                                    checkpoint=tmp_path / f"{optimizer}-4.pt")
        assert [r["epoch"] for r in whole] == [1, 2, 3, 4]
        assert [r["epoch"] for r in first] == [1, 2] and [r["epoch"] for r in rest] == [3, 4]
        assert first_summary["epochs"] == 4 and first_summary["epochs_trained"] == 2
        for one, part in zip(whole, first + rest):
            same_numbers(part, one)
        assert summary["fitness"] == max(r["fitness"] for r in first + rest)  # over all epochs so far
        assert (summary["best_epoch"], summary["epochs"], summary["epochs_trained"]) == \
            (whole_summary["best_epoch"], 4, 4)
        same_numbers(summary["fitness"], whole_summary["fitness"])
        same_numbers(best, whole_best)
        end, whole_end = (load_checkpoint(tmp_path / f"{optimizer}-{name}.pt") for name in ("4", "whole"))
        same_numbers(end["model"], whole_end["model"])  # the last epoch's weights, not only the best one's
        same_numbers(end["optimizer"]["state"], whole_end["optimizer"]["state"])
        assert "epochs_trained" not in whole_summary  # a task in one go says what it always said


def one_cycle_lr(total: int, at: int) -> float:
    """The learning rate after `at` steps of a one-cycle schedule over `total`, as train.py sets it up."""
    opt = torch.optim.Adam([torch.zeros(1, requires_grad=True)], lr=1e-2)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=total, pct_start=0.15)
    for _ in range(at):
        opt.step()
        sched.step()
    return opt.param_groups[0]["lr"]


def test_the_learning_rate_schedule_goes_on_after_resuming(tmp_path):
    g = genome(LAYERS, lr=1e-2)
    total = STEPS_PER_EPOCH * 4
    train(g, until=2, checkpoint=tmp_path / "2.pt")
    train(g, resume=tmp_path / "2.pt", until=3, checkpoint=tmp_path / "3.pt")
    for name, epoch in (("2.pt", 2), ("3.pt", 3)):
        state = load_checkpoint(tmp_path / name)
        steps = STEPS_PER_EPOCH * epoch
        assert state["epoch"] == epoch and state["steps"] == total and state["scheduler"]["last_epoch"] == steps
        assert state["optimizer"]["param_groups"][0]["lr"] == pytest.approx(one_cycle_lr(total, steps), rel=1e-9)
    # stopped at epoch 2, the rate is mid-way down the cycle, and epoch 3 goes on from there: not a restart
    restarted = one_cycle_lr(total, STEPS_PER_EPOCH)
    assert load_checkpoint(tmp_path / "3.pt")["optimizer"]["param_groups"][0]["lr"] != pytest.approx(restarted)
    mid, later = (one_cycle_lr(total, k * STEPS_PER_EPOCH) for k in (2, 3))
    assert one_cycle_lr(total, total - 1) < later < mid < one_cycle_lr(total, STEPS_PER_EPOCH)  # down the cycle


def test_a_rung_decays_to_zero_and_its_promotion_goes_on_from_before_the_decay(tmp_path):
    """Warm-up, stable, decay (`cooldown`, evolve/rungs.py): a rung's rate rises, stays at the genome's and decays to
    zero by its last epoch; its checkpoint is the state where the decay starts, and a promotion from it trains as the
    network would have trained to the next rung in one go, and a training stopped in its decay leaves it too (a run
    deletes the checkpoints of the evaluations that did not finish: galapagos/flows/evolution_source.py)."""
    from galapagos.evolve.train import _schedule

    g, config = genome(LAYERS, lr=1e-2), TrainConfig(epochs=8, warmup=0.05)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1e-2)
    *_, sched = _schedule(g, config, opt, 192, None, cooldown=1, until=2)
    rates = []
    for _ in range(2 * STEPS_PER_EPOCH):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    warm = round(0.05 * 8 * STEPS_PER_EPOCH)  # 2 steps
    assert rates[0] < rates[warm - 1] == rates[STEPS_PER_EPOCH - 1] == pytest.approx(1e-2)
    decay = rates[STEPS_PER_EPOCH:]
    assert all(a > b for a, b in zip(decay, decay[1:])) and decay[-1] < 1e-2 / 20

    def run(**kw):
        reports: list[dict] = []
        summary, state = train_candidate(g, Problem(SHAPE, "classification", 3), DATA, config, seed=5,
                                         report=reports.append, **kw)
        return reports, summary, state

    rung0, summary0, _ = run(until=2, cooldown=1, checkpoint=tmp_path / "0.pt")
    state = load_checkpoint(tmp_path / "0.pt")
    assert [r["epoch"] for r in rung0] == [1, 2] and state["epoch"] == 1
    assert state["scheduler"]["last_epoch"] == STEPS_PER_EPOCH  # where the decay starts
    assert summary0["epochs_trained"] == 2
    promoted, summary1, best1 = run(resume=tmp_path / "0.pt", until=8, cooldown=6, checkpoint=tmp_path / "1.pt")
    whole, whole_summary, whole_best = run(until=8, cooldown=6)
    assert [r["epoch"] for r in promoted] == list(range(2, 9))
    for one, part in zip(whole[1:], promoted):
        same_numbers(part, one)
    same_numbers(best1, whole_best)
    assert summary1["fitness"] == whole_summary["fitness"] and load_checkpoint(tmp_path / "1.pt")["epoch"] == 6

    def stop_in_decay(metrics):
        if metrics["epoch"] == 2:
            raise Stop

    with pytest.raises(Stop):
        train_candidate(g, Problem(SHAPE, "classification", 3), DATA, config, seed=5, report=stop_in_decay, until=2,
                        cooldown=1, checkpoint=tmp_path / "stopped.pt")
    assert load_checkpoint(tmp_path / "stopped.pt")["epoch"] == 1
    for cooldown in (2, 0):
        with pytest.raises(ValueError, match=f"cooldown = {cooldown}: not between"):
            run(until=2, cooldown=cooldown)


def test_a_missing_or_garbled_checkpoint_is_an_error_naming_the_file(tmp_path):
    g = genome(LAYERS, lr=1e-2)
    missing = tmp_path / "gone.pt"
    with pytest.raises(CheckpointError, match=f"cannot resume from {missing}: no such file"):
        train(g, resume=missing)
    garbled = tmp_path / "garbled.pt"
    garbled.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match=f"cannot resume from {garbled}: not a readable checkpoint"):
        train(g, resume=garbled)
    train(g, until=1, checkpoint=tmp_path / "1.pt")
    whole = (tmp_path / "1.pt").read_bytes()
    cut = tmp_path / "cut.pt"
    cut.write_bytes(whole[:len(whole) // 2])
    with pytest.raises(CheckpointError, match=f"cannot resume from {cut}: not a readable checkpoint"):
        train(g, resume=cut)
    _, _, weights = train(g, until=1)
    torch.save(weights, tmp_path / "weights.pt")  # a state_dict, not a training checkpoint
    with pytest.raises(CheckpointError, match=f"{tmp_path / 'weights.pt'}: not a training checkpoint"):
        train(g, resume=tmp_path / "weights.pt")
    wider = genome([{**LAYERS[0], "channels": 8}, *LAYERS[1:]], lr=1e-2)
    with pytest.raises(CheckpointError, match=f"{tmp_path / '1.pt'}: it is not this candidate's"):
        train(wider, resume=tmp_path / "1.pt")
    # through the payload, as a trainer child gets it
    with pytest.raises(CheckpointError, match=str(missing)):
        train_task(TrainTask(GENOME, PROBLEM, TrainConfig(epochs=2), resume=str(missing)), Here())


class Stop(Exception):
    """What a trainer's report raises when the master prunes or cancels the candidate."""


def test_a_task_up_to_until_reports_its_epochs_and_checkpoints_a_stopped_one_does_not(tmp_path):
    g = genome(LAYERS, lr=1e-2)
    reports, summary, _ = train(g, until=2, checkpoint=tmp_path / "2.pt")
    assert [r["epoch"] for r in reports] == [1, 2] and summary["epochs_trained"] == 2
    assert load_checkpoint(tmp_path / "2.pt")["epoch"] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["2.pt"]  # written atomically: no temporary file left
    _, beyond, _ = train(g, until=9)  # past the schedule: to its end
    assert beyond["epochs_trained"] == 4

    def stop_at(epoch):
        def report(metrics):
            if metrics["epoch"] == epoch:
                raise Stop
        return report

    for resume, epoch in ((None, 1), (tmp_path / "2.pt", 3)):
        with pytest.raises(Stop):
            train_candidate(g, Problem(SHAPE, "classification", 3), DATA, CONFIG, seed=5, report=stop_at(epoch),
                            until=4, resume=resume, checkpoint=tmp_path / "stopped.pt")
        assert not (tmp_path / "stopped.pt").exists()
    with pytest.raises(ValueError, match="nothing to train"):
        train(g, until=0)
    train(g, resume=tmp_path / "2.pt", checkpoint=tmp_path / "4.pt")
    done = tmp_path / "4.pt"
    with pytest.raises(ValueError, match=rf"nothing to train: until = None \(resumed from {done} at epoch 4 of 4"):
        train(g, resume=tmp_path / "4.pt")
    reports, _, _ = train(g, resume=tmp_path / "2.pt", until=3, checkpoint=tmp_path / "2.pt")  # one file, replaced
    assert [r["epoch"] for r in reports] == [3] and load_checkpoint(tmp_path / "2.pt")["epoch"] == 3


def test_a_task_in_parts_through_the_payload_and_its_pickle(tmp_path, caplog):
    """train_task: the parts' results are those of one task in one go, a resumed task does not even look for a
    parent, and the three fields survive the pickle a task travels in (as it was for a task without them)."""
    ck, parent = str(tmp_path / "ck.pt"), str(tmp_path / "pruned-parent.pt")
    config = TrainConfig(epochs=3)
    alone = Here()
    whole = train_task(TrainTask(GENOME, PROBLEM, config, seed=2, save=str(tmp_path / "whole.pt")), alone)
    first = pickle.loads(pickle.dumps(TrainTask(GENOME, PROBLEM, config, seed=2, until=1, checkpoint=ck)))
    assert (first.until, first.resume, first.checkpoint) == (1, None, ck)
    part = Here()
    train_task(first, part)
    train_task(TrainTask(GENOME, PROBLEM, config, seed=9), Here())  # another candidate in between: nothing shared
    caplog.set_level("INFO", logger="galapagos.evolve.train")
    rest = pickle.loads(pickle.dumps(TrainTask(GENOME, PROBLEM, config, seed=2, inherit=parent, resume=ck,
                                               save=str(tmp_path / "rest.pt"))))
    out = train_task(rest, part)
    assert "inherited" not in out["metrics"] and "not inheriting" not in caplog.text  # its parent: never read
    train_task(TrainTask(GENOME, PROBLEM, config, seed=2, inherit=parent, until=1), Here())
    assert f"not inheriting {parent}" in caplog.text  # what a fresh start with that parent logs
    assert [r["epoch"] for r in part.reports] == [1, 2, 3]
    for one, two in zip(alone.reports, part.reports):
        same_numbers(two, one)
    same_numbers(out["fitness"], whole["fitness"])
    same_numbers(torch.load(tmp_path / "rest.pt"), torch.load(tmp_path / "whole.pt"))
    plain = TrainTask(GENOME, PROBLEM, config, seed=2)
    assert len(plain.__reduce__()[1]) == 5 and pickle.loads(pickle.dumps(plain)) == plain
    drawn = TrainTask(None, IMAGE, config, seed=3, drawn=Drawn(SPACE, 7, 5), until=2, checkpoint=ck)
    arrived = pickle.loads(pickle.dumps(drawn))
    assert arrived.genome is not None and (arrived.until, arrived.resume, arrived.checkpoint) == (2, None, ck)
    assert len(TrainTask(None, IMAGE, config, drawn=Drawn(SPACE, 7, 5)).__reduce__()[1]) == 5


def test_a_spread_candidate_checkpoints_from_its_leader_and_every_child_resumes(tmp_path):
    """Two trainer children (gloo on the CPU): the leader writes the checkpoint, both read it, and the resumed
    part's epochs are the one-process training's."""
    config = TrainConfig(epochs=2)
    alone = Here()
    train_task(TrainTask(GENOME, PROBLEM, config, seed=3), alone)
    ck = str(tmp_path / "spread.pt")
    workers = group()
    try:
        workers.submit(Task(1, TrainTask(GENOME, PROBLEM, config, seed=3, until=1, checkpoint=ck), 120.0))
        first, result = until_result(workers)
        assert result.status == Status.OK and result.metrics["epochs_trained"] == 1, result
        assert load_checkpoint(ck)["epoch"] == 1
        workers.submit(Task(2, TrainTask(GENOME, PROBLEM, config, seed=3, resume=ck), 120.0))
        rest, result = until_result(workers)
        assert result.status == Status.OK, result
    finally:
        workers.stop()
    assert [p.metrics["epoch"] for p in first + rest] == [1, 2]
    for spread, one in zip(first + rest, alone.reports):
        assert spread.metrics["train_loss"] == pytest.approx(one["train_loss"], rel=1e-4)
        assert spread.metrics["val_loss"] == pytest.approx(one["val_loss"], rel=1e-4)
