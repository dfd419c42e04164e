"""Search quality: Galapagos evolution and random search against Optuna's TPE and random samplers.

    pip install -e ".[bench]"          # Optuna, for the peers
    python -m bench.search --datasets signals shapes cosmoflow tabular --seeds 0 1 2 --minutes 1.5 --workers 2
    python -m bench.search --contestants evolution expert ...   # a part of the field

Eighteen contestants search the same space for the same data, one after another on the same cores, and an expert
trains a hand-written network there (bench/PROTOCOL.md says which answer what):
- `evolution`, `random`: `galapagos evolve --strategy evolution|random --workers W --budget-minutes M`;
  `evolution-no-priors` the same with `evolution.priors = false` (the algorithm's share without the priors'),
  `evolution-rungs` with `evolution.rungs = 2` (multi-fidelity, evolve/rungs.py: the best third of the candidates
  trained on to three times the epochs), `evolution-surrogate` with `evolution.surrogate = 8` (evolve/surrogate.py:
  of 8 children bred per ask, the one a model of the results predicts best), `evolution-holdout` with
  `train.holdout = 0.5` (galapagos/flows/final_pick.py: the best networks re-scored on half the validation rows),
  `evolution-cost` with `evolution.cost_aware = true` (at a fitness within `cost_tolerance` of a tournament's
  fittest, fewer parameters win), `evolution-shrink` with `train.inherit_shrink = 0.5` (evolve/inherit.py: a child's
  inherited weights start halfway back to a fresh initialisation; the default since its pilot) and
  `evolution-unshrunk` with 1 (a parent's weights as they are: the default before it), `evolution-adaptive` with
  `train.adaptive_shrink = true` (each child's share of its parent's weights the parent's training loss over its
  validation loss, from 0.5 up to 1), `evolution-finish` with `evolution.finish = 0.25`
  (galapagos/flows/finish.py: the budget's last quarter trains the best networks on); `evolution-ensemble` is
  evolution as `galapagos evolve` runs by default since the kept-ensemble pilot: its 16 best networks' weights kept
  (`run.keep_models`, which changes nothing the search does) and made an ensemble as they are in OUT/final at the
  end (`run.final_ensemble`: greedy selection on validation, nothing trained), its build inside the time budget
  (the search stops its expected seconds before the end); its row scores the ensemble and, as `pick_test`, the same
  run's single best network (best/), so that the two final picks of one search pair exactly (the table's
  `evolution-ensemble:pick`); `evolution-bagged` is the same with `ensemble.bags = 20` (that ensemble by bagged
  selection, ensemble/selection.py), `evolution-ensemble-finish` with `evolution.finish = 0.25` (its ensemble of
  the kept networks with the finished ones' weights), `evolution-shift` with `space.shifts = [0.0, 0.125, 0.25]`
  (the shift gene, evolution's choice: each genome trains on samples moved at random by up to 0, 1/8 or 1/4 of
  each spatial axis), its ensemble scored as evolution-ensemble's. Every other Galapagos contestant runs with
  `run.final_ensemble = false` and is scored by its best/, as in the protocol's rounds 1 and 2;
- `tpe`, `optuna-random`: W processes sharing one Optuna study (a journal file), TPESampler or RandomSampler
  seeded by 1000 * seed + process, MedianPruner with the config's `run.prune_after` and `run.prune_min_results`;
  `tpe-best` is TPE at its best: multivariate, constant liar, HyperbandPruner, warm-started with evolution's prior
  networks (bench/peers.py).
  Each trial maps Galapagos's `[space]` onto `trial.suggest_*` (`genome_from_trial`), repairs or rejects the genome
  with `evolve.check.check_genome` (a rejected one is a pruned trial) and trains it with `evolve.train.
  train_candidate`: the same `[train]` recipe, splits, normalisation and seed per evaluation as a Galapagos worker,
  one torch thread per process, each process bound to one core, every epoch reported to the pruner.
- `expert`: W processes, each training the dataset's hand-written network (bench/search_configs/NAME.expert.json,
  outside the search space's limits: a batch-norm CNN of six convolutions for signals, images and volumes, an MLP
  with batch norm and dropout for the permuted signals, a SiLU MLP for the smooth tabular regression, where it
  reached 0.91 validation R^2 in 60 epochs against 0.83 with ReLU, batch norm and dropout) with the same
  `train_candidate`, first for the recipe's epochs, then for as many epochs as the time left holds, until the
  deadline; its best training by validation is its network.
Each contestant gets M minutes of wall time from its launch, start-up included: Galapagos is stopped with SIGTERM
(its clean stop) when they end, and the Optuna processes stop there; like Galapagos's, a trial still training then
is abandoned. The score is the test score (accuracy, or mean R^2) of the contestant's best network by validation,
from `galapagos predict --split test --json` for all five (the Optuna and expert winners are saved as network
directories).
The data come from the bundled generators (seed 0), `signals-permuted` from the signals with every trace's
positions permuted (convolutions the wrong prior), `signals-clean` from the signals generator with less noise
(sigma 0.2 instead of 0.3: best networks near 0.98, the regime of issue 10's held-out 1D set; no config or
network was tuned on it) and `shapes-noisy` from the shapes generator with more noise (sigma 0.45 instead of
0.25) and twice the images, half of them for val and test: on the plain shapes every contestant's best network
reaches the data's own limit (about 0.98) and 450 test images cannot rank them. `spectra` and `fields`
(bench/heldout.py) are issue 40's held-out sets, used for no tuning decision (bench/PROTOCOL.md). The config of
each dataset is bench/search_configs/NAME.toml, the variants sharing their generator's (`config_path`). With
`--default-space` every contestant searches Galapagos's default space with its default recipe instead (an empty
config: what a new user runs, as issue 10 measured), and the expert trains its network with that recipe.
Prints one JSON line per run, then the mean and standard deviation over seeds per dataset and contestant. With
`--results FILE` each line is also added to FILE, a run already there is not run again, and the table is of every
row of FILE asked for: a protocol of many hours goes on across sessions, and its table is made from its own rows.
Each row names the commit and the machine it ran on. `--table-only` runs nothing and prints the table of FILE's
rows; `--readme README.md` also writes the comparison of every contestant into the README, between its marker
lines (bench/search_report.py), so that its table is the rows' own:

    python -m bench.search --datasets spectra fields --contestants evolution tpe-best evolution-no-priors random \
        optuna-random expert --seeds 0 1 2 3 4 --minutes 20 --results bench/results/search-protocol.jsonl \
        --table-only --readme README.md

`--pairs FILE` adds rows made for the pairing alone, in no cell of the table: evolution run again on the machine of
another contestant's rows, so that each pair is two runs of one machine (bench/PROTOCOL.md, round 2).
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from galapagos.config import Config, load_config
from galapagos.evolve.genome import Genome
from galapagos.evolve.train import NonFiniteLoss, train_candidate
from galapagos.examples import cosmoflow, shapes, signals, tabular

from bench import heldout
from bench.peers import OPTUNA, Deadline, save_best, spawn, training_data, run_optuna
from bench.search_report import PICK, summary, table, write_readme


def signals_permuted(out_path: str | Path, *, seed: int = 0) -> None:
    """examples/signals.py with the positions of every trace permuted by one fixed permutation: convolutions are
    the wrong prior there, an MLP on the flattened input the right one (issue 10's second case)."""
    heldout.permuted(signals.generate, out_path, "signals-permuted", seed=seed)


DATASETS = {  # name -> (generator, its arguments, its configs in CONFIGS): each small enough that a candidate
    # trains in seconds on a core
    "signals": (signals.generate, {}, "signals"),
    "signals-clean": (signals.generate, {"noise": 0.2}, "signals"),
    "signals-permuted": (signals_permuted, {}, "signals-permuted"),
    "shapes": (shapes.generate, {}, "shapes"),
    "shapes-noisy": (shapes.generate, {"samples": 6000, "noise": 0.45, "fractions": (0.5, 0.25, 0.25)}, "shapes"),
    "cosmoflow": (cosmoflow.generate, {"samples": 1200, "size": 12}, "cosmoflow"),
    "tabular": (tabular.generate, {}, "tabular"),
    "spectra": (heldout.spectra, {}, "spectra"),  # held out: bench/PROTOCOL.md
    "fields": (heldout.fields, {}, "fields"),
    # round 2's held-out sets: the config and expert of round 1's set of the same dimensionality, by that rule
    "lightcurves": (heldout.lightcurves, {}, "spectra"),
    "tracks": (heldout.tracks, {}, "fields"),
    # round 3's held-out sets, by the same rule
    "seismograms": (heldout.seismograms, {}, "spectra"),
    "galaxies": (heldout.galaxies, {}, "fields"),
    # round 4's: the bundled 1D set's config and expert (the same input size: nothing to scale), the permuted
    # variant the permuted signals' (their MLP with batch norm and dropout)
    "pulses": (heldout.pulses, {}, "signals"),
    "pulses-permuted": (heldout.pulses_permuted, {}, "signals-permuted"),
    # round 6's: by round 4's rule
    "heartbeats": (heldout.heartbeats, {}, "signals"),
    "heartbeats-permuted": (heldout.heartbeats_permuted, {}, "signals-permuted"),
}
# each protocol round's evidence (bench/PROTOCOL.md): spectra and fields round 1's, lightcurves and tracks round 2's
# (spectra is a tuning set of the decision round 2 tests), seismograms and galaxies round 3's, pulses and
# pulses-permuted round 4's, heartbeats and heartbeats-permuted round 6's; the others were tuned on
HELD_OUT = ("spectra", "fields", "lightcurves", "tracks", "seismograms", "galaxies", "pulses", "pulses-permuted",
            "heartbeats", "heartbeats-permuted")
CONTESTANTS = ("evolution", "evolution-no-priors", "evolution-rungs", "evolution-surrogate", "evolution-holdout",
               "evolution-cost", "evolution-shrink", "evolution-unshrunk", "evolution-adaptive", "evolution-finish",
               "evolution-ensemble", "evolution-bagged", "evolution-ensemble-finish", "evolution-shift", "random",
               "tpe", "tpe-best", "optuna-random", "expert")
VARIANTS = {  # Galapagos contestants beside its two strategies: the strategy, and the settings they add
    "evolution": ("evolution", []), "random": ("random", []),
    "evolution-no-priors": ("evolution", ["evolution.priors=false"]),  # the algorithm's share without the priors'
    "evolution-rungs": ("evolution", ["evolution.rungs=2"]),  # multi-fidelity: the best third trained 3x as long
    "evolution-surrogate": ("evolution", ["evolution.surrogate=8"]),  # the best predicted of 8 children asked
    "evolution-holdout": ("evolution", ["train.holdout=0.5"]),  # the final pick on half the validation rows
    "evolution-cost": ("evolution", ["evolution.cost_aware=true"]),  # at nearly equal fitness the smaller network
    "evolution-shrink": ("evolution", ["train.inherit_shrink=0.5"]),  # inherited weights halfway to a fresh start
    "evolution-unshrunk": ("evolution", ["train.inherit_shrink=1"]),  # a parent's weights as they are
    "evolution-adaptive": ("evolution", ["train.adaptive_shrink=true"]),  # the share follows the parent's fit
    "evolution-finish": ("evolution", ["evolution.finish=0.25"]),  # the last quarter trains the best networks on
    "evolution-ensemble": ("evolution", []),  # the default: the kept networks an ensemble in final/
    "evolution-bagged": ("evolution", ["ensemble.bags=20"]),  # that ensemble by bagged selection
    "evolution-ensemble-finish": ("evolution", ["evolution.finish=0.25"]),  # that ensemble, of finished networks
    "evolution-shift": ("evolution", ["space.shifts=[0.0, 0.125, 0.25]"]),  # the shift gene, evolution's choice
}
# scored by final/ (the others by best/, with run.final_ensemble = false)
ENSEMBLED = ("evolution-ensemble", "evolution-bagged", "evolution-ensemble-finish", "evolution-shift")
PAIRED = (("evolution", "tpe-best"), ("evolution-ensemble", "tpe-best"), ("evolution", "tpe"),  # tested, a minus b
          ("evolution-rungs", "evolution"), ("evolution-surrogate", "evolution"),
          ("evolution-holdout", "evolution"), ("evolution-cost", "evolution"),
          ("evolution-shrink", "evolution"), ("evolution-adaptive", "evolution"), ("evolution-finish", "evolution"),
          ("evolution-ensemble", "evolution-ensemble" + PICK), ("evolution-bagged", "evolution-ensemble"),
          ("evolution-ensemble-finish", "evolution-ensemble"), ("evolution-shift", "evolution-ensemble"))
EXPERT_TIME_USED = 0.85  # of the time left that the expert's longer training is planned to take (a margin for noise)
CONFIGS = Path(__file__).parent / "search_configs"


def config_path(name: str) -> Path:
    """The dataset's search config."""
    return CONFIGS / f"{DATASETS[name][2]}.toml"


def expert_path(name: str) -> Path:
    """The dataset's hand-written network, beside its config."""
    return config_path(name).with_suffix(".expert.json")


def expert_worker(data: Path, config: Config, genome: dict, seed: int, worker: int, core: int, deadline: float,
                  out: Path) -> None:
    """One of the W processes of the expert: the hand-written network trained with the recipe's epochs, then for
    as many epochs as the time left holds (a practitioner who has timed one training spends the rest of the
    budget on a longer one), again until the deadline; each finished training's summary and weights saved."""
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    problem, tensors, stats = training_data(data)
    network = Genome.from_json(genome)
    epochs = config.train.epochs

    def report(metrics: dict) -> None:
        if time.time() >= deadline:
            raise Deadline

    for i in itertools.count():
        start = time.time()
        try:
            summary, state = train_candidate(network, problem, tensors,
                                             dataclasses.replace(config.train, epochs=epochs),
                                             seed=seed * 1_000_003 + 1000 * worker + i, report=report, stats=stats)
        except Deadline:  # abandoned, as the other contestants' last trainings are
            return
        except NonFiniteLoss:  # diverged: a failed training, and another seed
            (out / f"{worker}-{i}.json").write_text(json.dumps({"epochs": epochs, "status": "nan"}))
            continue
        torch.save(state, out / f"{worker}-{i}.pt")
        (out / f"{worker}-{i}.json").write_text(json.dumps({"epochs": epochs, "fitness": summary["fitness"]}))
        per_epoch = (time.time() - start) / epochs
        left = deadline - time.time()
        if left < per_epoch * config.train.epochs:
            return
        epochs = max(config.train.epochs, int(EXPERT_TIME_USED * left / per_epoch))


def _expert_order(path: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in path.stem.split("-"))  # WORKER-TRAINING


def run_expert(data: Path, config_path: Path, expert: Path, out: Path, seed: int, workers: int, cores: list[int],
               deadline: float, sets: list[str]) -> dict:
    config = load_config(config_path, sets)
    genome = json.loads(expert.read_text())
    out.mkdir(parents=True)
    spawn(expert_worker, [(data, config, genome, seed, w, cores[w % len(cores)], deadline, out)
                           for w in range(workers)], "expert")
    runs = [(json.loads(p.read_text()), p.with_suffix(".pt")) for p in sorted(out.glob("*.json"), key=_expert_order)]
    done = [(r["fitness"], weights) for r, weights in runs if "fitness" in r]
    row = {"evaluations": len(runs), "by_status": {"ok": len(done), "failed": len(runs) - len(done)},
           "epochs": [r["epochs"] for r, _ in runs], "val": None, "model": None}
    if done:
        fitness, weights = max(done)
        row.update(val=fitness, model=save_best(out, data, genome, fitness, weights))
    return row


def run_galapagos(strategy: str, data: Path, config: Path, out: Path, seed: int, minutes: float, workers: int,
                  deadline: float, sets: list[str]) -> dict:
    cmd = [sys.executable, "-m", "galapagos.cli", "evolve", "--data", str(data), "--out", str(out), "--config",
           str(config), "--budget-minutes", str(minutes), "--workers", str(workers), "--strategy", strategy,
           "--set", f"run.seed={seed}", "--set", f"evolution.seed={seed}", *(a for s in sets for a in ("--set", s))]
    log = out.with_suffix(".log")
    stopped = False
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:  # its budget counts from after its start-up; the wall time is over
            proc.send_signal(signal.SIGTERM)
            proc.wait()
            stopped = True
    # 4: no candidate succeeded, a result too; the signal itself: it came after the job ended, as the command
    # printed its summary (its handlers the default again), and the run's summary.json is written
    if proc.returncode not in (0, 4) and not (stopped and proc.returncode == -signal.SIGTERM
                                              and (out / "summary.json").exists()):
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}; see {log}")
    summary = json.loads((out / "summary.json").read_text())
    best = summary["best"]
    return {"evaluations": summary["evaluations"], "by_status": summary["by_status"],
            "val": best and best["fitness"], "model": best and out / "best"}


