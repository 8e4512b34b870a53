#!/usr/bin/env bash
# Assembled by tunebook 05_assemble_config for scenario high_concurrency_chat
# objective: max goodput_rps, then max request_throughput_rps, then max output_throughput_tok_s under the SLO
# SLO: ttft_ms <= 500, tpot_ms <= 50, itl_ms <= 1000
# no measured setting beat vLLM's default beyond the noise: defaults kept
# evidence: choice.json beside this file
# listens on all interfaces: --host 127.0.0.1 keeps it on this machine; --api-key <key> guards /v1
# runs the vllm command on PATH (tunebook's install: .venv/bin)
# flags given to this script are added: bash serve.sh --port 8001
# the model: $MODEL if set, else models/qwen3-0.6b, or models/qwen3-0.6b looked for from this folder upwards (MODEL=<checkpoint folder> bash serve.sh)
# the model is vllm serve's positional argument, which wins over a config file's model:
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)  # the folder of this script
# The model: $MODEL if set, else the folder measured; a relative one is looked for in this
# script's folder and each folder above it (a run folder kept inside a checkout finds its models/).
if [ -z "${MODEL:-}" ]; then
  for want in models/qwen3-0.6b models/qwen3-0.6b; do
    case "$want" in
      /*) if [ -f "$want/config.json" ]; then MODEL=$want; fi ;;
      *) d=$HERE
         while [ -z "${MODEL:-}" ]; do
           if [ -f "$d/$want/config.json" ]; then MODEL=$d/$want; fi
           if [ "$d" = / ]; then break; fi
           d=$(dirname "$d")
         done ;;
    esac
    if [ -n "${MODEL:-}" ]; then break; fi
  done
fi
if [ -z "${MODEL:-}" ]; then
  echo "$(basename "$0"): no model folder models/qwen3-0.6b or models/qwen3-0.6b (in $HERE or a folder above it) holds a config.json; set MODEL=<checkpoint folder>" >&2
  exit 2
fi
[ "$MODEL" = models/qwen3-0.6b ] || exec vllm serve "$MODEL" --load-format dummy --served-model-name qwen3-0.6b "$@"
exec vllm serve models/qwen3-0.6b \
  --load-format dummy \
  --served-model-name qwen3-0.6b "$@"
