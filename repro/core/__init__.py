"""What every engine-side process shares: the wire format, crash sites and root causes, the parent
watchdog, where vLLM keeps the pieces of its server."""
