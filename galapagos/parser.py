"""The command line's contract: every subcommand and option of `galapagos` (parsing only)."""
from __future__ import annotations

import argparse

from galapagos import __version__
from galapagos.datashare.format import TASKS


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="galapagos", description="Evolve neural networks for a scientific dataset, "
                                "at supercomputer scale.")
    p.add_argument("--version", action="version", version=f"galapagos {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    e = sub.add_parser("evolve", help="evolve networks for a dataset (rank 0 evolves, every other rank trains)")
    e.add_argument("--data", required=True, help="HDF5 dataset (see `galapagos data check`)")
    e.add_argument("--out", required=True, help="run directory")
    e.add_argument("--config", help="TOML config with [space] [evolution] [train] [run] tables")
    e.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one config value, e.g. "
                   "train.epochs=4 (repeatable)")
    budget = e.add_mutually_exclusive_group()
    budget.add_argument("--budget-minutes", type=float, help="stop after this many minutes")
    budget.add_argument("--evaluations", type=int, help="stop after this many evaluations")
    e.add_argument("--workers", type=int, help="worker ranks to start when run without MPI (default: one per GPU "
                   "or core)")
    e.add_argument("--strategy", choices=["evolution", "random"])
    e.add_argument("--resume", action="store_true", help="continue the run in --out from its results.jsonl")
    e.add_argument("--seed-from", metavar="RUN|FILE", help="warm start: the population starts from the best "
                   "genomes of an earlier run, or from a JSON file of genomes")
    e.add_argument("--max-restarts", type=int, metavar="N", help="started without MPI: restart the job with --resume "
                   "this many times when a worker rank is lost (default 3)")

    pr = sub.add_parser("predict", help="score a saved network or an ensemble on a split of a dataset")
    pr.add_argument("--model", required=True, help="a run's best/ directory (or the run directory), or an "
                    "ensemble directory (members averaged over MPI ranks)")
    pr.add_argument("--pick", metavar="ID|CONSTRAINTS", help="with --model RUN: a network of the run's Pareto front "
                    "(several [evolution] objectives), by evaluation id or as the best fitness meeting constraints "
                    "such as 'params<=100000,latency<=2' (latency in ms)")
    pr.add_argument("--data", required=True)
    pr.add_argument("--split", default="test", choices=("train", "val", "test"))
    pr.add_argument("--json", action="store_true", help="print one JSON object")
    pr.add_argument("--save", help="write predictions (and, for an ensemble, uncertainties and each member's "
                    "predictions) to this HDF5 file")
    pr.add_argument("--batch", type=int, default=1024, help="samples per forward pass (and per broadcast)")
    pr.add_argument("--ranks", type=int, help="ensemble: MPI ranks to start when run without MPI (default: one per "
                    "member, at most one per GPU or core; 1 = in this process)")
    pr.add_argument("--no-member-outputs", dest="member_outputs", action="store_false",
                    help="ensemble: reduce only the ensemble's moments, not each member's outputs (no per-member "
                    "metrics or predictions; for very large ensembles)")

    en = sub.add_parser("ensemble", help="train an ensemble from an evolution run's best networks, one member per "
                        "worker, and select its members on val")
    en.add_argument("--from", dest="from_run", required=True, metavar="RUN", help="evolution run directory")
    en.add_argument("--data", required=True, help="HDF5 dataset (the one the run evolved for, or one like it)")
    en.add_argument("--out", required=True, help="ensemble directory (new, or with --resume an unfinished one)")
    en.add_argument("--members", type=int, help="members to train (default: ensemble.members)")
    en.add_argument("--pick", metavar="ID|CONSTRAINTS", help="members only from the run's evaluations that meet "
                    "constraints such as 'params<=100000,latency<=2' (latency in ms), or one evaluation's id")
    en.add_argument("--strategy", choices=["distinct", "seeds", "mixed"],
                    help="members from the best distinct genomes, the best genome with new seeds, or half each")
    en.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one value of the run's config, "
                    "e.g. ensemble.epochs=10 (repeatable)")
    en.add_argument("--workers", type=int, help="worker ranks to start when run without MPI (default: one per GPU "
                    "or core)")
    en.add_argument("--resume", action="store_true", help="finish an interrupted build in --out; members already "
                    "trained are kept")
    en.add_argument("--max-restarts", type=int, metavar="N", help="started without MPI: restart the job with --resume "
                    "this many times when a worker rank is lost (default 3)")

    de = sub.add_parser("design", help="one command for a new dataset: evolve, build the ensemble, report")
    de.add_argument("--data", required=True, help="HDF5 dataset (see `galapagos data check`)")
    de.add_argument("--out", required=True, help="run directory; the ensemble goes to OUT/ensemble")
    de.add_argument("--config", help="TOML config with [space] [evolution] [train] [run] [ensemble] tables")
    de.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one config value (repeatable)")
    de_budget = de.add_mutually_exclusive_group()
    de_budget.add_argument("--budget-minutes", type=float, help="time budget of the evolution")
    de_budget.add_argument("--evaluations", type=int, help="evaluations of the evolution")
    de.add_argument("--workers", type=int, help="worker ranks to start when run without MPI (default: one per GPU "
                    "or core)")
    de.add_argument("--members", type=int, help="ensemble members to train (default: ensemble.members)")
    de.set_defaults(resume=False, strategy=None)

    r = sub.add_parser("report", help="summarise a run, design or ensemble directory")
    r.add_argument("dir")
    r.add_argument("--top", type=int, default=5, help="the best N evaluations to list")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.add_argument("--csv", metavar="FILE", help="also write the journal as a flat table: one row per evaluation")
    r.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report with plots")
    r.add_argument("--compare", metavar="RUN", help="--html: another run (e.g. --strategy random) to plot beside")

    x = sub.add_parser("export", help="write a network or an ensemble as one file that plain torch (or an ONNX "
                       "runtime) runs: inputs -> class probabilities or regression outputs, as `predict` gives")
    x.add_argument("--model", required=True, help="a run directory, a network directory or an ensemble directory")
    x.add_argument("--format", required=True, choices=("torchscript", "pt2", "onnx"),
                   help="torchscript (torch.jit.load), pt2 (torch.export.load) or onnx (needs onnx, onnxscript)")
    x.add_argument("--out", required=True, help="the file to write")
    x.add_argument("--json", action="store_true", help="print one JSON object")

    d = sub.add_parser("data", help="check, describe or import datasets")
    dsub = d.add_subparsers(dest="action", required=True)
    c = dsub.add_parser("check", help="validate a file fully (structure and values)")
    c.add_argument("file")
    i = dsub.add_parser("info", help="describe a file (structure only)")
    i.add_argument("file")
    im = dsub.add_parser("import", help="convert a .npz (x_train, y_train, x_val, ...) to the HDF5 format")
    im.add_argument("file")
    im.add_argument("out")
    im.add_argument("--task", choices=TASKS)
    im.add_argument("--num-classes", type=int)
    im.add_argument("--ignore-index", type=int, help="segmentation: the label of unlabelled pixels (e.g. 255)")
    im.add_argument("--name")
    im.add_argument("--force", action="store_true", help="replace the output file if it exists")
    layout = im.add_mutually_exclusive_group()
    layout.add_argument("--channels-last", dest="channels_last", action="store_const", const=True,
                        help="samples are (..., C): move the channel axis first, as Galapagos reads them")
    layout.add_argument("--channels-first", dest="channels_last", action="store_const", const=False,
                        help="samples are channels-first already, though their last axis is 1, 3 or 4")
    im.add_argument("--relabel", action="store_true", help="map the distinct class labels to 0..K-1 (1-based "
                    "labels, or labels with gaps)")

    _add_launch(sub)
    _add_setup(sub)
    _add_doctor(sub)
    _add_supervise(sub)
    return p


