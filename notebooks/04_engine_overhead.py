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
# # 04 · The engine's own overhead: is it host-bound, and what lifts it?
#
# **Question.** For a small model the GPU's share of a decode step is small: how much of the
# step is the host (scheduling, input preparation, sampling, detokenization, and, when served,
# the API server that sends every token as its own SSE chunk)? And which host-side lever raises
# the load the deployment serves within its SLO: CUDA graph capture sizes, `max_num_seqs`,
# `performance_mode`, `stream_interval` and `api_server_count` (server only), or several engine
# replicas on the one device behind vLLM's load balancer, vllm-router?
#
# **Method.**
# 1. Diagnosis: one in-process engine runs a decode-heavy batch; its decode step time (TPOT) is
#    set against the roofline floor of that step (weights and KV read once, FLOPs at peak).
# 2. Levers: every configuration is served as users are served (`vllm serve`, streamed OpenAI
#    completions from a multi-process client that reports its own lag) and judged by its
#    **capacity under the SLO**: the highest Poisson request rate at which the SLO holds
#    (`tunebook.core.metrics.slo_text`), found by doubling the rate until the SLO breaks, then
#    bisecting, on one engine start per configuration and repeat. Starts are interleaved
#    (A B C A B C) and repeated; a gap counts only beyond the noise (`metrics.compare`).
#
# **Expected outcome.** On a GPU, decode steps run far above their floor (host-bound), the single
# API-server process caps a served small model, and replicas or fewer SSE chunks lift capacity
# severalfold: vLLM's defaults leave capacity on the table. On the CPU profile (a tiny model on
# two cores) the device *is* the host: replicas compete for the same two cores, so no lever
# should win there, and the figures describe the harness, not a GPU.

# %%
import os
from typing import Optional  # papermill reads Optional[float] in the parameters, not float | None

import pandas as pd
from IPython.display import display

from tunebook.core import claims
from tunebook.core.metrics import slo_text
from tunebook.topics import headroom, roofline
from tunebook.workbench.workbook import Workbook, platform_name, vllm_version

pd.set_option("display.max_colwidth", 160)
pd.set_option("display.width", 200)

# %% tags=["parameters"]
# fmt: off
run_dir: str = ""  # where results go; "": runs/interactive in this repository; the runner passes runs/<run-id>
model: str = "tiny-ernie"  # model folder or name under models/ (config.json; dummy weights when none)
engine_settings: dict = {"enforce_eager": True, "kv_cache_memory_bytes": 67108864, "max_model_len": 2048}  # vLLM EngineArgs for every engine here
engine_env: dict = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # environment of the in-process diagnosis engine
server_env: dict = {}  # environment of every vllm serve process
repeats: int = 1  # engine starts per configuration, interleaved A B C A B C
isolate: bool = False  # the diagnosis engine in a child process
diagnose: bool = True  # run the decode-step diagnosis (one in-process engine start)
diagnosis_workload: dict = {"kind": "fixed", "num_requests": 32, "prompt_len": 64, "output_len": 64, "seed": 21}  # decode-heavy batch, all at once
peak_tflops: Optional[float] = None  # device peak (dense bf16, TFLOP/s) for the floor; None: the detected card's datasheet
hbm_tb_s: Optional[float] = None  # device memory bandwidth (TB/s) for the floor; None: the detected card's datasheet
levers: dict = {}  # name -> {"settings": {EngineArgs}, "serve": {api_server_count, ...}}: configurations beside the default
replica_counts: list[int] = [2]  # engine replicas behind vllm-router (1 is the default itself)
kv_cache_bytes_total: int = 67108864  # KV bytes the replicas of one configuration share (0: split gpu_memory_utilization)
router_policy: str = "round_robin"  # vllm-router policy for replicas
workload: dict = {"kind": "fixed", "prompt_len": 64, "output_len": 16, "seed": 31}  # one request's shape; the rate search sets num_requests and request_rate
slo_ttft_ms: float = 2000.0  # each request's time to first token at most this
slo_tpot_ms: float = 200.0  # each request's time per output token at most this
slo_attainment_pct: float = 99.0  # the SLO holds when this share of requests meets both
search: dict = {"start_rps": 2.0, "duration_s": 3.0, "min_requests": 8, "bisect_steps": 1, "max_rps": 256.0}  # capacity search (tunebook.measure.served.SEARCH_DEFAULTS)
client_workers: int = 1  # load-generator processes
# fmt: on

# %%
# Parameters checked (names, types, values: papermill itself only warns); from here on vLLM's log
# goes to <run_dir>/04_engine_overhead/logs/engine.log.
import tunebook.workbench.notebook

