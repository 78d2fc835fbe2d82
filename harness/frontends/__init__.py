"""The faces: the ``vllm-repro`` CLI (one module per command) and the pytest plugin."""
