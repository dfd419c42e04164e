"""The dataset (installed as ``galapagos.datashare``): the HDF5 format and its checks, writing and ``.npz`` import,
and the read-once MPI broadcast that puts one shared-memory copy of the data on each node (the communicator is
passed in: nothing here imports MPI).
"""
