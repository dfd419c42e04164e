"""A rank that only asks for COMM_WORLD (galapagos.launch.mpi.world), as every Galapagos job does first. Run with the
PMIx variables a PMIx launcher sets (Aurora's PALS mpiexec --pmi=pmix) and the pip MPICH, which speaks no PMIx: the
mismatch must come back as one line before MPI_Init, which would abort with MPICH's error stack."""
import sys

from galapagos.launch.mpi import MPIMismatch, world

try:
    comm = world()
except MPIMismatch as exc:
    print(f"world_pmix: {exc}", file=sys.stderr)
    sys.exit(2)
print(f"world_pmix: a world of {comm.size}")
