"""Benchmarks: runnable modules that print comparable numbers (python -m embedstream.bench.<name>)."""
