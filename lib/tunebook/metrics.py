"""Latency percentiles, throughput and goodput from per-request timings. Pure Python.

A request record (what the engine module returns per request) holds, in milliseconds:
``ttft_ms`` (arrival to first token), ``e2e_ms`` (arrival to last token), ``queue_ms``,
``tpot_ms`` (mean time per output token after the first), ``itl_ms`` (list of gaps between
streamed outputs; online mode only), and token counts.
"""

from __future__ import annotations

import math
import statistics
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
    return out


def meets_slo(record: dict, slo: dict) -> bool:
    for key, limit in slo.items():
        v = record.get(key)
        if isinstance(v, list):  # itl_ms: every gap must be within the limit; none is no gap
            v = max(v) if v else None
        if v is None:
            continue
        if v > limit:
            return False
    return True


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


def compare(a: Sequence[float], b: Sequence[float]) -> dict:
    """Ratio of medians b/a, and whether the gap is within the noise (the ranges overlap)."""
    sa, sb = spread(a), spread(b)
    ratio = sb["median"] / sa["median"] if sa["median"] else float("nan")
    overlap = not (sb["min"] > sa["max"] or sa["min"] > sb["max"])
    return {"ratio": ratio, "a": sa, "b": sb, "within_noise": overlap}
