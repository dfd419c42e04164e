"""The master's side of an ensemble build: one member per task on the workers, then selection, manifest, metrics.

Members train through the same runtime as the evolution run (supervised trainer children, time limits, crash
handling); a member that fails is recorded in DIR/results.jsonl with its status and left out, and the ensemble is
built from the rest. `--resume` reads the saved plan and the journal and trains only the members not yet finished.
"""
from __future__ import annotations

import json
import logging
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from datashare.format import DataError, inspect, load
from datashare.share import DataShareError, dataset_plan
from ensemble.members import MemberSpec, choose_members
from ensemble.selection import Selection, combine, select
from ensemble.store import EnsembleError, Manifest, Member, member_dir, save_manifest
from evolve.build import count_params
from evolve.genome import Genome
from evolve.problem import Problem
from launch.config import Config, load_config
from launch.job import WorkerSetup, master_start
from launch.messages import CANCELLED, OK, Progress, Result, Task
from launch.progress import ProgressView, Snapshot
from launch.rundir import RunDir, RunDirError, write_json
from launch.runtime import MasterState, master_serve, stop_signal

log = logging.getLogger(__name__)

PLAN = "plan.json"
MEMBER_FILES = ("genome.json", "model.pt", "metrics.json")


@dataclass(frozen=True)
class EnsembleJob:
    """Everything an ensemble build needs, checked before any rank starts."""

    source: RunDir  # the evolution run the members come from
    data: str
    out: RunDir  # the ensemble directory (its journal is results.jsonl, as a run's)
    config: Config
    problem: Problem
    specs: tuple[MemberSpec, ...]
    resume: bool = False


def prepare(source: str | Path, data: str | Path, out: str | Path, *, sets: list[str] = (),
            overrides: dict | None = None, resume: bool = False) -> EnsembleJob:
    """Check the run, the data and the output directory, and resolve the config and the plan of members.

    The config is the run's own config.toml (or, with `resume`, the ensemble's), then `sets`, then `overrides`.
    """
    src, dst = RunDir(source), RunDir(out)
    if not src.journal.exists():
        raise RunDirError(f"--from {source}: no results.jsonl (not a run directory)")
    best = src.best / "metrics.json"
    if not best.exists():
        raise RunDirError(f"--from {source}: no best/metrics.json (no evaluation of the run finished)")
    try:
        problem = Problem.from_dict(json.loads(best.read_text())["problem"])
    except (ValueError, KeyError) as exc:
        raise RunDirError(f"--from {source}: unreadable best/metrics.json: {exc}") from None
    if not dst.path.parent.exists():
        raise RunDirError(f"--out {dst.path}: parent directory {dst.path.parent} does not exist")
    plan = dst.path / PLAN
    if resume:
        if not plan.exists():
            raise RunDirError(f"--resume: {dst.path} holds no ensemble build to resume (no {PLAN})")
        if overrides:
            raise RunDirError(f"--resume continues the plan in {plan}; --members and --strategy cannot change it")
        config = load_config(dst.config, sets)
    else:
        if dst.path.exists() and any(dst.path.iterdir()):
            raise RunDirError(f"--out {dst.path} exists and is not empty; use --resume or a new --out")
        config = load_config(src.config if src.config.exists() else None, sets, overrides)
    info = inspect(data)
    if (tuple(info.sample_shape), info.task, info.num_targets) != (problem.sample_shape, problem.task,
                                                                  problem.num_outputs):
        raise DataError(f"{data}: does not match the run {src.path}: the run evolved {problem.task} networks for "
                        f"samples of shape {problem.sample_shape} with {problem.num_outputs} outputs; the file has "
                        f"{info.task}, {tuple(info.sample_shape)}, {info.num_targets}")
    if resume:
        try:
            specs = [MemberSpec.from_dict(d) for d in json.loads(plan.read_text())]
        except (ValueError, TypeError) as exc:
            raise RunDirError(f"--resume: unreadable {plan}: {exc}") from None
    else:
        try:
            specs = choose_members(src.read_journal(), config.ensemble, run=str(src.path))
        except ValueError as exc:
            raise RunDirError(f"--from {exc}") from None
    return EnsembleJob(src, str(data), dst, config, problem, tuple(specs), resume)


