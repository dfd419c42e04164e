"""The search benchmark's paired statistics (bench/paired.py), against values worked out by hand, and the tables made
from its rows (bench/search_report.py)."""
from pathlib import Path

import pytest

from bench.paired import bootstrap_ci, compare, wilcoxon_greater


def test_the_signed_rank_test_is_exact_on_small_samples():
    assert wilcoxon_greater([1, 2, 3, 4, 5]) == pytest.approx(1 / 32)  # every sign positive: 1 of 2^5
    assert wilcoxon_greater([-1, 2, 3, 4, 5]) == pytest.approx(2 / 32)  # W+ = 14: {2,3,4,5} and all five reach it
    assert wilcoxon_greater([-5, -4, -3, -2, -1]) == pytest.approx(1.0)  # leaning negative: no evidence
    assert wilcoxon_greater([0.1, -0.1]) == pytest.approx(3 / 4)  # tied magnitudes share rank 1.5
    assert wilcoxon_greater([0.0, 0.0]) == 1.0 and wilcoxon_greater([0.0, 1.0]) == pytest.approx(1 / 2)


def test_the_normal_approximation_takes_over_beyond_twenty_pairs_and_agrees():
    d = [(-1) ** (i % 3 == 0) * (i + 1) for i in range(24)]  # a third negative
    exact_20, approx_24 = wilcoxon_greater(d[:20]), wilcoxon_greater(d)
    assert 0 < approx_24 < 0.5 and 0 < exact_20 < 0.5
    assert wilcoxon_greater([x + 0.5 for x in range(1, 25)]) < 1e-5


def test_the_bootstrap_interval_holds_the_mean_and_is_repeatable():
    d = [0.01, 0.03, -0.02, 0.04, 0.02]
    low, high = bootstrap_ci(d)
    assert low < sum(d) / len(d) < high and (low, high) == bootstrap_ci(d)
    assert bootstrap_ci([0.02] * 5) == pytest.approx((0.02, 0.02))


def test_runs_pair_by_dataset_and_seed_and_unfinished_ones_drop_out():
    rows = [{"dataset": "spectra", "contestant": c, "seed": s, "test": t}
            for s in range(3) for c, t in (("evolution", 0.9), ("tpe-best", 0.8 if s else None))]
    text = compare(rows, "evolution", "tpe-best", ["spectra"])
    assert "2 paired runs" in text and "+0.1000" in text and "p = 0.2500" in text
    assert "no (dataset, seed) run" in compare(rows, "evolution", "tpe", ["spectra"])
    one = compare(rows[:4], "evolution", "tpe-best", ["spectra"])  # one pair: its difference, no interval
    assert "spectra: 1 pair, difference +0.1000" in one and "interval" not in one
    assert "over spectra: 1 paired run, mean difference" in one


def test_with_one_machine_only_two_runs_of_one_machine_make_a_pair():
    def row(c, s, machine, t):
        return {"dataset": "tracks", "contestant": c, "seed": s, "machine": machine, "test": t}
    rows = [row("evolution", 0, "Xeon", 0.60), row("expert", 0, "EPYC", 0.50), row("evolution", 0, "EPYC", 0.45),
            row("evolution", 1, "Xeon", 0.70), row("expert", 1, "EPYC", 0.40)]  # seed 1: no rerun on the EPYC
    across = compare(rows[:2] + rows[3:], "evolution", "expert", ["tracks"])  # by (dataset, seed) alone
    assert "2 paired runs, mean difference +0.2000" in across
    one = compare(rows, "evolution", "expert", ["tracks"], one_machine=True)
    assert "1 paired run on one machine, mean difference -0.0500" in one and "tracks: 1 pair, difference -0.05" in one
    assert "no (dataset, seed) run on one machine" in compare(rows[3:], "evolution", "expert", ["tracks"],
                                                              one_machine=True)


