# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 00 · Baseline: vLLM's defaults and the article's configuration, side by side
#
# **Question.** What does the engine do with its default settings on this machine, and what does
# the article's "tuned" configuration change, on the same workloads (short chat, medium and long
# prompts)? Latency per request, TTFT and TPOT percentiles, throughput, requests per second (QPS),
# device memory (GPU only) and KV capacity.
#
# **Method.** Every setting of the article is first checked on its own against the installed
# vLLM: settings that do not exist (`max_paddings`, `scheduler_policy="hybrid"`) are reported as
# errors, not dropped silently, and a value the backend rejects (`block_size=16` on CPU) is shown
# with its error and replaced by the nearest valid one. Then both configurations run each workload
# on a real engine, one engine start per point, repeats interleaved (A B A B), and the tables give
# the median with the min-max range over engine starts. A separate run puts 100 requests in
# flight at once (the article's "OOM at 100 concurrent requests").
#
# **Expected outcome.** The article's baseline (C1: 3.2 s per request, 4.8 GB, ~10 QPS on an
# RTX 4090) cannot be reproduced here: other hardware, and its own figures disagree with each
# other. Its two scheduler settings do not exist (C9). 100 concurrent requests fit in the KV cache
# many times over (C6): the arithmetic for ERNIE-4.5-0.3B gives 7.0 GiB for 100 x 4096 tokens.
# On the CPU profile (a tiny model with dummy weights) speed figures describe the harness, not a
# GPU; capacity and errors are the engine's own.

# %%
import os

os.environ.setdefault(
    "VLLM_LOGGING_LEVEL", "WARNING"
)  # before vLLM is imported: keep outputs readable

import pandas as pd

import tunebook as tb
import tunebook.baseline as bl
import tunebook.claims as claims
import tunebook.engine as engine
import tunebook.plots as plots
import tunebook.workbook
from tunebook.model import GIB, load_shape

pd.set_option("display.width", 200)
pd.set_option("display.max_columns", 30)
pd.set_option("display.max_colwidth", 120)

# %% tags=["parameters"]
# fmt: off
run_dir: str = "../runs/interactive"  # where results go; the runner passes runs/<run-id>
model: str = "tiny-ernie"  # model folder or name under models/ (config.json; dummy weights when none)
engine_settings: dict = {"enforce_eager": True, "kv_cache_memory_bytes": 67108864, "max_model_len": 2048}  # vLLM EngineArgs for every engine here
engine_env: dict = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # environment of the engine processes
repeats: int = 2  # engine starts per configuration, interleaved A B A B
isolate: bool = False  # one child process per engine (a crash fails only its point)
article_settings: dict = {"gpu_memory_utilization": 0.85, "max_num_batched_tokens": 2048, "max_num_seqs": 256, "block_size": 16, "enable_prefix_caching": True, "max_paddings": 128, "scheduler_policy": "hybrid"}  # the article's configuration as written, nonexistent settings included
workloads: dict = {"short_chat": {"kind": "uniform", "num_requests": 16, "min_prompt_len": 16, "max_prompt_len": 64, "output_len": 16, "seed": 1}, "medium": {"kind": "uniform", "num_requests": 8, "min_prompt_len": 256, "max_prompt_len": 512, "output_len": 16, "seed": 2}, "long": {"kind": "uniform", "num_requests": 4, "min_prompt_len": 1024, "max_prompt_len": 1536, "output_len": 16, "seed": 3}}  # name -> workload spec; one sweep each
mode: str = "offline"  # "offline" (LLM.generate, all requests at once) or "online" (AsyncLLM, streamed, client-side TTFT)
max_concurrency: int = 0  # online mode: requests in flight at most (0: no cap)
sampling: dict = {"temperature": 0.0}  # SamplingParams for every request (greedy; the article used temperature 0.7, top_p 0.9)
concurrent_workload: dict = {"kind": "fixed", "num_requests": 100, "prompt_len": 128, "output_len": 8, "seed": 4}  # C6: this many requests in flight at once, both configurations
concurrent_repeats: int = 1  # engine starts per configuration for the concurrent run
claim_model: str = "ernie-4.5-0.3b-pt"  # the article's model (its config.json), for the C6 arithmetic
article_card_gib: float = 23.65  # the article's RTX 4090: total memory as CUDA reports it (what gpu_memory_utilization multiplies)
claim_tokens: int = 4096  # tokens per request in the C6 arithmetic (the article's max_model_len)
# fmt: on

