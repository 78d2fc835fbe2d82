"""Result history: an append-only JSONL file of runs (``store``), each cell's outcome over time (``view``),
shown as a terminal table (``table``) or a PNG heat-map (``plot``).

One line per run (one results report)::

    {"schema": "vllm-repro/history", "schema_version": 1, "run_id": "…", "cells_digest": "…", "added": "2026-…",
     "source": "…",
     "meta": {"platform": "cpu", "created": "…", "inject": [...], "devices": [...], …},
     "cells": [{"id", "version", "executor", "async", "mode", "clear_cache", "tp", "scenario", "model_runner",
                "batch_invariant", ["tier",] "outcome", "label", "summary", "reason", "expectation", "expected",
                "vllm_version", "device", "inject"}, …]}

A cell's axes are those of harness.core.cell.Cell (``async`` spelled as in schema 1); an axis added since (``tier``)
is written only when it is not at its default, so the lines still read in older versions.

Outcomes are kept as strings, so a history written by a newer vllm-repro (e.g. FLAKY from ``--repeat``) still
shows and plots.  Runs that used fault injection (``--inject vllm#42043``) are labelled everywhere and kept in
rows of their own: an injected LOSS must never read as an upstream regression.
"""
