"""What the ranks of a self-started job run: `python -m galapagos.flows.ranks NAME OPTIONS_JSON RESULT_FILE`.

galapagos.flows.mpijob.start_ranks starts it under mpiexec; rank 0 writes {"result": ...} or {"error": "one line"} to
RESULT_FILE for the process that started the job.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from galapagos.errors import NoResult
from galapagos.launch.protocol import EXIT_BAD_INPUT


def main(argv: list[str]) -> int:
    from galapagos import api
    from galapagos.flows.mpijob import WorkerExit, setup_logging, user_errors
    from galapagos.launch.mpi import world

    name, options, result_file = argv
    setup_logging(0)
    result_path = Path(result_file)
    try:
        result = api.run(name, json.loads(options))
    except WorkerExit as exc:
        return exc.code
    except NoResult as exc:  # rank 0: the run is over and nothing succeeded; the command says so
        result_path.write_text(json.dumps({"no_result": exc.summary}))
        return 0
    except user_errors() as exc:
        if world().rank == 0:
            result_path.write_text(json.dumps({"error": str(exc)}))
        return EXIT_BAD_INPUT
    if world().rank == 0:
        result_path.write_text(json.dumps({"result": result}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
