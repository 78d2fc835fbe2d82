"""Code that runs inside a vLLM environment; talks to the harness only through JSON files and argv."""
