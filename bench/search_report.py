"""The search benchmark's tables, made from its own JSON lines (bench/PROTOCOL.md, Report), never by hand: the
table `python -m bench.search` prints after its runs, and the README's comparison, which `--readme FILE` writes
between two marker lines of FILE (the first names the command that made it, so that a test can make it again)."""
from __future__ import annotations

import shlex
import statistics
from collections import Counter
from pathlib import Path

from bench.paired import compare

START, END = "<!-- made by python -m bench.search", "<!-- end of the table made by bench.search -->"
PICK = ":pick"  # an ensembled run's own single best network, as a contestant of the table (bench.search.with_picks)


def _mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    mean = f"{statistics.mean(values):.4f}"
    return f"{mean} ± {statistics.stdev(values):.4f}" if len(values) > 1 else mean


def _scores(rows: list[dict], dataset: str, contestant: str) -> tuple[list[dict], list[dict]]:
    runs = [r for r in rows if r["dataset"] == dataset and r["contestant"] == contestant]
    return runs, [r for r in runs if r["test"] is not None]


def table(rows: list[dict], datasets: list[str], contestants: list[str], held_out: tuple[str, ...],
          paired: tuple[tuple[str, str], ...], pairs: list[dict] | None = None) -> str:
    """One line per dataset and contestant, which of the others the first contestant's mean leads, and the paired
    tests of `paired` over the held-out sets and over the others apart (with `pairs`, of one machine: _compare)."""
    lines = ["| dataset | contestant | test score | validation score | evaluations | runs |",
             "|---|---|---|---|---|---|"]
    for d in datasets:
        for c in contestants:
            runs, scored = _scores(rows, d, c)
            evals = statistics.mean(r["evaluations"] for r in runs) if runs else 0
            lines.append(f"| {d} | {c} | {_mean_std([r['test'] for r in scored])} | "
                         f"{_mean_std([r['val'] for r in scored])} | {evals:.0f} | {len(scored)}/{len(runs)} |")
    verdicts, first = [], contestants[0]
    for d in datasets:
        means = {c: statistics.mean(r["test"] for r in scored) for c in contestants
                 if (scored := _scores(rows, d, c)[1])}
        if first in means and len(means) > 1:
            ahead = ", ".join(f"{c} {'yes' if means[first] > m else 'no'}" for c, m in means.items() if c != first)
            verdicts.append(f"{d}: is {first}'s mean test score ahead? {ahead}")
    tests = [_compare(rows, pairs, a, b, sets) for a, b in paired for sets in _groups(datasets, held_out)
             if {a, b} <= set(contestants)]
    return "\n".join(lines + [""] + verdicts + [""] + tests)


def _compare(rows: list[dict], pairs: list[dict] | None, a: str, b: str, datasets: list[str]) -> str:
    """`a` against `b`, paired by (dataset, seed); with `pairs` (rows in no cell: a contestant run again on the
    machine of another's rows, bench/PROTOCOL.md), only two runs of one machine make a pair."""
    if pairs is None:
        return compare(rows, a, b, datasets)
    return compare(rows + pairs, a, b, datasets, one_machine=True)


def _groups(datasets: list[str], held_out: tuple[str, ...]) -> list[list[str]]:
    groups = [[d for d in datasets if d in held_out], [d for d in datasets if d not in held_out]]
    return [g for g in groups if g]


def _tally(rows: list[dict], key: str) -> str:
    counts = Counter(r.get(key) or "not recorded" for r in rows)
    return "; ".join(f"{k} ({n} run{'s' if n > 1 else ''})" for k, n in counts.items())


