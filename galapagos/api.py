"""The Python API: what the command line does, as functions that return data.

Started in a plain process (a script, a notebook), `evolve`, `ensemble` and `design` check their inputs, start
their MPI job under `mpiexec` and return rank 0's result. Called under a launcher (every rank of `srun python
my_script.py` calls the same function), they run this rank's part: rank 0 gets the result, the other ranks None.
Bad input raises :class:`galapagos.errors.UsageError` (or a subclass of ValueError naming the key, file or
dataset) before anything is written; a run that ends with no successful evaluation raises
:class:`galapagos.errors.NoResult` (its summary attached) once summary.json is written.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from galapagos.flows.mpijob import FlowRef
from galapagos.options import TRAIN_TASK, EnsembleOptions, EvolveOptions, PredictOptions

PathLike = str | Path
# The jobs that run a flow over MPI ranks (galapagos.flows.mpijob); worker ranks of the master/worker flows import
# none of them; every rank of a collective one (predict) runs it.
FLOWS = {"evolve": FlowRef("galapagos.flows.evolution", task=TRAIN_TASK),
         "design": FlowRef("galapagos.flows.designing", phases=2, task=TRAIN_TASK),
         "ensemble": FlowRef("galapagos.flows.ensembling", task=TRAIN_TASK),
         "predict": FlowRef("galapagos.flows.prediction", collective=True)}


def evolve(data: PathLike, out: PathLike, *, config: PathLike | None = None, set: tuple[str, ...] = (),
           evaluations: int | None = None, budget_minutes: float | None = None, workers: int | None = None,
           strategy: str | None = None, resume: bool = False, seed_from: PathLike | None = None) -> dict | None:
    """Evolve networks for the HDF5 dataset `data` into the run directory `out`.

    `set` overrides config values ("train.epochs=4"); give a budget (`evaluations` or `budget_minutes`) here or
    in the config; `seed_from` (a run directory, or a JSON file of genomes) starts the population from known
    genomes. Returns the run's summary (as in summary.json) with `run`, `best_dir` and `finished`.
    """
    return run("evolve", EvolveOptions(str(data), str(out), _str(config), tuple(set), evaluations, budget_minutes,
                                       workers, strategy, resume, seed_from=_str(seed_from)))


def design(data: PathLike, out: PathLike, *, config: PathLike | None = None, set: tuple[str, ...] = (),
           evaluations: int | None = None, budget_minutes: float | None = None, workers: int | None = None,
           members: int | None = None) -> dict | None:
    """Evolve into `out`, train an ensemble of `members` into `out`/ensemble on the same workers, and report.

    Returns {"evolution": summary, "ensemble": metrics, "report": report} (less what a stop signal cut off).
    """
    return run("design", EvolveOptions(str(data), str(out), _str(config), tuple(set), evaluations, budget_minutes,
                                       workers, members=members))


def ensemble(from_run: PathLike, data: PathLike, out: PathLike, *, members: int | None = None,
             strategy: str | None = None, set: tuple[str, ...] = (), workers: int | None = None,
             resume: bool = False, pick: str | None = None) -> dict | None:
    """Train an ensemble from the best networks of the run `from_run` into `out` and select its members on val.

    `strategy`: "distinct", "seeds" or "mixed"; `pick`: members only from the evaluations that meet it (an id or
    constraints like "params<=100000,latency<=2"). Returns the metrics (as in `out`/metrics.json) with
    `ensemble_dir`, or {"ensemble_dir", "stopped_by"} when a stop signal ended the build first.
    """
    return run("ensemble", EnsembleOptions(str(from_run), str(data), str(out), members, strategy, tuple(set),
                                           workers, resume, pick))


def predict(model: PathLike, data: PathLike, split: str = "test", *, save: PathLike | None = None,
            batch: int = 1024, ranks: int | None = None, member_outputs: bool = True, pick: str | None = None
            ) -> dict | None:
    """Score a network (a run directory or its best/) or an ensemble directory on `split` of `data`. With `pick`
    (an id, or constraints like "params<=100000,latency<=2") `model` is a run directory and the network is the
    member of its Pareto front that the pick names (the best fitness of those meeting the constraints).

    Returns accuracy, nll and ece (classification) or mse, mae, r2 and per_target (regression); for an ensemble
    also each member's scores and the uncertainty. `save` writes the predictions to an HDF5 file.
    """
    return run("predict", PredictOptions(str(model), str(data), split, _str(save), batch, ranks, member_outputs,
                                         pick))


def load(path: PathLike, device: str = "cpu") -> Any:
    """A saved network (a run directory, its best/, or an ensemble member) or a whole ensemble directory, as a
    torch module in eval mode: inputs (N, *sample_shape) -> class probabilities for an ensemble, logits for one
    network (classification), or regression outputs."""
    from galapagos.models import load_ensemble, load_network
    from galapagos.store.ensembledir import is_ensemble

    if is_ensemble(path):
        return load_ensemble(path, device)
    return load_network(path, device)[0]


def export(model: PathLike, out: PathLike, format: str = "torchscript") -> dict:
    """Write a network (a run directory, its best/, an ensemble member) or a whole ensemble directory to `out` as
    one file that plain torch runs without Galapagos: "torchscript", "pt2" (torch.export) or "onnx". The module
    gives what `predict` gives: class probabilities, or regression outputs. Returns the file, format and shapes."""
    from galapagos.export import export as write

    return write(model, out, format)


def report(path: PathLike, top: int = 5) -> dict:
    """What a directory amounts to, by its `kind`: a run's summary (evaluations by status, the best network,
    utilisation, the `top` evaluations), a design's (the same and its ensemble's metrics), an ensemble's metrics."""
    from galapagos.reports.summary import run_report

    return run_report(path, top)


