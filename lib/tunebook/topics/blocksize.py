"""Block sizes: which ones the platform accepts, what each holds, costs and loses (notebook 02).

Validity is found, not assumed: every candidate goes through the settings check first (which
knows the rules vLLM states up front, e.g. CPU_ATTN's multiples of 32), and the ones it cannot
rule out go to the engine itself. Prefix-cache hits are counted in whole blocks: a shared prefix
of P tokens yields floor(P / block) * block cached tokens per later request, so bigger blocks lose
the partial block at the end of the prefix.
"""

from __future__ import annotations

from collections.abc import Iterable

from tunebook.core.claims import verdict
from tunebook.core.errors import ConfigError
from tunebook.core.metrics import compare, spread
from tunebook.core.results import point_row
from tunebook.engine.knobs import validate_settings
from tunebook.topics import plots
from tunebook.topics.prefill import long_form


def screen(candidates: Iterable[int], settings: dict) -> list[dict]:
    """Each candidate through the settings check (names, types and the platform's block rule)."""

    rows = []
    for b in candidates:
        try:
            validate_settings({**settings, "block_size": b})
            rows.append({"block_size": b, "settings check": "passed", "error": ""})
        except ConfigError as e:
            rows.append({"block_size": b, "settings check": "rejected", "error": str(e)})
    return rows


def passed(screened: list[dict]) -> list[int]:
    return [r["block_size"] for r in screened if r["settings check"] == "passed"]


def requested_block_size(point: dict) -> int | None:
    return (point.get("settings") or {}).get("block_size")


def validity(screened: list[dict], probe: list[dict]) -> list[dict]:
    """The settings check's verdict, then the engine's for the sizes the check let through.

    ``probe`` holds the point results of one engine start per size that passed the check. An
    engine that starts but runs with another block size than asked is flagged.
    """
    by_size: dict[int, dict] = {}
    for p in sorted(probe, key=lambda p: p.get("repeat") or 0):
        b = requested_block_size(p)
        if b is not None and b not in by_size:
            by_size[b] = p
    rows = []
    for r in screened:
        row = {"block_size": r["block_size"], "settings check": r["settings check"]}
        if r["settings check"] == "rejected":
            row.update(engine="not started", valid=False, error=r["error"])
        else:
            p = by_size.get(r["block_size"])
            if p is None:
                row.update(engine="not probed", valid=False, error="")
            elif p.get("status") != "ok":
                row.update(engine="rejected", valid=False, error=p.get("error") or "")
            else:
                used = (p.get("capacity") or {}).get("block_size")
                if used is not None and used != r["block_size"]:
                    row.update(
                        engine=f"started with block_size {used}",
                        valid=False,
                        error=f"asked for {r['block_size']}, the engine used {used}",
                    )
                else:
                    row.update(engine="started", valid=True, error="")
        rows.append(row)
    return rows


def valid_sizes(rows: list[dict]) -> list[int]:
    return [r["block_size"] for r in rows if r["valid"]]


