"""The command line's contract: every subcommand and option of `galapagos` (parsing only).

One grammar (tests/test_cli_grammar.py checks it): the same flag for the same thing in every command (`--data`,
`--out`, `--run` for a directory read, `--workers`, `--resume`, `--json`), every option with help and its real
default, an example in every subcommand's help. Old spellings stay as hidden aliases, so scripts keep working."""
from __future__ import annotations

import argparse
import textwrap

from galapagos import __version__
from galapagos.datashare.format import TASKS

RESTARTS = 3  # default --max-restarts (options.py's dataclasses have the same)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Examples kept as written; an option's default shown where it has a real one (not None or a switch's
    False); hidden alias spellings (an action's `hidden`) and a switch's legacy value left out."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (not action.option_strings or "default" in text or action.default in (None, False, "", argparse.SUPPRESS)
                or isinstance(action.default, (list, tuple)) or action.const is True):
            return text
        return f"{text} (default: %(default)s)"

    def _format_action_invocation(self, action: argparse.Action) -> str:
        hidden = getattr(action, "hidden", ())
        if not hidden and not getattr(action, "switch", False):
            return super()._format_action_invocation(action)
        shown = [s for s in action.option_strings if s not in hidden]
        if action.nargs == 0 or getattr(action, "switch", False):
            return ", ".join(shown)
        value = self._format_args(action, self._get_default_metavar_for_optional(action))
        return ", ".join(f"{s} {value}" for s in shown)


class Parser(argparse.ArgumentParser):
    """Errors name an option by its current spelling only, not by its hidden old ones."""

    def error(self, message: str):
        for action in self._actions:
            if getattr(action, "hidden", ()):
                shown = [s for s in action.option_strings if s not in action.hidden]
                message = message.replace("/".join(action.option_strings), "/".join(shown))
        super().error(message)


def hide(action: argparse.Action, *aliases: str) -> argparse.Action:
    """Old spellings of an option: they still parse, the help does not show them."""
    action.hidden = aliases
    return action


def command(sub, name: str, help: str, example: str, **kw) -> argparse.ArgumentParser:
    """A subcommand with the common conventions: its help as description, defaults shown, an example."""
    lines = [line.strip() for line in example.strip().splitlines()]
    title = "example" if len(lines) == 1 else "examples"
    return sub.add_parser(name, help=help, description=textwrap.fill(help, 100), formatter_class=HelpFormatter,
                          epilog=f"{title}:\n" + "\n".join(f"  {line}" for line in lines), **kw)


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout")