def results(path: PathLike, *, csv: PathLike | None = None, as_frame: bool = False) -> Any:
    """The journal of a run or ensemble directory as a flat table: a list of dicts, one per evaluation (the
    metrics as metric_* columns), or a pandas DataFrame (`as_frame`). With `csv`, writes the table there instead
    and returns its number of rows."""
    from galapagos.reports import tables

    if csv is not None:
        return tables.write_csv(path, csv)
    return tables.frame(path) if as_frame else tables.rows(path)


def html_report(path: PathLike, out: PathLike, *, compare: PathLike | None = None) -> str:
    """A self-contained HTML report of a run, design or ensemble directory (plots inline, nothing to fetch), with
    the run `compare` (e.g. a random search) beside it; returns the file written."""
    from galapagos.reports.html import write_report

    return str(write_report(path, out, compare=compare))


def check_data(path: PathLike, *, values: bool = True) -> Any:
    """Check a dataset file: its structure and (`values`) every value. Its DatasetInfo, or a DataError naming the
    file, the dataset and what is wrong."""
    from galapagos.datashare.format import inspect, validate

    return validate(path) if values else inspect(path)


def import_data(npz: PathLike, out: PathLike, *, task: str | None = None, num_classes: int | None = None,
                name: str | None = None, overwrite: bool = False, channels_last: bool | None = None,
                relabel: bool = False, ignore_index: int | None = None) -> Any:
    """Convert a .npz (x_train, y_train, x_val, y_val, x_test, y_test) into a checked HDF5 dataset file; an
    existing `out` is refused unless `overwrite`. Samples that look channels-last, labels that start at 1 or skip
    values, and hundreds of integer targets taken for classes are refused with the fix: `channels_last` (True:
    move the last axis first; False: they are channels-first), `relabel` (labels to 0..K-1), `num_classes`,
    `task` (the dense tasks, segmentation with `ignore_index` for unlabelled pixels, and field, are never
    inferred)."""
    from galapagos.datashare.write import import_npz

    return import_npz(npz, out, task=task, num_classes=num_classes, name=name, overwrite=overwrite,
                      channels_last=channels_last, relabel=relabel, ignore_index=ignore_index)


def run(name: str, opts: Any) -> dict | None:
    """Run a job by name with its options (an options object or its dict): the one entry of every job."""
    from galapagos.flows.mpijob import run as run_flow

    kinds = {"evolve": EvolveOptions, "design": EvolveOptions, "ensemble": EnsembleOptions, "predict": PredictOptions}
    if isinstance(opts, dict):
        opts = kinds[name].from_dict(opts)
    return run_flow(FLOWS[name], opts)


def _str(path: PathLike | None) -> str | None:
    return None if path is None else str(path)
