"""Ensembles end to end over real MPI ranks: design (evolve + ensemble + report), ensemble from a run, a crashed
member, --resume, and bad inputs refused before any rank starts."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from galapagos import cli
from galapagos.ensemble.members import SEED_BASE, choose_members
from galapagos.errors import RunDirError
from galapagos.examples import shapes
from galapagos.models import load_network
from galapagos.store.ensembledir import EnsembleDir, EnsembleError, load_manifest
from galapagos.store.journal import JournalRecord
from tests.mpirun import describe_run, run_mpi
from tests.test_evolve_run import SMALL, galapagos, journal

TINY = [*SMALL, "--set", "train.epochs=1", "--set", "space.max_layers=3"]


@pytest.fixture(scope="module")
def shapes_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "shapes.h5"
    shapes.generate(path, samples=480, size=12, seed=2)
    return path


@pytest.fixture(scope="module")
def design(shapes_file, tmp_path_factory) -> tuple[Path, str]:
    """One `galapagos design` run (self-started, 2 workers): an evolution run with its ensemble, for every test."""
    out = tmp_path_factory.mktemp("design") / "run"
    proc = galapagos("design", "--data", shapes_file, "--out", out, "--workers", 2, "--evaluations", 4,
                     "--members", 3, *TINY, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, proc.stdout


def _record(i: int, fitness: float | None, key: str, status: str = "ok") -> JournalRecord:
    return JournalRecord(i, {"k": key}, status, fitness, key=key)


# -- the plan of members (no MPI) --------------------------------------------------------------------------------
def test_members_by_strategy():
    records = [_record(0, 0.5, "a"), _record(1, 0.9, "b"), _record(2, None, "c", "failed"), _record(3, 0.7, "d"),
               _record(4, 0.6, "e", "pruned")]
    distinct = choose_members(records, members=4, strategy="distinct", seed=0, run="r")
    assert [s.key for s in distinct] == ["b", "d", "a", "b"]  # best first; filled by retraining the best again
    assert [s.origin["kind"] for s in distinct] == ["distinct"] * 3 + ["reseed"]
    seeds = choose_members(records, members=3, strategy="seeds", seed=0)
    assert {s.key for s in seeds} == {"b"} and [s.origin["id"] for s in seeds] == [1, 1, 1]
    mixed = choose_members(records, members=5, strategy="mixed", seed=0)
    assert [s.key for s in mixed] == ["b", "d", "a", "b", "b"]
    for plan in (distinct, seeds, mixed):
        assert len({s.seed for s in plan}) == len(plan) and all(s.seed >= SEED_BASE for s in plan)
        assert len({s.name for s in plan}) == len(plan)
    with pytest.raises(ValueError, match="no evaluation finished"):
        choose_members([_record(0, None, "a", "crashed")], members=8, strategy="mixed", seed=0)


def test_kept_members_are_the_best_kept_networks():
    records = [_record(0, 0.5, "a"), _record(1, 0.9, "b"), _record(2, 0.8, "c"), _record(3, 0.7, "d"),
               _record(4, 0.95, "b"), _record(5, 0.6, "e", "pruned")]
    kept = choose_members(records, members=3, strategy="kept", seed=0, run="r", kept={0, 1, 2, 4, 5},
                          search_seed=7)
    assert [s.origin["id"] for s in kept] == [4, 2, 0]  # best first, one per genome, only those with weights
    assert {s.origin["kind"] for s in kept} == {"kept"} and [s.seed for s in kept] == [7 * 1_000_003 + i
                                                                                       for i in (4, 2, 0)]
    assert len(choose_members(records, members=16, strategy="kept", seed=0, kept={1, 3})) == 2  # as many as kept
    with pytest.raises(ValueError, match="no finished evaluation's weights are kept"):
        choose_members(records, members=4, strategy="kept", seed=0, kept={5})


def test_a_finished_network_stands_for_its_genome_in_the_kept_plan():
    """Finished at the end of the budget (galapagos/flows/finish.py), a network's longest-trained weights are its
    member, even where its parent scored higher in validation (an optimistic score, chosen among many)."""
    records = [_record(0, 0.9, "a"), _record(1, 0.8, "b"), _record(2, 0.7, "c"),
               *(r._replace(origin="finish") for r in (_record(3, 0.85, "a"), _record(4, 0.88, "b"),
                                                       _record(5, 0.95, "c", "failed")))]
    kept = choose_members(records, members=3, strategy="kept", seed=0, kept={0, 1, 2, 3, 4, 5})
    assert [s.origin["id"] for s in kept] == [4, 3, 2]  # a by 3 (not 0), b by 4; c's finishing failed: c by 2
    assert [s.origin["id"] for s in choose_members(records, members=3, strategy="kept", seed=0, kept={0, 1, 4})] \
        == [0, 4]  # a finished network without weights kept stands for nothing


# -- design, and an ensemble from its run --------------------------------------------------------------------------
def test_design_end_to_end(design, shapes_file):
    out, stdout = design
    assert len(journal(out)) == 4 and (out / "best" / "model.pt").exists()
    report = json.loads((out / "report.json").read_text())
    assert report["split"] == "test" and report["task"] == "classification"
    for key in ("best_single", "ensemble_metrics", "best_member"):
        assert set(report[key]) >= {"accuracy", "nll", "ece"}, key
    assert len(report["members"]) == 3 and report["status"] == {"ok": 3}
    manifest = load_manifest(out / "ensemble")
    assert sum(m.weight for m in manifest.used) == pytest.approx(1.0)
    assert "design report on test" in stdout and "best single network" in stdout and "ensemble" in stdout
    # the ensemble's members were trained longer than the search's candidates (twice train.epochs)
    assert all(r["metrics"]["epochs"] == 2 for r in journal(out / "ensemble"))


def test_ensemble_from_a_run_and_resume(design, shapes_file, tmp_path):
    run, _ = design
    out = tmp_path / "ens"
    args = ["-m", "galapagos.cli", "ensemble", "--from", run, "--data", shapes_file, "--out", out, "--members", 4,
            "--strategy", "distinct", "--set", "ensemble.max_rounds=10"]
    proc = run_mpi(3, args, timeout=180)
    assert proc.returncode == 0, describe_run(proc)
    records = journal(out)
    assert len(records) == 4 and all(r["status"] == "ok" for r in records)
    assert {r["rank"] for r in records} <= {1, 2} and len({r["seed"] for r in records}) == 4
    evaluated = {r["key"] for r in journal(run) if r["status"] == "ok"}
    assert {r["key"] for r in records} <= evaluated
    manifest = load_manifest(out)
    assert [m.name for m in manifest.members] == [r["name"] for r in sorted(records, key=lambda r: r["id"])]
    assert sum(m.weight for m in manifest.members) == pytest.approx(1.0)
    assert manifest.selection["trace"] == sorted(manifest.selection["trace"], reverse=True)
    assert len(manifest.selection["picks"]) <= 10
    for m in manifest.members:
        saved = json.loads((EnsembleDir(out).member(m.name) / "metrics.json").read_text())
        assert set(saved) >= {"problem", "fitness", "metrics", "params", "seed", "origin"} and saved["seed"] == m.seed
        _, genome, problem = load_network(EnsembleDir(out).member(m.name))  # a member directory is a network directory
        assert problem == manifest.problem and genome.key == saved["key"]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["selection"]["ensemble"] <= metrics["selection"]["single_best"]  # never worse than one member
    assert metrics["val"]["ensemble"]["nll"] == pytest.approx(metrics["selection"]["ensemble"])
    for split in ("val", "test"):
        assert set(metrics[split]["members"]) == {m.name for m in manifest.members}
        assert set(metrics[split]["ensemble"]) >= {"accuracy", "nll", "ece"}
    assert "selection on val" in proc.stdout and "test (" in proc.stdout

    # an interrupted build: the last member's line and files are gone, and no manifest was written
    lines = (out / "results.jsonl").read_text().splitlines(keepends=True)
    last = json.loads(lines[-1])
    (out / "results.jsonl").write_text("".join(lines[:-1]))
    shutil.rmtree(EnsembleDir(out).member(last["name"]))
    (out / "ensemble.json").unlink()
    proc = run_mpi(3, ["-m", "galapagos.cli", "ensemble", "--from", run, "--data", shapes_file, "--out", out,
                       "--resume"], timeout=180)
    assert proc.returncode == 0, describe_run(proc)
    again = journal(out)
    assert again[:3] == [json.loads(line) for line in lines[:-1]]  # finished members kept, not retrained
    assert len(again) == 4 and again[3]["name"] == last["name"] and again[3]["seed"] == last["seed"]
    assert "training 1 of 4" in proc.stderr
    assert len(load_manifest(out).members) == 4


def test_a_crashed_member_is_recorded_and_the_rest_make_the_ensemble(design, shapes_file, tmp_path):
    run, _ = design
    out = tmp_path / "ens"
    proc = run_mpi(3, ["-m", "galapagos.cli", "ensemble", "--from", run, "--data", shapes_file, "--out", out,
                       "--members", 3, "--set", "run.task='tests.faulty_tasks:aborts_task_1'"], timeout=180)
    assert proc.returncode == 0, describe_run(proc)
    by_id = {r["id"]: r for r in journal(out)}
    assert by_id[1]["status"] == "crashed" and "SIGABRT" in by_id[1]["error"] and by_id[1]["fitness"] is None
    assert by_id[0]["status"] == by_id[2]["status"] == "ok"
    manifest = load_manifest(out)
    crashed = [m for m in manifest.members if m.name == by_id[1]["name"]]
    assert crashed and crashed[0].status == "crashed" and crashed[0].weight == 0
    assert not EnsembleDir(out).member(by_id[1]["name"]).exists()
    assert {m.name for m in manifest.used} <= {by_id[0]["name"], by_id[2]["name"]}
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["test"]["members"]) == {by_id[0]["name"], by_id[2]["name"]}
    assert metrics["status"] == {"ok": 2, "crashed": 1}


def test_an_ensemble_of_the_kept_networks_trains_nothing(design, shapes_file, tmp_path, capsys, monkeypatch):
    """--strategy kept, started without MPI: the run's kept weights as the members, in this process; --resume
    places only what is missing; under a launcher the workers are stopped at once."""
    from galapagos.flows import mpijob
    from galapagos.store.rundir import RunDir

    def no_ranks(*args, **kwargs):
        raise AssertionError("the kept strategy started ranks")

    monkeypatch.setattr(mpijob, "start_ranks", no_ranks)
    run, _ = design
    out = tmp_path / "kept"
    argv = ["ensemble", "--from", run, "--data", shapes_file, "--out", out, "--strategy", "kept", "--members", 3]
    assert cli.main([str(a) for a in argv]) == 0
    assert "selection on val" in capsys.readouterr().out
    search = {r["id"]: r for r in journal(run)}
    records = journal(out)
    best = sorted((r for r in search.values() if r["status"] == "ok"), key=lambda r: -r["fitness"])[:3]
    assert [r["origin"]["id"] for r in records] == [r["id"] for r in best]
    metrics = json.loads((out / "metrics.json").read_text())
    for record in records:
        source = search[record["origin"]["id"]]
        assert record["status"] == "ok" and record["rank"] == 0 and record["fitness"] == source["fitness"]
        member = EnsembleDir(out).member(record["name"])
        weights = Path(RunDir(run).model_path(source["id"]))
        assert (member / "model.pt").read_bytes() == weights.read_bytes()
        assert (member / "model.pt").stat().st_ino == weights.stat().st_ino  # a hard link: no room taken
        # the weights the search scored: their validation accuracy is the search's fitness
        assert metrics["val"]["members"][record["name"]]["accuracy"] == pytest.approx(source["fitness"], abs=1e-6)
    assert metrics["selection"]["ensemble"] <= metrics["selection"]["single_best"]
    assert json.loads((out / "plan.json").read_text())[0]["origin"]["kind"] == "kept"

    lines = (out / "results.jsonl").read_text().splitlines(keepends=True)
    (out / "results.jsonl").write_text("".join(lines[:-1]))
    shutil.rmtree(EnsembleDir(out).member(json.loads(lines[-1])["name"]))
    assert cli.main([str(a) for a in ["ensemble", "--from", run, "--data", shapes_file, "--out", out,
                                      "--resume"]]) == 0
    again = journal(out)
    assert again[:2] == [json.loads(line) for line in lines[:-1]] and len(again) == 3
    assert len(load_manifest(out).members) == 3

    proc = run_mpi(3, ["-m", "galapagos.cli", *map(str, [*argv[:6], tmp_path / "under-mpi", *argv[7:]])],
                   timeout=120)
    assert proc.returncode == 0, describe_run(proc)
    assert [r["origin"]["id"] for r in journal(tmp_path / "under-mpi")] == [r["id"] for r in best]


def test_a_kept_ensemble_by_bagged_selection_says_so_and_predicts(design, shapes_file, tmp_path, capsys):
    """ensemble.bags: the kept networks weighted by bagged selection (ensemble/selection.py); the manifest names the
    method and its bags, and predict averages the members it weighted."""
    run, _ = design
    out = tmp_path / "bagged"
    assert cli.main([str(a) for a in ["ensemble", "--from", run, "--data", shapes_file, "--out", out, "--strategy",
                                      "kept", "--members", 4, "--set", "ensemble.bags=6"]]) == 0
    manifest = load_manifest(out)
    assert manifest.selection["bags"] == 6 and manifest.selection["method"].startswith("bagged ensemble selection")
    assert sum(m.weight for m in manifest.members) == pytest.approx(1.0)
    capsys.readouterr()
    assert cli.main(["predict", "--model", str(out), "--data", str(shapes_file), "--split", "test", "--json"]) == 0
    assert 0 <= json.loads(capsys.readouterr().out)["accuracy"] <= 1


def test_a_kept_ensemble_refit_trains_its_used_members_on_train_and_val(design, shapes_file, tmp_path, capsys):
    """ensemble.refit_epochs: the same selection as without it (on the weights the search trained), then each used
    member trained on over the training and validation rows (ensemble/refit.py); the weights selection chose stay as
    fit.pt, the run's models/ untouched; val's scores are the selection's, test's the refit members'; --resume
    selects on the weights before the refit again."""
    from galapagos.datashare.format import load
    from galapagos.ensemble.selection import combine
    from galapagos.models import predict_outputs
    from galapagos.store.rundir import RunDir

    run, _ = design
    kept = ["ensemble", "--from", run, "--data", shapes_file, "--strategy", "kept", "--members", 3]
    assert cli.main([str(a) for a in [*kept, "--out", tmp_path / "plain"]]) == 0
    out = tmp_path / "refit"
    argv = [*kept, "--out", out, "--set", "ensemble.refit_epochs=2", "--set", "ensemble.refit_lr=0.5"]
    capsys.readouterr()
    assert cli.main([str(a) for a in argv]) == 0
    printed = capsys.readouterr().out
    assert "trained on for 2 epoch(s) on train and val" in printed and "test before the refit: ensemble" in printed
    plain, metrics = (json.loads((d / "metrics.json").read_text()) for d in (tmp_path / "plain", out))
    assert metrics["selection"] == plain["selection"] and metrics["weights"] == plain["weights"]
    assert metrics["val"] == plain["val"]  # scored before the refit: the refit trains on val
    used = sorted(name for name, w in metrics["weights"].items() if w > 0)
    refit = metrics["refit"]
    assert sorted(refit["members"]) == used and refit["epochs"] == 2 and refit["lr"] == 0.5
    _, splits = load(shapes_file, ("train", "val", "test"))
    assert {m["rows"] for m in refit["members"].values()} == {len(splits["train"][1]) + len(splits["val"][1])}
    assert refit["test_before"] == plain["test"]["ensemble"]
    origin = {r["name"]: r["origin"]["id"] for r in journal(out)}
    manifest = load_manifest(out)
    for name in metrics["weights"]:
        member, source = EnsembleDir(out).member(name), Path(RunDir(run).model_path(origin[name]))
        if name in used:  # fit.pt: the run's file, a second name; model.pt: new weights
            assert (member / "fit.pt").stat().st_ino == source.stat().st_ino
            assert (member / "model.pt").read_bytes() != source.read_bytes()
        else:
            assert not (member / "fit.pt").exists() and (member / "model.pt").stat().st_ino == source.stat().st_ino
    x, y = splits["test"]
    preds = [predict_outputs(load_network(EnsembleDir(out).member(m.name))[0], x, manifest.problem)
             for m in manifest.used]
    probs = combine(preds, [m.weight for m in manifest.used])
    assert -np.log(probs[np.arange(len(y)), y]).mean() == pytest.approx(metrics["test"]["ensemble"]["nll"], rel=1e-5)
    assert metrics["test"]["ensemble"] != plain["test"]["ensemble"]

    (out / "metrics.json").unlink()  # a build cut short after its refit: --resume selects on fit.pt's weights again
    assert cli.main([str(a) for a in ["ensemble", "--from", run, "--data", shapes_file, "--out", out, "--resume"]]) == 0
    again = json.loads((out / "metrics.json").read_text())
    assert again["selection"] == plain["selection"] and again["val"] == plain["val"]
    assert again["test"]["ensemble"]["nll"] == pytest.approx(metrics["test"]["ensemble"]["nll"], rel=1e-5)
    for name in used:
        assert (EnsembleDir(out).member(name) / "fit.pt").stat().st_ino == \
            Path(RunDir(run).model_path(origin[name])).stat().st_ino


def test_bench_refit_pairs_a_run_before_and_after_its_refit(design, tmp_path, capsys):
    """bench/refit.py: a run's kept ensemble rebuilt with the refit, its test score before (the run's final/'s)
    and after; the report pairs them, per set where there are several, and --table-only reports a results file."""
    from bench.refit import main, refit_run

    run, _ = design
    row = refit_run(run, 1, 0.5)
    final = json.loads((run / "final" / "metrics.json").read_text())
    assert row["before"] == round(final["test"]["ensemble"]["accuracy"], 4) and row["epochs"] == 1
    assert row["refit"] == sum(w > 0 for w in final["weights"].values()) and row["seconds"] >= 0
    rows = [{**row, "ensemble": f"k/{d}-evolution-ensemble-{i}/final", "before": b, "after": a}
            for d, i, b, a in [("signals-clean", 0, 0.98, 0.99), ("signals-permuted", 0, 0.5, 0.51),
                               ("signals-clean", 1, 0.97, 0.96)]]
    results = tmp_path / "refit.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    main(["--results", str(results), "--table-only"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == f"| signals-clean-evolution-ensemble-0 | {row['refit']} | {row['seconds']} | 0.9800 | 0.9900 |"
    assert lines[5].startswith("refit - before: mean +0.0033") and "2 ahead, 1 behind" in lines[5]
    assert lines[6].startswith("  signals-clean: 2 pairs, mean difference +0.0000")
    with pytest.raises(SystemExit):
        main(["--table-only"])


def test_a_stop_signal_to_rank_0s_process_group_leaves_the_final_build_to_finish(design, shapes_file, tmp_path):
    """A launcher passes a stop signal on to rank 0's process group; one that comes as the search ends, while the
    final ensemble builds (seconds inside the budget), stops nothing more: the build runs in a session of its own.
    Here a process like rank 0 (catching stop signals) builds it, and its process group gets SIGUSR1 a second in."""
    import subprocess
    import sys

    run, _ = design
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    script = f"""
import json, os, signal, threading, time
from galapagos.config import load_config
from galapagos.flows.evolution import final_ensemble
from galapagos.launch.signals import catch_stop_signals
from galapagos.store.rundir import RunDir
catch_stop_signals()
threading.Thread(target=lambda: (time.sleep(1.0), os.killpg(0, signal.SIGUSR1)), daemon=True).start()
made = final_ensemble(RunDir({str(copy)!r}), load_config({str(copy / "config.toml")!r}), {str(shapes_file)!r})
print(json.dumps(made))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          start_new_session=True)  # its own process group: the signal reaches nothing else
    assert proc.returncode == 0, proc.stderr[-3000:]
    made = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "error" not in made and made["members"] >= 1 and (copy / "final" / "metrics.json").is_file()


