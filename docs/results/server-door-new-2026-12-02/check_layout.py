"""Run inside a vLLM env (PYTHONPATH = the worktree): where the server door finds vLLM's server in this release,
whether the flags it builds parse back to the asked engine arguments, and whether the build_app the probe wraps is
the one the server's build_and_serve/run_server_worker call.  No engine is started.  Prints one JSON line."""

import importlib
import json
import sys
import warnings

from repro.server import layout
from repro.server.args import serve_argv
from repro.server.probe import install

warnings.simplefilter("ignore", DeprecationWarning)
import vllm  # noqa: E402

out: dict = {"vllm": vllm.__version__}
out["server_main"] = layout.server_main()
out["cli_args"] = layout.find_attr(layout.CLI_ARGS, "make_arg_parser")[0]
kwargs = {"model": sys.argv[1], "skip_tokenizer_init": True, "max_model_len": 256, "max_num_seqs": 32,
          "max_num_batched_tokens": 256, "enforce_eager": True, "seed": 0, "disable_log_stats": True,
          "dtype": "float32", "distributed_executor_backend": "mp", "async_scheduling": True,
          "tensor_parallel_size": 1}
main = importlib.import_module(out["server_main"])
caller = getattr(main, "build_and_serve", None) or main.run_server_worker
state: dict = {"problems": []}
install(main, state)
# The probe's wrapper is what the server's own code will call: the caller reads build_app from the same globals.
out["caller"] = f"{caller.__module__}.{caller.__qualname__}"
out["caller_sees_wrapper"] = getattr(caller.__globals__.get("build_app"), "__repro_wrapped__", False)
out["problems"] = state["problems"]
try:
    out["argv"] = serve_argv(kwargs, "127.0.0.1", 20030)
except Exception as exc:  # e.g. the CUDA wheel on a machine without a GPU: no device to build the parser's defaults
    out["argv_error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
