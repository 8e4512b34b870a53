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
# # 05 · Assemble a configuration from the evidence
#
# **Question.** Which vLLM settings should a deployment use for a given scenario (high-concurrency
# chat, long documents, low latency, high throughput; the article's presets, C11), under a stated
# SLO, and how strong is the evidence for each one? Does the result beat vLLM's defaults, and the
# article's configuration, when they run side by side? Does the written deployment hold the load
# 04 found, measured by vLLM's own client, and on traffic it was not chosen on?
#
# **Method.** This notebook reads only the saved results of notebooks 00-04 (point JSONs and
# `summary.csv` under the run folder) to choose; it never restarts an engine to choose. It starts
# from vLLM's defaults (plus the profile's platform settings, such as the KV size the CPU backend
# needs) and changes a setting only when a sweep that varied that setting alone shows a value
# better than vLLM's default for the scenario's objective *beyond the noise* (the workbook's one
# rule, `tunebook.core.metrics.compare`: the min-max ranges over engine starts are apart, ranges
# that clean would come apart by chance at most 10% of the time, which takes three starts a side,
# and the gap is at least the 3% that matters), and the SLO must hold. Each setting's decision
# names its notebook, sweep and figure. The configuration is written as `serve.sh`, `serve.yaml`,
# `llm_kwargs.py` and `choice.json`, parsed back with the installed vLLM's own parser; the served
# deployment 04 ranked first as one `vllm serve` file per replica and `start.sh`. Then the engines:
# the chosen configuration, vLLM's default and the article's run side by side on the scenario's
# workload, repeats interleaved (A B C A B C), reported as ratios with spreads; and, served, the
# check: `vllm bench serve` at 04's capacity and at 1.25x it, and the sustained capacity on three
# held-out workloads (decode-heavy, prefill-heavy, log-normal lengths). Last, the claims ledger.
#
# **Expected outcome.** Few settings clear the bar: vLLM's defaults are already tuned for common
# cases and engine-to-engine noise is large, so "keep the default" should be the usual answer,
# with the reason recorded. The article's configuration should be no better than the defaults; it
# lowers `max_num_batched_tokens` (C8). vLLM's own client should find the SLO held at the capacity
# and broken at 1.25x; a deployment tuned on chat may lose on other traffic, and the start script
# then says for which. On the CPU profile (a tiny model, dummy weights, a shared two-core machine)
# the speed figures describe the harness rather than a GPU.

# %%
import os
from pathlib import Path

import pandas as pd
from IPython.display import Markdown, display

from tunebook.topics import assemble, capacity, presets, validation
from tunebook.topics.explorer import Explorer
from tunebook.workbench.notebook import record_verdicts, verdicts_text
from tunebook.workbench.profiles import NOTEBOOKS
from tunebook.workbench.workbook import Workbook, load_shape, platform_name

pd.set_option("display.width", 200, "display.max_columns", 30, "display.max_colwidth", 160)

# %% tags=["parameters"]
# fmt: off
run_dir: str = ""  # where results go; "": runs/interactive in this repository; the runner passes runs/<run-id>
model: str = "tiny-ernie"  # model folder or name under models/ (config.json; dummy weights when none)
engine_settings: dict = {"enforce_eager": True, "kv_cache_memory_bytes": 67108864, "max_model_len": 2048}  # vLLM EngineArgs for every engine here
engine_env: dict = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # environment of the engine processes
repeats: int = 2  # engine starts per configuration, interleaved A B A B
isolate: bool = False  # one child process per engine (a crash fails only its point)
scenario: str = "high_concurrency_chat"  # one of high_concurrency_chat, long_documents, low_latency, high_throughput
slo_ttft_ms: float = 2000.0  # SLO: p99 time to first token, ms (per request for goodput)
slo_tpot_ms: float = 200.0  # SLO: median time per output token, ms (per request for goodput)
slo_chunk_gap_ms: float = 0.0  # SLO of the chat scenarios: every gap between streamed chunks at most this, ms (0: not bounded)
validate: bool = True  # run the side-by-side validation (engines)
validate_saved_only: bool = False  # report the validation points already saved, start no engine (a run cut short)
validation_workload: dict = {}  # keys merged over the scenario's validation workload, e.g. {"num_requests": 16}
validation_mode: str = "offline"  # "offline" (LLM.generate, all at once), "online" (AsyncLLM, streamed) or "served" (vllm serve over HTTP)
validation_configs: list = ["chosen", "default", "article"]  # configurations validated side by side ("default" always)
server_env: dict = {}  # served validation: environment of every vllm serve process
client_workers: int = 1  # served validation: load-generator processes (also vllm bench serve's)
also_validate: dict = {}  # more scenarios, each validated side by side too: name -> overrides of its workload
check: bool = False  # served: check the deployment against the default (vllm bench serve at 04's capacity and 1.25x; held-out workloads)
check_repeats: int = 2  # check: deployment starts per configuration, interleaved, for the held-out searches (0: none)
held_out: dict = {}  # check: held-out workloads, name -> spec ({}: decode-heavy 128/512, prefill-heavy 2048/128, log-normal medians 512/128)
check_search: dict = {}  # check: the held-out capacity searches (tunebook.measure.served.SEARCH_DEFAULTS keys)
claim_model: str = "ernie-4.5-0.3b-pt"  # the article's model (its config.json), for the C13 arithmetic
card_sizes_gib: list = [8, 12, 16, 24, 48, 80, 141]  # device memory of cards for the C13 arithmetic, GiB
# fmt: on

