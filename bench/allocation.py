"""A whole-machine allocation under node failures: the share of its node-hours spent training, with recovery and
without, by simulation.

    python -m bench.allocation [--nodes 9408] [--per-node 8] [--hours 12] [--mtbf-hours 43800] [--restart 60]

Two parts. First the real master (`bench/scale.py`: rank 0's loop, engine, journal and pruning unchanged, the
workers simulated on a virtual clock) serves nodes x per-node workers, and one node dies mid-run, once reported by
MPI at once (ULFM: Open MPI 5 with `--with-ft ulfm`) and once only silent (found by the heartbeat timeout). Measured:
seconds until rank 0 gave the node's workers up, worker-seconds lost on the dead node's unfinished tasks, the
worker-seconds that every worker's unfinished task held at that moment (what a restart of the whole job loses), and
the other workers' utilization after the death.

Then a Monte Carlo of the allocation (`--trials` draws): node failures at random (Poisson, nodes / MTBF per hour;
the MTBF is `galapagos launch`'s default, galapagos/flows/recovery.py NODE_MTBF_HOURS), each costing what the
first part measured, under each way a job can meet them:

- none: the first failure ends the job; the rest of the allocation trains nothing (Galapagos before `supervise`).
- restart: the MPI ends every rank (MPICH, Cray MPICH, Open MPI without ULFM); `galapagos supervise` restarts the
  job without the dead node: every worker's unfinished task is lost, and the allocation waits `--restart` seconds
  (the launcher's teardown, the probes and a whole-machine start) plus the master's first round (measured).
- ulfm: the job goes on; only the dead node's unfinished tasks are lost (they go back to the queue).

Under every policy with recovery the dead node is missing for the rest of the allocation (no spare node).
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys

from galapagos.flows.recovery import NODE_MTBF_HOURS, RESTART_SECONDS


def measured(nodes: int, per_node: int, minutes: float, reported: bool) -> dict:
    """One node's death under the real master (bench.scale), in a fresh process."""
    code = ("import json, sys; from bench.scale import one; "
            f"print(json.dumps(one({nodes * per_node}, {minutes}, 60.0, 0.6, per_node={per_node}, "
            f"kill_at={minutes / 2}, reported={reported})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"bench.scale at {nodes} nodes failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def shares(nodes: int, per_node: int, hours: float, mtbf: float, restart: float, ulfm: dict, silent: dict,
           trials: int, seed: int = 0) -> dict:
    """Mean share of the allocation's node-seconds that train, per policy, over `trials` draws, against the same
    allocation without failures (1.0): what the master itself leaves idle (its utilization, measured apart) is not
    counted twice."""
    rng, total = random.Random(seed), nodes * hours * 3600.0
    rate = nodes / (mtbf * 3600.0)  # failures per second in the allocation
    restart_cost = restart + ulfm["ramp_seconds"]  # every node idle this long per restart
    sums = {"none": 0.0, "restart": 0.0, "ulfm": 0.0}
    failures = 0
    for _ in range(trials):
        t, alive, lost = 0.0, nodes, {"none": None, "restart": 0.0, "ulfm": 0.0}
        while (t := t + rng.expovariate(rate)) < hours * 3600.0:
            failures += 1
            if lost["none"] is None:
                lost["none"] = total - nodes * t
            gone = hours * 3600.0 - t  # the dead node's rest of the allocation
            alive -= 1
            lost["restart"] += gone + alive * restart_cost + ulfm["running_worker_seconds"] / per_node
            lost["ulfm"] += gone + ulfm["lost_worker_seconds"] / per_node
        for k, v in lost.items():
            sums[k] += 1.0 - min(total, v or 0.0) / total
    return {"failures_per_allocation": round(failures / trials, 2), "restart_idle_s": round(restart_cost, 1),
            **{k: round(v / trials, 5) for k, v in sums.items()},
            "silent_node_given_up_after_s": silent["given_up_after_s"]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.allocation", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=9408, help="nodes of the allocation (Frontier: 9,408)")
    p.add_argument("--per-node", type=int, default=8, help="workers per node (Frontier: 8 GCDs)")
    p.add_argument("--hours", type=float, default=12.0, help="wall time of the allocation")
    p.add_argument("--mtbf-hours", type=float, default=NODE_MTBF_HOURS, help="one node's mean time between failures")
    p.add_argument("--restart", type=float, default=RESTART_SECONDS,
                   help="seconds a whole-job restart keeps the allocation idle, besides the master's first round")
    p.add_argument("--minutes", type=float, default=3.0, help="virtual minutes of the real-master simulation")
    p.add_argument("--trials", type=int, default=20000)
    args = p.parse_args(argv)
    ulfm = measured(args.nodes, args.per_node, args.minutes, reported=True)
    silent = measured(args.nodes, args.per_node, args.minutes, reported=False)
    result = shares(args.nodes, args.per_node, args.hours, args.mtbf_hours, args.restart, ulfm, silent, args.trials)
    print(json.dumps({"ulfm_death": ulfm, "silent_death": silent, "allocation": result}, indent=1))


if __name__ == "__main__":
    main()
