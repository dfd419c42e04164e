"""Several objectives: dominance, the incremental front, NSGA-II in the engine, picks by id or constraint."""
from __future__ import annotations

import itertools
import json
import math
import random

import pytest

from galapagos.evolve.check import count_params
from galapagos.evolve.engine import Engine, EvolutionConfig
from galapagos.evolve.errors import ConfigError
from galapagos.evolve.pareto import (Front, best_pick, dominates, nsga2_rank, nsga2_survivors, objective_values,
                                     parse_pick)
from galapagos.store.journal import JournalRecord
from tests.test_engine import IMAGE, SPACE, record, synthetic_fitness
from tests.test_evolve_run import SMALL, galapagos, shapes_file  # noqa: F401 - fixture

OBJ = ("fitness", "params")


def brute_front(points: dict[int, tuple]) -> set[int]:
    """The nondominated keys by the definition, first of equal points kept."""
    w = (1.0, -1.0)
    keep = set()
    for k, v in points.items():
        if not any(dominates(u, v, w) or (u == v and j < k) for j, u in points.items() if j != k):
            keep.add(k)
    return keep


def test_dominance_and_the_incremental_front_match_the_definition():
    w = (1.0, -1.0)
    assert dominates((0.9, 10), (0.8, 10), w) and dominates((0.9, 10), (0.9, 20), w)
    assert not dominates((0.9, 10), (0.9, 10), w) and not dominates((0.9, 20), (0.8, 10), w)
    rng = random.Random(0)
    for _ in range(20):
        points = {i: (rng.choice([0.5, 0.6, 0.7, 0.8]), rng.choice([10, 20, 30, 40])) for i in range(40)}
        front = Front(OBJ)
        for k, v in points.items():
            removed = front.add(k, v)
            assert removed is None or k in front.members
        assert set(front.members) == brute_front(points)


def test_objective_values_read_the_journal_record_and_refuse_missing_ones():
    rec = JournalRecord(0, {}, "ok", 0.9, {"latency_ms": 0.4}, params=1200)
    assert objective_values(rec, ("fitness", "params", "latency")) == (0.9, 1200.0, 0.4)
    assert objective_values(rec.replace(metrics={}), ("fitness", "latency")) is None
    assert objective_values(rec.replace(fitness=None), ("fitness",)) is None
    assert objective_values(rec.replace(fitness=math.nan), ("fitness",)) is None


def test_nsga2_keeps_whole_fronts_then_the_least_crowded():
    pop = [("a", (0.9, 100.0)), ("b", (0.8, 50.0)), ("c", (0.7, 10.0)), ("d", (0.6, 200.0)), ("e", (0.5, 300.0)),
           ("f", (0.85, 60.0))]
    ranked = {item: rank for item, rank, _ in nsga2_rank(pop, OBJ)}
    assert ranked == {"a": 0, "b": 0, "c": 0, "f": 0, "d": 1, "e": 2}
    assert set(nsga2_survivors(pop, 4, OBJ)) == {"a", "b", "c", "f"}
    # the first front cut to 3: its extremes (infinite crowding distance) stay
    assert {"a", "c"} <= set(nsga2_survivors(pop, 3, OBJ))


def test_config_refuses_bad_objectives():
    assert EvolutionConfig(objectives=["fitness", "latency"]).objectives == ("fitness", "latency")
    for bad, words in [(["params"], "includes fitness"), (["fitness", "fitness"], "distinct"),
                       (["fitness", "speed"], "speed")]:
        with pytest.raises(ConfigError, match="evolution.objectives") as e:
            EvolutionConfig(objectives=bad)
        assert words in str(e.value)


def drive(engine: Engine, n: int) -> list[JournalRecord]:
    """Ask and tell n times; objectives: the synthetic fitness and the genome's parameter count."""
    out = []
    for _ in range(n):
        c = engine.ask()
        rec = record(c, synthetic_fitness(c.genome)).replace(params=count_params(c.genome, IMAGE))
        engine.tell(c.id, rec.fitness, "ok", objective_values(rec, OBJ))
        out.append(rec)
    return out


def hypervolume(records: list[JournalRecord], ref: tuple[float, float]) -> float:
    """Area dominated by the records' front in (fitness up, log10 params down) above the reference point."""
    front = Front(OBJ)
    for r in records:
        front.add(r.id, (r.fitness, r.params))
    pts = sorted(((f, math.log10(p)) for f, p in front.members.values()), key=lambda t: t[1])
    area, best = 0.0, ref[0]
    for (f, lp), nxt in zip(pts, [p[1] for p in pts[1:]] + [ref[1]]):
        best = max(best, f)
        area += max(0.0, best - ref[0]) * max(0.0, min(nxt, ref[1]) - lp)
    return area


def test_the_engine_breeds_from_the_nsga2_elite_and_replays_it():
    cfg = EvolutionConfig(population_size=8, tournament_size=3, seed=5, objectives=OBJ)
    engine = Engine(SPACE, IMAGE, cfg)
    records = drive(engine, 60)
    elite = engine.elite
    assert len(elite) == 8
    told = {r.id: (r.fitness, float(r.params)) for r in records}
    assert all(told[c.id] == v for c, v in elite)
    front = brute_front(told)
    if len(front) <= 8:  # an elitist population loses no point of the front while the front fits in it
        assert front <= {c.id for c, _ in elite}
    bred = [r for r in records if r.parents]
    assert bred and all(set(r.parents) <= {x.id for x in records} for r in bred)
    resumed = Engine(SPACE, IMAGE, cfg)
    resumed.replay(records)
    assert [(c.id, v) for c, v in resumed.elite] == [(c.id, v) for c, v in elite]
    assert drive(resumed, 20) == drive(engine, 20)  # a resumed run proposes what the uninterrupted one would


