"""The one owner of vLLM's HTTP protocol: ports (no server started)."""

from __future__ import annotations

import socket

from tunebook.engine import vllm_http


def test_a_run_of_ports_is_free_end_to_end_and_avoids_what_is_taken():
    p = vllm_http.free_port_run(4, offsets=(1000,))
    assert all(vllm_http.port_free(p + i) for i in (0, 1, 2, 3, 1000))
    # a port bound in the middle of a run: that run is never offered
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        for _ in range(20):
            q = vllm_http.free_port_run(3, avoid=(taken + 5,))
            assert taken not in (q, q + 1, q + 2) and taken + 5 not in (q, q + 1, q + 2)
