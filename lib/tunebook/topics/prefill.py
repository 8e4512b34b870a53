"""Prefill: the roofline floor from the model's shape, fits of TTFT against prompt length, and the
figures notebook 03 reports (TTFT per prompt class, C7, C8, C10).

Pure Python and numpy (no scipy, no vllm), except ``serve_default_batched_tokens`` which reads the
installed vLLM's defaults when asked.

The arithmetic. A prefill of S tokens through a decoder-only transformer costs

    FLOPs(S) = 2 * N * S  +  2 * L * H * d * S**2  +  2 * V * h

where N is the parameter count without the embedding table (every token passes every weight
matrix once, a multiply and an add each), the middle term is causal attention (QK^T and PV, 2 S^2 d
each per head and layer, halved by the causal mask), and the last is the logits of the one token
that is sampled. For ERNIE-4.5-0.3B: 5.1e8 * S + 73,728 * S^2 (+ 2.1e8): linear, then quadratic
past S ~ 6,900, never exponential. The memory floor is reading every weight once plus writing the
KV cache of S tokens. The time floor is the larger of FLOPs / peak and bytes / bandwidth.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tunebook.core.claims import verdict
from tunebook.core.metrics import compare, percentile, spread
from tunebook.core.model import ModelShape
from tunebook.core.results import point_row
from tunebook.engine import adapter
from tunebook.topics import plots

# --------------------------------------------------------------------------- roofline


def prefill_coefficients(shape: ModelShape) -> dict[str, float]:
    """FLOPs(S) = const + linear * S + quadratic * S^2, and the bytes a prefill must move.

    All from the model's config: H query heads of head_dim d (which need not be hidden / H:
    ERNIE-4.5 and Qwen3 have H x d = 2 h), the embedding table counted once where it is tied,
    and the weight bytes one pass reads (an untied embedding table only as gathered rows).
    """
    non_embedding = shape.non_embedding_params
    return {
        "non_embedding_params": float(non_embedding),
        "linear_flops": 2.0 * non_embedding,
        "quadratic_flops": 2.0
        * shape.num_hidden_layers
        * shape.num_attention_heads
        * shape.head_dim,
        # logits of the sampled token (tied or not, a V x h matmul)
        "const_flops": 2.0 * shape.embedding_params,
        "weight_bytes": float(shape.weight_bytes_read()),
        "kv_bytes_per_token": float(shape.kv_bytes_per_token()),
    }


def prefill_flops(shape: ModelShape, prompt_len) -> np.ndarray:
    c = prefill_coefficients(shape)
    s = np.asarray(prompt_len, dtype=float)
    return c["const_flops"] + c["linear_flops"] * s + c["quadratic_flops"] * s**2


def crossover_len(shape: ModelShape) -> float:
    """Prompt length where the attention term overtakes the weight term (S = linear / quadratic)."""
    c = prefill_coefficients(shape)
    return c["linear_flops"] / c["quadratic_flops"]


def prefill_floor_ms(
    shape: ModelShape, prompt_len, peak_tflops: float, hbm_tb_s: float
) -> np.ndarray:
    """Roofline floor of one prefill (ms): max(compute time at peak, memory time at peak bandwidth)."""
    c = prefill_coefficients(shape)
    s = np.asarray(prompt_len, dtype=float)
    compute_s = prefill_flops(shape, s) / (peak_tflops * 1e12)
    memory_s = (c["weight_bytes"] + c["kv_bytes_per_token"] * s) / (hbm_tb_s * 1e12)
    return 1e3 * np.maximum(compute_s, memory_s)


# --------------------------------------------------------------------------- fits
# Each model is T(S; params). Linear models are solved by least squares; the exponential ones by
# least squares for their linear coefficients at each growth rate b, with b searched (a profile).
# The objective everywhere is the relative residual (pred - T) / T: TTFT spans orders of
# magnitude, and an absolute objective would let the longest prompts decide alone.

MODELS = ("linear", "linear+quadratic", "exponential", "constant+exponential")
N_PARAMS = {"linear": 2, "linear+quadratic": 3, "exponential": 2, "constant+exponential": 3}
FORMULAS = {
    "linear": "c0 + c1*S",
    "linear+quadratic": "c0 + c1*S + c2*S^2",
    "exponential": "a*exp(b*S)",
    "constant+exponential": "c + a*exp(b*S)",
}


def _basis(model: str, s: np.ndarray, b: float | None = None) -> np.ndarray:
    if model == "linear":
        return np.stack([np.ones_like(s), s], axis=1)
    if model == "linear+quadratic":
        return np.stack([np.ones_like(s), s, s**2], axis=1)
    if model == "exponential":
        return np.exp(b * s)[:, None]
    if model == "constant+exponential":
        return np.stack([np.ones_like(s), np.exp(b * s)], axis=1)
    raise ValueError(f"unknown model {model!r}; known: {MODELS}")


def _solve(model: str, s: np.ndarray, t: np.ndarray, b: float | None = None):
    x = _basis(model, s, b)
    coef, *_ = np.linalg.lstsq(x / t[:, None], np.ones_like(t), rcond=None)
    rel = x @ coef / t - 1.0
    return coef, float(np.sqrt(np.mean(rel**2)))


def _fit_rate(model: str, s: np.ndarray, t: np.ndarray) -> tuple[float, np.ndarray, float]:
    """Growth rate b > 0 minimising the relative residual: log grid, then golden-section."""
    span = float(s.max() - s.min()) or 1.0
    # b from "doubles once per 1000 ranges" (a near-line) to "doubles 60 times over the range"
    grid = np.geomspace(1e-3 * math.log(2) / span, 60 * math.log(2) / span, 121)
    errs = [_solve(model, s, t, b)[1] for b in grid]
    i = int(np.nanargmin(errs))
    lo, hi = math.log(grid[max(i - 1, 0)]), math.log(grid[min(i + 1, len(grid) - 1)])
    g = (math.sqrt(5) - 1) / 2
    a, c = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fc = _solve(model, s, t, math.exp(a))[1], _solve(model, s, t, math.exp(c))[1]
    for _ in range(60):
        if fa < fc:
            hi, c, fc = c, a, fa
            a = hi - g * (hi - lo)
            fa = _solve(model, s, t, math.exp(a))[1]
        else:
            lo, a, fa = a, c, fc
            c = lo + g * (hi - lo)
            fc = _solve(model, s, t, math.exp(c))[1]
    b = math.exp((lo + hi) / 2)
    coef, err = _solve(model, s, t, b)
    return b, coef, err


@dataclass
class Fit:
    """One model fitted to (prompt length, TTFT) points."""

    model: str
    params: dict[str, float]
    rms_rel_pct: float  # in-sample RMS of (pred - T) / T, percent
    max_rel_pct: float
    extrap_rms_rel_pct: float | None = None  # fitted on the shorter half, scored on the longer
    n: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def formula(self) -> str:
        return FORMULAS[self.model]

    def predict(self, prompt_len) -> np.ndarray:
        s = np.asarray(prompt_len, dtype=float)
        p = self.params
        if self.model == "linear":
            return p["c0"] + p["c1"] * s
        if self.model == "linear+quadratic":
            return p["c0"] + p["c1"] * s + p["c2"] * s**2
        if self.model == "exponential":
            return p["a"] * np.exp(p["b"] * s)
        return p["c"] + p["a"] * np.exp(p["b"] * s)

    def row(self) -> dict:
        r = {
            "model": self.model,
            "formula": self.formula,
            "n": self.n,
            "rms_rel_residual_pct": self.rms_rel_pct,
            "max_rel_residual_pct": self.max_rel_pct,
            "extrapolation_rms_rel_pct": self.extrap_rms_rel_pct,
        }
        r.update({f"param_{k}": v for k, v in self.params.items()})
        r.update(self.extra)
        return r


def _fit_raw(model: str, s: np.ndarray, t: np.ndarray) -> tuple[dict, float]:
    if model in ("linear", "linear+quadratic"):
        coef, _ = _solve(model, s, t)
        names = ["c0", "c1", "c2"][: len(coef)]
        return dict(zip(names, map(float, coef), strict=True)), 0.0
    b, coef, _ = _fit_rate(model, s, t)
    if model == "exponential":
        return {"a": float(coef[0]), "b": b}, b
    return {"c": float(coef[0]), "a": float(coef[1]), "b": b}, b


def fit(model: str, prompt_len: Sequence[float], ttft_ms: Sequence[float]) -> Fit:
    """Fit one model; also score it out of sample (fit on S <= median, predict S > median)."""
    s = np.asarray(prompt_len, dtype=float)
    t = np.asarray(ttft_ms, dtype=float)
    ok = np.isfinite(s) & np.isfinite(t) & (t > 0)
    s, t = s[ok], t[ok]
    if len(s) < N_PARAMS[model] + 1:
        raise ValueError(f"{model}: {len(s)} points, need at least {N_PARAMS[model] + 1}")
    params, _ = _fit_raw(model, s, t)
    f = Fit(model, params, float("nan"), float("nan"), n=len(s))
    rel = f.predict(s) / t - 1.0
    f.rms_rel_pct = 100.0 * float(np.sqrt(np.mean(rel**2)))
    f.max_rel_pct = 100.0 * float(np.max(np.abs(rel)))
    if "b" in params:
        span = float(s.max() - s.min())
        f.extra = {
            "doubling_tokens": math.log(2) / params["b"],
            "growth_over_range": math.exp(params["b"] * span),
        }
    med = float(np.median(s))
    lo, hi = s <= med, s > med
    if lo.sum() >= N_PARAMS[model] + 1 and hi.sum() >= 1:
        p_lo, _ = _fit_raw(model, s[lo], t[lo])
        g = Fit(model, p_lo, 0.0, 0.0)
        err = g.predict(s[hi]) / t[hi] - 1.0
        f.extrap_rms_rel_pct = 100.0 * float(np.sqrt(np.mean(err**2)))
    return f


def fit_all(prompt_len, ttft_ms, models: Sequence[str] = MODELS) -> list[Fit]:
    return [fit(m, prompt_len, ttft_ms) for m in models]


def fits_table(fits: list[Fit]):
    import pandas as pd

    return pd.DataFrame([f.row() for f in fits])


def compare_fits(
    runs: list[list[Fit]],
    a: str = "linear+quadratic",
    b: str = "constant+exponential",
    margin: float = 1.5,
    score: str = "rms_rel_pct",
) -> dict:
    """Which of two models fits better, run by run; robust when it wins every run by ``margin``x.

    ``runs`` holds one list of fits per engine start. Returns the winner (or None), whether it is
    robust, and the residual ratios b/a per run (> 1: a fits better).
    """
    ratios = []
    for fits in runs:
        by = {f.model: f for f in fits}
        ea, eb = getattr(by[a], score), getattr(by[b], score)
        if ea is None or eb is None or not (ea > 0 and eb > 0):
            continue
        ratios.append(eb / ea)
    if not ratios:
        return {"winner": None, "robust": False, "ratios": [], "a": a, "b": b, "score": score}
    if all(r > margin for r in ratios):
        winner, robust = a, True
    elif all(r < 1 / margin for r in ratios):
        winner, robust = b, True
    else:
        med = float(np.median(ratios))
        winner, robust = (a if med > 1 else b), False
    return {"winner": winner, "robust": robust, "ratios": ratios, "a": a, "b": b, "score": score}


NOISY_PCT = 25.0  # above this RMS relative residual for the best fit, shapes cannot be told apart


def ranking_lines(
    fits: list[Fit], cmp_in: dict, cmp_out: dict, noisy_pct: float = NOISY_PCT
) -> list[str]:
    """The fitted models and, where the data allow, which fits better (deterministic text)."""
    lines = [f"{f.model:>22}: TTFT = {f.formula}" for f in fits]
    if min(f.rms_rel_pct for f in fits) > noisy_pct:
        lines.append(
            f"too noisy to rank: the best fit leaves more than {noisy_pct:.0f}% RMS residual"
        )
        return lines
    for label, c in (("in-sample residual", cmp_in), ("extrapolation to the longer half", cmp_out)):
        if c["robust"]:
            lines.append(f"{label}: {c['winner']} fits better in every engine start (by >= 1.5x)")
        else:
            lines.append(f"{label}: no robust winner between {c['a']} and {c['b']}")
    return lines


# --------------------------------------------------------------------------- per-request records


def ok_points(results: list[dict], config: str | None = None) -> list[dict]:
    return [
        p
        for p in results
        if p.get("status") == "ok" and (config is None or p.get("config") == config)
    ]


def curve_points(results: list[dict], field: str = "prefill_ms"):
    """One row per request of the TTFT curve: config, repeat, prompt length and its time alone.

    ``alone_ms`` is ``field`` of the request record: ``prefill_ms`` (engine clock, scheduled to
    first token: the prefill itself, without queueing) or ``ttft_ms`` (from arrival).
    """
    import pandas as pd

    rows = []
    for p in ok_points(results):
        for r in p.get("requests") or []:
            if r.get(field) is None:
                continue
            rows.append(
                {
                    "config": p["config"],
                    "repeat": p["repeat"],
                    "prompt_tokens": r["prompt_tokens"],
                    "alone_ms": r[field],
                    "ttft_ms": r.get("ttft_ms"),
                    "prefill_ms": r.get("prefill_ms"),
                    "queue_ms": r.get("queue_ms"),
                    "cached_tokens": r.get("cached_tokens", 0),
                }
            )
    df = pd.DataFrame(rows)
    if len(df):
        df = df.sort_values(["config", "repeat", "prompt_tokens"]).reset_index(drop=True)
    return df


CLASSES = ("short", "medium", "long")


def length_class(prompt_tokens: int, bounds: Sequence[int]) -> str:
    """short < bounds[0] <= medium < bounds[1] <= long (the article's 100 / 500 split)."""
    lo, hi = bounds
    return "short" if prompt_tokens < lo else "medium" if prompt_tokens < hi else "long"


def class_ttft(
    results: list[dict], bounds: Sequence[int] | None = None, q: float = 50
) -> dict[tuple[str, int], dict[str, float]]:
    """TTFT percentile per (config, repeat) and request class, plus 'mixed' (all requests).

    Classes come from the request's tag (the mixed workload tags short and long) or, with
    ``bounds``, from its prompt length.
    """
    out: dict[tuple[str, int], dict[str, float]] = {}
    for p in ok_points(results):
        groups: dict[str, list[float]] = {}
        for r in p.get("requests") or []:
            if r.get("ttft_ms") is None:
                continue
            cls = length_class(r["prompt_tokens"], bounds) if bounds else (r.get("tag") or "all")
            groups.setdefault(cls, []).append(r["ttft_ms"])
            groups.setdefault("mixed", []).append(r["ttft_ms"])
        out[(p["config"], p["repeat"])] = {k: percentile(v, q) for k, v in groups.items()} | {
            f"n_{k}": len(v) for k, v in groups.items()
        }
    return out


def mixed_load_table(results: list[dict], classes=("short", "long", "mixed")):
    """One row per point of the mixed-load (batched-tokens) sweep: headline metrics and TTFT per
    request class."""
    import pandas as pd

    p50 = class_ttft(results, q=50)
    p90 = class_ttft(results, q=90)
    cols = (
        "config",
        "repeat",
        "max_num_batched_tokens",
        "output_throughput_tok_s",
        "total_token_throughput_tok_s",
        "itl_p50_ms",
        "itl_p99_ms",
        "tpot_p50_ms",
        "num_preemptions",
    )
    rows = []
    for p in ok_points(results):
        key = (p["config"], p["repeat"])
        flat = point_row(p)
        row = {c: flat.get(c) for c in cols}
        for c in classes:
            row[f"ttft_{c}_p50_ms"] = p50[key].get(c, float("nan"))
            row[f"ttft_{c}_p90_ms"] = p90[key].get(c, float("nan"))
            row[f"n_{c}"] = p50[key].get(f"n_{c}", 0)
        rows.append(row)
    df = pd.DataFrame(rows)
    if len(df):
        df = df.sort_values(["max_num_batched_tokens", "repeat"]).reset_index(drop=True)
    return df


def long_form(df, x: str, columns: dict[str, str]):
    """Melt metric columns into (x, metric, value, repeat) rows for grouped bar charts."""
    import pandas as pd

    parts = []
    for label, col in columns.items():
        part = df[[x, "repeat", col]].rename(columns={col: "value"})
        part["metric"] = label
        part["status"] = "ok"
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


# --------------------------------------------------------------------------- vLLM's defaults


def serve_default_batched_tokens() -> int | None:
    """max_num_batched_tokens that `vllm serve` picks here (see adapter.serve_default_batched_tokens)."""

    return adapter.serve_default_batched_tokens()


# --------------------------------------------------------------------------- verdicts

ARTICLE_C10_S = {  # the article's prefill table: TTFT (s) before -> after its setting change
    "short": (0.8, 0.3),
    "medium": (2.5, 1.2),
    "long": (6.8, 3.1),
    "mixed": (3.2, 1.5),
}


def _fmt_ms(x: float) -> str:
    if x is None or not np.isfinite(x):
        return "n/a"
    return f"{x / 1e3:.2f} s" if x >= 1000 else f"{x:.1f} ms" if x >= 10 else f"{x:.2f} ms"


def c7_verdict(
    fits_pooled: list[Fit],
    cmp_in: dict,
    cmp_out: dict,
    curve,
    evidence: str,
    speed_meaningful: bool,
    crossover: float,
    noisy_pct: float = NOISY_PCT,
) -> dict:
    """C7 (prefill grows exponentially) from the fits: in-sample and out-of-sample comparisons.

    refuted: linear+quadratic fits better in every engine start (in or out of sample) and the
    exponential never does; partly: the reverse, with real exponential growth; inconclusive:
    no robust winner, or the data too noisy (best fit's RMS residual above ``noisy_pct``).
    """

    by = {f.model: f for f in fits_pooled}
    q, e = by["linear+quadratic"], by["constant+exponential"]
    s, t = curve["prompt_tokens"].to_numpy(float), curve["alone_ms"].to_numpy(float)
    lo_sel, hi_sel = s <= np.quantile(s, 0.1), s >= np.quantile(s, 0.9)
    t_lo, t_hi = float(np.median(t[lo_sel])), float(np.median(t[hi_sel]))
    s_lo, s_hi = float(np.median(s[lo_sel])), float(np.median(s[hi_sel]))
    figure = (
        f"prefill alone {_fmt_ms(t_lo)} at ~{s_lo:.0f} tokens -> {_fmt_ms(t_hi)} at ~{s_hi:.0f}"
        f" tokens"
        f" (x{t_hi / t_lo:.1f} for x{s_hi / s_lo:.0f} tokens); RMS residual linear+quadratic"
        f" {q.rms_rel_pct:.1f}% vs constant+exponential {e.rms_rel_pct:.1f}% (fit on the shorter"
        f" half, error on the longer: {_pct(q.extrap_rms_rel_pct)} vs {_pct(e.extrap_rms_rel_pct)})"
    )
    doubling = e.extra.get("doubling_tokens", float("inf"))
    span = float(s.max() - s.min())
    spread_txt = (
        f"residual ratio exp/poly per engine start: in-sample "
        f"{', '.join(_ratio(r) for r in cmp_in['ratios'])}; out-of-sample "
        f"{', '.join(_ratio(r) for r in cmp_out['ratios'])}"
    )
    best_rms = min(f.rms_rel_pct for f in fits_pooled)
    notes = [
        f"FLOP arithmetic for this shape is linear + quadratic (quadratic term dominates past"
        f" S ~ {crossover:,.0f} tokens); the fitted exponential doubles every {doubling:,.0f}"
        f" tokens over a {span:,.0f}-token range."
    ]
    poly_wins = [c for c in (cmp_in, cmp_out) if c["robust"] and c["winner"] == "linear+quadratic"]
    exp_wins = [
        c for c in (cmp_in, cmp_out) if c["robust"] and c["winner"] == "constant+exponential"
    ]
    if best_rms > noisy_pct:
        v = "inconclusive"
        notes.insert(
            0,
            f"too noisy to tell shapes: the best of four fits leaves {best_rms:.0f}% RMS relative"
            f" residual (gate: {noisy_pct:.0f}%).",
        )
    elif poly_wins and not exp_wins:
        v = "refuted"
        notes.insert(0, "linear+quadratic fits better in every engine start (by >= 1.5x).")
    elif exp_wins and not poly_wins and doubling < span:
        v = "partly"
        notes.insert(
            0,
            "an exponential fits better here, against the FLOP arithmetic: look for"
            " a non-compute cause (memory pressure, preemption, chunking).",
        )
    else:
        v = "inconclusive"
        notes.insert(
            0,
            "the two fits are within noise of each other: the curve does not have the curvature"
            " to tell them apart (an exponential that doubles this slowly is a near-line).",
        )
    if not speed_meaningful:
        notes.append(
            "CPU with a tiny model: fixed per-step overhead dominates and the shape says nothing"
            " about a GPU; the GPU profile runs the same fits."
        )
    return verdict("C7", v, figure, evidence, spread=spread_txt, note=" ".join(notes))


def _pct(x: float | None) -> str:
    if x is None or not np.isfinite(x):
        return "n/a"
    return f"{x:.1f}%" if x < 1000 else ">1000%"


def _ratio(r: float) -> str:
    return f"{r:.2f}" if r < 1000 else ">1000"


def _series(df, col: str, config_col: str, value) -> list[float]:
    return df.loc[df[config_col] == value, col].dropna().tolist()


def c8_verdict(
    df, good: int, evidence: str, speed_meaningful: bool, serve_default: int | None
) -> dict:
    """C8 (2048 is a good start): 2048 against the best swept value on short-request TTFT, ITL
    tail and throughput, gaps judged against the spread over engine starts."""

    col = "max_num_batched_tokens"
    values = sorted(df[col].dropna().unique())
    metrics = {  # name -> (column, lower is better)
        "short-request TTFT p90": ("ttft_short_p90_ms", True),
        "ITL p99": ("itl_p99_ms", True),
        "output throughput": ("output_throughput_tok_s", False),
    }
    if good not in values:
        return verdict("C8", "inconclusive", f"{good} was not swept", evidence)
    parts, worse, beats = [], [], []
    for name, (c, low) in metrics.items():
        series = {v: _series(df, c, col, v) for v in values}
        med = {v: spread(x)["median"] for v, x in series.items()}
        best = min(med, key=med.get) if low else max(med, key=med.get)
        unit = "tok/s" if "throughput" in name else "ms"
        if best == good:
            # how 2048 fares against every other value: does the sweep resolve anything?
            gaps = {v: compare(series[good], x) for v, x in series.items() if v != good}
            won = [int(v) for v, g in gaps.items() if not g["within_noise"]]
            beats += won
            parts.append(
                f"{name}: {good} is best ({med[good]:.1f} {unit}; beyond noise against"
                f" {', '.join(map(str, won)) or 'none'})"
            )
        else:
            cmp = compare(series[best], series[good])
            parts.append(
                f"{name}: best {int(best)} ({med[best]:.1f} {unit}), {good} {med[good]:.1f} {unit}"
                f" ({cmp['noise']})"
            )
            if not cmp["within_noise"]:
                worse.append(name)
    # confirmed: never beaten beyond the noise, and better than some value beyond it;
    # inconclusive: nothing resolved either way; partly / refuted: beaten on some / every metric.
    if not worse:
        v = "confirmed" if beats else "inconclusive"
    elif len(worse) < len(metrics):
        v = "partly"
    else:
        v = "refuted"
    note = (
        f"swept {', '.join(str(int(x)) for x in values)} under a mixed load with arrivals."
        f" vllm serve's own default here: {serve_default or 'unknown'}."
    )
    if v == "inconclusive":
        note += " No value differs from 2048 beyond the spread over engine starts."
    if not speed_meaningful:
        note += (
            " CPU with a tiny model: which value wins says nothing about a GPU, where prefill"
            " chunks cost far more relative to decode steps."
        )
    return verdict("C8", v, "; ".join(parts), evidence, note=note)


def c10_table(
    loaded,
    isolated: dict[str, list[float]] | None,
    before: int,
    after: int,
    classes=("short", "medium", "long", "mixed"),
):
    """The article's TTFT per class next to the measured one, before -> after its setting change.

    ``loaded`` is mixed_load_table() of the mixed-load sweep (p50 TTFT per class and engine start);
    ``isolated`` maps a class to the TTFT of requests run alone (reference, one setting).
    """
    import pandas as pd

    col = "max_num_batched_tokens"
    rows = []
    for c in classes:
        ab, aa = ARTICLE_C10_S[c]
        key = f"ttft_{c}_p50_ms"
        b = loaded.loc[loaded[col] == before, key].dropna().tolist() if key in loaded else []
        a = loaded.loc[loaded[col] == after, key].dropna().tolist() if key in loaded else []
        cmp = compare(b, a) if b and a else None
        iso = (isolated or {}).get(c) or []
        rows.append(
            {
                "class": c,
                "article before (s)": ab,
                "article after (s)": aa,
                "article after/before": round(aa / ab, 2),
                f"measured before, mnbt={before} (ms)": spread(b)["median"] if b else float("nan"),
                f"measured after, mnbt={after} (ms)": spread(a)["median"] if a else float("nan"),
                "measured after/before": cmp["ratio"] if cmp else float("nan"),
                "within noise": cmp["within_noise"] if cmp else None,
                "noise": cmp["noise"] if cmp else "not measured",
                "engine starts": f"{len(b)} / {len(a)}",
                "alone, one at a time (ms)": float(np.median(iso)) if iso else float("nan"),
                "alone: requests": len(iso),
            }
        )
    return pd.DataFrame(rows)


def c10_verdict(table, evidence: str, speed_meaningful: bool) -> dict:
    """C10 from c10_table: confirmed if every measured class improves to <= 0.6x beyond the
    noise; partly if some do; refuted if one gets worse beyond the noise; not reproducible if
    every ratio is within 0.8-1.25 and the noise; inconclusive otherwise."""

    measured = table.dropna(subset=["measured after/before"])
    if measured.empty:
        return verdict("C10", "inconclusive", "no class measured before and after", evidence)
    bits, improved = [], 0
    for _, r in measured.iterrows():
        b = r[[c for c in table.columns if c.startswith("measured before")][0]]
        a = r[[c for c in table.columns if c.startswith("measured after,")][0]]
        tag = r["noise"]
        bits.append(
            f"{r['class']}: {_fmt_ms(b)} -> {_fmt_ms(a)} (x{r['measured after/before']:.2f},"
            f" {tag}; article x{r['article after/before']:.2f})"
        )
        if not r["within noise"] and r["measured after/before"] <= 0.6:
            improved += 1
    worse = sum(
        1
        for _, r in measured.iterrows()
        if not r["within noise"] and r["measured after/before"] > 1
    )
    unchanged = all(0.8 <= r <= 1.25 for r in measured["measured after/before"])
    if improved == len(measured):
        v = "confirmed"
    elif improved:
        v = "partly"
    elif worse:
        v = "refuted"
    elif unchanged:
        v = "not reproducible"
    else:
        v = "inconclusive"
    missing = [c for c in table["class"] if c not in set(measured["class"])]
    note = "the article's change halves TTFT in every class; measured ratios above."
    if missing:
        note += f" Not in the mixed load: {', '.join(missing)} (see the 'alone' column)."
    if not speed_meaningful:
        note += (
            " CPU with a tiny model: absolute TTFTs (ms, not the article's seconds) and ratios say"
            " nothing about a GPU."
        )
    return verdict("C10", v, "; ".join(bits), evidence, note=note)


def fit_curves(fits: list[Fit], s_max: float, n: int = 200) -> dict[str, tuple]:
    """x/y arrays of each fitted curve over [1, s_max], for plotting."""
    xs = np.linspace(1, s_max, n)
    return {f"{f.model} ({f.rms_rel_pct:.1f}%)": (xs, f.predict(xs)) for f in fits}


def doc_coefficients(shape: ModelShape) -> str:
    c = prefill_coefficients(shape)
    return (
        f"FLOPs(S) = {c['linear_flops']:.4g} * S + {c['quadratic_flops']:,.0f} * S^2"
        f" + {c['const_flops']:.3g}"
    )


# --------------------------------------------------------------------------- notebook 03's cells


@dataclass
class Plan:
    """What notebook 03 measures, from its parameters and the installed vLLM."""

    max_model_len: int
    serve_default: int | None  # max_num_batched_tokens that `vllm serve` picks here
    before: int  # C10 'before' value of max_num_batched_tokens
    after: int  # C10 'after' value
    values: list[int]  # max_num_batched_tokens values swept under mixed load
    curve_max_prompt_len: int  # longest prompt of the TTFT curve
    mixed_mode: str
    mixed_sweep: str  # sweep name of the mixed load


def plan(
    engine_settings: dict,
    shape: ModelShape,
    values: Sequence[int],
    before: int | None,
    after: int,
    curve_max_prompt_len: int | None,
    mixed_mode: str,
    serve_default: int | None,
) -> Plan:
    """The notebook's derived settings: ``before`` None is vllm serve's default here (an error if
    the installed vLLM does not say it); the swept values always include before and after; the
    curve runs up to max_model_len - 1 unless given."""
    max_model_len = int(engine_settings.get("max_model_len") or shape.max_position_embeddings)
    before = before or serve_default
    if before is None:
        raise ValueError(
            "the installed vLLM does not say its server default: set before_max_num_batched_tokens"
        )
    return Plan(
        max_model_len=max_model_len,
        serve_default=serve_default,
        before=before,
        after=after,
        values=sorted(set(values) | {before, after}),
        curve_max_prompt_len=curve_max_prompt_len or max_model_len - 1,
        mixed_mode=mixed_mode,
        # served results are kept apart from in-process ones: they are different measurements
        mixed_sweep="max_num_batched_tokens"
        if mixed_mode == "online"
        else f"max_num_batched_tokens_{mixed_mode}",
    )


def setup_text(p: Plan, platform: str, vllm_version: str, model: str) -> str:
    """Where the notebook runs and what it sweeps, in three lines."""
    return (
        f"platform {platform}, vLLM {vllm_version}, model {model}, max_model_len {p.max_model_len}\n"
        f"vllm serve's max_num_batched_tokens here: {p.serve_default}; before {p.before} -> after"
        f" {p.after}\n"
        f"max_num_batched_tokens swept under mixed load ({p.mixed_mode}): {p.values}"
    )


def arithmetic_text(shape: ModelShape, peak_tflops: float | None, hbm_tb_s: float | None) -> str:
    """The prefill FLOPs polynomial, the shape's figures, the crossover length, the bytes moved
    and whether a roofline floor is drawn."""
    c = prefill_coefficients(shape)
    floor = (
        f"{peak_tflops} TFLOP/s, {hbm_tb_s} TB/s"
        if peak_tflops is not None and hbm_tb_s is not None
        else "not drawn (no peak figures for this device)"
    )
    return "\n".join(
        [
            doc_coefficients(shape),
            f"non-embedding parameters N = {c['non_embedding_params']:,.0f};"
            f" L={shape.num_hidden_layers}, H={shape.num_attention_heads}, d={shape.head_dim}",
            f"attention term overtakes the weight term at S = {crossover_len(shape):,.0f} tokens",
            f"weights {c['weight_bytes'] / 1e9:.3f} GB, KV {c['kv_bytes_per_token']:,.0f} B per token",
            f"roofline floor: {floor}",
        ]
    )


def curve_configs(max_num_batched_tokens: int) -> dict[str, dict]:
    """The TTFT curve's one configuration: one request at a time (max_num_seqs 1)."""
    return {
        f"max_num_batched_tokens={max_num_batched_tokens}": {
            "settings": {"max_num_batched_tokens": max_num_batched_tokens, "max_num_seqs": 1}
        }
    }


def curve_workload(num_requests: int, min_prompt_len: int, max_prompt_len: int) -> dict:
    """Requests of uniformly random prompt length, one output token each."""
    return {
        "kind": "uniform",
        "num_requests": num_requests,
        "min_prompt_len": min_prompt_len,
        "max_prompt_len": max_prompt_len,
        "output_len": 1,
        "seed": 0,
    }


def failures_text(results: list[dict]) -> str:
    """One line per point that failed: its id and error; empty when none did."""
    return "\n".join(
        f"{p['point_id']} failed: {p.get('error')}" for p in results if p.get("status") != "ok"
    )


def curve_summary(curve):
    """Per engine start: requests, shortest and longest prompt, fastest/median/slowest prefill."""
    return curve.groupby("repeat").agg(
        requests=("alone_ms", "size"),
        shortest=("prompt_tokens", "min"),
        longest=("prompt_tokens", "max"),
        fastest_ms=("alone_ms", "min"),
        median_ms=("alone_ms", "median"),
        slowest_ms=("alone_ms", "max"),
    )


def compare_per_start(curve) -> tuple[dict, dict]:
    """The four models fitted per engine start, compared in sample and out of sample
    (compare_fits on ``rms_rel_pct``, then on ``extrap_rms_rel_pct``)."""
    per_run = [fit_all(g["prompt_tokens"], g["alone_ms"]) for _, g in curve.groupby("repeat")]
    return (
        compare_fits(per_run, score="rms_rel_pct"),
        compare_fits(per_run, score="extrap_rms_rel_pct"),
    )


CURVE_TITLES = {
    False: "Prefill time of a request alone, against its prompt length (fits: RMS relative residual)",
    True: "The same on log-log axes: slope 1 is linear, slope 2 quadratic; an exponential bends up",
}


def curve_figure(
    curve,
    fits: list[Fit],
    shape: ModelShape,
    peak_tflops: float | None = None,
    hbm_tb_s: float | None = None,
    log: bool = False,
):
    """Prefill time alone against prompt length, one colour per engine start, with the
    linear+quadratic and constant+exponential fits and, given peak figures, the roofline floor
    (dashed); ``log``: log-log axes."""
    s_max = curve["prompt_tokens"].max()
    points = {
        f"measured, engine start {r}": (g["prompt_tokens"], g["alone_ms"])
        for r, g in curve.groupby("repeat")
    }
    shown = [f for f in fits if f.model in ("linear+quadratic", "constant+exponential")]
    curves = fit_curves(shown, s_max)
    dashed: tuple[str, ...] = ()
    if peak_tflops is not None and hbm_tb_s is not None:
        xs = np.linspace(1, s_max, 200)
        curves["roofline floor"] = (xs, prefill_floor_ms(shape, xs, peak_tflops, hbm_tb_s))
        dashed = ("roofline floor",)
    return plots.scatter_with_curves(
        points,
        curves,
        title=CURVE_TITLES[log],
        xaxis="prompt tokens",
        yaxis="prefill time alone (ms)",
        log_x=log,
        log_y=log,
        dashed=dashed,
    )


def floor_table(curve, shape: ModelShape, peak_tflops: float, hbm_tb_s: float, bins: int = 6):
    """Median prefill time alone against the roofline floor, in ``bins`` prompt-length bins."""
    import pandas as pd

    d = curve.assign(
        floor_ms=prefill_floor_ms(shape, curve["prompt_tokens"], peak_tflops, hbm_tb_s)
    )
    d["floor / measured"] = d["floor_ms"] / d["alone_ms"]
    cols = ["alone_ms", "floor_ms", "floor / measured"]
    return d.groupby(pd.cut(d["prompt_tokens"], bins), observed=True)[cols].median()


def mixed_workload(
    num_requests: int,
    short_len: int,
    long_len: int,
    long_fraction: float,
    output_len: int,
    long_output_len: int,
    request_rate: float,
) -> dict:
    """Short and long prompts arriving as a Poisson process at ``request_rate`` per second."""
    return {
        "kind": "mixed",
        "num_requests": num_requests,
        "short_len": short_len,
        "long_len": long_len,
        "long_fraction": long_fraction,
        "output_len": output_len,
        "long_output_len": long_output_len,
        "request_rate": request_rate,
        "seed": 0,
    }


def swept_results(results: list[dict], values: Sequence[int]) -> list[dict]:
    """The points whose max_num_batched_tokens is among ``values`` (a resumed run folder may hold
    others)."""
    return [p for p in results if (p.get("settings") or {}).get("max_num_batched_tokens") in values]


MIXED_COLUMNS = [
    "max_num_batched_tokens",
    "repeat",
    "n_short",
    "n_long",
    "ttft_short_p50_ms",
    "ttft_short_p90_ms",
    "ttft_long_p50_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "output_throughput_tok_s",
    "num_preemptions",
]


def mixed_table(loaded):
    """The columns of mixed_load_table() the notebook shows."""
    return loaded[MIXED_COLUMNS]


def _mixed_bars(loaded, columns: dict[str, str], title: str):
    x = "max_num_batched_tokens"
    return plots.bar_with_spread(
        long_form(loaded, x, columns), x, "value", color="metric", title=title, yaxis="ms"
    )


def mixed_ttft_figure(loaded):
    """TTFT of short and long requests under mixed load per max_num_batched_tokens."""
    cols = {
        "short TTFT p50": "ttft_short_p50_ms",
        "short TTFT p90": "ttft_short_p90_ms",
        "long TTFT p50": "ttft_long_p50_ms",
    }
    title = "TTFT per request class under mixed load (median, min-max over engine starts)"
    return _mixed_bars(loaded, cols, title)


def mixed_itl_figure(loaded):
    """Inter-token latency (p50, p99) of the running decodes per max_num_batched_tokens."""
    cols = {"ITL p50": "itl_p50_ms", "ITL p99": "itl_p99_ms"}
    return _mixed_bars(loaded, cols, "Inter-token latency of the running decodes")


def mixed_throughput_figure(loaded):
    """Output throughput under the mixed load per max_num_batched_tokens."""
    return plots.bar_with_spread(
        loaded.assign(status="ok"),
        "max_num_batched_tokens",
        "output_throughput_tok_s",
        title="Output throughput under the mixed load",
        yaxis="output tokens/s",
    )


def alone_by_class(curve, bounds: Sequence[int]) -> dict[str, list[float]]:
    """Prefill times alone of the curve's requests per length class (short, medium, long)."""
    cls = curve["prompt_tokens"].map(lambda n: length_class(n, bounds))
    return {c: curve.loc[cls == c, "alone_ms"].tolist() for c in CLASSES}
