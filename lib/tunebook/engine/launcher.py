"""Start `vllm serve` without paying for its imports every time.

A warm `vllm serve` start on an H200 took 47-78 s, 17-30 s of it before the API server's first
log line: Python importing vLLM, torch and the server (13 s on two CPU cores). A served sweep
starts dozens of servers with the same environment. A *launcher* imports vLLM's command line
once and forks one child per server; the child sets its log, argv and working folder and calls
the entrypoint the ``vllm`` script calls (``vllm.entrypoints.cli.main.main``), so it is the
process ``vllm serve ...`` would be, with its imports already done. vLLM itself does the same
when ``LLM`` forks its engine core after importing vLLM. A launcher of the ``engine`` kind does
the same for isolated in-process points: it imports ``tunebook.measure.execute`` and vLLM's ``LLM`` and
``AsyncLLM`` once and runs each point's ``python -m tunebook.measure.execute`` in a forked child.

Part of the second, declared boundary to vLLM (its command line, with ``serve`` and ``served``):
this module imports no vLLM in the sweep's process, only in the launcher.

What stays equal: a launcher serves exactly the environment it was started with (a module may
read a variable while it is imported), so every distinct environment gets its own launcher. The
child starts a new session, as ``isolation.spawn`` does, so ``kill_group`` stops it and its
engine core; it kills that session if the launcher dies, and the launcher exits when the sweep
does, so nothing outlives its point.

Protocol, one JSON object per line: the sweep writes ``{"argv": [...], "log": path, "cwd":
path}`` (and ``"module"`` for ``python -m``) to the launcher's stdin; the launcher answers on its stdout ``{"pid": n}`` (or
``{"error": text}``) and later ``{"exit": pid, "code": n}`` when that child ends (a negative
code: the signal, as in ``subprocess``). Its first line is ``{"ready": import_s}`` or
``{"error": text}``.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tunebook.engine.flags import server_env
from tunebook.engine.host import device_memory_bytes
from tunebook.engine.interrupt import PARENT_ENV
from tunebook.engine.isolation import WATCH_ENV, process_env, spawn, watch_parent

# Imported once in a launcher, by kind. serve: the CLI and what `vllm serve` imports before its
# first log line. engine: what an isolated point's child (`python -m tunebook.measure.execute`) imports
# before its engine starts (vLLM's LLM and AsyncLLM).
PRELOAD = {
    "serve": (
        "vllm.entrypoints.cli.main",
        "vllm.entrypoints.cli.serve",
        "vllm.entrypoints.cli.openai",
        "vllm.entrypoints.openai.api_server",
    ),
    "engine": (
        "tunebook.measure.execute",
        "vllm.engine.arg_utils",
        "vllm.entrypoints.llm",
        "vllm.v1.engine.async_llm",
    ),
}
# Tests: a forked child fails at once ("1"), as a fork that breaks vLLM would (a spawned one is
# unaffected), or crashes in native code ("segv", "abort").
FAIL_ENV = "TUNEBOOK_LAUNCHER_TEST_FAIL"
# What a forked child is called (its process name, 15 characters at most).
CHILD_NAMES = {"serve": "vllm-serve", "engine": "tunebook-engine"}
READY_TIMEOUT_S = 600.0  # the first import on a cold node's file cache
# Launchers one process keeps: each holds vLLM's imports (about 0.5 GB on two CPU cores); a
# notebook uses two or three, a test session one per test environment. Beyond this many, the
# least recently used without a child is closed (it starts again if it is asked for again).
MAX_LAUNCHERS = 6


# --------------------------------------------------------------------------- the sweep's side
class LauncherError(RuntimeError):
    """The launcher itself failed (not the server it was asked for): start the server afresh."""


class LaunchedProcess:
    """A server forked by a launcher, with the part of ``subprocess.Popen`` the sweep uses."""

    def __init__(self, pid: int, argv: list[str]):
        self.pid = pid
        self.args = argv
        self.returncode: int | None = None
        # Seconds its launch waited for the launcher's answer: the launcher's own imports when it
        # was not ready yet (tunebook.workbench.cost counts them: a launcher started early hides them).
        self.waited_s = 0.0
        # Whether the launcher that forked it still runs: a server whose launcher exits kills its
        # own session (it watches its parent), so its death says nothing of its own.
        self.launcher_alive = lambda: True
        self._done = threading.Event()

    def _exited(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
        self._done.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Launcher:
    """One launcher process for one environment (see the module doc)."""

    def __init__(
        self, env: dict[str, str], log: str | Path, kind: str = "serve", early: bool = False
    ):
        self.env = {**env, PARENT_ENV: str(os.getpid())}
        # Started before the caller imported vLLM (``prestart``): importing vLLM sets variables
        # (LD_LIBRARY_PATH, TORCHINDUCTOR_*, ...) in the caller's environment as in ours, so the
        # environment asked for later may differ from ``env`` by exactly those.
        self.early = early
        self.env_changes: dict[str, str | None] = {}  # what our imports set (None: removed)
        self.log = Path(log)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.kind = kind
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tunebook.engine.launcher", str(self.log), kind],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=self.env,
            start_new_session=True,
        )
        self.ready_s: float | None = None
        self._children: dict[int, LaunchedProcess] = {}
        self._early_exits: dict[int, int] = {}
        self._replies: list[dict] = []
        self._cond = threading.Condition()
        self._closed = False
        self._abandoned = 0  # launches given up before their answer came
        self.used = time.monotonic()  # its last launch (or its start): the eviction order
        self._lock = threading.Lock()  # one launch at a time: replies come in request order
        threading.Thread(target=self._read, name="tunebook-launcher", daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            with self._cond:
                if "exit" in msg:
                    child = self._children.pop(int(msg["exit"]), None)
                    if child is not None:
                        child._exited(int(msg["code"]))
                    else:  # it died before launch() took its pid: launch() looks here
                        self._early_exits[int(msg["exit"])] = int(msg["code"])
                elif "ready" in msg:
                    self.env_changes = dict(msg.get("env_changes") or {})
                    self.ready_s = float(msg["ready"])
                elif self._abandoned:  # the answer to a launch given up: see _abandon
                    self._abandoned -= 1
                    self._abandon(msg)
                else:
                    self._replies.append(msg)
                self._cond.notify_all()
        # The launcher is gone: its children kill their own sessions when it dies.
        with self._cond:
            self._closed = True
            for child in self._children.values():
                child._exited(-signal.SIGKILL)
            self._children.clear()
            self._cond.notify_all()

    def launch(
        self,
        argv: list[str],
        log: str | Path,
        cwd: str | Path | None = None,
        module: str | None = None,
    ):
        """Fork ``vllm <argv>`` (or ``python -m <module> <argv>``) with its output to ``log``;
        a Popen-like handle."""
        req = {"argv": list(argv), "log": str(log), "cwd": str(cwd or os.getcwd())}
        if module:
            req["module"] = module
        self.used = t0 = time.monotonic()
        with self._lock:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write((json.dumps(req) + "\n").encode())
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError) as e:
                raise LauncherError(f"the vllm serve launcher has exited: {self._tail()}") from e
            deadline = time.monotonic() + READY_TIMEOUT_S
            with self._cond:
                try:
                    while not self._replies and not self._closed:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise LauncherError(
                                f"the vllm serve launcher did not answer: {self._tail()}"
                            )
                        self._cond.wait(min(left, 1.0))
                except BaseException:  # Ctrl-C or the timeout: nobody will own that server
                    self._abandon(self._replies.pop(0) if self._replies else None)
                    raise
                if not self._replies:
                    raise LauncherError(f"the vllm serve launcher has exited: {self._tail()}")
                msg = self._replies.pop(0)
                if "error" in msg:
                    raise LauncherError(f"the vllm serve launcher could not fork: {msg['error']}")
                child = LaunchedProcess(int(msg["pid"]), [module or "vllm", *argv])
                child.waited_s = time.monotonic() - t0
                child.launcher_alive = self.alive
                if child.pid in self._early_exits:
                    child._exited(self._early_exits.pop(child.pid))
                else:
                    self._children[child.pid] = child
                return child

    def _abandon(self, msg: dict | None) -> None:
        """A launch given up (interrupted): kill its server now or, if its answer has not come
        yet, when it comes. Called with ``_cond`` held."""
        if msg is None:
            self._abandoned += 1
        elif "pid" in msg:  # the pid first: the child may not have started its session yet
            for kill in (os.kill, os.killpg):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    kill(int(msg["pid"]), signal.SIGKILL)

    def wait_ready(self, timeout: float) -> bool:
        """Wait until its imports are done (or it has exited); whether they are done."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.ready_s is None and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 1.0))
            return self.ready_s is not None

    def alive(self) -> bool:
        return self.proc.poll() is None and not self._closed

    def serves(self, env: dict[str, str]) -> bool:
        """Whether its children have ``env``: the environment it started with, up to what its
        own imports set (a child started afresh would set that in importing them too)."""
        changed = self.env_changes
        mine = {k: v for k, v in self.env.items() if k != PARENT_ENV and k not in changed}
        theirs = {k: v for k, v in env.items() if k != PARENT_ENV and k not in changed}
        return mine == theirs and all(env[k] == changed[k] for k in changed if k in env)

    def close(self) -> None:
        """Stop the launcher (its children, if any are left, kill their sessions when it goes)."""
        if self.proc.poll() is None and self.ready_s is None:
            self.proc.kill()  # still importing: it has no children, and would not read stdin yet
            self.proc.wait()
        if self.proc.poll() is None:
            try:
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()

    def _tail(self, n: int = 15) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return f"exit code {self.proc.poll()}"
        return "\n".join(lines[-n:]) or f"exit code {self.proc.poll()}"