def add_search(p: argparse.ArgumentParser, *, design: bool) -> None:
    """The options `evolve` and `design` share: data, run directory, config, budgets, workers and the search."""
    p.add_argument("--data", required=True, metavar="FILE", help="HDF5 dataset (see `galapagos data check`; a .npz "
                   "converts with `galapagos data import`)")
    p.add_argument("--out", required=True, metavar="DIR", help="run directory (created, with its parents; with "
                   "--resume the run to continue)" + ("; the ensemble goes to DIR/ensemble" if design else ""))
    p.add_argument("--config", metavar="FILE", help="TOML config with [space] [evolution] [train] [run]"
                   + (" [ensemble]" if design else "") + " tables (default: the built-in defaults)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one config value, e.g. "
                   "train.epochs=4 (repeatable)")
    p.add_argument("--evaluations", type=int, metavar="N", help="stop after N evaluations (run.evaluations); with "
                   "--budget-minutes, at whichever comes first")
    p.add_argument("--budget-minutes", type=float, metavar="M", help="stop after M minutes of search "
                   "(run.budget_minutes); with --evaluations, at whichever comes first")
    p.add_argument("--workers", type=int, metavar="N", help="worker ranks to start when run without MPI (default: "
                   "one per GPU or core)")
    p.add_argument("--strategy", choices=["evolution", "random"], help="how candidates are chosen: evolution, or "
                   "random search as a baseline (default: evolution.strategy, evolution)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its results.jsonl"
                   + ("; then build or finish its ensemble" if design else ""))
    p.add_argument("--seed-from", metavar="RUN|FILE", help="warm start: the population starts from the best "
                   "genomes of an earlier run, or from a JSON file of genomes")
    p.add_argument("--max-restarts", type=int, default=RESTARTS, metavar="N", help="started without MPI: restart "
                   "the job with --resume this many times when a worker rank is lost")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="galapagos", formatter_class=HelpFormatter,
               description="Evolve neural networks for a scientific dataset, at supercomputer scale, and build "
               "ensembles from what it finds.",
               epilog="examples:\n"
               "  galapagos data check shapes.h5\n"
               "  galapagos design --data shapes.h5 --out runs/d1 --budget-minutes 10\n"
               "  galapagos report runs/d1\n\n"
               "`galapagos COMMAND --help` shows a command's options, defaults and an example.")
    p.add_argument("--version", action="version", version=f"galapagos {__version__}",
                   help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    e = command(sub, "evolve", "evolve networks for a dataset (rank 0 evolves, every other rank trains)",
                "galapagos evolve --data shapes.h5 --out runs/e4 --evaluations 40 --budget-minutes 10 --workers 2")
    add_search(e, design=False)
    add_json(e)

    pr = command(sub, "predict", "score a saved network or an ensemble on a split of a dataset",
                 "galapagos predict --model runs/e4 --data shapes.h5 --split test --json")
    pr.add_argument("--model", "--run", required=True, metavar="DIR", help="a run directory (its best network), "
                    "its best/ directory, or an ensemble directory (members averaged over MPI ranks)")
    pr.add_argument("--pick", metavar="ID|CONSTRAINTS", help="with a run: a network of the run's Pareto front "
                    "(several [evolution] objectives), by evaluation id or as the best fitness meeting constraints "
                    "such as 'params<=100000,latency<=2' (latency in ms)")
    pr.add_argument("--data", required=True, metavar="FILE", help="HDF5 dataset with the split to score")
    pr.add_argument("--split", default="test", choices=("train", "val", "test"), help="the split to score")
    add_json(pr)
    pr.add_argument("--save", metavar="FILE", help="write predictions (and, for an ensemble, uncertainties and each "
                    "member's predictions) to this HDF5 file")
    pr.add_argument("--batch", type=int, default=1024, metavar="N", help="samples per forward pass (and per "
                    "broadcast)")
    hide(pr.add_argument("--workers", "--ranks", dest="ranks", type=int, metavar="N", help="ensemble: ranks to "
                         "start when run without MPI (default: one per member, at most one per GPU or core; 1 = in "
                         "this process)"), "--ranks")
    pr.add_argument("--no-member-outputs", dest="member_outputs", action="store_false",
                    help="ensemble: reduce only the ensemble's moments, not each member's outputs (no per-member "
                    "metrics or predictions; for very large ensembles)")

    en = command(sub, "ensemble", "train an ensemble from an evolution run's best networks, one member per worker, "
                 "and select its members on val",
                 "galapagos ensemble --run runs/e4 --data shapes.h5 --out runs/e4-ens --members 4 --workers 2")
    hide(en.add_argument("--run", "--from", dest="from_run", required=True, metavar="DIR",
                         help="the evolution run (or design) directory to build from"), "--from")
    en.add_argument("--data", required=True, metavar="FILE", help="HDF5 dataset (the one the run evolved for, or one "
                    "like it)")
    en.add_argument("--out", required=True, metavar="DIR", help="ensemble directory (created, with its parents; "
                    "with --resume an unfinished one)")
    en.add_argument("--members", type=int, metavar="K", help="members to train (default: ensemble.members, 8)")
    en.add_argument("--pick", metavar="ID|CONSTRAINTS", help="members only from the run's evaluations that meet "
                    "constraints such as 'params<=100000,latency<=2' (latency in ms), or one evaluation's id")
    en.add_argument("--strategy", choices=["distinct", "seeds", "mixed", "kept"],
                    help="members trained from the best distinct genomes, the best genome with new seeds, or half "
                    "each; or kept: the run's kept networks as they are, nothing trained, no ranks started "
                    "(default: ensemble.strategy, mixed)")
    en.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one value of the run's config, "
                    "e.g. ensemble.epochs=10 (repeatable)")
    en.add_argument("--workers", type=int, metavar="N", help="worker ranks to start when run without MPI (default: "
                    "one per GPU or core)")
    en.add_argument("--resume", action="store_true", help="finish an interrupted build in --out; members already "
                    "trained are kept")
    en.add_argument("--max-restarts", type=int, default=RESTARTS, metavar="N", help="started without MPI: restart "
                    "the job with --resume this many times when a worker rank is lost")
    add_json(en)

    de = command(sub, "design", "one command for a new dataset: evolve, build the ensemble, report",
                 "galapagos design --data shapes.h5 --out runs/d1 --budget-minutes 10 --members 4 --workers 2")
    add_search(de, design=True)
    de.add_argument("--members", type=int, metavar="K", help="ensemble members to train (default: ensemble.members, "
                    "8)")
    add_json(de)

    r = command(sub, "report", "summarise a run, design or ensemble directory; write it as a table or an interactive "
                "HTML page, or serve that page live while the run goes on",
                "galapagos report runs/e4 --top 10 --html runs/e4.html\n"
                "galapagos report runs/e4 --csv runs/e4.csv\n"
                "galapagos report runs/e4 --serve --port 8050")
    r.add_argument("dir", nargs="?", metavar="DIR", help="the run, design or ensemble directory (or --run DIR)")
    r.add_argument("--run", dest="run_dir", metavar="DIR", help="the same as DIR, as the other commands spell it")
    r.add_argument("--top", type=int, default=5, metavar="N", help="the best N evaluations to list")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.add_argument("--csv", metavar="FILE", help="also write the journal as a flat table: one row per evaluation")
    r.add_argument("--html", metavar="FILE", help="also write the interactive HTML report: one self-contained file "
                   "that opens offline")
    r.add_argument("--compare", metavar="RUN", help="--html, --serve: another run (e.g. --strategy random) to plot "
                   "beside")
    r.add_argument("--serve", action="store_true", help="serve the HTML report on 127.0.0.1 and refresh it as the "
                   "run's journal grows, to watch a running search (Ctrl-C stops)")
    r.add_argument("--port", type=int, default=8050, metavar="N", help="--serve: the port (0: any free one)")

    x = command(sub, "export", "write a network or an ensemble as one file that plain torch (or an ONNX runtime) "
                "runs: inputs -> class probabilities or regression outputs, as `predict` gives",
                "galapagos export --model runs/e4 --format torchscript --out e4.ts")
    x.add_argument("--model", "--run", required=True, metavar="DIR", help="a run directory (its best network), a "
                   "network directory or an ensemble directory")
    x.add_argument("--format", required=True, choices=("torchscript", "pt2", "onnx"),
                   help="torchscript (torch.jit.load), pt2 (torch.export.load) or onnx (needs onnx, onnxscript)")
    x.add_argument("--out", required=True, metavar="FILE", help="the file to write (its directory must exist)")
    add_json(x)

    d = command(sub, "data", "check, inspect or import datasets: `data check|info|import`",
                "galapagos data check shapes.h5\ngalapagos data info shapes.h5\n"
                "galapagos data import mydata.npz mydata.h5")
    dsub = d.add_subparsers(dest="action", required=True, metavar="ACTION")
    c = command(dsub, "check", "validate a file fully (structure and values)", "galapagos data check shapes.h5")
    c.add_argument("file", metavar="FILE", help="the HDF5 dataset")
    add_json(c)
    i = command(dsub, "info", "describe a file (structure only, fast)", "galapagos data info shapes.h5")
    i.add_argument("file", metavar="FILE", help="the HDF5 dataset")
    add_json(i)
    im = command(dsub, "import", "convert a .npz (x_train, y_train, x_val, y_val, x_test, y_test) to the HDF5 "
                 "format", "galapagos data import mydata.npz mydata.h5 --task classification")
    im.add_argument("file", metavar="NPZ", help="the .npz file to convert")
    im.add_argument("out", metavar="OUT", help="the HDF5 file to write")
    im.add_argument("--task", choices=TASKS, help="the learning task (default: classification for integer labels, "
                    "regression for float targets; dense tasks are never inferred)")
    im.add_argument("--num-classes", type=int, metavar="K", help="classes (default: the largest label + 1)")
    im.add_argument("--ignore-index", type=int, metavar="LABEL", help="segmentation: the label of unlabelled pixels "
                    "(e.g. 255)")
    im.add_argument("--name", help="the dataset's name, kept as the file's `name` attribute")
    im.add_argument("--force", action="store_true", help="replace the output file if it exists")
    layout = im.add_mutually_exclusive_group()
    layout.add_argument("--channels-last", dest="channels_last", action="store_const", const=True,
                        help="samples are (..., C): move the channel axis first, as Galapagos reads them")
    layout.add_argument("--channels-first", dest="channels_last", action="store_const", const=False,
                        help="samples are channels-first already, though their last axis is 1, 3 or 4")
    im.add_argument("--relabel", action="store_true", help="map the distinct class labels to 0..K-1 (1-based "
                    "labels, or labels with gaps)")
    add_json(im)

    _add_launch(sub)
    _add_setup(sub)
    _add_doctor(sub)
    _add_supervise(sub)
    return p


