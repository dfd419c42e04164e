"""Galapagos: evolve neural networks for a scientific dataset across a whole machine, and build ensembles.

    import galapagos
    run = galapagos.evolve("data.h5", "runs/first", evaluations=40, workers=2)
    ens = galapagos.ensemble("runs/first", "data.h5", "runs/first-ens", members=4, workers=2)
    scores = galapagos.predict("runs/first-ens", "data.h5", split="test")
    model = galapagos.load("runs/first-ens")  # a torch module
    galapagos.export("runs/first-ens", "ens.pt2", "pt2")  # one file for plain torch

See galapagos.api for every function and what it returns. Everything Galapagos installs lives under this one name:
the packages galapagos.evolve, .datashare, .ensemble, .launch and .examples, and the application's flows, store
and reports. Importing galapagos is cheap (no torch, no MPI): the API's modules load when a function is first used.
"""
from __future__ import annotations

import types
from typing import Any

__version__ = "0.2.0"

API = ("check_data", "design", "ensemble", "evolve", "export", "import_data", "load", "predict", "report")
__all__ = [*API, "UsageError", "__version__"]


class _CallablePackage(types.ModuleType):
    """A subpackage named like an API function (galapagos.evolve, galapagos.ensemble): the package to import from,
    and the function when called."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from galapagos import api

        return getattr(api, self.__name__.rpartition(".")[2])(*args, **kwargs)


from galapagos import ensemble as _ensemble, evolve as _evolve  # noqa: E402 - their __init__ only: no imports

_evolve.__class__ = _ensemble.__class__ = _CallablePackage


def __getattr__(name: str) -> Any:
    if name in API:
        from galapagos import api

        return getattr(api, name)
    if name == "UsageError":
        from galapagos.errors import UsageError

        return UsageError
    raise AttributeError(f"module 'galapagos' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
