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
# article's configuration, when they run side by side?
#
# **Method.** This notebook reads only the saved results of notebooks 00-03 (point JSONs and
# `summary.csv` under the run folder); it never restarts an engine to choose. It starts from
# vLLM's defaults (plus the profile's platform settings, such as the KV size the CPU backend needs)
# and changes a setting only when a sweep that varied that setting alone shows a value better than
# vLLM's default for the scenario's objective *beyond the noise* (the workbook's one rule,
# `tunebook.core.metrics.compare`: the min-max ranges over engine starts are apart, and ranges that
# clean would come apart by chance at most 10% of the time, which takes three starts a side), and
# the SLO (p99 TTFT, median TPOT) must hold. Each setting's decision names
# its notebook, sweep and figure, and whether the runner-up is within noise. The configuration is
# written as `serve.sh`, `serve.yaml` (for `vllm serve --config`), `llm_kwargs.py` and
# `choice.json`, and both command forms are parsed with the installed vLLM's own argument parser. Then the only engine use here:
# the chosen configuration, vLLM's default and the article's configuration run side by side on the
# scenario's workload, repeats interleaved (A B C A B C), reported as ratios with spreads.
# Last, the claims ledger of the whole run.
#
# **Expected outcome.** Few settings clear the bar. vLLM's defaults are already tuned for common
# cases (prefix caching on, chunked prefill, a large token budget per step), and engine-to-engine
# noise is large, so "keep the default" should be the usual answer, with the reason recorded. The
# article's configuration should be no better than the defaults; it lowers
# `max_num_batched_tokens` (C8). On the CPU profile (a tiny model, dummy weights, a shared
# two-core machine) the speed figures describe the harness rather than a GPU.

# %%
import json
import os
import time
from pathlib import Path

import pandas as pd
from IPython.display import Markdown, display

import tunebook.core.claims as claims
import tunebook.core.results
import tunebook.topics.assemble as assemble
import tunebook.topics.presets as presets
from tunebook.core.model import load_shape
from tunebook.deploy import writers
from tunebook.engine import adapter, flags
from tunebook.topics import capacity
from tunebook.topics.explorer import Explorer, decision_figure, ratio_bars
from tunebook.workbench.profiles import NOTEBOOKS
from tunebook.workbench.workbook import Workbook, platform_name, vllm_version

pd.set_option("display.width", 200)
pd.set_option("display.max_columns", 30)
pd.set_option("display.max_colwidth", 160)

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
validate: bool = True  # run the side-by-side validation (the only engine use in this notebook)
validate_saved_only: bool = False  # report the validation points already saved, start no engine (a run cut short)
validation_workload: dict = {}  # keys merged over the scenario's validation workload, e.g. {"num_requests": 16}
validation_mode: str = "offline"  # "offline" (LLM.generate, all at once), "online" (AsyncLLM, streamed) or "served" (vllm serve over HTTP)
validation_configs: list = ["chosen", "default", "article"]  # configurations validated side by side ("default" always)
server_env: dict = {}  # served validation: environment of every vllm serve process
client_workers: int = 1  # served validation: load-generator processes
also_validate: dict = {}  # more scenarios, each validated side by side too: name -> overrides of its workload
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
if scenario not in assemble.SCENARIOS:
    raise ValueError(
        f"scenario {scenario!r} unknown; choose one of {', '.join(assemble.SCENARIOS)}"
    )
sc = assemble.SCENARIOS[scenario]
unknown = sorted(set(also_validate) - set(assemble.SCENARIOS))
if unknown:
    raise ValueError(
        f"also_validate: scenario(s) {unknown} unknown; choose from {', '.join(assemble.SCENARIOS)}"
    )
if validation_mode not in ("offline", "online", "served"):
    raise ValueError(
        f"validation_mode must be 'offline', 'online' or 'served', got {validation_mode!r}"
    )
bad_configs = sorted(set(validation_configs) - {"chosen", "default", "article"})
if bad_configs:
    raise ValueError(
        f"validation_configs: {bad_configs} unknown; choose from chosen, default, article"
    )
