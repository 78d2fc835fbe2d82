"""vllm-repro harness: runs outside any vLLM environment and never imports vllm or torch."""

__version__ = "0.1.0"
