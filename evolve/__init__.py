"""What a network is and how the search moves (installed as ``galapagos.evolve``).

The genome and its search space, the DEAP operators, the asynchronous steady-state engine behind ask/tell, the
shape arithmetic that checks a genome without torch, genome -> torch module, and the training of one candidate.
Nothing here imports MPI, ``galapagos.launch`` or the application; algorithm code sees ask/tell and arrays.

Called, the package is the API function :func:`galapagos.api.evolve` (``galapagos.evolve(data, out, ...)``).
"""
