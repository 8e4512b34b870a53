"""Ctrl-C stops a sweep, at every moment, in a terminal and in a Jupyter kernel.

Why tunebook installs its own handler instead of relying on Python's KeyboardInterrupt:

- A process started in the background by a non-interactive shell (``cmd &`` in a script, as CI
  harnesses and job launchers do) inherits SIGINT *ignored* (POSIX), and Python then installs no
  KeyboardInterrupt handler at all: ``kill -INT`` on such a sweep runner did nothing, and it went
  on to finish every point with exit status 0.
- A KeyboardInterrupt raised deep inside a library (vLLM's engine start, a ``__del__`` run by the
  garbage collector) can be caught there and lost.

So for the duration of a sweep, SIGINT and SIGTERM set a stop flag and raise :class:`Interrupted`
(a KeyboardInterrupt). The flag stays set until the sweep has unwound: every :func:`checkpoint`
raises again, so a swallowed interrupt still stops the sweep at the next phase. A handler that was
there before (ipykernel's, a user's) is restored afterwards and, if it was a Python function other
than Python's default, is called too.

:func:`phase` marks the named moments of a point (``between``, ``engine_start``, ``warmup``,
``measure``, ``write``). With ``TUNEBOOK_SIGNAL_AT=<phase>[@<point_id>]`` in the environment, the
sweep's process sends itself SIGINT when that phase begins: tests interrupt at an exact phase
without timing anything. In an isolated engine child the signal goes to the sweep (the parent),
as Ctrl-C would.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

SIGNAL_AT_ENV = "TUNEBOOK_SIGNAL_AT"
PARENT_ENV = "TUNEBOOK_PARENT_PID"  # set by engine.run_point in an isolated child's environment
PHASES = ("between", "engine_start", "warmup", "measure", "write")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A sweep was stopped by SIGINT or SIGTERM; finished points are kept, a rerun resumes."""


_state = threading.local()
_stop = {"signal": None}  # process-wide: signals are delivered to the process
_depth = 0
_deferring = 0
_previous: dict[int, object] = {}


def requested() -> int | None:
    """The signal number that asked the sweep to stop, or None."""
    return _stop["signal"]


def _raise(signum: int):
    name = signal.Signals(signum).name
    raise Interrupted(f"{name}: sweep stopped; finished points are kept, a rerun resumes")


def _handler(signum, frame):
    _stop["signal"] = signum
    prev = _previous.get(signum)
    if callable(prev) and prev is not signal.default_int_handler:
        prev(signum, frame)  # chain a handler that was there before us (it may raise itself)
    if _deferring:
        return  # raised by the checkpoint at the end of the deferred block
    _raise(signum)


def checkpoint() -> None:
    """Raise Interrupted if a stop was requested during this sweep (even if swallowed since)."""
    if _stop["signal"] is not None and not _deferring:
        _raise(_stop["signal"])


@contextlib.contextmanager
def stop_on_signal():
    """Within this block SIGINT/SIGTERM stop the sweep (see the module doc). Re-entrant.

    Handlers can only be installed from the main thread; elsewhere the block installs nothing and
    checkpoints still see a stop requested through the main thread's handler.
    """
    global _depth
    main = threading.current_thread() is threading.main_thread()
    if _depth == 0 and main:
        _stop["signal"] = None
        for s in STOP_SIGNALS:
            _previous[s] = signal.getsignal(s)
            signal.signal(s, _handler)
    _depth += 1
    try:
        yield
        checkpoint()
    finally:
        _depth -= 1
        if _depth == 0 and main:
            for s in STOP_SIGNALS:
                prev = _previous.pop(s, signal.SIG_DFL)
                signal.signal(s, prev if prev is not None else signal.SIG_DFL)
            _stop["signal"] = None


@contextlib.contextmanager
def deferred():
    """A block a signal must not cut in half (writing a finished point): stop right after it."""
    global _deferring
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
    checkpoint()


def phase(name: str, point_id: str | None = None) -> None:
    """A named moment of a sweep: stop here if asked, and fire the test hook if it names it."""
    spec = os.environ.get(SIGNAL_AT_ENV)
    if spec:
        want, _, pid = spec.partition("@")
        if want == name and (not pid or pid == point_id):
            target = int(os.environ.get(PARENT_ENV) or os.getpid())
            os.kill(target, signal.SIGINT)
    checkpoint()