_LAUNCHERS: dict[tuple, Launcher] = {}
_REGISTRY_LOCK = threading.Lock()
# Launchers one of whose processes worked (a server healthy, a point done), and those refused: a
# forked process failed before any had worked, so the fork itself may be what broke it.
_TRUSTED: set[tuple] = set()
_REFUSED: set[tuple] = set()


def _key(kind: str, env: dict[str, str]) -> tuple:
    return (kind, *sorted((k, v) for k, v in env.items() if k != PARENT_ENV))


def vouch(kind: str, env: dict[str, str]) -> None:
    """A process forked by the launcher of ``env`` worked: its later failures are its own."""
    with _REGISTRY_LOCK:
        _TRUSTED.add(_key(kind, env))


def refuse(kind: str, env: dict[str, str]) -> bool:
    """A process forked by the launcher of ``env`` failed. Unless one of that launcher's processes
    worked before, fork no more for ``env`` and return True: the caller starts that process
    afresh once, so a fork that breaks vLLM costs one failed start, not the sweep."""
    key = _key(kind, env)
    with _REGISTRY_LOCK:
        if key in _TRUSTED:
            return False
        _REFUSED.add(key)
        return True


def pardon(kind: str, env: dict[str, str]) -> None:
    """The process ``refuse`` had started afresh failed as well: the failure was its own (a
    setting that cannot start, say), not the fork's, so the launcher of ``env`` forks again."""
    with _REGISTRY_LOCK:
        _REFUSED.discard(_key(kind, env))


