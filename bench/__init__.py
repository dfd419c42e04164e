"""Benchmarks: each measures against a named peer or limit in the same run."""
