"""`report --html`: one self-contained, interactive HTML file that opens offline, on a login node or a laptop.

The plotting library is plotly.js as the `plotly` package ships it (the one Optuna and optuna-dashboard draw with),
inlined in the page with the run's data as one JSON block; nothing is fetched. Every plot zooms, pans and hovers;
hovering a point shows the candidate's network and metrics, clicking it shows its whole genome and picks its row
in the table.

For an evolution run: every evaluation over time coloured by status with the best so far (another run, e.g. a
random search, beside it), the intermediate values (fitness after each epoch) of every candidate, pruned ones
included, fitness against parameter count (and latency) with the Pareto front, parameter importance, parallel
coordinates, a worker timeline, the genealogy of the best network, the counts by status and a sortable table of
evaluations. For an ensemble (or a design's): the members' weights, the ensemble against each member, the members'
diversity, and, when its data file is at hand, calibration and uncertainty on the test split.

The same page is what `report --serve` (galapagos/reports/serve.py) gives, polling :func:`payload` as the journal
grows. The journal is only read here, never repaired: a line the master is still writing is left for the next read.
"""
from __future__ import annotations

import html
import json
import math
import tempfile
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from galapagos.errors import RunDirError
from galapagos.evolve.genome import Genome
from galapagos.evolve.pareto import Front, objective_values
from galapagos.reports.summary import format_metrics, format_pareto, format_summary, run_report, summarize
from galapagos.reports.tables import genome_params, iso
from galapagos.store.ensembledir import is_ensemble, load_manifest
from galapagos.store.journal import JournalRecord
from galapagos.store.rundir import JournalDir, RunDir

COLORS = {"ok": "#2a9d8f", "pruned": "#e9a23b", "failed": "#e76f51", "timeout": "#9b5de5", "crashed": "#d62828",
          "lost": "#6c757d"}
IMPORTANCE = ("correlation ratio \u03b7\u00b2 of fitness on each genome parameter, over the evaluations that "
              "succeeded: the share of fitness variance explained by the parameter's value (numeric parameters with "
              "more than 5 values grouped into 5 quantile bins); 0 = no relation, 1 = the parameter decides fitness. "
              "A marginal, one-parameter-at-a-time measure, like a single-feature ANOVA; small runs overstate it.")


def read_records(path: str | Path) -> tuple[list[JournalRecord], int]:
    """The journal's complete lines and the bytes they span. Read only: a last line without its newline (the master
    is writing it) is left for the next read, where read_journal would cut it off."""
    journal = JournalDir(path).journal
    try:
        data = journal.read_bytes()
    except FileNotFoundError:
        return [], 0
    end = data.rfind(b"\n") + 1
    out = []
    for line in data[:end].splitlines():
        if line.strip():
            out.append(JournalRecord.from_dict(json.loads(line)))
    return out, end


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _network(genome: Any) -> str:
    try:
        return Genome.from_json(genome).describe()
    except Exception:  # noqa: BLE001 - a journal of another version: show it, do not fail the report
        return json.dumps(genome)[:200]


def _params(genome: Any) -> dict:
    try:
        return genome_params(genome)
    except Exception:  # noqa: BLE001 - as above
        return {}


def evaluation(r: JournalRecord, t0: float) -> dict:
    """What the page knows of one evaluation (times in minutes since the run's first start)."""
    return {"id": r.id, "status": r.status, "fitness": _number(r.fitness), "size": r.params,
            "start": None if r.start is None else (r.start - t0) / 60, "end": None if r.end is None else
            (r.end - t0) / 60, "finished": iso(r.end), "seconds": None if not (r.start and r.end) else
            round(r.end - r.start, 3), "rank": r.rank, "host": r.host,
            "origin": r.origin if isinstance(r.origin, (str, type(None))) else json.dumps(r.origin),
            "parents": list(r.parents or []), "curve": [_number(v) for v in r.curve or []],
            "network": _network(r.genome), "genome": r.genome, "params": _params(r.genome),
            "metrics": {k: v for k, v in (r.metrics or {}).items() if _number(v) is not None or isinstance(v, str)},
            "error": r.error.strip().splitlines()[-1] if r.error else None, "name": r.name}


