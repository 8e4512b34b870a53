"""tunebook.engine.interrupt without engines: SIGINT stops a sweep block even where Python would not."""

from __future__ import annotations

import os
import signal

import pytest

from tunebook.engine import interrupt
from tunebook.engine.interrupt import Interrupted, checkpoint, deferred, phase, stop_on_signal


@pytest.fixture
def sigint_ignored():
    """SIGINT ignored, as a process started with `cmd &` by a script inherits it (the CI case)."""
    prev = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, prev)


def test_sigint_stops_the_block_even_when_inherited_ignored(sigint_ignored):
    with pytest.raises(Interrupted, match="SIGINT: sweep stopped"):
        with stop_on_signal():
            os.kill(os.getpid(), signal.SIGINT)
            pytest.fail("the signal did not interrupt")  # pragma: no cover
    # outside the block the inherited disposition is back
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert interrupt.requested() is None


def test_sigterm_stops_the_block_too():
    prev = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted, match="SIGTERM"):
        with stop_on_signal():
            os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) == prev


def test_a_swallowed_interrupt_is_raised_again_at_the_next_checkpoint():
    reached = []
    with pytest.raises(Interrupted):
        with stop_on_signal():
            try:  # what a library does when it catches BaseException and carries on
                os.kill(os.getpid(), signal.SIGINT)
            except KeyboardInterrupt:
                reached.append("swallowed")
            reached.append("went on")
            checkpoint()
            reached.append("after checkpoint")  # pragma: no cover
    assert reached == ["swallowed", "went on"]


def test_a_swallowed_interrupt_still_stops_at_the_end_of_the_block():
    with pytest.raises(Interrupted):
        with stop_on_signal():
            try:
                os.kill(os.getpid(), signal.SIGINT)
            except KeyboardInterrupt:
                pass


def test_deferred_block_completes_then_stops():
    written = []
    with pytest.raises(Interrupted):
        with stop_on_signal():
            with deferred():
                os.kill(os.getpid(), signal.SIGINT)
                written.append("half")
                checkpoint()  # no effect inside a deferred block
                written.append("whole")
            written.append("after")  # pragma: no cover
    assert written == ["half", "whole"]


def test_an_earlier_python_handler_is_chained_and_restored():
    seen = []

    def mine(signum, frame):
        seen.append(signum)

    prev = signal.signal(signal.SIGINT, mine)
    try:
        with pytest.raises(Interrupted):
            with stop_on_signal():
                with stop_on_signal():  # nested sweeps share one installation
                    os.kill(os.getpid(), signal.SIGINT)
        assert seen == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, prev)


def test_phase_hook_signals_this_process_at_the_named_phase(monkeypatch):
    monkeypatch.setenv(interrupt.SIGNAL_AT_ENV, "measure@b-r0")
    monkeypatch.delenv(interrupt.PARENT_ENV, raising=False)
    with pytest.raises(Interrupted):
        with stop_on_signal():
            phase("measure", "a-r0")  # another point: nothing
            phase("warmup", "b-r0")  # another phase: nothing
            phase("measure", "b-r0")
            pytest.fail("the hook did not fire")  # pragma: no cover


def test_phase_hook_signals_the_parent_from_an_isolated_child(monkeypatch):
    sent = []
    monkeypatch.setenv(interrupt.SIGNAL_AT_ENV, "warmup")
    monkeypatch.setenv(interrupt.PARENT_ENV, "4242")
    monkeypatch.setattr(interrupt.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    phase("warmup", "any")
    assert sent == [(4242, signal.SIGINT)]


def test_phase_without_a_block_or_hook_does_nothing(monkeypatch):
    sent = []
    monkeypatch.delenv(interrupt.SIGNAL_AT_ENV, raising=False)
    monkeypatch.setenv(interrupt.PARENT_ENV, "4242")
    monkeypatch.setattr(interrupt.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    for name in interrupt.PHASES:
        phase(name, "p")
    assert sent == [] and not interrupt.requested()
