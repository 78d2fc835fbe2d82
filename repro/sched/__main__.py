"""``python -m repro.sched SPEC.json OUT.jsonl`` (see repro/sched/__init__.py)."""

import sys

from repro.core.watchdog import watch_parent
from repro.sched.spec_run import main

watch_parent()  # nothing of this run outlives a harness that was killed without cleaning up
sys.exit(main())
