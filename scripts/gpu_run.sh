#!/usr/bin/env bash
# Run workbook steps on a GPU node inside a time budget, then pack the run folder.
#   bash scripts/gpu_run.sh <run-id> <budget-seconds> <step>...
# steps: bench (harness overhead benchmark), roofline (decode/prefill vs the roofline floor),
#        served (tunebook's client vs vllm bench serve on one warm server, all requests at once),
#        served-c32 (the same, at most 32 requests in flight), served-sampler (tunebook's /metrics
#        sampler off vs on, same server, at most 32 in flight), abba (bare LLM.generate vs
#        Engine.run on one warm engine, ABBA), starts (cold vs warm compile cache), starts-mp
#        (warm starts, engine core spawned vs forked), starts-launcher (warm starts, the API server
#        spawned vs forked from tunebook's launcher), starts-launcher-fork (the same, engine core
#        forked in both arms), starts-core (warm starts, every API server forked from the
#        launcher, its engine core spawned vs forked),
#        overload (05's written deployment as written: a 2x burst of 20 s, then 60 s at its
#        capacity; python -m tunebook.serve --check --overload), overload-bench (the same, sent
#        by vllm bench serve: --client vllm-bench; its result JSONs kept; OVERLOAD_RATE=<req/s>
#        replaces deployment.json's capacity, e.g. one measured on this kind of card),
#        kv-exact (engines sized in bytes, bf16 and fp8 KV, for ERNIE's, Qwen3's and Llama's full
#        shapes: each engine's KV capacity must equal the config's arithmetic exactly; ~6 eager
#        starts),
#        00 01 02 03 04 05 (notebooks, resumable; consecutive ones share one runner process).
# Each step gets what is left of the budget; a step cut short leaves its finished points on disk
# (atomic per-point files) and the next call with the same run id resumes. The run folder is
# packed into $OUT/run.tgz (or ./run.tgz) whatever happened.
set -u
rid=$1; budget=$2; shift 2
out=${OUT:-.}
start=$(date +%s)
mkdir -p "runs/$rid"
# Each call gets a fresh copy of the checkout: the tracked files of a run folder committed earlier
# (run.json, run.log, notebooks) come back as committed and would hide what an earlier call on
# this node wrote. The node keeps its own copy of the folder outside the checkout; restore it.
keep=${TMPDIR:-/tmp}/tunebook-keep
if [[ -d $keep/$rid ]]; then cp -a "$keep/$rid/." "runs/$rid/"; fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,clocks.sm,clocks.mem --format=csv \
  >> "runs/$rid/nvidia-smi.csv" 2>&1 || true
# The served steps compile into the same cache folders the start-cost steps fill (one cold
# compile per node, not one per step); start_cost.py sets these per start itself.
for v in VLLM_CACHE_ROOT TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR; do
  export "$v=/tmp/starts-launcher/warm/${v,,}"
done
# 25 s to pack, and 30 s for a notebook step stopped by its timeout: SIGTERM stops the runner,
# which shuts papermill's kernel (and its servers) down and records the call in run.json; a
# SIGKILL 5 s after it left both cut calls of 04 unrecorded on an H100 (runs/h100-20261206).
left() { echo $(( budget - ($(date +%s) - start) - 55 )); }
profile=${GPU_RUN_PROFILE:-h200}  # another profile only to try this script off a GPU node

# Each given notebook as "<nb>:<status>:<calls>" from run.json ("00:ok:2 01:-:0 ...").
books() {
  python3 - "runs/$rid/run.json" "$@" <<'PY'
import json, sys
try:
    books = json.load(open(sys.argv[1]))["notebooks"]
except (OSError, ValueError, KeyError):
    books = {}
seen = {k.split("_")[0]: v for k, v in books.items()}
print(" ".join(
    f"{b}:{seen[b].get('status', '-')}:{len(seen[b].get('calls') or [1])}" if b in seen else f"{b}:-:0"
    for b in sys.argv[2:]
))
PY
}

# The given notebooks that no call has finished (status ok), in order.
unfinished() {
  local s out=()
  for s in $(books "$@"); do [[ $s == *:ok:* ]] || out+=("${s%%:*}"); done
  echo "${out[*]}"
}