# %%
# A parameter this notebook does not declare, a wrong type or an invalid value stops here (papermill
# itself only warns); from here on vLLM's log goes to <run_dir>/05_assemble_config/logs/engine.log.
import tunebook.workbench.notebook

run_dir = tunebook.workbench.notebook.begin(globals(), "05_assemble_config")

# %% [markdown]
# Derived values: the scenario, the SLO, the output folder, the platform (imports vLLM once, so
# that its start-up messages land here and not in later cells).

# %%
sc = validation.scenario_of(scenario, also_validate, validation_mode, validation_configs)
slo = validation.scenario_slo(sc, slo_ttft_ms, slo_tpot_ms, slo_chunk_gap_ms)
out_dir = Path(run_dir) / "05_assemble_config"
out_dir.mkdir(parents=True, exist_ok=True)
os.environ.update({k: str(v) for k, v in engine_env.items()})
platform = platform_name()
env_text = validation.environment_text(out_dir, validation_mode, sc, validate_saved_only)
print(validation.setup_text(sc, slo, env_text, model))
wb = Workbook(run_dir, "05_assemble_config", model, engine_settings, engine_env, isolate=isolate)

# %% [markdown]
# ## 1. The evidence on disk
#
# Every sweep the earlier notebooks saved in this run, what it varied and how many of its points
# succeeded. A sweep that varied one setting alone can decide that setting; one that changed
# several at once (the article's bundle in 00) is reported as a comparison; one that varied only
# the workload (prompt length in 03) is context.

# %%
sweeps = assemble.discover(run_dir)
display(assemble.inventory(sweeps))
print(validation.missing_text(run_dir, sweeps, NOTEBOOKS[:4]))

# %% [markdown]
# ## 2. The choice, setting by setting
#
# For each setting that a sweep varied alone: the scenario's metric per value (median over engine
# starts), the best value that meets the SLO, the gap to vLLM's default and to the runner-up, and
# the decision. Goodput is recomputed from the saved per-request timings under this notebook's
# SLO (a request counts when it is within every limit).

# %%
choice = assemble.choose(sweeps, sc.name, slo, engine_settings)
print(assemble.recommendation_text(choice))
display(assemble.decisions_table(choice))

# %% [markdown]
# The figure behind each decision (median bar, min-max whiskers over engine starts; grey: vLLM's
# default, green: the value kept or chosen).

# %%
for fig in validation.decision_figures(choice, sweeps, slo):
    print(fig) if isinstance(fig, str) else fig.show()

# %% [markdown]
# Sweeps that changed several settings at once cannot credit any single one; here is how each
# bundle compared with the plainest configuration of its sweep, on the scenario's metric.

# %%
bundles = validation.bundles_frame(choice)
display(bundles) if len(bundles) else print("no multi-setting comparisons in this run")

# %% [markdown]
# ## 3. The configuration, written
#
# `serve.sh` (`vllm serve <model> --flag value ...`, flags spelled as vLLM's CLI spells them),
# `serve.yaml` (`vllm serve --config serve.yaml`, keys are CLI option names), `llm_kwargs.py`
# (`LLM(**kwargs)`) and `choice.json` (settings and the evidence for each). The model path is the
# one measured (dummy weights when the folder has none): replace it with the real checkpoint.
#
# A YAML detail worth knowing: vLLM 0.32 silently drops `enable-prefix-caching: false` from a
# config file (it looks for `--no-enable-prefix-caching` on the top-level parser, which lacks it),
# so the default would win. The writer spells a false boolean as `no-enable-prefix-caching: true`.

# %%
kwargs, files = validation.write_choice(out_dir, choice, model, engine_env)
print(validation.files_text(files))

# %% [markdown]
# The structure of what was written (file names and keys; the values depend on the measurements)
# and, for a fixed synthetic configuration, the command and YAML the writers produce.

# %%
# NBVAL_CHECK_OUTPUT
print(validation.structure_text(files))

# %% [markdown]
# Both forms, parsed by the installed vLLM's own `vllm serve` parser, must mean the settings of
# `llm_kwargs.py` (a misspelt flag or a dropped boolean fails here, not at deployment).

