"""What an air-gapped node is handed: vLLM wheelhouses and the harness's own wheels."""