def test_a_results_file_skips_what_it_holds_and_refuses_other_settings(tmp_path):
    import argparse
    import json

    from bench.search import saved_rows

    args = argparse.Namespace(minutes=20.0, workers=2, default_space=False, datasets=["spectra"],
                              contestants=["evolution", "tpe-best"], seeds=[0, 1])
    row = {"dataset": "spectra", "contestant": "evolution", "seed": 0, "minutes": 20.0, "workers": 2,
           "default_space": False, "test": 0.99}
    path = tmp_path / "rows.jsonl"
    assert saved_rows(path, args) == [] and saved_rows(None, args) == []
    path.write_text("".join(json.dumps(r) + "\n" for r in [row, {**row, "seed": 7}, {**row, "dataset": "fields"}]))
    assert saved_rows(path, args) == [row]  # of the runs asked for
    path.write_text(json.dumps({**row, "minutes": 3.0}) + "\n")
    with pytest.raises(SystemExit, match="other settings"):
        saved_rows(path, args)


def test_the_comparison_shows_every_contestant_and_what_is_missing_between_the_markers_only(tmp_path):
    from bench.search_report import END, readme_command, summary, write_readme

    rows = [{"dataset": d, "contestant": c, "seed": s, "test": t, "evaluations": 100 + s,
             "commit": "abc1234", "machine": "EPYC, 2 cores"}
            for d in ("spectra", "signals") for s in range(3)
            for c, t in (("evolution", 0.9 + s / 100), ("tpe-best", 0.8 if s else None))]
    text = summary(rows, ["spectra", "signals"], ["evolution", "tpe-best", "expert"], [0, 1, 2], minutes=20,
                   workers=2, held_out=("spectra",))
    held, tuned = text.split("**Tuning sets")
    assert "| spectra | 0.9100 ± 0.0100 · 101 | 0.8000 ± 0.0000 · 101 (2 of 3 runs) | not run yet |" in held
    assert "| signals |" in tuned and "| signals |" not in held
    assert "evolution against tpe-best over spectra: 2 paired runs" in held
    assert "evolution against expert: no (dataset, seed) run that both finished" in held
    assert "Machine: EPYC, 2 cores (12 runs). Code: abc1234 (12 runs)." in text
    readme = tmp_path / "README.md"
    readme.write_text("# Title\n\nno markers\n")
    with pytest.raises(SystemExit, match="marker"):
        write_readme(readme, text, ["--table-only"])
    readme.write_text(f"# Title\n<!-- made by python -m bench.search -->\nold table\n{END}\n\n## Next\n")
    for _ in range(2):  # the same text twice: the same file
        write_readme(readme, text, ["--minutes", "20", "--readme", "my readme.md"])
        assert readme.read_text() == (f"# Title\n<!-- made by python -m bench.search --minutes 20 --readme "
                                      f"'my readme.md' -->\n\n{text}\n\n{END}\n\n## Next\n")
    assert readme_command(readme) == ["--minutes", "20", "--readme", "my readme.md"]


def test_the_comparison_tests_the_first_contestant_and_counts_a_runs_pick_as_no_run():
    """Round 3's primary contestant is evolution-ensemble: the comparison pairs it with every other column, its
    own single pick (bench.search.with_picks) among them, and a pick row is no run of the tally."""
    from bench.search import with_picks
    from bench.search_report import summary

    rows = [{"dataset": "galaxies", "contestant": c, "seed": s, "test": t, "val": t, "evaluations": 100,
             "commit": "abc1234", "machine": "Xeon", **extra}
            for s in range(3) for c, t, extra in (("evolution-ensemble", 0.85 + s / 100,
                                                   {"pick_test": 0.82, "pick_val": 0.83}), ("tpe-best", 0.8, {}))]
    text = summary(with_picks(rows), ["galaxies"], ["evolution-ensemble", "tpe-best", "evolution-ensemble:pick"],
                   [0, 1, 2], minutes=20, workers=2, held_out=("galaxies",))
    assert "The primary test (bench/PROTOCOL.md) is evolution-ensemble against tpe-best" in text
    assert "evolution-ensemble against tpe-best over galaxies: 3 paired runs, mean difference +0.0600" in text
    assert "evolution-ensemble against evolution-ensemble:pick over galaxies: 3 paired runs" in text
    assert "evolution-ensemble is scored by its final ensemble (OUT/final)" in text
    assert "| galaxies | 0.8600 ± 0.0100 · 100 | 0.8000 ± 0.0000 · 100 | 0.8200 ± 0.0000 · 100 |" in text
    assert "Machine: Xeon (6 runs)." in text