def final_ensemble(run: dict, out: Path) -> dict:
    """The run's final ensemble (OUT/final) in place of its single pick as the run's network: its validation
    score, the pick's and the build's seconds."""
    if run["model"] is None:  # nothing finished: nothing to ensemble
        return run
    final = json.loads((out / "summary.json").read_text()).get("final_ensemble")
    if not final or "error" in final:
        raise RuntimeError(f"{out}: no final ensemble ({(final or {}).get('error', 'none made')})")
    return {**run, "model": out / "final", "val": headline(final["val"]), "pick_val": run["val"],
            "pick_model": run["model"], "ensemble_s": final["seconds"]}


def with_picks(rows: list[dict]) -> list[dict]:
    """The rows, and for each ensembled run its own single pick as a row of contestant NAME:pick (paired with the
    ensemble of the same search: bench/PROTOCOL.md's ensemble pilot)."""
    return rows + [{**{k: v for k, v in r.items() if not k.startswith("pick_")}, "contestant": r["contestant"] + PICK,
                    "test": r["pick_test"], "val": r["pick_val"]} for r in rows if "pick_test" in r]


def headline(scores: dict) -> float:
    """The one score a row reports: accuracy, or mean R^2."""
    return scores["accuracy"] if "accuracy" in scores else scores["r2"]


