"""The pure core of the harness: no I/O, no subprocesses, no rich.

``axes`` declares every axis of a cell once; ``cell`` derives the cell, its engine key, ids, their parser,
sort order and JSON form from that table; ``pattern`` selects cells by any subset of axes (``bisect
--cell``, known-bug rules, the workaround ledger, history rows); ``versions`` orders version labels.
"""
