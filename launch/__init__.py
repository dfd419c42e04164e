"""How ranks start and talk (installed as ``galapagos.launch``): the one mpi4py import (``mpi``), the typed protocol
of every MPI and pipe message, the master and worker loops, the supervisor and its trainer child, placement on the
node's GPUs and cores, and the batch scripts of each scheduler (``scripts``).
"""