def floor_blocks(tokens: int, block_size: int) -> int:
    """Tokens of a prefix that can be cache hits: whole blocks only."""
    return (tokens // block_size) * block_size


def warm_cached_tokens(requests: list[dict]) -> list[int]:
    """Cached tokens of every request that is not the first of its prefix group (tag).

    The first request with a prefix computes it; the later ones can hit. Requests without a tag
    count as one group.
    """
    seen: set[str] = set()
    out = []
    for r in requests:
        tag = r.get("tag") or ""
        if tag in seen:
            out.append(int(r.get("cached_tokens") or 0))
        seen.add(tag)
    return out


_SPEED = (
    "output_throughput_tok_s",
    "total_token_throughput_tok_s",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "tpot_p50_ms",
    "tpot_p99_ms",
    "prefix_cache_hit_rate_pct",
)


def per_point(results: list[dict], prefix_len: int | None = None):
    """One row per finished point (from ``results.point_row``): block size, backend, capacity,
    speed, latency, prefix hits."""
    import pandas as pd

    rows = []
    for p in results:
        if p.get("status") != "ok":
            continue
        flat, env = point_row(p), p.get("env") or {}
        warm = warm_cached_tokens(p.get("requests") or [])
        bs = flat.get("cap_block_size") or requested_block_size(p)
        row = {
            "config": p["config"],
            "repeat": p["repeat"],
            "block_size": bs,
            "attention_backend (asked)": (p.get("settings") or {}).get("attention_backend")
            or "default",
            "attention_backend (used)": env.get("attention_backend") or "unknown",
            "num_gpu_blocks": flat.get("cap_num_gpu_blocks"),
            "kv_capacity_tokens": flat.get("cap_kv_capacity_tokens"),
            **{k: flat.get(k) for k in _SPEED},
            "cached_tokens_per_warm_request": (
                float(sorted(warm)[len(warm) // 2]) if warm else float("nan")
            ),
            "warm_requests": len(warm),
            "status": "ok",
        }
        if prefix_len is not None and bs:
            row["arithmetic floor(prefix/block)*block"] = floor_blocks(prefix_len, int(bs))
        rows.append(row)
    if not rows:  # nothing valid or nothing finished: an empty frame with the usual columns
        return pd.DataFrame(columns=PER_POINT_COLUMNS)
    return pd.DataFrame(rows).sort_values(["block_size", "repeat"]).reset_index(drop=True)


PER_POINT_COLUMNS = [
    "config",
    "repeat",
    "block_size",
    "attention_backend (asked)",
    "attention_backend (used)",
    "num_gpu_blocks",
    "kv_capacity_tokens",
    *_SPEED,
    "cached_tokens_per_warm_request",
    "warm_requests",
    "status",
]


def summary(df, prefix_len: int | None = None):
    """One row per block size: medians over engine starts with min-max, capacity, prefix hits."""
    import pandas as pd

    rows = []
    for bs, g in df.groupby("block_size", sort=True):
        thr = spread(g["output_throughput_tok_s"])
        row = {
            "block_size": int(bs),
            "engine starts": len(g),
            "kv_capacity_tokens": int(g["kv_capacity_tokens"].iloc[0]),
            "num_gpu_blocks": int(g["num_gpu_blocks"].iloc[0]),
            "output tok/s (median)": thr["median"],
            "output tok/s (min-max)": f"{thr['min']:.0f}-{thr['max']:.0f}",
            "TTFT p50 ms": spread(g["ttft_p50_ms"])["median"],
            "TTFT p99 ms": spread(g["ttft_p99_ms"])["median"],
            "TPOT p50 ms": spread(g["tpot_p50_ms"])["median"],
            "TPOT p99 ms": spread(g["tpot_p99_ms"])["median"],
            "cached tokens / warm request": spread(g["cached_tokens_per_warm_request"])["median"],
        }
        if prefix_len is not None:
            row["floor(prefix/block)*block"] = floor_blocks(prefix_len, int(bs))
            row["prefix tokens lost"] = prefix_len - row["floor(prefix/block)*block"]
        rows.append(row)
    return pd.DataFrame(rows)


def granularity_check(df, prefix_len: int) -> list[dict]:
    """Measured cached tokens per warm request against floor(prefix/block)*block, per size."""
    out = []
    for bs, g in df.groupby("block_size", sort=True):
        measured = sorted({int(v) for v in g["cached_tokens_per_warm_request"].dropna()})
        expect = floor_blocks(prefix_len, int(bs))
        out.append(
            {
                "block_size": int(bs),
                "measured": measured,
                "expected": expect,
                "match": measured == [expect],
            }
        )
    return out


def backend_rows(df):
    """Throughput and latency per (asked, used) attention backend: median and range."""
    import pandas as pd

    rows = []
    keys = ["attention_backend (asked)", "attention_backend (used)", "block_size"]
    for k, g in df.groupby(keys, sort=False):
        thr = spread(g["output_throughput_tok_s"])
        rows.append(
            {
                **dict(zip(keys, k, strict=True)),
                "engine starts": len(g),
                "output tok/s (median)": thr["median"],
                "output tok/s (min-max)": f"{thr['min']:.0f}-{thr['max']:.0f}",
                "TTFT p50 ms": spread(g["ttft_p50_ms"])["median"],
                "TPOT p50 ms": spread(g["tpot_p50_ms"])["median"],
            }
        )
    return pd.DataFrame(rows)


def speed_ranking(df, metric: str = "output_throughput_tok_s") -> dict:
    """Fastest block size by median over engine starts, and every other size against it."""
    thr = {int(b): g[metric].dropna().tolist() for b, g in df.groupby("block_size")}
    med = {b: spread(v)["median"] for b, v in thr.items()}
    best = max(med, key=med.get)
    others = {b: compare(thr[best], v) for b, v in thr.items() if b != best}  # ratio other/best
    return {"values": thr, "median": med, "best": best, "vs_best": others}


def c4_verdict(
    rows: list[dict],
    df,
    granularity: list[dict],
    prefix_len: int,
    evidence: str,
    speed_meaningful: bool,
    claimed: int = 16,
) -> dict:
    """C4 (block_size 16 is best; too small fragments, too large wastes), from measured figures.

    refuted: 16 is not valid here, or another size is faster beyond the noise; confirmed: 16 is
    faster than every other size beyond the noise; inconclusive: the gaps are within the noise.
    """

    valid = valid_sizes(rows)
    gran_ok = all(g["match"] for g in granularity)
    lost = {g["block_size"]: prefix_len - g["expected"] for g in granularity}
    caps = sorted({int(c) for c in df["kv_capacity_tokens"]}) if len(df) else []
    gran_txt = (
        f"Prefix hits come in whole blocks: a {prefix_len}-token shared prefix gave "
        + ", ".join(
            f"{g['block_size']}: {'/'.join(map(str, g['measured'])) or 'n/a'}" for g in granularity
        )
        + f" cached tokens per later request ({'exactly' if gran_ok else 'NOT'}"
        f" floor(prefix/block)*block; up to {max(lost.values(), default=0)} tokens lost)."
    )
    cap_txt = (
        f"KV capacity {caps[0]:,} tokens at every size."
        if len(caps) == 1
        else f"KV capacity {', '.join(f'{c:,}' for c in caps)} tokens (whole-block rounding)."
    )
    frag_txt = (
        "'Too small fragments' does not hold for PagedAttention: a sequence wastes at most"
        " block-1 slots in its last block, so smaller blocks waste less."
    )
    rank = speed_ranking(df) if len(df) else None
    if rank:
        med, best = rank["median"], rank["best"]
        speed_txt = "output tok/s median " + ", ".join(f"{b}: {med[b]:,.0f}" for b in sorted(med))
        gaps = "; ".join(
            f"{b}: x{c['ratio']:.2f} of {best} ({c['noise']})"
            for b, c in sorted(rank["vs_best"].items())
        )
        speed_txt += f" (fastest median: {best}; {gaps or 'one size only'})"
        sp = "; ".join(
            f"{b}: {spread(v)['min']:,.0f}-{spread(v)['max']:,.0f}"
            for b, v in sorted(rank["values"].items())
        )
        sp = f"output tok/s min-max over engine starts: {sp}"
    else:
        speed_txt, sp = "no size measured", None
    cpu_txt = (
        "" if speed_meaningful else " CPU with a tiny model: speed figures say nothing about a GPU."
    )

    if claimed not in valid:
        row = next((r for r in rows if r["block_size"] == claimed), None)
        why = (row or {}).get("error") or "it was not among the candidates"
        figure = f"block_size {claimed} is not valid here: {why.splitlines()[0][:200]}"
        note = (
            f"Valid sizes found: {', '.join(map(str, valid)) or 'none'}; {speed_txt}. {gran_txt}"
            f" {cap_txt} {frag_txt}{cpu_txt}"
        )
        return verdict("C4", "refuted", figure, evidence, spread=sp, note=note)

    vs16 = {
        b: compare(rank["values"][claimed], v) for b, v in rank["values"].items() if b != claimed
    }  # ratio other / 16
    beaten = [b for b, c in vs16.items() if not c["within_noise"] and c["ratio"] > 1]
    wins = all(not c["within_noise"] and c["ratio"] < 1 for c in vs16.values())
    v = "refuted" if beaten else "confirmed" if wins and vs16 else "inconclusive"
    figure = speed_txt
    note = f"{gran_txt} {cap_txt} {frag_txt}{cpu_txt}"
    if beaten:
        note = f"faster than 16 beyond the noise: {', '.join(map(str, beaten))}. " + note
    elif v == "inconclusive":
        note = "No size differs from 16 beyond the spread over engine starts. " + note
    return verdict("C4", v, figure, evidence, spread=sp, note=note)


# --------------------------------------------------------------------------- notebook 02's cells


def shared_prefix_workload(
    num_requests: int, prompt_len: int, prefix_len: int, num_prefixes: int, output_len: int
) -> dict:
    """The chat-like offline batch: every prompt starts with one of ``num_prefixes`` shared
    system prompts of ``prefix_len`` tokens (the workload takes the prefix as a share)."""
    share = prefix_len / prompt_len
    if round(prompt_len * share) != prefix_len:
        raise ValueError(f"prefix length {prefix_len} does not round-trip through {share}")
    return {
        "kind": "shared_prefix",
        "num_requests": num_requests,
        "prompt_len": prompt_len,
        "prefix_share": share,
        "num_prefixes": num_prefixes,
        "output_len": output_len,
        "seed": 0,
    }


def setup_text(platform: str, vllm_version: str, model: str, workload: dict) -> str:
    """Where the notebook runs and the batch every point gets, in two lines."""
    w = workload
    prefix = round(w["prompt_len"] * w["prefix_share"])
    return (
        f"platform {platform}, vLLM {vllm_version}, model {model}\n"
        f"workload: {w['num_requests']} x ({w['prompt_len']} prompt tokens, {prefix} of them"
        f" shared; {w['output_len']} out)"
    )


def validity_text(rows: list[dict]) -> str:
    """One line per candidate (valid or not, the check's and the engine's word, the error's first
    line), then the valid sizes."""
    lines = []
    for r in rows:
        status = "valid" if r["valid"] else "invalid"
        reason = f": {r['error'].splitlines()[0]}" if r["error"] else ""
        lines.append(
            f"block_size {r['block_size']:>4}: {status} (check {r['settings check']},"
            f" engine {r['engine']}){reason}"
        )
    lines.append(f"valid block sizes: {valid_sizes(rows)}")
    return "\n".join(lines)


def failed_points(df):
    """The sweep's points that did not finish (point id, status, error); empty when none."""
    return df.loc[df["status"] != "ok", ["point_id", "status", "error"]]


def results_for(results: list[dict], sizes: list[int]) -> list[dict]:
    """The point results whose requested block size is among ``sizes``."""
    return [p for p in results if requested_block_size(p) in sizes]


def throughput_figure(df):
    """Output throughput per block size: median bar, min-max over engine starts."""
    return plots.bar_with_spread(
        df,
        "block_size",
        "output_throughput_tok_s",
        title="Output throughput per block size (median, min-max over engine starts)",
        yaxis="output tokens/s",
    )


LATENCY_COLUMNS = {
    "TTFT p50": "ttft_p50_ms",
    "TTFT p99": "ttft_p99_ms",
    "TPOT p50": "tpot_p50_ms",
    "TPOT p99": "tpot_p99_ms",
}


def latency_figure(df):
    """TTFT and TPOT percentiles per block size, one bar group per percentile."""
    return plots.bar_with_spread(
        long_form(df, "block_size", LATENCY_COLUMNS),
        "block_size",
        "value",
        color="metric",
        title="TTFT and TPOT percentiles per block size",
        yaxis="ms",
    )


def capacity_text(summary_df, shape, kv_cache_memory_bytes: int | None) -> str:
    """KV bytes per token, then per block size the blocks and tokens the engine reported, with
    the arithmetic's tokens where the KV memory is set in bytes."""
    lines = [f"KV bytes per token: {shape.kv_bytes_per_token():,}"]
    for _, r in summary_df.iterrows():
        bs = int(r["block_size"])
        pred = (
            shape.kv_capacity_tokens(kv_cache_memory_bytes, bs) if kv_cache_memory_bytes else None
        )
        extra = f" (arithmetic {pred:,})" if pred is not None else ""
        lines.append(
            f"block_size {bs:>4}: {int(r['num_gpu_blocks']):>6,} blocks,"
            f" {int(r['kv_capacity_tokens']):>10,} tokens{extra}"
        )
    return "\n".join(lines)


def granularity_text(granularity: list[dict], prefix_len: int) -> str:
    """granularity_check() in words: measured cached tokens against floor(prefix/block)*block."""
    return "\n".join(
        f"block_size {g['block_size']:>4}: cached tokens per later request {g['measured']},"
        f" floor({prefix_len}/{g['block_size']})*{g['block_size']} = {g['expected']},"
        f" {'match' if g['match'] else 'MISMATCH'}"
        for g in granularity
    )


def prefix_hits_figure(summary_df, prefix_len: int):
    """Cached tokens per later request against block size, beside floor(prefix/block)*block and
    the shared prefix's length (dashed)."""
    d = summary_df.assign(**{"shared prefix": prefix_len})
    return plots.lines(
        d,
        "block_size",
        {
            "measured cached tokens per later request": "cached tokens / warm request",
            "floor(prefix / block) x block": "floor(prefix/block)*block",
            "shared prefix length": "shared prefix",
        },
        title=f"Prefix-cache hits of a {prefix_len}-token shared prefix",
        xaxis="block_size (log scale)",
        yaxis="tokens",
        dashed=("floor(prefix / block) x block", "shared prefix length"),
        log_x=True,
    )


def backend_configs(backends: list[str], block_size: int) -> dict[str, dict]:
    """One configuration per attention_backend value, all at ``block_size``."""
    return {
        f"attention_backend={b}": {"settings": {"attention_backend": b, "block_size": block_size}}
        for b in backends
    }


def failures_text(results: list[dict]) -> str:
    """One line per point that failed: its configuration and error; empty when none did."""
    return "\n".join(f"{p['config']}: {p.get('error')}" for p in results if p.get("status") != "ok")


def backends_frame(df, backend_results: list[dict], prefix_len: int, block_size: int):
    """The default backend's points at ``block_size`` (from ``df``, per_point rows) with the
    points of the attention_backend sweep."""
    import pandas as pd

    base = df[df["block_size"] == block_size]
    extra = per_point(backend_results, prefix_len)
    return pd.concat([base, extra], ignore_index=True) if len(extra) else base


def backends_text(df) -> str:
    """Which backend each asked-for attention_backend ran, then the backends in use."""
    asked, used = "attention_backend (asked)", "attention_backend (used)"
    pairs = dict.fromkeys(zip(df[asked], df[used], strict=True))
    lines = [f"attention_backend asked {a}: used {u}" for a, u in pairs]
    lines.append(f"backends in use here: {sorted(set(df[used]))}")
    return "\n".join(lines)


def backend_figure(df, block_size: int):
    """Output throughput per (asked -> used) attention backend, at one block size."""
    d = df.assign(backend=df["attention_backend (asked)"] + " -> " + df["attention_backend (used)"])
    return plots.bar_with_spread(
        d,
        "backend",
        "output_throughput_tok_s",
        title=f"Output throughput per attention backend (block_size {block_size})",
        yaxis="output tokens/s",
    )
