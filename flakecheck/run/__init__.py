"""A run from start to finish: its settings, the one pipeline every source of traces goes through, and the
replay through the built-in engine."""