def refused_by_vllm(reason: str | None) -> bool:
    """Whether a failed start's reason is vLLM refusing the setting after the start itself
    worked: its KV checks ("No available memory for the cache blocks", "... KV cache is needed,
    which is larger than the available KV cache memory"), which run once the model is loaded
    and memory measured. Nothing wider: on the H200 of 2026-12-05 a broken fork failed with
    "1 validation error for ModelConfig" (runs/h200-20261205), so a config error may be the
    fork's doing and is retried afresh."""
    first = (reason or "").split("\n", 1)[0]
    return (
        re.search(
            r"\bValueError: (No available memory for the cache blocks|.*larger than the"
            r" available KV cache)",
            first,
        )
        is not None
    )


def settle(
    kind: str,
    env: dict[str, str],
    *,
    forked: bool,
    ok: bool,
    external: bool = False,
    retried: bool = False,
    own: bool = False,
) -> bool:
    """What a started process's outcome says about the launcher of ``env``; True: start it
    afresh (once). The one fork-then-fallback rule of isolated points and `vllm serve` replicas:

    - forked and worked: the launcher is vouched for, its later failures are the process's own;
    - forked and failed of itself (``external``: a signal or a timeout from outside is not the
      fork's doing; ``own``: vLLM refused the setting, ``refused_by_vllm``): unless the launcher
      worked before, fork no more and start afresh;
    - started afresh after that (``retried``) and failed again: not the fork, pardon it.
    """
    if forked and ok:
        vouch(kind, env)
    elif forked and not external and not own:
        return refuse(kind, env)
    elif not forked and not ok and retried:
        pardon(kind, env)
    return False


