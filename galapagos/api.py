"""The Python API: what the command line does, as functions that return objects.

Started in a plain process (a script, a notebook), `evolve`, `ensemble` and `design` check their inputs, start
their MPI job under `mpiexec` and return rank 0's result as a :class:`~galapagos.results.Run`,
:class:`~galapagos.results.Ensemble` or :class:`~galapagos.results.Design`. Called under a launcher (every rank of
`srun python my_script.py` calls the same function), they run this rank's part: rank 0 gets the result, the other
ranks None. Bad input raises :class:`galapagos.errors.UsageError` (or a subclass of ValueError naming the key, file
or dataset) before anything is written; a run that ends with no successful evaluation raises
:class:`galapagos.errors.NoResult` (its summary attached) once summary.json is written.

Config values that name a function as "module:function" (`run.task`, `train.builder`) also take the function
itself, when it is defined at the top level of a module that the ranks can import.
"""
from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tomli_w

from galapagos.errors import UsageError
from galapagos.flows.mpijob import FlowRef
from galapagos.options import TRAIN_TASK, EnsembleOptions, EvolveOptions, PredictOptions

if TYPE_CHECKING:
    import torch

    from galapagos.results import Design, Ensemble, Run

PathLike = str | Path
#: Config overrides: {"train.epochs": 4, "run.task": my_task} (TOML values, or a function where a "module:function"
#: is expected), or the command line's strings ("train.epochs=4", ...).
Overrides = Mapping[str, Any] | Sequence[str] | str
# The jobs that run a flow over MPI ranks (galapagos.flows.mpijob); worker ranks of the master/worker flows import
# none of them; every rank of a collective one (predict) runs it.
FLOWS = {"evolve": FlowRef("galapagos.flows.evolution", task=TRAIN_TASK),
         "design": FlowRef("galapagos.flows.designing", phases=2, task=TRAIN_TASK),
         "ensemble": FlowRef("galapagos.flows.ensembling", task=TRAIN_TASK),
         "predict": FlowRef("galapagos.flows.prediction", collective=True)}


def evolve(data: PathLike, out: PathLike, *, config: PathLike | Mapping | None = None, set: Overrides = (),
           evaluations: int | None = None, budget_minutes: float | None = None, workers: int | None = None,
           strategy: str | None = None, resume: bool = False, seed_from: PathLike | Run | None = None,
           max_restarts: int = 3) -> Run | None:
    """Evolve networks for the HDF5 dataset `data` into the run directory `out`; returns the :class:`Run`.

    `config`: a TOML file, or its tables as a dict ({"train": {"epochs": 4}}); `set` overrides config values
    ({"train.epochs": 4}); give a budget (`evaluations`, `budget_minutes`, or both: whichever comes first) here or
    in the config; `seed_from` (a run, or a JSON file of genomes) starts the population from known genomes;
    `resume` continues the run in `out`; `max_restarts`: restarts of the job after a lost rank.
    """
    from galapagos.results import Run

    opts = EvolveOptions(str(data), str(out), *_config(config, set, resume), evaluations, budget_minutes, workers,
                         strategy, resume, seed_from=_str(seed_from), max_restarts=max_restarts)
    result = run("evolve", opts)
    return None if result is None else Run(result["run"], finished=result.get("finished"))


def design(data: PathLike, out: PathLike, *, config: PathLike | Mapping | None = None, set: Overrides = (),
           evaluations: int | None = None, budget_minutes: float | None = None, workers: int | None = None,
           members: int | None = None, strategy: str | None = None, resume: bool = False,
           seed_from: PathLike | Run | None = None, max_restarts: int = 3) -> Design | None:
    """Evolve into `out`, train an ensemble of `members` into `out`/ensemble on the same workers, and compare the
    two on test; returns the :class:`Design` (a stop signal may leave its ensemble unbuilt: `resume=True` goes on).
    The other arguments are `evolve`'s."""
    from galapagos.results import Design

    opts = EvolveOptions(str(data), str(out), *_config(config, set, resume), evaluations, budget_minutes, workers,
                         strategy, resume, members, seed_from=_str(seed_from), max_restarts=max_restarts)
    result = run("design", opts)
    return None if result is None else Design(out, finished=result["evolution"].get("finished"))


