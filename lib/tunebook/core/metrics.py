"""Latency percentiles, throughput and goodput from per-request timings. Pure Python.

A request record (what the engine module returns per request) holds, in milliseconds:
``ttft_ms`` (arrival to first token), ``e2e_ms`` (arrival to last token), ``queue_ms``,
``tpot_ms`` (mean time per output token after the first), ``itl_ms`` (list of gaps between
streamed outputs; online mode only), and token counts.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Iterable, Sequence

PERCENTILES = (50, 90, 99)
LATENCIES = ("ttft", "tpot", "itl", "e2e")


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default); NaN for no values."""
    xs = sorted(v for v in values if v is not None and not math.isnan(v))
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(records: list[dict], duration_s: float, slo: dict | None = None) -> dict:
    """Percentiles of every latency, throughputs, and goodput under ``slo``.

    ``slo`` maps metric names to limits, e.g. ``{"ttft_ms": 500, "tpot_ms": 50}``; a request is
    good when every one of its values is within its limit (as in vLLM's benchmark_serving).
    """
    if duration_s <= 0:
        raise ValueError(f"duration_s must be positive, got {duration_s}")
    out: dict[str, float] = {}
    for name in LATENCIES:
        key = f"{name}_ms"
        vals: list[float] = []
        for r in records:
            v = r.get(key)
            if isinstance(v, list):
                vals.extend(v)
            elif v is not None:
                vals.append(v)
        out[f"{name}_mean_ms"] = statistics.fmean(vals) if vals else float("nan")
        for q in PERCENTILES:
            out[f"{name}_p{q}_ms"] = percentile(vals, q)
    n = len(records)
    out_tokens = sum(r.get("output_tokens", 0) for r in records)
    in_tokens = sum(r.get("prompt_tokens", 0) for r in records)
    out.update(
        num_requests=n,
        duration_s=duration_s,
        request_throughput_rps=n / duration_s,
        output_throughput_tok_s=out_tokens / duration_s,
        total_token_throughput_tok_s=(in_tokens + out_tokens) / duration_s,
        prompt_tokens=in_tokens,
        output_tokens=out_tokens,
        cached_tokens=sum(r.get("cached_tokens", 0) or 0 for r in records),
    )
    if slo:
        good = sum(1 for r in records if meets_slo(r, slo))
        out["goodput_rps"] = good / duration_s
        out["slo_attainment_pct"] = 100.0 * good / n if n else float("nan")
        out["slo_holds"] = slo_holds(records, slo)
    errors = sum(1 for r in records if r.get("error"))
    if errors:
        out["failed_requests"] = errors
    return out


# --------------------------------------------------------------------------- the SLO
# The one definition, used by every measurement and label: a request is *good* when its own TTFT
# and its own TPOT are within their limits (vLLM's goodput definition; a failed request, or one
# that produced no token, is never good); the SLO *holds* at a load when at least
# ``attainment_pct`` of the requests are good. Capacity under the SLO is the highest request rate
# at which it holds.
SLO_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
DEFAULT_ATTAINMENT_PCT = 99.0


def broken_limits(record: dict, slo: dict) -> list[str]:
    """The limits of ``slo`` this one request broke, in ``SLO_KEYS`` order (its error aside).

    A list (``itl_ms``) breaks when any gap does; no value is a break only for ``ttft_ms`` (no
    first token: not served), not for ``tpot_ms`` (a one-token reply has no gap to judge)."""
    broken = []
    for key in SLO_KEYS:
        limit = slo.get(key)
        if limit is None:
            continue
        v = record.get(key)
        if isinstance(v, list):
            v = max(v) if v else None
        if (v is None and key == "ttft_ms") or (v is not None and v > limit):
            broken.append(key)
    return broken


def meets_slo(record: dict, slo: dict) -> bool:
    """Is this one request within every limit of ``slo``? (``attainment_pct`` is not a limit.)"""
    return not record.get("error") and not broken_limits(record, slo)


def slo_breaks(records: list[dict], slo: dict) -> dict[str, int]:
    """How many requests broke each limit of ``slo`` (one request may break several), and how
    many failed or were stopped: which limit decided a rate that failed (``broke_ttft_ms`` ...)."""
    out = {f"broke_{k}": 0 for k in SLO_KEYS if slo.get(k) is not None}
    out["broke_failed"] = 0
    for r in records:
        if r.get("error") or r.get("stopped"):
            out["broke_failed"] += 1
            continue
        for key in broken_limits(r, slo):
            out[f"broke_{key}"] += 1
    return out


def slo_attainment_pct(records: list[dict], slo: dict) -> float:
    """Share of requests that are good under ``slo`` (NaN for no requests)."""
    if not records:
        return float("nan")
    return 100.0 * sum(1 for r in records if meets_slo(r, slo)) / len(records)


def slo_holds(records: list[dict], slo: dict) -> bool:
    """The SLO holds when at least ``attainment_pct`` (default 99) % of requests are good."""
    need = float(slo.get("attainment_pct", DEFAULT_ATTAINMENT_PCT))
    return bool(records) and slo_attainment_pct(records, slo) >= need


def slo_text(slo: dict | None) -> str:
    """The SLO in words, as every label prints it."""
    if not slo:
        return "no SLO"
    names = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "itl_ms": "every chunk gap", "e2e_ms": "E2E"}
    bounds = " and ".join(f"{names[k]} <= {slo[k]:g} ms" for k in SLO_KEYS if slo.get(k))
    need = float(slo.get("attainment_pct", DEFAULT_ATTAINMENT_PCT))
    return f"{need:g}% of requests each with {bounds}"


