"""How long a node's death costs a run, on the namespace cluster of the tests (tests/cluster.py): a 4- and an 8-node
evolve under `galapagos supervise` (Hydra across the nodes, the supervisor on a node of its own, as on a batch node),
one worker node killed mid-run (every process in its namespaces, SIGKILL).

Measured per run: seconds from the kill to every surviving worker training again (the first task that each
surviving worker rank starts after the kill, from the journal; the slowest of them), the restart's share of that
(the launcher's end, the probes, the new job's start), and the evaluations lost by the failure: tasks that started
before the kill (each task notes its start) and are not in the journal as having started before it.

    sudo .venv/bin/python -m bench.recovery [--nodes 4 8] [--evaluations 120]

Needs root (namespaces); the task is tests/faulty_tasks.py's slow_quick (0.3 s, no training), so the figures are
the recovery's own cost, not training's.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from galapagos.examples import shapes
from tests.cluster import Cluster, cluster_problem

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "galapagos.cli"]
NOTES = "GALAPAGOS_BENCH_STARTS"


def noting_task(payload, ctx):
    """tests.faulty_tasks.slow_quick, after noting when this task started (a file per start)."""
    from tests.faulty_tasks import slow_quick

    Path(os.environ[NOTES], f"{ctx.task_id}-{time.time():.6f}").touch()
    return slow_quick(payload, ctx)


def journal(out: Path) -> list[dict]:
    path = out / "results.jsonl"
    found = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            found.append(json.loads(line))
        except ValueError:  # a line being written
            break
    return found


def one_run(nodes: int, evaluations: int, tmp: Path) -> dict:
    data, out, starts = tmp / "d.h5", tmp / f"run{nodes}", tmp / f"starts{nodes}"
    shapes.generate(data, samples=120, size=12, seed=1)
    starts.mkdir()
    with Cluster(nodes + 1) as c:
        compute = c.hosts[1:]
        node_file = tmp / f"nodes{nodes}"
        node_file.write_text("".join(f"{n}\n" for n in compute))
        env = c.mpi_env({**os.environ, "PYTHONPATH": str(REPO), "HYDRA_LAUNCHER": "ssh",
                         "HYDRA_LAUNCHER_EXEC": str(c.launcher), NOTES: str(starts)})
        argv = [*CLI, "supervise", "--nodes", node_file, "--per-node", "1", "--probe-timeout", "10", "--",
                *CLI, "evolve", "--data", data, "--out", out, "--evaluations", str(evaluations),
                "--set", "space.max_layers=3", "--set", "evolution.population_size=4",
                "--set", "run.task='bench.recovery:noting_task'"]
        proc = c.popen(0, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       start_new_session=True)
        try:
            while len(journal(out)) < 3 * nodes and proc.poll() is None:
                time.sleep(0.05)
            victim = compute[len(compute) // 2]
            killed = time.time()
            c.kill_node(victim)
            _, err = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    records = journal(out)
    if proc.returncode != 0:
        raise SystemExit(f"{nodes} nodes: the run failed ({proc.returncode}):\n{err[-3000:]}")
    begun = sorted(r["start"] for r in records if r["start"] > killed)
    restarted = max((b - a, b) for a, b in zip([killed, *begun], begun))[1]  # after the longest pause: the restart
    first = {}
    for r in records:
        if r["start"] >= restarted:
            first[r["rank"]] = min(first.get(r["rank"], r["start"]), r["start"])
    started_before = sum(1 for p in starts.iterdir() if float(p.name.split("-", 1)[1]) < killed)
    recorded_before = sum(1 for r in records if r["start"] < killed)
    restart = [line for line in err.splitlines() if "restart 1 of" in line]
    return {"nodes": nodes, "workers_after": len(first), "first_training": round(min(first.values()) - killed, 2),
            "all_training": round(max(first.values()) - killed, 2), "lost": started_before - recorded_before,
            "evaluations": len(records), "restart_line": restart[0] if restart else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--evaluations", type=int, default=120)
    args = parser.parse_args()
    if (why := cluster_problem()) is not None:
        raise SystemExit(f"bench.recovery: {why}")
    with tempfile.TemporaryDirectory(prefix="galapagos-bench-recovery-") as tmp:
        rows = [one_run(n, args.evaluations, Path(tmp)) for n in args.nodes]
    print("| nodes | workers after | first worker training again (s) | every surviving worker (s) | "
          "evaluations lost |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['nodes']} | {r['workers_after']} | {r['first_training']} | {r['all_training']} | {r['lost']} |")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
