"""The chat front end (`python -m tunebook.chat`): its pure helpers, its HTTP client against a
scripted server and a real vLLM, and the Chainlit app in headless Chromium.

Three kinds of test:

* no marks: Prometheus parsing, reply statistics, error wording, the client against
  ``FakeServer`` (a scripted OpenAI-compatible server on a thread: streams, dies mid-reply,
  refuses a long prompt, goes away and comes back);
* ``engine``: the client against a real ``vllm serve`` of the tiny model (streaming, vLLM's own
  error messages, a server killed in the middle of a reply);
* ``browser``: the app in Chromium. With ``engine`` too, the one command a user runs,
  ``python -m tunebook.chat <assembled folder>``, starts the tiny model's deployment and the app;
  a typed Chinese prompt streams back with its statistics, the side panel fills from vLLM's
  /metrics, an over-long message gets a clear error, and SIGTERM stops everything it started.
  Without an engine, the scripted server shows the other errors and the recovery in the page.

The tiny model has dummy weights, so replies are random text: these tests check the plumbing,
never the words. Browser tests need /usr/bin/chromium, playwright and the chat extra (chainlit);
they are skipped, with the reason, where one is missing. Screenshots go to test-artifacts/browser/.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest
from conftest import ENGINE_ENV, ENGINE_SETTINGS

from tunebook.deploy import chat, serve, writers
from tunebook.engine import flags, vllm_http
from tunebook.engine.interrupt import SIGNAL_AT_ENV
from tunebook.topics import assemble

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = REPO / "test-artifacts" / "browser"
# The suite's CPU engine settings (max_model_len 512: the context the error tests overrun).
SETTINGS, ENV = ENGINE_SETTINGS, ENGINE_ENV
# Generous: on a shared two-core box `vllm serve` of the tiny model has taken 40-80 s to start.
SERVER_START_S = 600
PAGE_S = 90


def _browser_requirements() -> None:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} not found (Debian: apt-get install -y chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("the playwright Python package is not installed (pip install playwright)")
    if importlib.util.find_spec("chainlit") is None:
        pytest.skip(chat.INSTALL_HINT)


# --------------------------------------------------------------------------- a scripted server
class FakeServer:
    """An OpenAI-compatible server on a thread, scripted by ``mode``: ``ok`` streams ``reply``
    one piece every ``delay_s``; ``die`` sends three pieces and drops the connection; a prompt
    over ``max_chars`` is refused as vLLM refuses it. ``/metrics`` counts what it served."""

    MODEL = "fake-model"

    def __init__(self, port: int = 0):
        self.mode = "ok"
        self.reply = ["你好", "，", "这是", "一个", "流式", "回答", "。"]
        self.delay_s = 0.05
        self.max_chars = 2000
        self.root: str | None = None  # /v1/models' root (vLLM: the model's path)
        self.requests: list[dict] = []
        self.done = 0
        self.conns: set[socket.socket] = set()
        self.port = port
        self.httpd: ThreadingHTTPServer | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                super().setup()
                fake.conns.add(self.connection)

            def log_message(self, *a):  # keep the test output clean
                pass

            def _send(self, status: int, body: bytes, ctype: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def do_GET(self):
                if self.path == "/health":
                    self._send(200, b"", "text/plain")
                elif self.path == "/v1/models":
                    model = {"id": fake.MODEL, "max_model_len": 512}
                    data = {"data": [{**model, **({"root": fake.root} if fake.root else {})}]}
                    self._send(200, json.dumps(data).encode(), "application/json")
                elif self.path == "/metrics":
                    self._send(200, fake.metrics().encode(), "text/plain; version=0.0.4")
                else:
                    self._send(404, b"", "text/plain")

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append(body)
                chars = sum(len(m["content"]) for m in body["messages"])
                if chars > fake.max_chars:
                    msg = (
                        "This model's maximum context length is 512 tokens. However, your prompt"
                        f" contains at least {chars} input tokens, which exceeds this limit even"
                        " without any output tokens. Please reduce the length of the input prompt."
                    )
                    err = {"error": {"message": msg, "type": "BadRequestError", "code": 400}}
                    self._send(400, json.dumps(err).encode(), "application/json")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                pieces = fake.reply[:3] if fake.mode == "die" else fake.reply
                for p in pieces:
                    time.sleep(fake.delay_s)
                    ev = {"choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]}
                    self._chunk(f"data: {json.dumps(ev, ensure_ascii=False)}\n\n".encode())
                if fake.mode == "die":  # as a killed server: no last chunk, the socket just closes
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                usage = {"prompt_tokens": chars, "completion_tokens": len(pieces)}
                ev = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
                self._chunk(f"data: {json.dumps(ev)}\n\n".encode())
                self._chunk(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
                self._chunk(b"data: [DONE]\n\n")
                self._chunk(b"")
                fake.done += 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        """Stop as a dead server does: no listener, and every open connection closed."""
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None
        for c in list(self.conns):
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.conns.clear()

    def metrics(self) -> str:
        lab = f'engine="0",model_name="{self.MODEL}"'
        n = self.done
        return "\n".join(
            [
                "# HELP vllm:num_requests_running Number of requests in model execution batches.",
                "# TYPE vllm:num_requests_running gauge",
                f"vllm:num_requests_running{{{lab}}} 0.0",
                f"vllm:num_requests_waiting{{{lab}}} 0.0",
                f"vllm:kv_cache_usage_perc{{{lab}}} 0.25",
                f"vllm:prefix_cache_queries_total{{{lab}}} {100.0 * n}",
                f"vllm:prefix_cache_hits_total{{{lab}}} {40.0 * n}",
                f'vllm:request_success_total{{{lab},finished_reason="stop"}} {float(n)}',
                f"vllm:e2e_request_latency_seconds_sum{{{lab}}} {0.5 * n}",
                f"vllm:e2e_request_latency_seconds_count{{{lab}}} {float(n)}",
                f"vllm:generation_tokens_total{{{lab}}} {7.0 * n}",
                "",
            ]
        )


@pytest.fixture
def fake():
    f = FakeServer()
    yield f
    f.stop()


def _closed_port() -> int:
    return vllm_http.free_port()  # bound and released: nothing listens there


# --------------------------------------------------------------------------- pure helpers
def test_api_base_and_metrics_url():
    for u in ("http://h:8000", "http://h:8000/", "http://h:8000/v1", "h:8000/v1/"):
        assert chat.api_base(u) == "http://h:8000/v1"
    assert chat.metrics_url("http://h:8000/v1") == "http://h:8000/metrics"
    cfg = chat.ChatConfig(url="http://h:1")
    assert cfg.url == "http://h:1/v1" and cfg.metrics == ["http://h:1/metrics"]


def test_config_travels_through_the_environment():
    cfg = chat.ChatConfig(
        url="http://a:1/v1",
        metrics=["http://b:2/metrics", "http://c:3/metrics"],
        model="m",
        max_tokens=64,
        temperature=0.0,
        refresh_s=0.5,
        label="runs/x/05_assemble_config",
    )
    assert chat.ChatConfig.from_env(cfg.to_env()) == cfg
    # a reply is capped unless asked otherwise; None (--max-tokens 0) travels as "no cap"
    default = chat.ChatConfig(url="http://a:1")
    assert default.max_tokens == chat.DEFAULT_MAX_TOKENS == 512
    assert chat.ChatConfig.from_env(default.to_env()).max_tokens == 512
    uncapped = chat.ChatConfig(url="http://a:1", max_tokens=None, dummy_weights=True)
    assert chat.ChatConfig.from_env(uncapped.to_env()) == uncapped
    with pytest.raises(RuntimeError, match="TUNEBOOK_CHAT_URL"):
        chat.ChatConfig.from_env({})


def test_a_reply_is_capped_by_default_and_the_pages_setting_changes_the_cap():
    cfg = chat.ChatConfig(url="http://a:1")
    msgs = [{"role": "user", "content": "hi"}]
    assert chat.request_body(cfg, "m", msgs)["max_tokens"] == 512
    assert chat.request_body(cfg, "m", msgs, max_tokens=64)["max_tokens"] == 64
    assert "max_tokens" not in chat.request_body(cfg, "m", msgs, max_tokens=0)  # none: the server's
    assert "max_tokens" not in chat.request_body(
        chat.ChatConfig(url="a", max_tokens=None), "m", msgs
    )
    assert chat.panel_props(cfg, None)["max_tokens"] == 512


def test_the_models_text_is_shown_as_text_not_markdown():
    """Random text from dummy weights is full of ~~, ** and # : escaped, none of it formats.
    Streamed piece by piece it escapes as the whole text does."""
    text = "~~struck~~ **bold** <b>x</b> 1. item\n# head\n    code? `tick` $x$ 你好，世界。"
    whole = chat.escape_markdown(text)
    esc = chat.Escaper()
    assert "".join(esc.feed(text[i : i + 3]) for i in range(0, len(text), 3)) == whole
    assert whole.startswith(r"\~\~struck\~\~ \*\*bold\*\* \<b\>x\<\/b\> 1\. item  ")
    assert "  \n\\# head  \n\u00a0\u00a0\u00a0\u00a0code\\?" in whole  # no heading, no code block
    assert whole.endswith(r"\`tick\` \$x\$ 你好，世界。")
    # unescaped, the page would show the text again: every escape is one backslash
    assert whole.replace("\\", "").replace("  \n", "\n").replace("\u00a0", " ") == text


def test_dummy_weights_are_told_from_the_deployment_and_the_model_folder(tmp_path):
    empty = tmp_path / "tiny"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    real = tmp_path / "real"
    real.mkdir()
    (real / "model.safetensors").write_bytes(b"")
    assert chat.has_weights(empty) is False and chat.has_weights(real) is True
    assert chat.has_weights("baidu/ERNIE-4.5-0.3B-PT") is None  # a hub name: unknown
    assert chat.dummy_weights({"model": str(real), "load-format": "dummy"})
    assert chat.dummy_weights({"model": str(empty)})
    assert chat.dummy_weights({"model": "tiny"}, here=tmp_path)  # relative to the folder
    assert not chat.dummy_weights({"model": str(real)})
    assert not chat.dummy_weights({"model": "baidu/ERNIE-4.5-0.3B-PT"})
    props = chat.panel_props(chat.ChatConfig(url="http://a:1", dummy_weights=True), None)
    assert props["notice"] == chat.DUMMY_NOTICE and "random text by design" in props["notice"]
    assert chat.panel_props(chat.ChatConfig(url="http://a:1"), None)["notice"] == ""


def test_a_port_whose_server_just_stopped_can_be_listened_on_again():
    """A server that has just stopped leaves its connections in TIME_WAIT: vLLM (uvicorn) binds
    with SO_REUSEADDR and gets the port; so does the chat's check, which then keeps it."""
    import socket

    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    assert not chat.can_listen(port)  # listening: taken
    cli = socket.create_connection(("127.0.0.1", port))
    conn, _ = srv.accept()
    conn.close()  # the server side closes first: its end waits in TIME_WAIT
    cli.close()
    srv.close()
    assert not vllm_http.port_free(port)  # a bind without SO_REUSEADDR: "taken" (the old check)
    assert chat.can_listen(port)