def ensemble(run: PathLike | Run, data: PathLike, out: PathLike, *, members: int | None = None,
             strategy: str | None = None, set: Overrides = (), workers: int | None = None,
             resume: bool = False, pick: str | None = None, max_restarts: int = 3) -> Ensemble | None:
    """Train an ensemble from the best networks of the evolution `run` (a Run or its directory) into `out` and
    select its members on val; returns the :class:`Ensemble`.

    `strategy`: "distinct", "seeds" or "mixed"; `pick`: members only from the evaluations that meet it (an id or
    constraints like "params<=100000,latency<=2"). When a stop signal ends the build first, the Ensemble's
    `stopped_by` names it and `resume=True` finishes it.
    """
    from galapagos.results import Ensemble

    opts = EnsembleOptions(_str(run), str(data), str(out), members, strategy, _sets(set), workers, resume, pick,
                           max_restarts=max_restarts)
    result = _job("ensemble", opts)
    return None if result is None else Ensemble(result["ensemble_dir"], stopped_by=result.get("stopped_by"))


def predict(model: PathLike | Run | Ensemble, data: PathLike, split: str = "test", *, save: PathLike | None = None,
            batch: int = 1024, workers: int | None = None, member_outputs: bool = True, pick: str | None = None,
            ranks: int | None = None) -> dict | None:
    """Score a network (a run, its best/) or an ensemble on `split` of `data`. With `pick` (an id, or constraints
    like "params<=100000,latency<=2") `model` is a run and the network is the member of its Pareto front that the
    pick names (the best fitness of those meeting the constraints). `workers`: ranks that share an ensemble's
    members (`ranks` is its old name).

    Returns accuracy, nll and ece (classification) or mse, mae, r2 and per_target (regression); for an ensemble
    also each member's scores and the uncertainty. `save` writes the predictions to an HDF5 file.
    """
    return run("predict", PredictOptions(_str(model), str(data), split, _str(save), batch,
                                         ranks if workers is None else workers, member_outputs, pick))


def load(path: PathLike | Run | Ensemble, device: str = "cpu", *, logits: bool = False) -> torch.nn.Module:
    """A saved network (a run, its best/, an ensemble member) or a whole ensemble, as a torch module in eval mode:
    inputs (N, *sample_shape) -> class probabilities (classification), as `predict` scores them and exported files
    give them, or regression outputs. `logits=True`: one network's raw outputs before the softmax."""
    from galapagos.models import load_model

    return load_model(_str(path), device, logits=logits)


def load_run(path: PathLike) -> Run | Design | Ensemble:
    """A run, design or ensemble directory (finished or still going) as its object."""
    from galapagos.results import load_run as read

    return read(path)


def export(model: PathLike | Run | Ensemble, out: PathLike, format: str = "torchscript") -> dict:
    """Write a network (a run, its best/, an ensemble member) or a whole ensemble to `out` as one file that plain
    torch runs without Galapagos: "torchscript", "pt2" (torch.export) or "onnx". The module gives what `predict`
    gives: class probabilities, or regression outputs. Returns the file, format and shapes."""
    from galapagos.export import export as write

    return write(_str(model), out, format)


def report(path: PathLike | Run | Ensemble, top: int = 5) -> dict:
    """What a directory amounts to, by its `kind`: a run's summary (evaluations by status, the best network,
    utilisation, the `top` evaluations), a design's (the same and its ensemble's metrics), an ensemble's metrics."""
    from galapagos.reports.summary import run_report

    return run_report(_str(path), top)


def results(path: PathLike, *, csv: PathLike | None = None, as_frame: bool = False) -> Any:
    """The journal of a run or ensemble directory as a flat table: a list of dicts, one per evaluation, or a pandas
    DataFrame (`as_frame`; `load_run(path).results()` gives the same). With `csv`, writes the table there instead
    and returns its number of rows."""
    from galapagos.reports import tables

    if csv is not None:
        return tables.write_csv(path, csv)
    return tables.frame(path) if as_frame else tables.rows(path)


