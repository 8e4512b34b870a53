"""Notebook 00's helpers: the article's settings checked one by one, made runnable, and compared.

The article (seed/) gives a "tuned" configuration. Some of its settings do not exist in vLLM and
one is invalid on some backends. Nothing here drops a setting silently: every change comes back
as a row saying what was changed and why, and the notebook shows it.

Also here: the verdicts on C1, C6 and C9 (``c1_verdict``, ``c6_verdict``, ``c9_verdict``),
``points_frame`` (a sweep's points as one DataFrame of ``results.point_row`` rows, with
whether the gauge sampler saw each run) and the side-by-side tables of two configurations with
their spread over engine starts. The last section holds what 00's cells show: texts, tables and
figures, each from one call.
"""

from __future__ import annotations

import math

from tunebook.core.claims import verdict
from tunebook.core.errors import ConfigError
from tunebook.core.metrics import compare, spread
from tunebook.core.model import GIB, ModelShape
from tunebook.core.results import point_row
from tunebook.core.workloads import make_workload
from tunebook.engine.adapter import vllm_reaction
from tunebook.engine.knobs import valid_block_sizes, validate_settings
from tunebook.topics import plots

# The article's final configuration, as written (seed, section 6, and the scheduler tip of 5.3),
# nonexistent settings included; assemble.ARTICLE_SETTINGS is the part vLLM has.
ARTICLE_AS_WRITTEN: dict = {
    "gpu_memory_utilization": 0.85,
    "max_num_batched_tokens": 2048,
    "max_num_seqs": 256,
    "block_size": 16,
    "enable_prefix_caching": True,
    "max_paddings": 128,
    "scheduler_policy": "hybrid",
}


# --------------------------------------------------------------------------- settings, one by one
def check_each(settings: dict, with_vllm: bool = True) -> list[dict]:
    """Validate every setting on its own, so that one bad name does not hide the next.

    Returns rows ``{setting, value, valid, error, vllm}``: ``error`` is tunebook's ConfigError
    message (None when valid), ``vllm`` what the installed EngineArgs does with it.
    """

    rows = []
    for name, value in settings.items():
        try:
            validate_settings({name: value})
            err = None
        except ConfigError as e:
            err = str(e)
        row = {"setting": name, "value": value, "valid": err is None, "error": err}
        if with_vllm:
            row["vllm"] = vllm_reaction(name, value)
        rows.append(row)
    return rows


def runnable_settings(
    settings: dict, platform: str, base_settings: dict | None = None
) -> tuple[dict, list[dict]]:
    """The settings that can run here, and one row per change made to get them.

    * a name vLLM does not have (max_paddings, scheduler_policy) is dropped;
    * a block_size the platform's attention backend rejects becomes the smallest valid size above
      it (CPU: 16 -> 32);
    * any other invalid value is dropped;
    * gpu_memory_utilization is kept but flagged when ``base_settings`` fixes the KV size with
      kv_cache_memory_bytes (which vLLM then uses instead, CPU included).
    """

    rows = check_each(settings, with_vllm=False)
    out: dict = {}
    changes: list[dict] = []
    for r in rows:
        name, value = r["setting"], r["value"]
        if r["valid"]:
            out[name] = value
            continue
        if name == "block_size" and isinstance(value, int) and value > 0:
            ok = [
                b
                for b in valid_block_sizes(platform, candidates=(16, 32, 64, 128, 256))
                if b >= value
            ]
            if ok:
                out[name] = ok[0]
                changes.append(
                    {"setting": name, "article": value, "run with": ok[0], "why": r["error"]}
                )
                continue
        changes.append(
            {"setting": name, "article": value, "run with": "(dropped)", "why": r["error"]}
        )
    base = base_settings or {}
    if "gpu_memory_utilization" in out and base.get("kv_cache_memory_bytes"):
        changes.append(
            {
                "setting": "gpu_memory_utilization",
                "article": out["gpu_memory_utilization"],
                "run with": out["gpu_memory_utilization"],
                "why": (
                    f"kept, but kv_cache_memory_bytes={base['kv_cache_memory_bytes']} in"
                    " engine_settings sizes the KV cache instead: on this profile it does not"
                    " change capacity"
                ),
            }
        )
    return out, changes