PROM = r"""
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny ernie, {x}"} 2.0
vllm:num_requests_running{engine="1",model_name="tiny ernie, {x}"} 1.0
vllm:num_requests_waiting{engine="0",model_name="a\"b\\c"} 3.0
vllm:kv_cache_usage_perc{engine="0"} 0.5
vllm:kv_cache_usage_perc{engine="1"} 0.25
vllm:prefix_cache_queries_total{engine="0"} 200.0
vllm:prefix_cache_hits_total{engine="0"} 50.0
vllm:prefix_cache_queries_created{engine="0"} 1.7e9
vllm:request_success_total{engine="0",finished_reason="stop"} 3.0
vllm:request_success_total{engine="0",finished_reason="length"} 1.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf"} 4.0
vllm:e2e_request_latency_seconds_sum{engine="0"} 2.0
vllm:e2e_request_latency_seconds_count{engine="0"} 4.0
vllm:generation_tokens_total{engine="0"} 640.0
process_cpu_seconds_total 12.5 1700000000000
vllm:broken{engine="0" 1.0
nonsense line
python_info{version="3.11"} NaN
"""


def test_parse_prometheus_reads_labels_escapes_and_skips_garbage():
    samples = vllm_http.parse_samples(PROM)
    names = [n for n, _, _ in samples]
    assert "vllm:broken" not in names and "nonsense" not in names
    running = [(lab, v) for n, lab, v in samples if n == "vllm:num_requests_running"]
    assert running[0] == ({"engine": "0", "model_name": "tiny ernie, {x}"}, 2.0)
    waiting = next(lab for n, lab, _ in samples if n == "vllm:num_requests_waiting")
    assert waiting["model_name"] == 'a"b\\c'
    assert ("process_cpu_seconds_total", {}, 12.5) in samples  # a timestamp after the value
    assert any(n == "python_info" for n in names)  # NaN is a value


