"""Backends: the only code that starts, signals and watches real processes."""
