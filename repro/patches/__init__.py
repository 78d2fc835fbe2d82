"""What the project's vLLM plugin installs in every vLLM process: the async shim, loopback binds, counters, faults."""
