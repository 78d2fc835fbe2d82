"""The benchmark: where a run's time goes (vllm-repro bench), per engine and per phase."""
