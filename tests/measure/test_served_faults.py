"""Served-mode faults that need no real engine: a replica that stays alive but never becomes
healthy.

The replica's command (``served.Deployment.server_argv``) is replaced by a small Python script
that logs like a server starting, starts a child of its own (as ``vllm serve`` starts its
EngineCore) and then waits forever: either without listening at all, or listening on its port
without ever answering (a server wedged after ``bind``). Everything else is the real path:
``engine.run_point`` of a served point, the isolation wrapper, ``_wait_healthy`` with a short
``start_timeout_s``, and the teardown of the replica's process group.
"""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

from tunebook.engine import launcher
from tunebook.measure import served
from tunebook.measure.execute import run_point

SETTINGS = {"enforce_eager": True, "kv_cache_memory_bytes": 32 << 20, "max_model_len": 512}
LAST_LINE = "fake-serve: still loading weights (shard 7 of 7), never healthy"

FAKE_SERVER = textwrap.dedent(
    f"""
    import socket, subprocess, sys, time

    mode, port = sys.argv[1], int(sys.argv[2])
    print("fake-serve: starting on port", port, flush=True)
    # a child in the same process group, as vllm serve's EngineCore
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    if mode == "silent-port":
        s = socket.socket()
        s.bind(("127.0.0.1", port))
        s.listen()  # connections queue up, nothing ever accepts or answers them
    print("fake-serve: loading weights", flush=True)
    print({LAST_LINE!r}, flush=True)
    time.sleep(600)
    """
)


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes whose process group is ``pgid``."""
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(p.pid) == pgid:
                found.append(p.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return found


@pytest.mark.vllm
@pytest.mark.parametrize("mode", ["no-port", "silent-port"])
def test_a_replica_that_never_becomes_healthy_times_out_with_its_log(tmp_path, monkeypatch, mode):
    """The point fails with a timeout that quotes the replica's last log lines, within about
    ``start_timeout_s``, and nothing of the replica's process group is left."""
    script = tmp_path / "fake_serve.py"
    script.write_text(FAKE_SERVER)
    monkeypatch.setattr(
        served.Deployment,
        "server_argv",
        lambda self, port: [sys.executable, str(script), mode, str(port)],
    )
    spawned = []
    real_spawn = launcher.spawn  # where served starts a replica afresh

    def spawn(cmd, log, env=None, **popen):
        proc = real_spawn(cmd, log, env, **popen)
        spawned.append(proc)
        return proc

    monkeypatch.setattr(launcher, "spawn", spawn)
    point = {
        "point_id": "never-healthy",
        "model": "tiny-ernie",
        "mode": "served",
        "settings": dict(SETTINGS),
        "workload": {"kind": "fixed", "num_requests": 2, "prompt_len": 16, "output_len": 4},
        # spawned: the fake replaces the command line, which a launcher's fork never runs
        "serve": {"start_timeout_s": 3, "launcher": "spawn"},
        "warmup_requests": 0,
    }
    try:
        res = run_point(point, log_path=tmp_path / "logs" / "never-healthy.log")
        # spawn starts a new session: the replica's pid is its group's id
        exited = [proc.poll() is not None for proc in spawned]
        left = [group_members(proc.pid) for proc in spawned]
    finally:
        for proc in spawned:  # last resort, after the check, so that a failure leaves nothing
            served.kill_group(proc)

    assert len(spawned) == 1  # one replica, no router, no client started
    assert res["status"] == "failed"
    err = res["error"]
    assert err.startswith("TimeoutError: replica 0 did not answer /health within 3 s"), err
    assert "last log lines:" in err and err.rstrip().endswith(LAST_LINE), err
    assert "fake-serve: starting on port" in err  # the tail is the log's, in order
    # The point's own 3 s timeout was the one applied (the message says so), not the default
    # 900 s; it waited that long at least (a lower bound: no machine is too fast for it).
    assert res["wall_s"] >= 3, res["wall_s"]
    log = tmp_path / "logs" / "never-healthy" / "replica0.log"
    assert res["log_file"] == str(log) and LAST_LINE in log.read_text()
    assert exited == [True] and left == [[]], left
