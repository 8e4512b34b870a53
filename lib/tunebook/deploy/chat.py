"""Chat with a deployment: a Chainlit front end over vLLM's OpenAI-compatible API, with the
server's own live state (its Prometheus ``/metrics``) in a side panel.

    python -m tunebook.chat runs/<run-id>/05_assemble_config/      # start the deployment, then chat
    python -m tunebook.chat --url http://host:8000/v1               # a running server or router

With an assembled folder (or its serve.yaml) it reuses a server of that deployment already
answering on serve.yaml's port (vLLM's default 8000 when the YAML names none), else starts one
with ``vllm serve --config serve.yaml`` as ``tunebook.deploy.serve`` does and stops it on exit
(on another port, said in one line, when that one is taken). Then it runs the Chainlit app
(``tunebook/chat_app.py``). Ctrl-C or SIGTERM at any moment stops it, and everything it started
(each in its own process group): a process is recorded for the stop as it is started, before
any wait (``TUNEBOOK_SIGNAL_AT=<phase>`` interrupts at one of ``START_PHASES``, for tests).

Replies stream from ``/v1/chat/completions`` (``stream=true``) token by token, capped at
``--max-tokens`` (512 by default; 0: the server's own limit, what is left of the context; the
page's settings change it per chat), and shown as text: the model's Markdown is escaped
(``Escaper``), so its ``~~`` or ``#`` are characters, not formatting. Each reply ends with its
time to first token, token count and decode rate. A model without weights in its folder (vLLM's
``load_format: dummy``) answers random text by design: the page says so in a banner. The panel refreshes every ``--refresh``
seconds: running and waiting requests, KV-cache use, prefix-cache hit rate (the article's
section 6.2 monitor, read from vLLM itself), plus finished requests per second, mean latency and
generated tokens per second over the last ``--window`` seconds. A router's own /metrics has no
``vllm:`` series: name each replica's with ``--metrics`` (repeatable) and the panel adds them up.

This module has no Chainlit import (importing chainlit writes its config into the working
directory); the pure parts (Prometheus text, reply statistics, error wording) are tested alone.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tunebook.deploy import serve
from tunebook.engine import flags
from tunebook.engine.interrupt import SIGNAL_AT_ENV
from tunebook.engine.vllm_http import (
    DONE,
    E2E,
    GEN_TOKENS,
    KV_USAGE,
    PREFIX_HITS,
    PREFIX_QUERIES,
    REQUESTS_DONE,
    RUNNING,
    WAITING,
    Sample,
    free_port,
    parse_samples,
    sse_data,
)

ENV_PREFIX = "TUNEBOOK_CHAT_"
APP_FILE = Path(__file__).with_name("chat_app.py")
PANEL_JSX = Path(__file__).with_name("chat_panel.jsx")
PANEL_NAME = "ServerState"  # Chainlit loads public/elements/<name>.jsx for a CustomElement
INSTALL_HINT = (
    "the chat extra is not installed: `pip install -e '.[chat]'` then "
    "`pip install --no-deps chainlit==2.12.0` (scripts/setup.sh does both)"
)
# A reply's cap when none is given: a tiny model's reply otherwise runs to what is left of the
# context (1,697 tokens, 6.8 s, on the CPU profile); 0 on the command line lifts it.
DEFAULT_MAX_TOKENS = 512
DUMMY_NOTICE = (
    "This model runs with dummy weights (no *.safetensors or *.bin in its folder: vLLM's"
    " load_format dummy): its replies are random text by design. The server, the streaming and"
    " this panel are real."
)
# The article's three benchmark prompts (its section 3.2), offered as starters.
ARTICLE_PROMPTS = (
    "请用中文介绍一下人工智能的发展历史。",
    "写一篇关于环境保护的短文，300字左右。",
    "解释一下什么是机器学习，用简单的语言说明。",
)


# --------------------------------------------------------------------------- configuration
@dataclass
class ChatConfig:
    """What the app needs; the command hands it to the Chainlit process through the environment."""

    url: str  # OpenAI-compatible base, ending in /v1
    metrics: list[str] = field(default_factory=list)  # Prometheus endpoints shown in the panel
    model: str | None = None  # None: the first of /v1/models
    max_tokens: int | None = DEFAULT_MAX_TOKENS  # None: the server's (what is left of the context)
    temperature: float = 0.7  # the article's sampling (section 6)
    top_p: float = 0.9
    refresh_s: float = 2.0
    window_s: float = 30.0
    timeout_s: float = 300.0  # longest wait for the next chunk of a reply
    label: str = ""  # what is being served, for the panel
    dummy_weights: bool = False  # the model has no weights: its text is noise (a banner says so)

    def __post_init__(self) -> None:
        self.url = api_base(self.url)
        if not self.metrics:
            self.metrics = [metrics_url(self.url)]

    def to_env(self) -> dict[str, str]:
        d = {
            "URL": self.url,
            "METRICS": " ".join(self.metrics),
            "MODEL": self.model or "",
            "MAX_TOKENS": "" if self.max_tokens is None else str(self.max_tokens),
            "TEMPERATURE": str(self.temperature),
            "TOP_P": str(self.top_p),
            "REFRESH_S": str(self.refresh_s),
            "WINDOW_S": str(self.window_s),
            "TIMEOUT_S": str(self.timeout_s),
            "LABEL": self.label,
            "DUMMY_WEIGHTS": "1" if self.dummy_weights else "",
        }
        return {ENV_PREFIX + k: v for k, v in d.items()}

    @classmethod
    def from_env(cls, env: dict | None = None) -> ChatConfig:
        e = {
            k[len(ENV_PREFIX) :]: v
            for k, v in (os.environ if env is None else env).items()
            if k.startswith(ENV_PREFIX)
        }
        if not e.get("URL"):
            raise RuntimeError(
                f"{ENV_PREFIX}URL is not set: start the app with python -m tunebook.chat"
            )
        return cls(
            url=e["URL"],
            metrics=e.get("METRICS", "").split(),
            model=e.get("MODEL") or None,
            max_tokens=int(e["MAX_TOKENS"]) if e.get("MAX_TOKENS") else None,
            temperature=float(e.get("TEMPERATURE", 0.7)),
            top_p=float(e.get("TOP_P", 0.9)),
            refresh_s=float(e.get("REFRESH_S", 2.0)),
            window_s=float(e.get("WINDOW_S", 30.0)),
            timeout_s=float(e.get("TIMEOUT_S", 300.0)),
            label=e.get("LABEL", ""),
            dummy_weights=e.get("DUMMY_WEIGHTS") == "1",
        )


def api_base(url: str) -> str:
    """``http://h:p``, ``http://h:p/`` or ``http://h:p/v1`` -> ``http://h:p/v1``."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url if url.endswith("/v1") else url + "/v1"


