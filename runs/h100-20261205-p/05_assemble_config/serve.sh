#!/usr/bin/env bash
# Assembled by tunebook 05_assemble_config for scenario high_concurrency_chat
# objective: max goodput_rps, then max request_throughput_rps, then max output_throughput_tok_s under the SLO
# SLO: ttft_ms <= 500, tpot_ms <= 50
# no measured setting beat vLLM's default beyond the noise: defaults kept
# evidence: choice.json beside this file
# listens on all interfaces: --host 127.0.0.1 keeps it on this machine; --api-key <key> guards /v1
# runs the vllm command on PATH (tunebook's install: .venv/bin)
# flags given to this script are added: bash serve.sh --port 8001
set -euo pipefail
exec vllm serve models/ernie-4.5-0.3b-pt \
  --load-format dummy \
  --served-model-name ernie-4.5-0.3b-pt "$@"