slo = {"ttft_ms": float(slo_ttft_ms), "tpot_ms": float(slo_tpot_ms)}
out_dir = Path(run_dir) / "05_assemble_config"
out_dir.mkdir(parents=True, exist_ok=True)
os.environ.update({k: str(v) for k, v in engine_env.items()})
platform, vllm_text = platform_name(), vllm_version()
if validate_saved_only:  # report the device and vLLM that made the saved points, not this one's
    kind = "served" if validation_mode == "served" else sc.name
    saved = sorted(out_dir.glob(f"validate-{kind}-*/*.json"))
    if saved:
        saved_env = json.loads(saved[0].read_text())["env"]
        platform, vllm_text = (
            saved_env["platform"],
            f"{saved_env['vllm_version']} (saved points)",
        )
print(f"scenario: {sc.name} ({sc.title})")
print(f"objective: {sc.describe()}")
print(f"SLO: p99 TTFT <= {slo_ttft_ms:g} ms, median TPOT <= {slo_tpot_ms:g} ms")
print(f"platform: {platform}, vLLM {vllm_text}, model {model}")

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
for nb in NOTEBOOKS[:4]:
    if not (Path(run_dir) / nb).is_dir():
        print(f"no results of {nb} in this run")
if not sweeps:
    print("no saved sweeps in this run: every setting stays at vLLM's default")

# %% [markdown]
# ## 2. The choice, setting by setting
#
# For each setting that a sweep varied alone: the scenario's metric per value (median over engine
# starts), the best value that meets the SLO, the gap to vLLM's default and to the runner-up, and
# the decision. Goodput is recomputed from the saved per-request timings under this notebook's
# SLO (a request counts when its TTFT and TPOT are both within the limits).

# %%
choice = assemble.choose(sweeps, sc.name, slo, engine_settings)
print(assemble.recommendation_text(choice))
display(assemble.decisions_table(choice))

# %% [markdown]
# The figure behind each decision (median bar, min-max whiskers over engine starts; grey: vLLM's
# default, green: the value kept or chosen).

# %%
for i, d in enumerate(choice["decisions"], 1):
    fig = decision_figure(d, assemble.evidence_sweep(sweeps, d), slo)
    if fig is None:
        print(f"{d['setting']}: {d['status']} ({d['reason']})")
        continue
    fig.update_layout(title=f"Figure 5.{i}. {d['figure']} ({d['status']})")
    d["figure"] = f"Figure 5.{i} of 05_assemble_config: {d['figure']}"
    fig.show()

# %% [markdown]
# Sweeps that changed several settings at once cannot credit any single one; here is how each
# bundle compared with the plainest configuration of its sweep, on the scenario's metric.

# %%
bundles = pd.DataFrame(choice["bundles"])
if len(bundles):
    bundles["settings"] = bundles["settings"].map(
        lambda s: ", ".join(f"{k}={v}" for k, v in s.items())
    )
    display(bundles)
else:
    print("no multi-setting comparisons in this run")

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
kwargs = flags.deploy_kwargs(model, choice["settings"])
files = writers.write_config(out_dir, choice, kwargs, env=engine_env, served_model_name=model)
for name in ("serve.sh", "serve.yaml"):
    print(f"----- {files[name]}")
    print(files[name].read_text())

# %% [markdown]
# The structure of what was written (file names and keys; the values depend on the measurements)
# and, for a fixed synthetic configuration, the command and YAML the writers produce.

# %%
# NBVAL_CHECK_OUTPUT
print(json.dumps(assemble.structure(files), indent=1))
demo = {
    "model": "tiny-ernie",
    "block_size": 64,
    "enable_prefix_caching": False,
    "enforce_eager": True,
    "max_num_seqs": 128,
    "compilation_config": {"mode": 0},
}
print(flags.serve_command(demo, served_model_name="tiny-ernie"))
print(flags.yaml_config(demo, served_model_name="tiny-ernie"))