def correlation_ratio(values: list, y: np.ndarray, bins: int = 5) -> float | None:
    """eta^2 of y on one parameter's values (see IMPORTANCE); None when the parameter never varies."""
    keep = [i for i, v in enumerate(values) if v is not None]
    if len(keep) < 3:
        return None
    vals, y = [values[i] for i in keep], y[keep]
    if len(set(vals)) < 2:
        return None
    if all(isinstance(v, (int, float)) for v in vals) and len(set(vals)) > bins:
        edges = np.quantile(np.asarray(vals, float), np.linspace(0, 1, bins + 1)[1:-1])
        vals = list(np.searchsorted(edges, np.asarray(vals, float), side="right"))
    total = float(((y - y.mean()) ** 2).sum())
    if total == 0:
        return None
    groups: dict[Any, list[float]] = {}
    for v, f in zip(vals, y):
        groups.setdefault(v, []).append(f)
    between = sum(len(g) * (np.mean(g) - y.mean()) ** 2 for g in groups.values())
    return float(between / total)


def importance(evals: list[dict]) -> list[dict]:
    ok = [e for e in evals if e["status"] == "ok" and e["fitness"] is not None and e["params"]]
    if len(ok) < 4:
        return []
    y = np.array([e["fitness"] for e in ok])
    names = list(dict.fromkeys(k for e in ok for k in e["params"]))
    out = [{"name": n, "eta2": eta} for n in names
           if (eta := correlation_ratio([e["params"].get(n) for e in ok], y)) is not None]
    return sorted(out, key=lambda d: d["eta2"])


def fronts(records: list[JournalRecord]) -> dict[str, list[int]]:
    """Ids on the front of fitness against each cost (parameters, latency): fitter and cheaper."""
    out = {}
    for cost in ("params", "latency"):
        front = Front(("fitness", cost))
        for r in records:
            if r.status == "ok" and (v := objective_values(r, ("fitness", cost))) is not None:
                front.add(r.id, v)
        out[cost] = sorted(front.members, key=lambda i: front.members[i][1])
    return out


def genealogy(evals: list[dict], depth: int = 8, width: int = 16) -> dict:
    """The best network and its ancestors, a row per generation back: node positions and edges."""
    by_id = {e["id"]: e for e in evals}
    ok = [e for e in evals if e["status"] == "ok" and e["fitness"] is not None]
    if not ok:
        return {"nodes": [], "edges": []}
    best = max(ok, key=lambda e: e["fitness"])
    rows, edges, seen = [[best["id"]]], [], {best["id"]}
    while len(rows) < depth and rows[-1]:
        nxt = []
        for child in rows[-1]:
            for p in by_id[child]["parents"]:
                if p in by_id:
                    edges.append((child, p))
                    if p not in seen and len(nxt) < width:
                        seen.add(p)
                        nxt.append(p)
        rows.append(nxt)
    nodes = [{"id": i, "x": k - (len(row) - 1) / 2, "y": -g} for g, row in enumerate(rows) for k, i in enumerate(row)]
    placed = {n["id"] for n in nodes}
    return {"nodes": nodes, "edges": [e for e in edges if e[0] in placed and e[1] in placed]}


def run_payload(path: str | Path, compare: str | Path | None = None) -> dict:
    """Everything the page draws of an evolution run, from its journal as it stands (also while it runs)."""
    from galapagos.config import load_config

    run = RunDir(path)
    records, size = read_records(path)
    config = load_config(run.config if run.config.exists() else None)
    summary = summarize(records, population_size=config.evolution.population_size)
    if run.summary.exists():
        try:
            saved = json.loads(run.summary.read_text())
            summary.update({k: v for k, v in saved.items() if k in ("workers", "slots", "wall_seconds",
                                                                        "worker_utilization")})
        except (OSError, ValueError):
            pass
    t0 = min((r.start for r in records if r.start), default=0.0)
    evals = [evaluation(r, t0) for r in sorted(records, key=lambda r: (r.end or 0, r.id))]
    timed = [r for r in records if r.start and r.end]
    ranks = {r.rank for r in timed}
    span = max((r.end for r in timed), default=0) - min((r.start for r in timed), default=0)
    busy = sum(r.end - r.start for r in timed)
    out = {"kind": "run", "version": size, "started": iso(t0) if records else None, "evaluations": evals,
           "summary": format_summary(summary), "fronts": fronts(records), "importance": importance(evals),
           "genealogy": genealogy(evals), "importance_method": IMPORTANCE, "colors": COLORS,
           "busy": {"share": busy / (len(ranks) * span) if span > 0 else None, "workers": len(ranks),
                    "minutes": span / 60}}
    if (front := run.read_front()) is not None:
        out["pareto_text"] = format_pareto({"pareto": front, "dir": str(path)})
    if compare:
        other, _ = read_records(compare)
        c0 = min((r.start for r in other if r.start), default=0.0)
        out["compare"] = {"name": str(compare), "evaluations": [
            {"fitness": _number(r.fitness), "status": r.status, "end": None if r.end is None else (r.end - c0) / 60}
            for r in sorted(other, key=lambda r: (r.end or 0, r.id))]}
    return out


