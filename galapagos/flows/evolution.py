"""The evolution run: its inputs checked before any rank starts, and rank 0's part: the engine behind ask/tell,
the journal, pruning, best/ and the summary.

A run may span several jobs (`--resume`): each checks that its data is the run's own (data.json), holds the run
directory's lock while it runs, and takes its time budget from what the earlier jobs left (clock.json)."""
from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

from galapagos.config import Config, evolve_config, load_config
from galapagos.datashare.carve import carved_count
from galapagos.datashare.format import DatasetInfo, inspect
from galapagos.errors import NoResult, RunDirError, UsageError
from galapagos.evolve.ahead import Ahead
from galapagos.evolve.engine import Engine
from galapagos.evolve.problem import Problem
from galapagos.evolve.settings import load_function
from galapagos.flows.datamode import data_memory, data_setup
from galapagos.flows.evolution_source import EvolutionSource
from galapagos.flows.finish import FINISH
from galapagos.flows.mpijob import Flow, default_workers, setup_logging
from galapagos.flows.session import MasterSession
from galapagos.flows.warmstart import seed_genomes
from galapagos.launch.protocol import Setup
from galapagos.launch.runtime import MasterState
from galapagos.launch.signals import stop_signal
from galapagos.options import TRAIN_TASK, EvolveOptions
from galapagos.reports.summary import summarize
from galapagos.reports.tracking import Tracker, check_tracking
from galapagos.store.fingerprint import data_fingerprint
from galapagos.store.rundir import RunDir

log = logging.getLogger(__name__)


