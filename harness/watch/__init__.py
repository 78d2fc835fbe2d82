"""The release watch: which vLLM releases are newer than the newest one the project has judged, a compatibility
smoke on each tier and door of each, then its default matrix; a failure of the harness itself is told apart from a
finding about vLLM (``vllm-repro releases watch``)."""
