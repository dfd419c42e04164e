"""`design`: one job that evolves into DIR, trains the ensemble on the same workers into DIR/ensemble, and
reports the search's best network, the best member and the ensemble."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from galapagos.evolve.files import write_json
from galapagos.flows import ensembling, evolution
from galapagos.errors import NoResult
from galapagos.flows.mpijob import Flow, starting
from galapagos.options import EvolveOptions
from galapagos.reports.summary import design_report
from galapagos.launch.protocol import SetupFailed
from galapagos.launch.runtime import stop_signal
from galapagos.launch.session import master_start


def master(comm: Any, opts: EvolveOptions) -> dict:
    """Rank 0: {"evolution": summary, "ensemble": metrics, "report": report}, less what a stop signal cut off."""
    try:
        summary = evolution.master(comm, opts)
    except NoResult:
        master_start(comm, SetupFailed("no evaluation succeeded"))  # the workers wait for a second phase
        raise
    out = Path(opts.out)
    if stopped := stop_signal():
        master_start(comm, SetupFailed(f"stopped by {stopped}"))  # the workers wait for a second phase
        return {"evolution": summary, "stopped_by": stopped}
    if summary.get("lost_ranks"):  # a lost rank would never join the second phase's start; the job is ended
        master_start(comm, SetupFailed("worker ranks were lost"))
        return {"evolution": summary}
    with starting(comm):
        job = ensembling.prepare(out, opts.data, out / "ensemble")
    metrics = ensembling.build(comm, job)
    if "stopped_by" in metrics:
        return {"evolution": summary, "ensemble": metrics, "stopped_by": metrics["stopped_by"]}
    report = design_report(out, opts.data, job.out.path, metrics)
    write_json(out / "report.json", report)
    return {"evolution": summary, "ensemble": metrics, "report": report}


FLOW = Flow("design", evolution.check, master, salvage=evolution.salvage)
