"""Upstream-ready reports (``vllm-repro upstream-report FINDING``, issue 38 item 2): for each finding of the
project that vLLM has no report of, an issue body in vLLM's bug-report form, a standalone reproducer importing only
vllm and pytest, and a check that runs it in a bare env (vLLM and pytest alone) inside the window and before it.

* ``findings`` — the known findings (``findings.toml``), each tied to its known-bug row for the window;
* ``bare_env`` — the bare envs (uv), cached beside the project's envs under ``bare-envs/``;
* ``check`` — run the reproducer in a bare env and judge its JUnit results (pure);
* ``report`` — the folder: ``ISSUE.md``, ``test_<finding>.py``, ``check.json``.
"""
