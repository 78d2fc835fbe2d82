"""Running engines: the engine process and its events, sessions, the local and Ray backends, GPU slots, port
blocks (``ports``), and why an engine died (``engine_death``)."""
