"""The issue-35 kv-example case: enable_prefix_caching made an argument the engine spec cannot carry."""
import sys
import repro.wire
repro.wire.OWNED_ENGINE_ARGS["enable_prefix_caching"] = "(a declared setting)"
from harness.frontends.cli import main
sys.exit(main(sys.argv[1:]))
