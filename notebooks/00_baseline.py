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

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # before vLLM is imported: readable outputs

import pandas as pd
from IPython.display import display

import tunebook.topics.baseline as bl

pd.set_option("display.width", 200, "display.max_columns", 30, "display.max_colwidth", 120)

# %% tags=["parameters"]
# fmt: off
run_dir: str = ""  # where results go; "": runs/interactive in this repository; the runner passes runs/<run-id>
model: str = "tiny-ernie"  # model folder or name under models/ (config.json; dummy weights when none)
engine_settings: dict = {"enforce_eager": True, "kv_cache_memory_bytes": 67108864, "max_model_len": 2048}  # vLLM EngineArgs for every engine here
engine_env: dict = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # environment of the engine processes
repeats: int = 2  # engine starts per configuration, interleaved A B A B
isolate: bool = False  # one child process per engine (a crash fails only its point)
article_settings: dict = {"gpu_memory_utilization": 0.85, "max_num_batched_tokens": 2048, "max_num_seqs": 256, "block_size": 16, "enable_prefix_caching": True, "max_paddings": 128, "scheduler_policy": "hybrid"}  # the article's configuration as written, nonexistent settings included
workloads: dict = {"short_chat": {"kind": "uniform", "num_requests": 16, "min_prompt_len": 16, "max_prompt_len": 64, "output_len": 16, "seed": 1}, "medium": {"kind": "uniform", "num_requests": 8, "min_prompt_len": 256, "max_prompt_len": 512, "output_len": 16, "seed": 2}, "long": {"kind": "uniform", "num_requests": 4, "min_prompt_len": 1024, "max_prompt_len": 1536, "output_len": 16, "seed": 3}}  # name -> workload spec; each engine start runs every one
mode: str = "offline"  # "offline" (LLM.generate, all requests at once), "online" (AsyncLLM, streamed, client-side TTFT) or "served" (vllm serve over HTTP)
max_concurrency: int = 0  # online and served modes: requests in flight at most (0: no cap)
compare_mode: str = ""  # run the default once more in this mode, shown beside `mode` ("": no)
sampling: dict = {"temperature": 0.0}  # SamplingParams for every request (greedy; the article used temperature 0.7, top_p 0.9)
concurrent_workload: dict = {"kind": "fixed", "num_requests": 100, "prompt_len": 128, "output_len": 8, "seed": 4}  # C6: this many requests in flight at once, both configurations
concurrent_repeats: int = 1  # in-process modes: how many starts per configuration also run C6 (served: every start)
claim_model: str = "ernie-4.5-0.3b-pt"  # the article's model (its config.json), for the C6 arithmetic
article_card_gib: float = 23.65  # the article's RTX 4090: total memory as CUDA reports it (what gpu_memory_utilization multiplies)
claim_tokens: int = 4096  # tokens per request in the C6 arithmetic (the article's max_model_len)
# fmt: on

# %%
# A parameter this notebook does not declare, a wrong type or an invalid value stops here (papermill
# itself only warns); from here on vLLM's log goes to <run_dir>/00_baseline/logs/engine.log.
import tunebook.workbench.notebook
from tunebook.workbench.notebook import headline, record_verdicts, verdicts_text
from tunebook.workbench.workbook import Workbook, load_shape, platform_name, vllm_version

run_dir = tunebook.workbench.notebook.begin(globals(), "00_baseline")

# %% [markdown]
# Derived values: the platform, the two configurations, the workloads named after their keys.

# %%
platform = platform_name()
wb = Workbook(run_dir, "00_baseline", model, engine_settings, engine_env, isolate=isolate)
article_runnable, article_changes = bl.runnable_settings(
    article_settings, platform, engine_settings
)
configs = {"default": {}, "article": {"settings": article_runnable}}  # default: vLLM's own defaults
workloads = bl.named_workloads(workloads)
concurrent_workload = {**concurrent_workload, "name": "concurrent"}
cap = max_concurrency or None
print(f"platform: {platform}; vLLM {vllm_version()}; model: {model}")

# %% [markdown]
# ## The article's settings, one by one (C9)
#
# Each setting is validated alone against the installed vLLM's `EngineArgs`, so that one bad
# name does not hide the next. The last column is what vLLM's own `EngineArgs` does with it when
# tunebook's check is bypassed.

# %%
# NBVAL_CHECK_OUTPUT
check_rows = bl.check_each(article_settings)
print(bl.checks_text(check_rows))

