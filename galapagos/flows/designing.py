"""`design`: one job that evolves into DIR, trains the ensemble on the same workers into DIR/ensemble, and
reports the search's best network, the best member and the ensemble. `--resume` continues the search, then
finishes the ensemble's build (or starts it)."""
from __future__ import annotations

from typing import Any

from galapagos.errors import NoResult
from galapagos.evolve.files import write_json
from galapagos.flows import ensembling, evolution
from galapagos.flows.mpijob import Flow
from galapagos.flows.session import MasterSession
from galapagos.launch.signals import stop_signal
from galapagos.options import EvolveOptions
from galapagos.reports.summary import design_report
from galapagos.store.ensembledir import EnsembleDir
from galapagos.store.rundir import RunDir


def master(comm: Any, opts: EvolveOptions) -> dict:
    """Rank 0: {"evolution": summary, "ensemble": metrics, "report": report}, less what a stop signal cut off."""
    with MasterSession(comm) as session:
        try:
            summary = evolution.evolve(session, opts)
        except NoResult:
            session.fail("no evaluation succeeded")  # the workers wait for a second phase
            raise
        out = RunDir(opts.out)
        if stopped := stop_signal():
            session.fail(f"stopped by {stopped}")
            return {"evolution": summary, "stopped_by": stopped}
        if summary.get("lost_ranks"):  # a lost rank would never join the second phase's start; the job is ended
            session.fail("worker ranks were lost")
            return {"evolution": summary}
        with session.starting():  # --resume finishes a build begun (its plan written) or starts it
            begun = opts.resume and EnsembleDir(out.ensemble).plan.exists()
            job = ensembling.prepare(out.path, opts.data, out.ensemble, resume=begun)
        metrics = ensembling.build(session, job)
    if "stopped_by" in metrics:
        return {"evolution": summary, "ensemble": metrics, "stopped_by": metrics["stopped_by"]}
    report = design_report(out.path, opts.data, job.out.path, metrics)
    write_json(out.report, report)
    return {"evolution": summary, "ensemble": metrics, "report": report}


FLOW = Flow("design", evolution.check, master, salvage=evolution.salvage)