# %% [markdown]
# Both forms, parsed by the installed vLLM's own `vllm serve` parser, must mean the settings of
# `llm_kwargs.py` (a misspelt flag or a dropped boolean fails here, not at deployment).

# %%
ns_sh = adapter.parse_serve_args(flags.serve_sh_args(files["serve.sh"]))
ns_yaml = adapter.parse_serve_args(["--config", str(files["serve.yaml"])])
rows = []
for k, v in kwargs.items():
    if isinstance(v, dict | list):
        continue  # JSON-valued settings parse into config objects; compared by vLLM at start
    rows.append(
        {"setting": k, "llm_kwargs": v, "serve.sh": ns_sh.get(k), "serve.yaml": ns_yaml.get(k)}
    )
parsed = pd.DataFrame(rows)
display(parsed)
mismatch = parsed[
    (parsed["serve.sh"] != parsed["llm_kwargs"]) | (parsed["serve.yaml"] != parsed["llm_kwargs"])
]
assert mismatch.empty, f"serve files do not mean the chosen settings:\n{mismatch}"
print("serve.sh, serve.yaml and llm_kwargs.py agree under vLLM's parser:", mismatch.empty)

# %% [markdown]
# ### Served as users are served: the deployment for chat traffic
#
# Notebook 04 measured configurations through `vllm serve` (replicas behind vllm-router,
# `stream_interval`, ...) by their capacity under the SLO. The best one is taken only if it beats
# vLLM's default beyond the noise; then `deployment/` holds one `vllm serve --config` file per
# replica (its KV share) and `start.sh`, which starts them all behind vllm-router and stops them
# together (`python -m tunebook.serve <out_dir>/deployment --check` runs it and asks through the
# router).

# %%
served_choice = capacity.choose_deployment(run_dir)
if served_choice is None:
    print(
        "no capacity evidence in this run (notebook 04 did not run): the files above are the deployment"
    )
else:
    display(pd.DataFrame(served_choice["ranking"]).round(3))
    print(f"{served_choice['status']}: {served_choice['reason']}")
    if served_choice["status"] == "changed":
        served_kwargs = flags.deploy_kwargs(
            model, {**choice["settings"], **served_choice["settings"]}
        )
        deploy_files = writers.write_deployment(
            Path(out_dir) / "deployment",
            {**choice, "served_choice": {k: v for k, v in served_choice.items() if k != "ranking"}},
            served_kwargs,
            served_choice["replicas"],
            served_choice["serve"].get("router_policy") or "round_robin",
            env=engine_env,
            served_model_name=model,
        )
        print(f"----- {deploy_files['start.sh']}")
        print(deploy_files["start.sh"].read_text())

# %% [markdown]
# ## 4. Validation: chosen vs default vs the article, side by side
#
# The only engine use in this notebook. Three configurations on the scenario's workload, one
# engine start per point, repeats interleaved. The article's configuration is the one the
# installed vLLM can run: its nonexistent settings dropped (C9) and, on CPU, block size 32 for 16.
# When nothing was changed, "chosen" equals "default" and the pair measures the noise itself.
#
# With `validation_mode="served"` the configurations are served as users are served (`vllm
# serve`, streamed over HTTP), and "chosen" is the deployment written above (its replicas behind
# vllm-router included). One deployment start per configuration and repeat serves every
# scenario's workload in turn, so the scenarios below cost no further starts.

# %%
article, article_notes = assemble.article_settings(platform)
print("article's configuration as run:", article)
for n in article_notes:
    print(" -", n)
workload = {**sc.workload, **validation_workload}
configs = {
    "chosen": {"settings": dict(choice["changed"])},
    "default": {},
    "article": {"settings": article},
}
configs = {k: v for k, v in configs.items() if k in validation_configs or k == "default"}
sweep_name = f"validate-{sc.name}-{assemble.config_hash([configs, workload, validation_mode, slo, engine_settings])}"
print("workload:", workload)
if validation_mode != "served":
    print("sweep:", sweep_name)


