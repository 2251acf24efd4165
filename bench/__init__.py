"""Benchmarks, run as modules from the repository root (`python3 -m bench.parser`); each prints
rows/s of binlake and of its baseline measured in the same run, and their ratio. What they
share is in `bench/common.py`."""
