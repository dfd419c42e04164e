"""`report --html`: one self-contained HTML file (plots as inline PNG made by matplotlib, no script or style to
fetch) that opens on a login node or a laptop.

For an evolution run: best fitness over evaluations and over time (a second run, e.g. a random search, beside it),
fitness against parameter count with the Pareto front, learning curves of the top networks, a worker timeline
(a row per worker, a bar per evaluation coloured by status), the genealogy of the best network and the counts by
status. For an ensemble (or a design's): the members' weights, the ensemble against each member, and, when its
data file is at hand, calibration and uncertainty on the test split.
"""
from __future__ import annotations

import base64
import html
import io
import json
import tempfile
from pathlib import Path

import numpy as np

from galapagos.errors import RunDirError
from galapagos.evolve.pareto import Front, objective_values
from galapagos.reports.summary import format_metrics, format_pareto, format_summary, run_report
from galapagos.store.ensembledir import is_ensemble, load_manifest
from galapagos.store.journal import JournalRecord
from galapagos.store.rundir import RunDir

COLORS = {"ok": "#2a9d8f", "pruned": "#e9c46a", "failed": "#e76f51", "timeout": "#9b5de5", "crashed": "#d62828",
          "lost": "#6c757d"}
STYLE = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}
figure{margin:1.5em 0}img{max-width:100%}figcaption{color:#555;font-size:90%}pre{background:#f6f6f6;padding:1em;
overflow-x:auto}h2{border-bottom:1px solid #ddd;padding-bottom:.2em}"""
# Marks, once the page has loaded, how many plots the browser decoded (the test in a headless browser reads it).
CHECK = """<script>window.addEventListener("load",()=>{document.body.dataset.rendered=
[...document.images].filter(i=>i.complete&&i.naturalWidth>0).length;});</script>"""


def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


class Page:
    def __init__(self, title: str):
        self.title, self.parts, self.plots = title, [], 0

    def heading(self, text: str) -> None:
        self.parts.append(f"<h2>{html.escape(text)}</h2>")

    def text(self, text: str) -> None:
        self.parts.append(f"<pre>{html.escape(text)}</pre>")

    def figure(self, fig, caption: str) -> None:
        self.plots += 1
        self.parts.append(f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{_png(fig)}">'
                          f"<figcaption>{html.escape(caption)}</figcaption></figure>")

    def render(self) -> str:
        return (f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(self.title)}</title>'
                f'<style>{STYLE}</style></head><body data-plots="{self.plots}"><h1>{html.escape(self.title)}</h1>'
                + "\n".join(self.parts) + CHECK + "</body></html>\n")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _ordered(records: list[JournalRecord]) -> list[JournalRecord]:
    return sorted(records, key=lambda r: (r.end or 0, r.id))