# %% [markdown]
# The configuration that runs: the nonexistent settings are left out (reported above), and each
# change is listed with its reason.

# %%
# NBVAL_CHECK_OUTPUT
print(bl.runnable_text(article_runnable, article_changes))

# %% [markdown]
# ## Measurements
#
# One sweep: both configurations, `repeats` engine starts each, interleaved; each start serves every
# workload in turn (an in-process engine, or in served mode one `vllm serve` deployment), then the
# 100-requests-at-once run of C6 below (in-process: on the first `concurrent_repeats` starts).

# %%
sweep_name = f"baseline_{mode}"  # one engine start per configuration and repeat serves them all
runs = bl.baseline_runs(workloads, concurrent_workload, cap, mode, concurrent_repeats)
wb.sweep(sweep_name, configs, None, repeats, mode=mode, sampling=sampling, **runs)
baseline_points = wb.results(sweep_name)
frames = bl.workload_frames(baseline_points, workloads)
if failed := bl.failed_text(frames):
    print(failed)

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
bl.side_by_side(frames, "default", "article")

# %% [markdown]
# The default in two modes, side by side (`compare_mode`): the same workloads, in-process
# against served, for instance. Served adds the server's front end (HTTP, one SSE chunk per
# token, one API-server process): for a small model that gap is a finding in itself.

# %%
if compare_mode and compare_mode != mode:
    other = {}
    for name, spec in workloads.items():
        other_sweep = f"baseline_{name}_{compare_mode}"
        wb.sweep(
            other_sweep,
            {"default": {}},
            spec,
            1,
            mode=compare_mode,
            sampling=sampling,
            max_concurrency=cap,
        )
        other[name] = bl.points_frame(wb.results(other_sweep))
    display(bl.modes_side_by_side(frames, other, mode, compare_mode))
else:
    print("no second mode asked for (compare_mode is empty)")

# %%
for fig in bl.metric_charts(frames):
    fig.show()

# %% [markdown]
# ## 100 requests at once (C6)
#
# The article reports "OOM" at 100 concurrent requests before tuning. First the arithmetic for
# the article's model, then a run of `concurrent_workload` on both configurations: all requests
# are submitted at once; the engine reports how many ran together, whether any were preempted,
# and its peak KV usage.

# %%
# NBVAL_CHECK_OUTPUT
article_gmu = article_settings.get("gpu_memory_utilization", 0.9)  # vLLM's default if not set
c6 = bl.c6_arithmetic(load_shape(claim_model), article_card_gib, article_gmu, claim_tokens)
print(bl.c6_text(c6, claim_model))

# %%
# measured above, on the same engine starts as the workloads
conc_results = bl.workload_points(baseline_points, "concurrent")
conc = bl.points_frame(conc_results)
bl.concurrent_view(conc, concurrent_workload, load_shape(model))

# %% [markdown]
# The same run, the engine's view over time (first engine of each configuration): KV usage and
# the number of running and waiting requests.

# %%
for fig in bl.concurrent_timelines(conc_results, concurrent_workload["num_requests"]):
    fig.show()

# %% [markdown]
# ## Verdicts
#
# C1 rests on this machine's speed figures; C6 on the arithmetic above (the run's peak KV usage
# and speed ratios beside it vary from run to run); C9 on what vLLM's own `EngineArgs` says.

# %%
evidence = str(wb.sweep_dir(sweep_name))
v_c1 = bl.c1_verdict(frames, platform, repeats, evidence, vllm_version(), article_card_gib)
print(verdicts_text([v_c1]))

# %%
n_conc = concurrent_workload["num_requests"]
v_c6 = bl.c6_verdict(c6, claim_model, conc, n_conc, frames, evidence, platform)
print(verdicts_text([v_c6]))

# %%
# NBVAL_CHECK_OUTPUT
v_c9 = bl.c9_verdict(check_rows, vllm_version())
print(verdicts_text([v_c9]))

# %%
# NBVAL_CHECK_OUTPUT
# C6's verdict follows from the arithmetic alone (its figures above include timings).
print(headline(v_c6))

# %%
record_verdicts(run_dir, "00_baseline", [v_c1, v_c6, v_c9])

# %%
# vLLM's log in a few lines (the file holds all of it), and this notebook's GPU time.
tunebook.workbench.notebook.end(run_dir, "00_baseline")