class _LaunchParser(argparse.ArgumentParser):
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
    p = sub.add_parser("launch", help="write (and submit) the batch job that runs a galapagos command across a "
                       "whole machine: slurm, lsf, alps, pbs, flux or local",
                       usage="galapagos launch --scheduler S --nodes N --gpus-per-node G [options] "
                             "-- galapagos evolve|ensemble|design ...")
    sub._parser_class = default_class
    p.add_argument("--site", help="a bundled profile by name (frontier, aurora, elcapitan, perlmutter, polaris, lumi, "
                   "alps, jupiter, generic-slurm, ..., workstation) or the path of a TOML profile: one machine's "
                   "defaults, limits and MPI route (see examples/sites/)")
    p.add_argument("--scheduler", help="one of slurm, lsf, alps, pbs, flux, local")
    p.add_argument("--nodes", type=int)
    p.add_argument("--gpus-per-node", type=int, help="one worker rank per GPU; 0 for CPU-only nodes")
    p.add_argument("--cpus-per-node", type=int, help="cores per node (jsrun's resource file needs it)")
    p.add_argument("--workers-per-node", type=int, help="worker ranks per CPU-only node (default: one per core)")
    p.add_argument("--walltime", help="HH:MM (or HH:MM:SS, D-HH:MM, minutes)")
    p.add_argument("--stop-before", type=int, metavar="SECONDS", help="tell the run to stop this long before the "
                   "wall time (default: a tenth of it, 60 to 600 s, worked out again for each follow-up's wall time)")
    p.add_argument("--account")
    p.add_argument("--queue", help="queue or partition (a site's [queues.NAME] limits are checked)")
    p.add_argument("--qos", help="Slurm quality of service, e.g. regular at NERSC (where a job without one gets "
                   "debug); refused for other schedulers")
    p.add_argument("--job-name")
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
    p.add_argument("--launcher-args", help="extra arguments for srun, jsrun, aprun, mpiexec or flux run")
    p.add_argument("--stage", metavar="DIR", help="before the ranks start, copy this Python environment (packed "
                   "once into OUT/job) and the --data file to DIR on each node's local storage (e.g. /tmp, "
                   "/mnt/bb/$USER), and run from there; removed after the run")
    p.add_argument("--program", help="how the compute nodes start galapagos (default: this installation's)")
    p.add_argument("--script", help="where to write the script (default: <out>/job/<scheduler>-<n>.sh)")
    p.add_argument("--submit", action="store_true", help="submit the script and print the job id")
    p.add_argument("--after", metavar="JOBID", help="start only after this job has ended")
    p.add_argument("--chain", type=int, default=0, metavar="N", help="with --submit: also submit N follow-up jobs, "
                   "each resuming the run after the one before ends")
    p.add_argument("--resume", metavar="DIR", help="write the follow-up job of the run in DIR (its saved options, "
                   "overridden by any given here)")
    p.add_argument("job_command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                   help="galapagos evolve|ensemble|design ...")


def _add_setup(sub) -> None:
    p = sub.add_parser("setup", help="make the Python environment a site documents (its modules, mpi4py by the site's "
                       "route, torch for its GPUs, galapagos-nas), or print the commands where they must run on the "
                       "centre's login node",
                       usage="galapagos setup --site NAME DIR [--print] [options]")
    p.add_argument("--site", required=True, help="a bundled profile by name (e.g. frontier, workstation) or a path")
    p.add_argument("dir", metavar="DIR", help="the environment to create (a venv or conda prefix)")
    p.add_argument("--print", dest="print_only", action="store_true", help="print the commands, run nothing (what "
                   "every centre's profile does anyway: its lines load modules on the login node)")
    p.add_argument("--source", default="galapagos-nas", help="what pip installs for Galapagos: galapagos-nas from "
                   "PyPI (default), a checkout's directory or a wheel")
    p.add_argument("--torch", metavar="PIP-ARGS", help="pip arguments for torch (default: the profile's, e.g. its "
                   "ROCm index); '' skips torch")
    p.add_argument("--python", help="the interpreter that makes the venv (default: this one on a workstation, "
                   "python3 of the site's modules elsewhere)")
    p.add_argument("--system-site-packages", action="store_true", help="let the venv see the interpreter's packages")
    p.add_argument("--pip-args", default="", metavar="ARGS", help="added to every pip install, e.g. "
                   "'--no-index --find-links DIR' where there is no network")


def _add_doctor(sub) -> None:
    p = sub.add_parser("doctor", help="check that the MPI mpi4py loads meets this launcher's PMI and this node's "
                       "network (and the site's route), the GPUs and node-local storage; --ranks measures the network",
                       usage="galapagos doctor [--site NAME|PATH] [--ranks N] [--json] [--before-launch]")
    p.add_argument("--site", help="a bundled profile by name or a path (default: $GALAPAGOS_SITE): its [mpi] route, "
                   "network, fabric figures and [storage]")
    p.add_argument("--ranks", type=int, metavar="N", help="measure node-to-node bandwidth and latency on N ranks "
                   "(started with mpiexec; under a launcher, on the ranks it started)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--before-launch", action="store_true", help="what a job script runs before its ranks start: no "
                   "MPI_Init, warnings to stderr, exit code 2 with one line on a definite mismatch")
    p.add_argument("--launcher", choices=["srun", "pals", "jsrun", "flux", "aprun", "mpiexec"],
                   help="what the job's launch line starts ranks with (default: the site's, else the scheduler's)")
    p.add_argument("--pmi", help="the PMI that launch line serves, e.g. srun --mpi=TYPE's TYPE (cray_shasta, pmix, "
                   "pmi2)")


def _add_supervise(sub) -> None:
    p = sub.add_parser("supervise", help="what a job script runs: start the job's ranks on a list of nodes and, when "
                       "a node or rank is lost, probe the nodes and start again with --resume on those that answer",
                       usage="galapagos supervise --nodes FILE [--ranks FILE | --per-node P] [options] "
                             "-- PROGRAM evolve|ensemble|design ...")
    p.add_argument("--nodes", required=True, metavar="FILE", help="the allocation's nodes, one a line; rank 0 "
                   "goes on the first that answers")
    p.add_argument("--ranks", metavar="FILE", help="the scheduler's ranks file that `galapagos launch` wrote beside "
                   "the script (default: this installation's Hydra mpiexec on the host list)")
    p.add_argument("--per-node", type=int, default=1, metavar="P", help="without --ranks: worker ranks per node")
    p.add_argument("--max-restarts", type=int, default=3, metavar="N", help="restarts before the job ends with "
                   "its summary and exit code 3 (default 3)")
    p.add_argument("--min-nodes", type=int, default=1, metavar="N", help="end the job when fewer nodes answer")
    p.add_argument("--probe-timeout", type=float, default=30.0, metavar="SECONDS", help="a node whose one-task "
                   "probe takes longer is left out (default 30)")
    p.add_argument("job_command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                   help="how the nodes start galapagos, then its job command")