# %%
display(validation.parsed_frame(files, kwargs))
print("serve.sh, serve.yaml and llm_kwargs.py agree under vLLM's parser: True")

# %% [markdown]
# ### Served as users are served: the deployment for chat traffic
#
# Notebook 04 measured configurations through `vllm serve` (replicas behind vllm-router,
# `stream_interval`, ...) by their sustained capacity under the SLO. The best one is taken only if
# it beats vLLM's default beyond the noise; then `deployment/` holds one `vllm serve --config` file
# per replica (its KV share) and `start.sh`, which starts them all behind vllm-router and stops them
# together (`python -m tunebook.serve <out_dir>/deployment --check` runs it and asks through the
# router).

# %%
served_choice = capacity.choose_deployment(run_dir)
served_changed = bool(served_choice) and served_choice["status"] == "changed"
if served_choice is None:
    print("no capacity evidence in this run (04 did not run): the files above are the deployment")
else:
    display(pd.DataFrame(served_choice["ranking"]).round(3))
    print(f"{served_choice['status']}: {served_choice['reason']}")
if served_changed:
    deploy_files = validation.write_served(out_dir, choice, served_choice, model, engine_env)
    print(validation.files_text(deploy_files, ["start.sh"]))

# %% [markdown]
# ## 4. Validation: chosen vs default vs the article, side by side
#
# Three configurations on the scenario's workload, one engine start per point, repeats
# interleaved. The article's configuration is the one the installed vLLM can run: its nonexistent
# settings dropped (C9) and, on CPU, block size 32 for 16. When nothing was changed, "chosen"
# equals "default" and the pair measures the noise itself.
#
# With `validation_mode="served"` the configurations are served as users are served (`vllm
# serve`, streamed over HTTP), and "chosen" is the deployment written above (its replicas behind
# vllm-router included). One deployment start per configuration and repeat serves every
# scenario's workload in turn, so the scenarios below cost no further starts.

# %%
article, article_notes = assemble.article_settings(platform)
print("\n - ".join([f"article's configuration as run: {article}", *article_notes]))
workload = {**sc.workload, **validation_workload}
run = dict(
    out_dir=out_dir,
    validate=validate,
    saved_only=validate_saved_only,
    repeats=repeats,
    mode=validation_mode,
    slo=slo,
    warmup_requests=2,
)
check_plan, served_val, plan = None, None, None
if (
    check and served_choice is not None
):  # section 5's check: on the validation's starts where it can
    names = ["chosen", "default"] if served_changed else ["default"]  # else chosen is the default
    check_configs = capacity.validation_configs(
        choice, served_choice, article, names, client_workers
    )
    check_plan = validation.check_plan(
        run_dir,
        served_choice,
        check_configs,
        held_out or capacity.HELD_OUT,
        check_search,
        check_repeats,
    )
if validation_mode == "served":
    plan = validation.served_plan(
        choice,
        served_choice,
        article,
        validation_configs,
        client_workers,
        sc,
        workload,
        also_validate,
        check_plan,
    )
    sweep_name = f"validate-served-{assemble.config_hash([plan['configs'], plan['workloads'], slo, engine_settings, server_env])}"
    served_val, ran = validation.run_validation(
        wb.sweep,
        sweep_name,
        plan["configs"],
        None,
        plan["workloads"],
        point_overrides=plan["point_overrides"],
        workload_repeats=plan["workload_repeats"],
        env=dict(server_env),
        **run,
    )
    val = served_val[served_val["workload"] == sc.name] if len(served_val) else served_val
else:
    configs = {
        "chosen": {"settings": dict(choice["changed"])},
        "default": {},
        "article": {"settings": article},
    }
    configs = {k: v for k, v in configs.items() if k in validation_configs or k == "default"}
    sweep_name = f"validate-{sc.name}-{assemble.config_hash([configs, workload, validation_mode, slo, engine_settings])}"
    val, ran = validation.run_validation(wb.sweep, sweep_name, configs, workload, **run)
print("workload:", workload, "\nsweep:", sweep_name, "\n" + ran)
display(validation.failed_frame(val))

# %% [markdown]
# Medians, min-max over engine starts, and each configuration's ratio to vLLM's default; "within
# noise" is the workbook's one rule (`metrics.compare`): the gap is not evidence.

# %%
table, fig, aa = validation.validation_view(
    val, sc, choice, served_val is not None and served_changed
)
display(table.round(3))
fig.show() if fig is not None else print("no validation results")
print(aa)

# %% [markdown]
# ### The other scenarios
#
# Each scenario in `also_validate` gets its own choice from the same sweeps and the same
# side-by-side validation on its own workload (the scenario's, with the overrides given). Where its
# choice is vLLM's default, "chosen" is not run again: the A/A pair above already measures the
# noise.