def server_root(base: str) -> str:
    """``http://h:p/v1`` -> ``http://h:p`` (where /health and /metrics are)."""
    return api_base(base)[: -len("/v1")]


def metrics_url(base: str) -> str:
    """The server's Prometheus endpoint: ``/metrics`` beside ``/v1``."""
    return server_root(base) + "/metrics"


def request_body(
    cfg: ChatConfig, model: str, messages: list[dict], max_tokens: int | None | str = "config"
) -> dict:
    """The chat completion request (streaming and usage are added by ``stream_chat``).
    ``max_tokens``: the reply cap of this chat (the page's settings), else the config's; None
    or 0 leaves it to the server."""
    body: dict = {
        "model": model,
        "messages": messages,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
    }
    cap = cfg.max_tokens if max_tokens == "config" else max_tokens
    if cap:
        body["max_tokens"] = int(cap)
    return body


# --------------------------------------------------------------------------- text, not Markdown
# CommonMark lets any ASCII punctuation be escaped with a backslash; escaped, none of it formats.
_PUNCT = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


class Escaper:
    """The model's text as the page shows it: characters, not Markdown. Every ASCII punctuation
    mark is backslash-escaped (``~~`` strikes nothing, ``#`` heads nothing, ``<b>`` is text), a
    line break stays a line break, and a line's leading spaces are kept as no-break spaces (four
    of them would start a code block). Fed piece by piece as a reply streams: ``feed(piece)``
    returns that piece escaped; the pieces joined are ``escape(text)``."""

    def __init__(self) -> None:
        self.line_start = True

    def feed(self, text: str) -> str:
        out = []
        for ch in text:
            if ch == "\n":
                out.append("  \n")  # a hard line break: two spaces, then the newline
                self.line_start = True
                continue
            if self.line_start and ch in " \t":
                out.append("\u00a0" * (4 if ch == "\t" else 1))
                continue
            self.line_start = False
            out.append("\\" + ch if ch in _PUNCT else ch)
        return "".join(out)


def escape_markdown(text: str) -> str:
    """``text`` shown as typed: see ``Escaper``."""
    return Escaper().feed(text)


def has_weights(model: str | Path) -> bool | None:
    """Whether a local model folder holds weights (*.safetensors or *.bin); None for a name that
    is not a folder here (a hub id, or a server elsewhere: unknown)."""
    p = Path(str(model)).expanduser()
    if not p.is_dir():
        return None
    return any(p.glob("*.safetensors")) or any(p.glob("*.bin"))


def dummy_weights(serve_yaml: dict, here: Path | None = None) -> bool:
    """A deployment that serves no real weights: ``load-format: dummy``, or a model folder
    without weight files (vLLM refuses that one unless told dummy)."""
    fmt = serve_yaml.get("load-format", serve_yaml.get("load_format"))
    if fmt == "dummy":
        return True
    model = serve_yaml.get("model")
    if not model:
        return False
    path = Path(str(model))
    if here is not None and not path.is_absolute() and (here / path).is_dir():
        path = here / path
    return has_weights(path) is False