# %% [markdown]
# Derived values: the platform, the model's shape, the two configurations.

# %%
platform = engine.platform_name()
shape = load_shape(model)
claim_shape = load_shape(claim_model)
wb = tb.workbook.Workbook(
    run_dir, "00_baseline", model, engine_settings, engine_env, isolate=isolate
)
article_runnable, article_changes = bl.runnable_settings(
    article_settings, platform, engine_settings
)
configs = {
    "default": {},  # engine_settings only: vLLM's own defaults for everything else
    "article": {"settings": article_runnable},
}
workloads = {name: {**spec, "name": name} for name, spec in workloads.items()}
concurrent_workload = {**concurrent_workload, "name": "concurrent"}
cap = max_concurrency or None
print(f"platform: {platform}; vLLM {engine.vllm_version()}; model: {model}")

# %% [markdown]
# ## The article's settings, one by one (C9)
#
# Each setting is validated alone against the installed vLLM's `EngineArgs`, so that one bad
# name does not hide the next. The last column is what vLLM's own `EngineArgs` does with it when
# tunebook's check is bypassed.

# %%
# NBVAL_CHECK_OUTPUT
checks = pd.DataFrame(bl.check_each(article_settings))
with pd.option_context("display.max_colwidth", 200):
    print(checks.to_string(index=False))

# %% [markdown]
# The configuration that runs: the nonexistent settings are left out (reported above), and each
# change is listed with its reason.

# %%
# NBVAL_CHECK_OUTPUT
print("article, as run here:", article_runnable)
print(pd.DataFrame(article_changes).to_string(index=False) if article_changes else "(no changes)")

# %% [markdown]
# ## Measurements
#
# One sweep per workload: both configurations, `repeats` engine starts each, interleaved.

# %%
frames = {}
for name, spec in workloads.items():
    wb.sweep(
        f"baseline_{name}",
        configs,
        spec,
        repeats,
        mode=mode,
        sampling=sampling,
        max_concurrency=cap,
    )
    frames[name] = bl.points_frame(wb.results(f"baseline_{name}"))
failed = {n: df.loc[df["status"] != "ok", ["point_id", "error"]] for n, df in frames.items()}
for n, f in failed.items():
    if len(f):
        print(f"{n}: failed points\n{f.to_string(index=False)}")

# %% [markdown]
# What each configuration ran with, as the engine resolved it (a blank in the settings means
# vLLM chose; this is what it chose).

# %%
# NBVAL_CHECK_OUTPUT
print(bl.effective_settings(frames).to_string())

# %% [markdown]
# Side by side: median [min-max] over engine starts; the ratio is article / default, and
# "within noise" means the two ranges overlap (the gap is not shown to be real); blank when a
# side has a single engine start.

# %%
table = bl.side_by_side(frames, "default", "article")
table

# %%
allf = pd.concat([bl.add_derived(df) for df in frames.values()], ignore_index=True)
for col, title in [
    ("e2e_mean_ms", "Latency per request (mean e2e, ms)"),
    ("ttft_p99_ms", "TTFT p99 (ms)"),
    ("tpot_p50_ms", "TPOT p50 (ms)"),
    ("request_throughput_rps", "Requests per second"),
]:
    plots.bar_with_spread(allf, "workload", col, color="config", title=title).show()

# %% [markdown]
# ## 100 requests at once (C6)
#
# The article reports "OOM" at 100 concurrent requests before tuning. First the arithmetic for
# the article's model, then a run of `concurrent_workload` on both configurations: all requests
# are submitted at once; the engine reports how many ran together, whether any were preempted,
# and its peak KV usage.