def html_report(path: PathLike, out: PathLike, *, compare: PathLike | None = None) -> str:
    """A self-contained HTML report of a run, design or ensemble directory, with the run `compare` (e.g. a random
    search) beside it; returns the file written (`load_run(path).report(out)` does the same)."""
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
    """Run a job by name with its options (an options object or its dict): the one entry of every job; returns
    rank 0's result as a dict (what the command line prints), None on the other ranks."""
    from galapagos.flows.mpijob import run as run_flow

    kinds = {"evolve": EvolveOptions, "design": EvolveOptions, "ensemble": EnsembleOptions, "predict": PredictOptions}
    if isinstance(opts, dict):
        opts = kinds[name].from_dict(opts)
    return run_flow(FLOWS[name], opts)


_job = run  # for `ensemble`, whose first argument is named `run`


def _config(config: PathLike | Mapping | None, sets: Overrides, resume: bool) -> tuple[str | None, tuple[str, ...]]:
    """`config` and `set` as the options carry them: a config file's path, and `section.key=value` strings (a config
    given as a dict comes first among them, as a file comes before --set)."""
    if not isinstance(config, Mapping):
        return _str(config), _sets(sets)
    if resume:
        raise UsageError("config=: a resumed run keeps its own config.toml; change it with set= instead")
    flat = {}
    for section, table in config.items():
        if not isinstance(table, Mapping):
            raise UsageError(f"config={{{section!r}: {table!r}}}: expected a table of keys, e.g. "
                             "config={'train': {'epochs': 4}}")
        flat |= {f"{section}.{key}": value for key, value in table.items()}
    return None, _sets(flat) + _sets(sets)


def _sets(sets: Overrides) -> tuple[str, ...]:
    """Overrides as `section.key=value` strings, values written as TOML, functions as "module:function"."""
    if isinstance(sets, str):
        return (sets,)
    if not isinstance(sets, Mapping):
        return tuple(sets)
    out = []
    for key, value in sets.items():
        if not isinstance(key, str) or key.count(".") != 1 or "=" in key:
            raise UsageError(f"set={{{key!r}: ...}}: expected a key 'section.key', e.g. set={{'train.epochs': 4}}")
        out.append(f"{key}={_toml(key, function_name(value, key) if callable(value) else value)}")
    return tuple(out)


def _toml(key: str, value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(key, v) for v in value) + "]"
    if isinstance(value, Path):
        value = str(value)
    if not isinstance(value, (str, int, float, bool)):
        raise UsageError(f"{key}: {value!r} is not a config value (a number, string, boolean or list of them)")
    return tomli_w.dumps({"v": value})[4:].strip()


def function_name(fn: Any, key: str = "function") -> str:
    """A function given where a config value names one (run.task, train.builder) as its "module:function", which
    every rank imports; a UsageError that says how to fix a function no other process can import."""
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    fix = ("define it at the top level of a module of its own (e.g. tasks.py beside your script, importable by the "
           "ranks: in the working directory or on PYTHONPATH) and import it from there, or give its name as "
           "'module:function'")
    if not module or not name:
        raise UsageError(f"{key}: {fn!r} has no module and name to import it by; {fix}")
    if "." in name or "<" in name:
        raise UsageError(f"{key}: {name} is not a top-level function of {module} (a lambda, a function defined "
                         f"inside another, or a method); {fix}")
    if module == "__main__":
        raise UsageError(f"{key}: {name} is defined in __main__ (the script being run, or an interactive session), "
                         f"which the ranks cannot import; {fix}")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"{key}: {module}:{name} cannot be imported ({exc}); {fix}") from None
    if found is not fn:
        raise UsageError(f"{key}: {module}:{name} is another object than the function given; {fix}")
    return f"{module}:{name}"


def _str(path: Any) -> str | None:
    """A path, or a result object's directory, as the options carry it."""
    if path is None:
        return None
    return str(getattr(path, "path", path))
