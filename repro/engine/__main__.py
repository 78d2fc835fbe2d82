"""``python -m repro.engine SPEC.json OUT.jsonl``: the engine process (``repro.engine.main``)."""

from repro.engine.main import main

if __name__ == "__main__":
    raise SystemExit(main())