# --------------------------------------------------------------------------- Prometheus text


def _values(samples: Iterable[Sample], name: str) -> list[float]:
    """Every sample of a metric; counters are exposed as ``<name>_total``."""
    names = {name, name + "_total"}
    return [v for n, _, v in samples if n in names]


def _sum(samples: Sequence[Sample], name: str) -> float | None:
    vals = _values(samples, name)
    return math.fsum(vals) if vals else None


@dataclass
class ServerState:
    """One reading of the server's metrics, added up over engines (and replicas)."""

    t: float  # monotonic seconds
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None  # mean fraction over engines
    prefix_hits: float | None = None  # cumulative tokens
    prefix_queries: float | None = None
    requests_done: float | None = None  # cumulative, every finish reason
    e2e_sum: float | None = None
    e2e_count: float | None = None
    generation_tokens: float | None = None
    engines: int = 0

    @property
    def prefix_hit_rate(self) -> float | None:
        """Share of prompt tokens found in the prefix cache since the server started."""
        if self.prefix_hits is None or not self.prefix_queries:
            return None
        return self.prefix_hits / self.prefix_queries


def server_state(samples: Sequence[Sample], t: float | None = None) -> ServerState | None:
    """The panel's figures from parsed samples; None when there is no ``vllm:`` series at all."""
    if not any(n.startswith("vllm:") for n, _, _ in samples):
        return None
    kv = _values(samples, KV_USAGE)
    return ServerState(
        t=time.monotonic() if t is None else t,
        running=_sum(samples, RUNNING),
        waiting=_sum(samples, WAITING),
        kv_cache_usage=math.fsum(kv) / len(kv) if kv else None,
        prefix_hits=_sum(samples, PREFIX_HITS),
        prefix_queries=_sum(samples, PREFIX_QUERIES),
        requests_done=_sum(samples, REQUESTS_DONE),
        e2e_sum=_sum(samples, E2E + "_sum"),
        e2e_count=_sum(samples, E2E + "_count"),
        generation_tokens=_sum(samples, GEN_TOKENS),
        engines=len(_values(samples, RUNNING)),
    )


_COUNTERS = (
    "prefix_hits",
    "prefix_queries",
    "requests_done",
    "e2e_sum",
    "e2e_count",
    "generation_tokens",
)


def _delta(old: ServerState, new: ServerState, name: str) -> float | None:
    a, b = getattr(old, name), getattr(new, name)
    return None if a is None or b is None else b - a


def restarted(old: ServerState, new: ServerState) -> bool:
    """A counter went down: the server (or a replica) started again since ``old``."""
    return any((d := _delta(old, new, c)) is not None and d < 0 for c in _COUNTERS)


def window_rates(old: ServerState, new: ServerState) -> dict[str, float | None]:
    """Rates between two readings: finished requests/s, their mean latency, generated tokens/s
    and the prefix-cache hit rate of the prompts that arrived in between."""
    dt = new.t - old.t
    out: dict[str, float | None] = {
        "qps": None,
        "latency_s": None,
        "gen_tok_s": None,
        "hit_rate": None,
    }
    if dt <= 0 or restarted(old, new):
        return out
    if (d := _delta(old, new, "requests_done")) is not None:
        out["qps"] = d / dt
    n, s = _delta(old, new, "e2e_count"), _delta(old, new, "e2e_sum")
    if n and s is not None:
        out["latency_s"] = s / n
    if (d := _delta(old, new, "generation_tokens")) is not None:
        out["gen_tok_s"] = d / dt
    q, h = _delta(old, new, "prefix_queries"), _delta(old, new, "prefix_hits")
    if q and h is not None:
        out["hit_rate"] = h / q
    return out


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def _num(x: float | None, unit: str = "", digits: int = 0) -> str:
    if x is None:
        return "–"
    return f"{x:,.{digits}f}{unit}"


def panel_rows(state: ServerState, rates: dict, window_s: float) -> list[dict]:
    """The panel's rows: key (for tests and styling), label, value."""
    w = f"last {window_s:.0f} s"
    hit = _pct(state.prefix_hit_rate)
    if state.prefix_queries:
        hit += f" ({_num(state.prefix_hits)} of {_num(state.prefix_queries)} tokens)"
    rows = [
        ("running", "Running requests", _num(state.running)),
        ("waiting", "Waiting requests", _num(state.waiting)),
        ("kv_cache", "KV cache used", _pct(state.kv_cache_usage)),
        ("prefix_hit_rate", "Prefix cache hit rate", hit),
        ("prefix_hit_rate_recent", f"Prefix cache hit rate, {w}", _pct(rates.get("hit_rate"))),
        ("qps", f"Finished requests/s, {w}", _num(rates.get("qps"), digits=2)),
        ("latency", f"Mean request latency, {w}", _num(rates.get("latency_s"), " s", 2)),
        ("gen_tok_s", f"Generated tokens/s, {w}", _num(rates.get("gen_tok_s"), digits=1)),
    ]
    if state.engines > 1:
        rows.append(("engines", "Engines reporting", str(state.engines)))
    return [{"key": k, "label": label, "value": v} for k, label, v in rows]