def test_nsga2_finds_a_better_front_than_random_search():
    volumes = {}
    for strategy, seed in itertools.product(("evolution", "random"), range(3)):
        engine = Engine(SPACE, IMAGE, EvolutionConfig(population_size=12, seed=seed, strategy=strategy,
                                                      objectives=OBJ))
        volumes.setdefault(strategy, []).append(hypervolume(drive(engine, 150), ref=(-8.0, 7.0)))
    assert sum(volumes["evolution"]) > sum(volumes["random"]), volumes


def test_picks_by_id_or_by_constraints():
    recs = [JournalRecord(1, {}, "ok", 0.9, {"latency_ms": 2.0}, params=5000),
            JournalRecord(2, {}, "ok", 0.8, {"latency_ms": 0.5}, params=800),
            JournalRecord(3, {}, "ok", 0.7, {}, params=300)]
    assert best_pick(recs, "2").id == 2
    assert best_pick(recs, "params<=1000").id == 2
    assert best_pick(recs, "params < 1e4, latency<=1").id == 2
    assert best_pick(recs, "latency<0.1") is None
    assert best_pick(recs, "fitness>=0.85").id == 1
    for bad in ("small", "params<=lots", "depth<=3", "params=<3"):
        with pytest.raises(ValueError, match="--pick") as e:
            parse_pick(bad)
        assert "params<=100000" in str(e.value)


def test_a_run_with_three_objectives_keeps_its_front_and_predict_and_ensemble_pick_from_it(shapes_file, tmp_path):  # noqa: F811
    run = tmp_path / "run"
    objectives = ["--set", 'evolution.objectives=["fitness", "params", "latency"]']
    proc = galapagos("evolve", "--data", shapes_file, "--out", run, "--evaluations", 8, "--workers", 2, *SMALL,
                     *objectives, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Pareto front:" in proc.stdout
    proc = galapagos("evolve", "--data", shapes_file, "--out", run, "--evaluations", 12, "--workers", 2, "--resume",
                     timeout=300)
    assert proc.returncode == 0, proc.stderr
    records = [JournalRecord.from_dict(json.loads(line)) for line in (run / "results.jsonl").read_text().splitlines()]
    ok = {r.id: r for r in records if r.status == "ok"}
    assert len(records) == 12 and all(r.metrics["latency_ms"] > 0 for r in ok.values())
    pareto = json.loads((run / "pareto.json").read_text())
    assert pareto["objectives"] == [["fitness", "max"], ["params", "min"], ["latency", "min"]]
    members = {m["id"]: m for m in pareto["members"]}
    three = ("fitness", "params", "latency")
    assert set(members) == {i for i, r in ok.items() if not any(
        dominates(objective_values(o, three), objective_values(r, three), (1, -1, -1)) for o in ok.values())}
    assert {d.name for d in (run / "front").iterdir()} == {str(i) for i in members}
    for i in members:
        assert json.loads((run / "front" / str(i) / "genome.json").read_text()) == ok[i].genome

    report = json.loads(galapagos("report", run, "--json").stdout)
    assert [m["id"] for m in report["pareto"]["members"]] == [m["id"] for m in pareto["members"]]
    assert "Pareto front (fitness max, params min, latency min)" in galapagos("report", run).stdout

    smallest = min(members.values(), key=lambda m: (m["params"], -m["fitness"]))
    for spec, expected in [(str(smallest["id"]), smallest["id"]), (f"params<={smallest['params']}", smallest["id"])]:
        proc = galapagos("predict", "--model", run, "--pick", spec, "--data", shapes_file, "--json")
        assert proc.returncode == 0, proc.stderr
        direct = galapagos("predict", "--model", run / "front" / str(expected), "--data", shapes_file, "--json")
        assert json.loads(proc.stdout) == json.loads(direct.stdout)
    proc = galapagos("predict", "--model", run, "--pick", "params<=1", "--data", shapes_file)
    assert proc.returncode == 2 and "no network on the Pareto front" in proc.stderr and f"id {smallest['id']}" in \
        proc.stderr, proc.stderr

    proc = galapagos("ensemble", "--from", run, "--data", shapes_file, "--out", tmp_path / "ens", "--members", 2,
                     "--workers", 1, "--pick", f"params<={smallest['params']}", "--set", "ensemble.epochs=1",
                     timeout=300)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads((tmp_path / "ens" / "plan.json").read_text())
    assert plan and all(ok[m["origin"]["id"]].params <= smallest["params"] for m in plan)


def test_predict_pick_needs_a_run_with_a_front(shapes_file, tmp_path):  # noqa: F811
    run = tmp_path / "run"
    assert galapagos("evolve", "--data", shapes_file, "--out", run, "--evaluations", 2, "--workers", 1,
                     *SMALL, timeout=300).returncode == 0
    assert not (run / "pareto.json").exists() and not (run / "front").exists()
    proc = galapagos("predict", "--model", run, "--pick", "1", "--data", shapes_file)
    assert proc.returncode == 2 and "no pareto.json" in proc.stderr, proc.stderr
