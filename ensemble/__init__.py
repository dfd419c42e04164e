"""Ensembles of evolved networks (installed as ``galapagos.ensemble``): which members, greedy (Caruana) selection,
the averaging of their predictions over MPI ranks (the communicator is passed in), and the metrics.

Called, the package is the API function :func:`galapagos.api.ensemble` (``galapagos.ensemble(run, data, out)``).
"""
