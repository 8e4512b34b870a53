"""`make lab` (scripts/lab.sh) starts JupyterLab on notebooks/ as root and as a user, with the
`tunebook (.venv)` kernel listed and named in every notebook's metadata (so it is preselected).

The script runs as `make lab` runs it, with this test's virtualenv (TUNEBOOK_VENV) and its own
port, token and Jupyter folders; the server is stopped with its process group.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tunebook.engine.vllm_http import free_port

REPO = Path(__file__).resolve().parents[2]
START_S = 120  # a shared two-core machine has taken 40 s to bring JupyterLab up


def _get(url: str, token: str) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, r.read()


USERS = ["invoker", "nobody"]
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.mark.slow
@pytest.mark.parametrize("user", USERS)
def test_lab_starts_and_offers_the_tunebook_kernel(user):
    as_root = hasattr(os, "geteuid") and os.geteuid() == 0
    if user == "nobody" and not as_root:
        pytest.skip("starting the server as another user needs root")
    jupyter = Path(sys.prefix) / "bin" / "jupyter"
    if (
        user == "nobody"
        and subprocess.run(
            [*AS_NOBODY, "bash", "-c", f"{jupyter} --version"], capture_output=True
        ).returncode
    ):
        pytest.skip(f"{jupyter} cannot be run by another user here (its Python is private)")
    home = Path(tempfile.mkdtemp(prefix="tunebook-lab-"))
    home.chmod(0o777)  # the other user writes its Jupyter folders here
    port, token = free_port(), secrets.token_hex(16)
    env = {
        **os.environ,
        "HOME": str(home),
        "TUNEBOOK_VENV": sys.prefix,
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
        "IPYTHONDIR": str(home / "ipython"),
    }
    cmd = [
        "bash",
        str(REPO / "scripts" / "lab.sh"),
        "--no-browser",
        f"--port={port}",
        "--ServerApp.ip=127.0.0.1",
        f"--IdentityProvider.token={token}",
        "--ServerApp.port_retries=0",
    ]
    if user == "nobody":
        cmd = [*AS_NOBODY, *cmd]
    log = open(home / "lab.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=home
    )
    base = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + START_S
        while True:
            assert proc.poll() is None, (home / "lab.log").read_text()[-3000:]
            try:
                _get(f"{base}/api/status", token)
                break
            except (urllib.error.URLError, OSError):
                assert time.monotonic() < end, (home / "lab.log").read_text()[-3000:]
                time.sleep(0.5)
        status, page = _get(f"{base}/lab?token={token}", token)
        assert status == 200 and b"JupyterLab" in page
        specs = json.loads(_get(f"{base}/api/kernelspecs", token)[1])["kernelspecs"]
        assert "tunebook" in specs, sorted(specs)
        assert specs["tunebook"]["spec"]["display_name"] == "tunebook (.venv)"
        # The server's root is notebooks/, and each notebook names the tunebook kernel.
        listing = json.loads(_get(f"{base}/api/contents", token)[1])["content"]
        names = sorted(c["name"] for c in listing if c["name"].endswith(".ipynb"))
        assert names and names == sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))
        for name in names:
            nb = json.loads(_get(f"{base}/api/contents/{name}", token)[1])["content"]
            assert nb["metadata"]["kernelspec"]["name"] == "tunebook", name
        if user == "invoker" and as_root:
            assert "--allow-root" in " ".join(_cmdlines(proc.pid))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # its own session: the server and its children
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        log.close()
        shutil.rmtree(home, ignore_errors=True)


def _cmdlines(pid: int) -> list[str]:
    import psutil

    p = psutil.Process(pid)
    return [" ".join(c.cmdline()) for c in [p, *p.children(recursive=True)]]