# --------------------------------------------------------------------------- the noise rule
ALPHA = 0.1  # a gap counts only if ranges this cleanly apart would arise by chance at most 10%
# The smallest gap that matters: a configuration 0.3% faster over cleanly separated ranges
# (C8 on an H100, runs/h100-20261206e) is real and useless. A gap under 3% is "no practical
# difference", however clean the ranges: no setting is changed, no claim refuted, on it.
MIN_GAP = 0.03


def chance_apart(n_a: int, n_b: int) -> float:
    """Chance that the min-max ranges of n_a and n_b runs of one and the same configuration come
    out disjoint: 2 * n_a! * n_b! / (n_a + n_b)! (1/3 for 2 vs 2, 1/10 for 3 vs 3); 1 if a side is empty."""
    if not n_a or not n_b:
        return 1.0
    return 2 * math.factorial(n_a) * math.factorial(n_b) / math.factorial(n_a + n_b)


def spread(values: Iterable[float]) -> dict:
    """Median, min, max and relative spread ((max - min) / median) of repeated measurements."""
    xs = [v for v in values if v is not None and not math.isnan(v)]
    if not xs:
        nan = float("nan")
        return {"median": nan, "min": nan, "max": nan, "n": 0, "rel_spread": nan}
    med = statistics.median(xs)
    return {
        "median": med,
        "min": min(xs),
        "max": max(xs),
        "n": len(xs),
        "rel_spread": (max(xs) - min(xs)) / med if med else float("nan"),
    }


def compare(a: Sequence[float], b: Sequence[float], alpha: float = ALPHA) -> dict:
    """The one noise rule of tunebook: is the gap between configurations a and b real?

    Each side is a figure measured over several engine starts. The gap is *beyond the noise* when
    the two min-max ranges are disjoint **and** ranges that clean would come apart by chance at
    most ``alpha`` of the time if both were one configuration (``chance_apart``: 1/3 with two
    starts a side, so never enough; 1/10 with three) **and** the medians differ by at least
    ``MIN_GAP`` (3%). Otherwise it is within the noise (or, for a clean gap under 3%, "no
    practical difference"): ``within_noise`` is True either way, so nothing acts on it.

    Returns ``ratio`` (median b / median a), the ``a`` and ``b`` spreads, ``ranges_apart``,
    ``p_chance``, ``within_noise`` and ``noise`` (the wording every notebook prints).
    """
    sa, sb = spread(a), spread(b)
    ratio = sb["median"] / sa["median"] if sa["median"] else float("nan")
    measured = sa["n"] > 0 and sb["n"] > 0
    apart = measured and (sb["min"] > sa["max"] or sa["min"] > sb["max"])
    p = chance_apart(sa["n"], sb["n"])
    matters = not math.isnan(ratio) and abs(ratio - 1.0) >= MIN_GAP
    c = {
        "ratio": ratio,
        "a": sa,
        "b": sb,
        "ranges_apart": apart,
        "p_chance": p,
        "matters": matters,
        "within_noise": not (apart and p <= alpha and matters),
    }
    c["noise"] = noise_words(c)
    return c


def noise_words(c: dict) -> str:
    """The wording of the noise rule for one comparison (see ``compare``)."""
    na, nb = c["a"]["n"], c["b"]["n"]
    if not na or not nb:
        return "not measured on both sides"
    starts = f"{na} and {nb} engine starts"
    if not c["within_noise"]:
        return f"beyond noise: ranges apart over {starts}, p={c['p_chance']:.2f} by chance"
    if c["ranges_apart"] and c["p_chance"] <= ALPHA and not c.get("matters", True):
        gap = 100 * abs(c["ratio"] - 1)
        return (
            f"no practical difference: ranges apart over {starts}, but the gap ({gap:.2g}%) is"
            f" under the {100 * MIN_GAP:g}% that matters"
        )
    if c["ranges_apart"]:
        return (
            f"within noise: ranges apart, but {starts} come apart by chance p={c['p_chance']:.2f}"
        )
    return f"within noise: ranges overlap over {starts}"


# --------------------------------------------------------------------------- engine state over a run
class GaugeSampler(threading.Thread):
    """Polls ``snapshot()`` (vLLM's gauges and counters, in-process or scraped from /metrics)
    while a workload runs: a timeline, and the peaks of KV use and queue depths.

    An optional ``on_sample`` callback receives each sample (the live view in Jupyter uses it).
    """

    def __init__(self, snapshot, interval_s: float = 0.25, on_sample=None):
        super().__init__(daemon=True)
        self.snapshot, self.interval_s, self.on_sample = snapshot, interval_s, on_sample
        self.samples: list[dict] = []
        self.final: dict | None = None  # the sample stop() takes, when it succeeds
        self._stop_event = threading.Event()
        self._t0 = time.perf_counter()
        self.wall0 = time.time()  # t_s = 0 on the wall clock, to align samples with a schedule

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            self.sample()

    def sample(self) -> dict | None:
        try:
            snap = self.snapshot()
        except Exception:  # noqa: BLE001 - a missed sample is not a failed run
            return None
        if not snap:
            return None
        s = {"t_s": time.perf_counter() - self._t0, **snap}
        self.samples.append(s)
        if self.on_sample:
            self.on_sample(s)
        return s

    def stop(self) -> dict:
        """End sampling with one last sample (``final``: the run's closing counters); the peaks."""
        self._stop_event.set()
        self.join(timeout=10)
        self.final = self.sample()
        peak = lambda k: max((s.get(k, 0.0) for s in self.samples), default=0.0)  # noqa: E731
        return {
            "kv_cache_usage_peak_pct": 100.0 * peak("vllm:kv_cache_usage_perc"),
            "num_requests_running_peak": peak("vllm:num_requests_running"),
            "num_requests_waiting_peak": peak("vllm:num_requests_waiting"),
        }