def test_server_state_adds_up_engines():
    st = chat.server_state(vllm_http.parse_samples(PROM), t=10.0)
    assert st.running == 3 and st.waiting == 3 and st.engines == 2
    assert st.kv_cache_usage == pytest.approx(0.375)  # mean over engines, a fraction
    assert (st.prefix_hits, st.prefix_queries, st.prefix_hit_rate) == (50, 200, 0.25)
    assert st.requests_done == 4 and (st.e2e_sum, st.e2e_count) == (2.0, 4.0)
    assert st.generation_tokens == 640
    assert chat.server_state(vllm_http.parse_samples("http_requests_total 3\n")) is None
    assert chat.ServerState(t=0, prefix_hits=0, prefix_queries=0).prefix_hit_rate is None


def test_window_rates_and_a_restart():
    old = chat.ServerState(
        t=0.0,
        prefix_hits=10,
        prefix_queries=100,
        requests_done=2,
        e2e_sum=1.0,
        e2e_count=2,
        generation_tokens=100,
    )
    new = chat.ServerState(
        t=10.0,
        prefix_hits=70,
        prefix_queries=200,
        requests_done=7,
        e2e_sum=6.0,
        e2e_count=7,
        generation_tokens=600,
    )
    r = chat.window_rates(old, new)
    assert r == {"qps": 0.5, "latency_s": 1.0, "gen_tok_s": 50.0, "hit_rate": 0.6}
    assert not chat.restarted(old, new) and chat.restarted(new, old)
    assert set(chat.window_rates(new, old).values()) == {None}  # counters went down: no rates
    idle = chat.window_rates(new, chat.ServerState(**{**new.__dict__, "t": 20.0}))
    assert idle["qps"] == 0 and idle["latency_s"] is None and idle["hit_rate"] is None


def test_panel_rows_show_dashes_for_unknowns():
    st = chat.server_state(vllm_http.parse_samples(PROM))
    rows = {r["key"]: r["value"] for r in chat.panel_rows(st, {}, 30)}
    assert rows["running"] == "3" and rows["waiting"] == "3"
    assert rows["kv_cache"] == "37.5 %"
    assert rows["prefix_hit_rate"] == "25.0 % (50 of 200 tokens)"
    assert rows["qps"] == rows["latency"] == rows["prefix_hit_rate_recent"] == "–"
    assert rows["engines"] == "2"
    props = chat.panel_props(chat.ChatConfig(url="http://h:1"), None, status="unreachable")
    assert props["rows"] == [] and props["status"] == "unreachable"


def test_reply_stats():
    s = chat.ReplyStats(t0=100.0)
    for t in (100.2, 100.3, 100.4, 100.6):
        s.on_text(t)
    assert s.ttft_s == pytest.approx(0.2) and s.tokens == 4
    assert s.tok_s == pytest.approx(3 / 0.4)  # tokens after the first over first..last
    s.on_usage({"prompt_tokens": 19, "completion_tokens": 9})  # the server's count wins
    assert s.tokens == 9 and s.tok_s == pytest.approx(8 / 0.4)
    s.finish_reason = "length"
    assert s.line() == (
        "TTFT 200 ms · 9 tokens · 20.0 tok/s · prompt 19 tokens · stopped at the token limit"
    )
    one = chat.ReplyStats(t0=0.0)
    one.on_text(0.1)
    assert one.tok_s is None and one.line() == "TTFT 100 ms · 1 token"


def test_sse_lines_and_error_bodies():
    assert vllm_http.sse_data('data: {"a": 1}') == {"a": 1}
    assert vllm_http.sse_data("data: [DONE]") is vllm_http.DONE
    assert vllm_http.sse_data(": keep-alive") is None and vllm_http.sse_data("") is None
    assert chat.error_text({"error": {"message": "boom"}}) == "boom"
    assert chat.error_text({"object": "error", "message": "bad"}) == "bad"
    assert chat.error_text({"choices": []}) is None
    # vLLM 0.32's own wording for the three refusals
    e = chat.http_error(
        400,
        b'{"error": {"message": "This model\'s maximum context length is 512 tokens. However, '
        b'your prompt contains at least 513 input tokens", "code": 400}}',
    )
    assert e.kind == "too_long" and e.detail.startswith("This model's maximum context length")
    e = chat.http_error(400, '{"error": {"message": "max_tokens=1000 cannot be greater than '
                        'max_model_len=512. Please request fewer output tokens."}}')  # fmt: skip
    assert e.kind == "max_tokens"
    assert chat.http_error(
        404, b'{"error": {"message": "The model `x` does not exist."}}'
    ).kind == ("http")
    assert chat.http_error(502, b"<html>bad gateway</html>").detail.startswith("HTTP 502: <html>")