def enabled() -> bool:
    """Whether servers and isolated points may be forked from a launcher: vLLM's CLI importable
    by this Python, and not switched off by ``TUNEBOOK_LAUNCHER=0``."""
    if os.environ.get("TUNEBOOK_LAUNCHER", "1").lower() in ("0", "false", "no", "off"):
        return False
    import importlib.util

    # Where the file is, not an import: importing vllm.entrypoints.cli imports torch (4.5 s on
    # two CPU cores), which would hold up a launcher started early to save exactly that.
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return False
    dirs = (spec.submodule_search_locations or []) if spec else []
    return any((Path(d) / "entrypoints" / "cli" / "main.py").is_file() for d in dirs)


def launcher_for(env: dict[str, str], log_dir: str | Path, kind: str = "serve") -> Launcher:
    """The launcher of this kind and environment, started on first use (its log:
    ``log_dir``/launcher.log, or launcher-engine.log)."""
    key = _key(kind, env)
    with _REGISTRY_LOCK:
        launcher = _LAUNCHERS.get(key)
        if launcher is None or not launcher.alive():
            launcher = _early_match(kind, env)
            if launcher is None:
                launcher = Launcher(env, _log(log_dir, kind), kind)
            _LAUNCHERS[key] = launcher
            _evict(launcher)
        return launcher


def _log(log_dir: str | Path, kind: str) -> Path:
    return Path(log_dir) / ("launcher.log" if kind == "serve" else f"launcher-{kind}.log")


def _evict(keep: Launcher) -> None:
    """Close the least recently used launchers that have no child and are not importing, down
    to MAX_LAUNCHERS (dead ones go too). Called with the registry lock held."""
    distinct = {id(x): x for x in _LAUNCHERS.values()}
    gone = [x for x in distinct.values() if x is not keep and not x.alive()]
    idle = sorted(
        (
            x
            for x in distinct.values()
            if x is not keep and x.alive() and x.ready_s is not None and not x._children
        ),
        key=lambda x: x.used,
    )
    gone += idle[: max(0, len(distinct) - len(gone) - MAX_LAUNCHERS)]
    for x in gone:
        x.close()
        for k in [k for k, v in _LAUNCHERS.items() if v is x]:
            del _LAUNCHERS[k]


def _early_match(kind: str, env: dict[str, str]) -> Launcher | None:
    """A launcher started early (``prestart``) whose children have ``env`` once its own imports
    are done (waits for them). Called with the registry lock held."""
    differ: set[str] = set()
    for x in list(_LAUNCHERS.values()):
        if x.kind == kind and x.early and x.alive() and x.wait_ready(READY_TIMEOUT_S):
            if x.serves(env):
                return x
            differ |= {k for k in {*x.env, *env} if x.env.get(k) != env.get(k)} - {PARENT_ENV}
    if differ:  # the early import was wasted: say why, so that it can be mended
        print(
            f"tunebook: the {kind} launcher started early has another environment"
            f" ({', '.join(sorted(differ))}); starting one for this one",
            file=sys.stderr,
        )
    return None


