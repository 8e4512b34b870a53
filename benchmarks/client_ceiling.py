"""How many streamed requests a second can tunebook's own load generator keep on schedule?

A served point is only a measurement of the server while the client keeps its Poisson schedule
(``tunebook.measure.loadgen.client_check``: send-lag p99 <= ``LAG_OK_MS``). The H200 runs offered up to
~1024 req/s x 128 streamed tokens a request; this benchmark asks whether the client itself could
go higher, and with how many worker processes.

Method: a stub OpenAI-compatible server (aiohttp, in processes of its own sharing one port through
SO_REUSEPORT) answers every streamed ``/v1/completions`` at once with ``max_tokens`` SSE chunks in
vLLM's format, one write per chunk, then the ``usage`` chunk and ``[DONE]``. No model runs: what is
measured is the client, so a server that costs nothing per token is the right counterpart. The
client is ``LoadGenerator`` called as ``served.Deployment.run`` calls it: the same request bodies
(``served.rate_workload`` of the H200 capacity searches' workload, 512 prompt token ids, 128 output
tokens, fresh prompts at every rate), ``api="completions"``, the point's default sampling. Each rate
runs for ``--duration-s`` of Poisson arrivals, for each worker count.

Per row: offered rate, achieved rate (completed requests over the span from the first send to the
last token), send-lag p50/p99, the busiest client worker's CPU share, the workers' CPU time per
request (its inverse is what one fully busy worker can send; unlike the CPU share it holds on a
machine shared with other work), the stub's CPU (all its processes, % of one core) and
``kept_schedule``.

    python benchmarks/client_ceiling.py --out runs/bench/client_ceiling.json
    python benchmarks/client_ceiling.py --rates 128 256 512 1024 --workers 1 2 --duration-s 2
    python benchmarks/client_ceiling.py --rates 256 512 1024 --workers 1 2 --duration-s 2 \
        --tokens-per-chunk 16

Measured 2026-12-03 on a 2-vCPU VM shared with other work (load average 3 to 8 during the runs:
the stub, the client and unrelated processes competed for two cores, so lag and achieved rate are
the machine's, not the client's; the CPU time per request is the figure to carry over):

    tokens/chunk  workers  offered  achieved  lag p50  lag p99  ms CPU/req  kept
               1        1      128       120     20.4     69.6        3.57    no
               1        1      256       125    283.0    838.8        3.42    no
               1        1     1024        99   1581.6   2831.7        3.65    no
               1        2      256        76    455.7    903.0        3.36    no
              16        1      256       263      1.2      8.5        1.06   yes
              16        1      512       511      2.9     27.2        0.74    no
              16        1     1024       435    551.3   1284.6        0.96    no
              16        2      256       262      1.1     10.4        1.39   yes

So a worker costs ~3.5 ms of CPU a request with one SSE chunk per token (~280 req/s per fully busy
worker on these cores) and ~1 ms with 16 tokens a chunk (~1000 req/s). The H200 deployment that
reached 1024 req/s streamed 16 tokens a chunk through 4 workers (256 req/s each): ~4x headroom
by this figure, on these cores; the busiest worker there used 16-22% of a core at 1024 req/s
(runs/h200-20261203), in line with ~1 ms a request. With one chunk per token, 1024 req/s would
need 4 workers fully busy on these cores: use more workers, and rerun this on the host itself.

The first runs of this benchmark found a client fault, fixed in ``loadgen``: the schedule's clock
started before the requests were handed to the workers (deep-copied by ``dataclasses.asdict``,
3.8 s for 4096 requests of 512 token ids), so long schedules started late at any rate. 128 req/s
x 16 s: lag p99 2522 ms (1 worker) and 7567 ms (4 workers) before, 87 and 265 ms after, on the
loaded VM.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

# The H200 capacity searches' workload (params/h200.yaml, 04_engine_overhead).
WORKLOAD = {"kind": "fixed", "prompt_len": 512, "output_len": 128, "seed": 31}
MODEL = "ernie-4.5-0.3b-pt"  # only its vocabulary size is read: prompts are token ids
ROW_KEYS = (
    "workers",
    "offered_rps",
    "requests",
    "achieved_rps",
    "output_tok_s",
    "lag_p50_ms",
    "lag_p99_ms",
    "client_cpu_busiest_pct",
    "client_cpu_ms_per_req",
    "stub_cpu_pct",
    "kept_schedule",
    "errors",
)


# --------------------------------------------------------------------------- the stub server
def _stub_main(port: int, tpot_ms: float, per_chunk: int) -> None:
    """One stub process: streamed /v1/completions in vLLM's SSE format, no model."""
    import asyncio

    from aiohttp import web

    def event(payload: dict) -> bytes:
        return b"data: " + json.dumps(payload).encode() + b"\n\n"

    head = {"id": "cmpl-stub", "object": "text_completion", "created": 0, "model": "tunebook"}
    chunk = event(
        {
            **head,
            "choices": [{"index": 0, "text": " tok", "logprobs": None, "finish_reason": None}],
            "usage": None,
        }
    )

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = int(body.get("max_tokens") or 1)
        chunks = -(-n // per_chunk)  # vLLM's stream_interval: one chunk per per_chunk tokens
        prompt = body.get("prompt")
        n_prompt = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(chunks):
            await resp.write(chunk)
            if tpot_ms > 0:
                await asyncio.sleep(tpot_ms / 1e3)
        usage = {"prompt_tokens": n_prompt, "completion_tokens": n, "total_tokens": n_prompt + n}
        await resp.write(event({**head, "choices": [], "usage": usage}) + b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="")

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        app.router.add_get("/health", health)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, reuse_port=True, backlog=4096).start()
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