def test_explain_says_what_happened_and_what_to_do():
    cfg = chat.ChatConfig(url="http://h:9/v1")
    say = {
        k: chat.explain(chat.ChatError(k, "detail", "partial"), cfg)
        for k in ("no_server", "too_long", "max_tokens", "interrupted", "timeout", "http")
    }
    assert "No server answers at http://h:9/v1" in say["no_server"]
    assert "send your message again" in say["no_server"]
    assert "longer than the model's context" in say["too_long"] and "new chat" in say["too_long"]
    assert "--max-tokens" in say["max_tokens"]
    assert (
        "stopped in the middle of this reply" in say["interrupted"]
        and "7 characters" in say["interrupted"]
    )
    assert "within 300 s" in say["timeout"] and "detail" in say["http"]


# --------------------------------------------------------------------------- client vs scripted server
def _run(coro):
    return asyncio.run(coro)


async def _stream(base: str, messages: list[dict], **extra) -> tuple[str, chat.ReplyStats]:
    import httpx

    stats = chat.ReplyStats()
    got = []
    async with httpx.AsyncClient(timeout=30) as c:
        body = {"model": FakeServer.MODEL, "messages": messages, **extra}
        async for piece in chat.stream_chat(c, base, body, stats):
            got.append(piece)
    return "".join(got), stats


def test_stream_chat_streams_chinese_and_counts(fake):
    text, stats = _run(_stream(fake.url, [{"role": "user", "content": "你好"}]))
    assert text == "你好，这是一个流式回答。"
    assert stats.chunks == 7 and stats.tokens == 7 and stats.prompt_tokens == 2
    assert stats.finish_reason == "stop" and stats.ttft_s > 0 and stats.tok_s > 0
    assert stats.last - stats.first >= 6 * fake.delay_s * 0.9  # pieces came one by one
    sent = fake.requests[-1]
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}


def test_stream_chat_errors(fake):
    fake.mode = "die"
    with pytest.raises(chat.ChatError) as e:
        _run(_stream(fake.url, [{"role": "user", "content": "hi"}]))
    assert e.value.kind == "interrupted" and e.value.partial == "你好，这是"
    fake.mode = "ok"
    with pytest.raises(chat.ChatError) as e:
        _run(_stream(fake.url, [{"role": "user", "content": "长" * 3000}]))
    assert e.value.kind == "too_long" and "maximum context length is 512" in e.value.detail
    with pytest.raises(chat.ChatError) as e:
        _run(_stream(f"http://127.0.0.1:{_closed_port()}/v1", [{"role": "user", "content": "hi"}]))
    assert e.value.kind == "no_server"


@pytest.mark.slow
def test_monitor_follows_the_server_down_and_back(fake):
    import httpx

    async def go():
        cfg = chat.ChatConfig(url=fake.url, window_s=30)
        async with httpx.AsyncClient() as c:
            mon = chat.Monitor(cfg, c)
            first = await mon.poll()
            await _stream(fake.url, [{"role": "user", "content": "hi"}])
            second = await mon.poll()
            port = fake.port
            fake.stop()
            down = await mon.poll()
            fake.port = port
            fake.start()
            back = await mon.poll()
        return first, second, down, back

    first, second, down, back = _run(go())
    assert first["status"] == "ok" and first["model"] == FakeServer.MODEL
    rows = {r["key"]: r["value"] for r in second["rows"]}
    assert rows["kv_cache"] == "25.0 %" and rows["prefix_hit_rate"].startswith("40.0 %")
    assert rows["qps"] != "–" and rows["latency"] == "0.50 s"
    assert down["status"] == "unreachable" and "No answer from" in down["message"]
    assert down["rows"] == []
    assert back["status"] == "ok" and back["rows"]


def test_monitor_says_when_an_endpoint_has_no_vllm_metrics(fake):
    import httpx

    async def go():
        cfg = chat.ChatConfig(url=fake.url, metrics=[fake.url.replace("/v1", "/health")])
        async with httpx.AsyncClient() as c:
            return await chat.Monitor(cfg, c).poll()

    props = _run(go())
    assert props["status"] == "no_metrics" and "--metrics" in props["message"]


