"""Benchmark scripts: they print their figures; performance is never asserted in tests."""
