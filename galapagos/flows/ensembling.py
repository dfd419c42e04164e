"""The ensemble build: its inputs checked before any rank starts, and rank 0's part: one member per task on the
workers, then selection, manifest, metrics.

Members train through the same runtime as the evolution run (supervised trainer children, time limits, crash
handling); a member that fails is recorded in DIR/results.jsonl with its status and left out, and the ensemble is
built from the rest. `--resume` reads the saved plan and the journal and trains only the members not yet finished.
With `--strategy kept` nothing trains: the run's kept weights become the members (hard links, or copies), in this
process (no ranks are started; under a launcher the workers are stopped at once).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import socket
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from galapagos.config import Config, ensemble_overrides, load_config
from galapagos.datashare.format import DataError, DatasetInfo, inspect, load
from galapagos.datashare.plan import dataset_plan
from galapagos.ensemble.members import MemberSpec, choose_members
from galapagos.ensemble.refit import restore
from galapagos.ensemble.selection import Selection, combine, pixel_samples, select
from galapagos.errors import RunDirError, UsageError
from galapagos.evolve.check import count_params
from galapagos.evolve.files import write_json
from galapagos.evolve.genome import Genome
from galapagos.evolve.netdir import ModelError, NetworkDir
from galapagos.evolve.pareto import parse_pick
from galapagos.evolve.problem import Problem
from galapagos.evolve.task import TrainTask
from galapagos.flows.mpijob import Flow, setup_logging
from galapagos.flows.session import MasterSession
from galapagos.flows.sources import JournalSource
from galapagos.launch.protocol import Result, Setup, Status, Task
from galapagos.launch.signals import stop_signal
from galapagos.launch.scripts.request import job_folder
from galapagos.options import EnsembleOptions
from galapagos.reports.progress import ProgressView, Snapshot
from galapagos.store.ensembledir import EnsembleDir, EnsembleError, Manifest, Member, save_manifest
from galapagos.store.journal import JournalRecord, journal_record
from galapagos.store.rundir import RunDir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EnsembleJob:
    """Everything an ensemble build needs, checked before any rank starts."""

    source: RunDir  # the evolution run the members come from
    data: str
    out: EnsembleDir  # the ensemble directory
    config: Config
    problem: Problem
    specs: tuple[MemberSpec, ...]
    resume: bool = False


def prepare(source: str | Path, data: str | Path, out: str | Path, *, sets: list[str] = (),
            overrides: dict | None = None, resume: bool = False, pick: str | None = None) -> EnsembleJob:
    """Check the run, the data and the output directory, and resolve the config and the plan of members.

    The config is the run's own config.toml (or, with `resume`, the ensemble's), then `sets`, then `overrides`.
    """
    src, dst = RunDir(source), EnsembleDir(out)
    if not src.journal.exists():
        raise RunDirError(f"--run {source}: no {src.journal.name} (not a run directory)")
    best = NetworkDir(src.best)
    if not best.metrics_file.exists():
        raise RunDirError(f"--run {source}: no {best.metrics_file.relative_to(src.path)} (no evaluation of the run "
                          "finished)")
    try:
        problem = best.problem()
    except ModelError as exc:
        raise RunDirError(f"--run {exc}") from None
    if dst.path.exists() and not dst.path.is_dir():
        raise RunDirError(f"--out {dst.path}: exists and is not a directory")
    plan = dst.plan
    if resume:
        if not plan.exists():
            raise RunDirError(f"--resume: {dst.path} holds no ensemble build to resume (no {plan.name})")
        config = load_config(dst.config, sets)
        changed = {k: v for k, v in (overrides or {}).items()
                   if getattr(config.ensemble, k.split(".")[1]) != v}  # the same values as the plan's are fine
        if pick is not None:
            changed["pick"] = pick
        if changed:
            raise RunDirError(f"--resume continues the plan in {plan} ({config.ensemble.members} members, strategy "
                              f"{config.ensemble.strategy}); --members, --strategy and --pick cannot change it")
    else:
        # a job of `galapagos launch` writes its script and settings into --out/job/ before the build starts
        if dst.path.exists() and any(p != job_folder(dst.path) for p in dst.path.iterdir()):
            raise RunDirError(f"--out {dst.path} exists and is not empty; use --resume or a new --out")
        config = load_config(src.config if src.config.exists() else None, sets, overrides)
    info = inspect(data)
    if why := problem.mismatch(info):
        raise DataError(f"{data}: does not match the run {src.path}: the run evolved networks for {why}")
    if resume:
        try:
            specs = [MemberSpec.from_dict(d) for d in json.loads(plan.read_text())]
        except (ValueError, TypeError) as exc:
            raise RunDirError(f"--resume: unreadable {plan}: {exc}") from None
    else:
        records = src.read_journal()
        if pick is not None:
            try:
                test = parse_pick(pick)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
            records = [r for r in records if r.status == "ok" and test(r)]
            if not records:
                raise RunDirError(f"--pick {pick}: no finished evaluation of {source} meets it")
        kept = {r.id for r in records if Path(src.model_path(r.id)).exists()} if is_kept(config) else ()
        try:
            specs = choose_members(records, members=config.ensemble.members, strategy=config.ensemble.strategy,
                                   seed=config.ensemble.seed, run=str(src.path), kept=kept,
                                   search_seed=config.run.seed)
        except ValueError as exc:
            raise RunDirError(f"--run {exc}") from None
    return EnsembleJob(src, str(data), dst, config, problem, tuple(specs), resume)


def is_kept(config: Config) -> bool:
    """The members are the run's kept networks, trained by the search: nothing to train."""
    return config.ensemble.strategy == "kept"


