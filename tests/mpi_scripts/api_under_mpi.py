"""Every rank calls galapagos.evolve, as a user's script under srun/mpiexec does: rank 0 gets the Run. Each rank
says whether it imported torch (only rank 0 and the trainer children need it)."""
import json
import sys

import galapagos
from galapagos.launch.mpi import world

data, out = sys.argv[1:3]
result = galapagos.evolve(data, out, evaluations=4, set={"train.epochs": 1, "space.max_layers": 3,
                                                          "evolution.population_size": 2,
                                                          "evolution.tournament_size": 2})
print(f"result rank={world().rank} " + json.dumps(None if result is None else len(result.trials)), flush=True)
print(f"rank={world().rank} imported torch: {'torch' in sys.modules}", flush=True)