def test_kept_weights_gone_are_a_clear_error(design, shapes_file, tmp_path, capsys):
    from galapagos.flows.ensembling import build_kept, prepare

    run, _ = design
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    job = prepare(copy, shapes_file, tmp_path / "ens", overrides={"ensemble.strategy": "kept"})
    for f in (copy / "models").glob("*.pt"):
        f.unlink()
    with pytest.raises(RunDirError, match="are no longer in"):
        build_kept(job)
    code = cli.main([str(a) for a in ["ensemble", "--from", copy, "--data", shapes_file, "--out", tmp_path / "e2",
                                      "--strategy", "kept"]])
    assert code == 2 and "no finished evaluation's weights are kept" in capsys.readouterr().err


def test_no_member_trained_is_a_clear_error(design, shapes_file, tmp_path):
    from galapagos.flows.ensembling import finish, prepare

    run, _ = design
    job = prepare(run, shapes_file, tmp_path / "ens", overrides={"ensemble.members": 2})
    failed = [JournalRecord(i, s.genome, "crashed", name=s.name) for i, s in enumerate(job.specs)]
    with pytest.raises(EnsembleError, match="no ensemble member trained successfully .crashed 2."):
        finish(job, failed)


def test_the_job_folder_of_launch_is_no_obstacle(design, shapes_file, tmp_path):
    """`galapagos launch -- galapagos ensemble --out DIR` writes DIR/job/ (script, settings) before the job runs."""
    from galapagos.flows.ensembling import prepare

    run, _ = design
    (tmp_path / "ens" / "job").mkdir(parents=True)
    assert len(prepare(run, shapes_file, tmp_path / "ens", overrides={"ensemble.members": 2}).specs) == 2