def _best_so_far(records: list[JournalRecord]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(evaluation number, minutes since the first start, best fitness so far) in the order they finished."""
    rs = _ordered(records)
    t0 = min((r.start for r in rs if r.start), default=0)
    best, ys = -np.inf, []
    for r in rs:
        if r.status == "ok" and r.fitness is not None:
            best = max(best, r.fitness)
        ys.append(best if np.isfinite(best) else np.nan)
    return np.arange(1, len(rs) + 1), np.array([((r.end or t0) - t0) / 60 for r in rs]), np.array(ys)


def progress_plot(page: Page, records: list[JournalRecord], compare: tuple[str, list[JournalRecord]] | None) -> None:
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.6))
    for name, recs, style in [("this run", records, "-"), *([(compare[0], compare[1], "--")] if compare else [])]:
        n, t, best = _best_so_far(recs)
        a.step(n, best, style, where="post", label=name)
        b.step(t, best, style, where="post", label=name)
    a.set(xlabel="evaluations", ylabel="best fitness so far")
    b.set(xlabel="minutes", ylabel="best fitness so far")
    for ax in (a, b):
        ax.grid(alpha=.3)
        ax.legend()
    page.figure(fig, "Best fitness over evaluations and over time" + (f", beside {compare[0]}" if compare else ""))


def cost_plot(page: Page, records: list[JournalRecord], cost: str) -> None:
    """Fitness against one cost objective (params or latency), with the front of the two (fitter and cheaper)."""
    plt = _plt()
    points = {r.id: v for r in records
              if r.status == "ok" and (v := objective_values(r, ("fitness", cost))) is not None}
    label = {"params": "parameters", "latency": "latency (ms per sample)"}[cost]
    fig, ax = plt.subplots(figsize=(7, 4))
    if points:
        ax.scatter(*zip(*((c, f) for f, c in points.values())), s=12, alpha=.5, color=COLORS["ok"],
                   label="evaluations")
        front = Front(("fitness", cost))
        for i, v in points.items():
            front.add(i, v)
        steps = sorted((c, f) for f, c in front.members.values())
        ax.step(*zip(*steps), "-o", where="post", color="#264653", ms=4, label="Pareto front")
        ax.set_xscale("log")
        ax.legend()
    ax.set(xlabel=label, ylabel="fitness")
    ax.grid(alpha=.3)
    page.figure(fig, f"Fitness against {label}, with the Pareto front of the two (fitter and cheaper)")


def curves_plot(page: Page, records: list[JournalRecord], top: int = 8) -> None:
    plt = _plt()
    best = sorted((r for r in records if r.status == "ok" and r.curve), key=lambda r: -r.fitness)[:top]
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in best:
        ax.plot(range(1, len(r.curve) + 1), r.curve, marker=".", label=f"#{r.id} ({r.fitness:.3f})")
    ax.set(xlabel="epoch", ylabel="validation fitness")
    ax.grid(alpha=.3)
    if best:
        ax.legend(fontsize=8)
    page.figure(fig, f"Learning curves of the top {len(best)} networks")


def timeline_plot(page: Page, records: list[JournalRecord]) -> None:
    plt = _plt()
    timed = [r for r in records if r.start and r.end]
    t0 = min((r.start for r in timed), default=0)
    t1 = max((r.end for r in timed), default=1)
    ranks = sorted({r.rank for r in timed})
    fig, ax = plt.subplots(figsize=(11, 0.5 + 0.35 * max(len(ranks), 2)))
    busy = 0.0
    for row, rank in enumerate(ranks):
        mine = [r for r in timed if r.rank == rank]
        busy += sum(r.end - r.start for r in mine)
        ax.broken_barh([((r.start - t0) / 60, (r.end - r.start) / 60) for r in mine], (row - .4, .8),
                       facecolors=[COLORS.get(r.status, "#999") for r in mine])
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.set_xlabel("minutes")
    ax.set_xlim(0, max((t1 - t0) / 60, 1e-3))
    for status, color in COLORS.items():
        if any(r.status == status for r in timed):
            ax.bar(0, 0, color=color, label=status)
    ax.legend(loc="upper right", fontsize=8, ncols=len(COLORS))
    use = busy / max(len(ranks) * (t1 - t0), 1e-9)
    page.figure(fig, f"Worker timeline: a bar per evaluation, coloured by status; utilization {use:.1%} of "
                     f"{len(ranks)} worker(s) between the first start and the last end")


def genealogy_plot(page: Page, records: list[JournalRecord], depth: int = 6) -> None:
    """The best network and its ancestors, a row per generation back."""
    plt = _plt()
    by_id = {r.id: r for r in records}
    ok = [r for r in records if r.status == "ok" and r.fitness is not None]
    fig, ax = plt.subplots(figsize=(11, 4))
    if ok:
        best = max(ok, key=lambda r: r.fitness)
        rows, edges, seen = [[best.id]], [], {best.id}
        while len(rows) < depth and rows[-1]:
            nxt = []
            for child in rows[-1]:
                for p in by_id[child].parents or []:
                    edges.append((child, p))
                    if p in by_id and p not in seen:
                        seen.add(p)
                        nxt.append(p)
            rows.append(nxt[:12])
        pos = {i: (k - (len(row) - 1) / 2, -g) for g, row in enumerate(rows) for k, i in enumerate(row)}
        for child, parent in edges:
            if child in pos and parent in pos:
                ax.plot(*zip(pos[child], pos[parent]), color="#aaa", zorder=1)
        for i, (x, y) in pos.items():
            r = by_id[i]
            ax.scatter([x], [y], s=300, color=COLORS.get(r.status, "#999"), zorder=2)
            fit = "-" if r.fitness is None else f"{r.fitness:.3f}"
            ax.annotate(f"#{i}\n{fit}\n{'' if r.origin is None else r.origin}", (x, y), ha="center", va="center",
                        fontsize=6)
    ax.axis("off")
    page.figure(fig, "Genealogy of the best network: its parents, theirs, and so on (id, fitness, origin)")


def status_plot(page: Page, records: list[JournalRecord]) -> None:
    plt = _plt()
    counts = {s: sum(r.status == s for r in records) for s in {r.status for r in records}}
    fig, ax = plt.subplots(figsize=(6, 2.8))
    names = sorted(counts, key=lambda s: -counts[s])
    ax.bar(names, [counts[s] for s in names], color=[COLORS.get(s, "#999") for s in names])
    ax.set_ylabel("evaluations")
    page.figure(fig, "Evaluations by status")


def ensemble_plots(page: Page, root: Path, metrics: dict) -> None:
    plt = _plt()
    task = metrics["task"]
    key = {"classification": "accuracy", "segmentation": "miou"}.get(task, "r2")
    split = "test" if "test" in metrics else "val"
    names = list(metrics[split]["members"])
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.6))
    a.bar(names, [metrics["weights"].get(n, 0) for n in names], color="#264653")
    a.set(ylabel="weight", title="members' weights")
    scores = [metrics[split]["members"][n][key] for n in names]
    b.bar([*names, "ensemble"], [*scores, metrics[split]["ensemble"][key]],
          color=["#8ab17d"] * len(names) + ["#e76f51"])
    b.set(ylabel=f"{split} {key}", title="the ensemble against each member")
    lo = min([*scores, metrics[split]["ensemble"][key]])
    b.set_ylim(max(0.0, lo - 0.1) if task == "classification" else None)
    for ax in (a, b):
        ax.tick_params(axis="x", rotation=45)
    page.figure(fig, f"Ensemble members, their weights, and the ensemble against each member on {split}")
    if task in ("segmentation", "field"):
        page.text("Calibration and uncertainty plots are drawn for classification and regression ensembles.")
        return
    data = load_manifest(root).sources.get("data") if is_ensemble(root) else None
    if not data or not Path(data).exists():
        page.text(f"Calibration and uncertainty need the ensemble's data file ({data or 'unknown'}), not found here.")
        return
    import h5py

    from galapagos.flows.prediction import predict_ensemble

    with tempfile.TemporaryDirectory() as tmp:
        predict_ensemble(root, data, split, save=Path(tmp) / "p.h5", per_member=False)
        with h5py.File(Path(tmp) / "p.h5") as f:
            saved = {k: f[k][()] for k in f}
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    if task == "classification":
        p, y = saved["probabilities"], saved["y"]
        conf, right = p.max(1), p.argmax(1) == y
        edges = np.linspace(0, 1, 11)
        bins = np.clip(np.digitize(conf, edges) - 1, 0, 9)
        centers = [(edges[k] + edges[k + 1]) / 2 for k in range(10) if (bins == k).any()]
        acc = [right[bins == k].mean() for k in range(10) if (bins == k).any()]
        a.plot([0, 1], [0, 1], ":", color="#999")
        a.plot(centers, acc, "o-", color="#e76f51")
        a.set(xlabel="confidence", ylabel="accuracy", title="reliability (calibration)")
        b.hist([saved["entropy"][right], saved["entropy"][~right]], bins=20, label=["right", "wrong"],
               color=["#2a9d8f", "#e76f51"])
        b.set(xlabel="predictive entropy (nats)", title="uncertainty, right against wrong predictions")
        b.legend()
    else:
        pred, y, std = saved["predictions"][:, 0], saved["y"].reshape(len(saved["y"]), -1)[:, 0], saved["std"][:, 0]
        a.errorbar(y, pred, yerr=std, fmt=".", alpha=.5, color="#264653")
        a.plot([y.min(), y.max()], [y.min(), y.max()], ":", color="#999")
        a.set(xlabel="true (first target)", ylabel="predicted", title="predictions, ± between-member std")
        b.scatter(std, np.abs(pred - y), s=8, alpha=.5, color="#e76f51")
        b.set(xlabel="between-member std", ylabel="absolute error", title="uncertainty against error")
    page.figure(fig, f"Calibration and uncertainty of the ensemble on {split} ({data})")


def write_report(path: str | Path, out: str | Path, *, compare: str | Path | None = None) -> Path:
    """Write the HTML report of the run, design or ensemble directory `path` to `out`."""
    try:
        _plt()
    except ImportError:
        raise RunDirError("--html needs matplotlib (pip install matplotlib)") from None
    path, out = Path(path), Path(out)
    if not out.absolute().parent.is_dir():
        raise RunDirError(f"--html {out}: directory {out.absolute().parent} does not exist")
    report = run_report(path)
    page = Page(f"Galapagos report: {path}")
    if report["kind"] != "ensemble":
        if compare and not RunDir(compare).journal.exists():
            raise RunDirError(f"--compare {compare}: no {RunDir(compare).journal.name} (not a run directory)")
        records = RunDir(path).read_journal()
        other = (str(compare), RunDir(compare).read_journal()) if compare else None
        page.heading("Search")
        page.text(format_summary(report))
        progress_plot(page, records, other)
        if "pareto" in report:
            page.text(format_pareto(report))
        cost_plot(page, records, "params")
        if any((r.metrics or {}).get("latency_ms") for r in records):
            cost_plot(page, records, "latency")
        curves_plot(page, records)
        timeline_plot(page, records)
        genealogy_plot(page, records)
        status_plot(page, records)
    if "ensemble" in report:
        root = path if report["kind"] == "ensemble" else RunDir(path).ensemble
        page.heading("Ensemble")
        page.text(format_metrics(report["ensemble"]))
        ensemble_plots(page, root, report["ensemble"])
    page.parts.append(f"<details><summary>the report as JSON (galapagos report --json)</summary><pre>"
                      f"{html.escape(json.dumps(report, indent=1, default=str))}</pre></details>")
    out.write_text(page.render())
    return out
