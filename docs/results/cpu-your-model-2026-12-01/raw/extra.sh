#!/bin/bash
# Extra CPU runs for issue 15 after the acceptance runs: a user's model folder that loops (tied head), and bf16.
while pgrep -f "/tmp/mm/acc/run.sh" > /dev/null; do sleep 20; done
V=/tmp/venv-mymodel/bin/vllm-repro
COMMON="--versions 0.21.0 --executor mp --async on --mode keep --clear-cache true --scenario pause"
run() { name=$1; shift; /usr/bin/time -f "$name wall %e s" nice -n 10 $V matrix $COMMON --reports /tmp/mm/acc/$name "$@" > /tmp/mm/acc/$name.log 2>&1; echo "$name rc=$?" >> /tmp/mm/acc/$name.log; }
run tied-folder --model /tmp/mm/tied
run qwen3-bf16 --model qwen3-random --engine-arg dtype=bfloat16