# --------------------------------------------------------------------------- results as frames
def points_frame(results: list[dict]):
    """One row per point (``results.point_row``: identity, settings, metrics, ``cap_`` engine
    capacity, device memory), sorted by config and repeat, with ``sampled``."""
    import pandas as pd

    rows = []
    for p in results:
        row = point_row(p)
        # Gauge peaks mean something only if the sampler (every 0.25 s) saw the run.
        row["sampled"] = len(p.get("timeline") or []) > 1
        if not row["sampled"]:
            for k in (
                "kv_cache_usage_peak_pct",
                "num_requests_running_peak",
                "num_requests_waiting_peak",
            ):
                if k in row:
                    row[k] = None
        rows.append(row)
    df = pd.DataFrame(rows)
    if len(df) and "repeat" in df:
        df = df.sort_values(["config", "repeat"], kind="stable").reset_index(drop=True)
    return df


# What the baseline table shows, in order: (column, label).
BASELINE_METRICS: list[tuple[str, str]] = [
    ("e2e_mean_ms", "latency per request, mean (ms)"),
    ("per_request_article_s", "article's 'per request' = run time / requests (s)"),
    ("ttft_p50_ms", "TTFT p50 (ms)"),
    ("ttft_p99_ms", "TTFT p99 (ms)"),
    ("tpot_p50_ms", "TPOT p50 (ms)"),
    ("tpot_p99_ms", "TPOT p99 (ms)"),
    ("output_throughput_tok_s", "output tokens/s"),
    ("request_throughput_rps", "QPS (requests/s)"),
    ("device_memory_used_gib", "device memory used (GiB)"),
    ("cap_kv_capacity_tokens", "KV capacity (tokens)"),
]


def add_derived(df):
    """Columns the tables need that the sweep does not store directly."""
    df = df.copy()
    if "duration_s" in df and "num_requests" in df:
        df["per_request_article_s"] = df["duration_s"] / df["num_requests"]
    return df


