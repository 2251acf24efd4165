"""Benchmarks (run as scripts, e.g. `python bench/parser.py`)."""