# %%
others, figs, lines = validation.other_scenarios(
    wb.sweep,
    also_validate,
    sweeps,
    engine_settings,
    article,
    validation_configs,
    served_val,
    **run,
)
print("\n".join(lines))
for f in figs:
    f.show()
if others:
    display(pd.concat(others, ignore_index=True).round(3))

# %% [markdown]
# ## 5. Does the deployment hold it? vLLM's own client, and traffic it was not chosen on
#
# The deployment was chosen on 04's chat workload by tunebook's own client. Here it and vLLM's
# default are driven by vLLM's own `vllm bench serve` (its random dataset with 04's lengths,
# Poisson arrivals, `--goodput` with the SLO) at the sustained capacity 04 found for each and at
# 1.25x it: the SLO should hold at the first and break at the second. Then each is searched for its
# sustained capacity on held-out workloads: decode-heavy (128 prompt / 512 output tokens),
# prefill-heavy (2,048 / 128) and a seeded log-normal of lengths (medians 512 and 128). Where the
# deployment sustains less than the default beyond the noise, or measured worse on another
# scenario above, `start.sh` says for which traffic it should not be used.

# %%
bench, held, avoid = pd.DataFrame(), pd.DataFrame(), []
if check_plan is not None:
    own = validation.check_needs_its_own(plan, check_plan)
    check_name = (
        validation.run_check(wb.sweep, check_plan, slo, server_env, run_dir) if own else sweep_name
    )
    points = wb.results(check_name)
    names_04 = {"chosen": served_choice["config"]}  # the check's names, as 04 called them
    bench = capacity.bench_table(points, check_plan["run_04"], names_04)
    held = capacity.check_table(points)
    display(bench.round(3))
    print(capacity.bench_verdict(bench))
    display(held.round(3))
    scenario_tables = {
        t["scenario"].iloc[0]: (
            t.drop(columns="scenario"),
            presets.objective_metric(t["scenario"].iloc[0], t),
        )
        for t in others
    }
    avoid = capacity.not_for(held, scenario_tables)
    if served_changed:  # the deployment's header: what checked it, and the traffic it loses on
        validation.write_served(
            out_dir,
            choice,
            served_choice,
            model,
            engine_env,
            checked=capacity.bench_verdict(bench).splitlines(),
            not_for=avoid,
        )
    print(
        f"check: {check_name}; not for:",
        "; ".join(avoid) or "nothing measured worse than the default",
    )
else:
    print("check skipped: it needs check=True and 04's capacity evidence")

# %% [markdown]
# ## 6. Claims
#
# C11 (scenario presets) and C13 (presets by card memory) are judged here. For C13 the split of
# a card's memory follows from the model's arithmetic: weights, then KV at 18,432 B per token for
# ERNIE-4.5-0.3B in bf16. The table is an upper bound (activations and graphs also take memory;
# the engine reports its own KV size at start).

# %%
claim_shape = load_shape(claim_model)
cards = presets.card_table(claim_shape, card_sizes_gib)
display(cards)

# %%
v_c11 = presets.c11_verdict(
    choice,
    table,
    others,
    evidence=f"05_assemble_config/{sweep_name}; choice.json",
    repeats=repeats,
    had_sweeps=bool(sweeps),
    deployment=served_choice if served_val is not None else None,
)
print(verdicts_text([v_c11]))

# %%
# NBVAL_CHECK_OUTPUT
v_c13 = presets.c13_verdict(cards, claim_model, claim_shape, platform)
print(verdicts_text([v_c13]))

# %%
display(record_verdicts(run_dir, "05_assemble_config", [v_c11, v_c13], ledger=True))

# %% [markdown]
# ## 7. Explorer
#
# Change the scenario, the SLO, the sweep and metric to plot, and the configurations to compare:
# the recommendation and the figure are recomputed from the saved results (no engine starts).
# What this notebook printed above comes from its parameters, not from these controls.

# %%
explorer = Explorer(
    run_dir,
    scenario=sc.name,
    slo_ttft_ms=slo_ttft_ms,
    slo_tpot_ms=slo_tpot_ms,
    base_settings=engine_settings,
    model=model,
    sweeps=sweeps,
    extra_sweeps=validation.extra_sweeps(out_dir, sweep_name, validation_mode),
)
display(explorer.widget)

# %% [markdown]
# ## Summary

# %%
display(
    Markdown(
        presets.summary_markdown(
            sc,
            slo,
            choice,
            served_choice,
            table,
            files,
            served_val is not None,
            avoid if check else [],
        )
    )
)

# %%
# vLLM's log in a few lines (the file holds all of it), and this notebook's GPU time.
tunebook.workbench.notebook.end(run_dir, "05_assemble_config")
