"""Process groups: run an engine (or a server) where a crash, a hang or a kill cannot take the
sweep down, and where nothing outlives its point.

A child is started in a new session, so that it and every process it spawns (vLLM's EngineCore,
its workers, an API server's children) form one group that ``kill_group`` kills at once. The child
watches its parent (``watch_parent``): if the sweep itself is killed with SIGKILL, the child kills
its own group, so no engine keeps holding the device.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from tunebook.core.model import GIB
from tunebook.engine.interrupt import PARENT_ENV

# The process whose death a child must not outlive, where that is not the sweep (PARENT_ENV): a
# child forked by tunebook.engine.launcher watches the launcher, its parent.
WATCH_ENV = "TUNEBOOK_WATCH_PID"


# The environment engine processes start from (``base_env``): a notebook's, as its first cell
# found it (``set_base_env``), before the kernel imported vLLM or ran an engine of its own,
# which set variables a `vllm serve` started from a shell would not have (LD_LIBRARY_PATH from
# an OpenCV import, VLLM_DIST_IDENT, LD_PRELOAD on CPU ...). None: the process's own.
_BASE_ENV: dict[str, str] | None = None


def set_base_env(env: dict[str, str]) -> None:
    """Fix the environment engine processes start from, once per process (a notebook run again
    in its kernel keeps the first one: by then the kernel's imports have changed its own)."""
    global _BASE_ENV
    if _BASE_ENV is None:
        _BASE_ENV = dict(env)


def base_env() -> dict[str, str]:
    """What an engine process's environment starts from: ``set_base_env``'s, else this one's."""
    return dict(_BASE_ENV if _BASE_ENV is not None else os.environ)


def process_env(point_env: dict) -> dict[str, str]:
    """The environment of an engine process (an isolated point, a `vllm serve`) and of the
    launcher that forks it: ``base_env`` with the point's own variables."""
    env = {**base_env(), **{k: str(v) for k, v in point_env.items()}}
    env.setdefault("PYTHONUNBUFFERED", "1")
    # A crash in native code (SIGSEGV, SIGABRT ...) then leaves every thread's Python stack in
    # the log instead of nothing; processes forked from a launcher inherit its handler.
    env.setdefault("PYTHONFAULTHANDLER", "1")
    # The attention backend and KV size are read from vLLM's INFO lines: a quieter level set
    # for the notebook's own output must not reach the engine unless the point asks for it.
    env["VLLM_LOGGING_LEVEL"] = str(point_env.get("VLLM_LOGGING_LEVEL", "INFO"))
    return env


def spawn(cmd: list[str], log, env: dict | None = None, **popen) -> subprocess.Popen:
    """Start ``cmd`` in its own session (its own process group), output to ``log``.

    The child learns our pid through PARENT_ENV, so that it can kill its group when we die.
    """
    env = {**(env if env is not None else os.environ), PARENT_ENV: str(os.getpid())}
    return subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, **popen
    )


def kill_group(proc: subprocess.Popen, grace_s: float = 0.0) -> None:
    """Kill the child's whole process group and reap the child.

    With ``grace_s`` the group first gets SIGTERM (a server shuts down cleanly) and SIGKILL only
    if the child has not exited by then; children of the group are killed either way.
    """
    if grace_s > 0 and proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=grace_s)
        except (ProcessLookupError, PermissionError):
            pass
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    # The rest of the group (an engine core, its workers) dies on its own clock once killed:
    # wait for it, so that what it held (device memory, a port) is free for the next start.
    deadline = time.monotonic() + GROUP_EXIT_S
    while group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.02)


# How long kill_group waits for the killed group's last members to be gone.
GROUP_EXIT_S = 5.0