# -- bad inputs, refused before any rank starts (in this process: the checks run before self-start) ---------------
def test_bad_inputs_fail_clearly(design, shapes_file, tmp_path, capsys):
    run, _ = design
    other = tmp_path / "other.h5"
    shapes.generate(other, samples=60, size=14, seed=0)
    base = ["ensemble", "--data", shapes_file, "--workers", "1"]
    cases = [
        ([*base, "--from", tmp_path / "nope", "--out", tmp_path / "e"], "no results.jsonl"),
        (["ensemble", "--data", other, "--from", run, "--out", tmp_path / "e"], "does not match the run"),
        ([*base, "--from", run, "--out", tmp_path / "e", "--members", "0"], "--members 0"),
        ([*base, "--from", run, "--out", run], "not empty"),
        ([*base, "--from", run, "--out", tmp_path / "e", "--resume"], "no ensemble build to resume"),
        ([*base, "--from", run, "--out", tmp_path / "e", "--set", "ensemble.strategy='best'"], "ensemble.strategy"),
        (["design", "--data", shapes_file, "--out", tmp_path / "d", "--evaluations", "2", "--members", "0"],
         "--members 0"),
        (["design", "--data", shapes_file, "--out", run, "--evaluations", "2"], "already holds a run"),
    ]
    for argv, words in cases:
        code = cli.main([str(a) for a in argv])
        err = capsys.readouterr().err
        assert code == 2, (argv, err)
        assert words in err and f"galapagos {argv[0]}: error:" in err, (argv, err)
    assert not (tmp_path / "e").exists() and not (tmp_path / "d").exists()