def _fmt(x, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    ax = abs(x)
    if ax >= 1000:
        return f"{x:,.0f}"
    if ax >= 100:
        return f"{x:.0f}"
    return f"{x:.{digits}g}"


def side_by_side(frames: dict, a: str, b: str, metrics=BASELINE_METRICS):
    """Per workload and metric: median [min-max] of each config, ratio b/a, within the noise?

    ``frames`` maps a workload name to its points_frame. A metric missing for a config (device
    memory on CPU) shows n/a.
    """
    import pandas as pd

    rows = []
    for wl, df in frames.items():
        df = add_derived(df)
        ok = df[df["status"] == "ok"] if "status" in df else df
        for col, label in metrics:
            if col not in ok:
                continue
            va = ok.loc[ok["config"] == a, col].dropna().astype(float).tolist()
            vb = ok.loc[ok["config"] == b, col].dropna().astype(float).tolist()
            if not va and not vb:
                continue
            sa, sb = spread(va), spread(vb)
            c = compare(va, vb)
            rows.append(
                {
                    "workload": wl,
                    "metric": label,
                    a: f"{_fmt(sa['median'])} [{_fmt(sa['min'])}-{_fmt(sa['max'])}]",
                    b: f"{_fmt(sb['median'])} [{_fmt(sb['min'])}-{_fmt(sb['max'])}]",
                    f"{b}/{a}": round(c["ratio"], 3) if not math.isnan(c["ratio"]) else None,
                    "within noise": c["within_noise"],
                    "n": f"{sa['n']}/{sb['n']}",
                }
            )
    return pd.DataFrame(rows)


def modes_side_by_side(frames: dict, other: dict, mode: str, other_mode: str):
    """The default configuration in two modes: ``side_by_side`` with the modes as the columns
    (ratio ``mode``/``other_mode``), from each mode's per-workload frames."""
    import pandas as pd

    both = {}
    for wl in frames:
        if wl not in other:
            continue
        a = frames[wl][frames[wl]["config"] == "default"].assign(config=mode)
        b = other[wl][other[wl]["config"] == "default"].assign(config=other_mode)
        both[wl] = pd.concat([b, a], ignore_index=True)
    return side_by_side(both, other_mode, mode)


def comparison(frames: dict, a: str, b: str, col: str) -> dict:
    """metrics.compare of one column between configs, per workload: {workload: compare(...)}."""
    out = {}
    for wl, df in frames.items():
        df = add_derived(df)
        ok = df[df["status"] == "ok"] if "status" in df else df
        if col not in ok:
            continue
        va = ok.loc[ok["config"] == a, col].dropna().astype(float).tolist()
        vb = ok.loc[ok["config"] == b, col].dropna().astype(float).tolist()
        if va and vb:
            out[wl] = compare(va, vb)
    return out


def effective_settings(
    frames: dict,
    knobs=(
        "gpu_memory_utilization",
        "max_num_batched_tokens",
        "max_num_seqs",
        "block_size",
        "enable_prefix_caching",
        "kv_capacity_tokens",
    ),
):
    """What each configuration ran with, as the engine resolved it (one row per config)."""
    import pandas as pd

    rows = {}
    for df in frames.values():
        ok = df[df["status"] == "ok"] if "status" in df else df
        for _, r in ok.iterrows():
            rows.setdefault(r["config"], {k: r.get(f"cap_{k}") for k in knobs})
    return pd.DataFrame(rows).T.rename_axis("config")


# --------------------------------------------------------------------------- the article's arithmetic
def article_qps_from_per_request(per_request_s: float, n_prompts: int = 3) -> dict:
    """The article's benchmark: (end - start) / len(prompts) over concurrent requests.

    That is run time per request, i.e. 1 / QPS of the run, not the latency of a request. Its
    3.2 s over 3 prompts is 9.6 s of run time: 0.31 requests/s, not the ~10 QPS it also reports.
    """
    run_s = per_request_s * n_prompts
    return {
        "per_request_s": per_request_s,
        "prompts": n_prompts,
        "run_s": run_s,
        "implied_qps": n_prompts / run_s,
    }


def concurrent_kv_need(
    shape: ModelShape, n_requests: int, tokens: int, kv_cache_dtype="auto"
) -> dict:
    """KV bytes that n requests of ``tokens`` each hold at once (C6's '100 concurrent')."""
    per_tok = shape.kv_bytes_per_token(kv_cache_dtype)
    total = n_requests * tokens * per_tok
    return {
        "requests": n_requests,
        "tokens_each": tokens,
        "bytes_per_token": per_tok,
        "kv_bytes": total,
        "kv_gib": total / GIB,
    }


def card_kv_space(
    shape: ModelShape, total_gib: float, gpu_memory_utilization: float, activation_gib: float = 0.0
) -> float:
    """An upper bound of the KV space (GiB) a card leaves: gmu x total - weights - activations."""
    return gpu_memory_utilization * total_gib - shape.weight_bytes() / GIB - activation_gib


def workload_need(spec: dict, shape: ModelShape, block_size: int) -> dict:
    """Tokens and KV blocks a workload holds if all its requests run at once."""

    wl = make_workload(spec, vocab_size=shape.vocab_size)
    toks = [max(r.prompt_len, 0) + r.max_tokens for r in wl.requests]
    blocks = sum(-(-t // block_size) for t in toks)
    return {
        "requests": len(toks),
        "tokens": sum(toks),
        "blocks": blocks,
        "tokens_max": max(toks, default=0),
    }


# --------------------------------------------------------------------------- verdicts
def _median_of(df, config: str, col: str) -> float:
    """Median of a column over a config's successful points (NaN when there are none)."""
    if not len(df) or col not in df:
        return float("nan")
    ok = df[(df["status"] == "ok") & (df["config"] == config)]
    return float(ok[col].median()) if len(ok) else float("nan")


def _speed_caveat(platform: str) -> str:
    if platform != "cpu":
        return ""
    return " On CPU with a tiny model these speed figures say nothing about a GPU."


def c1_verdict(
    frames: dict,
    platform: str,
    repeats: int,
    evidence: str,
    vllm_version: str,
    card_gib: float,
    article_per_request_s: float = 3.2,
    article_prompts: int = 3,
) -> dict:
    """C1 (the article's 4090 baseline: 3.2 s per request, 4.8 GB, ~10 QPS): not reproducible.

    No 4090 here; the figure is the default configuration's baseline as measured (``frames``:
    workload -> points_frame with configs "default" and "article"), and the note shows that the
    article's own figures disagree with each other and with how vLLM holds memory.
    """

    device = "CPU (tiny model, dummy weights)" if platform == "cpu" else f"{platform} device"
    bits = []
    for name, df in frames.items():
        df = add_derived(df)
        bits.append(
            f"{name}: {_median_of(df, 'default', 'e2e_mean_ms'):.0f} ms per request (e2e mean), "
            f"{_median_of(df, 'default', 'request_throughput_rps'):.1f} QPS"
        )
    mem = [
        _median_of(df, "default", "device_memory_used_gib")
        for df in frames.values()
        if "device_memory_used_gib" in df
    ]
    mem_txt = (
        f"; device memory {max(mem):.1f} GiB (vLLM holds gpu_memory_utilization x total, "
        f"whatever the load)"
        if mem
        else "; no device memory on CPU"
        if platform == "cpu"
        else "; device memory not read (served: the engine runs in the server's processes)"
    )
    art = article_qps_from_per_request(article_per_request_s, article_prompts)
    # gpu_memory_utilization as this vLLM resolved it for the default configuration
    gmu = _median_of(next(iter(frames.values())), "default", "cap_gpu_memory_utilization")
    return verdict(
        "C1",
        "not reproducible",
        figure=f"default config on {device}: " + "; ".join(bits) + mem_txt,
        spread=f"{repeats} engine starts per config; ranges in the side-by-side table",
        evidence=evidence,
        note=(
            "No RTX 4090 here. The article's own figures disagree: its script divides the run time "
            f"by the number of prompts, so {article_per_request_s:g} s 'per request' over "
            f"{art['prompts']} concurrent prompts is a {art['run_s']:.1f} s run, "
            f"{art['implied_qps']:.2f} requests/s, not ~10 QPS. And vLLM holds "
            f"gpu_memory_utilization (default {gmu:g} in vLLM {vllm_version}) of the card whatever "
            f"the load: {gmu * card_gib:.1f} GiB on a {card_gib:g} GiB card, not 4.8 GB."
            + _speed_caveat(platform)
        ),
    )


def c6_arithmetic(
    shape: ModelShape,
    card_gib: float,
    gpu_memory_utilization: float,
    tokens: int,
    n_requests: int = 100,
) -> dict:
    """C6's arithmetic: the KV of ``n_requests`` x ``tokens`` against what the card leaves for KV.

    ``kv_space_gib`` is an upper bound (gmu x card - weights); ``requests_that_fit`` is how many
    requests of ``tokens`` it holds at once.
    """
    need = concurrent_kv_need(shape, n_requests, tokens)
    space = card_kv_space(shape, card_gib, gpu_memory_utilization)
    return {
        **need,
        "card_gib": card_gib,
        "gpu_memory_utilization": gpu_memory_utilization,
        "weights_gib": shape.weight_bytes() / GIB,
        "kv_space_gib": space,
        "requests_that_fit": int(space * GIB // (tokens * need["bytes_per_token"])),
    }


def _running(row) -> str:
    """The peak of requests running at once, as the sampler saw it."""
    n = getattr(row, "num_requests_running_peak", None)
    return "peak running unknown" if n is None or n != n else f"{int(n)} running at the peak"


def c6_verdict(
    arithmetic: dict,
    claim_model: str,
    concurrent,
    num_requests: int,
    frames: dict,
    evidence: str,
    platform: str,
) -> dict:
    """C6 (100 concurrent requests OOM before KV tuning) from ``c6_arithmetic`` and the runs.

    refuted when the article's card holds the requests' KV at once (the arithmetic decides);
    inconclusive when it does not. ``concurrent`` is the points_frame of the run that put
    ``num_requests`` in flight at once; ``frames`` the baseline sweeps (for memory and speed).
    """

    a = arithmetic
    ok = concurrent[concurrent["status"] == "ok"] if len(concurrent) else concurrent
    all_ran = len(concurrent) > 0 and len(ok) == len(concurrent)
    preempt = int(ok["num_preemptions"].sum()) if len(ok) and "num_preemptions" in ok else None
    peaks = ", ".join(
        f"{r.config} {r.kv_cache_usage_peak_pct:.1f}% ({_running(r)})"
        if r.sampled
        else f"{r.config} not sampled (run < 0.25 s)"
        for r in ok.itertuples()
    )
    speed = "; ".join(
        f"{w}: article/default e2e = {c['ratio']:.2f} ({c['noise']})"
        for w, c in comparison(frames, "default", "article", "e2e_mean_ms").items()
    )
    mem = "; ".join(
        f"{w}: device memory {c['a']['median']:.1f} -> {c['b']['median']:.1f} GiB"
        for w, c in comparison(frames, "default", "article", "device_memory_used_gib").items()
    ) or (
        "device memory not measurable on CPU"
        if platform == "cpu"
        else "device memory not read (served: the engine runs in the server's processes)"
    )
    return verdict(
        "C6",
        "refuted" if a["requests_that_fit"] >= a["requests"] else "inconclusive",
        figure=(
            f"{a['requests']} x {a['tokens_each']} tokens of {claim_model} need {a['kv_gib']:.2f}"
            f" GiB of KV; a 4090 at gmu {a['gpu_memory_utilization']} leaves at most"
            f" {a['kv_space_gib']:.1f} GiB ({a['requests_that_fit']} such requests). Here"
            f" {num_requests} requests at once: "
            + ("ran on both configurations" if all_ran else "FAILED on some engines")
            + f", {preempt} preemptions; peak KV usage "
            + peaks
        ),
        spread=speed,
        evidence=evidence,
        note=(
            "vLLM allocates the KV cache once at start; when it is full it queues or preempts "
            "requests, it does not run out of memory (01_kv_cache_sizing squeezes it to show "
            "this). An OOM at 100 requests comes from elsewhere (another process on the card, a "
            "gpu_memory_utilization above the free memory), not from KV. "
            f"Memory: {mem}; device memory follows gpu_memory_utilization, not the number of "
            "requests." + _speed_caveat(platform)
        ),
    )


def c9_verdict(checks: list[dict], vllm_version: str) -> dict:
    """C9 (max_paddings, scheduler_policy="hybrid") from ``check_each`` rows.

    refuted when vLLM's own EngineArgs does not know some of the settings (TypeError);
    inconclusive when every name exists.
    """

    rejected = [r for r in checks if not r["valid"]]
    missing = [r for r in rejected if str(r.get("vllm", "")).startswith("TypeError")]
    names = {r["setting"] for r in missing}
    return verdict(
        "C9",
        "refuted" if missing else "inconclusive",
        figure=(
            f"{len(missing)} of the article's settings do not exist in vLLM {vllm_version}: "
            + "; ".join(f"{r['setting']}={r['value']!r}: {r['error']}" for r in missing)
        ),
        evidence="check_each(article_settings) in this notebook",
        note=(
            "vLLM's own EngineArgs raises TypeError on both names; tunebook reports them before "
            "any engine starts. The article's configuration ran here without them. "
            + "; ".join(
                f"{r['setting']}={r['value']!r} is also rejected: {r['error']}"
                for r in rejected
                if r["setting"] not in names
            )
        ),
    )


# --------------------------------------------------------------------------- notebook 00's cells
def checks_text(checks: list[dict]) -> str:
    """``check_each`` rows as a text table, the errors in full."""
    import pandas as pd

    with pd.option_context("display.max_colwidth", 200):
        return pd.DataFrame(checks).to_string(index=False)


def runnable_text(runnable: dict, changes: list[dict]) -> str:
    """The article's configuration as it runs here, then one row per change (``runnable_settings``)."""
    import pandas as pd

    table = pd.DataFrame(changes).to_string(index=False) if changes else "(no changes)"
    return f"article, as run here: {runnable}\n{table}"


def named_workloads(workloads: dict) -> dict:
    """name -> spec, each spec carrying its name (the points' ``workload`` column)."""
    return {name: {**spec, "name": name} for name, spec in workloads.items()}


def baseline_runs(
    workloads: dict,
    concurrent: dict,
    max_concurrency: int | None,
    mode: str,
    concurrent_repeats: int,
) -> dict:
    """The workloads of the baseline sweep, as ``Workbook.sweep`` keyword arguments.

    Every engine start serves each of ``workloads`` (capped at ``max_concurrency`` requests in
    flight; None: no cap), then C6's ``concurrent`` workload, uncapped, as "concurrent". In-process
    modes run C6 on the first ``concurrent_repeats`` starts only; served mode on every start.
    """
    if "concurrent" in workloads:
        raise ValueError("C6 runs as the workload 'concurrent': rename that workload")
    return {
        "workloads": {**workloads, "concurrent": concurrent},
        "point_overrides": {name: {"max_concurrency": max_concurrency} for name in workloads},
        "workload_repeats": None if mode == "served" else {"concurrent": concurrent_repeats},
    }


def workload_points(results: list[dict], name: str) -> list[dict]:
    """The points of one workload of a sweep that served several."""
    return [r for r in results if (r.get("workload") or {}).get("name") == name]


def workload_frames(results: list[dict], names) -> dict:
    """workload name -> ``points_frame`` of its points, for each of ``names``."""
    return {name: points_frame(workload_points(results, name)) for name in names}


def failed_text(frames: dict) -> str:
    """The failed points of each workload with their errors; "" when every point ran."""
    parts = []
    for name, df in frames.items():
        if "status" not in df:
            continue
        failed = df.loc[df["status"] != "ok"].reindex(columns=["point_id", "error"])
        if len(failed):
            parts.append(f"{name}: failed points\n{failed.to_string(index=False)}")
    return "\n".join(parts)


# The baseline's charts, one per metric: (column, title).
BASELINE_CHARTS: list[tuple[str, str]] = [
    ("e2e_mean_ms", "Latency per request (mean e2e, ms)"),
    ("ttft_p99_ms", "TTFT p99 (ms)"),
    ("tpot_p50_ms", "TPOT p50 (ms)"),
    ("request_throughput_rps", "Requests per second"),
]


def metric_charts(frames: dict) -> list:
    """One bar chart per ``BASELINE_CHARTS`` metric: workloads on x, one bar per config (median,
    min-max whiskers over engine starts)."""
    import pandas as pd

    allf = pd.concat([add_derived(df) for df in frames.values()], ignore_index=True)
    return [
        plots.bar_with_spread(allf, "workload", col, color="config", title=title)
        for col, title in BASELINE_CHARTS
    ]


def c6_text(c6: dict, claim_model: str) -> str:
    """``c6_arithmetic`` in three lines: bytes per token, the requests' KV, what the card holds."""
    tokens = c6["tokens_each"]
    return "\n".join(
        [
            f"{claim_model}: {c6['bytes_per_token']:,} B per token (bf16)",
            f"{c6['requests']} requests x {tokens} tokens = {c6['kv_bytes']:,} B"
            f" = {c6['kv_gib']:.2f} GiB of KV",
            f"RTX 4090 ({c6['card_gib']} GiB) at gpu_memory_utilization"
            f" {c6['gpu_memory_utilization']}: at most {c6['kv_space_gib']:.2f} GiB for KV after"
            f" {c6['weights_gib']:.2f} GiB of weights -> {c6['requests_that_fit']} requests of"
            f" {tokens} tokens",
        ]
    )


# What the table of C6's run shows, in order (those the frame has).
CONCURRENT_COLUMNS = [
    "config",
    "repeat",
    "status",
    "num_requests",
    "num_requests_running_peak",
    "num_preemptions",
    "kv_cache_usage_peak_pct",
    "KV blocks predicted %",
    "cap_kv_capacity_tokens",
    "error",
]


def concurrent_view(concurrent, workload: dict, shape: ModelShape):
    """C6's run per engine (``points_frame``), with "KV blocks predicted %": the share of the
    engine's KV blocks the workload holds with every request in flight (blank for a failed run)."""

    def predicted_pct(row):
        blocks = row.get("cap_num_gpu_blocks")
        if row.get("status") != "ok" or not blocks or blocks != blocks:
            return None
        need = workload_need(workload, shape, int(row["cap_block_size"]))
        return round(100 * need["blocks"] / blocks, 2)

    view = concurrent.assign(
        **{"KV blocks predicted %": [predicted_pct(r) for _, r in concurrent.iterrows()]}
    )
    return view[[c for c in CONCURRENT_COLUMNS if c in view]]


def concurrent_timelines(results: list[dict], num_requests: int) -> list:
    """The engine's state over C6's run (KV usage, running, waiting): one figure per
    configuration, from its first engine start, when it ran and was sampled."""
    return [
        plots.timeline(r["timeline"], title=f"{r['config']}: {num_requests} requests at once")
        for r in results
        if r.get("status") == "ok" and r.get("repeat") == 0 and r.get("timeline")
    ]
