"""Sequence parallelism: ring attention, Ulysses and state passing over processes, and their cost model."""
