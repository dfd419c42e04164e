"""What a run, an ensemble or a design amounts to: summaries as data (for summary.json, report.json and the API)
and as the text the command line prints."""
from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Iterable

from galapagos.evolve.genome import Genome
from galapagos.flows.finish import FINISH
from galapagos.launch.protocol import Status
from galapagos.store.ensembledir import EnsembleDir
from galapagos.store.journal import JournalRecord
from galapagos.store.rundir import RunDir


def summarize(records: Iterable[JournalRecord], *, population_size: int, workers: int | None = None,
              wall_seconds: float | None = None, busy_seconds: float | None = None, slots: int | None = None,
              picked: int | None = None) -> dict:
    """Evaluations by status, the best network (the evaluation `picked` where the run made a final pick, else the
    best by validation score), how it compares with the initial population, utilisation. One pass over
    `records`, holding none of them but the best (the master passes the journal as it reads it back)."""
    by_status, count, succeeded, best, initial = Counter(), 0, 0, None, []
    for r in records:
        count += 1
        by_status[r.status] += 1
        if r.fitness is None or r.status != Status.OK:
            continue
        succeeded += 1
        if (r.id == picked) if picked is not None else (best is None or r.fitness > best.fitness):
            best = r
        if r.id < population_size:
            initial.append(r.fitness)
    out = {"evaluations": count, "by_status": dict(by_status), "best": None,
           "initial_population_best": max(initial, default=None),
           "initial_population_median": statistics.median(initial) if initial else None, "succeeded": succeeded}
    if best:
        genome = Genome.from_json(best.genome)
        out["best"] = {"id": best.id, "fitness": best.fitness, "params": best.params, "genome": genome.to_json(),
                       "network": genome.describe(), "metrics": dict(best.metrics)}
        if best.origin == FINISH:
            out["best"]["finished"] = {"from": best.parents[0], "epochs": len(best.curve)}
    if workers and wall_seconds:
        out["workers"] = workers
        out["wall_seconds"] = round(wall_seconds, 2)
        if slots and slots != workers:  # packed ranks train several candidates at once: utilization is of those
            out["slots"] = slots
        out["worker_utilization"] = round(busy_seconds / ((slots or workers) * wall_seconds), 4)
    return out


def network(entry: dict) -> str:
    """An entry's genome as one line: its `network`, or the `genome` itself in a summary.json written before the
    genome became a dict."""
    genome = entry["genome"]
    return entry.get("network") or (genome if isinstance(genome, str) else Genome.from_json(genome).describe())


def format_summary(s: dict) -> str:
    lines = [f"evaluations: {s['evaluations']} (" + ", ".join(f"{k} {v}" for k, v in sorted(s["by_status"].items()))
             + ")"]
    if s.get("succeeded") == 0:
        lines.append("no evaluation succeeded: there is no best network")
    if s.get("best"):
        b = s["best"]
        lines.append(f"best fitness: {b['fitness']:.4f} (evaluation {b['id']}, {b['params']:,} parameters)")
        if f := b.get("finished"):
            lines.append(f"  finished: evaluation {f['from']}'s network trained on for {f['epochs']} epochs")
        lines.append(f"best network: {network(b)}")
        if dense := _dense_line(b.get("metrics") or {}):
            lines.append(dense)
    if s.get("initial_population_best") is not None:
        lines.append(f"initial population: best {s['initial_population_best']:.4f}, "
                     f"median {s['initial_population_median']:.4f}")
    if s.get("pareto_front"):
        lines.append(f"Pareto front: {s['pareto_front']} network(s) in front/ (see `galapagos report`)")
    if e := s.get("final_ensemble"):
        lines.append(f"final ensemble: not made: {e['error']}" if "error" in e else
                     f"final ensemble: {e['members']} of {e['kept']} kept networks in {e['dir']}; on val "
                     f"{_line(e['val'], e['task'])} (best network: {_line(e['val_best'], e['task'])})")
    if "worker_utilization" in s:
        of = f"{s['slots']} candidate slots on {s['workers']} workers" if s.get("slots") else f"{s['workers']} workers"
        lines.append(f"worker utilization: {100 * s['worker_utilization']:.1f}% of {of} over "
                     f"the last job's {s['wall_seconds']:.0f} s wall time (start-up and data loading included)")
    return "\n".join(lines)


def metric_keys(task: str) -> tuple[str, ...]:
    """The scores shown for a task (of ensemble.metrics' results)."""
    return {"classification": ("accuracy", "nll", "ece"), "segmentation": ("miou", "pixel_accuracy", "nll")}.get(
        task, ("mse", "mae", "r2"))


def _line(m: dict, task: str) -> str:
    return ", ".join(f"{k} {m[k]:.4f}" for k in metric_keys(task))


def _dense_line(m: dict) -> str | None:
    """The best network's validation scores of a dense task, per class or per target; None for other tasks."""
    if "val_miou" in m:
        iou = " ".join("-" if v is None else f"{v:.3f}" for v in m.get("val_iou", []))
        return (f"best on val: mean IoU {m['val_miou']:.4f}, pixel accuracy {m['val_pixel_accuracy']:.4f}, "
                f"IoU per class [{iou}]")
    if "val_mse_per_target" in m:
        mse = " ".join(f"{v:.4g}" for v in m["val_mse_per_target"])
        return f"best on val: mean R^2 {m['val_r2']:.4f}, MSE {m['val_mse']:.4g}, MSE per target [{mse}]"
    return None


