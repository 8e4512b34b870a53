"""vLLM's HTTP protocol, in one place: its Prometheus series, their parsing, server-sent events,
and the ports a server listens on.

Pure Python. Every room that talks to a running ``vllm serve`` (served mode's sampler and load
generator, ``serve --check``, the chat panel) reads the same names and parses the same way here.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.parse
import urllib.request

# --------------------------------------------------------------------------- metric names
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"  # a fraction despite the name: 1 means full
PREEMPTIONS = "vllm:num_preemptions"
PREFIX_HITS = "vllm:prefix_cache_hits"
PREFIX_QUERIES = "vllm:prefix_cache_queries"
PROMPT_TOKENS = "vllm:prompt_tokens"
GEN_TOKENS = "vllm:generation_tokens"
REQUESTS_DONE = "vllm:request_success"
E2E = "vllm:e2e_request_latency_seconds"

# Counters whose change over a run is reported (vLLM's name -> ours), and the gauges sampled.
COUNTERS = {
    PREEMPTIONS: "num_preemptions",
    PREFIX_HITS: "prefix_cache_hits",
    PREFIX_QUERIES: "prefix_cache_queries",
    PROMPT_TOKENS: "engine_prompt_tokens",
    GEN_TOKENS: "engine_generation_tokens",
}
GAUGES = (KV_USAGE, RUNNING, WAITING)
# The API-server process's own CPU seconds (prometheus_client's process collector: not the engine
# core's, a process of its own; absent where several API servers share a multiprocess registry).
PROCESS_CPU = "process_cpu_seconds"
# Only those series, rendered by the server: vLLM mounts prometheus_client's own app under
# /metrics/ (its plain /metrics renders every histogram, milliseconds of the API server's loop
# per sample), and that app answers ``name[]`` (sample names: a counter's carries ``_total``).
METRICS_SUBSET = "/metrics/?" + urllib.parse.urlencode(
    [("name[]", f"{k}_total") for k in (*COUNTERS, PROCESS_CPU)] + [("name[]", g) for g in GAUGES]
)

# --------------------------------------------------------------------------- Prometheus text
Sample = tuple[str, dict[str, str], float]  # (name, labels, value)


def parse_totals(text: str) -> dict[str, float]:
    """Each series of a Prometheus text exposition summed over its label sets (the sampler's
    fast path, four times a second). A counter's ``_total`` suffix is dropped, so that names
    match vLLM's."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, value = line.rpartition(" ")
        name = name_part.split("{", 1)[0].strip()
        try:
            v = float(value)
        except ValueError:
            continue
        if name.endswith("_total"):
            name = name[: -len("_total")]
        out[name] = out.get(name, 0.0) + v
    return out


def parse_samples(text: str) -> list[Sample]:
    """Every sample with its labels (the chat panel reads histograms by bucket). Comments and
    lines that do not parse are skipped: a partial page must not stop a reader."""
    out: list[Sample] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            name, labels, rest = _split_sample(line)
            out.append((name, labels, float(rest.split()[0])))
        except (ValueError, IndexError):
            continue
    return out


_ESCAPES = {"n": "\n", "\\": "\\", '"': '"'}


def _split_sample(line: str) -> tuple[str, dict[str, str], str]:
    brace, space = line.find("{"), line.find(" ")
    if brace == -1 or (space != -1 and space < brace):
        name, rest = line.split(None, 1)
        return name, {}, rest
    labels: dict[str, str] = {}
    i = brace + 1
    while True:
        while line[i] in " ,":
            i += 1
        if line[i] == "}":
            return line[:brace], labels, line[i + 1 :]
        eq = line.index("=", i)
        if line[eq + 1] != '"':
            raise ValueError(line)
        j, val = eq + 2, []
        while line[j] != '"':  # label values may hold spaces, commas, braces and escapes
            if line[j] == "\\":
                val.append(_ESCAPES.get(line[j + 1], line[j + 1]))
                j += 2
            else:
                val.append(line[j])
                j += 1
        labels[line[i:eq].strip()] = "".join(val)
        i = j + 1


# --------------------------------------------------------------------------- server-sent events
DONE = object()  # the stream's ``data: [DONE]``


def sse_data(line: bytes | str):
    """One server-sent-events line: the JSON payload of a ``data:`` line, ``DONE``, or None for
    anything else (keep-alives, blank lines). A payload that is not JSON raises ValueError."""
    # Bytes stay bytes (the load generator's hot path: json.loads reads them as they are).
    data, done = (b"data:", b"[DONE]") if isinstance(line, bytes) else ("data:", "[DONE]")
    line = line.strip()
    if not line.startswith(data):
        return None
    payload = line[5:].strip()
    if not payload:
        return None
    if payload == done:
        return DONE
    return json.loads(payload)


# --------------------------------------------------------------------------- ports and GETs
def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_port_run(
    n: int, offsets: tuple[int, ...] = (), avoid: tuple[int, ...] = (), host: str = "127.0.0.1"
) -> int:
    """A port p with p .. p+n-1 and each p+offset free now: for a start script that binds
    consecutive ports from one it is given (replica i on BASE_PORT+i; the router's metrics on
    PORT+1000), none of them in ``avoid`` (ports chosen but not bound yet). ``free_port`` alone
    vouches only for p: a replica once failed on p+1 with "Address already in use" and the
    router sent it requests (500)."""
    for _ in range(100):
        p = free_port(host)
        wanted = [p + i for i in range(1, n)] + [p + o for o in offsets]
        if p not in avoid and all(
            q <= 65535 and q not in avoid and port_free(q, host) for q in wanted
        ):
            return p
    raise RuntimeError(f"no run of {n} free ports (and +{offsets}) on {host} in 100 tries")


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``port`` can be bound on ``host`` now."""
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """(status, body) of a GET; an HTTP error's status with an empty body."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, ""