# %%
def run_validation(
    name: str, configs: dict, workload: dict | None, workloads: dict | None = None
) -> pd.DataFrame:
    """One side-by-side sweep (or its saved points, with validate_saved_only)."""
    if not validate:
        print("validation skipped (validate=False)")
        return pd.DataFrame()
    if validate_saved_only:
        val = tunebook.core.results.load_sweep(out_dir / name)
        print(
            f"validation: {len(val)} saved points reported, no engine started (validate_saved_only)"
        )
        return val
    wb = Workbook(
        run_dir, "05_assemble_config", model, engine_settings, engine_env, isolate=isolate
    )
    t0 = time.perf_counter()
    served = {"env": dict(server_env)} if validation_mode == "served" else {}
    val = wb.sweep(
        name,
        configs,
        workload,
        repeats=repeats,
        workloads=workloads,
        mode=validation_mode,
        slo=slo,
        warmup_requests=2,
        **served,
    )
    print(f"validation: {len(val)} points in {time.perf_counter() - t0:.0f} s")
    failed = val[val["status"] != "ok"] if len(val) else val
    if len(failed):
        display(failed[["point_id", "error"]])
    return val


served_val = None
if validation_mode == "served":
    served_configs = capacity.validation_configs(
        choice, served_choice, article, validation_configs, client_workers
    )
    served_workloads = {sc.name: workload} | {
        name: {**assemble.SCENARIOS[name].workload, **overrides}
        for name, overrides in also_validate.items()
    }
    served_sweep = f"validate-served-{assemble.config_hash([served_configs, served_workloads, slo, engine_settings, server_env])}"
    print("served validation:", {k: v.get("serve") for k, v in served_configs.items()})
    print("sweep:", served_sweep, "- scenarios:", ", ".join(served_workloads))
    served_val = run_validation(served_sweep, served_configs, None, served_workloads)
    val = served_val[served_val["workload"] == sc.name] if len(served_val) else served_val
else:
    val = run_validation(sweep_name, configs, workload)

# %% [markdown]
# Medians, min-max over engine starts, and each configuration's ratio to vLLM's default; "within
# noise" is the workbook's one rule (`metrics.compare`): the gap is not evidence.

# %%
if len(val) and (val["status"] == "ok").any():
    validation = assemble.validation_table(val, reference="default")
    display(validation.round(3))
    fig = ratio_bars(
        validation,
        reference="default",
        title=f"Figure 5.V. {sc.name}: chosen and article relative to vLLM's default (median, min-max)",
    )
    fig.show()
    served_changed = bool(served_choice) and served_choice["status"] == "changed"
    if not choice["changed"] and not (served_val is not None and served_changed):
        print(presets.aa_check(validation))
else:
    validation = pd.DataFrame()
    print("no validation results")

# %% [markdown]
# ### The other scenarios
#
# Each scenario in `also_validate` gets its own choice from the same sweeps and the same
# side-by-side validation on its own workload (the scenario's, with the overrides given). Where its
# choice is vLLM's default, "chosen" is not run again: the A/A pair above already measures the
# noise.

# %%
others = []
for i, (name, overrides) in enumerate(also_validate.items(), 1):
    other_scenario = assemble.SCENARIOS[name]
    other_choice = assemble.choose(sweeps, name, slo, engine_settings)
    other_configs = {"default": {}, "article": {"settings": article}}
    other_configs = {
        k: v for k, v in other_configs.items() if k in validation_configs or k == "default"
    }
    if other_choice["changed"]:
        other_configs = {"chosen": {"settings": dict(other_choice["changed"])}, **other_configs}
    other_workload = {**other_scenario.workload, **overrides}
    other_sweep = f"validate-{name}-{assemble.config_hash([other_configs, other_workload, validation_mode, slo, engine_settings])}"
    print(
        f"{name} ({other_scenario.describe()}): chosen = {other_choice['changed'] or 'vLLM default'}"
        + (" (measured: the deployment above, served)" if served_val is not None else "")
    )
    shown = other_sweep if validation_mode != "served" else "the served validation above"
    print(f"  workload: {other_workload}; sweep: {shown}")
    if served_val is not None:  # measured above, on the same deployment starts
        other_points = served_val[served_val["workload"] == name] if len(served_val) else served_val
    else:
        other_points = run_validation(other_sweep, other_configs, other_workload)
    if not (len(other_points) and (other_points["status"] == "ok").any()):
        continue
    other_validation = assemble.validation_table(other_points, reference="default")
    other_validation.insert(0, "scenario", name)
    others.append(other_validation)
    ratio_bars(
        other_validation.drop(columns="scenario"),
        reference="default",
        title=f"Figure 5.V{i}. {name}: relative to vLLM's default (median, min-max)",
    ).show()