def panel_props(
    cfg: ChatConfig,
    state: ServerState | None,
    rates: dict | None = None,
    status: str = "starting",
    message: str = "",
    model: str | None = None,
) -> dict:
    """Props of the side panel's custom element (chat_panel.jsx)."""
    return {
        "status": status,  # ok | unreachable | no_metrics | starting
        "message": message,
        "server": cfg.url,
        "label": cfg.label,
        "model": model or cfg.model or "",
        "rows": panel_rows(state, rates or {}, cfg.window_s) if state else [],
        "updated": time.strftime("%H:%M:%S"),
        "notice": DUMMY_NOTICE if cfg.dummy_weights else "",
        "max_tokens": cfg.max_tokens or 0,
    }


class Monitor:
    """Reads the metrics endpoints and keeps the readings of the last ``window_s`` seconds."""

    def __init__(self, cfg: ChatConfig, client=None):
        self.cfg = cfg
        self.client = client
        self.history: deque[ServerState] = deque()
        self.model: str | None = cfg.model

    async def _get(self, url: str) -> str:
        r = await self.client.get(url, timeout=5.0)
        r.raise_for_status()
        return r.text

    async def poll(self) -> dict:
        """One refresh: the panel's props."""
        import httpx

        if self.client is None:
            self.client = httpx.AsyncClient()
        pages = await asyncio.gather(
            *(self._get(u) for u in self.cfg.metrics), return_exceptions=True
        )
        failed = [
            u for u, p in zip(self.cfg.metrics, pages, strict=True) if isinstance(p, BaseException)
        ]
        samples = [s for p in pages if isinstance(p, str) for s in parse_samples(p)]
        if len(failed) == len(self.cfg.metrics):
            self.history.clear()
            self.model = self.cfg.model
            return panel_props(
                self.cfg,
                None,
                status="unreachable",
                message=f"No answer from {', '.join(failed)}: the server is down or still starting.",
            )
        state = server_state(samples)
        if state is None:
            return panel_props(
                self.cfg,
                None,
                status="no_metrics",
                message="No vLLM metrics at "
                + ", ".join(self.cfg.metrics)
                + " (a router? pass --metrics for each replica).",
            )
        if self.history and restarted(self.history[-1], state):
            self.history.clear()
        self.history.append(state)
        while len(self.history) > 2 and state.t - self.history[1].t >= self.cfg.window_s:
            self.history.popleft()
        rates = window_rates(self.history[0], state) if len(self.history) > 1 else {}
        if self.model is None:
            try:
                self.model = (await list_models(self.client, self.cfg.url))[0]["id"]
            except (ChatError, IndexError, KeyError, ValueError):
                pass
        msg = f"{len(failed)} of {len(self.cfg.metrics)} endpoints did not answer: {', '.join(failed)}"
        return panel_props(self.cfg, state, rates, "ok", msg if failed else "", self.model)


# --------------------------------------------------------------------------- a streamed reply
@dataclass
class ReplyStats:
    """Timing of one streamed reply. TTFT is from sending the request to the first text; tokens/s
    is the decode rate (tokens after the first, over the time from the first to the last), so it
    is 1 / TPOT and does not include the queue or the prefill."""

    t0: float = field(default_factory=time.perf_counter)
    first: float | None = None
    last: float | None = None
    chunks: int = 0
    completion_tokens: int | None = None  # from the server's usage, when it reports it
    prompt_tokens: int | None = None
    finish_reason: str | None = None

    def on_text(self, t: float | None = None) -> None:
        t = time.perf_counter() if t is None else t
        if self.first is None:
            self.first = t
        self.last = t
        self.chunks += 1

    def on_usage(self, usage: dict) -> None:
        if usage.get("completion_tokens") is not None:
            self.completion_tokens = int(usage["completion_tokens"])
        if usage.get("prompt_tokens") is not None:
            self.prompt_tokens = int(usage["prompt_tokens"])

    @property
    def tokens(self) -> int:
        """Generated tokens: the server's count, else the text chunks (one token each at
        vLLM's default stream_interval of 1)."""
        return self.completion_tokens if self.completion_tokens is not None else self.chunks

    @property
    def ttft_s(self) -> float | None:
        return None if self.first is None else self.first - self.t0

    @property
    def tok_s(self) -> float | None:
        if self.first is None or self.last is None or self.tokens < 2 or self.last <= self.first:
            return None
        return (self.tokens - 1) / (self.last - self.first)

    def line(self) -> str:
        """``TTFT 85 ms · 16 tokens · 41.2 tok/s`` (parts that are unknown are left out)."""
        parts = []
        if self.ttft_s is not None:
            parts.append(f"TTFT {1e3 * self.ttft_s:.0f} ms")
        parts.append(f"{self.tokens} token{'s' if self.tokens != 1 else ''}")
        if self.tok_s is not None:
            parts.append(f"{self.tok_s:.1f} tok/s")
        if self.prompt_tokens is not None:
            parts.append(f"prompt {self.prompt_tokens} tokens")
        if self.finish_reason == "length":
            parts.append("stopped at the token limit")
        return " · ".join(parts)


