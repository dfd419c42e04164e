"""Galapagos: evolve neural networks for a scientific dataset across a whole machine, and build ensembles.

    import galapagos
    run = galapagos.evolve("shapes.h5", "runs/api", evaluations=40, workers=2, set={"train.epochs": 4})
    print(run.best.fitness, run.best.params)  # the best evaluation, a Trial
    table = run.results()  # pandas DataFrame: one row per evaluation, a column per parameter and metric
    ens = galapagos.ensemble(run, "shapes.h5", "runs/api-ens", members=4, workers=2)
    scores = galapagos.predict(ens, "shapes.h5", split="test")  # accuracy, nll, ece
    model = galapagos.load(ens)  # torch module: inputs -> class probabilities
    galapagos.export(ens, "ens.pt2", "pt2")  # one file for plain torch
    run.report("runs/api.html")  # the interactive HTML report, one self-contained file

Jobs: started in a plain process they start their MPI ranks themselves (`workers` of them, with mpiexec); under a
launcher (`srun python my_script.py`) every rank calls them, and rank 0 gets the result, the other ranks None.

    evolve(data, out, ...) -> Run            search for networks (`resume=True` continues a run)
    design(data, out, ...) -> Design         a search, then an ensemble of its best, compared on test
    ensemble(run, data, out, ...) -> Ensemble  an ensemble of a run's best networks

Using what they made (a result object or its directory):

    load_run(path) -> Run | Design | Ensemble  a directory read back, also while its run is going
    predict(model, data, split) -> dict      scores on a split, and the predictions saved if asked
    load(model, *, logits=False) -> torch module giving class probabilities (or regression outputs)
    export(model, out, format) -> dict       a file plain torch or an ONNX runtime runs
    report(path) -> dict                     the summary `galapagos report --json` prints

Results: `Run` (.best, .trials, .pareto, .results(), .report(), .summary, .config, .load()), `Trial` (.fitness,
.params, .metrics, .genome, .curve, .status, .path, .load()), `Ensemble` (.members, .weights, .metrics,
.results(), .report(), .load()), `Design` (a Run with .ensemble and .comparison).

Data: check_data(path) checks an HDF5 dataset; import_data(npz, out) converts a .npz into one.

Configuration: `config=` a TOML file or its tables as a dict; `set=` overrides as a dict ({"train.epochs": 4}) or
the command line's strings ("train.epochs=4"). A value that names a function ("module:function": run.task,
train.builder) also takes the function itself, defined at the top level of a module the ranks can import.
Bad input raises UsageError (a ValueError) before anything is written or started.

These names (`__all__`) are the API. Everything Galapagos installs lives under this one name: the packages
galapagos.evolve, .datashare, .ensemble, .launch and .examples, and the application's modules, whose insides may
change between versions. Importing galapagos is cheap (no torch, no MPI): the API loads when first used.
"""
from __future__ import annotations

import types as _types
from typing import Any as _Any

__version__ = "0.2.0"

_FUNCTIONS = ("check_data", "design", "ensemble", "evolve", "export", "import_data", "load", "load_run", "predict",
              "report")
_CLASSES = ("Design", "Ensemble", "Run", "Trial")
__all__ = [*_FUNCTIONS, *_CLASSES, "UsageError", "__version__"]


class _CallablePackage(_types.ModuleType):
    """A subpackage named like an API function (galapagos.evolve, galapagos.ensemble): the package to import from,
    and the function when called."""

    def __call__(self, *args: _Any, **kwargs: _Any) -> _Any:
        from galapagos import api

        return getattr(api, self.__name__.rpartition(".")[2])(*args, **kwargs)


from galapagos import ensemble as _ensemble, evolve as _evolve  # noqa: E402 - their __init__ only: no imports

_evolve.__class__ = _ensemble.__class__ = _CallablePackage


def __getattr__(name: str) -> _Any:
    if name in _FUNCTIONS:
        from galapagos import api

        return getattr(api, name)
    if name in _CLASSES:
        from galapagos import results

        return getattr(results, name)
    if name == "UsageError":
        from galapagos.errors import UsageError

        return UsageError
    raise AttributeError(f"module 'galapagos' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
