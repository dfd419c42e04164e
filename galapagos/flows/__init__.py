"""The application flows, each as check-then-master: the evolution run, the ensemble build, design and
prediction, the job lifecycle they share on rank 0 (``session``) and how any of them runs over MPI ranks
(``mpijob``: self-started under mpiexec, or on a launcher's ranks)."""
