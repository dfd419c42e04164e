"""Warm start (`--seed-from RUN|FILE`): the population starts from known genomes, asked first, in order."""
from __future__ import annotations

import json

import pytest

from galapagos.evolve.engine import Engine, EvolutionConfig
from galapagos.evolve.genome import Gene
from tests.test_engine import IMAGE, SPACE, record
from tests.test_evolve_run import SMALL, galapagos, shapes_file  # noqa: F401 - fixture


def test_seeds_are_asked_first_then_the_search_goes_on():
    donor = Engine(SPACE, IMAGE, EvolutionConfig(population_size=4, seed=1))
    genomes = [donor.ask().genome for _ in range(3)]
    broken = genomes[0].replace(layers=(Gene("dense", units=8, act="relu"),
                                        Gene("conv", channels=4, kernel=3, stride=1, act="relu")))
    engine = Engine(SPACE, IMAGE, EvolutionConfig(population_size=4, seed=2))
    assert engine.seed([*genomes, genomes[1], broken]) == 4  # the repeat is dropped; the broken one is repaired
    asked = [engine.ask() for _ in range(6)]
    assert [c.genome.key for c in asked[:3]] == [g.key for g in genomes]
    assert [c.origin for c in asked] == ["seed"] * 4 + ["random"] * 2
    replayed = Engine(SPACE, IMAGE, EvolutionConfig(population_size=4, seed=2))
    replayed.replay([record(c, 0.5) for c in asked])  # --resume of a seeded run
    assert replayed.seed([c.genome for c in asked]) == 0  # every replayed genome is seen: none is queued again
    assert replayed.ask().id == 6


def test_a_run_seeded_from_another(shapes_file, tmp_path):  # noqa: F811
    first = tmp_path / "first"
    proc = galapagos("evolve", "--data", shapes_file, "--out", first, "--evaluations", 6, "--workers", 2, *SMALL,
                     timeout=300)
    assert proc.returncode == 0, proc.stderr
    done = [json.loads(line) for line in (first / "results.jsonl").read_text().splitlines()]
    best = sorted((r for r in done if r["status"] == "ok"), key=lambda r: -r["fitness"])[:4]  # population_size 4
    second = tmp_path / "second"
    proc = galapagos("evolve", "--data", shapes_file, "--out", second, "--evaluations", 6, "--workers", 2, *SMALL,
                     "--seed-from", first, timeout=300)
    assert proc.returncode == 0, proc.stderr
    records = sorted((json.loads(line) for line in (second / "results.jsonl").read_text().splitlines()),
                     key=lambda r: r["id"])
    assert [r["key"] for r in records[:len(best)]] == [r["key"] for r in best]
    assert all(r["origin"] == "seed" for r in records[:len(best)]) and records[len(best)]["origin"] != "seed"
    third = tmp_path / "third"  # one genome, as best/genome.json holds it
    proc = galapagos("evolve", "--data", shapes_file, "--out", third, "--evaluations", 2, "--workers", 1, *SMALL,
                     "--seed-from", first / "best" / "genome.json", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((third / "results.jsonl").read_text().splitlines()[0])["origin"] == "seed"


@pytest.mark.parametrize("extra, words", [
    (["--seed-from", "/no/such/run"], "--seed-from /no/such/run: no such run directory"),
    (["--seed-from", "{json}"], "genome 0:"),
])
def test_bad_seeds_are_one_line(shapes_file, tmp_path, extra, words):  # noqa: F811
    bad = tmp_path / "g.json"
    bad.write_text(json.dumps([{"layers": "not a list"}]))
    extra = [str(bad) if e == "{json}" else e for e in extra]
    proc = galapagos("evolve", "--data", shapes_file, "--out", tmp_path / "run", "--evaluations", 2, *extra)
    assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()
