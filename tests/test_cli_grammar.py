"""One CLI grammar: every subcommand's help is walked and checked (help text, defaults, an example that parses, the
same flag for the same thing everywhere), and the behaviour around it: --version, --json, both budgets, a closed
pipe, messages for a missing or a .npz data file, parent directories of --out created."""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from galapagos import __version__
from galapagos.config import EnsembleConfig, evolve_config
from galapagos.evolve.engine import EvolutionConfig
from galapagos.examples import shapes
from galapagos.options import EvolveOptions
from galapagos.parser import build_parser
from tests.mpirun import REPO

# concept -> (its one flag, the commands that have it). Every command that has the concept spells it this way.
CONCEPTS = {
    "dataset file": ("--data", ("evolve", "design", "ensemble", "predict")),
    "directory the command writes": ("--out", ("evolve", "design", "ensemble")),
    "run/design/ensemble directory it reads": ("--run", ("ensemble", "predict", "export", "report", "launch")),
    "worker ranks started without MPI": ("--workers", ("evolve", "design", "ensemble", "predict")),
    "worker ranks per CPU-only node": ("--workers-per-node", ("launch", "supervise")),
    "continue an interrupted job": ("--resume", ("evolve", "design", "ensemble", "launch")),
    "config file": ("--config", ("evolve", "design")),
    "config override": ("--set", ("evolve", "design", "ensemble")),
    "budget by count": ("--evaluations", ("evolve", "design")),
    "budget by time": ("--budget-minutes", ("evolve", "design")),
    "search strategy": ("--strategy", ("evolve", "design")),
    "warm start": ("--seed-from", ("evolve", "design")),
    "restarts after a lost rank": ("--max-restarts", ("evolve", "design", "ensemble", "supervise")),
    # every command that prints a result; setup prints shell commands, supervise is a job script's own line
    "one JSON object": ("--json", ("evolve", "design", "ensemble", "predict", "report", "export", "data check",
                                   "data info", "data import", "launch", "doctor")),
}
# Spellings replaced by the flags above: they still parse (old scripts, saved job commands) but no help shows them.
OLD = {"ensemble": "--from", "predict": "--ranks", "supervise": "--per-node"}


def subcommands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(path, parser) of every subcommand, nested ones (`data check`) included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from subcommands(sub, (*path, name))


COMMANDS = dict((" ".join(path), p) for path, p in subcommands(build_parser()))


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions for s in a.option_strings}


def shown(parser: argparse.ArgumentParser) -> str:
    return parser.format_help()


def examples(parser: argparse.ArgumentParser) -> list[list[str]]:
    return [shlex.split(line) for line in (parser.epilog or "").splitlines() if line.strip().startswith("galapagos ")]