run_dir = tunebook.workbench.notebook.begin(globals(), "04_engine_overhead")

# %% [markdown]
# Derived values: the platform, the model's shape, the SLO, the configurations.

# %%
if not isolate:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # before vLLM is first imported
wb = Workbook(run_dir, "04_engine_overhead", model, engine_settings, engine_env, isolate=isolate)
shape = wb.shape
platform = platform_name()
slo = {"ttft_ms": slo_ttft_ms, "tpot_ms": slo_tpot_ms, "attainment_pct": slo_attainment_pct}
kv_total = kv_cache_bytes_total or None
configs = {"default": {}, **levers}
for name, cfg in headroom.replica_configs(replica_counts, kv_total).items():
    configs[name] = headroom.merge_config(cfg, {"serve": {"router_policy": router_policy}})
print(f"platform {platform}, vLLM {vllm_version()}, model {model}")
peak_tflops, hbm_tb_s, card_source = roofline.card_figures(peak_tflops, hbm_tb_s)
print(f"roofline: {peak_tflops} TFLOP/s, {hbm_tb_s} TB/s ({card_source})")
print(f"SLO: {slo_text(slo)}")
print("configurations:", ", ".join(configs))

# %% [markdown]
# ## 1. Diagnosis: the decode step against its floor

# %%
floor = None  # the diagnosis, when run
diag_ok = []
if diagnose:
    diag = wb.sweep(
        "diagnosis",
        {"default": {}},
        {**diagnosis_workload, "name": "decode"},
        repeats=1,
        mode="offline",
    )
    diag_ok = diag[diag["status"] == "ok"]
    if not len(diag_ok):
        display(diag[["point_id", "error"]])
else:
    print("diagnosis skipped (diagnose: false)")
if len(diag_ok) and not (peak_tflops and hbm_tb_s):
    print("no roofline floor: no card figures (give peak_tflops and hbm_tb_s)")
elif len(diag_ok):
    row = diag_ok.iloc[0]
    batch = diagnosis_workload["num_requests"]
    context = diagnosis_workload["prompt_len"] + diagnosis_workload["output_len"] / 2
    floor = headroom.decode_vs_floor(
        row["tpot_p50_ms"], batch, context, shape, peak_tflops, hbm_tb_s
    )
    display(pd.DataFrame([floor]).round(4))
    print(
        f"decode step {floor['step_ms']:.3g} ms at batch {batch}: the floor ({floor['bound']}-bound) is"
        f" {floor['floor_ms']:.3g} ms, {floor['of_floor_pct']:.1f}% of the step"
    )

# %% [markdown]
# ## 2. Levers, served: capacity under the SLO

# %%
serve_common = {"client_workers": client_workers}
points_configs = {
    name: headroom.merge_config(cfg, {"serve": serve_common}) for name, cfg in configs.items()
}
capacity = wb.sweep(
    "capacity",
    points_configs,
    {**workload, "name": "chat"},
    repeats=repeats,
    mode="served",
    slo=slo,
    search=search,
    env=dict(server_env),
    warmup_requests=2,
)
results = wb.results("capacity")
cap = headroom.capacity_frame(results)
display(cap.round(3))

# %%
rank = headroom.ranking(cap)
display(pd.DataFrame(rank).round(3))
headroom.capacity_figure(rank, f"Figure 4.1. Capacity under the SLO ({slo_text(slo)})").show()
headroom.curve_figure(
    headroom.curve_frame(results),
    "Figure 4.2. Goodput against the offered rate, every start"
    " (a rate decided failed early, search.stop_early, has no goodput point)",
).show()

# %% [markdown]
# Every measurement says whether the client kept its schedule (p99 send lag within 20 ms): where
# it did not, the client, not the server, may have set the pace.

# %%
print(
    "client kept its schedule in every search:",
    bool(cap["client_kept_schedule"].fillna(False).all()),
    f"(worst p99 send lag {cap['lag_p99_ms_max'].max():.3g} ms)" if len(cap) else "",
)

# %% [markdown]
# ## 3. Verdict

# %%
v = headroom.verdict(rank, floor=floor)
print(v["text"])
verdicts = [
    headroom.c14_verdict(
        v, rank, evidence=str(wb.sweep_dir("capacity")), speed_meaningful=platform != "cpu"
    )
]
claims.write(run_dir, "04_engine_overhead", verdicts)
display(claims.table(verdicts))
for x in verdicts:
    print(claims.describe(x))

# %%
# vLLM's log in a few lines (the file holds all of it), and this notebook's GPU time.
tunebook.workbench.notebook.end(run_dir, "04_engine_overhead")
