"""Example dataset generators and configs (run as ``python -m galapagos.examples.NAME --out FILE.h5``)."""