class ChatError(Exception):
    """A failed request, with a kind the UI explains: no_server, too_long, max_tokens,
    interrupted, timeout, server_error (an error event in the stream) or http (any other)."""

    def __init__(self, kind: str, detail: str, partial: str = ""):
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail, self.partial = kind, detail, partial


def error_text(payload) -> str | None:
    """The message of an OpenAI-style error body (``{"error": {...}}`` or vLLM's
    ``{"object": "error", ...}``), else None."""
    if not isinstance(payload, dict):
        return None
    if isinstance(payload.get("error"), dict):
        return str(payload["error"].get("message") or payload["error"])
    if isinstance(payload.get("error"), str):
        return payload["error"]
    if payload.get("object") == "error":
        return str(payload.get("message") or payload)
    return None


def _too_long(text: str) -> bool:
    t = text.lower()
    return any(k in t for k in ("maximum context length", "max_model_len", "context length"))


def http_error(status: int, raw: bytes | str) -> ChatError:
    """A non-200 answer as a ChatError (a prompt over the context is ``too_long``)."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    try:
        msg = error_text(json.loads(text)) or text
    except ValueError:
        msg = text
    msg = msg.strip()[:1000]
    if status in (400, 413) and "max_tokens" in msg and "max_model_len" in msg:
        return ChatError("max_tokens", msg)  # the reply cap alone exceeds the context
    if status in (400, 413) and _too_long(msg):
        return ChatError("too_long", msg)
    return ChatError("http", f"HTTP {status}: {msg}")


def _transport_error(e: Exception, base: str, partial: str) -> ChatError:
    import httpx

    if isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout)):
        return ChatError("no_server", f"nothing answers at {base} ({e})")
    if isinstance(e, httpx.TimeoutException):
        return ChatError("timeout", str(e) or type(e).__name__, partial)
    return ChatError("interrupted", f"{type(e).__name__}: {e}", partial)


async def list_models(client, base: str) -> list[dict]:
    """``GET /v1/models``: the served models (each with ``id`` and, from vLLM, ``max_model_len``)."""
    import httpx

    try:
        r = await client.get(f"{api_base(base)}/models", timeout=10.0)
    except httpx.HTTPError as e:
        raise _transport_error(e, base, "") from e
    if r.status_code != 200:
        raise http_error(r.status_code, r.content)
    return list(r.json().get("data") or [])


async def stream_chat(client, base: str, body: dict, stats: ReplyStats) -> AsyncIterator[str]:
    """Stream a chat completion: yield the text as it arrives, fill ``stats``; raise ChatError.

    A stream that ends without ``[DONE]`` (the server died, or a proxy dropped it) is an
    ``interrupted`` error carrying the text received so far.
    """
    import httpx

    base = api_base(base)
    payload = {**body, "stream": True, "stream_options": {"include_usage": True}}
    got: list[str] = []
    stats.t0 = time.perf_counter()
    try:
        async with client.stream("POST", f"{base}/chat/completions", json=payload) as r:
            if r.status_code != 200:
                raise http_error(r.status_code, await r.aread())
            async for line in r.aiter_lines():
                try:
                    ev = sse_data(line)
                except ValueError:  # a line that is not JSON: skipped, as a browser would
                    continue
                if ev is None:
                    continue
                if ev is DONE:
                    return
                if (msg := error_text(ev)) is not None:
                    kind = "too_long" if _too_long(msg) else "server_error"
                    raise ChatError(kind, msg, "".join(got))
                if ev.get("usage"):
                    stats.on_usage(ev["usage"])
                for choice in ev.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        stats.on_text()
                        got.append(text)
                        yield text
                    if choice.get("finish_reason"):
                        stats.finish_reason = choice["finish_reason"]
        raise ChatError("interrupted", "the stream ended without [DONE]", "".join(got))
    except httpx.HTTPError as e:
        raise _transport_error(e, base, "".join(got)) from e


def explain(err: ChatError, cfg: ChatConfig) -> str:
    """What the UI says about a failed reply: what happened, and what to do."""
    base = cfg.url
    if err.kind == "no_server":
        return (
            f"**No server answers at {base}.** It is stopped, or still starting. Start it "
            "(`python -m tunebook.serve <serve.yaml>` or `python -m tunebook.chat <folder>`) "
            "and send your message again: the chat connects as soon as it answers."
        )
    if err.kind == "too_long":
        return (
            "**This conversation is longer than the model's context.** The server refused it: "
            f"{err.detail}\n\nSend a shorter message, or start a new chat (the conversation so "
            "far is sent with every message); the context is the deployment's `max-model-len`."
        )
    if err.kind == "max_tokens":
        return (
            "**The reply cap (`--max-tokens`) is larger than the model's context.** The server "
            f"refused it: {err.detail}\n\nLower it in the settings (the gear by the message box;"
            " 0: the server then allows what is left of the context), or restart the chat with"
            " a smaller `--max-tokens`."
        )
    if err.kind == "interrupted":
        got = len(err.partial)
        return (
            f"**The server stopped in the middle of this reply** (after {got} characters): "
            f"{err.detail}.\n\nThe partial reply is not kept in the conversation. Once the "
            "server is back, send your message again."
        )
    if err.kind == "timeout":
        return (
            f"**No reply from {base} within {cfg.timeout_s:.0f} s** ({err.detail}). The server "
            "may be overloaded: see the waiting requests in the panel."
        )
    if err.kind == "server_error":
        return f"**The server reported an error during the reply:** {err.detail}"
    return f"**The request failed:** {err.detail}"


# --------------------------------------------------------------------------- the command
def _deployment_yaml(path: str | Path) -> Path:
    p = Path(path)
    if p.is_dir():
        p = p / "serve.yaml"
    if not p.is_file():
        raise FileNotFoundError(f"no serve.yaml at {path} (expected runs/<id>/05_assemble_config/)")
    return p.resolve()


def _deployment_names(cfg: dict) -> set[str]:
    names = cfg.get("served-model-name") or cfg.get("served_model_name") or cfg.get("model") or []
    return {names} if isinstance(names, str) else {str(n) for n in names}


def _get_json(url: str, timeout: float = 3.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def _answers(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def prepare_app_root(root: Path, cfg: ChatConfig) -> Path:
    """The folder Chainlit runs in (it writes .chainlit/ and .files/ there): the panel's JSX and
    the readme."""
    elements = root / "public" / "elements"
    elements.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(PANEL_JSX, elements / f"{PANEL_NAME}.jsx")
    (root / "chainlit.md").write_text(
        "# tunebook chat\n\n"
        f"Chat with `{cfg.label or cfg.url}` through vLLM's OpenAI-compatible API ({cfg.url}).\n\n"
        "Each reply ends with its time to first token (TTFT), token count and decode rate, and "
        "stops at the reply cap ("
        + (f"{cfg.max_tokens} tokens" if cfg.max_tokens else "none: the server's limit")
        + "; the settings by the message box change it). The model's text is shown as "
        "typed, not as Markdown. The side panel is the server's own state, read from its "
        f"Prometheus endpoint ({', '.join(cfg.metrics)}) every {cfg.refresh_s:g} s.\n"
        + (f"\n**{DUMMY_NOTICE}**\n" if cfg.dummy_weights else "")
    )
    return root


# Ctrl-C at any moment: each process is recorded for the stop as it is started (a signal that
# arrives while Popen runs waits for the record), before any wait on it.
START_PHASES = ("server_spawned", "server_healthy", "app_spawned", "app_ready", "serving")
_stop: dict = {"asked": None, "held": 0}


def _on_signal(signum, frame):
    _stop["asked"] = signum
    if not _stop["held"]:
        raise KeyboardInterrupt


class _held:
    """A block a stop must not cut in half (a process started and recorded): a signal that
    arrives inside it stops right after it."""

    def __enter__(self):
        _stop["held"] += 1

    def __exit__(self, *exc):
        _stop["held"] -= 1
        if _stop["asked"] is not None and not _stop["held"] and exc[0] is None:
            raise KeyboardInterrupt


def _phase(name: str) -> None:
    """A moment of the start; with ``TUNEBOOK_SIGNAL_AT=<name>`` the command sends itself SIGINT
    there, as Ctrl-C in its terminal would (the tests interrupt at each phase this way)."""
    if os.environ.get(SIGNAL_AT_ENV) == name:
        os.kill(os.getpid(), signal.SIGINT)


def _spawn(cmd: list[str], log_path: Path, env: dict, on_spawn, cwd=None) -> subprocess.Popen:
    """Popen in a process group of its own, recorded by ``on_spawn`` before anything else."""
    with _held(), open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
        )
        if on_spawn is not None:
            on_spawn(proc)
    return proc


def start_server(
    config: Path, port: int, log_path: Path, timeout_s: float, out=print, on_spawn=None
) -> tuple[subprocess.Popen, str]:
    """``vllm serve --config`` on 127.0.0.1:port with the deployment's environment, as
    tunebook.deploy.serve starts it; returns the process (its own group) once /health answers.
    ``on_spawn(proc)`` records it the moment it exists (the caller stops it on Ctrl-C)."""
    base = f"http://127.0.0.1:{port}"
    cmd = flags.vllm_command(config, "--host", "127.0.0.1", "--port", str(port))
    env = {**os.environ, **serve.load_env(config), "PYTHONUNBUFFERED": "1"}
    out(f"[chat] starting vllm serve --config {config} --port {port}  (log: {log_path})")
    proc = _spawn(cmd, log_path, env, on_spawn)
    try:
        _phase("server_spawned")
        waited = serve.wait_healthy(base, proc, timeout_s)
        _phase("server_healthy")
    except BaseException:
        serve.stop(proc)
        raise
    out(f"[chat] server healthy after {waited:.1f} s")
    return proc, base


def start_app(
    cfg: ChatConfig,
    host: str,
    port: int,
    root: Path,
    log_path: Path,
    timeout_s: float = 120.0,
    on_spawn=None,
) -> subprocess.Popen:
    """The Chainlit app in its own process group; returns once its page answers. ``on_spawn``
    records the process the moment it exists: a Ctrl-C while it starts stops it too."""
    env = {**os.environ, **cfg.to_env(), "CHAINLIT_APP_ROOT": str(root), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "chainlit", "run", str(APP_FILE), "--headless"]
    cmd += ["--host", host, "--port", str(port)]
    proc = _spawn(cmd, log_path, env, on_spawn, cwd=root)
    try:
        _phase("app_spawned")
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"chainlit exited with code {proc.returncode}:\n{tail}")
            if _answers(f"http://{host}:{port}/"):
                _phase("app_ready")
                return proc
            time.sleep(0.5)
        raise TimeoutError(
            f"the chat app did not answer within {timeout_s:.0f} s (log: {log_path})"
        )
    except BaseException:
        serve.stop(proc, grace_s=10.0)
        raise


def can_listen(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on ``port`` now, as vLLM's and Chainlit's (uvicorn) do:
    with SO_REUSEADDR, so a port whose last server just stopped (connections in TIME_WAIT) is
    free, as it is for them."""
    import socket

    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tunebook.chat", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument(
        "deployment",
        nargs="?",
        help="assembled folder (runs/<id>/05_assemble_config/) or its serve.yaml",
    )
    ap.add_argument("--url", help="a running server or router instead, e.g. http://host:8000/v1")
    ap.add_argument(
        "--metrics",
        action="append",
        default=[],
        metavar="URL",
        help="Prometheus endpoint for the panel (repeatable; default: the server's /metrics)",
    )
    ap.add_argument("--model", help="model name to ask for (default: the first of /v1/models)")
    ap.add_argument("--host", default="127.0.0.1", help="where the chat page listens")
    ap.add_argument("--port", type=int, default=8001, help="the chat page's port (default 8001)")
    ap.add_argument(
        "--server-port",
        type=int,
        help="port of the deployment (default: serve.yaml's, else 8000; a free one if taken)",
    )
    ap.add_argument(
        "--max-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        help=f"cap on each reply, tokens (default {DEFAULT_MAX_TOKENS}; 0: none, the server's"
        " own limit; the page's settings change it per chat)",
    )
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--refresh", type=float, default=2.0, help="panel refresh, seconds")
    ap.add_argument(
        "--window", type=float, default=30.0, help="window of the panel's rates, seconds"
    )
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the server")
    ap.add_argument("--log-dir", help="server and app logs (default: a new temporary folder)")
    args = ap.parse_args(argv)
    if bool(args.deployment) == bool(args.url):
        ap.error("give an assembled folder (or serve.yaml) or --url, not both")
    if importlib.util.find_spec("chainlit") is None:
        print(f"tunebook.chat: error: {INSTALL_HINT}", file=sys.stderr)
        return 2
    logs = Path(args.log_dir or tempfile.mkdtemp(prefix="tunebook-chat-"))
    logs.mkdir(parents=True, exist_ok=True)
    # Ctrl-C and SIGTERM raise KeyboardInterrupt from here on, also where SIGINT came ignored
    # (a job started with `cmd &` by a script); every process is recorded as it starts.
    _stop.update(asked=None, held=0)
    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    procs: dict[str, subprocess.Popen] = {}
    root = Path(tempfile.mkdtemp(prefix="app-", dir=logs))
    try:
        return _run(args, logs, root, procs)
    except KeyboardInterrupt:
        return 0
    finally:
        for s in old:  # a second Ctrl-C or SIGTERM must not cut the cleanup
            signal.signal(s, signal.SIG_IGN)
        warned = procs.pop("server_exited", None) is not None
        if "app" in procs:
            serve.stop(procs["app"], grace_s=10.0)
        if "server" in procs:
            code = procs["server"].poll()
            sd = serve.stop(procs["server"])  # also when it exited: its group may hold workers
            if warned:
                print(f"[chat] the server had exited (code {code}); its process group is gone")
            else:
                how = "clean" if sd["clean"] else "killed"
                print(f"[chat] server stopped: {how} in {sd['stop_s']:.1f} s")
        shutil.rmtree(root, ignore_errors=True)  # Chainlit's config, uploads and session files
        for s, h in old.items():
            signal.signal(s, h)
        # The stop was this command's: a later start in this process (a caller's start_server)
        # must not find it still asked.
        _stop.update(asked=None, held=0)


def _served_root_has_weights(base: str) -> bool | None:
    """Whether the model a running server serves (its /v1/models ``root``, a folder here) has
    weights; None where that cannot be told."""
    try:
        models = _get_json(server_root(base) + "/v1/models").get("data") or []
        return has_weights(models[0]["root"]) if models and models[0].get("root") else None
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError):
        return None


