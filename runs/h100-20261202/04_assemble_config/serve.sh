#!/usr/bin/env bash
# Assembled by tunebook 04_assemble_config for scenario high_concurrency_chat
# objective: max goodput_rps, then max request_throughput_rps, then max output_throughput_tok_s under the SLO
# SLO: ttft_ms <= 500, tpot_ms <= 50
# no measured setting beat vLLM's default beyond the noise: defaults kept
# evidence: choice.json beside this file
set -euo pipefail
exec vllm serve models/ernie-4.5-0.3b-pt \
  --load-format dummy \
  --skip-tokenizer-init \
  --served-model-name ernie-4.5-0.3b-pt "$@"