def _histogram(values: np.ndarray, edges: np.ndarray) -> list[int]:
    return np.histogram(values, bins=edges)[0].tolist()


def ensemble_payload(root: Path, metrics: dict) -> dict:
    """The ensemble's members, weights and scores; with its data file, calibration, uncertainty and the members'
    diversity (how often two members disagree, or how their errors correlate) on the split it was scored on."""
    task = metrics["task"]
    key = {"classification": "accuracy", "segmentation": "miou"}.get(task, "r2")
    split = "test" if "test" in metrics else "val"
    names = list(metrics[split]["members"])
    records, _ = read_records(root)
    networks = {r.name: _network(r.genome) for r in records if r.name}
    out: dict[str, Any] = {"task": task, "key": key, "split": split, "summary": format_metrics(metrics),
                           "members": [{"name": n, "weight": metrics["weights"].get(n, 0),
                                        "score": metrics[split]["members"][n][key], "network": networks.get(n, "")}
                                       for n in names],
                           "ensemble_score": metrics[split]["ensemble"][key]}
    if task in ("segmentation", "field"):
        out["note"] = "Calibration, uncertainty and diversity are drawn for classification and regression ensembles."
        return out
    data = load_manifest(root).sources.get("data") if is_ensemble(root) else None
    if not data or not Path(data).exists():
        out["note"] = (f"Calibration, uncertainty and the members' diversity need the ensemble's data file "
                       f"({data or 'unknown'}), not found here.")
        return out
    import h5py

    from galapagos.flows.prediction import predict_ensemble

    with tempfile.TemporaryDirectory() as tmp:
        predict_ensemble(root, data, split, save=Path(tmp) / "p.h5", per_member=True)
        with h5py.File(Path(tmp) / "p.h5") as f:
            saved = {k: f[k][()] for k in f}
            used = [str(n) for n in f.attrs["members"]]
    out["data"], out["used"] = str(data), used
    if task == "classification":
        p, y = saved["probabilities"], saved["y"]
        conf, right = p.max(1), p.argmax(1) == y
        edges = np.linspace(0, 1, 11)
        bins = np.clip(np.digitize(conf, edges) - 1, 0, 9)
        filled = [k for k in range(10) if (bins == k).any()]
        out["calibration"] = {"confidence": [float(conf[bins == k].mean()) for k in filled],
                              "accuracy": [float(right[bins == k].mean()) for k in filled],
                              "count": [int((bins == k).sum()) for k in filled]}
        ent = saved["entropy"]
        e_edges = np.linspace(0, max(float(ent.max()), 1e-6), 21)
        out["uncertainty"] = {"centers": ((e_edges[1:] + e_edges[:-1]) / 2).tolist(),
                              "right": _histogram(ent[right], e_edges), "wrong": _histogram(ent[~right], e_edges)}
        labels = saved["member_probabilities"].argmax(-1)  # (members, samples)
        out["diversity"] = {"what": "share of samples on which two members predict different classes",
                            "matrix": [[float((a != b).mean()) for b in labels] for a in labels]}
    else:
        pred = saved["predictions"].reshape(len(saved["predictions"]), -1)[:, 0]
        y = saved["y"].reshape(len(saved["y"]), -1)[:, 0]
        std = saved["std"].reshape(len(saved["std"]), -1)[:, 0]
        pick = np.linspace(0, len(y) - 1, min(len(y), 2000)).astype(int) if len(y) else np.array([], int)
        out["regression"] = {"y": y[pick].tolist(), "pred": pred[pick].tolist(), "std": std[pick].tolist()}
        members = saved["member_predictions"].reshape(saved["member_predictions"].shape[0], len(y), -1)[:, :, 0]
        errors = members - y[None]
        corr = np.corrcoef(errors) if len(y) > 1 else np.eye(len(members))
        out["diversity"] = {"what": "correlation of two members' errors on the first target (lower: more diverse)",
                            "matrix": np.nan_to_num(np.atleast_2d(corr), nan=1.0).tolist()}
    return out