# --------------------------------------------------------------------------- the command's checks
class ChatCommand:
    """``python -m tunebook.chat ...`` in its own session, its output in a file; remembers every
    process it starts, to check afterwards that none is left."""

    def __init__(self, args: list[str], log: Path):
        self.log = log
        self._out = open(log, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tunebook.chat", *args],
            stdout=self._out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
        self.seen: set[int] = set()

    def output(self) -> str:
        if not self._out.closed:
            self._out.flush()
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            self.note_children()
            if m := re.search(pattern, self.output()):
                return m
            assert self.proc.poll() is None, f"tunebook.chat exited:\n{self.output()}"
            time.sleep(0.5)
        raise TimeoutError(f"no {pattern!r} within {timeout_s:g} s:\n{self.output()}")

    def note_children(self) -> None:
        try:
            self.seen |= {c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass

    def stop(self, timeout_s: float = 90) -> tuple[int | None, list[int]]:
        """SIGTERM, as a service manager stops it; returns its exit code and what is left."""
        self.note_children()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        end = time.monotonic() + 10
        while (left := _alive(self.seen)) and time.monotonic() < end:
            time.sleep(0.2)
        for pid in left:  # never leave them running, but report them: the test fails
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._out.close()
        return self.proc.returncode, left


def _alive(pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def test_main_checks_its_arguments(tmp_path, capsys, monkeypatch):
    with pytest.raises(SystemExit):
        chat.main([])
    with pytest.raises(SystemExit):
        chat.main([str(tmp_path), "--url", "http://h:1/v1"])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert chat.main(["--url", "http://h:1/v1"]) == 2
    assert "pip install --no-deps chainlit==2.12.0" in capsys.readouterr().err
    monkeypatch.undo()
    if importlib.util.find_spec("chainlit") is not None:
        assert chat.main([str(tmp_path), "--log-dir", str(tmp_path / "logs")]) == 2
        assert "no serve.yaml" in capsys.readouterr().err


@pytest.mark.slow
def test_a_running_deployment_is_reused_and_left_running(tmp_path, fake):
    """Given a folder whose deployment already answers on serve.yaml's port, the command starts
    no server, and on SIGTERM stops only the app it started."""
    if importlib.util.find_spec("chainlit") is None:
        pytest.skip(chat.INSTALL_HINT)
    folder = tmp_path / "05_assemble_config"
    folder.mkdir()
    yml = f"model: /nowhere/fake\nserved-model-name: {FakeServer.MODEL}\nport: {fake.port}\n"
    (folder / "serve.yaml").write_text(yml)
    cmd = ChatCommand(
        [str(folder), "--port", str(vllm_http.free_port()), "--log-dir", str(tmp_path / "logs")],
        tmp_path / "chat.out",
    )
    try:
        cmd.wait_for(r"\[chat\] open http://", PAGE_S)
    finally:
        code, left = cmd.stop()
    out = cmd.output()
    assert f"using the server already running at http://127.0.0.1:{fake.port}" in out, out
    assert "starting vllm serve" not in out and "server stopped" not in out, out
    assert code == 0 and not left, (code, left, out)
    assert chat._answers(f"http://127.0.0.1:{fake.port}/health")  # not ours to stop


# --------------------------------------------------------------------------- Ctrl-C at each phase
# A stand-in for `vllm serve --config <yaml> --host h --port p`: answers /health, /v1/models and
# /metrics at once, so that each start phase is reached in seconds, without an engine.
FAKE_VLLM = """
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port = int(sys.argv[sys.argv.index("--port") + 1])
models = json.dumps({"data": [{"id": "fake", "root": "/nowhere"}]}).encode()


class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        body = {"/health": b"", "/v1/models": models, "/metrics": b""}.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Length", str(len(body or b"")))
        self.end_headers()
        self.wfile.write(body or b"")


ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"""


@pytest.mark.slow
@pytest.mark.parametrize("phase", chat.START_PHASES)
def test_ctrl_c_at_each_start_phase_stops_everything_it_started(
    phase, tmp_path, monkeypatch, capsys
):
    """Ctrl-C (SIGINT to the command, as its terminal sends it) at each moment of the start:
    the server spawned, healthy, the app spawned, answering (the second Chainlit says it is
    available: the app used to be left running in its own session, still serving) and running.
    The command exits 0 and no process it started is left, the server's and the app's groups
    included."""
    if importlib.util.find_spec("chainlit") is None and phase.startswith(("app", "serving")):
        pytest.skip(chat.INSTALL_HINT)
    from tunebook.engine.isolation import group_alive

    # What SIGINT did before (the default, or ignored where the test run was started in the
    # background): the command must put that back.
    handler_before = signal.getsignal(signal.SIGINT)
    script = tmp_path / "fake_vllm.py"
    script.write_text(FAKE_VLLM)
    monkeypatch.setattr(
        chat.flags, "vllm_command", lambda config, *extra: [sys.executable, str(script), *extra]
    )
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())  # "chainlit is there"
    spawned: list[tuple[str, int]] = []
    real_spawn = chat._spawn

    def spawn(cmd, log_path, env, on_spawn, cwd=None):
        proc = real_spawn(cmd, log_path, env, on_spawn, cwd)
        spawned.append((log_path.name, proc.pid))
        return proc

    monkeypatch.setattr(chat, "_spawn", spawn)
    monkeypatch.setenv(SIGNAL_AT_ENV, phase)
    folder = tmp_path / "05_assemble_config"
    folder.mkdir()
    # serve.yaml's port is taken by another program: the server starts on another, said once
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    asked = taken.getsockname()[1]
    (folder / "serve.yaml").write_text(
        f"model: /nowhere/fake\nserved-model-name: fake\nport: {asked}\n"
    )
    app_port = vllm_http.free_port()
    try:
        code = chat.main(
            [
                str(folder),
                "--port",
                str(app_port),
                "--log-dir",
                str(tmp_path / "logs"),
                "--timeout",
                "60",
            ]
        )
    finally:
        taken.close()
        left = [(name, pid) for name, pid in spawned if group_alive(pid)]
        for _, pid in left:  # never leave them running, but report them: the test fails
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    out = capsys.readouterr().out
    assert code == 0, out
    assert not left, f"left running after Ctrl-C at {phase}: {left}\n{out}"
    want = {
        "server_spawned": 1,
        "server_healthy": 1,
        "app_spawned": 2,
        "app_ready": 2,
        "serving": 2,
    }
    assert [n for n, _ in spawned] == ["serve.log", "chat.log"][: want[phase]], spawned
    assert "[chat] server stopped:" in out, out
    assert re.search(
        rf"\[chat\] port {asked} is taken \(.*\): its server starts on port \d+ instead", out
    )
    assert out.count(f"port {asked} is taken") == 1
    if phase in ("app_ready", "serving"):
        assert not chat._answers(f"http://127.0.0.1:{app_port}/")  # the app no longer serves
    assert signal.getsignal(signal.SIGINT) == handler_before  # put back


def test_the_panel_jsx_is_packaged():
    assert chat.PANEL_JSX.is_file() and "data-metric" in chat.PANEL_JSX.read_text()
    assert chat.APP_FILE.is_file()


# --------------------------------------------------------------------------- a real vLLM
def _deployment(out: Path) -> Path:
    choice = assemble.choose(
        [], "high_concurrency_chat", {"ttft_ms": 5000.0, "tpot_ms": 500.0}, SETTINGS
    )
    kwargs = flags.deploy_kwargs("tiny-ernie", choice["settings"])
    writers.write_config(out, choice, kwargs, env=ENV, served_model_name="tiny-ernie")
    return out


@pytest.mark.engine
def test_stream_against_vllm_errors_and_a_killed_server(tmp_path):
    import httpx

    config = _deployment(tmp_path / "05_assemble_config") / "serve.yaml"
    proc, root = chat.start_server(
        config, vllm_http.free_port(), tmp_path / "serve.log", SERVER_START_S, out=lambda s: None
    )
    base = root + "/v1"

    async def go():
        out = {}
        async with httpx.AsyncClient(timeout=120) as c:
            models = await chat.list_models(c, base)
            out["models"] = models
            msgs = [{"role": "user", "content": chat.ARTICLE_PROMPTS[0]}]
            stats = chat.ReplyStats()
            body = {"model": "tiny-ernie", "messages": msgs, "max_tokens": 24}
            out["text"] = "".join([p async for p in chat.stream_chat(c, base, body, stats)])
            out["stats"] = stats
            out["panel"] = await chat.Monitor(chat.ChatConfig(url=base), c).poll()
            for name, body in {
                "too_long": {"messages": [{"role": "user", "content": "长 " * 600}]},
                "max_tokens": {"messages": msgs, "max_tokens": 100_000},
            }.items():
                try:
                    body = {"model": "tiny-ernie", **body}
                    async for _ in chat.stream_chat(c, base, body, chat.ReplyStats()):
                        pass
                except chat.ChatError as e:
                    out[name] = e
            # Killed in the middle of a long reply (ignore_eos: no early stop).
            body = {"model": "tiny-ernie", "messages": msgs, "max_tokens": 400, "ignore_eos": True}
            n = 0
            try:
                async for _ in chat.stream_chat(c, base, body, chat.ReplyStats()):
                    n += 1
                    if n == 5:
                        os.killpg(proc.pid, signal.SIGKILL)
            except chat.ChatError as e:
                out["killed"] = e
            proc.wait(timeout=30)
            try:
                await chat.list_models(c, base)
            except chat.ChatError as e:
                out["gone"] = e
            out["panel_down"] = await chat.Monitor(chat.ChatConfig(url=base), c).poll()
        return out

    try:
        out = _run(go())
    finally:
        serve.stop(proc)
    assert out["models"][0]["id"] == "tiny-ernie" and out["models"][0]["max_model_len"] == 512
    st = out["stats"]
    assert out["text"] and st.tokens == 24 and st.prompt_tokens > 0 and st.ttft_s > 0
    assert st.finish_reason == "length"
    rows = {r["key"]: r["value"] for r in out["panel"]["rows"]}
    assert out["panel"]["status"] == "ok" and out["panel"]["model"] == "tiny-ernie"
    assert rows["running"] == "0" and rows["waiting"] == "0"
    assert re.fullmatch(r"\d+\.\d %", rows["kv_cache"])
    assert re.match(r"\d+\.\d % \(\d+ of \d+ tokens\)", rows["prefix_hit_rate"])
    assert out["too_long"].kind == "too_long"
    assert "maximum context length is 512" in out["too_long"].detail
    assert out["max_tokens"].kind == "max_tokens"
    assert out["killed"].kind == "interrupted" and out["killed"].partial
    assert out["gone"].kind == "no_server"
    assert out["panel_down"]["status"] == "unreachable"
    assert not psutil.pid_exists(proc.pid) or psutil.Process(proc.pid).status() == "zombie"


# --------------------------------------------------------------------------- in the browser
def _open_page(pw, url: str):
    browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    page = browser.new_page(viewport={"width": 1400, "height": 950})
    # Chainlit's page links web fonts and KaTeX from CDNs: only the app itself is fetched, so
    # the test does not depend on (or wait for) the internet.
    page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(url) else r.abort())
    page.goto(url, wait_until="domcontentloaded")
    return browser, page


WATCH_JS = """() => {
  // Every distinct text the last assistant message shows while it streams.
  window.__seen = [];
  const note = () => {
    const all = document.querySelectorAll('[data-step-type="assistant_message"]');
    if (!all.length) return;
    const t = all[all.length - 1].innerText;
    if (window.__seen[window.__seen.length - 1] !== t) window.__seen.push(t);
  };
  new MutationObserver(note).observe(document.body,
    {subtree: true, childList: true, characterData: true});
}"""


def _send(page, text: str) -> None:
    box = page.locator("#chat-input")
    box.click()
    if text.isascii() or len(text) > 200:
        box.fill(text)
    else:
        page.keyboard.type(text)  # typed key by key, as a user types Chinese
    page.keyboard.press("Enter")


def _assistant(page):
    return page.locator('[data-step-type="assistant_message"]')


def _metric(page, key: str):
    return page.locator(f'.tunebook-server-state tr[data-metric="{key}"] td').nth(1)


def _screenshot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name))


