"""Layers of the Llama family, one op a file; every reduction goes through the run's `Ops`."""