def prestart(kind: str, env: dict[str, str], log_dir: str | Path) -> Launcher | None:
    """Start the launcher of ``kind`` and ``env`` now, without waiting for its imports: they run
    while the caller does its own work (a notebook's kernel imports vLLM too), and the first
    process of that environment is forked from it. None where no launcher would be used."""
    key = _key(kind, env)
    if not enabled() or key in _REFUSED:
        return None
    with _REGISTRY_LOCK:
        launcher = _LAUNCHERS.get(key)
        if launcher is None or not launcher.alive():
            # one started earlier that serves it (a notebook run again in its kernel)
            launcher = next(
                (
                    x
                    for x in _LAUNCHERS.values()
                    if x.kind == kind and x.alive() and x.ready_s is not None and x.serves(env)
                ),
                None,
            )
        if launcher is None:
            launcher = Launcher(env, _log(log_dir, kind), kind, early=True)
        _LAUNCHERS[key] = launcher
        _evict(launcher)
        return launcher


def wants_prestart() -> bool:
    """Whether a notebook starts its launchers early: on a GPU node (nvidia-smi answers), where
    each one's import takes 18-25 s; ``TUNEBOOK_PRESTART=0`` or ``1`` decides otherwise. Not on
    CPU by default: a launcher the notebook turns out not to use would take one of few cores."""
    flag = os.environ.get("TUNEBOOK_PRESTART", "").strip().lower()
    if flag:
        return flag not in ("0", "false", "no", "off")

    return device_memory_bytes()[0] == "cuda"


def prestart_for(engine_env: dict, isolate: bool, log_dir: str | Path) -> list[str]:
    """Start, without waiting, the launchers that points with ``engine_env`` fork from: the
    ``vllm serve`` one and, where in-process points run isolated, the engine one. Their kinds."""

    envs = {"serve": server_env(engine_env, {})}
    if isolate:
        envs["engine"] = process_env(engine_env)
    return [kind for kind, env in envs.items() if prestart(kind, env, log_dir)]


def wait_ready(timeout: float = READY_TIMEOUT_S) -> None:
    """Wait until every launcher of this process has done its imports (or exited), so that none
    is still importing while an engine is measured beside it."""
    with _REGISTRY_LOCK:
        launchers = list(_LAUNCHERS.values())
    deadline = time.monotonic() + timeout
    for x in launchers:
        x.wait_ready(max(0.0, deadline - time.monotonic()))


def start(
    kind: str,
    argv: list[str],
    log: str | Path,
    env: dict[str, str],
    fresh_cmd: list[str],
    module: str | None = None,
    fork: bool = True,
) -> tuple:
    """A server (kind "serve": ``vllm <argv>``) or an isolated point's process (kind "engine":
    ``python -m <module> <argv>``), output to ``log``: forked from the launcher of ``env`` where
    ``fork`` and ``enabled()`` (and the launcher not refused, see ``refuse``), else (or if the
    launcher fails) ``fresh_cmd`` started afresh by ``isolation.spawn``. Returns the process and
    "forked" or "spawned"."""
    if fork and enabled() and _key(kind, env) not in _REFUSED:
        try:
            x = launcher_for(env, Path(log).parent, kind)
            return x.launch(argv, log, module=module), "forked"
        except LauncherError as e:  # the launcher, not the process asked for: start it afresh
            print(f"tunebook: {e}; starting it as a new process", file=sys.stderr)
    with open(log, "w") as f:
        return spawn(fresh_cmd, f, env), "spawned"


@atexit.register
def close_all() -> None:
    """Stop every launcher of this process (also at exit)."""
    with _REGISTRY_LOCK:
        for launcher in _LAUNCHERS.values():
            launcher.close()
        _LAUNCHERS.clear()


