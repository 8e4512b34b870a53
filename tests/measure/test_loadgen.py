"""The load generator's own records, against an OpenAI-shaped stub server (no engine)."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "deploy"))
from stub_server import stub_server  # noqa: E402

from tunebook.measure import loadgen  # noqa: E402


def _send(srv, n: int, gap_s: float) -> list[dict]:
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    reqs = [loadgen.ClientRequest(i, "Hello", 4, i * gap_s) for i in range(n)]
    return asyncio.run(loadgen._send_all(url, "stub", "completions", {}, reqs, time.time(), 10.0))


def test_a_request_that_opened_a_connection_records_how_long_that_took():
    # A slow accept (a listen backlog that overflows: the SYN sent again after 1 s) lands in
    # TTFT and in no server metric; connect_ms tells it apart. HTTP/1.0: a connection each.
    srv = stub_server("Paris.")
    try:
        recs = _send(srv, 6, 0.02)
    finally:
        srv.shutdown()
    assert all(not r.get("error") for r in recs), recs
    assert all(0 <= r["connect_ms"] < r["ttft_ms"] for r in recs)
    check = loadgen.client_check(recs, [], 1)
    assert check["new_connections"] == 6 and check["connect_max_ms"] >= check["connect_p99_ms"]


def test_a_reused_connection_records_none():
    srv = stub_server("Paris.", keep_alive=True)
    try:
        recs = _send(srv, 4, 0.1)  # one at a time: each finds the last one's connection idle
    finally:
        srv.shutdown()
    assert all(not r.get("error") for r in recs), recs
    assert "connect_ms" in recs[0]
    assert [r for r in recs[1:] if "connect_ms" in r] == []
    assert loadgen.client_check(recs, [], 1)["new_connections"] == 1


def test_an_idle_connection_is_not_reused_past_the_keepalive(monkeypatch):
    # vLLM's server closes an idle connection after 5 s; the client stops reusing one before
    # (KEEPALIVE_S, 4 s: here 0.2 s, and requests 0.5 s apart), so it never sends on one as
    # it closes.
    monkeypatch.setattr(loadgen, "KEEPALIVE_S", 0.2)
    srv = stub_server("Paris.", keep_alive=True)
    try:
        recs = _send(srv, 3, 0.5)
    finally:
        srv.shutdown()
    assert all(not r.get("error") for r in recs), recs
    assert all("connect_ms" in r for r in recs)  # each one a fresh connection