def summary(rows: list[dict], datasets: list[str], contestants: list[str], seeds: list[int], *, minutes: float,
            workers: int, held_out: tuple[str, ...], pairs: list[dict] | None = None) -> str:
    """The README's comparison: per set of datasets (held out, then tuned on) a table of every contestant's mean
    and sd of test score and its mean evaluations, then the first contestant (the round's evolution) against each
    other, paired by (dataset, seed), with `pairs` on one machine (_compare): the one-sided Wilcoxon p and the
    per-dataset bootstrap intervals; the machine and commits."""
    first = contestants[0]
    out = [f"{minutes:g} minutes a run from launch, {workers} training processes on {workers} cores, seeds "
           f"{', '.join(map(str, seeds))}, one run after another. Each cell: the test score (accuracy, or mean "
           "R² for a regression) of the network the contestant picked by validation, mean ± sd over the runs "
           "that finished, and the mean evaluations a run; a cell with fewer runs than seeds says how many. The "
           f"primary test (bench/PROTOCOL.md) is {first} against tpe-best over the held-out sets: {first} is "
           "better if p < 0.05; every other line is descriptive." + (
               f" Each pair is two runs on one machine: where {first}'s run of a (dataset, seed) is from another "
               f"machine than the other contestant's, its pair is {first} run again on that machine (rows in no "
               "cell, made for the pairing alone)." if pairs is not None else "") + "".join(
               f" {c.removesuffix(PICK)} is scored by its final ensemble (OUT/final), {c} by the same run's single "
               "pick (OUT/best)." for c in contestants if c.endswith(PICK)), ""]
    for group in _groups(datasets, held_out):
        title = ("Held out (the evidence: no default or setting was chosen on them)" if group[0] in held_out
                 else "Tuning sets (defaults were chosen on them: no evidence for those choices)")
        out += [f"**{title}**", "", "| dataset | " + " | ".join(contestants) + " |",
                "|---|" + "---|" * len(contestants)]
        for d in group:
            cells = []
            for c in contestants:
                runs, scored = _scores(rows, d, c)
                if not runs:
                    cells.append("not run yet")
                    continue
                evals = statistics.mean(r["evaluations"] for r in runs)
                cell = f"{_mean_std([r['test'] for r in scored])} · {evals:,.0f}"
                cells.append(cell + (f" ({len(scored)} of {len(seeds)} runs)" if len(scored) < len(seeds) else ""))
            out.append(f"| {d} | " + " | ".join(cells) + " |")
        out.append("")
        for other in contestants[1:]:
            head, *rest = _compare(rows, pairs, first, other, group).splitlines()
            out += [f"- {head}"] + [f"  - {line.strip()}" for line in rest]
        out.append("")
    made = [r for r in rows if r["dataset"] in datasets and r["contestant"] in contestants
            and not r["contestant"].endswith(PICK)]  # a pick is a run's second score, not a run
    out += [f"Machine: {_tally(made, 'machine')}. Code: {_tally(made, 'commit')}." if made else "No run yet."]
    if pairs:
        out[-1] += f" Runs made for the pairing alone: {_tally(pairs, 'machine')}; code: {_tally(pairs, 'commit')}."
    return "\n".join(out)


def write_readme(path: Path, text: str, argv: list[str]) -> None:
    """Put `text` between FILE's start marker (which names the command `argv`) and END, replacing what was
    there; FILE must hold both markers, in that order."""
    lines = path.read_text().splitlines()
    start = [i for i, line in enumerate(lines) if line.startswith(START)]
    end = [i for i, line in enumerate(lines) if line == END]
    if len(start) != 1 or len(end) != 1 or end[0] < start[0]:
        raise SystemExit(f"--readme {path}: needs the marker lines, one starting '{START}' and, below it, "
                         f"'{END}'; found {len(start)} and {len(end)}")
    marker = f"{START} {shlex.join(argv)} -->"
    path.write_text("\n".join(lines[:start[0]] + [marker, "", text, ""] + lines[end[0]:]) + "\n")


def readme_command(path: Path) -> list[str]:
    """The arguments of the command that made FILE's table (its start marker)."""
    for line in path.read_text().splitlines():
        if line.startswith(START + " "):
            return shlex.split(line.removeprefix(START).removesuffix(" -->"))
    raise ValueError(f"{path} has no table made by bench.search")
