"""Compare two results reports cell by cell (the CPU tier against the GPU tier, or any two runs): ``pairs``
pairs the cells and judges agreement, ``render`` shows it.

A cell *ran* on a side when it produced a verdict there (anything but UNSUPPORTED, ERROR, TIMEOUT or
BUILD-FAILED).  Two sides *agree* on a cell both ran when the outcome, the outcome label (``LOSS(1)`` is not
``LOSS(2)``) and the number of affected requests are the same.  Everything else (cells one side ran, cells
neither ran) is listed with the other side's outcome and reason, never counted as agreement.

**Across tiers** (``across_tiers``; by default whenever each report holds one tier and the tiers differ, e.g.
a ``--tier scheduler`` run against an engine-tier run) cells are paired by their id without the tier segment
(``vllm0.21.0-mp-async_on-keep-clear-sched`` with ``vllm0.21.0-mp-async_on-keep-clear``).  The tiers run
different workloads (the scheduler tier 4 requests, all running at the reset; the engine tier 10, 8 of them
running at the pause), so request counts are not compared: they agree when outcome, label and *scope* (no
request affected, every request running at the pause, or some) are the same.  A pair that differs while each
side shows what the known-bug table expects for its tier is an *expected difference* (the table's windows
per tier say why, e.g. vllm#42043: the engine tier from 0.17.0, the first release whose keep-mode pause
resets the cache with requests running; the scheduler tier, which calls the reset directly, from 0.12.0);
it is reported as such, not as agreement, and does not fail the comparison.
"""
