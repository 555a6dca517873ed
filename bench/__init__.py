"""Benchmark suite: ``python3 bench/run.py`` (see bench/README.md)."""