def member_done(out: RunDir, record: dict) -> bool:
    """A journalled member that --resume does not train again: a failure, or an ok one whose files are there."""
    return record["status"] != OK or all((member_dir(out.path, record["name"]) / f).exists() for f in MEMBER_FILES)


class EnsembleSource:
    """One task per member, no pruning; every result is journalled the moment it arrives."""

    def __init__(self, job: EnsembleJob, *, records: list[dict] = (), view: ProgressView | None = None):
        self.job, self.out, self.view = job, job.out, view or ProgressView()
        cfg = job.config
        epochs = cfg.ensemble.member_epochs(cfg.train.epochs)
        self.train = {**cfg.train.to_dict(), "epochs": epochs}
        self.timeout = cfg.ensemble.member_timeout(cfg.run.task_timeout, cfg.train.epochs)
        done = {r["name"] for r in records if member_done(self.out, r)}
        self.records = [r for r in records if r["name"] in done]
        self.pending = [i for i, s in enumerate(job.specs) if s.name not in done]
        self.curves: dict[int, list[float]] = {}  # running member -> fitness after each epoch
        self.started = time.time()
        self.state: MasterState | None = None
        self.shown = -1
        self.cancelled = 0  # members stopped by a stop signal, not journalled

    def next_task(self) -> Task | None:
        if not self.pending:
            return None
        i = self.pending.pop(0)
        spec = self.job.specs[i]
        where = member_dir(self.out.path, spec.name)
        where.mkdir(parents=True, exist_ok=True)
        self.curves[i] = []
        payload = {"genome": spec.genome, "problem": self.job.problem.to_dict(), "train": self.train,
                   "seed": spec.seed, "save": str(where / "model.pt")}
        return Task(i, payload, self.timeout)

    def finished(self) -> bool:
        return not self.pending and not self.curves

    def on_result(self, r: Result) -> None:
        spec = self.job.specs[r.id]
        curve = self.curves.pop(r.id, [])
        where = member_dir(self.out.path, spec.name)
        if r.status == CANCELLED:  # the job is ending; --resume trains it again
            shutil.rmtree(where, ignore_errors=True)
            self.cancelled += 1
            return
        record = {"id": r.id, "name": spec.name, "genome": spec.genome, "key": spec.key, "seed": spec.seed,
                  "origin": spec.origin, "status": r.status, "fitness": r.fitness, "metrics": r.metrics,
                  "curve": curve, "params": count_params(Genome.from_json(spec.genome), self.job.problem),
                  "rank": r.rank, "host": r.host, "start": r.started, "end": r.ended, "error": r.error}
        self.out.append(record)
        self.records.append(record)
        if r.status == OK and (where / "model.pt").exists():
            write_json(where / "genome.json", spec.genome)
            write_json(where / "metrics.json", {
                "problem": self.job.problem.to_dict(), "fitness": r.fitness, "metrics": r.metrics,
                "params": record["params"], "seed": spec.seed, "origin": spec.origin, "key": spec.key,
                "name": spec.name, "describe": Genome.from_json(spec.genome).describe()})
            return
        shutil.rmtree(where, ignore_errors=True)  # a failed member leaves only its journal line
        self.view.message(f"member {spec.name} {r.status} in {r.seconds:.1f}s on rank {r.rank}"
                          + (f": {r.error.splitlines()[-1]}" if r.error else ""))

    def on_progress(self, p: Progress) -> str | None:
        fit = p.metrics.get("fitness")
        if isinstance(fit, (int, float)) and p.id in self.curves:
            self.curves[p.id].append(fit)
        return None  # members train to completion

    def on_tick(self, state: MasterState) -> None:
        self.state = state
        ok = [r["fitness"] for r in self.records if r["status"] == OK]
        snap = Snapshot(done=len(self.records), total=len(self.job.specs), best=max(ok, default=None),
                        busy=state.busy, workers=state.workers, failures=len(self.records) - len(ok),
                        elapsed=time.time() - self.started, remaining=None)
        self.view.show(snap, force=len(self.records) != self.shown)
        self.shown = len(self.records)


