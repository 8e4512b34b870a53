"""Sustained capacity: does a deployment *hold* an offered rate, or only absorb a burst of it?

A rate of arrivals that lasts a few seconds can pass the SLO while the deployment falls behind:
requests pile up in its queues and part of each one's life falls in the drain after arrivals stop
(runs/h100-20261206e: 724 req/s passed 4-s windows with the running count still climbing in a
straight line; held for 20 s by ``vllm bench serve`` the same deployment met the SLO at 512, not
724). A rate *holds* here only if, over a window long enough to reach steady state, all of:

1. **the SLO**: at least ``attainment_pct`` of the window's requests each within every limit
   (``tunebook.core.metrics.meets_slo``; the chat scenarios bound the gap between streamed
   chunks as well);
2. **keeping up**: in the steady part of the window (its last two thirds), the requests completed
   per second, and their output tokens per second, are at least ``KEEP_UP`` (95%) of what arrived
   one median end-to-end latency earlier (less ``KEEP_UP_SLACK``, 2 requests: the edges), both
   per second (the earlier span is clipped to the window). In steady state what completes now is
   what arrived one latency ago; a deployment that falls behind completes fewer. (Comparing with
   the requests that arrived in the same seconds, or with the nominal rate, would mix Poisson
   noise into the test.) A request arrives when the schedule says it is due (``due_s``), not when
   the client got round to sending it: a client starved of CPU sends late, and counted by its
   sends the deployment would be asked only what it managed to serve (keep-up read 0.997 where
   9.4 of 22 req/s offered were served, on 2 cores).
3. **steadiness**: the requests in the system (running + waiting, from the servers' /metrics
   samples) are not still growing: the median over the window's last third is at most
   ``GROWTH`` (10%) above the median over its middle third, plus ``GROWTH_SLACK`` (3) times the
   square root of that median. Requests in flight come and go like a Poisson count (for many
   servers in parallel its variance is its mean), so in steady state two thirds' medians differ
   by a few square roots; a queue that builds up adds (offered - served rate) x a third of the
   window, hundreds of requests at a GPU's rates;
4. **nothing refused or cut**: no request failed, and none was stopped (a rate decided failed
   early, ``search.stop_early``, fails).

The window is sized from what was measured: arrivals last at least
``max(min_window_s, WINDOW_E2E_MULTIPLE x e2e p50)`` (20 s, 8 x): the steady part then starts
at least 2.7 median latencies after the first arrival, and the latency shift in rule 2 stays
inside the window. A run whose window turns out shorter than that is measured again with the
longer window (``window_s_needed``, with ``WINDOW_TOLERANCE`` to spare). A window within
``WINDOW_TOLERANCE`` (5%) of that length counts. Pure Python.
"""

from __future__ import annotations

import math
import statistics

KEEP_UP = 0.95  # completed / arrived, requests and output tokens, over the steady part
KEEP_UP_SLACK = 2.0  # requests: the edges' share of a small window (see judge)
GROWTH = 0.10  # the last third's in-system median at most this much above the middle third's
GROWTH_SLACK = 3.0  # ... plus this many square roots of it (steady-state fluctuation)
WINDOW_E2E_MULTIPLE = 8.0  # arrivals last at least this many median end-to-end latencies
MIN_WINDOW_S = 20.0  # ... and at least this long
# A window this much shorter than asked still counts: the e2e p50 it is sized by moves a few
# percent from one window to the next at the same rate (2.89 and 2.97 s at 452.6 req/s,
# runs/h100-20261207), so an exact bound would fail a rate on that noise alone.
WINDOW_TOLERANCE = 0.05

RULES = ("slo", "keep_up", "steady", "complete", "window")


def window_s_needed(e2e_p50_ms: float | None, min_window_s: float = MIN_WINDOW_S) -> float:
    """How long arrivals must last at a rate whose requests take ``e2e_p50_ms`` (median)."""
    if e2e_p50_ms is None or not math.isfinite(e2e_p50_ms):
        return float(min_window_s)
    return max(float(min_window_s), WINDOW_E2E_MULTIPLE * e2e_p50_ms / 1e3)


def _ends(r: dict) -> float | None:
    """When a request's last token arrived, on the schedule's clock (seconds)."""
    if r.get("sent_s") is None or r.get("e2e_ms") is None:
        return None
    return r["sent_s"] + r["e2e_ms"] / 1e3


def _arrives(r: dict) -> float | None:
    """When a request was offered: its due time on the schedule, else (a record that does not
    carry one, e.g. from ``vllm bench serve``) when it was sent."""
    return r["due_s"] if r.get("due_s") is not None else r.get("sent_s")