def check(opts: EvolveOptions, workers: int | None = None) -> tuple[Config, DatasetInfo, dict]:
    """Everything that can be checked before any rank starts: config, data file, run directory (no live run holds
    it; on --resume, its run was evolved on this same data), seed genomes. Returns the config, its "auto" search
    sizes resolved for the job's candidates at once (`workers`, rank 0's count; else the options'), the data's info
    and fingerprint."""
    config = evolve_config(opts)
    ranks = workers or opts.workers or default_workers()
    at_once = -(-ranks // config.run.spread_ranks) * max(config.run.pack, 1)  # a gang trains one at a time
    config = dataclasses.replace(config, evolution=config.evolution.sized(at_once))
    check_task(config.run.task)
    check_tracking(config.report)
    if config.train.builder:
        check_task(config.train.builder, "train.builder")
    if opts.seed_from:
        if opts.resume:
            raise UsageError("--seed-from with --resume: the run's population was seeded when it started")
        seed_genomes(opts.seed_from, config.evolution.population_size)
    info = inspect(opts.data)
    data_memory(config.data, config.run, info, opts.workers or default_workers())  # refuses when nothing fits
    run = RunDir.check(opts.out, resume=opts.resume)
    data = run.check_data(info, opts.data) if opts.resume else data_fingerprint(info, opts.data)
    check_room(run, config, opts.workers or 1)  # at least one worker's (rank 0 knows how many: it looks again)
    return config, info, data


def check_room(run: RunDir, config: Config, workers: int) -> None:
    """Refuse a disk too small for the weights the run keeps (the best, and for inheritance the population's and a
    parent's per task in flight), one being written per worker, and best/."""
    inherit = config.evolution.inherit * (config.evolution.population_size + workers)
    run.check_room(config.run.keep_models + workers + 1 + inherit, config.space.max_params)


def check_task(spec: str, key: str = "run.task") -> None:
    """run.task (or train.builder) must name a function this Python can import (every node imports it alike).
    Galapagos's own task is not imported here: it imports torch, which only the trainer children need."""
    if spec == TRAIN_TASK:
        return
    try:
        fn = load_function(spec, key)
    except (ImportError, AttributeError, ValueError) as exc:
        raise UsageError(f"{key} {spec!r}: cannot be imported here: {type(exc).__name__}: {exc}") from None
    if not callable(fn):
        raise UsageError(f"{key} {spec!r}: not a function")


def master(comm: Any, opts: EvolveOptions) -> dict:
    """Rank 0 of an evolution run: returns the summary (also written to summary.json). Holds the run directory's
    lock until it returns. Raises NoResult, after writing summary.json, when the run is over and nothing
    succeeded."""
    with MasterSession(comm) as session:
        return evolve(session, opts)


def evolve(session: MasterSession, opts: EvolveOptions) -> dict:
    """The run itself, on rank 0: checked and set up, served, summarized."""
    with session.starting():
        config, info, data = check(opts, session.workers)
        run = RunDir.open(opts.out, resume=opts.resume)
        session.hold(run.hold())
        session.on_refusal(run.discard)  # a refused start leaves --out as it found it (the lock still held)
        setup_logging(0, run.master_log)
        records = run.read_journal(repair=True) if opts.resume else []
        spent = run.spent_seconds() if opts.resume else 0.0
        check_room(run, config, session.workers)
        problem = Problem.of_dataset(info)
        share = build_share(config, info)  # the file's splits, test included (the data's setup below loads none)
        engine = Engine(config.space, problem, config.evolution)
        if records:  # a finishing task trained a network the engine was told of: only its id counts there
            engine.replay(r.replace(fitness=None) if r.origin == FINISH else r for r in records)
        elif opts.seed_from:
            seeded = engine.seed(seed_genomes(opts.seed_from, config.evolution.population_size))
            log.info("the population starts from %d genome(s) of %s", seeded, opts.seed_from)
        drawn = range(0) if records or opts.seed_from else first_draws(engine, config, session.workers)
        engine = breeder(engine, config, session.workers)
        session.while_serving(engine.close)
        plan, memory, info, access, want = data_setup(config.data, config.run, opts.data, info, session.workers)
    start = time.time()
    # The time budget counts the search time of every job of the run, not only this one's.
    deadline = start + 60 * config.run.budget_minutes - spent if config.run.budget_minutes else None
    tracker = Tracker.open(config.report, run.path, run.path.name)
    if tracker is not None:
        session.while_serving(tracker.close)
    session.while_serving(run.close)
    source = EvolutionSource(engine, config, run, problem, deadline=deadline, records=records,
                             spent=spent, tracker=tracker, access=access, drawn=drawn,
                             build_share=share)
    if records:
        log.info("resuming %s: %d evaluation(s) already done in %.0f s of search", run.path, len(records), spent)
    if deadline is not None and source.end() <= start:
        log.info("the time budget of %g minute(s) was spent by the run's earlier jobs (%.0f s of search, %.0f s "
                 "left for the final ensemble's build): ending at once; give it more with --set "
                 "run.budget_minutes=M", config.run.budget_minutes, spent, source.reserve)
        plan, memory, want = {}, None, None  # nothing will train: no data to share
    log.info("evolving networks (%s) for %s (%s, samples %s) on %d worker(s); budget: %s", config.evolution.strategy,
             opts.data, info.task, tuple(info.sample_shape), session.workers,
             " and ".join(filter(None, [config.run.evaluations and f"{config.run.evaluations} evaluations",
                                        config.run.budget_minutes and f"{config.run.budget_minutes:g} minutes"])))
    liveness = config.run.liveness(run.master_heartbeat, session.workers)
    session.start(Setup(config.run.task, str(run.logs), want=want, liveness=liveness, pack=config.run.packing,
                        spread=config.run.spreading,
                        spread_ranks=config.run.spread_ranks),
                  plan, memory)
    run.begin(config.dumps(), data, resume=opts.resume)  # the run's config and data.json: the job has started
    cpu, serve_start = time.process_time(), time.time()
    state = session.serve(source, deadline=source.end, lost_grace=config.run.lost_grace,
                          prefetch=prefetch(config.run.prefetch, session.workers))
    master_cpu = (time.process_time() - cpu) / max(time.time() - serve_start, 1e-9)
    return conclude(run, config, source, state, wall=time.time() - start, master_cpu=master_cpu, data=opts.data)


def conclude(run: RunDir, config: Config, source: EvolutionSource, state: MasterState, *, wall: float,
             master_cpu: float, data: str) -> dict:
    """The end of a job of the run: its search time on the clock, the final pick (best/, flows/final_pick.py),
    summary.json, and the result (NoResult when nothing succeeded and no stop signal cut the run short)."""
    run.prune_models(source.kept())  # what cancelled tasks wrote before their trainers were stopped
    if config.evolution.rungs > 1:  # and their checkpoints; those a resumed run may still promote stay
        run.prune_checkpoints(source.engine.resumable())
    searched = source.search_seconds()
    run.record_seconds(searched)
    pick = None
    if config.train.holdout:  # rank 0 imports torch only here, to score a few networks
        from galapagos.flows.final_pick import final_pick

        pick = final_pick(run, config, source.problem, data, run.read_journal())
    if pick is not None:
        run.save_network(run.best, pick[0], {**source.network_extra(pick[0]), "final_pick": pick[1]})
    picked = pick[0].id if pick is not None else source.best.id if source.best and source.best.origin == FINISH \
        else None
    slots = state.workers - len(state.followers) + sum(state.slots.spare.values())  # candidates trained at once
    summary = summarize(run.iter_journal(), population_size=config.evolution.population_size,
                        workers=state.workers, slots=slots,
                        wall_seconds=wall, busy_seconds=state.busy_seconds, picked=picked)
    if pick is not None:
        summary["final_pick"] = pick[1]
    if config.run.final_ensemble and source.best is not None and (made := final_ensemble(run, config, data)):
        summary["final_ensemble"] = made
    if source.reserve:  # the seconds the search stopped early for the final ensemble's build
        summary["build_reserve"] = round(source.reserve, 1)
    # The master's own CPU use while it served: it should leave the cores to training.
    summary["master_cpu_share"] = round(master_cpu, 4)
    summary["search_seconds"] = round(searched, 2)
    if stopped := stop_signal():
        summary["stopped_by"] = stopped
    summary.update(state.lost_summary())
    if state.lost:
        run.record_lost({r: state.hosts.get(r, "") for r in state.lost}, state.lost_nodes, state.lost_at)
    if source.front is not None:
        summary["pareto_front"] = len(source.front.members)
    if source.exhausted:
        summary["ended_early"] = source.exhausted
    run.save(run.summary, summary)
    end = source.end()  # where the search's time ended (before the final ensemble's build)
    result = {**summary, "run": str(run.path), "best_dir": str(run.best) if source.best else None,
              "finished": source.finished() or (end is not None and time.time() >= end)}
    if source.best is None and not stopped:
        raise NoResult(result)
    return result


def final_ensemble(run: RunDir, config: Config, data: str) -> dict | None:
    """The kept networks made an ensemble in OUT/final at the end of every job of the run: `galapagos ensemble
    --strategy kept` (seconds, nothing trained) in a child process, so that rank 0 never imports torch. What
    summary.json says of it, or why there is none (the run goes on without it); None where no network's weights
    were kept (a task of its own that saves none)."""
    from galapagos.launch.mpi import plain_env
    from galapagos.launch.trainer import die_with_parent

    shutil.rmtree(run.final, ignore_errors=True)
    if not any(run.models.glob("*.pt")):
        return None
    start = time.time()
    # In a session of its own: a stop signal that reaches rank 0's process group (a launcher passes SIGUSR1 or
    # SIGTERM on to it) as the search ends stops the search, not the build in progress, seconds inside the budget;
    # if rank 0 dies, so does the build.
    proc = subprocess.run([sys.executable, "-m", "galapagos.cli", "ensemble", "--from", str(run.path), "--data", data,
                           "--out", str(run.final), "--strategy", "kept", "--members", str(config.run.keep_models)],
                          env=plain_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          start_new_session=True, preexec_fn=lambda: die_with_parent(signal.SIGKILL))
    if proc.returncode:
        why = (f"killed by {signal.Signals(-proc.returncode).name}" if proc.returncode < 0 else
               (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1])
        log.warning("no final ensemble: %s", why)
        return {"error": why}
    metrics = json.loads((run.final / "metrics.json").read_text())
    used = sum(w > 0 for w in metrics["weights"].values())
    seconds = time.time() - start
    log.info("final ensemble: %d of %d kept network(s) in %s (%.1f s)", used, len(metrics["weights"]), run.final,
             seconds)
    return {"dir": str(run.final), "members": used, "kept": len(metrics["weights"]), "task": metrics["task"],
            "val": metrics["val"]["ensemble"], "val_best": metrics["val"]["run_best"],
            "seconds": round(seconds, 1)}


def build_share(config: Config, info: DatasetInfo) -> float:
    """The final ensemble's predictions in samples over the training split's (its build comes out of the time
    budget: EvolutionSource.end): the val split (carved from train where the file has none) and the test split;
    0 without a final ensemble."""
    if not config.run.final_ensemble:
        return 0.0
    splits = info.splits
    train = splits.get("train", 0)
    val = splits["val"] if "val" in splits else carved_count(train, config.run.val_fraction)
    fit = train - (0 if "val" in splits else val)
    return (val + splits.get("test", 0)) / max(fit, 1)


def breeder(engine: Engine, config: Config, workers: int) -> Engine | Ahead:
    """What rank 0 asks for children: with `[evolution] breeder_workers` workers or more, a helper process that
    breeds them ahead (evolve/ahead.py); else the engine itself."""
    n = config.evolution.breeder_workers
    return Ahead(engine, config.train.builder) if 0 < n <= workers else engine


def first_draws(engine: Engine, config: Config, workers: int) -> range:
    """The ids of a fresh run's first round where its workers draw the genomes (evolve/drawn.py): one per worker
    (fewer under a smaller evaluation budget) in a job that breeds ahead, none in a smaller one. Reserved before the
    helper gets its copy of the engine."""
    n = config.evolution.breeder_workers
    if not 0 < n <= workers:
        return range(0)
    return engine.reserve(min(workers, config.run.evaluations or workers))


def prefetch(setting: int, workers: int) -> int | None:
    """Tasks queued on a worker beyond its running one (None: the runtime decides by task length). One worker gets
    none by default: each child is then bred knowing every earlier result, whatever the timing, so a run with a
    fixed seed and one worker repeats its sequence of genomes."""
    if setting >= 0:
        return setting
    return 0 if workers == 1 else None


def salvage(opts: EvolveOptions, code: int) -> dict | None:
    """The job died without rank 0's summary (MPICH ends every rank when one is killed): summary.json from the
    journal, which holds every evaluation that finished, so that the run still ends with its summary and resumes.
    None when the run never started or a live job holds it."""
    run = RunDir(opts.out)
    if not run.config.exists():
        return None
    try:
        lock = run.lock()
    except (RunDirError, OSError):
        return None
    try:
        config = load_config(run.config)
        summary = summarize(run.iter_journal(), population_size=config.evolution.population_size)
        summary["search_seconds"] = round(run.spent_seconds(), 2)
        summary["ended_by"] = f"the job's failure (exit code {code})"
        run.save(run.summary, summary)
    except (RunDirError, OSError, ValueError) as exc:
        log.warning("%s: no summary written after the job's failure: %s", run.path, exc)
        return None
    finally:
        lock.release()
    return {**summary, "run": str(run.path), "best_dir": str(run.best) if summary["best"] else None,
            "finished": False}


FLOW = Flow("evolve", check, master, salvage=salvage)