# %%
# NBVAL_CHECK_OUTPUT
need = bl.concurrent_kv_need(claim_shape, 100, claim_tokens)
space = bl.card_kv_space(
    claim_shape, article_card_gib, article_settings.get("gpu_memory_utilization", 0.9)
)
fit = int(space * GIB // (claim_tokens * need["bytes_per_token"]))
print(f"{claim_model}: {need['bytes_per_token']:,} B per token (bf16)")
print(
    f"100 requests x {claim_tokens} tokens = {need['kv_bytes']:,} B = {need['kv_gib']:.2f} GiB of KV"
)
print(
    f"RTX 4090 ({article_card_gib} GiB) at gpu_memory_utilization "
    f"{article_settings.get('gpu_memory_utilization')}: at most {space:.2f} GiB for KV after "
    f"{claim_shape.weight_bytes() / GIB:.2f} GiB of weights -> {fit} requests of {claim_tokens} tokens"
)

# %%
wb.sweep(
    "concurrent",
    configs,
    concurrent_workload,
    concurrent_repeats,
    mode=mode,
    sampling=sampling,
    max_concurrency=None,
)
conc = bl.points_frame(wb.results("concurrent"))


def predicted_pct(row):
    """Share of the engine's KV blocks the workload holds with every request in flight."""
    if row["status"] != "ok" or not row.get("cap_num_gpu_blocks"):
        return None
    need = bl.workload_need(concurrent_workload, shape, int(row["cap_block_size"]))
    return round(100 * need["blocks"] / row["cap_num_gpu_blocks"], 2)


conc_view = conc.assign(**{"KV blocks predicted %": conc.apply(predicted_pct, axis=1)})
cols = [
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
conc_view[[c for c in cols if c in conc_view]]

# %% [markdown]
# The same run, the engine's view over time (first engine of each configuration): KV usage and
# the number of running and waiting requests.

# %%
for r in wb.results("concurrent"):
    if r.get("status") == "ok" and r.get("repeat") == 0 and r.get("timeline"):
        plots.timeline(
            r["timeline"],
            title=f"{r['config']}: {concurrent_workload['num_requests']} requests at once",
        ).show()

# %% [markdown]
# ## Verdicts

# %%
device = "CPU (tiny model, dummy weights)" if platform == "cpu" else f"{platform} device"
on_cpu = platform == "cpu"
speed_caveat = (
    " On CPU with a tiny model these speed figures say nothing about a GPU." if on_cpu else ""
)


def med(df, config, col):
    ok = df[(df["status"] == "ok") & (df["config"] == config)] if len(df) else df
    return ok[col].median() if col in ok and len(ok) else float("nan")


# C1: the baseline, as measured here, against the article's figures.
first = next(iter(frames))
base_bits = []
for name, df in frames.items():
    df = bl.add_derived(df)
    base_bits.append(
        f"{name}: {med(df, 'default', 'e2e_mean_ms'):.0f} ms per request (e2e mean), "
        f"{med(df, 'default', 'request_throughput_rps'):.1f} QPS"
    )
mem_cols = [
    med(df, "default", "device_memory_used_gib")
    for df in frames.values()
    if "device_memory_used_gib" in df
]
mem_txt = (
    f"; device memory {max(mem_cols):.1f} GiB (vLLM holds gpu_memory_utilization x total, "
    f"whatever the load)"
    if mem_cols
    else "; no device memory on CPU"
)
art = bl.article_qps_from_per_request(3.2, 3)
default_gmu = med(
    frames[first], "default", "cap_gpu_memory_utilization"
)  # as this vLLM resolved it
v_c1 = claims.verdict(
    "C1",
    "not reproducible",
    figure=f"default config on {device}: " + "; ".join(base_bits) + mem_txt,
    spread=f"{repeats} engine starts per config; ranges in the side-by-side table",
    evidence=str(wb.root / f"baseline_{first}"),
    note=(
        "No RTX 4090 here. The article's own figures disagree: its script divides the run time "
        f"by the number of prompts, so 3.2 s 'per request' over {art['prompts']} concurrent prompts "
        f"is a {art['run_s']:.1f} s run, {art['implied_qps']:.2f} requests/s, not ~10 QPS. And "
        f"vLLM holds gpu_memory_utilization (default {default_gmu:g} in vLLM {engine.vllm_version()}) of "
        f"the card whatever the load: {default_gmu * article_card_gib:.1f} GiB on a {article_card_gib:g} GiB "
        "card, not 4.8 GB." + speed_caveat
    ),
)

# C6: 100 concurrent requests, memory and speed after "KV tuning".
ok_conc = conc[conc["status"] == "ok"] if len(conc) else conc
all_ran = len(ok_conc) == len(conc) and len(conc) > 0
preempt = int(ok_conc["num_preemptions"].sum()) if len(ok_conc) else None
cmp_e2e = bl.comparison(frames, "default", "article", "e2e_mean_ms")
speed_txt = "; ".join(
    f"{w}: article/default e2e = {c['ratio']:.2f} ({c['noise']})" for w, c in cmp_e2e.items()
)
mem_cmp = bl.comparison(frames, "default", "article", "device_memory_used_gib")
mem_txt6 = (
    "; ".join(
        f"{w}: device memory {c['a']['median']:.1f} -> {c['b']['median']:.1f} GiB"
        for w, c in mem_cmp.items()
    )
    or "device memory not measurable on CPU"
)
v_c6 = claims.verdict(
    "C6",
    "refuted" if fit >= 100 else "inconclusive",
    figure=(
        f"100 x {claim_tokens} tokens of {claim_model} need {need['kv_gib']:.2f} GiB of KV; a 4090 at "
        f"gmu {article_settings.get('gpu_memory_utilization')} leaves at most {space:.1f} GiB ({fit} such "
        f"requests). Here {concurrent_workload['num_requests']} requests at once: "
        + ("ran on both configurations" if all_ran else "FAILED on some engines")
        + f", {preempt} preemptions, peak KV usage "
        + ", ".join(
            f"{r.config} {r.kv_cache_usage_peak_pct:.1f}%"
            if r.sampled
            else f"{r.config} not sampled (run < 0.25 s)"
            for r in ok_conc.itertuples()
        )
    ),
    spread=speed_txt,
    evidence=str(wb.sweep_dir("concurrent")),
    note=(
        "vLLM allocates the KV cache once at start; when it is full it queues or preempts "
        "requests, it does not run out of memory (01_kv_cache_sizing squeezes it to show this). "
        "An OOM at 100 requests comes from elsewhere (another process on the card, a "
        "gpu_memory_utilization above the free memory), not from KV. "
        f"Memory: {mem_txt6}; device memory follows gpu_memory_utilization, not the number of "
        "requests." + speed_caveat
    ),
)

# C9: settings that do not exist.
rejected = checks[~checks["valid"]]
missing = rejected[rejected["vllm"].str.startswith("TypeError")]
v_c9 = claims.verdict(
    "C9",
    "refuted" if len(missing) else "inconclusive",
    figure=(
        f"{len(missing)} of the article's settings do not exist in vLLM {engine.vllm_version()}: "
        + "; ".join(f"{r.setting}={r.value!r}: {r.error}" for r in missing.itertuples())
    ),
    evidence="check_each(article_settings) in this notebook",
    note=(
        "vLLM's own EngineArgs raises TypeError on both names; tunebook reports them before any "
        "engine starts. The article's configuration ran here without them. "
        + "; ".join(
            f"{r.setting}={r.value!r} is also rejected: {r.error}"
            for r in rejected.itertuples()
            if r.setting not in set(missing["setting"])
        )
    ),
)
verdicts = [v_c1, v_c6, v_c9]
claims.write(run_dir, "00_baseline", verdicts)
claims.table(verdicts)