def write_member(job: EnsembleJob, spec: MemberSpec, fitness: float, metrics: dict, params: int) -> None:
    """A member's genome.json and metrics.json, beside its model.pt."""
    builder = job.config.train.builder
    NetworkDir(job.out.member(spec.name)).write(spec.genome, {
        "problem": job.problem.to_dict(), "fitness": fitness, "metrics": metrics, "params": params, "seed": spec.seed,
        "origin": spec.origin, "key": spec.key, "name": spec.name, "describe": Genome.from_json(spec.genome).describe(),
        **({"builder": builder} if builder else {})})


def place_kept(job: EnsembleJob, records: list[JournalRecord]) -> list[JournalRecord]:
    """Place each kept network of the plan not yet placed in its member directory (a hard link where the file
    system allows, else a copy) and journal it as a member that finished with the search's own fitness and
    metrics; every member's record."""
    done = {r.name for r in records if member_done(job.out, r)}
    records = [r for r in records if r.name in done]
    by_id = {r.id: r for r in job.source.read_journal()}
    builder = job.config.train.builder
    for i, spec in enumerate(job.specs):
        if spec.name in done:
            continue
        found = by_id.get(spec.origin["id"])
        weights = Path(job.source.model_path(spec.origin["id"]))
        if found is None or not weights.exists():
            raise RunDirError(f"--run {job.source.path}: the weights of evaluation {spec.origin['id']} are no longer "
                              f"in {job.source.models} (the plan in {job.out.plan} needs them)")
        net = NetworkDir(job.out.member(spec.name))
        net.path.mkdir(parents=True, exist_ok=True)
        net.model_file.unlink(missing_ok=True)
        try:  # a second name for the same weights: no room taken, and models/ may drop its own later
            os.link(weights, net.model_file)
        except OSError:  # another file system, or one without hard links
            shutil.copyfile(weights, net.model_file)
        params = count_params(Genome.from_json(spec.genome), job.problem, builder)
        write_member(job, spec, found.fitness, dict(found.metrics), params)
        now = time.time()
        result = Result(i, 0, socket.gethostname(), Status.OK, found.fitness, now, now, dict(found.metrics))
        record = journal_record(result, list(found.curve), {"name": spec.name, "genome": spec.genome,
                                                            "key": spec.key, "seed": spec.seed,
                                                            "origin": spec.origin, "params": params})
        job.out.append(record)
        records.append(record)
    job.out.flush()
    return records