class Stub:
    """``procs`` stub server processes on one port (the kernel spreads connections over them)."""

    def __init__(self, procs: int, tpot_ms: float = 0.0, per_chunk: int = 1):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, __file__, "--stub-server", str(self.port)]
        cmd += ["--tpot-ms", str(tpot_ms), "--tokens-per-chunk", str(per_chunk)]
        self.procs = [
            subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
            for _ in range(procs)
        ]
        for p in self.procs:
            if p.stdout.readline().strip() != "ready":
                self.close()
                raise RuntimeError(f"stub server {p.pid} failed to start (exit {p.poll()})")

    def cpu_s(self) -> float:
        import psutil

        total = 0.0
        for p in self.procs:
            t = psutil.Process(p.pid).cpu_times()
            total += t.user + t.system
        return total

    def close(self) -> None:
        from tunebook.engine.isolation import kill_group

        for p in self.procs:
            kill_group(p)


# --------------------------------------------------------------------------- one rate
def requests_at(rate: float, step: int, duration_s: float, vocab: int) -> list:
    """The client requests ``served.Deployment.run`` would send for this rate of a search."""
    from tunebook.measure.loadgen import ClientRequest
    from tunebook.measure.served import rate_workload

    search = {"duration_s": duration_s, "min_requests": 1, "max_requests": 10**7}
    wl = rate_workload(WORKLOAD, rate, step, search, vocab)
    out = []
    for i, r in enumerate(wl.requests):  # as Deployment.client_requests
        prompt = r.prompt_token_ids if r.prompt_token_ids is not None else r.prompt
        out.append(ClientRequest(i, prompt, r.max_tokens, r.arrival_s, r.prompt_len, r.tag))
    return out