def keep_up(records: list[dict], window_s: float) -> dict:
    """Rule 2: completions over the steady part against arrivals one median latency earlier.

    ``records`` carry ``sent_s`` and ``due_s`` (the schedule's clock, 0 = first arrival),
    ``e2e_ms`` and ``output_tokens``. Returns the two ratios (None where nothing arrived to
    compare with).
    """
    done = [r for r in records if _ends(r) is not None]
    if not done:
        return {
            "arrived": 0,
            "keep_up_requests": None,
            "keep_up_tokens": None,
            "latency_shift_s": None,
        }
    shift = statistics.median(r["e2e_ms"] for r in done) / 1e3
    lo, hi = window_s / 3.0, window_s
    completed = [r for r in done if lo <= _ends(r) < hi]
    # Arrivals one latency earlier, clipped to the window: where latency is long against the window
    # (a machine slower than planned, a queue building), that span is shorter than the steady
    # part, so the two are compared per second, not as counts.
    a_lo, a_hi = max(0.0, lo - shift), max(0.0, min(window_s, hi - shift))
    arrived = [r for r in records if _arrives(r) is not None and a_lo <= _arrives(r) < a_hi]

    def ratio(num: float, den: float) -> float | None:
        if not den or a_hi <= a_lo:
            return None
        return (num / (hi - lo)) / (den / (a_hi - a_lo))

    # What arrived asked for its own output tokens once finished; one still unfinished (or cut)
    # is counted at the finished requests' mean.
    mean_out = statistics.fmean(r.get("output_tokens") or 0 for r in done)
    asked = sum(
        r.get("output_tokens") or mean_out if _ends(r) is not None else mean_out for r in arrived
    )
    return {
        "arrived": len(arrived),
        "keep_up_requests": ratio(len(completed), len(arrived)),
        "keep_up_tokens": ratio(sum(r.get("output_tokens") or 0 for r in completed), asked),
        "latency_shift_s": shift,
    }


def in_system_growth(timeline: list[dict], window_s: float, offset_s: float = 0.0) -> dict:
    """Rule 3: the median running + waiting count over the window's middle and last thirds.

    ``timeline``: the servers' /metrics samples, ``t_s`` on the sampler's clock; ``offset_s`` is
    the schedule's start on that clock (the first arrival's ``t_s``).
    """

    def median_between(a: float, b: float) -> float | None:
        xs = [
            s.get("vllm:num_requests_running", 0.0) + s.get("vllm:num_requests_waiting", 0.0)
            for s in timeline
            if a <= s.get("t_s", -1.0) - offset_s < b
        ]
        return statistics.median(xs) if xs else None

    mid = median_between(window_s / 3.0, 2.0 * window_s / 3.0)
    last = median_between(2.0 * window_s / 3.0, window_s)
    return {"in_system_middle": mid, "in_system_last": last}


def judge(
    records: list[dict],
    timeline: list[dict],
    window_s: float,
    slo_holds: bool | None,
    offset_s: float = 0.0,
    min_window_s: float = MIN_WINDOW_S,
) -> dict:
    """Does the deployment hold this rate? Every rule's figure, which rules broke, and the verdict.

    ``records``: every request of the window (failed and stopped ones included); ``window_s``:
    how long arrivals lasted; ``slo_holds``: rule 1 as ``metrics.summarize`` found it (None: no
    SLO given, the rule does not apply).
    """
    out: dict = {"window_s": window_s}
    ends = [r["e2e_ms"] for r in records if r.get("e2e_ms") is not None]
    e2e_p50 = statistics.median(ends) if ends else None
    out["window_s_needed"] = window_s_needed(e2e_p50, min_window_s)
    out.update(keep_up(records, window_s))
    out.update(in_system_growth(timeline, window_s, offset_s))
    broke = []
    if slo_holds is False:
        broke.append("slo")
    # The ratios' own edges: a request's latency differs from the median it is shifted by, so a
    # few requests cross the steady part's edges either way; KEEP_UP_SLACK of them are allowed.
    slack = KEEP_UP_SLACK / out["arrived"] if out.get("arrived") else 0.0
    ku = [out["keep_up_requests"], out["keep_up_tokens"]]
    if any(k is not None and k + slack < KEEP_UP for k in ku):
        broke.append("keep_up")
    mid, last = out["in_system_middle"], out["in_system_last"]
    out["steady"] = (
        None
        if mid is None or last is None
        else last <= mid * (1 + GROWTH) + GROWTH_SLACK * math.sqrt(max(mid, 1.0))
    )
    if out["steady"] is False:
        broke.append("steady")
    bad = sum(1 for r in records if r.get("error") or r.get("stopped"))
    out["refused_or_cut"] = bad
    if bad:
        broke.append("complete")
    # A window shorter than the rule asks for cannot show a rate holds (it may show it fails).
    if window_s + 1e-9 < out["window_s_needed"] * (1.0 - WINDOW_TOLERANCE):
        broke.append("window")
    out["broke"] = broke
    out["sustained"] = not broke
    return out


def why_not(j: dict) -> str:
    """One line: which rules a rate broke, with their figures ('' when it held)."""
    words = []
    for rule in j.get("broke", []):
        if rule == "slo":
            words.append("the SLO broke")
        elif rule == "keep_up":
            ku = [x for x in (j.get("keep_up_requests"), j.get("keep_up_tokens")) if x is not None]
            words.append(f"fell behind (completed {100 * min(ku):.0f}% of what arrived)")
        elif rule == "steady":
            words.append(
                f"still filling up ({j['in_system_middle']:.0f} -> {j['in_system_last']:.0f}"
                " requests in the system)"
            )
        elif rule == "complete":
            words.append(f"{j['refused_or_cut']} request(s) refused or cut")
        elif rule == "window":
            words.append(f"window {j['window_s']:.0f} s < the {j['window_s_needed']:.0f} s needed")
    return "; ".join(words)