# --------------------------------------------------------------------------- the launcher's side
def _child(req: dict, launcher_pid: int) -> int:
    """In the forked child: become `vllm <argv>` and return its exit status."""
    os.setsid()  # its own session: kill_group(pid) stops it and the engine core it starts
    for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    # As Python's own start-up leaves them, so as in `vllm serve` started from a shell: SIGPIPE
    # ignored, so that writing to a client that has gone raises an error the server handles. With
    # the default action, the first stream written after its client hung up killed the whole
    # server without a word (04's servers under load on an H100, runs/h100-20261206).
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    # The protocol pipe (stdin, replaced above; the reply pipe, closed by the caller) and the
    # launcher's log (closed after its dup2) are gone now. Whatever else is open stays open, as in
    # any fork: libraries imported here may hold descriptors they still count on (every forked
    # server failed on an H200 while the child closed them all).
    os.chdir(req["cwd"])
    # Our parent is the launcher: a child that watches its parent (tunebook.measure.execute's) watches it;
    # PARENT_ENV still names the sweep (the test hook of tunebook.engine.interrupt signals it).
    os.environ[WATCH_ENV] = str(launcher_pid)
    module = req.get("module")
    if os.environ.get(FAIL_ENV) == "1":  # tests: a fork that breaks what it starts
        print("RuntimeError: this forked process fails on purpose (test hook)", flush=True)
        return 1
    if os.environ.get(FAIL_ENV) == "segv":  # tests: a crash in native code
        import faulthandler

        faulthandler._sigsegv()
    if os.environ.get(FAIL_ENV) == "abort":  # tests: a native library aborting
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file in the caller's folder
        os.abort()
    # Its command line stays the launcher's (rewriting it would wipe /proc/<pid>/environ); its
    # name says what it is: `ps -o comm`, top, psutil's name().
    with contextlib.suppress(ImportError):
        import setproctitle  # a dependency of vLLM

        setproctitle.setthreadtitle(CHILD_NAMES["engine" if module else "serve"])
    try:
        if module:  # python -m <module> <argv>
            import runpy

            sys.argv = [module, *req["argv"]]
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        else:  # the `vllm` script cannot watch its parent, so we do it for it
            watch_parent(launcher_pid)  # launcher gone (sweep killed): end the session
            from vllm.entrypoints.cli.main import main

            sys.argv = ["vllm", *req["argv"]]
            code = main()
    except SystemExit as e:
        code = e.code
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def _serve(log: str, kind: str = "serve") -> int:
    """The launcher: import what its kind needs, then fork a child per request until stdin
    closes."""
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)  # what importing vLLM prints goes to the log, not into the protocol
    os.dup2(fd, 2)
    os.close(fd)
    parent = os.getppid()
    t0 = time.perf_counter()
    before = dict(os.environ)
    try:
        import importlib

        for name in PRELOAD[kind]:
            importlib.import_module(name)
    except BaseException as e:  # noqa: BLE001 - the sweep falls back to a spawned server
        import traceback

        traceback.print_exc()
        reply.write(json.dumps({"error": f"importing vLLM's CLI failed: {e!r}"}) + "\n")
        return 1
    # What the imports made is shared with every child, copy-on-write: frozen, the children's
    # garbage collector never walks (and so never copies) it, as Python's docs advise before a
    # fork; vLLM freezes its servers' and engines' heaps the same way once they have started.
    gc.collect()
    gc.freeze()
    changes = {
        k: os.environ.get(k) for k in {*before, *os.environ} if before.get(k) != os.environ.get(k)
    }
    reply.write(
        json.dumps({"ready": round(time.perf_counter() - t0, 3), "env_changes": changes}) + "\n"
    )
    took = time.perf_counter() - t0
    print(f"launcher ready: {', '.join(PRELOAD[kind])} imported in {took:.1f} s", flush=True)

    me = os.getpid()
    buf = b""
    children: set[int] = set()
    while os.getppid() == parent:
        readable, _, _ = select.select([0], [], [], 0.25)
        for pid in list(children):  # reap, and tell the sweep
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, 0
            if done:
                children.discard(pid)
                code = os.waitstatus_to_exitcode(status)
                reply.write(json.dumps({"exit": pid, "code": code}) + "\n")
        if not readable:
            continue
        data = os.read(0, 65536)
        if not data:
            break  # the sweep closed us
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                req = json.loads(line)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
            except (ValueError, OSError) as e:
                reply.write(json.dumps({"error": repr(e)}) + "\n")
                continue
            if pid == 0:
                reply.close()
                # Leaves through SystemExit: the interpreter exits as the `vllm` script would.
                raise SystemExit(_child(req, me))
            children.add(pid)
            print(
                f"forked {pid}: {req.get('module') or 'vllm'} {' '.join(req['argv'])}", flush=True
            )
            reply.write(json.dumps({"pid": pid}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(_serve(*sys.argv[1:3]))
