"""Benchmarks: each prints one JSON object with raw figures, a ratio and its target."""