def test_the_readmes_comparison_is_the_one_its_command_makes_from_the_results_file(tmp_path, monkeypatch, capsys):
    """README.md's table is not written by hand: the command in its marker, run again, makes the same table."""
    from bench.search import main
    from bench.search_report import END, readme_command

    root = Path(__file__).resolve().parent.parent
    argv = readme_command(root / "README.md")
    assert "--table-only" in argv and "--results" in argv
    copy = tmp_path / "README.md"
    copy.write_text((root / "README.md").read_text())
    argv[argv.index("--readme") + 1] = str(copy)
    monkeypatch.chdir(root)
    main(argv)

    def table(path):
        text = path.read_text()
        return text[text.index("-->", text.index("<!-- made by python -m bench.search")):text.index(END)]

    assert table(copy) == table(root / "README.md")


def test_rows_for_the_pairing_alone_pair_on_one_machine_and_stay_out_of_the_cells(tmp_path, capsys):
    import json

    from bench.search import main

    def row(c, machine, t):
        return {"dataset": "tracks", "contestant": c, "seed": 0, "minutes": 20.0, "workers": 2,
                "default_space": False, "test": t, "val": t, "evaluations": 100, "commit": "abc1234",
                "machine": machine}
    results, pairs, readme = tmp_path / "rows.jsonl", tmp_path / "pairs.jsonl", tmp_path / "README.md"
    results.write_text(json.dumps(row("evolution", "Xeon", 0.6)) + "\n" + json.dumps(row("expert", "EPYC", 0.5)) + "\n")
    pairs.write_text(json.dumps(row("evolution", "EPYC", 0.45)) + "\n")
    readme.write_text("<!-- made by python -m bench.search -->\n<!-- end of the table made by bench.search -->\n")
    argv = ["--datasets", "tracks", "--contestants", "evolution", "expert", "--seeds", "0", "--minutes", "20",
            "--results", str(results), "--table-only", "--readme", str(readme)]
    main(argv)
    assert "1 paired run, mean difference +0.1000" in readme.read_text()  # across machines, as round 1 paired
    main(argv + ["--pairs", str(pairs)])
    text = readme.read_text()
    assert "| tracks | 0.6000 · 100 | 0.5000 · 100 |" in text  # the cells: --results alone
    assert "1 paired run on one machine, mean difference -0.0500" in text
    assert "Runs made for the pairing alone: EPYC (1 run); code: abc1234 (1 run)." in text
    for bad, why in ((tmp_path / "none.jsonl", "no such file"), (results, "holds too")):
        with pytest.raises(SystemExit):
            main(argv + ["--pairs", str(bad)])
        assert why in capsys.readouterr().err


def test_an_ensembled_run_pairs_with_its_own_single_pick(tmp_path, capsys):
    """An evolution-ensemble row scores the kept ensemble and, as pick_test, the same search's best/: the table
    pairs the two within each run (bench.search.with_picks)."""
    import json

    from bench.search import PICK, main, with_picks

    def row(seed, test, pick):
        return {"dataset": "fields", "contestant": "evolution-ensemble", "seed": seed, "minutes": 5, "workers": 2,
                "default_space": False, "test": test, "val": 0.9, "pick_test": pick, "pick_val": 0.89,
                "evaluations": 10, "machine": "m"}
    rows = [row(0, 0.88, 0.86), row(1, 0.87, 0.875), row(2, None, None)]
    picks = with_picks(rows)
    assert [r["contestant"] for r in picks[3:]] == ["evolution-ensemble" + PICK] * 3
    assert [r["test"] for r in picks[3:]] == [0.86, 0.875, None] and picks[3]["val"] == 0.89
    assert with_picks(picks[3:]) == picks[3:]  # a pick row is no ensembled run
    results = tmp_path / "pilot.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    main(["--datasets", "fields", "--contestants", "evolution-ensemble", "--seeds", "0", "1", "2", "--minutes", "5",
          "--results", str(results), "--table-only"])
    out = capsys.readouterr().out
    assert "| fields | evolution-ensemble:pick | 0.8675 ± 0.0106 |" in out
    assert "evolution-ensemble against evolution-ensemble:pick over fields: 2 paired runs, mean difference +0.0075" \
        in out
