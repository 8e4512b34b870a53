#!/usr/bin/env bash
# JupyterLab on notebooks/ with the tunebook (.venv) kernel, as a user or as root.
#   bash scripts/lab.sh [jupyter lab options]      e.g. --ip 0.0.0.0 --port 8890 --no-browser
# As root (containers, GPU nodes) Jupyter refuses to start without --allow-root: it is added.
# The notebooks name the kernel `tunebook` (scripts/setup.sh registers it in the virtualenv); a
# virtualenv made another way gets it registered here first.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${TUNEBOOK_VENV:-.venv}
if ! "$venv/bin/jupyter" kernelspec list --json | "$venv/bin/python" -c \
    'import json, sys; sys.exit("tunebook" not in json.load(sys.stdin)["kernelspecs"])'; then
  "$venv/bin/python" -m ipykernel install --sys-prefix --name tunebook \
    --display-name "tunebook (.venv)" >/dev/null
fi
args=(--ServerApp.root_dir=notebooks)
if [[ $(id -u) == 0 ]]; then args+=(--allow-root); fi
exec "$venv/bin/jupyter" lab "${args[@]}" "$@"
