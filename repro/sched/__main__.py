"""``python -m repro.sched SPEC.json OUT.jsonl`` (see repro/sched/__init__.py)."""

import sys

from repro.sched.runner import main
from repro.watchdog import watch_parent

watch_parent()  # nothing of this run outlives a harness that was killed without cleaning up
sys.exit(main())
