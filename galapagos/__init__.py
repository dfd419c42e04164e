"""Galapagos: evolve neural networks for a scientific dataset across a whole machine, and build ensembles.

    import galapagos
    run = galapagos.evolve("data.h5", "runs/first", evaluations=40, workers=2)
    ens = galapagos.ensemble("runs/first", "data.h5", "runs/first-ens", members=4, workers=2)
    scores = galapagos.predict("runs/first-ens", "data.h5", split="test")
    model = galapagos.load("runs/first-ens")  # a torch module
    galapagos.export("runs/first-ens", "ens.pt2", "pt2")  # one file for plain torch

See galapagos.api for every function and what it returns.
"""
from galapagos.api import check_data, design, ensemble, evolve, export, import_data, load, predict, report
from galapagos.errors import UsageError

__all__ = ["check_data", "design", "ensemble", "evolve", "export", "import_data", "load", "predict", "report",
           "UsageError"]