def member_done(out: EnsembleDir, record: JournalRecord) -> bool:
    """A journalled member that --resume does not train again: a failure, or an ok one whose files are there."""
    return record.status != Status.OK or NetworkDir(out.member(record.name)).complete()


class EnsembleSource(JournalSource):
    """One task per member, no pruning; every result is journalled the moment it arrives."""

    def __init__(self, job: EnsembleJob, *, records: list[JournalRecord] = (), view: ProgressView | None = None):
        done = {r.name for r in records if member_done(job.out, r)}
        super().__init__(job.out, [r for r in records if r.name in done], view=view)
        self.job = job
        cfg = job.config
        self.train = dataclasses.replace(cfg.train, epochs=cfg.ensemble.member_epochs(cfg.train.epochs))
        self.timeout = cfg.ensemble.member_timeout(cfg.run.task_timeout, cfg.train.epochs)
        self.pending = [i for i, s in enumerate(job.specs) if s.name not in done]
        self.cancelled = 0  # members stopped by a stop signal, not journalled

    def next_task(self) -> Task | None:
        if not self.pending and not self.again:
            return None
        i = self.again.popleft() if self.again else self.pending.pop(0)
        spec = self.job.specs[i]
        net = NetworkDir(self.job.out.member(spec.name))
        net.path.mkdir(parents=True, exist_ok=True)
        self.running(i)
        payload = TrainTask(Genome.from_json(spec.genome), self.job.problem, self.train, seed=spec.seed,
                            save=str(net.model_file))
        return Task(i, payload, self.timeout)

    def finished(self) -> bool:
        return not self.pending and not self.again and not self.curves

    def on_result(self, r: Result) -> None:
        if self.lost_again(r):
            return
        spec = self.job.specs[r.id]
        net = NetworkDir(self.job.out.member(spec.name))
        builder = self.job.config.train.builder
        params = count_params(Genome.from_json(spec.genome), self.job.problem, builder)
        record = self.journal_result(r, {"name": spec.name, "genome": spec.genome, "key": spec.key,
                                         "seed": spec.seed, "origin": spec.origin, "params": params})
        if record is None:  # cancelled: --resume trains it again
            shutil.rmtree(net.path, ignore_errors=True)
            self.cancelled += 1
            return
        if r.status == Status.OK and net.model_file.exists():
            write_member(self.job, spec, r.fitness, r.metrics, params)
            return
        shutil.rmtree(net.path, ignore_errors=True)  # a failed member leaves only its journal line
        self.warn(f"member {spec.name}", r)

    def snapshot(self) -> Snapshot:
        ok = [r.fitness for r in self.records if r.status == Status.OK]
        return self._snapshot(total=len(self.job.specs), best=max(ok, default=None))


def write_plan(job: EnsembleJob) -> None:
    """The directory's folders, config and plan (kept as they are on --resume)."""
    for d in (job.out.path, job.out.members, job.out.logs):
        d.mkdir(parents=True, exist_ok=True)
    job.out.config.write_text(job.config.dumps())
    if not job.resume:
        write_json(job.out.plan, [s.to_dict() for s in job.specs])


def start_workers(session: MasterSession, job: EnsembleJob) -> None:
    """Write the directory's config and plan, then send the workers their setup and the train/val data, as an
    evolution run does (no data where there is nothing to train)."""
    run = job.config.run
    with session.starting():
        write_plan(job)
        plan, memory = {}, None
        if not is_kept(job.config):
            plan, memory, _ = dataset_plan(job.data, ("train", "val"), val_fraction=run.val_fraction, seed=run.seed,
                                           chunk_bytes=run.chunk_mib << 20, readers=run.readers or "node")
    liveness = run.liveness(job.out.master_heartbeat, session.workers)
    session.start(Setup(run.task, str(job.out.logs), liveness=liveness, pack=run.packing, spread=run.spreading,
                        spread_ranks=run.spread_ranks), plan,
                  memory)