def payload(path: str | Path, compare: str | Path | None = None, *, ensemble: bool = True) -> dict:
    """The page's data for a run, design or ensemble directory (`ensemble`: with the ensemble's section, which
    predicts on its data file; the live page leaves it out)."""
    path = Path(path)
    if is_ensemble(path):
        report = run_report(path)
        out: dict[str, Any] = {"kind": "ensemble", "version": 0}
        if ensemble:
            out["ensemble"] = ensemble_payload(path, report["ensemble"])
    else:
        out = run_payload(path, compare)
        built = RunDir(path).ensemble
        if ensemble and (built / "metrics.json").exists() and is_ensemble(built):
            out["kind"] = "design"
            out["ensemble"] = ensemble_payload(built, json.loads((built / "metrics.json").read_text()))
    out["title"] = f"Galapagos report: {path}"
    out["made"] = iso(datetime.now(timezone.utc).timestamp())
    return out


@lru_cache(maxsize=1)
def plotly_js() -> str:
    """plotly.min.js as the plotly package ships it (read once per process)."""
    from importlib import resources

    try:
        return (resources.files("plotly") / "package_data" / "plotly.min.js").read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError):
        raise RunDirError("the HTML report needs the plotly package (pip install plotly)") from None


@lru_cache(maxsize=1)
def app_js() -> str:
    """report.js beside this module: the app that draws the data with plotly.js."""
    return (Path(__file__).with_name("report.js")).read_text(encoding="utf-8")


def _json_script(data: dict) -> str:
    text = json.dumps(data, allow_nan=False, default=str, separators=(",", ":"))
    return text.replace("<", "\\u003c")  # "<" only occurs in strings, where this is the same character


def page(data: dict, live: str | None = None) -> str:
    """The whole HTML page: plotly.js, the data and the app that draws it (`live`: the URL of the data to poll)."""
    title = html.escape(data["title"])
    setup = f"window.GALAPAGOS_LIVE={json.dumps(live)};" if live else ""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
            f'content="width=device-width,initial-scale=1"><title>{title}</title><style>{STYLE}</style>'
            f"<script>{plotly_js()}</script></head><body><header><h1>{title}</h1>"
            f'<p id="made"></p></header><main id="app"></main>'
            f'<aside id="selected" hidden><button id="close" title="close">\u00d7</button><div></div></aside>'
            f'<script type="application/json" id="galapagos-data">{_json_script(data)}</script>'
            f"<script>{setup}{app_js()}</script></body></html>\n")


def write_report(path: str | Path, out: str | Path, *, compare: str | Path | None = None) -> Path:
    """Write the HTML report of the run, design or ensemble directory `path` to `out`."""
    path, out = Path(path), Path(out)
    if not out.absolute().parent.is_dir():
        raise RunDirError(f"--html {out}: directory {out.absolute().parent} does not exist")
    run_report(path)  # the same checks and messages as `report` (not a run directory, an unbuilt ensemble)
    if compare and not RunDir(compare).journal.exists():
        raise RunDirError(f"--compare {compare}: no {RunDir(compare).journal.name} (not a run directory)")
    plotly_js()
    out.write_text(page(payload(path, compare)), encoding="utf-8")
    return out


STYLE = """body{font-family:system-ui,sans-serif;margin:0 auto;max-width:1400px;padding:0 1.5em 4em;color:#222}
h1{font-size:1.5em;margin:.8em 0 .1em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
#made{color:#666;margin:0}pre{background:#f6f6f6;padding:.8em 1em;overflow-x:auto;font-size:90%}
figure{margin:1.2em 0}figcaption{color:#555;font-size:90%;max-width:70em}.plot{width:100%;min-height:380px}
table{border-collapse:collapse;font-size:85%;width:100%}th,td{padding:.25em .5em;border-bottom:1px solid #eee;
text-align:right;white-space:nowrap}td.net{text-align:left;white-space:normal;font-family:monospace}
th{cursor:pointer;position:sticky;top:0;background:#fafafa;user-select:none}th:hover{background:#eee}
tr.picked{background:#fff3c4}tbody tr{cursor:pointer}.scroll{max-height:32em;overflow:auto;border:1px solid #ddd}
#selected{position:fixed;right:1em;bottom:1em;width:min(36em,90vw);max-height:45vh;overflow:auto;background:#fff;
border:1px solid #bbb;box-shadow:0 2px 12px #0003;padding:.6em 1em;font-size:90%}#selected pre{margin:.3em 0}
#close{float:right;border:0;background:none;font-size:1.4em;cursor:pointer}.live{color:#2a9d8f}"""