def test_selection_weights_reproduce_the_saved_metrics(design, shapes_file):
    """The manifest's weights applied to the members' own predictions give the saved ensemble metrics."""
    from galapagos.datashare.format import load
    from galapagos.ensemble.metrics import classification_metrics
    from galapagos.models import predict_outputs

    run, _ = design
    ens = run / "ensemble"
    manifest = load_manifest(ens)
    _, splits = load(shapes_file, ("test",))
    x, y = splits["test"]
    preds = [predict_outputs(load_network(ens / "members" / m.name)[0], x, manifest.problem) for m in manifest.used]
    probs = np.tensordot(np.array([m.weight for m in manifest.used]), np.stack(preds), axes=1)
    saved = json.loads((ens / "metrics.json").read_text())["test"]["ensemble"]
    assert classification_metrics(probs, y)["nll"] == pytest.approx(saved["nll"], rel=1e-6)


def test_selection_rules_reweight_a_built_ensemble(design, shapes_file, tmp_path):
    """bench/selection_rules.py: its greedy rule reproduces the built ensemble's test score, uniform weights every
    member, bagged only members it picked; and the paired report names each rule against greedy."""
    from bench.selection_rules import compare_rules, report

    run, _ = design
    out = tmp_path / "kept"
    argv = ["ensemble", "--from", run, "--data", shapes_file, "--out", out, "--strategy", "kept", "--members", 3]
    assert cli.main([str(a) for a in argv]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    row = compare_rules(out)
    assert row["greedy"] == round(metrics["test"]["ensemble"]["accuracy"], 4)
    assert row["greedy_used"] == sum(w > 0 for w in metrics["weights"].values())
    assert row["members"] == row["uniform_used"] == 3 and 1 <= row["bagged_used"] <= 3
    lines = report([{**row, "greedy": 0.9, "uniform": 0.91, "bagged": 0.9},
                    {**row, "greedy": 0.8, "uniform": 0.8, "bagged": 0.79}]).splitlines()
    assert len(lines) == 6
    assert lines[-2].startswith("uniform - greedy: mean +0.0050") and "1 ahead, 0 behind" in lines[-2]
    assert lines[-1].startswith("bagged - greedy: mean -0.0050") and "p = 1.0000" in lines[-1]


def test_selection_rules_table_only_reports_a_results_file(tmp_path, capsys):
    """`--table-only` reports the rows already in --results, comparing nothing; without a file it says what it needs."""
    from bench.selection_rules import main

    row = {"ensemble": "a/final", "members": 4, "greedy": 0.9, "greedy_used": 2, "uniform": 0.92, "uniform_used": 4,
           "bagged": 0.9, "bagged_used": 3}
    results = tmp_path / "selection.jsonl"
    results.write_text(json.dumps(row) + "\n" + json.dumps({**row, "ensemble": "b/final", "uniform": 0.89}) + "\n")
    main(["--results", str(results), "--table-only"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("| a/final | 4 | 0.9000 (2) | 0.9200 (4) |") and len(lines) == 10
    assert lines[4].startswith("uniform - greedy: mean +0.0050") and "1 ahead, 1 behind" in lines[4]
    assert lines[5:7] == ["  a: 1 pair, difference +0.0200", "  b: 1 pair, difference -0.0100"]
    # the set of a run directory bench/search.py --keep named: the dataset, even one with a hyphen in its name
    runs = [{**row, "ensemble": f"k/{d}-evolution-ensemble-{s}/final", "uniform": u}
            for d, s, u in [("pulses-permuted", 0, 0.91), ("pulses", 0, 0.9), ("pulses-permuted", 1, 0.93)]]
    results.write_text("".join(json.dumps(r) + "\n" for r in runs))
    main(["--results", str(results), "--table-only"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[6:8] == ["  pulses-permuted: 2 pairs, mean difference +0.0200 (95% bootstrap interval +0.0100 to "
                          "+0.0300)", "  pulses: 1 pair, difference +0.0000"]
    for argv in (["--table-only"], ["--results", str(tmp_path / "none.jsonl"), "--table-only"], []):
        with pytest.raises(SystemExit):
            main(argv)
    assert "--table-only" in capsys.readouterr().err


def test_a_final_build_killed_by_a_signal_is_named_and_the_run_goes_on(design, shapes_file, tmp_path, monkeypatch):
    """A build that dies of a signal (the out-of-memory killer's SIGKILL, a crash's SIGSEGV) leaves summary.json
    an error naming the signal, not an empty exit code; the run's own result is kept."""
    from galapagos.config import load_config
    from galapagos.flows.evolution import final_ensemble
    from galapagos.store.rundir import RunDir

    run, _ = design
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    dies = tmp_path / "python"
    dies.write_text("#!/bin/sh\nkill -SEGV $$\n")
    dies.chmod(0o755)
    monkeypatch.setattr("sys.executable", str(dies))  # the build's child: a process that dies of SIGSEGV
    made = final_ensemble(RunDir(copy), load_config(copy / "config.toml"), str(shapes_file))
    assert made == {"error": "killed by SIGSEGV"} and not (copy / "final").exists()
    assert any((copy / "models").glob("*.pt"))
