"""Multi-fidelity (evolve/rungs.py and the engine's rungs): the top share of a rung against a brute-force ASHA, the
checkpoints it keeps and releases, promotions first and best-of-the-highest-rung first, tournaments within the
highest rung drawn, the best network by score of any rung, a resumed engine that promotes as the uninterrupted one
would, and a helper breeding ahead (evolve/ahead.py) while rank 0 promotes."""
from __future__ import annotations

import json
import random

import pytest

from galapagos.evolve.ahead import Ahead
from galapagos.evolve.engine import Engine, EvolutionConfig
from galapagos.evolve.errors import ConfigError
from galapagos.evolve.operators import select
from galapagos.evolve.rungs import SPARE, Rung, Rungs, rung_ends
from galapagos.store.journal import JournalRecord
from tests.test_engine import IMAGE, SPACE, synthetic_fitness


def top_share(results: dict[int, float], factor: int) -> set[int]:
    """The best n // factor ids (fitter, then earlier), by sorting all of them."""
    ranked = sorted(results, key=lambda i: (-results[i], i))
    return set(ranked[:len(results) // factor])


@pytest.mark.parametrize("factor", [2, 3, 4])
def test_a_rung_promotes_as_asha_does_and_keeps_few_checkpoints(factor):
    rng = random.Random(factor)
    rung, results, promoted, released = Rung(factor), {}, set(), set()
    for cid in range(600):
        results[cid] = round(rng.random(), 2)  # ties too
        rung.add(cid, results[cid])
        top = top_share(results, factor)
        assert {-k[1] for k in rung.top} == top
        released.update(rung.released)
        rung.released.clear()
        assert not released & top or all(i in promoted or i in released for i in released & top)
        kept_below = [i for i in rung.held if i not in top]
        assert len(kept_below) <= SPARE  # checkpoints below the top share: a few
        if rng.random() < 0.7:  # a free worker: ASHA promotes the best of the top share not yet promoted
            found = rung.best_promotable()
            waiting = [i for i in top if i not in promoted and i not in released]
            if found is None:
                assert not waiting
            else:
                assert found[1] == min(waiting, key=lambda i: (-results[i], i))
                rung.promote(found[1])
                promoted.add(found[1])
    assert released and not released & promoted


def test_rungs_promote_the_highest_rung_first_and_end_where_they_say():
    assert rung_ends(6, 3, 3) == (6, 18, 54) and rung_ends(4, 2, 1) == (4,)
    rungs = Rungs(2, 3)
    for cid, fitness in enumerate([0.1, 0.5, 0.3, 0.9]):
        rungs.add(0, cid, fitness, f"c{cid}")
    rungs.add(1, 10, 0.2, "c10")
    rungs.add(1, 11, 0.4, "c11")
    rungs.add(2, 12, 0.99, "c12")  # the last rung: nothing to promote to
    assert rungs.promote() == (1, "c11")  # rung 1 first
    assert rungs.promote() == (0, "c3")  # then rung 0's best two, best first
    assert rungs.promote() == (0, "c1")
    assert rungs.promote() is None
    assert rungs.held() == {0, 2, 10}  # below the top shares, kept as spares


def drive(engine, n: int, noise: float = 0.0, seed: int = 0) -> list[JournalRecord]:
    """Ask and tell n times; a candidate's fitness grows with its rung (longer training) around the genome's."""
    rng, records = random.Random(seed), []
    for _ in range(n):
        c = engine.ask()
        fitness = synthetic_fitness(c.genome) + 0.5 * c.rung + noise * rng.random()
        engine.tell(c.id, fitness)
        records.append(JournalRecord(c.id, c.genome.to_json(), "ok", fitness, parents=list(c.parents),
                                     origin=c.origin, rung=c.rung))
    return records


def test_the_engine_promotes_trains_on_and_ranks_by_rung():
    engine = Engine(SPACE, IMAGE, EvolutionConfig(rungs=3, reduction_factor=2, seed=3))
    records = drive(engine, 120, noise=0.2)
    by_id = {r.id: r for r in records}
    promoted = [r for r in records if r.origin == "promoted"]
    assert {r.rung for r in promoted} == {1, 2}
    for r in promoted:
        parent = by_id[r.parents[0]]
        assert r.genome == parent.genome and r.rung == parent.rung + 1  # the same network, one rung on
    assert len({r.parents[0] for r in promoted}) == len(promoted)  # each result goes on once
    best_id, _, best_fitness = engine.best
    assert by_id[best_id].rung == 2 and best_fitness == max(r.fitness for r in records if r.rung == 2)
    held = engine.resumable()
    assert held and all(by_id[i].rung < 2 for i in held)
    released = engine.released()
    assert released and not set(released) & held and engine.released() == []


def test_tournaments_compare_within_the_highest_rung_drawn():
    class C:
        def __init__(self, rung):
            self.rung = rung

    low, high = C(0), C(1)
    population = [(low, 0.9), (high, 0.1), (C(0), 0.5)]
    for seed in range(30):
        rng = random.Random(seed)
        drawn = [rng.choice(population) for _ in range(2)]  # select's draws, one for one
        expected = high if any(d[0] is high for d in drawn) else max(drawn, key=lambda d: d[1])[0]
        assert select(population, 1, 2, random.Random(seed), level=lambda c: c.rung) == [expected]


def test_a_resumed_engine_promotes_as_the_uninterrupted_one():
    config = EvolutionConfig(rungs=3, reduction_factor=2, seed=5)
    whole = Engine(SPACE, IMAGE, config)
    records = drive(whole, 80)
    resumed = Engine(SPACE, IMAGE, config)
    resumed.replay(records)
    assert resumed.resumable() == whole.resumable() and resumed.best == whole.best
    for _ in range(20):
        a, b = whole.ask(), resumed.ask()
        assert (a.id, a.genome, a.parents, a.origin, a.rung) == (b.id, b.genome, b.parents, b.origin, b.rung)
        for e in (whole, resumed):
            e.tell(a.id, synthetic_fitness(a.genome) + 0.5 * a.rung)
    missing = sorted(resumed.resumable())[:2]
    resumed.forget(missing)  # a resumed run found no file for these: never promoted
    assert not set(missing) & resumed.resumable()


def test_a_helper_breeds_ahead_while_rank_0_promotes():
    config = EvolutionConfig(rungs=2, reduction_factor=2, seed=1, population_size=8, tournament_size=2)
    ahead = Ahead(Engine(SPACE, IMAGE, config))
    try:
        records = drive(ahead, 60)
    finally:
        ahead.close()
    ids = [r.id for r in records]
    assert len(set(ids)) == len(ids)  # a promotion takes a bred child's id; no id twice
    promoted = [r for r in records if r.origin == "promoted"]
    assert promoted and all(r.rung == 1 for r in promoted)
    assert ahead.failed is None


def test_rungs_are_checked():
    assert EvolutionConfig.from_dict({"rungs": 3, "reduction_factor": 4}).rungs == 3
    for bad, words in [({"rungs": 0}, "rungs"), ({"rungs": 9}, "rungs"), ({"reduction_factor": 1}, "reduction_factor"),
                       ({"rungs": 2, "objectives": ["fitness", "params"]}, "several objectives")]:
        with pytest.raises(ConfigError, match=words):
            EvolutionConfig.from_dict(bad)


@pytest.mark.mpi
def test_a_run_in_rungs_end_to_end_and_resumed(tmp_path):
    """Real MPI ranks and training: promotions go on from their checkpoints (where their parents' learning rates
    started to decay) to their rung's end on one schedule, the best network is the best by score of any rung, the
    checkpoints left are those a promotion may still need, and a resumed run promotes on from them."""
    from galapagos.evolve.rungs import cooldowns
    from galapagos.examples import shapes
    from tests.mpirun import describe_run, run_mpi
    from tests.test_evolve_run import SMALL, journal

    data, out = tmp_path / "shapes.h5", tmp_path / "run"
    shapes.generate(data, samples=400, size=12, seed=1)
    rungs = ["--set", "evolution.rungs=3", "--set", "evolution.reduction_factor=2"]
    cools = cooldowns((2, 4, 8))
    assert cools == (1, 3, 7)
    for evaluations in (20, 32):
        resume = ["--resume"] if evaluations == 32 else []
        proc = run_mpi(3, ["-m", "galapagos.cli", "evolve", "--data", data, "--out", out, "--evaluations", evaluations,
                           *SMALL, *rungs, *resume], timeout=300)
        assert proc.returncode == 0, describe_run(proc)
        records = journal(out)
        assert len(records) == evaluations and all(r["status"] in ("ok", "pruned") for r in records), records
        by_id = {r["id"]: r for r in records}
        promoted = [r for r in records if r["origin"] == "promoted"]
        assert promoted and max(r["rung"] for r in records) == 2
        for r in promoted:
            parent = by_id[r["parents"][0]]
            assert r["key"] == parent["key"] and r["rung"] == parent["rung"] + 1 and "inherits" not in r
            # trained on from its parent's checkpoint (after epoch 1, 3) to its rung's end (4, 8), on the last rung's
            # schedule, its best over the epochs up to the checkpoint and its own
            start, at = (0, *cools)[parent["rung"]], cools[parent["rung"]]
            assert (r["metrics"]["epochs_trained"], r["metrics"]["epochs"]) == (2 * 2 ** r["rung"], 8)
            assert len(r["curve"]) == 2 * 2 ** r["rung"] - at
            assert r["fitness"] >= max(parent["curve"][:at - start]) - 1e-9
        best = json.loads((out / "best" / "metrics.json").read_text())
        top = max((r for r in records if r["status"] == "ok"), key=lambda r: r["fitness"])
        assert best["id"] == top["id"]
        kept = {int(f.stem) for f in (out / "checkpoints").glob("*.pt")}
        assert kept and all(by_id[i]["rung"] < 2 and by_id[i]["status"] == "ok" for i in kept)
        assert not kept & {r["parents"][0] for r in promoted}  # used up
    assert any(r["id"] >= 20 for r in promoted)  # the resumed job promoted too


def test_the_best_of_a_run_in_rungs_is_the_best_by_score_of_any_rung():
    from galapagos.ensemble.members import ranked_genomes
    from galapagos.reports.summary import summarize

    genomes = [Engine(SPACE, IMAGE, EvolutionConfig(seed=s)).ask().genome for s in range(3)]
    records = [JournalRecord(0, genomes[0].to_json(), "ok", 0.9, key="a", rung=0),
               JournalRecord(1, genomes[1].to_json(), "ok", 0.7, key="b", rung=1),
               JournalRecord(2, genomes[1].to_json(), "ok", 0.8, key="b", rung=0),
               JournalRecord(3, genomes[2].to_json(), "ok", 0.95, key="c")]  # a run without rungs: rung None
    assert summarize(records[:3], population_size=4)["best"]["id"] == 0  # every rung's score a finished training's
    assert summarize(records[:3], population_size=4, picked=2)["best"]["id"] == 2  # the final pick's, if any
    assert summarize(records[3:], population_size=4)["best"]["id"] == 3
    assert [r.id for r in ranked_genomes(records[:3])] == [0, 2]  # one per genome, its best rung's
