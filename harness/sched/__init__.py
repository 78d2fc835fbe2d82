"""The scheduler tier, harness side: its cells, its process, and the fuzzer's driver."""
