"""Notebook 05's side of the engines: the chosen configuration run beside vLLM's default (and the
article's), and the check that the written deployment holds what 04 found.

The notebook hands its sweep function (``Workbook.sweep``) to the runners here: topics sit below
the workbench, so they decide what to run and read what came back, and the notebook owns the run
folder. ``run_validation`` runs (or, with ``saved_only``, re-reads) one side-by-side sweep;
``served_validation`` and ``inprocess_validation`` plan the scenario's; ``other_scenarios`` the
rest; ``sustained_check`` 05's check of the served deployment (``tunebook.topics.capacity``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from tunebook.core.metrics import slo_text
from tunebook.core.results import SweepDir, load_sweep
from tunebook.core.scenarios import SCENARIOS, Scenario
from tunebook.deploy import writers
from tunebook.engine import adapter, flags
from tunebook.topics import assemble, capacity, presets
from tunebook.topics.explorer import decision_figure, ratio_bars

VALIDATION_MODES = ("offline", "online", "served")
VALIDATION_CONFIGS = ("chosen", "default", "article")


# --------------------------------------------------------------------------- parameters
def scenario_of(
    scenario: str, also_validate: dict, validation_mode: str, validation_configs: list
) -> Scenario:
    """The scenario, after checking the parameters that name scenarios, modes and configurations."""
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario {scenario!r} unknown; choose one of {', '.join(SCENARIOS)}")
    unknown = sorted(set(also_validate) - set(SCENARIOS))
    if unknown:
        raise ValueError(
            f"also_validate: scenario(s) {unknown} unknown; choose from {', '.join(SCENARIOS)}"
        )
    if validation_mode not in VALIDATION_MODES:
        raise ValueError(
            f"validation_mode must be 'offline', 'online' or 'served', got {validation_mode!r}"
        )
    bad = sorted(set(validation_configs) - set(VALIDATION_CONFIGS))
    if bad:
        raise ValueError(f"validation_configs: {bad} unknown; choose from chosen, default, article")
    return SCENARIOS[scenario]


def scenario_slo(sc: Scenario, ttft_ms: float, tpot_ms: float, chunk_gap_ms: float = 0.0) -> dict:
    """The SLO a scenario is judged by: TTFT and TPOT, and for chat the gap between chunks."""
    slo = {"ttft_ms": float(ttft_ms), "tpot_ms": float(tpot_ms)}
    if chunk_gap_ms and sc.chat:
        slo["itl_ms"] = float(chunk_gap_ms)  # every gap between streamed chunks (metrics.SLO_KEYS)
    return slo


def environment_text(out_dir: Path, validation_mode: str, sc: Scenario, saved_only: bool) -> str:
    """'platform: ..., vLLM ...': this machine's, or the saved points' when only re-reading them."""
    platform, version = adapter.platform_name(), adapter.vllm_version()
    if saved_only:  # report the device and vLLM that made the saved points, not this one's
        kind = "served" if validation_mode == "served" else sc.name
        saved = sorted(out_dir.glob(f"validate-{kind}-*/*.json"))
        if saved:
            env = json.loads(saved[0].read_text())["env"]
            platform, version = env["platform"], f"{env['vllm_version']} (saved points)"
    return f"platform: {platform}, vLLM {version}"


def setup_text(sc: Scenario, slo: dict, env_text: str, model: str) -> str:
    return "\n".join(
        [
            f"scenario: {sc.name} ({sc.title})",
            f"objective: {sc.describe()}",
            f"SLO: {slo_text(slo)} (p99 TTFT and median TPOT in the choice's tables)",
            f"{env_text}, model {model}",
        ]
    )


# --------------------------------------------------------------------------- the choice, shown
def missing_text(run_dir: str | Path, sweeps: list, notebooks: list[str]) -> str:
    lines = [
        f"no results of {nb} in this run" for nb in notebooks if not (Path(run_dir) / nb).is_dir()
    ]
    if not sweeps:
        lines.append("no saved sweeps in this run: every setting stays at vLLM's default")
    return "\n".join(lines)


def decision_figures(choice: dict, sweeps: list, slo: dict) -> list:
    """The figure behind each decision (numbered 5.1, 5.2 ...), or its reason in words when no
    figure can be drawn. A decision's ``figure`` names its number afterwards (the report's)."""
    out = []
    for i, d in enumerate(choice["decisions"], 1):
        fig = decision_figure(d, assemble.evidence_sweep(sweeps, d), slo)
        if fig is None:
            out.append(f"{d['setting']}: {d['status']} ({d['reason']})")
            continue
        fig.update_layout(title=f"Figure 5.{i}. {d['figure']} ({d['status']})")
        d["figure"] = f"Figure 5.{i} of 05_assemble_config: {d['figure']}"
        out.append(fig)
    return out


def bundles_frame(choice: dict):
    """Multi-setting comparisons (a bundle cannot credit any single setting)."""
    import pandas as pd

    b = pd.DataFrame(choice["bundles"])
    if len(b):
        b["settings"] = b["settings"].map(lambda s: ", ".join(f"{k}={v}" for k, v in s.items()))
    return b


# --------------------------------------------------------------------------- the files
DEMO = {
    "model": "tiny-ernie",
    "block_size": 64,
    "enable_prefix_caching": False,
    "enforce_eager": True,
    "max_num_seqs": 128,
    "compilation_config": {"mode": 0},
}


def write_choice(out_dir: Path, choice: dict, model: str, env: dict) -> tuple[dict, dict]:
    """serve.sh, serve.yaml, llm_kwargs.py and choice.json: (the kwargs, their paths)."""
    kwargs = flags.deploy_kwargs(model, choice["settings"])
    return kwargs, writers.write_config(out_dir, choice, kwargs, env=env, served_model_name=model)


def files_text(files: dict, names=("serve.sh", "serve.yaml")) -> str:
    return "\n".join(f"----- {files[n]}\n{Path(files[n]).read_text()}" for n in names)


def structure_text(files: dict) -> str:
    """The structure of what was written (names and keys), and the writers' output for a fixed
    synthetic configuration: what nbval checks."""
    return "\n".join(
        [
            json.dumps(assemble.structure(files), indent=1),
            flags.serve_command(DEMO, served_model_name="tiny-ernie"),
            str(flags.yaml_config(DEMO, served_model_name="tiny-ernie")),
        ]
    )


def parsed_frame(files: dict, kwargs: dict):
    """Each setting as llm_kwargs.py, serve.sh and serve.yaml mean it under vLLM's own parser;
    raises AssertionError where a form means something else."""
    import pandas as pd

    ns_sh = adapter.parse_serve_args(flags.serve_sh_args(files["serve.sh"]))
    ns_yaml = adapter.parse_serve_args(["--config", str(files["serve.yaml"])])
    rows = [
        {"setting": k, "llm_kwargs": v, "serve.sh": ns_sh.get(k), "serve.yaml": ns_yaml.get(k)}
        for k, v in kwargs.items()
        # JSON-valued settings parse into config objects; vLLM compares them at start
        if not isinstance(v, dict | list)
    ]
    parsed = pd.DataFrame(rows)
    bad = parsed[
        (parsed["serve.sh"] != parsed["llm_kwargs"])
        | (parsed["serve.yaml"] != parsed["llm_kwargs"])
    ]
    assert bad.empty, f"serve files do not mean the chosen settings:\n{bad}"
    return parsed


def write_served(
    out_dir: Path, choice: dict, served_choice: dict, model: str, env: dict, **extra
) -> dict:
    """The N-replica deployment 04's capacity ranking chose, with its reason (and, after 05's
    check, ``extra``: what checked it and the traffic it should not be used for)."""
    kwargs = flags.deploy_kwargs(model, {**choice["settings"], **served_choice["settings"]})
    served = {k: v for k, v in served_choice.items() if k != "ranking"} | extra
    # The request shape the capacity was found on: `serve --check --overload` sends it again.
    evidence = served_choice.get("evidence")
    if evidence and "workload_spec" not in served:
        points = SweepDir(evidence).points() if Path(evidence).is_dir() else []
        served["workload_spec"] = capacity.workload_of(points) if points else None
    return writers.write_deployment(
        Path(out_dir) / "deployment",
        {**choice, "served_choice": served},
        kwargs,
        served_choice["replicas"],
        served_choice["serve"].get("router_policy") or "round_robin",
        env=env,
        served_model_name=model,
    )


# --------------------------------------------------------------------------- side by side
def run_validation(
    sweep: Callable,
    name: str,
    configs: dict,
    workload: dict | None,
    workloads: dict | None = None,
    *,
    out_dir: Path,
    validate: bool,
    saved_only: bool,
    **how,
):
    """One side-by-side sweep through the notebook's ``sweep`` (``Workbook.sweep``), or its saved
    points with ``saved_only``: (its frame, a line saying what ran)."""
    import pandas as pd

    if not validate:
        return pd.DataFrame(), "validation skipped (validate=False)"
    if saved_only:
        val = load_sweep(out_dir / name)
        return (
            val,
            f"validation: {len(val)} saved points reported, no engine started (validate_saved_only)",
        )
    t0 = time.perf_counter()
    val = sweep(name, configs, workload, workloads=workloads, **how)
    return val, f"validation: {len(val)} points in {time.perf_counter() - t0:.0f} s"


def failed_frame(val):
    return val[val["status"] != "ok"][["point_id", "error"]] if len(val) else val


def validation_view(val, sc: Scenario, choice: dict, served_changed: bool):
    """(the validation table, its ratio figure, the A/A line when chosen is the default itself)."""
    import pandas as pd

    if not (len(val) and (val["status"] == "ok").any()):
        return pd.DataFrame(), None, "no validation results"
    table = assemble.validation_table(val, reference="default")
    same = not choice["changed"] and not served_changed  # "chosen" is the default run again
    fig = ratio_bars(
        table,
        reference="default",
        labels={"chosen": "default, a second run (the noise floor)"} if same else None,
        title=f"Figure 5.V. {sc.name}: chosen and article relative to vLLM's default (median, min-max)",
    )
    aa = presets.aa_check(table) if not choice["changed"] and not served_changed else ""
    return table, fig, aa


def other_scenarios(
    sweep: Callable | None,
    also_validate: dict,
    sweeps: list,
    engine_settings: dict,
    article: dict,
    validation_configs: list,
    served_val,
    *,
    mode: str,
    slo: dict,
    **run,
) -> tuple[list, list, list[str]]:
    """Each scenario of ``also_validate``: its own choice and side-by-side validation (on the
    served validation's starts when served). (tables, figures, lines to print)."""
    tables, figs, lines = [], [], []
    for i, (name, overrides) in enumerate(also_validate.items(), 1):
        sc = SCENARIOS[name]
        ch = assemble.choose(sweeps, name, slo, engine_settings)
        configs = {"default": {}, "article": {"settings": article}}
        configs = {k: v for k, v in configs.items() if k in validation_configs or k == "default"}
        if ch["changed"]:
            configs = {"chosen": {"settings": dict(ch["changed"])}, **configs}
        wl = {**sc.workload, **overrides}
        sweep_name = (
            f"validate-{name}-{assemble.config_hash([configs, wl, mode, slo, engine_settings])}"
        )
        served = served_val is not None
        lines.append(
            f"{name} ({sc.describe()}): chosen = {ch['changed'] or 'vLLM default'}"
            + (" (measured: the deployment above, served)" if served else "")
        )
        lines.append(
            f"  workload: {wl}; sweep: {'the served validation above' if served else sweep_name}"
        )
        if served:  # measured above, on the same deployment starts
            pts = served_val[served_val["workload"] == name] if len(served_val) else served_val
        else:
            pts, _ = run_validation(sweep, sweep_name, configs, wl, mode=mode, slo=slo, **run)
        if not (len(pts) and (pts["status"] == "ok").any()):
            continue
        t = assemble.validation_table(pts, reference="default")
        figs.append(
            ratio_bars(
                t,
                reference="default",
                title=f"Figure 5.V{i}. {name}: relative to vLLM's default (median, min-max)",
            )
        )
        t.insert(0, "scenario", name)
        tables.append(t)
    if not tables:
        lines.append(
            "no validation results for the other scenarios"
            if also_validate
            else "no other scenarios asked for (also_validate is empty)"
        )
    return tables, figs, lines


# --------------------------------------------------------------------------- the check
def check_plan(
    run_dir: str | Path,
    served_choice: dict,
    configs: dict,
    held_out: dict,
    search: dict,
    repeats: int,
) -> dict:
    """05's check of the served deployment, as sweep arguments: vllm bench serve at 04's
    capacity and 1.25x it (one start per configuration), and the sustained capacity on held-out
    workloads (``repeats`` starts). ``configs``: "chosen" and "default" only (each needs 04's
    capacity). Returns ``configs`` (with each one's own rates and search starts), ``workloads``,
    ``point_overrides``, ``workload_repeats`` and ``run_04`` (04's points, to compare with). ``repeats`` 0: no held-out
    searches."""
    if repeats < 1:  # vLLM's client only: the held-out searches cost the most GPU time
        held_out = {}
    run_04 = capacity.capacity_points(run_dir)
    workload = capacity.workload_of(run_04)
    cfgs, workloads, overrides = capacity.check_plan(
        served_choice, configs, workload, held_out, search
    )
    overrides[capacity.BENCH] = {"search": dict(search)}  # its windows: the searches' durations
    reps = {
        capacity.BENCH: 1,
        **{w: repeats for w in held_out},
    }  # vLLM's client once a configuration
    return {
        "configs": cfgs,
        "workloads": workloads,
        "point_overrides": overrides,
        "workload_repeats": reps,
        "run_04": run_04,
    }


def served_plan(
    choice: dict,
    served_choice: dict | None,
    article: dict,
    validation_configs: list,
    client_workers: int,
    sc: Scenario,
    workload: dict,
    also_validate: dict,
    check: dict | None,
) -> dict:
    """The served validation's sweep, 05's check joined to it where it can share the starts
    (one start per configuration and repeat serves every workload: GPU time is the user's)."""
    configs = capacity.validation_configs(
        choice, served_choice, article, validation_configs, client_workers
    )
    workloads = {sc.name: workload} | {
        n: {**SCENARIOS[n].workload, **o} for n, o in also_validate.items()
    }
    plan = {
        "configs": configs,
        "workloads": workloads,
        "point_overrides": None,
        "workload_repeats": None,
    }
    if check and set(configs) <= set(check["configs"]):
        for name in configs:
            configs[name] = {
                **configs[name],
                "per_workload": check["configs"][name]["per_workload"],
            }
        plan.update(
            workloads=workloads | check["workloads"],
            point_overrides=check["point_overrides"],
            workload_repeats=check["workload_repeats"],
        )
    return plan


def check_needs_its_own(plan: dict, check: dict | None) -> bool:
    """Whether the check must run its own sweep (the validation was not served, or it validates a
    configuration the check cannot: the article's has no capacity from 04)."""
    return bool(check) and capacity.BENCH not in (plan or {}).get("workloads", {})


def run_check(
    sweep: Callable, check: dict, slo: dict, server_env: dict, run_dir: str | Path
) -> str:
    """The check's own served sweep; its name."""
    name = f"check-{assemble.config_hash([check['configs'], check['workloads'], check['point_overrides'], slo, server_env])}"
    sweep(
        name,
        check["configs"],
        None,
        repeats=max(check["workload_repeats"].values()),
        workloads=check["workloads"],
        point_overrides=check["point_overrides"],
        workload_repeats=check["workload_repeats"],
        mode="served",
        slo=slo,
        env=dict(server_env),
        warmup_requests=2,
    )
    return name


def extra_sweeps(out_dir: Path, sweep_name: str, validation_mode: str) -> list:
    """The in-process validation sweep, for the explorer (a served one is 04's kind of evidence)."""
    if validation_mode == "served":
        return []
    s = assemble.load_sweep_dir(Path(out_dir) / sweep_name, "05_assemble_config")
    return [s] if s is not None else []
