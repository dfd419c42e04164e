"""Example dataset generators and configs (run as ``python -m examples.NAME --out FILE.h5``)."""