def group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` still runs (zombies, dead but not reaped, do not
    count: they hold no memory and nobody may reap a reparented one)."""
    try:
        pids = [d for d in os.listdir("/proc") if d.isdigit()]
    except OSError:  # no /proc: ask the kernel (zombies count there)
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def wait_or_kill(proc: subprocess.Popen, timeout_s: float | None) -> tuple[int | None, bool]:
    """Wait for the child; return (exit code, timed out). Its group is killed in every case:
    also on KeyboardInterrupt (Ctrl-C of the sweep), which is raised again afterwards."""
    try:
        return proc.wait(timeout=timeout_s), False
    except subprocess.TimeoutExpired:
        return None, True
    finally:
        kill_group(proc)


# Where the kernel counts this machine's (container's) OOM kills: cgroup v2, then v1.
OOM_COUNTERS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")


def oom_kills(paths: tuple[str, ...] = OOM_COUNTERS) -> int | None:
    """How many processes the kernel's OOM killer has killed in this cgroup (None: not known).
    A SIGKILL leaves nothing in the killed process's own log; this counter says whose it was."""
    for path in paths:
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None


# What this machine (container) has in memory: cgroup v2, then v1; and the host's view.
MEMORY_FILES = {
    "v2": (
        "/sys/fs/cgroup/memory.current",
        "/sys/fs/cgroup/memory.peak",
        "/sys/fs/cgroup/memory.max",
    ),
    "v1": (
        "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        "/sys/fs/cgroup/memory/memory.max_usage_in_bytes",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ),
}
MEMINFO = "/proc/meminfo"


def _read_bytes(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def memory_text(files: dict = MEMORY_FILES, meminfo: str = MEMINFO) -> str:
    """This container's memory in one line: the cgroup's use, peak (since it started) and limit,
    and what the host has available. Beside a process that died of a SIGKILL, it says whether
    memory was short (an OOM kill leaves nothing in the killed process's log)."""
    parts = []
    for current, peak, limit in files.values():
        now, top, cap = _read_bytes(current), _read_bytes(peak), _read_bytes(limit)
        if now is None:
            continue
        text = f"cgroup {now / GIB:.1f} GiB in use"
        if top is not None:
            text += f", peak {top / GIB:.1f} GiB"
        # v1 reports "no limit" as a huge number
        text += f", limit {cap / GIB:.1f} GiB" if cap is not None and cap < 2**60 else ", no limit"
        parts.append(text)
        break
    try:
        info = dict(
            (k, int(v.split()[0]))
            for k, _, v in (x.partition(":") for x in Path(meminfo).read_text().splitlines())
            if v.strip()
        )
        parts.append(
            f"host {info['MemAvailable'] * 1024 / GIB:.1f} of {info['MemTotal'] * 1024 / GIB:.1f}"
            " GiB available"
        )
    except (OSError, KeyError, ValueError):
        pass
    return "; ".join(parts) if parts else "memory not known"


def watch_parent(parent_pid: int, tmp_dir: Path | None = None, interval_s: float = 0.5) -> None:
    """Kill this process's whole group once the parent is gone (see the module doc)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval_s)
        if tmp_dir is not None and tmp_dir.name.startswith("tunebook-"):
            import shutil

            shutil.rmtree(tmp_dir, ignore_errors=True)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="tunebook-parent-watch", daemon=True).start()


def watch_parent_from_env(tmp_dir: Path | None = None) -> None:
    """In a child started by ``spawn`` (or forked by a launcher): watch the parent named in the
    environment, if any."""
    parent = os.environ.get(WATCH_ENV) or os.environ.get(PARENT_ENV)
    if parent:
        watch_parent(int(parent), tmp_dir)


def _main(argv: list[str]) -> int:
    """``python -m tunebook.engine.isolation -- cmd ...``: run ``cmd`` in this process group and kill the
    group if the parent that spawned us dies (a program such as ``vllm serve`` cannot watch its
    parent itself). Exits with the command's status."""
    import sys

    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -m tunebook.engine.isolation -- command [args ...]", file=sys.stderr)
        return 2
    watch_parent_from_env()
    child = subprocess.Popen(argv)
    try:
        return child.wait()
    except KeyboardInterrupt:
        child.send_signal(signal.SIGINT)
        return child.wait()


if __name__ == "__main__":
    import sys

    sys.exit(_main(sys.argv[1:]))
