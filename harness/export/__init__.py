"""Exporters: a cell or a scheduler-tier plan written out as a standalone script that imports only vLLM."""
