#!/bin/bash
# CPU acceptance runs for issue 15 (sequential; nice).
cd /tmp/mm/acc
V=/tmp/venv-mymodel/bin/vllm-repro
COMMON="--versions 0.21.0,0.32.0 --executor mp --scenario pause"
run() { name=$1; shift; /usr/bin/time -f "$name wall %e s" nice -n 10 $V matrix $COMMON --reports /tmp/mm/acc/$name "$@" > /tmp/mm/acc/$name.log 2>&1; echo "$name rc=$?" >> /tmp/mm/acc/$name.log; }
run bigram-pc-on  --engine-arg enable_prefix_caching=true
run qwen3-pc-on   --preset rlhf-async-new-apis --engine-arg enable_prefix_caching=true
run qwen3-pc-off  --preset rlhf-async-new-apis --engine-arg enable_prefix_caching=false
run bigram-pc-off --engine-arg enable_prefix_caching=false