def measure(client, stub: Stub, reqs: list, rate: float, workers: int) -> dict:
    from tunebook.core.points import sampling_kwargs
    from tunebook.measure.served import _span_s

    cpu0 = stub.cpu_s()
    t0 = time.perf_counter()
    recs, check = client.run(
        stub.url, "tunebook", reqs, api="completions", sampling=sampling_kwargs(None), timeout_s=120
    )
    wall = time.perf_counter() - t0
    stub_cpu = stub.cpu_s() - cpu0
    done = [r for r in recs if not r.get("error") and r.get("e2e_ms") is not None]
    span = _span_s(recs) or wall
    return {
        "workers": workers,
        "offered_rps": rate,
        "requests": len(reqs),
        "achieved_rps": len(done) / span,
        "output_tok_s": sum(r["output_tokens"] for r in done) / span,
        "lag_p50_ms": check["lag_p50_ms"],
        "lag_p99_ms": check["lag_p99_ms"],
        "client_cpu_busiest_pct": check["client_cpu_busiest_pct"],
        # CPU seconds the workers spent per request: its inverse is one busy worker's ceiling,
        # a figure that holds on a machine shared with other work, where the CPU share does not
        "client_cpu_ms_per_req": 1e3 * check["client_cpu_s"] / max(len(reqs), 1),
        # the stub's CPU over the client's whole call (its start-up lead included), % of one core
        "stub_cpu_pct": 100.0 * stub_cpu / wall,
        "kept_schedule": check["kept_schedule"],
        "errors": check["errors"],
        "span_s": span,
    }


def table(rows: list[dict]) -> str:
    lines = [
        f"{'workers':>7} {'offered':>8} {'achieved':>9} {'lag p50':>8} {'lag p99':>8}"
        f" {'client CPU':>11} {'ms CPU/req':>10} {'stub CPU':>9} {'kept':>5} {'errors':>6}"
    ]
    for r in rows:
        lines.append(
            f"{r['workers']:>7} {r['offered_rps']:>8.0f} {r['achieved_rps']:>9.0f}"
            f" {r['lag_p50_ms']:>8.1f} {r['lag_p99_ms']:>8.1f}"
            f" {r['client_cpu_busiest_pct']:>10.0f}% {r['client_cpu_ms_per_req']:>10.2f}"
            f" {r['stub_cpu_pct']:>8.0f}%"
            f" {'yes' if r['kept_schedule'] else 'no':>5} {r['errors']:>6}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rates", type=float, nargs="+", default=[256, 512, 1024, 2048, 4096])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--duration-s", type=float, default=4.0, help="Poisson arrivals per rate")
    ap.add_argument("--stub-procs", type=int, default=2, help="stub server processes")
    ap.add_argument("--tpot-ms", type=float, default=0.0, help="stub's pause between chunks")
    ap.add_argument(
        "--tokens-per-chunk",
        type=int,
        default=1,
        help="tokens in one SSE chunk, as vllm serve's --stream-interval (the H200 deployment"
        " measured up to 1024 req/s used 16)",
    )
    ap.add_argument("--out", default="runs/bench/client_ceiling.json")
    ap.add_argument("--stub-server", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.stub_server is not None:
        _stub_main(args.stub_server, args.tpot_ms, args.tokens_per_chunk)
        return 0

    import aiohttp

    from tunebook.core.model import load_shape
    from tunebook.measure.loadgen import LAG_OK_MS, LoadGenerator

    vocab = load_shape(MODEL).vocab_size
    stub = Stub(args.stub_procs, args.tpot_ms, args.tokens_per_chunk)
    rows = []
    try:
        for workers in args.workers:
            with LoadGenerator(workers) as client:
                for step, rate in enumerate(args.rates):
                    reqs = requests_at(rate, step, args.duration_s, vocab)
                    rows.append(measure(client, stub, reqs, rate, workers))
                    print(table(rows[-1:]).splitlines()[-1], flush=True)
    finally:
        stub.close()
    print()
    print(table(rows))
    out = {
        "benchmark": "client_ceiling",
        "lag_ok_ms": LAG_OK_MS,
        "config": {
            "rates": args.rates,
            "workers": args.workers,
            "duration_s": args.duration_s,
            "stub_procs": args.stub_procs,
            "tpot_ms": args.tpot_ms,
            "tokens_per_chunk": args.tokens_per_chunk,
            "workload": WORKLOAD,
        },
        "machine": {
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "aiohttp": aiohttp.__version__,
            "host": platform.node(),
        },
        "rows": rows,
    }
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
