"""The load generator of served mode: streamed OpenAI requests at their scheduled arrival times.

A user of ``vllm serve`` sends HTTP requests and reads server-sent events; so does this client.
Every request is sent at its Poisson arrival offset, streamed (``/v1/completions`` or
``/v1/chat/completions``), and timed on the client side as vLLM's own ``vllm bench serve`` times
it: TTFT from send to the first content chunk, ITL between chunks, TPOT = (last - first) /
(output tokens - 1), E2E from send to the last chunk. Output tokens come from the final ``usage``
(one chunk may carry several tokens with ``stream_interval`` > 1).

One Python process parses only so many SSE chunks per second, so the schedule is split round robin
over ``workers`` processes. Each measurement says whether the client kept its schedule: the lag
of every send behind its scheduled time, and each worker's CPU use. A load generator that falls
behind measures itself, not the server.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass

from tunebook.core.metrics import meets_slo, percentile
from tunebook.engine.vllm_http import DONE, sse_data

LEAD_S = 0.5  # workers start their clocks together this long after the schedule is handed out
LAG_OK_MS = 20.0  # a p99 send lag above this means the client, not the server, set the pace
KEEPALIVE_S = 4.0  # below the server keep-alive: vLLM default 5 s, 60 s where tunebook starts it


@dataclass
class ClientRequest:
    """One request as the client sends it. ``prompt`` is a list of token ids or a text."""

    index: int
    prompt: list | str
    max_tokens: int
    arrival_s: float
    prompt_len: int = -1
    tag: str = ""


def request_body(req: ClientRequest, model: str, api: str, sampling: dict) -> dict:
    """The OpenAI-compatible JSON body of one streamed request."""
    body = {
        "model": model,
        "max_tokens": req.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        **{k: v for k, v in sampling.items() if k != "max_tokens"},
    }
    if api == "chat":
        text = req.prompt if isinstance(req.prompt, str) else " ".join(map(str, req.prompt))
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = req.prompt
    return body


def _has_content(ev: dict) -> bool:
    for ch in ev.get("choices") or []:
        if ch.get("text") is not None or (ch.get("delta") or {}).get("content") is not None:
            return True
        if (ch.get("delta") or {}).get("reasoning_content") is not None:
            return True
    return False


def record_from_stamps(
    req: ClientRequest, sent: float, stamps: list[float], usage: dict | None, lag_s: float
) -> dict:
    """A request record (the fields tunebook.core.metrics.summarize reads) from chunk arrival times."""
    n_out = int((usage or {}).get("completion_tokens") or len(stamps))
    rec = {
        "request_id": str(req.index),
        "tag": req.tag,
        "prompt_tokens": int((usage or {}).get("prompt_tokens") or max(req.prompt_len, 0)),
        "output_tokens": n_out if stamps else 0,
        "lag_ms": 1e3 * lag_s,
        "chunks": len(stamps),
    }
    if stamps:
        rec["ttft_ms"] = 1e3 * (stamps[0] - sent)
        rec["e2e_ms"] = 1e3 * (stamps[-1] - sent)
        rec["itl_ms"] = [1e3 * (b - a) for a, b in zip(stamps, stamps[1:], strict=False)]
        rec["tpot_ms"] = 1e3 * (stamps[-1] - stamps[0]) / (n_out - 1) if n_out > 1 else None
    return rec


def _stopped(req: ClientRequest) -> dict:
    """The record of a request not sent, or cancelled in flight, once the outcome was decided."""
    return {
        "request_id": str(req.index),
        "tag": req.tag,
        "prompt_tokens": max(req.prompt_len, 0),
        "output_tokens": 0,
        "chunks": 0,
        "stopped": True,
        "due_s": req.arrival_s,
    }


class _EarlyStop:
    """The ``stop`` rule of ``_send_all``: counts the finished requests that broke the SLO, and
    once more than ``max_bad`` did, sets ``decided`` and cancels the other ``tasks``."""

    def __init__(self, stop: dict | None):
        self.stop = stop
        self.decided = asyncio.Event()
        self.bad = 0
        self.tasks: list[asyncio.Task] = []

    def judge(self, rec: dict) -> None:
        """Count ``rec`` if it broke the SLO; the count past ``max_bad`` decides the outcome."""
        stop = self.stop
        if stop is None or self.decided.is_set() or meets_slo(rec, stop["slo"]):
            return
        self.bad += 1
        if self.bad > stop["max_bad"]:
            self.decided.set()
            me = asyncio.current_task()
            for t in self.tasks:
                if t is not me and not t.done():
                    t.cancel()


# Long: one asyncio loop that sends on schedule, bounds concurrency and stops early; its state
# (the semaphore, the stop flag, the tasks) is shared by all of it.
async def _send_all(
    url: str,
    model: str,
    api: str,
    sampling: dict,
    reqs: list[ClientRequest],
    start_wall: float,
    timeout_s: float,
    max_concurrency: int | None = None,
    stop: dict | None = None,
) -> list[dict]:
    """Send ``reqs`` on their schedule; one record per request, in request order.

    ``stop`` = ``{"slo": {...}, "max_bad": k}``: once more than ``k`` finished requests broke
    ``slo``, the outcome is decided (the SLO cannot hold), so requests not yet sent are not
    sent and those in flight are cancelled (vLLM aborts a request whose client hung up). Their
    records carry ``"stopped": True`` and no timings.
    """
    import aiohttp

    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
    # The schedule is in wall-clock time shared by all workers; waits use the monotonic clock.
    t0 = time.perf_counter() + (start_wall - time.time())
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    # An idle connection is reused for at most 4 s: vLLM's server closes one after 5 s
    # (VLLM_HTTP_TIMEOUT_KEEP_ALIVE), and a client that sends on it as it closes gets an error
    # for a request the server never saw (a starved client wakes up to a pool of such; servers
    # tunebook starts keep them 60 s for that reason, flags.server_env).
    conn = aiohttp.TCPConnector(limit=0, force_close=False, keepalive_timeout=KEEPALIVE_S)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=conn, trace_configs=[_connect_trace()]
    ) as session:
        # As `vllm bench serve --max-concurrency`: a request waits for a free slot, then is sent.
        slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        early_stop = _EarlyStop(stop)
        decided = early_stop.decided

        async def one(req: ClientRequest) -> dict:
            try:
                due = t0 + req.arrival_s
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                if slots is None:
                    return _stopped(req) if decided.is_set() else await send(req, due)
                async with slots:  # the lag counts from when the slot freed, not the schedule
                    if decided.is_set():
                        return _stopped(req)
                    return await send(req, max(due, time.perf_counter()))
            except asyncio.CancelledError:  # cancelled by _EarlyStop: the outcome was decided
                return _stopped(req)

        async def send(req: ClientRequest, due: float) -> dict:
            sent = time.perf_counter()
            stamps: list[float] = []
            usage = None
            refused: dict = {}
            trace: dict = {}  # connect_ms where this request opened a connection of its own
            try:
                body = request_body(req, model, api, sampling)
                async with session.post(url + path, json=body, trace_request_ctx=trace) as resp:
                    if resp.status != 200:
                        # A refusal's status, how fast it came and when to retry: what an
                        # overload check reads (429/503 with Retry-After is a refusal to retry).
                        refused = {
                            "status": resp.status,
                            "error_ms": 1e3 * (time.perf_counter() - sent),
                            "retry_after": resp.headers.get("Retry-After"),
                        }
                        text = (await resp.text())[:300]
                        raise RuntimeError(f"HTTP {resp.status}: {text}")
                    async for line in resp.content:
                        ev = sse_data(line)
                        if ev is None or ev is DONE:
                            continue
                        if ev.get("usage"):
                            usage = ev["usage"]
                        if _has_content(ev):
                            stamps.append(time.perf_counter())
                rec = record_from_stamps(req, sent, stamps, usage, sent - due)
            except Exception as e:  # noqa: BLE001 - every failure is this request's record
                rec = record_from_stamps(req, sent, stamps, usage, sent - due)
                rec["error"] = f"{type(e).__name__}: {e}"[:300]
                rec.update(refused)
            rec["sent_s"] = sent - t0  # on the schedule's clock, shared by all workers
            # When it was due: what was offered, whether or not the client sent it on time (the
            # sustained rule counts arrivals by it, so a late client cannot make a rate look held).
            rec["due_s"] = req.arrival_s
            if "connect_ms" in trace:
                rec["connect_ms"] = trace["connect_ms"]
            early_stop.judge(rec)
            return rec

        early_stop.tasks.extend(asyncio.ensure_future(one(r)) for r in reqs)
        return list(await asyncio.gather(*early_stop.tasks))


def _connect_trace():
    """aiohttp tracing that times each new connection (TCP connect, through the server's accept)
    into the request's ``trace_request_ctx``: part of that request's TTFT. A listen backlog that
    overflows shows here as ~1 s and more (the client's SYN sent again), not in the server's
    own metrics."""
    import aiohttp

    async def start(session, ctx, params):
        ctx.trace_request_ctx["_t0"] = time.perf_counter()

    async def end(session, ctx, params):
        t0 = ctx.trace_request_ctx.pop("_t0", None)
        if t0 is not None:
            ctx.trace_request_ctx["connect_ms"] = 1e3 * (time.perf_counter() - t0)

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_start.append(start)
    trace.on_connection_create_end.append(end)
    return trace


def _worker(args: tuple) -> tuple[list[dict], dict]:
    """One client's share: send it on the schedule; return records and the client's own costs."""
    url, model, api, sampling, reqs, start_wall, timeout_s, cap, stop = args
    cpu0, wall0 = time.process_time(), time.perf_counter()
    records = asyncio.run(
        _send_all(url, model, api, sampling, reqs, start_wall, timeout_s, cap, stop)
    )
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    return records, {"pid": os.getpid(), "cpu_s": cpu, "wall_s": wall, "requests": len(reqs)}


def _serve_jobs() -> None:
    """A worker process: per job, a JSON job line, then a start line once every worker has parsed
    its job (``{"start_wall": ...}``); one JSON answer per job on stdout."""
    import aiohttp  # noqa: F401 - imported before "ready", so no schedule waits on the import

    sys.stdout.write(json.dumps({"ready": os.getpid()}) + "\n")
    sys.stdout.flush()
    while line := sys.stdin.readline():
        job = json.loads(line)
        reqs = [ClientRequest(**r) for r in job["requests"]]
        sys.stdout.write(json.dumps({"parsed": len(reqs)}) + "\n")
        sys.stdout.flush()
        job.update(json.loads(sys.stdin.readline()))
        try:
            records, costs = _worker(
                (
                    job["url"],
                    job["model"],
                    job["api"],
                    job["sampling"],
                    reqs,
                    job["start_wall"],
                    job["timeout_s"],
                    job.get("max_concurrency"),
                    job.get("stop"),
                )
            )
            answer = {"records": records, "costs": costs}
        except Exception as e:  # noqa: BLE001 - reported to the parent, which raises it
            answer = {"error": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


class LoadGenerator:
    """Client processes kept for the life of one deployment (all its rates).

    Workers are plain ``python -m tunebook.measure.loadgen`` processes fed over pipes, not
    multiprocessing children: those re-import the caller's ``__main__`` (a script without a
    main guard would start a second deployment), and the sweep's process may hold an engine's
    threads, which fork must not copy.
    """

    def __init__(self, workers: int = 1):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers
        self._procs = [
            subprocess.Popen(
                [sys.executable, "-m", "tunebook.measure.loadgen"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                bufsize=1,
            )
            for _ in range(workers)
        ]
        for p in self._procs:  # a schedule must not start before its workers can send
            if not p.stdout.readline():
                raise RuntimeError(f"load-generator worker {p.pid} failed to start")

    def run(
        self,
        url: str,
        model: str,
        requests: list[ClientRequest],
        api: str = "completions",
        sampling: dict | None = None,
        timeout_s: float = 600.0,
        max_concurrency: int | None = None,
        stop: dict | None = None,
    ) -> tuple[list[dict], dict]:
        """Send ``requests`` on their schedule; return (records in request order, client check).

        ``max_concurrency`` caps the requests in flight (split evenly over the workers).
        ``stop`` (``{"slo", "max_bad"}``, see ``_send_all``) ends the run once more than
        ``max_bad`` requests broke the SLO; each worker counts its own share's, so with several
        workers the run ends later than it could, never earlier."""
        shares = [requests[i :: self.workers] for i in range(self.workers)]
        n_busy = sum(1 for s in shares if s)
        cap = math.ceil(max_concurrency / n_busy) if max_concurrency and n_busy else None
        busy = []
        for proc, share in zip(self._procs, shares, strict=True):
            if not share:
                continue
            job = {
                "url": url,
                "model": model,
                "api": api,
                "sampling": dict(sampling or {}),
                # vars, not dataclasses.asdict: asdict deep-copies every prompt's token ids (~1 ms
                # a 512-token request), seconds for a few thousand requests.
                "requests": [vars(r) for r in share],
                "timeout_s": timeout_s,
                "max_concurrency": cap,
                "stop": stop,
            }
            proc.stdin.write(json.dumps(job) + "\n")
            proc.stdin.flush()
            busy.append(proc)
        # The clock starts once every worker holds its parsed share: handing out thousands of
        # prompts takes longer than LEAD_S, and a schedule that starts during the handout sends
        # its first requests late (the client's lag, not the server's).
        for proc in busy:
            if not proc.stdout.readline():
                raise RuntimeError(f"load-generator worker {proc.pid} died (exit {proc.poll()})")
        start_wall = time.time() + LEAD_S + 0.05 * self.workers
        start = json.dumps({"start_wall": start_wall}) + "\n"
        for proc in busy:
            proc.stdin.write(start)
            proc.stdin.flush()
        records, costs, errors = [], [], []
        for proc in busy:  # every answer is read, so the pipes stay in step for the next run
            line = proc.stdout.readline()
            if not line:
                errors.append(f"load-generator worker {proc.pid} died (exit {proc.poll()})")
                continue
            answer = json.loads(line)
            if "error" in answer:
                errors.append(f"load-generator worker failed: {answer['error']}")
                continue
            records += answer["records"]
            costs.append(answer["costs"])
        if errors:
            raise RuntimeError("; ".join(errors))
        records.sort(key=lambda r: int(r["request_id"]))
        # start_wall: the schedule's 0 on the wall clock (records' sent_s count from it)
        return records, {**client_check(records, costs, self.workers), "start_wall": start_wall}

    def close(self) -> None:
        for p in self._procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)
        self._procs = []

    def __enter__(self) -> LoadGenerator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def client_check(records: list[dict], workers: list[dict], n_workers: int) -> dict:
    """Did the client keep its schedule? Send-lag percentiles and the busiest worker's CPU share."""

    lags = [r["lag_ms"] for r in records if "lag_ms" in r]
    connects = [r["connect_ms"] for r in records if "connect_ms" in r]
    busiest = max((w["cpu_s"] / w["wall_s"] for w in workers if w["wall_s"] > 0), default=0.0)
    p99 = percentile(lags, 99)
    return {
        "client": "tunebook.measure.loadgen (aiohttp, streamed)",
        "client_workers": n_workers,
        "lag_p50_ms": percentile(lags, 50),
        "lag_p99_ms": p99,
        "lag_max_ms": max(lags, default=float("nan")),
        "client_cpu_busiest_pct": 100.0 * busiest,
        "client_cpu_s": sum(w["cpu_s"] for w in workers),
        "kept_schedule": bool(lags) and not math.isnan(p99) and p99 <= LAG_OK_MS,
        # connections opened, and how long the slowest took (in those requests' TTFT)
        "new_connections": len(connects),
        "connect_p99_ms": percentile(connects, 99),
        "connect_max_ms": max(connects, default=float("nan")),
        "errors": sum(1 for r in records if r.get("error")),
    }


if __name__ == "__main__":
    _serve_jobs()
