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

from tunebook.topics import blocksize
from tunebook.workbench.notebook import headline, record_verdicts, verdicts_text
from tunebook.workbench.workbook import Workbook, grid, platform_name, vllm_version

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
speed_meaningful = platform_name() != "cpu"  # a tiny model on CPU says nothing about GPU speed
workload = blocksize.shared_prefix_workload(
    num_requests, prompt_len, prefix_len, num_prefixes, output_len
)
print(blocksize.setup_text(platform_name(), vllm_version(), model, workload))

# %% [markdown]
# ## 1. Which block sizes are valid here
# The settings check runs first; every size it lets through is started as an engine (these
# engine starts are also the first repeat of the measurements below).

# %%
screened = blocksize.screen(block_sizes, engine_settings)
probe_configs = grid("block_size", blocksize.passed(screened))
wb.sweep("block_size", probe_configs, workload, repeats=1, mode="offline")
validity = blocksize.validity(screened, wb.results("block_size"))
valid = blocksize.valid_sizes(validity)
display(pd.DataFrame(validity))

# %%
# NBVAL_CHECK_OUTPUT
print(blocksize.validity_text(validity))

# %% [markdown]
# ## 2. Each valid size, with repeats
# One engine start per size and repeat, interleaved. TTFT in an offline batch is the time from
# submitting the batch to a request's first token, so it includes waiting for earlier prefills.

# %%
sweep_df = wb.sweep(
    "block_size", grid("block_size", valid), workload, repeats=repeats, mode="offline"
)
if len(failed := blocksize.failed_points(sweep_df)):
    display(failed)
pp = blocksize.per_point(blocksize.results_for(wb.results("block_size"), valid), prefix_len)
summary = blocksize.summary(pp, prefix_len)
display(summary)

# %%
blocksize.throughput_figure(pp).show()

# %%
blocksize.latency_figure(pp).show()

# %% [markdown]
# ### KV capacity
# Capacity is what the engine reports (blocks x block size); with `kv_cache_memory_bytes` set,
# the arithmetic from the model's shape predicts it.

# %%
# NBVAL_CHECK_OUTPUT
kv_bytes = engine_settings.get("kv_cache_memory_bytes")
print(blocksize.capacity_text(summary, wb.shape, kv_bytes))

# %% [markdown]
# ### Prefix-cache hits are counted in whole blocks
# Every later request with the same system prompt can reuse only the full blocks of it. The
# first request of each prefix computes it and is left out.

# %%
# NBVAL_CHECK_OUTPUT
gran = blocksize.granularity_check(pp, prefix_len)
print(blocksize.granularity_text(gran, prefix_len))

# %%
blocksize.prefix_hits_figure(summary, prefix_len).show()

# %% [markdown]
# ## 3. Attention backends
# The same batch with `attention_backend` set, at one block size. The backend actually used is
# what the engine reports (from its log when engines run isolated; vLLM's CPU platform always
# runs CPU_ATTN and only logs "Cannot use ... backend on CPU" for any other request).

# %%
bk_configs = blocksize.backend_configs(attention_backends, backend_block_size)
bk_results = []
if bk_configs:
    wb.sweep("attention_backend", bk_configs, workload, repeats=backend_repeats, mode="offline")
    bk_results = wb.results("attention_backend")
if bk_failures := blocksize.failures_text(bk_results):
    print(bk_failures)
backends = blocksize.backends_frame(pp, bk_results, prefix_len, backend_block_size)
display(blocksize.backend_rows(backends))

# %%
# NBVAL_CHECK_OUTPUT
print(blocksize.backends_text(backends))

# %%
if len(backends):
    blocksize.backend_figure(backends, backend_block_size).show()

# %% [markdown]
# ## 4. Verdict on the article's claim

# %%
evidence = str(wb.sweep_dir("block_size"))
verdicts = [
    blocksize.c4_verdict(
        validity, pp, gran, prefix_len, evidence, speed_meaningful=speed_meaningful
    )
]
display(record_verdicts(run_dir, "02_block_size_sweep", verdicts))
print(verdicts_text(verdicts))

# %%
# NBVAL_CHECK_OUTPUT
# C4's verdict on CPU rests on which block sizes the backend accepts (its speed figures vary).
print(headline(verdicts[0]))

# %%
# vLLM's log in a few lines (the file holds all of it), and this notebook's GPU time.
tunebook.workbench.notebook.end(run_dir, "02_block_size_sweep")
