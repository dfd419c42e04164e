"""Rank 0 fails unexpectedly while the workers wait for their setup: the job must end, not hang."""
from types import SimpleNamespace

from galapagos.mpijob import Flow, run_rank


def master(comm, opts):
    raise RuntimeError("boom")


run_rank(Flow("boom", check=lambda opts: None, master=master), SimpleNamespace(out=None, workers=None))
