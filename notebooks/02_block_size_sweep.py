# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: tunebook (.venv)
#     language: python
#     name: tunebook
# ---

# %% [markdown]
# # 02 · Block size: which sizes are valid here, and what each one costs
#
# **Question.** The article says `block_size=16` is best for ERNIE-4.5-0.3B ("too small
# fragments, too large wastes", claim C4). Which block sizes does this platform's attention
# backend accept at all, and what does each valid size change: throughput, time to first token
# (TTFT), time per output token (TPOT), KV capacity, and prefix-cache hits?
#
# **Method.**
# 1. Every candidate goes through the settings check first (it knows the rules vLLM states up
#    front); each one the check cannot rule out is started as a real engine. A rejected size is
#    shown with its error; an engine that silently uses another size is flagged.
# 2. Each valid size runs the same offline batch, with engine starts interleaved (A B A B) and
#    repeated, so that gaps can be judged against the spread between engine starts.
# 3. The batch is chat-like: every prompt starts with one of a few shared system prompts whose
#    length is *not* a multiple of the block size. Prefix-cache hits are counted in whole blocks,
#    so a later request can reuse only `floor(prefix / block) * block` tokens: the cached tokens
#    per request are compared with that arithmetic.
# 4. Where the platform has more than one attention backend, they are compared at one block
#    size (`attention_backend`).
#
# **Expected outcome.** Valid sizes depend on the backend (CPU_ATTN: multiples of 32, so 16 is
# invalid on CPU; FlashAttention on CUDA: multiples of 16). KV capacity is the same for every
# size up to rounding (PagedAttention has no external fragmentation). Bigger blocks lose up to
# `block - 1` tokens of every shared prefix. Speed differences between sizes are small and must
# be shown to exceed the noise before a size is called best.

# %%
import os

import pandas as pd
from IPython.display import display

from tunebook.core import claims
from tunebook.measure.sweep import grid
from tunebook.topics import blocksize, plots, prefill
from tunebook.workbench.workbook import Workbook, platform_name, vllm_version

pd.set_option("display.max_colwidth", 160)

# %% tags=["parameters"]
# fmt: off
run_dir: str = ""  # where results go; "": runs/interactive in this repository; the runner passes runs/<run-id>
model: str = "tiny-ernie"  # model folder or name under models/ (config.json; dummy weights when none)
engine_settings: dict = {"enforce_eager": True, "kv_cache_memory_bytes": 67108864, "max_model_len": 2048}  # vLLM EngineArgs for every engine here
engine_env: dict = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # environment of the engine processes
repeats: int = 2  # engine starts per configuration, interleaved A B A B
isolate: bool = False  # one child process per engine (a crash fails only its point)
block_sizes: list[int] = [8, 16, 32, 128, 256]  # candidate block_size values (tokens per KV block), each checked then probed
num_requests: int = 16  # requests in the offline batch of every point
prompt_len: int = 600  # prompt tokens per request (shared prefix + unique rest)
prefix_len: int = 470  # tokens of the shared system prompt; not a multiple of the block sizes
num_prefixes: int = 4  # distinct system prompts, reused round-robin
output_len: int = 16  # tokens generated per request (ignore_eos)
attention_backends: list[str] = ["FLASH_ATTN"]  # attention_backend values compared with the default backend
backend_block_size: int = 128  # block_size of the backend comparison
backend_repeats: int = 1  # engine starts per attention_backend value
# fmt: on

# %%
# A parameter this notebook does not declare, a wrong type or an invalid value stops here (papermill
# itself only warns); from here on vLLM's log goes to <run_dir>/02_block_size_sweep/logs/engine.log.
import tunebook.workbench.notebook

run_dir = tunebook.workbench.notebook.begin(globals(), "02_block_size_sweep")

# %%
if not isolate:  # in-process engines log into this notebook; isolated ones log to files, which
    # must keep vLLM's INFO lines (the attention backend in use is read from them)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # before vLLM is first imported
wb = Workbook(run_dir, "02_block_size_sweep", model, engine_settings, engine_env, isolate=isolate)
shape = wb.shape
platform = platform_name()
speed_meaningful = platform != "cpu"  # a tiny model on CPU says nothing about GPU speed
prefix_share = prefix_len / prompt_len
workload = {
    "kind": "shared_prefix",
    "num_requests": num_requests,
    "prompt_len": prompt_len,
    "prefix_share": prefix_share,
    "num_prefixes": num_prefixes,
    "output_len": output_len,
    "seed": 0,
}
assert round(prompt_len * prefix_share) == prefix_len, "prefix length must round-trip"
print(f"platform {platform}, vLLM {vllm_version()}, model {model}")
print(
    f"workload: {num_requests} x ({prompt_len} prompt tokens, {prefix_len} of them shared; {output_len} out)"
)

# %% [markdown]
# ## 1. Which block sizes are valid here
# The settings check runs first; every size it lets through is started as an engine (these
# engine starts are also the first repeat of the measurements below).

# %%
screened = blocksize.screen(block_sizes, engine_settings)
probe = wb.sweep(
    "block_size",
    grid("block_size", blocksize.passed(screened)),
    workload,
    repeats=1,
    mode="offline",
)
validity = blocksize.validity(screened, wb.results("block_size"))
valid = blocksize.valid_sizes(validity)
display(pd.DataFrame(validity))

# %%
# NBVAL_CHECK_OUTPUT
for r in validity:
    status = "valid" if r["valid"] else "invalid"
    reason = f": {r['error'].splitlines()[0]}" if r["error"] else ""
    print(
        f"block_size {r['block_size']:>4}: {status} (check {r['settings check']}, engine {r['engine']}){reason}"
    )