@pytest.mark.browser
@pytest.mark.engine
def test_chat_with_the_assembled_deployment_in_a_browser(tmp_path):
    _browser_requirements()
    from playwright.sync_api import expect, sync_playwright

    folder = _deployment(tmp_path / "runs" / "chat-test" / "05_assemble_config")
    port = vllm_http.free_port()
    # A free --server-port: on a shared machine another tiny-ernie server may answer on 8000,
    # and the command would rightly use it instead of starting (and stopping) its own.
    cmd = ChatCommand(
        [str(folder), "--port", str(port), "--max-tokens", "48", "--refresh", "1"]
        + ["--server-port", str(vllm_http.free_port()), "--log-dir", str(tmp_path / "logs")],
        tmp_path / "chat.out",
    )
    code, left = None, []
    try:
        cmd.wait_for(r"\[chat\] open http://", SERVER_START_S)
        server = re.search(r"server (http://127\.0\.0\.1:\d+/v1)", cmd.output()).group(1)
        url = f"http://127.0.0.1:{port}"
        with sync_playwright() as pw:
            browser, page = _open_page(pw, url)
            try:
                panel = page.locator('.tunebook-server-state[data-status="ok"]')
                expect(panel).to_be_visible(timeout=PAGE_S * 1000)
                expect(page.locator("#side-view-title")).to_contain_text("vLLM server")
                expect(panel.locator(".tunebook-server-url")).to_have_text(server)
                expect(panel.locator(".tunebook-server-model")).to_contain_text("tiny-ernie")
                for p in chat.ARTICLE_PROMPTS:  # the article's prompts are offered as starters
                    expect(page.get_by_text(p)).to_be_visible()

                page.evaluate(WATCH_JS)
                prompt = chat.ARTICLE_PROMPTS[0]
                _send(page, prompt)
                expect(page.locator('[data-step-type="user_message"]')).to_contain_text(prompt)
                reply = _assistant(page).last
                expect(reply).to_contain_text(
                    re.compile(r"TTFT \d+ ms · 48 tokens"), timeout=120_000
                )
                expect(reply).to_contain_text(re.compile(r"\d+\.\d tok/s · prompt \d+ tokens"))
                seen = page.evaluate("window.__seen")
                partial = [s for s in seen if s.strip() and "TTFT" not in s]
                assert len(partial) >= 3, seen  # the reply grew in the page, piece by piece

                # The panel: vLLM's own figures after one request.
                expect(_metric(page, "running")).to_have_text("0", timeout=10_000)
                expect(_metric(page, "waiting")).to_have_text("0")
                expect(_metric(page, "kv_cache")).to_have_text(re.compile(r"^\d+\.\d %$"))
                expect(_metric(page, "prefix_hit_rate")).to_have_text(
                    re.compile(r"^\d+\.\d % \(\d+ of \d+ tokens\)$"), timeout=10_000
                )
                expect(_metric(page, "qps")).to_have_text(re.compile(r"^\d+\.\d\d$"))
                expect(_metric(page, "latency")).to_have_text(re.compile(r"^\d+\.\d\d s$"))
                _screenshot(page, "chat.png")

                # Longer than the context (max_model_len 512): vLLM refuses, the page says why.
                _send(page, "长 " * 600)
                err = page.get_by_text("This conversation is longer than the model's context")
                expect(err).to_be_visible(timeout=60_000)
                expect(
                    page.get_by_text(re.compile("maximum context length is 512"))
                ).to_be_visible()
                _screenshot(page, "chat-too-long.png")
            except Exception:
                _screenshot(page, "chat-failure.png")
                raise
            finally:
                browser.close()
    finally:
        code, left = cmd.stop()
    out = cmd.output()
    assert code == 0, out
    assert "server stopped: clean" in out, out
    assert not left, f"processes left after tunebook.chat stopped: {left}\n{out}"
    assert cmd.seen, "no child process was seen"
    held = [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if str(folder) in " ".join(p.info["cmdline"] or [])
    ]
    assert not held, held