# Consecutive notebook steps run in one runner process: its start-up and the profile check that
# imports vLLM (~25 s on a GPU node, runs/h100-20261206b) are paid once per call, not per notebook.
# A notebook that fails is left out and the runner goes on with the rest, as separate steps did.
run_notebooks() {
  local todo; read -r -a todo <<< "$(unfinished "$@")"
  for b in "$@"; do [[ " ${todo[*]} " == *" $b "* ]] || echo "[gpu_run] $b: finished by an earlier call, skipped"; done
  while (( ${#todo[@]} )); do
    local l; l=$(left)
    if (( l < 30 )); then echo "[gpu_run] no time left for ${todo[*]}"; return 1; fi
    echo "[gpu_run] ${todo[*]}: ${l}s left"
    local args=() b; for b in "${todo[@]}"; do args+=(--notebook "$b"); done
    local before; before=$(books "${todo[@]}")
    timeout -k 30 "$l" python3 -m tunebook run --profile "$profile" --run-id "$rid" "${args[@]}" \
      --resume --runs-dir runs --no-report 2>&1 | grep -E "^\[tunebook\]|Error|error" | tail -40
    local rc=${PIPESTATUS[0]}
    if (( rc == 0 )); then return 0; fi
    if (( rc == 124 || rc == 137 )); then return 1; fi  # out of time: a later call resumes
    # Leave out what this call tried and did not finish (failed); go on with the rest.
    local after; after=$(books "${todo[@]}")
    local rest=() i=0 tried=0 a=($before) z=($after)
    for b in "${todo[@]}"; do
      if [[ ${a[$i]} != "${z[$i]}" ]]; then tried=1; else rest+=("$b"); fi
      i=$((i + 1))
    done
    if (( ! tried )); then echo "[gpu_run] the runner stopped before any notebook (rc $rc)"; return 1; fi
    read -r -a todo <<< "$(unfinished "${rest[@]}")"
  done
}

steps=("$@")
i=0
while (( i < ${#steps[@]} )); do
  step=${steps[$i]}
  if [[ $step =~ ^[0-9][0-9]$ ]]; then
    nbs=()
    while (( i < ${#steps[@]} )) && [[ ${steps[$i]} =~ ^[0-9][0-9]$ ]]; do
      nbs+=("${steps[$i]}"); i=$((i + 1))
    done
    run_notebooks "${nbs[@]}" || break
    continue
  fi
  i=$((i + 1))
  l=$(left)
  if (( l < 30 )); then echo "[gpu_run] no time left for $step"; break; fi
  echo "[gpu_run] $step: ${l}s left"
  case $step in
    bench) timeout -k 5 "$l" python3 benchmarks/harness_overhead.py --profile h200 --starts 3 --repeats 3 \
             --out "runs/$rid/bench/harness_overhead.json" 2>&1 | grep -v -E "^(\(|INFO|WARNING|DEBUG)" | tail -20 ;;
    served) timeout -k 5 "$l" python3 benchmarks/served_overhead.py --model ernie-4.5-0.3b-pt \
             --settings '{"max_model_len": 4096}' --blocks 6 --num-prompts 200 --input-len 512 \
             --output-len 128 --work-dir /tmp/so --out "runs/$rid/bench/served_overhead.json" \
             2>&1 | grep -v -E "^(\(|INFO|WARNING|DEBUG)" | tail -40 ;;
    served-c32) timeout -k 5 "$l" python3 benchmarks/served_overhead.py --model ernie-4.5-0.3b-pt \
             --settings '{"max_model_len": 4096}' --blocks 10 --num-prompts 200 --input-len 512 \
             --output-len 128 --max-concurrency 32 --work-dir /tmp/so32 \
             --out "runs/$rid/bench/served_overhead_c32.json" \
             2>&1 | grep -v -E "^(\(|INFO|WARNING|DEBUG)" | tail -40 ;;
    served-c32-nosampler) timeout -k 5 "$l" python3 benchmarks/served_overhead.py --model ernie-4.5-0.3b-pt \
             --settings '{"max_model_len": 4096}' --blocks 10 --num-prompts 200 --input-len 512 \
             --output-len 128 --max-concurrency 32 --metrics-interval-s 3600 --work-dir /tmp/so32n \
             --out "runs/$rid/bench/served_overhead_c32_nosampler.json" \
             2>&1 | grep -v -E "^(\(|INFO|WARNING|DEBUG)" | tail -40 ;;
    served-sampler) timeout -k 5 "$l" python3 benchmarks/served_overhead.py --model ernie-4.5-0.3b-pt \
             --settings '{"max_model_len": 4096}' --arms sampler --blocks 10 --num-prompts 200 \
             --input-len 512 --output-len 128 --max-concurrency 32 --work-dir /tmp/sos \
             --out "runs/$rid/bench/served_overhead_sampler.json" \
             2>&1 | grep -v -E "^(\(|INFO|WARNING|DEBUG)" | tail -40 ;;
    abba) timeout -k 5 "$l" python3 benchmarks/harness_overhead.py --profile h200 --abba 10 \
             --out "runs/$rid/bench/harness_abba.json" 2>&1 | grep -v -E "^(\(|INFO|WARNING|DEBUG)" | tail -12 ;;
    starts|starts-b) timeout -k 5 "$l" python3 benchmarks/start_cost.py --measure --model ernie-4.5-0.3b-pt \
             --starts 2 --work-dir "/tmp/$step" --out "runs/$rid/bench/${step/starts/start_cost}.json" \
             2>&1 | tail -30 ;;
    starts-mp) timeout -k 5 "$l" python3 benchmarks/start_cost.py --measure --arms mp \
             --model ernie-4.5-0.3b-pt --starts 4 --work-dir /tmp/starts-mp \
             --out "runs/$rid/bench/start_cost_mp.json" 2>&1 | tail -30 ;;
    starts-core) timeout -k 5 "$l" python3 benchmarks/start_cost.py --measure --arms mp --api-server fork \
             --model ernie-4.5-0.3b-pt --starts 4 --work-dir /tmp/starts-launcher \
             --settings '{"max_model_len": 4096}' --out "runs/$rid/bench/start_cost_core.json" 2>&1 | tail -30 ;;
    starts-launcher|starts-launcher-fork) timeout -k 5 "$l" python3 benchmarks/start_cost.py \
             --measure --arms launcher --model ernie-4.5-0.3b-pt --starts 4 --work-dir /tmp/starts-launcher \
             --settings '{"max_model_len": 4096}' \
             --engine-core "$([ "$step" = starts-launcher-fork ] && echo fork || echo spawn)" \
             --out "runs/$rid/bench/start_cost_${step#starts-}.json" 2>&1 | tail -30 ;;
    overload|overload-bench) d=runs/$rid/05_assemble_config/deployment  # issue 44: 05's written deployment, as written
      if [[ ! -f $d/start.sh ]]; then echo "[gpu_run] overload: 05 wrote no replica deployment in $d"; continue; fi
      # start.sh runs `vllm serve`; a node whose vLLM has no console script gets a shim for it
      if ! command -v vllm >/dev/null; then
        mkdir -p /tmp/vllm-shim && printf '#!/bin/sh\nexec python3 -m vllm.entrypoints.cli.main "$@"\n' \
          > /tmp/vllm-shim/vllm && chmod +x /tmp/vllm-shim/vllm && export PATH=/tmp/vllm-shim:$PATH
      fi
      client=tunebook; [[ $step = overload-bench ]] && client=vllm-bench
      mkdir -p "runs/$rid/$step"
      timeout -k 5 "$l" python3 -m tunebook.serve "$d" --check --overload --factor 2 --burst-s 20 \
             --window-s 60 --client "$client" ${OVERLOAD_RATE:+--rate "$OVERLOAD_RATE"} \
             --json "runs/$rid/$step/check.json" 2>&1 \
             | tee "runs/$rid/$step/check.log" | tail -30 ;;
    kv-exact) timeout -k 5 "$l" python3 scripts/engine_check.py --model ernie-4.5-0.3b-pt \
             --model qwen3-0.6b --model llama-3.2-1b --quick --no-timing --run-dir "runs/$rid/kv-exact" \
             2>&1 | grep -v -E "^(\(|INFO|WARNING|DEBUG)" | tail -30 ;;
    roofline) timeout -k 5 "$l" python3 benchmarks/roofline.py --profile h200 --out "runs/$rid/bench/roofline" \
             2>&1 | tail -20 ;;
    *) echo "[gpu_run] $step: no such step" ;;
  esac
done
mkdir -p "$keep" && rm -rf "${keep:?}/$rid" && cp -a "runs/$rid" "$keep/"
tar czf "$out/run.tgz" -C runs "$rid"
# Files that come back from a node may be size-capped: split a large archive (cat run.tgz.* to join).
if (( $(stat -c %s "$out/run.tgz") > 15000000 )); then
  split -b 15000000 -d -a 1 "$out/run.tgz" "$out/run.tgz." && rm "$out/run.tgz"
fi
echo "[gpu_run] packed runs/$rid in $(( $(date +%s) - start ))s"
# What the node's compile caches hold by now: what carrying them to a fresh node would move.
for v in VLLM_CACHE_ROOT TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR; do
  du -sh "${!v}" 2>/dev/null | sed 's/^/[gpu_run] cache /'
done
