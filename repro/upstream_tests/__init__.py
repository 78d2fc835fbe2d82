"""Standalone reproducers for upstream reports (``vllm-repro upstream-report``): each module is copied verbatim
as ``test_<finding>.py`` into the report's folder and run in a bare env that holds only vLLM and pytest, so each
imports only vllm, pytest and the standard library.  Never imported by the harness (read as text)."""
