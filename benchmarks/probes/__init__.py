"""Measuring helpers shared by benchmarks; not benchmarks themselves."""
