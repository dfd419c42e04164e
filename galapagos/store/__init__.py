"""The directories Galapagos writes and reads: the run directory (``rundir``) with its journal (``journal``: one
typed record per finished evaluation), data fingerprint and lock, and the ensemble directory (``ensembledir``).
No module outside this package builds a path inside a run or ensemble directory."""