def master_build(session: MasterSession, job: EnsembleJob) -> dict | None:
    """Rank 0 of an ensemble build: train the members on the workers, then select and save.

    Returns the metrics, or None when a stop signal ended the build before every member was trained."""
    records = job.out.read_journal(repair=True) if job.resume else []
    session.while_serving(job.out.close)
    start_workers(session, job)
    if is_kept(job.config):  # nothing to train: the workers are stopped by serving no task
        records = place_kept(job, records)
    source = EnsembleSource(job, records=records)
    log.info("training %d of %d ensemble member(s) (%d epochs each, limit %.0f s) on %d worker(s)",
             len(source.pending), len(job.specs), source.train.epochs, source.timeout, session.workers)
    state = session.serve(source, lost_grace=job.config.run.lost_grace)
    if state.lost:  # for the job's supervisor: which nodes to probe (galapagos/flows/recovery.py)
        job.out.record_lost({r: state.hosts.get(r, "") for r in state.lost}, state.lost_nodes, state.lost_at)
    if source.cancelled or not source.finished():
        return None
    metrics = finish(job, source.records)
    return {**metrics, **state.lost_summary()}


def latest(records: list[JournalRecord]) -> dict[str, JournalRecord]:
    """Each member's last journal record (a resumed build may have trained it again)."""
    return {r.name: r for r in records}


def member_predictions(out: EnsembleDir, names: list[str], problem: Problem, data: str | Path, config: Config,
                       device: str = "cpu", wanted: tuple[str, ...] = ("val", "test")
                       ) -> tuple[DatasetInfo, dict, dict[str, list[np.ndarray]]]:
    """The `wanted` splits of `data` as the run carved them (`config`'s run section), and each named member's
    predictions on them, in order."""
    from galapagos.models import load_network, predict_outputs

    info, splits = load(data, wanted, val_fraction=config.run.val_fraction, seed=config.run.seed)
    preds: dict[str, list[np.ndarray]] = {split: [] for split in splits}
    for name in names:
        model, _, _ = load_network(out.member(name), device)
        for split, (x, _) in splits.items():
            preds[split].append(predict_outputs(model, x, problem, device=device))
    return info, splits, preds