def format_metrics(metrics: dict) -> str:
    """What the CLI prints: per split, the ensemble, its best member (by val) and every member."""
    task = metrics["task"]
    s = metrics["selection"]
    used = sum(w > 0 for w in metrics["weights"].values())
    lines = ["members: " + ", ".join(f"{k} {v}" for k, v in sorted(metrics["status"].items())),
             (f"selection on val ({s['metric']}): best single member {s['single_best']:.4f} -> ensemble "
              f"{s['ensemble']:.4f} with {used} member(s) in {s['picks']} pick(s)")]
    if refit := metrics.get("refit"):
        lines.append(f"refit: {len(refit['members'])} member(s) trained on for {refit['epochs']} epoch(s) on train and "
                     f"val ({refit['seconds']} s); val's scores are from before it")
        if "test_before" in refit:
            lines.append(f"  test before the refit: ensemble {_line(refit['test_before'], task)}")
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


def design_report(run: Path, data: str, ensemble_dir: Path, metrics: dict) -> dict:
    """`galapagos design`'s report: the search's best network and the ensemble on test (val if there is none)."""
    split = "test" if "test" in metrics else "val"
    summary = RunDir(run).summary
    m = metrics[split]
    best = metrics["best_member"]
    return {"data": data, "run": str(run), "ensemble": str(ensemble_dir), "split": split,
            "task": metrics["task"], "evolution": json.loads(summary.read_text()) if summary.exists() else None,
            "best_single": m["run_best"], "ensemble_metrics": m["ensemble"],
            "best_member": {"name": best, **m["members"][best]}, "members": m["members"],
            "weights": metrics["weights"], "status": metrics["status"]}


def format_report(report: dict) -> str:
    task, split = report["task"], report["split"]
    used = sum(w > 0 for w in report["weights"].values())
    return "\n".join([
        f"design report on {split} ({report['ensemble_metrics']['samples']} samples):",
        f"  best single network  {_line(report['best_single'], task)}  ({RunDir(report['run']).best})",
        f"  best member          {_line(report['best_member'], task)}  ({report['best_member']['name']})",
        (f"  ensemble             {_line(report['ensemble_metrics'], task)}  ({report['ensemble']}, {used} of "
         f"{len(report['members'])} members used)"),
        f"report: {RunDir(report['run']).report}"])


def run_report(path: str | Path, top: int = 5) -> dict:
    """What a directory amounts to, with its `kind`: an evolution run ("run": its summary, summary.json's timing
    figures included, and its `top` evaluations), a design ("design": the run's, and its ensemble's metrics under
    "ensemble"), or an ensemble directory ("ensemble": its metrics)."""
    from galapagos.config import load_config
    from galapagos.errors import RunDirError

    path = Path(path)
    if (ensemble := EnsembleDir(path)).manifest.is_file():
        if not ensemble.metrics.exists():
            raise RunDirError(f"{path}: the ensemble is not built yet (no {ensemble.metrics.name}): finish it with "
                              "`galapagos ensemble --resume`")
        return {"kind": "ensemble", "dir": str(path), "ensemble": json.loads(ensemble.metrics.read_text())}
    run = RunDir(path)
    if not run.journal.exists():
        raise RunDirError(f"{path}: no {run.journal.name} (not a run, design or ensemble directory)")
    records = run.read_journal()
    config = load_config(run.config if run.config.exists() else None)
    summary = summarize(records, population_size=config.evolution.population_size)
    if run.summary.exists():
        saved = json.loads(run.summary.read_text())
        summary.update({k: v for k, v in saved.items() if k in ("workers", "slots", "wall_seconds",
                                                                    "worker_utilization", "search_seconds")})
    best = sorted((r for r in records if r.fitness is not None), key=lambda r: r.fitness, reverse=True)[:top]
    summary["top"] = [{"id": r.id, "fitness": r.fitness, "status": r.status, "genome": g.to_json(),
                       "network": g.describe()} for r in best for g in [Genome.from_json(r.genome)]]
    if (front := run.read_front()) is not None:
        summary["pareto"], summary["pareto_front"] = front, len(front["members"])
    built = EnsembleDir(run.ensemble).metrics
    if built.exists():
        summary["ensemble"] = json.loads(built.read_text())
    return {"kind": "design" if built.exists() else "run", "dir": str(path), **summary}


def format_pareto(report: dict) -> str:
    """The run's Pareto front (several objectives), one member per line, best fitness first."""
    lines = [f"Pareto front ({', '.join(f'{k} {v}' for k, v in report['pareto']['objectives'])}); "
             f"predict --model {report['dir']} --pick ID:",
             f"  {'id':>5}  {'fitness':>7}  {'params':>10}  {'latency_ms':>10}"]
    lines += [f"  {m['id']:>5}  {m['fitness']:.4f}  {m['params']:>10,}  "
              + ("         -" if m["latency_ms"] is None else f"{m['latency_ms']:>10.3f}")
              for m in report["pareto"]["members"]]
    return "\n".join(lines)


def format_run_report(report: dict) -> str:
    if report["kind"] == "ensemble":
        return format_metrics(report["ensemble"])
    lines = [format_summary(report)]
    if report["top"]:
        lines.append(f"top {len(report['top'])}:")
        lines += [f"  {r['id']:>5}  {r['fitness']:.4f}  {r['status']:<6} {network(r)}" for r in report["top"]]
    if "pareto" in report:
        lines.append(format_pareto(report))
    if "ensemble" in report:
        lines += [f"ensemble ({RunDir(report['dir']).ensemble}):", format_metrics(report["ensemble"])]
    return "\n".join(lines)