def test_score(model: Path, data: Path) -> float:
    """The test score of a saved network or ensemble, from the command a user would run."""
    proc = subprocess.run([sys.executable, "-m", "galapagos.cli", "predict", "--model", str(model), "--data",
                           str(data), "--split", "test", "--json"], capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"galapagos predict --model {model} failed: {proc.stderr.strip()}")
    return headline(json.loads(proc.stdout.strip().splitlines()[-1]))


def code_version() -> str | None:
    """The commit a run is made with (bench/PROTOCOL.md: results cite it), read as it starts, "+" if the code
    differs from it (the results file and the README table made from it are not code); None outside a git
    checkout."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":!bench/results", ":!README.md"], cwd=root, capture_output=True, text=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+" if dirty else "")


def machine() -> str:
    """The machine the runs are made on, as the rows name it (bench/PROTOCOL.md): processor, cores, memory, GPU."""
    cpuinfo = Path("/proc/cpuinfo")
    model = next((line.split(":", 1)[1].strip() for line in (cpuinfo.read_text() if cpuinfo.exists() else "")
                  .splitlines() if line.startswith("model name")), platform.processor() or platform.machine())
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{model}, {os.cpu_count()} cores, {memory:.0f} GiB, {gpu}"


def saved_rows(path: Path | None, args: argparse.Namespace, flag: str = "--results") -> list[dict]:
    """The rows of `path` (bench/search.py's JSON lines) of the runs `args` asks for, made with its settings: a
    row carries its minutes, workers and space, and a file of other settings is refused."""
    if path is None or not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    setting = {"minutes": args.minutes, "workers": args.workers, "default_space": args.default_space}
    if other := [r for r in rows if {k: r.get(k) for k in setting} != setting]:
        raise SystemExit(f"{flag} {path}: row {other[0]} was made with other settings than {setting}")
    return [r for r in rows if r["dataset"] in args.datasets and r["contestant"] in args.contestants
            and r["seed"] in args.seeds]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.search", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", nargs="+", choices=list(DATASETS), default=list(DATASETS))
    p.add_argument("--contestants", nargs="+", choices=CONTESTANTS, default=list(CONTESTANTS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--minutes", type=float, default=1.5, help="wall time of each run, start-up included")
    p.add_argument("--workers", type=int, default=2, help="training processes of each contestant")
    p.add_argument("--cores", type=int, nargs="+", help="the cores every contestant is bound to (default: the "
                   "first WORKERS of those this process may use)")
    p.add_argument("--keep", type=Path, help="keep data, runs and logs in this directory (made if missing; a later "
                   "call with the same --results and --keep goes on with the runs not done)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one value of every "
                   "dataset's config, for every contestant (e.g. train.epochs=3)")
    p.add_argument("--default-space", action="store_true", help="every contestant with the default space and "
                   "recipe (an empty config) instead of the dataset's")
    p.add_argument("--results", type=Path, help="a JSON-lines file of rows: a run already in it is not run again, "
                   "each new row is added as it is made, and the table is of all its rows of the chosen datasets, "
                   "contestants and seeds (a long protocol goes on across sessions; the table is made from it)")
    p.add_argument("--pairs", type=Path, metavar="FILE", help="rows made for the pairing alone, in no cell of the "
                   "table: evolution run again on the machine of another contestant's rows. With it, only two runs "
                   "of one machine make a pair (bench/PROTOCOL.md, round 2)")
    p.add_argument("--table-only", action="store_true", help="run nothing: the table of --results's rows")
    p.add_argument("--readme", type=Path, metavar="FILE", help="also write the comparison of every contestant into "
                   "FILE, between its bench.search marker lines (the README's table: bench/search_report.py)")
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)
    if args.table_only and not args.results:
        p.error("--table-only makes the table of a --results file")
    if set(OPTUNA) & set(args.contestants) and not args.table_only:
        try:
            import optuna  # noqa: F401
        except ImportError:
            p.error("the Optuna contestants need optuna: pip install -e \".[bench]\" (or leave out "
                    f"{', '.join(OPTUNA)} with --contestants)")
    if args.pairs and not args.pairs.is_file():
        p.error(f"--pairs {args.pairs}: no such file")
    rows = saved_rows(args.results, args)
    pairs = saved_rows(args.pairs, args, "--pairs") if args.pairs else None

    def refuse_clash(new: list[dict]) -> None:  # a run in both files would be paired twice, or with itself
        if clash := {_run_of(r) for r in new} & {_run_of(r) for r in pairs or []}:
            p.error(f"--pairs {args.pairs} holds the run {sorted(clash)[0]} (dataset, contestant, seed, machine) "
                    f"that --results {args.results} holds too: a run is in one file")
    refuse_clash(rows)  # before any run: the error comes at once, not after hours of runs
    if not args.table_only:
        made = run(args, rows)
        refuse_clash(made)
        rows += made
    picks = [c + PICK for c in args.contestants if c in ENSEMBLED]
    print(table(with_picks(rows), args.datasets, args.contestants + picks, HELD_OUT, PAIRED, pairs))
    if args.readme:
        write_readme(args.readme, summary(with_picks(rows), args.datasets, args.contestants + picks, args.seeds,
                                          minutes=args.minutes, workers=args.workers, held_out=HELD_OUT,
                                          pairs=pairs), argv)


def _run_of(row: dict) -> tuple:
    return row["dataset"], row["contestant"], row["seed"], row.get("machine")


def run(args: argparse.Namespace, held: list[dict]) -> list[dict]:
    """The runs `args` asks for that are not among the rows `held` (its --results file's), one after another:
    their rows."""
    cores = args.cores or sorted(os.sched_getaffinity(0))[:args.workers]
    os.sched_setaffinity(0, cores)  # every contestant's processes inherit it
    done, new = {(r["dataset"], r["contestant"], r["seed"]) for r in held}, []
    where = machine()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        (work / "defaults.toml").write_text("")
        for name in args.datasets:
            generate, kwargs, _ = DATASETS[name]
            data = work / f"{name}.h5"
            generate(data, **kwargs)
            for seed in args.seeds:
                for contestant in args.contestants:
                    if (name, contestant, seed) in done:
                        continue
                    out = work / f"{name}-{contestant}-{seed}"
                    if out.exists():  # a run stopped before its row was written: its traces are not overwritten
                        raise SystemExit(f"{out} holds a run that has no row in {args.results}; move it away to run "
                                         f"it again")
                    commit, t0 = code_version(), time.time()
                    deadline = t0 + 60 * args.minutes
                    config = work / "defaults.toml" if args.default_space else config_path(name)
                    if contestant in VARIANTS:
                        strategy, settings = VARIANTS[contestant]
                        ensembled = contestant in ENSEMBLED
                        r = run_galapagos(strategy, data, config, out, seed, args.minutes, args.workers, deadline,
                                          args.set + settings + ([] if ensembled else ["run.final_ensemble=false"]))
                        if ensembled:
                            r = final_ensemble(r, out)
                    elif contestant == "expert":
                        r = run_expert(data, config, expert_path(name), out, seed, args.workers, cores, deadline,
                                       args.set)
                    elif contestant in OPTUNA:
                        r = run_optuna(contestant, data, config, out, seed, args.workers, cores, deadline, args.set)
                    wall = time.time() - t0
                    model, val = r.pop("model"), r.pop("val")
                    if (pick := r.pop("pick_model", None)) is not None:
                        r["pick_test"] = round(test_score(pick, data), 4)
                        r["pick_val"] = round(r["pick_val"], 4)
                    row = {"dataset": name, "contestant": contestant, "seed": seed, "minutes": args.minutes,
                           "workers": args.workers, "default_space": args.default_space,
                           "test": None if model is None else round(test_score(model, data), 4),
                           "val": None if val is None else round(val, 4), **r, "wall_s": round(wall, 1),
                           "commit": commit, "machine": where}
                    new.append(row)
                    print(json.dumps(row), flush=True)
                    if args.results:
                        with args.results.open("a") as f:
                            f.write(json.dumps(row) + "\n")
    space = "the default space" if args.default_space else "each dataset's space"
    print(f"\n{args.minutes:g} min per run, {args.workers} workers on cores {cores}, seeds {args.seeds}, {space}\n")
    return new


if __name__ == "__main__":
    main()