@pytest.mark.browser
def test_chat_errors_and_recovery_in_a_browser(tmp_path, fake):
    """A scripted server dies mid-reply, goes away, comes back: the page says what happened each
    time and the conversation carries on; the page itself drops off and reconnects (no engine:
    the failures are made to order)."""
    _browser_requirements()
    from playwright.sync_api import expect, sync_playwright

    port = vllm_http.free_port()
    cmd = ChatCommand(
        ["--url", fake.url, "--port", str(port), "--refresh", "0.5"]
        + ["--log-dir", str(tmp_path / "logs")],
        tmp_path / "chat.out",
    )
    code, left = None, []
    try:
        cmd.wait_for(r"\[chat\] open http://", PAGE_S)
        with sync_playwright() as pw:
            browser, page = _open_page(pw, f"http://127.0.0.1:{port}")
            try:
                panel = page.locator(".tunebook-server-state")
                expect(panel).to_have_attribute("data-status", "ok", timeout=PAGE_S * 1000)
                expect(_metric(page, "kv_cache")).to_have_text("25.0 %")

                fake.mode = "die"
                _send(page, "讲一个故事")
                expect(
                    page.get_by_text("The server stopped in the middle of this reply")
                ).to_be_visible(timeout=30_000)
                expect(_assistant(page).first).to_contain_text("你好，这是")
                expect(_assistant(page).first).to_contain_text("(cut off)")

                fake.stop()
                expect(panel).to_have_attribute("data-status", "unreachable", timeout=15_000)
                expect(panel.locator(".tunebook-server-message")).to_contain_text("No answer from")
                _send(page, "还在吗？")
                expect(page.get_by_text(f"No server answers at {fake.url}")).to_be_visible(
                    timeout=30_000
                )
                _screenshot(page, "chat-no-server.png")

                fake.mode = "ok"
                fake.start()  # the same port: the server is back
                expect(panel).to_have_attribute("data-status", "ok", timeout=15_000)
                _send(page, "你好")
                expect(_assistant(page).last).to_contain_text("你好，这是一个流式回答。")
                expect(_assistant(page).last).to_contain_text(
                    re.compile(r"TTFT \d+ ms · 7 tokens · \d+\.\d tok/s"), timeout=30_000
                )
                # Failed turns are not part of the conversation the server sees.
                assert fake.requests[-1]["messages"] == [{"role": "user", "content": "你好"}]
                expect(_metric(page, "qps")).not_to_have_text("–", timeout=10_000)
                _screenshot(page, "chat-recovered.png")

                # The page loses its connection and gets it back (a laptop waking up): the panel
                # pauses while it is away and refreshes again once it has reconnected.
                page.context.set_offline(True)
                time.sleep(3)
                page.context.set_offline(False)
                updated = panel.locator(".tunebook-server-updated")
                before = updated.inner_text()
                expect(updated).not_to_have_text(before, timeout=60_000)
                expect(panel).to_have_attribute("data-status", "ok")
            except Exception:
                _screenshot(page, "chat-errors-failure.png")
                raise
            finally:
                browser.close()
    finally:
        code, left = cmd.stop()
    assert code == 0, cmd.output()
    assert not left, f"processes left after tunebook.chat stopped: {left}"


