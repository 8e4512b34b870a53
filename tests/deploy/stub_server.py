"""An OpenAI-shaped stub server, for tests of the deployment check's own logic (no engine).

In-process: ``stub_server(text)`` answers every request with ``text``; with ``bound``, a
request beyond that many in flight gets 503 at once (a replica at its queue bound), and each
completion takes ``delay_s``; ``keep_alive`` keeps connections open between requests. As a script,
``python stub_server.py --port N [anything ...]`` does the same on port N until killed, with
/health: what a test puts where `vllm serve` or a deployment's start.sh would run.
"""

from __future__ import annotations

import argparse
import http.server
import json
import threading
import time


def _handler(text: str, bound: int | None = None, delay_s: float = 0.0, keep_alive: bool = False):
    lock = threading.Lock()
    in_flight = [0]

    class Handler(http.server.BaseHTTPRequestHandler):
        # HTTP/1.0 closes each connection after its answer; 1.1 keeps it for the next request
        protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

        def log_message(self, *a):
            pass

        def _send(self, body: bytes, kind: str = "application/json"):
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/health":
                self._send(b"")
            else:
                self._send(json.dumps({"data": [{"id": "stub"}]}).encode())

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                full = bound is not None and in_flight[0] >= bound
                in_flight[0] += not full
            if full:
                body = b'{"error": "the queue is full"}'
                self.send_response(503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            try:
                time.sleep(delay_s)
                self._answer(req)
            finally:
                with lock:
                    in_flight[0] -= 1

        def _answer(self, req: dict):
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

    return Handler


def stub_server(
    text: str, bound: int | None = None, delay_s: float = 0.0, keep_alive: bool = False
) -> http.server.ThreadingHTTPServer:
    """A stub on a free port of 127.0.0.1, served from a thread; ``shutdown()`` stops it."""
    srv = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), _handler(text, bound, delay_s, keep_alive)
    )
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--text", default="Paris.")
    args, _ = ap.parse_known_args()
    http.server.ThreadingHTTPServer(("127.0.0.1", args.port), _handler(args.text)).serve_forever()
