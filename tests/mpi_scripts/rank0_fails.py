"""Rank 0 fails unexpectedly while the workers wait for their setup: the job must end, not hang."""
from types import SimpleNamespace

from galapagos.flows.mpijob import Flow, FlowRef, run_rank


def master(comm, opts):
    raise RuntimeError("boom")


FLOW = Flow("boom", check=lambda opts: None, master=master)
run_rank(FlowRef("__main__"), SimpleNamespace(out=None, workers=None))