def galapagos(*args, timeout: float = 120, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """The console command as one process outside MPI (no launcher variables)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_", "SLURM_"))}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "galapagos.cli", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_the_walk_finds_every_subcommand():
    assert set(COMMANDS) == {"evolve", "design", "ensemble", "predict", "export", "report", "data", "data check",
                             "data info", "data import", "launch", "setup", "doctor", "supervise"}
    top = build_parser().format_help()
    for name in COMMANDS:
        assert name.split()[-1] in top or name.startswith("data "), name
    assert "check|info|import" in top  # the data command's line names its actions as they are spelled


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_argument_has_help(name):
    parser = COMMANDS[name]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        assert action.help and action.help != argparse.SUPPRESS, (name, action.dest)
    assert parser.description, name


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_subcommand_has_an_example_that_parses(name):
    parser = COMMANDS[name]
    found = examples(parser)
    assert found and "example" in parser.epilog, name
    for words in found:
        args = build_parser().parse_args(words[1:])
        assert words[1:1 + len(name.split())] == name.split(), (name, words)
        assert args.command == name.split()[0]
        job = getattr(args, "job_command", None)
        if job:  # launch and supervise: the command after -- is a galapagos job that parses as well
            inner = job[1:] if job[0] == "--" else job
            at = next(i for i, w in enumerate(inner) if w in ("evolve", "ensemble", "design"))
            assert build_parser().parse_args(inner[at:]).command == inner[at]


@pytest.mark.parametrize("concept", sorted(CONCEPTS))
def test_the_same_concept_has_the_same_flag_in_every_command(concept):
    flag, names = CONCEPTS[concept]
    for name in names:
        assert flag in options(COMMANDS[name]), (concept, name)
        assert flag in shown(COMMANDS[name]), (concept, name)


def test_old_spellings_parse_and_are_hidden():
    for name, old in OLD.items():
        assert old in options(COMMANDS[name]) and old not in shown(COMMANDS[name]), name
    p = build_parser()
    args = p.parse_args(["ensemble", "--from", "r", "--data", "d.h5", "--out", "e"])
    assert args.from_run == "r"
    assert p.parse_args(["ensemble", "--run", "r", "--data", "d", "--out", "e"]).from_run == "r"
    assert p.parse_args(["predict", "--model", "m", "--data", "d", "--ranks", "2"]).ranks == 2
    assert p.parse_args(["predict", "--run", "m", "--data", "d", "--workers", "2"]).ranks == 2
    assert p.parse_args(["launch", "--resume", "runs/x"]).resume == "runs/x"  # the old `--resume DIR`
    new = p.parse_args(["launch", "--resume", "--run", "runs/x"])
    assert new.resume is True and new.run == "runs/x"
    assert "--resume DIR" not in shown(COMMANDS["launch"]) and "--resume [DIR]" not in shown(COMMANDS["launch"])


def test_errors_name_the_current_spelling(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["ensemble", "--data", "d.h5", "--out", "e"])
    err = capsys.readouterr().err
    assert "required: --run" in err and "--from" not in err


def test_the_top_level_examples_parse():
    found = examples(build_parser())
    assert found
    for words in found:
        assert build_parser().parse_args(words[1:]).command == words[1]


def test_resume_is_a_switch_everywhere():
    for name in CONCEPTS["continue an interrupted job"][1]:
        action = options(COMMANDS[name])["--resume"]
        assert action.nargs == 0 or action.const is True, name  # given alone it means "yes"
        line = next(x for x in shown(COMMANDS[name]).splitlines() if x.strip().startswith("--resume"))
        assert line.split()[0] == "--resume" and (len(line.split()) == 1 or line.split()[1][0].islower()), line


def test_design_has_every_search_option_of_evolve():
    assert set(options(COMMANDS["evolve"])) <= set(options(COMMANDS["design"]))


def test_defaults_are_shown():
    for name, parser in COMMANDS.items():
        text = " ".join(shown(parser).split())
        for action in parser._actions:
            if action.option_strings and action.default not in (None, False, argparse.SUPPRESS, "", 0, []):
                assert f"(default: {action.default})" in text, (name, action.dest)
    evolve = " ".join(shown(COMMANDS["evolve"]).split())
    assert f"(default: evolution.strategy, {EvolutionConfig().strategy})" in evolve
    ensemble = " ".join(shown(COMMANDS["ensemble"]).split())
    assert f"(default: ensemble.members, {EnsembleConfig().members})" in ensemble
    assert f"(default: ensemble.strategy, {EnsembleConfig().strategy})" in ensemble
    assert "(default: None)" not in "".join(shown(p) for p in COMMANDS.values())


def test_both_budgets_together():
    args = build_parser().parse_args(["evolve", "--data", "d.h5", "--out", "r", "--evaluations", "5",
                                      "--budget-minutes", "2"])
    config = evolve_config(EvolveOptions.from_args(args))
    assert (config.run.evaluations, config.run.budget_minutes) == (5, 2.0)


def test_version():
    proc = galapagos("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"galapagos {__version__}"


# -- a real run, and what the grammar promises around it --------------------------------------------------------------
@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "shapes.h5"
    shapes.generate(path, samples=300, size=12, seed=1)
    return path


@pytest.fixture(scope="module")
def run(data, tmp_path_factory) -> tuple[Path, dict]:
    """evolve into --out whose parents do not exist yet, with both budgets and --json."""
    out = tmp_path_factory.mktemp("runs") / "new" / "parents" / "run"
    proc = galapagos("evolve", "--data", data, "--out", out, "--evaluations", 2, "--budget-minutes", 5, "--workers", 1,
                     "--set", "train.epochs=1", "--json", timeout=240)
    assert proc.returncode == 0, proc.stderr
    return out, json.loads(proc.stdout)


def test_evolve_makes_the_parents_of_out_and_stops_at_the_first_budget(run):
    out, summary = run
    assert (out / "results.jsonl").exists()
    assert summary["evaluations"] == 2 and summary["finished"] and summary["run"] == str(out)


def test_a_closed_pipe_ends_quietly(run):
    out, _ = run
    proc = subprocess.Popen([sys.executable, "-m", "galapagos.cli", "report", str(out)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # the reader is gone before the command writes a line
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 1 and err == "", err
    piped = subprocess.run(f"{shlex.quote(sys.executable)} -m galapagos.cli report {shlex.quote(str(out))} | head -1",
                           shell=True, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert piped.stdout.startswith("evaluations: 2") and "Traceback" not in piped.stderr, piped.stderr


def test_report_takes_the_run_either_way(run):
    out, _ = run
    positional, flag = galapagos("report", out, "--json"), galapagos("report", "--run", out, "--json")
    assert positional.returncode == flag.returncode == 0, flag.stderr
    assert json.loads(positional.stdout) == json.loads(flag.stdout)
    proc = galapagos("report")
    assert proc.returncode == 2 and "galapagos report DIR (or --run DIR)" in proc.stderr


def test_ensemble_reads_run_and_makes_the_parents_of_out(run, data, tmp_path):
    out, _ = run
    ens = tmp_path / "no" / "such" / "ens"
    proc = galapagos("ensemble", "--run", out, "--data", data, "--out", ens, "--members", 1, "--workers", 1,
                     "--set", "ensemble.epochs=1", "--json", timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ensemble_dir"] == str(ens) and (ens / "plan.json").exists()


def test_a_missing_data_file_is_named_with_the_next_step(tmp_path):
    proc = galapagos("evolve", "--data", tmp_path / "shape.h5", "--out", tmp_path / "a" / "r", "--evaluations", 2)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{tmp_path / 'shape.h5'}: no such file: it does not exist" in proc.stderr
    assert "galapagos data import" in proc.stderr and ": /:" not in proc.stderr
    assert not (tmp_path / "a").exists()  # a refused run makes no directory, no parent either


def test_a_npz_given_as_data_names_data_import(tmp_path):
    npz = tmp_path / "mine.npz"
    np.savez(npz, x_train=np.zeros((8, 3), np.float32), y_train=np.zeros(8, np.int64))
    proc = galapagos("evolve", "--data", npz, "--out", tmp_path / "r", "--evaluations", 2)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"convert it with `galapagos data import {npz} {tmp_path / 'mine.h5'}`" in proc.stderr
    proc = galapagos("data", "check", npz)
    assert proc.returncode == 2 and "galapagos data import" in proc.stderr


def test_data_json(data, tmp_path):
    check = galapagos("data", "check", data, "--json")
    assert check.returncode == 0 and json.loads(check.stdout)["ok"] is True
    info = json.loads(galapagos("data", "info", data, "--json").stdout)
    assert info["task"] == "classification" and info["num_classes"] == 6
    npz = tmp_path / "d.npz"
    np.savez(npz, x_train=np.ones((8, 3), np.float32), y_train=np.arange(8) % 2)
    imported = galapagos("data", "import", npz, tmp_path / "d.h5", "--json")
    assert imported.returncode == 0 and json.loads(imported.stdout)["splits"]["train"] == 8


def test_launch_resume_is_a_switch_with_run(data, tmp_path):
    out = tmp_path / "runs" / "big"  # runs/ does not exist: launch makes it, as evolve does
    first = galapagos("launch", "--scheduler", "local", "--nodes", 1, "--gpus-per-node", 0, "--workers-per-node", 1,
                      "--json", "--", "galapagos", "evolve", "--data", data, "--out", out, "--evaluations", 2)
    assert first.returncode == 0, first.stderr
    assert Path(json.loads(first.stdout)["jobs"][0]["script"]).exists()
    follow = galapagos("launch", "--resume", "--run", out)
    assert follow.returncode == 0 and "script:" in follow.stdout, follow.stderr
    old = galapagos("launch", "--resume", out)
    assert old.returncode == 0, old.stderr
    scripts = sorted((out / "job").glob("local-*[0-9].sh"))
    assert len(scripts) == 3 and "--resume" in scripts[-1].read_text()
    alone = galapagos("launch", "--run", out)
    assert alone.returncode == 2 and "--resume --run DIR" in alone.stderr
