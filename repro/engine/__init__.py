"""The engine process, ``python -m repro.engine SPEC.json OUT.jsonl`` inside a vLLM environment, and its
standalone reproducer template."""
