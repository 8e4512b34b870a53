"""A live view of the engine while a sweep runs: running and waiting requests, KV cache usage,
preemptions and generated tokens per second, from the engine's metrics samples (~4 a second).

In a Jupyter kernel the panel is an ipywidgets HTML updated in place; elsewhere it writes a log
line to stderr at most every ``log_every_s`` seconds. ``sweep.run_sweep(live=...)`` drives it:
in-process points hand it the samples through ``on_sample``; isolated points append them as JSON
lines to a progress file that a ``ProgressTail`` thread reads back.

Nothing here changes a result: the panel only looks at samples the engine takes anyway.
"""

from __future__ import annotations

import html
import json
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from tunebook.engine.vllm_http import GEN_TOKENS, PREEMPTIONS, RUNNING, WAITING
from tunebook.engine.vllm_http import KV_USAGE as KV

PANEL_CLASS = "tunebook-live"


def in_jupyter() -> bool:
    """True in a Jupyter kernel (an IPython with a kernel attached), papermill's included."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


class LiveState:
    """The pure part: samples in, the figures the panel shows out.

    Tokens per second is the change of the ``vllm:generation_tokens`` counter over the last
    ``window_s`` seconds of samples; preemptions are counted from the point's first sample (the
    counters are cumulative over the process, which may have run other points before).
    """

    def __init__(self, window_s: float = 2.0):
        self.window_s = window_s
        self.reset()

    def reset(self, point_id: str | None = None) -> None:
        self.point_id = point_id
        self.last: dict | None = None
        self.samples = 0
        self._hist: deque[tuple[float, float]] = deque()
        self._preempt0: float | None = None
        self._gen0: float | None = None

    def update(self, sample: dict) -> None:
        t = float(sample.get("t_s", time.monotonic()))
        if self._hist and t < self._hist[-1][0]:
            self._hist.clear()  # a new sampler (next repeat): its clock starts again
        if GEN_TOKENS in sample:
            gen = float(sample[GEN_TOKENS])
            self._hist.append((t, gen))
            if self._gen0 is None:
                self._gen0 = gen
            while len(self._hist) > 2 and t - self._hist[1][0] >= self.window_s:
                self._hist.popleft()
        if PREEMPTIONS in sample and self._preempt0 is None:
            self._preempt0 = float(sample[PREEMPTIONS])
        self.last = dict(sample)
        self.samples += 1

    @property
    def tokens_per_s(self) -> float | None:
        if len(self._hist) < 2:
            return None
        (t0, g0), (t1, g1) = self._hist[0], self._hist[-1]
        return (g1 - g0) / (t1 - t0) if t1 > t0 else None

    @property
    def preemptions(self) -> int | None:
        if self.last is None or PREEMPTIONS not in self.last or self._preempt0 is None:
            return None
        return int(self.last[PREEMPTIONS] - self._preempt0)

    @property
    def generated(self) -> int | None:
        if self.last is None or GEN_TOKENS not in self.last or self._gen0 is None:
            return None
        return int(self.last[GEN_TOKENS] - self._gen0)

    def fields(self) -> dict:
        s = self.last or {}
        kv = s.get(KV)
        return {
            "running": None if RUNNING not in s else int(s[RUNNING]),
            "waiting": None if WAITING not in s else int(s[WAITING]),
            "kv_cache_pct": None if kv is None else 100.0 * float(kv),
            "preemptions": self.preemptions,
            "tokens_per_s": self.tokens_per_s,
            "generated_tokens": self.generated,
        }

    def text(self) -> str:
        """One line: ``point: running 12, waiting 3, KV 41.5%, preemptions 0, 812 tok/s``."""
        if self.last is None:
            return f"{self.point_id or 'engine'}: starting (no metrics yet)"
        f = self.fields()

        def show(v, fmt="{}"):
            return "-" if v is None else fmt.format(v)

        return (
            f"{self.point_id or 'engine'}: running {show(f['running'])}, "
            f"waiting {show(f['waiting'])}, KV {show(f['kv_cache_pct'], '{:.1f}%')}, "
            f"preemptions {show(f['preemptions'])}, {show(f['tokens_per_s'], '{:.0f}')} tok/s"
        )


class LivePanel:
    """The live view of one sweep. ``update(sample)`` may be called from any thread.

    ``widget=None`` picks the HTML widget in a Jupyter kernel and log lines elsewhere.
    """

    def __init__(
        self,
        title: str = "",
        total: int | None = None,
        widget: bool | None = None,
        log_every_s: float = 5.0,
        redraw_every_s: float = 0.5,
        log: Callable[[str], None] | None = None,
    ):
        self.title, self.total, self.done = title, total, 0
        self.state = LiveState()
        self.log_every_s, self.redraw_every_s = log_every_s, redraw_every_s
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self._lock = threading.Lock()
        self._last_emit = float("-inf")
        self.last_status: str | None = None
        self.widget = None
        if in_jupyter() if widget is None else widget:
            import ipywidgets as W
            from IPython.display import display

            self.widget = W.HTML(value=self.html())
            self.widget.add_class(PANEL_CLASS)
            display(self.widget)

    # -- what is shown
    def header(self) -> str:
        count = f"{self.done}/{self.total} points" if self.total else f"{self.done} points"
        return f"{self.title} [{count}]" if self.title else f"[{count}]"

    def html(self) -> str:
        s = self.state
        rows = []
        if s.point_id is not None:
            f = s.fields()
            fmt = {
                "running requests": f["running"],
                "waiting requests": f["waiting"],
                "KV cache usage": None
                if f["kv_cache_pct"] is None
                else f"{f['kv_cache_pct']:.1f}%",
                "preemptions": f["preemptions"],
                "tokens/s": None if f["tokens_per_s"] is None else f"{f['tokens_per_s']:.0f}",
            }
            rows = [
                f"<tr><td>{html.escape(k)}</td><td style='text-align:right'>"
                f"{'-' if v is None else html.escape(str(v))}</td></tr>"
                for k, v in fmt.items()
            ]
        point = "" if s.point_id is None else f" &middot; {html.escape(str(s.point_id))}"
        status = "" if not self.last_status else f"<div>{html.escape(self.last_status)}</div>"
        return (
            f"<div><b>{html.escape(self.header())}</b>{point}"
            f"<table>{''.join(rows)}</table>{status}</div>"
        )

    def _emit(self, force: bool = False) -> None:
        now = time.monotonic()
        every = self.redraw_every_s if self.widget is not None else self.log_every_s
        if not force and now - self._last_emit < every:
            return
        self._last_emit = now
        if self.widget is not None:
            self.widget.value = self.html()
        else:
            self.log(f"[tunebook] {self.header()} {self.state.text()}")

    # -- events
    def start_point(self, point_id: str) -> None:
        with self._lock:
            self.state.reset(point_id)
            self._last_emit = float("-inf")  # the point's first sample shows at once
            if self.widget is not None:
                self._emit(force=True)

    def update(self, sample: dict) -> None:
        try:
            with self._lock:
                self.state.update(sample)
                self._emit()
        except Exception:
            pass  # called from the engine's sampler thread: the view must never stop a run

    def end_point(self, result: dict | None = None) -> None:
        with self._lock:
            self.done += 1
            if result is not None:
                self.last_status = f"{result.get('point_id')}: {result.get('status')}"
            if self.widget is not None:
                self._emit(force=True)

    def close(self) -> None:
        with self._lock:
            if self.widget is not None:
                self.widget.value = self.html()


class ProgressTail(threading.Thread):
    """Reads the JSON lines an isolated engine appends to ``path`` and calls ``callback`` with each.

    Only complete lines are read (a line being written is left for the next poll); lines that are
    not JSON are skipped. ``stop()`` reads what is left and joins.
    """

    def __init__(self, path: str | Path, callback: Callable[[dict], None], interval_s=0.25):
        super().__init__(daemon=True, name="tunebook-progress-tail")
        self.path, self.callback, self.interval_s = Path(path), callback, interval_s
        self._pos = 0
        self._stop_event = threading.Event()

    def poll(self) -> int:
        """Read the new complete lines now; returns how many samples were handed on."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._pos)
                data = f.read()
        except FileNotFoundError:
            return 0
        end = data.rfind(b"\n")
        if end < 0:
            return 0
        self._pos += end + 1
        n = 0
        for line in data[: end + 1].splitlines():
            try:
                sample = json.loads(line)
            except ValueError:
                continue
            if isinstance(sample, dict):
                try:
                    self.callback(sample)
                except Exception:
                    pass  # the view must never stop a sweep
                n += 1
        return n

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            self.poll()

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=5)
        self.poll()


__all__ = ["LivePanel", "LiveState", "ProgressTail", "in_jupyter"]