STARTER_FONTS_JS = """(text) => {
  // the innermost element showing the starter's text, marked for the DevTools protocol
  const all = [...document.querySelectorAll('body *')].filter(e => e.textContent.trim() === text);
  const el = all[all.length - 1];
  el.setAttribute('data-tb-starter', '1');
  return getComputedStyle(el).fontFamily;
}"""


def _platform_fonts(page, selector: str) -> list[dict]:
    """The fonts Chromium drew a node's text with, and how many glyphs each drew (DevTools
    protocol, CSS.getPlatformFontsForNode): tofu boxes are drawn with no CJK font at all."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("DOM.enable")
    cdp.send("CSS.enable")
    root = cdp.send("DOM.getDocument", {"depth": -1})["root"]["nodeId"]
    node = cdp.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
    return cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]


@pytest.mark.browser
def test_starters_are_glyphs_replies_are_text_capped_and_dummy_weights_are_said(tmp_path, fake):
    """The page a newcomer sees: the article's Chinese starters drawn with a CJK font (CI
    installs fonts-noto-cjk; without it they were boxes), a banner saying the model has dummy
    weights, a reply capped at 512 tokens unless the settings say otherwise, and the model's
    ~~ and ** shown as characters, not as strike-through and bold (no engine: a scripted
    server)."""
    _browser_requirements()
    from playwright.sync_api import expect, sync_playwright

    weights = tmp_path / "tiny-model"  # a model folder without weights, as the cpu profile's
    weights.mkdir()
    (weights / "config.json").write_text("{}")
    fake.root = str(weights)
    port = vllm_http.free_port()
    cmd = ChatCommand(
        ["--url", fake.url, "--port", str(port), "--refresh", "0.5"]
        + ["--log-dir", str(tmp_path / "logs")],
        tmp_path / "chat.out",
    )
    code, left = None, []
    try:
        cmd.wait_for(r"\[chat\] open http://", PAGE_S)
        assert (
            "dummy weights" in cmd.output() and "reply cap (max_tokens): 512 tokens" in cmd.output()
        )
        with sync_playwright() as pw:
            browser, page = _open_page(pw, f"http://127.0.0.1:{port}")
            try:
                banner = page.locator(".tunebook-dummy-weights")
                expect(banner).to_be_visible(timeout=PAGE_S * 1000)
                expect(banner).to_contain_text("random text by design")
                prompt = chat.ARTICLE_PROMPTS[0]
                expect(page.get_by_text(prompt)).to_be_visible()
                page.evaluate(STARTER_FONTS_JS, prompt)
                fonts = _platform_fonts(page, "[data-tb-starter]")
                cjk = [f for f in fonts if "CJK" in f["familyName"]]
                hanzi = sum(1 for ch in prompt if "\u4e00" <= ch <= "\u9fff")
                assert cjk and sum(f["glyphCount"] for f in cjk) >= hanzi, fonts
                print(f"starter fonts: {fonts}")
                _screenshot(page, "chat-starters.png")

                # a reply full of Markdown marks, capped at 512 by default
                fake.reply = ["~~删", "除~~ ", "**粗", "体** ", "<b>x</b> ", "# 标题"]
                _send(page, "你好")
                reply = _assistant(page).last
                expect(reply).to_contain_text("~~删除~~ **粗体** <b>x</b> # 标题", timeout=30_000)
                expect(reply).to_contain_text("dummy weights: random text by design")
                assert reply.locator("del, s, strong, b, h1").count() == 0
                assert fake.requests[-1]["max_tokens"] == 512

                # the settings change the cap of this chat: Home (0) then four steps of 16
                page.locator("#chat-settings-open-modal").click()
                slider = page.get_by_role("slider")
                expect(slider).to_have_count(1)
                slider.focus()
                page.keyboard.press("Home")
                for _ in range(4):
                    page.keyboard.press("ArrowRight")
                page.locator("#confirm").click()
                # The first reply also holds "标题": wait for the second request, not the text.
                sent = len(fake.requests)
                _send(page, "再来")
                deadline = time.monotonic() + 30
                while len(fake.requests) == sent and time.monotonic() < deadline:
                    page.wait_for_timeout(100)
                assert len(fake.requests) == sent + 1, "the second message never reached the server"
                assert fake.requests[-1]["max_tokens"] == 64
                assert fake.requests[-1]["messages"][1]["content"] == (  # the history: raw text
                    "~~删除~~ **粗体** <b>x</b> # 标题"
                )
                _screenshot(page, "chat-text-not-markdown.png")
            except Exception:
                _screenshot(page, "chat-page-failure.png")
                raise
            finally:
                browser.close()
    finally:
        code, left = cmd.stop()
    assert code == 0, cmd.output()
    assert not left, f"processes left after tunebook.chat stopped: {left}"
