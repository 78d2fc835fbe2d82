"""Bisect: the pure search, the probe that runs one cell per candidate, and per-commit candidates."""