def start_workers(comm: Any, job: EnsembleJob) -> Any:
    """Write the directory's config and plan, then send the workers their setup and the train/val data, as an
    evolution run does. Returns master_start's hold on the shared data (close it after serving)."""
    run = job.config.run
    try:
        for d in (job.out.path, job.out.path / "members", job.out.logs):
            d.mkdir(parents=True, exist_ok=True)
        job.out.config.write_text(job.config.dumps())
        if not job.resume:
            write_json(job.out.path / PLAN, [s.to_dict() for s in job.specs])
        plan, memory, _ = dataset_plan(job.data, ("train", "val"), val_fraction=run.val_fraction, seed=run.seed,
                                       chunk_bytes=run.chunk_mib << 20, readers=run.readers or "node")
    except (DataError, DataShareError, OSError) as exc:
        master_start(comm, str(exc))
        raise DataError(str(exc)) from None
    return master_start(comm, WorkerSetup(run.task, str(job.out.logs)), plan, memory)


def master_build(comm: Any, job: EnsembleJob) -> dict | None:
    """Rank 0 of an ensemble build: train the members on the workers, then select and save.

    Returns the metrics, or None when a stop signal ended the build before every member was trained."""
    records = job.out.read_journal() if job.resume else []
    shared = start_workers(comm, job)
    view = ProgressView()
    source = EnsembleSource(job, records=records, view=view)
    log.info("training %d of %d ensemble member(s) (%d epochs each, limit %.0f s) on %d worker(s)",
             len(source.pending), len(job.specs), source.train["epochs"], source.timeout, comm.size - 1)
    try:
        master_serve(comm, source, stop=stop_signal)
    finally:
        view.clear()
        if shared is not None:
            shared.close()
    if source.cancelled or not source.finished():
        return None
    return finish(job, source.records)


def latest(records: list[dict]) -> dict[str, dict]:
    """Each member's last journal record (a resumed build may have trained it again)."""
    return {r["name"]: r for r in records}


def finish(job: EnsembleJob, records: list[dict], device: str = "cpu") -> dict:
    """Selection on val, the manifest, and metrics of the ensemble and of each member on val and test."""
    from launch.predict import load_network, predict_outputs, score

    by_name = latest(records)
    ok = [s for s in job.specs if s.name in by_name and by_name[s.name]["status"] == OK
          and member_done(job.out, by_name[s.name])]
    statuses = Counter(by_name[s.name]["status"] for s in job.specs if s.name in by_name)
    if not ok:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(statuses.items()))
        raise EnsembleError(f"no ensemble member trained successfully ({counts}); see {job.out.journal} and "
                            f"{job.out.logs}")
    run = job.config.run
    info, splits = load(job.data, ("val", "test"), val_fraction=run.val_fraction, seed=run.seed)
    preds: dict[str, list[np.ndarray]] = {split: [] for split in splits}
    for spec in ok:
        model, _, _ = load_network(member_dir(job.out.path, spec.name), device)
        for split, (x, _) in splits.items():
            preds[split].append(predict_outputs(model, x, job.problem, device=device))
    cfg = job.config.ensemble
    sel = select(preds["val"], splits["val"][1], job.problem.task, max_rounds=cfg.max_rounds, init=cfg.init)
    weight = {s.name: float(w) for s, w in zip(ok, sel.weights)}
    members = tuple(Member(s.name, weight.get(s.name, 0.0), s.seed, s.origin, by_name[s.name]["status"])
                    for s in job.specs if s.name in by_name)
    best_member = ok[int(np.argmin(sel.member_scores))].name
    selection = {**sel.to_dict(), "picks": [ok[i].name for i in sel.picks],
                 "member_scores": {s.name: v for s, v in zip(ok, sel.member_scores)},
                 "counts": {s.name: int(c) for s, c in zip(ok, sel.counts)}, "best_member": best_member}
    save_manifest(job.out.path, Manifest(job.problem, members, selection, {
        "run": str(job.source.path.resolve()), "data": str(Path(job.data).resolve()),
        "val_from_train": info.val_from_train, "strategy": cfg.strategy}))
    metrics: dict = {"task": job.problem.task, "best_member": best_member, "selection": _brief(sel),
                     "status": dict(statuses), "weights": weight}
    run_best, _, _ = load_network(job.source.best, device)  # the search's single best network, for comparison
    for split, (x, y) in splits.items():
        metrics[split] = {"ensemble": score(job.problem.task, combine(preds[split], sel.weights), y, info),
                          "run_best": score(job.problem.task,
                                            predict_outputs(run_best, x, job.problem, device=device), y, info),
                          "members": {s.name: score(job.problem.task, p, y, info)
                                      for s, p in zip(ok, preds[split])}}
    write_json(job.out.path / "metrics.json", metrics)
    return metrics


