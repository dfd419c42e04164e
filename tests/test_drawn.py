"""A fresh large job's first round drawn by its workers (evolve/drawn.py): the draw travels as an id, the worker's
genome comes back with the result, and rank 0 journals and breeds from it as from its own."""
from __future__ import annotations

import pickle

import pytest

from galapagos.config import load_config
from galapagos.datashare.format import inspect
from galapagos.evolve.ahead import AHEAD, Ahead
from galapagos.evolve.check import count_params
from galapagos.evolve.drawn import Drawn, draw
from galapagos.evolve.engine import Candidate, Engine, EvolutionConfig
from galapagos.evolve.problem import Problem
from galapagos.evolve.task import TrainConfig, TrainTask
from tests.test_engine import IMAGE, SPACE, synthetic_fitness
from tests.test_evolve_run import SMALL, galapagos, journal, shapes_file  # noqa: F401 - a fixture


def test_a_draw_travels_as_its_id_and_is_drawn_where_it_arrives():
    task = TrainTask(None, IMAGE, TrainConfig(), seed=3, save="/tmp/m.pt", drawn=Drawn(SPACE, 7, 5))
    assert task.echo is None  # rank 0 has no genome to say
    arrived = pickle.loads(pickle.dumps(task))
    expected = draw(SPACE, IMAGE, 7, 5)
    assert arrived.genome == expected and arrived.seed == 3 and arrived.save == "/tmp/m.pt"
    assert arrived.echo == {"genome": expected, "params": count_params(expected, IMAGE)}
    back = pickle.loads(pickle.dumps(arrived.echo))["genome"]  # as rank 0 gets it: key and JSON made on the worker
    assert back == expected and {"_key", "_canonical"} <= set(vars(back))
    assert draw(SPACE, IMAGE, 7, 6) != expected  # each id its own genome, the same on every rank
    to_trainer = pickle.loads(pickle.dumps(arrived))  # passed on to the trainer child: a genome, no draw
    assert to_trainer.genome == expected and to_trainer.drawn is None
    # a user's builder makes the network: the worker rank does not count it (that would import torch there)
    built = TrainTask(None, IMAGE, TrainConfig(builder="m:f"), drawn=Drawn(SPACE, 7, 5))
    assert "params" not in pickle.loads(pickle.dumps(built)).echo


def test_the_breeding_helper_hears_of_drawn_candidates_before_their_tells():
    engine = Engine(SPACE, IMAGE, EvolutionConfig(population_size=8, tournament_size=3, seed=2))
    drawn = engine.reserve(20)
    assert list(drawn) == list(range(20))
    ahead = Ahead(engine)
    try:
        for cid in drawn:  # as their results arrive: adopted, then told (the helper would refuse an unknown tell)
            genome = draw(SPACE, IMAGE, 2, cid)
            ahead.adopt(Candidate(cid, genome, (), "random", count_params(genome, IMAGE)))
            ahead.tell(cid, synthetic_fitness(genome))
        bred = [ahead.ask() for _ in range(80)]
        for c in bred:
            ahead.tell(c.id, synthetic_fitness(c.genome))
        assert ahead.failed is None
    finally:
        ahead.close()
    assert [c.id for c in bred] == list(range(20, 100))  # after the reserved ids
    assert engine.num_told == 100 and engine.pending == ()
    assert any(p < 20 for c in bred for p in c.parents)  # the drawn candidates were parents


@pytest.mark.mpi
def test_a_large_job_s_first_round_is_drawn_by_its_workers(shapes_file, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    n = AHEAD + 40  # the helper's first AHEAD children are bred before any result: random
    proc = galapagos("evolve", "--data", shapes_file, "--out", out, "--workers", 2, "--evaluations", n, *SMALL,
                     "--set", "evolution.breeder_workers=2", "--set", "run.task='tests.faulty_tasks:quick'",
                     timeout=180)
    assert proc.returncode == 0, proc.stderr
    records = journal(out)
    config = load_config(out / "config.toml")
    problem = Problem.of_dataset(inspect(shapes_file))
    first = [r for r in records if r["id"] < 2]
    assert len(first) == 2 and all(r["origin"] == "random" and r["parents"] == [] for r in first)
    for r in first:  # the genome its worker drew, journalled as sent back, counted
        genome = draw(config.space, problem, config.evolution.seed, r["id"])
        assert r["key"] == genome.key and r["params"] == count_params(genome, problem)
        assert "genome" not in r["metrics"] and "params" not in r["metrics"]
    assert sorted(r["id"] for r in records) == list(range(n))
    bred = [r for r in records if r["origin"] in ("mutation", "crossover")]
    assert bred and all(r["parents"] for r in bred)


def test_a_drawn_task_given_up_by_rank_0_is_journalled_with_the_genome_drawn_there(tmp_path):
    from bench.master_cost import timed_source
    from galapagos.launch.protocol import Result, Status

    config = load_config(None, ["evolution.breeder_workers=2"])
    source, _ = timed_source(str(tmp_path), IMAGE, config, workers=3)
    try:
        tasks = [source.next_task() for _ in range(4)]
        assert [t.payload.genome is None for t in tasks] == [True, True, True, False]  # one draw per worker
        # a worker's result says its genome; a task rank 0 gave up (its time limit) has none: drawn again on rank 0
        echo = pickle.loads(pickle.dumps(tasks[0].payload)).echo
        source.on_result(Result(0, 1, "n", Status.OK, 0.5, 0.0, 1.0, {"epochs": 1, **echo}))
        source.on_result(Result(1, 2, "n", Status.TIMEOUT, None, 0.0, 1.0))
    finally:
        source.engine.close()
        source.run.close()
    records = journal(tmp_path / "run")
    assert [r["id"] for r in records] == [0, 1]
    for r in records:
        assert r["key"] == draw(config.space, IMAGE, config.evolution.seed, r["id"]).key and r["params"] > 0
    assert records[0]["metrics"] == {"epochs": 1}
    assert source.engine.num_told == 2
