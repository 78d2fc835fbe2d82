"""``python -m repro.sched SPEC.json OUT.jsonl`` (see repro/sched/__init__.py)."""

import sys

from repro.sched.runner import main

sys.exit(main())