def finish(job: EnsembleJob, records: list[JournalRecord], device: str = "cpu") -> dict:
    """Selection on val, the manifest, and metrics of the ensemble and of each member on val and test."""
    from galapagos.flows.prediction import score
    from galapagos.models import load_network, predict_outputs

    by_name = latest(records)
    ok = [s for s in job.specs if s.name in by_name and by_name[s.name].status == Status.OK
          and member_done(job.out, by_name[s.name])]
    statuses = Counter(by_name[s.name].status for s in job.specs if s.name in by_name)
    if not ok:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(statuses.items()))
        raise EnsembleError(f"no ensemble member trained successfully ({counts}); see {job.out.journal} and "
                            f"{job.out.logs}")
    for s in ok:  # selection on the weights the members trained to, not a refit's (an interrupted build's)
        restore(job.out.member(s.name))
    info, splits, preds = member_predictions(job.out, [s.name for s in ok], job.problem, job.data, job.config,
                                             device)
    cfg = job.config.ensemble
    val, y_val, task = preds["val"], splits["val"][1], job.problem.task
    if job.problem.is_dense:  # per-pixel probabilities or fields: every labelled pixel is a sample of the selection
        val, y_val, task = pixel_samples(val, y_val, task, job.problem.ignore_index)
    sel = select(val, y_val, task, max_rounds=cfg.max_rounds, init=cfg.init, bags=cfg.bags, seed=cfg.seed)
    weight = {s.name: float(w) for s, w in zip(ok, sel.weights)}
    members = tuple(Member(s.name, weight.get(s.name, 0.0), s.seed, s.origin, by_name[s.name].status)
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
    if cfg.refit_epochs:  # val's scores stay the selection's: the refit trains on val
        used = [s.name for s in ok if weight[s.name] > 0]
        metrics["refit"] = refit_used(job, [s for s in ok if s.name in used], device)
        if "test" in splits:  # the refit members predict test again; the others keep their predictions
            metrics["refit"]["test_before"] = score(job.problem.task, combine(preds["test"], sel.weights),
                                                    splits["test"][1], info)
            _, _, after = member_predictions(job.out, used, job.problem, job.data, job.config, device, ("test",))
            refit_preds = dict(zip(used, after["test"]))
            preds["test"] = [refit_preds.get(s.name, p) for s, p in zip(ok, preds["test"])]
    run_best, _, _ = load_network(job.source.best, device)  # the search's single best network, for comparison
    for split, (x, y) in splits.items():
        metrics[split] = {"ensemble": score(job.problem.task, combine(preds[split], sel.weights), y, info),
                          "run_best": score(job.problem.task,
                                            predict_outputs(run_best, x, job.problem, device=device), y, info),
                          "members": {s.name: score(job.problem.task, p, y, info)
                                      for s, p in zip(ok, preds[split])}}
    write_json(job.out.metrics, metrics)
    return metrics


def refit_used(job: EnsembleJob, used: list[MemberSpec], device: str = "cpu") -> dict:
    """Each used member refit on the training and validation rows (ensemble/refit.py): what each refit did."""
    from galapagos.ensemble.refit import refit

    cfg = job.config.ensemble
    _, splits = load(job.data, ("train", "val"), val_fraction=job.config.run.val_fraction, seed=job.config.run.seed)
    start = time.time()
    done = {s.name: refit(job.out.member(s.name), job.problem, splits["train"], splits["val"], job.config.train,
                          epochs=cfg.refit_epochs, lr=cfg.refit_lr, seed=s.seed, device=device) for s in used}
    log.info("%d member(s) refit on %d rows for %d epoch(s) (%.1f s)", len(done), len(splits["train"][1]) +
             len(splits["val"][1]), cfg.refit_epochs, time.time() - start)
    return {"epochs": cfg.refit_epochs, "lr": cfg.refit_lr, "members": done, "seconds": round(time.time() - start, 1)}


def _brief(sel: Selection) -> dict:
    return {"metric": sel.metric, "single_best": min(sel.member_scores), "ensemble": sel.score,
            "picks": len(sel.picks)}


def check(opts: EnsembleOptions) -> EnsembleJob:
    return prepare(opts.from_run, opts.data, opts.out, sets=opts.set, resume=opts.resume, pick=opts.pick,
                   overrides=ensemble_overrides(opts.members, opts.strategy))


def build_kept(job: EnsembleJob) -> dict:
    """The kept strategy in one process, with no ranks: place the kept networks, then select and score."""
    write_plan(job)
    try:
        records = place_kept(job, job.out.read_journal(repair=True) if job.resume else [])
    finally:
        job.out.close()
    log.info("%d kept network(s) of %s as members (nothing trained)", len(records), job.source.path)
    return finish(job, records)


def build(session: MasterSession | None, job: EnsembleJob) -> dict:
    """Rank 0: train, select and score the checked ensemble job; the metrics, or where it stopped. Without a
    session (the kept strategy started without MPI), in this process."""
    job.out.logs.mkdir(parents=True, exist_ok=True)
    setup_logging(0, job.out.master_log)
    metrics = build_kept(job) if session is None else master_build(session, job)
    if metrics is None:
        return {"ensemble_dir": str(job.out.path), "stopped_by": stop_signal()}
    return {**metrics, "ensemble_dir": str(job.out.path)}


def master(comm: Any, opts: EnsembleOptions) -> dict:
    with MasterSession(comm) as session:
        with session.starting():
            job = check(opts)
        return build(session, job)


def alone(job: EnsembleJob) -> dict | None:
    """The kept strategy started without MPI: the checked job built in this process (mpijob.run)."""
    return build(None, job) if is_kept(job.config) else None


FLOW = Flow("ensemble", check, master, alone=alone)