class _LaunchParser(Parser):
    """`--directive X` takes X even when X starts with a dash: argparse alone would read `--directive
    --reservation=abc` as two options."""

    def parse_known_args(self, args=None, namespace=None):
        args, joined = list(args or []), []
        while args:
            token = args.pop(0)
            if token == "--":
                joined += [token, *args]
                break
            joined.append(f"--directive={args.pop(0)}" if token == "--directive" and args else token)
        return super().parse_known_args(joined, namespace)


def _add_launch(sub) -> None:
    default_class, sub._parser_class = sub._parser_class, _LaunchParser
    p = command(sub, "launch", "write (and submit) the batch job that runs a galapagos command across a whole "
                "machine: slurm, lsf, alps, pbs, flux or local",
                "galapagos launch --site frontier --nodes 8 --walltime 02:00 --account abc123 --submit -- "
                "galapagos evolve --data shapes.h5 --out runs/big --budget-minutes 110\n"
                "galapagos launch --scheduler slurm --nodes 2 --gpus-per-node 4 -- "
                "galapagos ensemble --run runs/big --data shapes.h5 --out runs/big-ens\n"
                "galapagos launch --resume --run runs/big --submit",
                usage="galapagos launch --scheduler S --nodes N --gpus-per-node G [options] "
                      "-- galapagos evolve|ensemble|design ...\n       galapagos launch --resume --run DIR [options]")
    sub._parser_class = default_class
    p.add_argument("--site", help="a bundled profile by name (frontier, aurora, elcapitan, perlmutter, polaris, lumi, "
                   "alps, jupiter, generic-slurm, ..., workstation) or the path of a TOML profile: one machine's "
                   "defaults, limits and MPI route (see examples/sites/)")
    p.add_argument("--scheduler", help="one of slurm, lsf, alps, pbs, flux, local (required unless --site gives it)")
    p.add_argument("--nodes", type=int, metavar="N", help="nodes to allocate (required unless --site gives it)")
    p.add_argument("--gpus-per-node", type=int, help="one worker rank per GPU; 0 for CPU-only nodes")
    p.add_argument("--cpus-per-node", type=int, help="cores per node (jsrun's resource file needs it)")
    p.add_argument("--workers-per-node", type=int, help="worker ranks per CPU-only node (default: one per core)")
    p.add_argument("--walltime", help="HH:MM (or HH:MM:SS, D-HH:MM, minutes)")
    p.add_argument("--stop-before", type=int, metavar="SECONDS", help="tell the run to stop this long before the "
                   "wall time (default: a tenth of it, 60 to 600 s, worked out again for each follow-up's wall time)")
    p.add_argument("--max-restarts", type=int, metavar="N", help="the script's supervisor starts the job again "
                   "after a lost rank or node at most N times (default: 3)")
    p.add_argument("--min-nodes", type=int, metavar="N", help="... and not on fewer than N nodes that answer "
                   "(default: 1)")
    p.add_argument("--account", help="the allocation (project) the job is charged to")
    p.add_argument("--queue", help="queue or partition (a site's [queues.NAME] limits are checked)")
    p.add_argument("--qos", help="Slurm quality of service, e.g. regular at NERSC (where a job without one gets "
                   "debug); refused for other schedulers")
    p.add_argument("--job-name", help="the scheduler's name of the job (default: galapagos-<command>)")
    p.add_argument("--constraint", help="node feature: Slurm --constraint, PBS select extra, LSF -alloc_flags, "
                   "Flux --requires")
    p.add_argument("--filesystems", metavar="FS[:FS...]", help="PBS Pro -l filesystems=..., mandatory at ALCF "
                   "(e.g. home:eagle on Polaris, home:flare on Aurora)")
    p.add_argument("--directive", dest="directives", action="append", metavar="TEXT", help="one more directive "
                   "line, the text after the scheduler's prefix, e.g. --directive=--reservation=abc (repeatable; "
                   "kept for --resume)")
    p.add_argument("--env", action="append", metavar="NAME=VALUE", help="exported in the job (repeatable)")
    p.add_argument("--setup", help="shell lines run before the launch: module loads, a venv")
    p.add_argument("--launcher", choices=["mpiexec"], help="slurm: start the ranks with this installation's "
                   "mpiexec inside the allocation instead of srun (when srun cannot speak its MPI's PMI)")
    p.add_argument("--srun-mpi", dest="mpi", metavar="TYPE", help="slurm: srun --mpi=TYPE (pmi2, pmix, "
                   "cray_shasta), the PMI the MPI of mpi4py speaks when srun's default does not match it")
    p.add_argument("--launcher-args", metavar="ARGS", help="extra arguments for srun, jsrun, aprun, mpiexec or flux "
                   "run")
    p.add_argument("--stage", metavar="DIR", help="before the ranks start, copy this Python environment (packed "
                   "once into OUT/job) and the --data file to DIR on each node's local storage (e.g. /tmp, "
                   "/mnt/bb/$USER), and run from there; removed after the run")
    p.add_argument("--program", help="how the compute nodes start galapagos (default: this installation's)")
    p.add_argument("--script", help="where to write the script (default: <out>/job/<scheduler>-<n>.sh)")
    p.add_argument("--submit", action="store_true", help="submit the script and print the job id")
    p.add_argument("--after", metavar="JOBID", help="start only after this job has ended")
    p.add_argument("--chain", type=int, default=0, metavar="N", help="with --submit: also submit N follow-up jobs, "
                   "each resuming the run after the one before ends")
    p.add_argument("--run", metavar="DIR", help="with --resume: the run whose follow-up job to write")
    resume = p.add_argument("--resume", nargs="?", const=True, metavar="DIR", help="write the follow-up job of the "
                            "run in --run DIR (its saved options, overridden by any given here)")
    resume.switch = True  # `--resume DIR`, the old spelling, still parses
    add_json(p)
    p.add_argument("job_command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                   help="galapagos evolve|ensemble|design ...")


def _add_setup(sub) -> None:
    p = command(sub, "setup", "make the Python environment a site documents (its modules, mpi4py by the site's "
                "route, torch for its GPUs, galapagos-nas), or print the commands where they must run on the centre's "
                "login node", "galapagos setup --site frontier ~/envs/galapagos --print",
                usage="galapagos setup --site NAME DIR [--print] [options]")
    p.add_argument("--site", required=True, help="a bundled profile by name (e.g. frontier, workstation) or a path")
    p.add_argument("dir", metavar="DIR", help="the environment to create (a venv or conda prefix)")
    p.add_argument("--print", dest="print_only", action="store_true", help="print the commands, run nothing (what "
                   "every centre's profile does anyway: its lines load modules on the login node)")
    p.add_argument("--source", default="galapagos-nas", help="what pip installs for Galapagos: galapagos-nas from "
                   "PyPI, a checkout's directory or a wheel")
    p.add_argument("--torch", metavar="PIP-ARGS", help="pip arguments for torch (default: the profile's, e.g. its "
                   "ROCm index); '' skips torch")
    p.add_argument("--python", help="the interpreter that makes the venv (default: this one on a workstation, "
                   "python3 of the site's modules elsewhere)")
    p.add_argument("--system-site-packages", action="store_true", help="let the venv see the interpreter's packages")
    p.add_argument("--pip-args", default="", metavar="ARGS", help="added to every pip install, e.g. "
                   "'--no-index --find-links DIR' where there is no network")


def _add_doctor(sub) -> None:
    p = command(sub, "doctor", "check that the MPI mpi4py loads meets this launcher's PMI and this node's network "
                "(and the site's route), the GPUs and node-local storage; --ranks measures the network",
                "galapagos doctor --site perlmutter --ranks 2",
                usage="galapagos doctor [--site NAME|PATH] [--ranks N] [--json] [--before-launch]")
    p.add_argument("--site", help="a bundled profile by name or a path (default: $GALAPAGOS_SITE): its [mpi] route, "
                   "network, fabric figures and [storage]")
    p.add_argument("--ranks", type=int, metavar="N", help="measure node-to-node bandwidth and latency on N ranks "
                   "(started with mpiexec; under a launcher, on the ranks it started)")
    add_json(p)
    p.add_argument("--before-launch", action="store_true", help="what a job script runs before its ranks start: no "
                   "MPI_Init, warnings to stderr, exit code 2 with one line on a definite mismatch")
    p.add_argument("--launcher", choices=["srun", "pals", "jsrun", "flux", "aprun", "mpiexec"],
                   help="what the job's launch line starts ranks with (default: the site's, else the scheduler's)")
    p.add_argument("--pmi", help="the PMI that launch line serves, e.g. srun --mpi=TYPE's TYPE (cray_shasta, pmix, "
                   "pmi2)")


def _add_supervise(sub) -> None:
    p = command(sub, "supervise", "what a job script runs: start the job's ranks on a list of nodes and, when a "
                "node or rank is lost, probe the nodes and start again with --resume on those that answer",
                "galapagos supervise --nodes nodes.txt --workers-per-node 4 -- galapagos evolve --data shapes.h5 "
                "--out runs/big --budget-minutes 60",
                usage="galapagos supervise --nodes FILE [--ranks FILE | --workers-per-node P] [options] "
                      "-- PROGRAM evolve|ensemble|design ...")
    p.add_argument("--nodes", required=True, metavar="FILE", help="the allocation's nodes, one a line; rank 0 "
                   "goes on the first that answers")
    p.add_argument("--ranks", metavar="FILE", help="the scheduler's ranks file that `galapagos launch` wrote beside "
                   "the script (default: this installation's Hydra mpiexec on the host list)")
    hide(p.add_argument("--workers-per-node", "--per-node", dest="per_node", type=int, default=1, metavar="P",
                        help="without --ranks: worker ranks per node (as launch's --workers-per-node)"), "--per-node")
    p.add_argument("--max-restarts", type=int, default=3, metavar="N", help="restarts before the job ends with "
                   "its summary and exit code 3")
    p.add_argument("--min-nodes", type=int, default=1, metavar="N", help="end the job when fewer nodes answer")
    p.add_argument("--probe-timeout", type=float, default=30.0, metavar="SECONDS", help="a node whose one-task "
                   "probe takes longer is left out")
    p.add_argument("job_command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                   help="how the nodes start galapagos, then its job command")