# Long: the command's one path from arguments to a running chat (server reused or started, app,
# wait), each step printing as it goes; ``main`` owns the stopping.
def _run(args, logs: Path, root: Path, procs: dict) -> int:
    """The command after its arguments: the server (reused or started), the app, then wait.
    ``procs`` gets each process the moment it starts (``main`` stops them)."""
    dummy = False
    if args.url:
        base, label = api_base(args.url), args.url
        if not _answers(server_root(base) + "/health"):
            print(f"[chat] nothing answers at {base} yet; the chat connects when it does")
        else:
            dummy = _served_root_has_weights(base) is False
    else:
        import yaml

        try:
            config = _deployment_yaml(args.deployment)
        except FileNotFoundError as e:
            print(f"tunebook.chat: error: {e}", file=sys.stderr)
            return 2
        ycfg = yaml.safe_load(config.read_text()) or {}
        label = str(config.parent)
        dummy = dummy_weights(ycfg, config.parent)
        asked = args.server_port or int(ycfg.get("port") or 8000)
        port = asked
        here = f"http://127.0.0.1:{port}"
        served: set[str] = set()
        if _answers(f"{here}/health"):
            try:
                served = {m["id"] for m in _get_json(f"{here}/v1/models").get("data", [])}
            except (urllib.error.URLError, OSError, ValueError, KeyError):
                pass
        if served & _deployment_names(ycfg):
            base = here + "/v1"
            print(f"[chat] using the server already running at {here} ({', '.join(served)})")
        else:
            if not can_listen(port, "127.0.0.1"):
                if args.server_port:
                    print(f"tunebook.chat: error: port {port} is taken", file=sys.stderr)
                    return 2
                port = free_port()
                what = f"serves {', '.join(sorted(served))}" if served else "is another program"
                print(
                    f"[chat] port {asked} is taken (what listens there {what}, not this"
                    f" deployment): its server starts on port {port} instead"
                    " (--server-port chooses one)"
                )
            try:
                _, base = start_server(
                    config,
                    port,
                    logs / "serve.log",
                    args.timeout,
                    on_spawn=lambda p: procs.__setitem__("server", p),
                )
            except (RuntimeError, TimeoutError) as e:
                log = logs / "serve.log"
                tail = log.read_text(errors="replace")[-3000:] if log.is_file() else ""
                print(f"tunebook.chat: error: {e}\n{tail}", file=sys.stderr)
                return 1
            base += "/v1"
    if dummy:
        print(f"[chat] {DUMMY_NOTICE}")
    cfg = ChatConfig(
        url=base,
        metrics=args.metrics,
        model=args.model,
        max_tokens=args.max_tokens or None,
        temperature=args.temperature,
        top_p=args.top_p,
        refresh_s=args.refresh,
        window_s=args.window,
        label=label,
        dummy_weights=dummy,
    )
    prepare_app_root(root, cfg)
    if not can_listen(args.port, args.host):
        print(f"tunebook.chat: error: port {args.port} is taken (--port)", file=sys.stderr)
        return 2
    try:
        app = start_app(
            cfg,
            args.host,
            args.port,
            root,
            logs / "chat.log",
            on_spawn=lambda p: procs.__setitem__("app", p),
        )
    except (RuntimeError, TimeoutError) as e:
        print(f"tunebook.chat: error: {e}", file=sys.stderr)
        return 1
    server = procs.get("server")
    print(f"[chat] open http://{args.host}:{args.port}  (server {cfg.url}; logs {logs})")
    cap = f"{cfg.max_tokens} tokens" if cfg.max_tokens else "none (the server's limit)"
    print(f"[chat] reply cap (max_tokens): {cap}; the page's settings change it")
    print("[chat] Ctrl-C stops the chat" + (" and the server it started" if server else ""))
    _phase("serving")
    while app.poll() is None:
        if server is not None and server.poll() is not None and "server_exited" not in procs:
            print(
                f"[chat] the server exited (code {server.returncode}; log {logs / 'serve.log'});"
                " the chat stays up and reconnects when a server answers at " + cfg.url
            )
            procs["server_exited"] = server.returncode
        time.sleep(1.0)
    print(f"[chat] the chat app exited (code {app.returncode}; log {logs / 'chat.log'})")
    return 1


if __name__ == "__main__":
    sys.exit(main())
