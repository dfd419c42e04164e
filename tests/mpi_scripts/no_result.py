"""An evolution in which every candidate is rejected (space.max_params=10), run as galapagos.flows.mpijob.run_rank runs
one but calling evolution.master itself: rank 0 gets NoResult, the workers end as after any run."""
import json
import sys

from galapagos.flows import evolution
from galapagos.flows.mpijob import setup_logging
from galapagos.launch.mpi import world
from galapagos.launch.signals import catch_stop_signals
from galapagos.launch.session import worker_main
from galapagos.options import EvolveOptions

data, out = sys.argv[1:3]
catch_stop_signals()
comm = world()
if comm.rank == 0:
    try:
        result = evolution.master(comm, EvolveOptions(data, out, set=("space.max_params=10",), evaluations=4))
    except evolution.NoResult as exc:
        print("NoResult rank=0 " + json.dumps({**exc.summary, "line": str(exc)}), flush=True)
    else:
        print("returned rank=0 " + json.dumps(result), flush=True)
else:
    setup_logging(comm.rank)
    print(f"worker rank={comm.rank} code={worker_main(comm)}", flush=True)