def _brief(sel: Selection) -> dict:
    return {"metric": sel.metric, "single_best": min(sel.member_scores), "ensemble": sel.score,
            "picks": len(sel.picks)}


def _keys(task: str) -> tuple[str, ...]:
    return ("accuracy", "nll", "ece") if task == "classification" else ("mse", "mae", "r2")


def _line(m: dict, task: str) -> str:
    return ", ".join(f"{k} {m[k]:.4f}" for k in _keys(task))


def format_metrics(metrics: dict) -> str:
    """What the CLI prints: per split, the ensemble, its best member (by val) and every member."""
    task = metrics["task"]
    s = metrics["selection"]
    used = sum(w > 0 for w in metrics["weights"].values())
    lines = ["members: " + ", ".join(f"{k} {v}" for k, v in sorted(metrics["status"].items())),
             (f"selection on val ({s['metric']}): best single member {s['single_best']:.4f} -> ensemble "
              f"{s['ensemble']:.4f} with {used} member(s) in {s['picks']} pick(s)")]
    for split in ("val", "test"):
        if split not in metrics:
            continue
        m = metrics[split]
        lines.append(f"{split} ({m['ensemble']['samples']} samples):")
        lines.append(f"  ensemble             {_line(m['ensemble'], task)}")
        lines.append(f"  run's best network   {_line(m['run_best'], task)}  (best/ of the search)")
        for name, mm in m["members"].items():
            mark = " (best member on val)" if name == metrics["best_member"] else ""
            lines.append(f"  {name:<12} w {metrics['weights'][name]:.2f}  {_line(mm, task)}{mark}")
    return "\n".join(lines)


def design_report(run: Path, job: EnsembleJob, metrics: dict) -> dict:
    """`galapagos design`'s report: the search's best network and the ensemble on test (val if there is none)."""
    split = "test" if "test" in metrics else "val"
    summary = run / "summary.json"
    m = metrics[split]
    best = metrics["best_member"]
    return {"data": job.data, "run": str(run), "ensemble": str(job.out.path), "split": split,
            "task": metrics["task"], "evolution": json.loads(summary.read_text()) if summary.exists() else None,
            "best_single": m["run_best"], "ensemble_metrics": m["ensemble"],
            "best_member": {"name": best, **m["members"][best]}, "members": m["members"],
            "weights": metrics["weights"], "status": metrics["status"]}


def format_report(report: dict) -> str:
    task, split = report["task"], report["split"]
    used = sum(w > 0 for w in report["weights"].values())
    return "\n".join([
        f"design report on {split} ({report['ensemble_metrics']['samples']} samples):",
        f"  best single network  {_line(report['best_single'], task)}  ({report['run']}/best)",
        f"  best member          {_line(report['best_member'], task)}  ({report['best_member']['name']})",
        (f"  ensemble             {_line(report['ensemble_metrics'], task)}  ({report['ensemble']}, {used} of "
         f"{len(report['members'])} trained members used)"),
        f"report: {report['run']}/report.json"])
