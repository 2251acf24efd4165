"""Benchmarks, run as scripts (`python bench/parser.py`); each prints rows/s of binlake and of
its baseline measured in the same run, and their ratio. This file only makes `bench` a package
so the scripts can share helpers."""