if others:
    display(pd.concat(others, ignore_index=True).round(3))
elif also_validate:
    print("no validation results for the other scenarios")
else:
    print("no other scenarios asked for (also_validate is empty)")


# %% [markdown]
# ## 5. Claims
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
    validation,
    others,
    evidence=f"05_assemble_config/{served_sweep if served_val is not None else sweep_name}; choice.json",
    repeats=repeats,
    had_sweeps=bool(sweeps),
    deployment=served_choice if served_val is not None else None,
)
print(claims.describe(v_c11))

# %%
# NBVAL_CHECK_OUTPUT
v_c13 = presets.c13_verdict(cards, claim_model, claim_shape, platform)
print(claims.describe(v_c13))

# %%
verdicts = [v_c11, v_c13]
claims.write(run_dir, "05_assemble_config", verdicts)
ledger = claims.read_all(run_dir)
display(claims.table(ledger))

# %% [markdown]
# ## 6. Explorer
#
# Change the scenario, the SLO, the sweep and metric to plot, and the configurations to compare:
# the recommendation and the figure are recomputed from the saved results (no engine starts).
# What this notebook printed above comes from its parameters, not from these controls.

# %%
extra = [
    s
    for s in [assemble.load_sweep_dir(out_dir / sweep_name, "05_assemble_config")]
    if s is not None
]
explorer = Explorer(
    run_dir,
    scenario=sc.name,
    slo_ttft_ms=slo_ttft_ms,
    slo_tpot_ms=slo_tpot_ms,
    base_settings=engine_settings,
    model=model,
    sweeps=sweeps,
    extra_sweeps=extra,
)
display(explorer.widget)

# %% [markdown]
# ## Summary

# %%
lines = [
    f"**Scenario** {sc.name}: {sc.describe()}; SLO p99 TTFT <= {slo_ttft_ms:g} ms, median TPOT <= {slo_tpot_ms:g} ms."
]
if choice["changed"]:
    lines.append(
        "**Changed from vLLM's defaults:** "
        + ", ".join(f"`{k}={v}`" for k, v in choice["changed"].items())
        + "."
    )
else:
    lines.append(
        "**Changed from vLLM's defaults:** nothing; no measured setting beat its default beyond the noise."
    )
for d in choice["decisions"]:
    lines.append(f"- `{d['setting']}`: {d['status']} ({d['notebook']}/{d['sweep']}). {d['reason']}")
lines += [f"- {m}." for m in choice["missing"]]
if served_choice is not None:
    lines.append(
        f"**Served deployment (04's capacity ranking):** {served_choice['status']}: {served_choice['reason']}."
    )
objective = presets.objective_metric(sc.name, validation)
deployed = served_choice if served_val is not None else None
lines.append(
    f"**Validation:** {presets.chosen_text(choice, validation, objective, deployed)};"
    f" {presets.article_text(validation, objective)}."
)
lines.append(
    f"**Files:** {', '.join(f'`{p}`' for p in files.values())}. Check it: `python -m tunebook.serve {files['serve.yaml']} --check`."
)
display(Markdown("\n".join(lines)))

# %%
# vLLM's log in a few lines (the file holds all of it), and this notebook's GPU time.
tunebook.workbench.notebook.end(run_dir, "05_assemble_config")