print("valid block sizes:", valid)

# %% [markdown]
# ## 2. Each valid size, with repeats
# One engine start per size and repeat, interleaved. TTFT in an offline batch is the time from
# submitting the batch to a request's first token, so it includes waiting for earlier prefills.

# %%
sweep_df = wb.sweep(
    "block_size", grid("block_size", valid), workload, repeats=repeats, mode="offline"
)
failed = sweep_df[sweep_df["status"] != "ok"]
if len(failed):
    display(failed[["point_id", "status", "error"]])
results = [p for p in wb.results("block_size") if blocksize.requested_block_size(p) in valid]
pp = blocksize.per_point(results, prefix_len)
summary = blocksize.summary(pp, prefix_len)
display(summary)

# %%
fig = plots.bar_with_spread(
    pp,
    "block_size",
    "output_throughput_tok_s",
    title="Output throughput per block size (median, min-max over engine starts)",
    yaxis="output tokens/s",
)
fig.show()

# %%
lat_cols = {
    "TTFT p50": "ttft_p50_ms",
    "TTFT p99": "ttft_p99_ms",
    "TPOT p50": "tpot_p50_ms",
    "TPOT p99": "tpot_p99_ms",
}
lat = prefill.long_form(pp, "block_size", lat_cols)
fig = plots.bar_with_spread(
    lat,
    "block_size",
    "value",
    color="metric",
    title="TTFT and TPOT percentiles per block size",
    yaxis="ms",
)
fig.show()

# %% [markdown]
# ### KV capacity
# Capacity is what the engine reports (blocks x block size); with `kv_cache_memory_bytes` set,
# the arithmetic from the model's shape predicts it.

# %%
# NBVAL_CHECK_OUTPUT
kv_bytes = engine_settings.get("kv_cache_memory_bytes")
print(f"KV bytes per token: {shape.kv_bytes_per_token():,}")
for _, r in summary.iterrows():
    pred = shape.kv_capacity_tokens(kv_bytes, int(r["block_size"])) if kv_bytes else None
    extra = f" (arithmetic {pred:,})" if pred is not None else ""
    print(
        f"block_size {int(r['block_size']):>4}: {int(r['num_gpu_blocks']):>6,} blocks, {int(r['kv_capacity_tokens']):>10,} tokens{extra}"
    )

# %% [markdown]
# ### Prefix-cache hits are counted in whole blocks
# Every later request with the same system prompt can reuse only the full blocks of it. The
# first request of each prefix computes it and is left out.

# %%
# NBVAL_CHECK_OUTPUT
gran = blocksize.granularity_check(pp, prefix_len)
for g in gran:
    print(
        f"block_size {g['block_size']:>4}: cached tokens per later request {g['measured']},"
        f" floor({prefix_len}/{g['block_size']})*{g['block_size']} = {g['expected']},"
        f" {'match' if g['match'] else 'MISMATCH'}"
    )

# %%
summary["shared prefix"] = prefix_len
fig = plots.lines(
    summary,
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
fig.show()

# %% [markdown]
# ## 3. Attention backends
# The same batch with `attention_backend` set, at one block size. The backend actually used is
# what the engine reports (from its log when engines run isolated; vLLM's CPU platform always
# runs CPU_ATTN and only logs "Cannot use ... backend on CPU" for any other request).

# %%
bk_configs = {
    f"attention_backend={b}": {
        "settings": {"attention_backend": b, "block_size": backend_block_size}
    }
    for b in attention_backends
}
bk_df = (
    wb.sweep("attention_backend", bk_configs, workload, repeats=backend_repeats, mode="offline")
    if bk_configs
    else None
)
bk_results = wb.results("attention_backend") if bk_configs else []
bk_failed = [p for p in bk_results if p.get("status") != "ok"]
for p in bk_failed:
    print(f"{p['config']}: {p.get('error')}")
bk_pp = blocksize.per_point(bk_results, prefix_len)
base_pp = pp[pp["block_size"] == backend_block_size]
backends = pd.concat([base_pp, bk_pp], ignore_index=True) if len(bk_pp) else base_pp
display(blocksize.backend_rows(backends))

# %%
# NBVAL_CHECK_OUTPUT
for (asked, used), _g in backends.groupby(
    ["attention_backend (asked)", "attention_backend (used)"], sort=False
):
    print(f"attention_backend asked {asked}: used {used}")
print("backends in use here:", sorted(set(backends["attention_backend (used)"])))

# %%
if len(backends):
    backends["backend"] = (
        backends["attention_backend (asked)"] + " -> " + backends["attention_backend (used)"]
    )
    fig = plots.bar_with_spread(
        backends,
        "backend",
        "output_throughput_tok_s",
        title=f"Output throughput per attention backend (block_size {backend_block_size})",
        yaxis="output tokens/s",
    )
    fig.show()

# %% [markdown]
# ## 4. Verdict on the article's claim

# %%
verdicts = [
    blocksize.c4_verdict(
        validity,
        pp,
        gran,
        prefix_len,
        evidence=str(wb.sweep_dir("block_size")),
        speed_meaningful=speed_meaningful,
    )
]
claims.write(run_dir, "02_block_size_sweep", verdicts)
display(claims.table(verdicts))
for v in verdicts:
    print(claims.describe(v))

# %%
# NBVAL_CHECK_OUTPUT
# C4's verdict on CPU rests on which block sizes the backend accepts (its speed figures vary).
print(claims.headline(verdicts[0]))

# %%
# vLLM's log in a few lines (the file holds all of it), and this notebook's GPU time.
tunebook.workbench.notebook.end(run_dir, "02_block_size_sweep")
