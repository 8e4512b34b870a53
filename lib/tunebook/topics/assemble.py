"""Assemble a serving configuration from saved sweep results, with the evidence for each setting.

Pure Python (pandas, no vllm): notebook 05 and its explorer call this on a run folder that
notebooks 00-03 filled; no engine starts here.

    sweeps = discover(run_dir)                          # every <notebook>/<sweep>/ of the run
    choice = choose(sweeps, "high_concurrency_chat", slo={"ttft_ms": 2000, "tpot_ms": 200},
                    base_settings=engine_settings)
    kwargs = deploy_kwargs(model, choice["settings"])
    write_config(out_dir, choice, kwargs, env=engine_env, served_model_name=model)

The rule: start from vLLM's defaults (plus the profile's platform settings, e.g. the KV size the
CPU backend needs) and change a setting only when a sweep that varied that setting alone shows a
configuration better than vLLM's default for the scenario's objective, beyond the noise of its
repeats (``metrics.compare``: the min-max ranges over engine starts are apart, and ranges that
clean would come apart by chance at most 10% of the time) and with the SLO met. Everything else
is kept at the default, and the reason is recorded.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from tunebook.core.metrics import compare, meets_slo, spread
from tunebook.core.results import IDENT, load_point, point_row
from tunebook.core.scenarios import SCENARIOS, Scenario  # noqa: F401 (assemble.SCENARIOS in 05)
from tunebook.deploy.writers import evidence_where, fmt_setting
from tunebook.topics.baseline import ARTICLE_AS_WRITTEN

# --------------------------------------------------------------------------- settings and the article


# Which measurements each setting needs, and where the workbook measures it (for "no evidence").
TOPICS: dict[str, str] = {
    "enable_prefix_caching": "prefix caching (C3, 01_kv_cache_sizing)",
    "block_size": "KV block size (C4, 02_block_size_sweep)",
    "max_num_batched_tokens": "tokens per scheduler step (C8, 03_prefill_scaling)",
    "max_num_seqs": "sequences per scheduler step (C8/C11)",
    "kv_cache_dtype": "fp8 KV cache (C5, 01_kv_cache_sizing)",
    "gpu_memory_utilization": "memory headroom (C12, 01_kv_cache_sizing)",
}

# Settings a speed ranking alone must not change: why, in words.
POLICY: dict[str, str] = {
    "kv_cache_dtype": "changes what the model computes (C5): adopt fp8 only after an accuracy check, not on speed",
    "gpu_memory_utilization": "is the deployment's memory budget (C12), not a speed knob: kept from the profile",
    "kv_cache_memory_bytes": "is the deployment's memory budget, not a speed knob: kept from the profile",
    "num_gpu_blocks_override": "is a test override of the KV size, not a deployment setting",
    "max_model_len": "follows the longest request the service must accept, not a speed ranking",
    "seed": "does not change speed",
    "load_format": "is how weights are loaded, not a tuning knob",
}

ARTICLE_DROPPED: dict[str, str] = {
    "max_paddings": "removed from vLLM (v0 scheduler only)",
    "scheduler_policy": "never a vLLM setting ('scheduling_policy' is fcfs or priority; there is no 'hybrid')",
}
# The article's configuration (one copy, in baseline.py) minus what vLLM never had (C9, C4).
ARTICLE_SETTINGS: dict = {k: v for k, v in ARTICLE_AS_WRITTEN.items() if k not in ARTICLE_DROPPED}


def article_settings(platform: str = "cuda") -> tuple[dict, list[str]]:
    """The source article's configuration as the installed vLLM can run it, and what was adapted."""
    s = dict(ARTICLE_SETTINGS)
    notes = [f"dropped {k}: {why}" for k, why in ARTICLE_DROPPED.items()]
    if platform == "cpu":
        s["block_size"] = 32
        notes.append("block_size 16 -> 32: the CPU attention backend accepts multiples of 32 only")
    return s, notes


# --------------------------------------------------------------------------- discovery

_NOTEBOOK_DIR = re.compile(r"^\d\d_[A-Za-z0-9_]+$")
MISSING = "(vLLM default)"
# Capacity figures the engine sized; every other capacity key (``cap_<key>``) is a value vLLM
# resolved for a setting.
CAPACITY_FIGURES = {
    "num_gpu_blocks",
    "kv_capacity_tokens",
    "engine_kv_tokens",
    "available_kv_gib",
    "model_load_gib",
}


@dataclass
class Sweep:
    """One sweep folder of a run, as data: its points, the settings each config used, what varied."""

    notebook: str
    name: str
    path: Path
    points: list[dict] = field(default_factory=list)  # point JSONs (empty when only summary.csv)
    rows: list[dict] = field(default_factory=list)  # one results.point_row per point
    settings: dict[str, dict] = field(default_factory=dict)  # config -> its settings
    workloads: dict[str, str] = field(default_factory=dict)  # config -> workload name/kind text
    part: str | None = None  # the workload this is the part of a sweep for (split_by_workload)

    @property
    def key(self) -> str:
        return f"{self.notebook}/{self.name}"

    @property
    def label(self) -> str:
        return self.key + (f" [{self.part}]" if self.part else "")

    def split_by_workload(self) -> list[Sweep]:
        """One part per workload, for sweeps that ran their settings on several workloads."""
        groups: dict[str, list[str]] = {}
        for cfg, w in self.workloads.items():
            groups.setdefault(w, []).append(cfg)
        parts = []
        for w, cfgs in groups.items():
            keep = set(cfgs)
            sub = Sweep(self.notebook, self.name, self.path, part=(w.split() or [""])[0])
            sub.points = [
                p for p in self.points if str(p.get("config") or p.get("point_id")) in keep
            ]
            sub.rows = [r for r in self.rows if str(r.get("config") or r.get("point_id")) in keep]
            sub.settings = {c: self.settings[c] for c in cfgs}
            sub.workloads = {c: self.workloads[c] for c in cfgs}
            parts.append(sub)
        return parts

    @property
    def configs(self) -> list[str]:
        return list(self.settings)

    @property
    def setting_names(self) -> set[str]:
        """Columns of the rows that are settings (vLLM's names), not measurements."""
        return {k for s in self.settings.values() for k in s}

    @property
    def varied(self) -> list[str]:
        """Settings whose value differs between this sweep's configurations (absent = vLLM's default)."""
        keys: list[str] = []
        for s in self.settings.values():
            keys += [k for k in s if k not in keys]
        out = []
        for k in keys:
            vals = {json.dumps(s.get(k, MISSING), sort_keys=True) for s in self.settings.values()}
            if len(vals) > 1:
                out.append(k)
        return out

    @property
    def workload_varies(self) -> bool:
        return len(set(self.workloads.values())) > 1

    @property
    def n_ok(self) -> int:
        return sum(1 for r in self.rows if r.get("status") == "ok")

    def metric_names(self) -> list[str]:
        names: list[str] = []
        skip = {*IDENT, *self.setting_names}
        for r in self.rows:
            for k, v in r.items():
                if k in names or k in skip:
                    continue
                if isinstance(v, int | float) and not isinstance(v, bool):
                    names.append(k)
        return names

    def frame(self, slo: dict | None = None):
        """A DataFrame, one row per point; ``goodput_rps`` recomputed under ``slo`` when requests are saved."""
        import pandas as pd

        rows = [dict(r) for r in self.rows]
        if slo and self.points:
            by_id = {p.get("point_id"): p for p in self.points}
            for r in rows:
                p = by_id.get(r["point_id"]) or {}
                g = goodput(p, slo)
                if g is not None:
                    r["goodput_rps"] = g
                    r["goodput_slo"] = "recomputed"
        return pd.DataFrame(rows)


def goodput(point: dict, slo: dict) -> float | None:
    """Requests per second that met ``slo`` (e.g. {"ttft_ms": 500, "tpot_ms": 50}), from saved requests."""
    reqs = point.get("requests")
    dur = (point.get("metrics") or {}).get("duration_s")
    if not reqs or not dur:
        return None
    return sum(1 for r in reqs if meets_slo(r, slo)) / dur


def _num(v):
    """CSV cells back to numbers and booleans where they look like them."""
    if not isinstance(v, str):
        return v
    if v == "":
        return None
    if v in ("True", "true"):
        return True
    if v in ("False", "false"):
        return False
    try:
        f = float(v)
    except ValueError:
        try:
            return json.loads(v)
        except (ValueError, TypeError):
            return v
    return int(f) if f.is_integer() and re.fullmatch(r"-?\d+", v) else f


def _workload_text(w) -> str:
    if isinstance(w, dict):
        words = [str(w.get(k)) for k in ("name", "kind") if w.get(k)]
        return " ".join(dict.fromkeys(words))
    return str(w or "")


def load_sweep_dir(path: Path, notebook: str | None = None) -> Sweep | None:
    """Read one sweep folder: point JSONs when present, else summary.csv. None when it holds neither."""
    path = Path(path)
    sw = Sweep(notebook or path.parent.name, path.name, path)
    for f in sorted(path.glob("*.json")):
        try:
            p = load_point(f)
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(p, dict) and "point_id" in p:
            sw.points.append(p)
    if sw.points:
        for p in sw.points:
            sw.rows.append(point_row(p))
            cfg = str(p.get("config") or p.get("point_id"))
            sw.settings.setdefault(cfg, dict(p.get("settings") or {}))
            sw.workloads.setdefault(cfg, _workload_text(p.get("workload")))
        return sw
    summary = path / "summary.csv"
    if not summary.is_file():
        return None
    with open(summary, newline="") as fh:
        reader = csv.DictReader(fh)
        cols = reader.fieldnames or []
        # point_row writes identity, then the settings, then "workload", then the rest.
        try:
            setting_cols = cols[cols.index("status") + 1 : cols.index("workload")]
        except ValueError:
            setting_cols = []
        for raw in reader:
            row = {k: _num(v) for k, v in raw.items()}
            settings = {k: row.pop(k) for k in setting_cols if k in row}
            settings = {k: v for k, v in settings.items() if v is not None}
            row.update(settings)
            row["repeat"] = row.get("repeat")
            sw.rows.append(row)
            cfg = str(row.get("config") or row.get("point_id"))
            sw.settings.setdefault(cfg, settings)
            sw.workloads.setdefault(cfg, str(row.get("workload") or ""))
    return sw if sw.rows else None


def discover(
    run_dir: str | Path, exclude: tuple[str, ...] = ("05_assemble_config",)
) -> list[Sweep]:
    """Every sweep of a run: ``<run_dir>/<NN_notebook>/<sweep>/`` with point JSONs or a summary.csv."""
    run_dir = Path(run_dir)
    found: list[Sweep] = []
    if not run_dir.is_dir():
        return found
    for nb in sorted(p for p in run_dir.iterdir() if p.is_dir() and _NOTEBOOK_DIR.match(p.name)):
        if nb.name in exclude:
            continue
        for sd in sorted(p for p in nb.iterdir() if p.is_dir() and not p.name.startswith(".")):
            sw = load_sweep_dir(sd, nb.name)
            if sw is not None:
                found.append(sw)
    return found


def inventory(sweeps: list[Sweep]):
    """One row per sweep: what it varied, on which workload, how many points succeeded."""
    import pandas as pd

    rows = []
    for s in sweeps:
        rows.append(
            {
                "notebook": s.notebook,
                "sweep": s.name,
                "varies": (", ".join(s.varied) or "-")
                + (" (on several workloads)" if s.workload_varies else ""),
                "configs": len(s.configs),
                "points ok": s.n_ok,
                "points failed": len(s.rows) - s.n_ok,
                "workload": ", ".join(sorted(set(s.workloads.values()))),
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "notebook",
            "sweep",
            "varies",
            "configs",
            "points ok",
            "points failed",
            "workload",
        ],
    )


def resolved_defaults(sweeps: list[Sweep]) -> dict:
    """What vLLM resolved each defaulted setting to, read from points that left the setting out."""
    seen: dict[str, dict] = {}
    for s in sweeps:
        for r in s.rows:
            if r.get("status") != "ok":
                continue
            given = s.settings.get(str(r.get("config") or r.get("point_id"))) or {}
            for k, v in r.items():
                if k.startswith("cap_") and v is not None:
                    name = k[len("cap_") :]
                    if name in CAPACITY_FIGURES or name in given:
                        continue  # sized by the engine, or set explicitly: not a default
                    key = json.dumps(v)
                    seen.setdefault(name, {})[key] = seen.get(name, {}).get(key, 0) + 1
    return {k: json.loads(max(c, key=c.get)) for k, c in seen.items()}


# --------------------------------------------------------------------------- choosing


def _vs(best: str, ratio: float, metric: str, verb: str = "measured") -> str:
    """'<best> measured 1.23x the default's <metric>' (in words when the default's median is 0)."""
    if ratio is None or (isinstance(ratio, float) and (math.isnan(ratio) or math.isinf(ratio))):
        return f"{best} was compared with a default whose median {metric} is 0 (no ratio)"
    return f"{best} {verb} {ratio:.3g}x the default's {metric}"


def _config_values(df, metric: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    if metric not in df:
        return out
    ok = df[df["status"] == "ok"] if "status" in df else df
    for cfg, g in ok.groupby("config", sort=False):
        vals = [
            float(v)
            for v in g[metric]
            if v is not None and not (isinstance(v, float) and math.isnan(v))
        ]
        if vals:
            out[str(cfg)] = vals
    return out


def _median(vals: list[float]) -> float:
    return statistics.median(vals) if vals else float("nan")


def _meets(df, cfg: str, slo: dict | None) -> tuple[bool, str]:
    """Whether a config's medians meet the SLO: p99 TTFT <= ttft_ms and median TPOT <= tpot_ms."""
    if not slo:
        return True, ""
    why = []
    for key, col in (("ttft_ms", "ttft_p99_ms"), ("tpot_ms", "tpot_p50_ms")):
        lim = slo.get(key)
        if lim is None or col not in df:
            continue
        vals = _config_values(df, col).get(cfg, [])
        if vals and _median(vals) > lim:
            why.append(f"{col} {_median(vals):.4g} > {lim:g}")
    return (not why), "; ".join(why)


def _slo_every_repeat(df, cfg: str, slo: dict | None) -> str:
    """'all' if every repeat of a config meets the SLO, 'none' if every repeat misses, else 'mixed'."""
    if not slo or "config" not in df:
        return "all"
    ok = (
        df[(df["config"] == cfg) & (df["status"] == "ok")]
        if "status" in df
        else df[df["config"] == cfg]
    )
    verdicts = []
    for _, r in ok.iterrows():
        miss = False
        for key, col in (("ttft_ms", "ttft_p99_ms"), ("tpot_ms", "tpot_p50_ms")):
            lim, v = slo.get(key), r.get(col)
            if (
                lim is not None
                and v is not None
                and not (isinstance(v, float) and math.isnan(v))
                and v > lim
            ):
                miss = True
        verdicts.append(miss)
    if not verdicts:
        return "mixed"
    return "none" if all(verdicts) else ("all" if not any(verdicts) else "mixed")


def _objective(df, scenario: Scenario) -> tuple[str, str] | None:
    for metric, direction in scenario.objectives:
        if _config_values(df, metric):
            return metric, direction
    return None


def _rank(vals: dict[str, list[float]], direction: str) -> list[str]:
    return sorted(vals, key=lambda c: _median(vals[c]), reverse=(direction == "max"))


def _match_score(sw: Sweep, scenario: Scenario) -> int:
    text = " ".join(sw.workloads.values()).lower() + " " + sw.name.lower()
    return sum(1 for h in scenario.workload_hints if h in text)


def _reference(sw: Sweep, setting: str, defaults: dict, base: dict) -> str | None:
    """The config that ran the setting at vLLM's default (or at the profile's base value)."""
    for cfg, s in sw.settings.items():
        if setting not in s:
            return cfg
    for cfg, s in sw.settings.items():
        if setting in defaults and s.get(setting) == defaults[setting]:
            return cfg
        if setting in base and s.get(setting) == base[setting]:
            return cfg
    return None


def _value_label(sw: Sweep, cfg: str, setting: str, defaults: dict) -> str:
    s = sw.settings.get(cfg, {})
    if setting in s:
        return fmt_setting(s[setting])
    return f"default ({fmt_setting(defaults[setting])})" if setting in defaults else MISSING


DECISION_KEYS = (
    "setting",
    "status",
    "changed",
    "value",
    "default",
    "reason",
    "notebook",
    "sweep",
    "path",
    "workload",
    "metric",
    "direction",
    "figure",
    "goodput_slo",
    "ranking",
    "best",
    "runner_up",
    "gap_to_runner_up",
    "reference",
    "vs_default",
    "also_in",
    "measured_best",
    "part",
    "per_workload",
)


def decide_setting(
    sw: Sweep,
    setting: str,
    scenario: Scenario,
    slo: dict | None,
    defaults: dict,
    base: dict,
) -> dict:
    """The decision for one setting from one sweep that varied it alone."""
    use = slo if scenario.use_slo else None
    df = sw.frame(use)
    d = _decision_of(sw, setting, defaults, base)
    obj = _objective(df, scenario)
    if obj is None:
        d.update(
            status="no data",
            reason=f"no successful points with {[m for m, _ in scenario.objectives]}",
        )
        return d
    metric, direction = obj
    vals = _config_values(df, metric)
    d.update(
        metric=metric,
        direction=direction,
        figure=f"{sw.label}: {metric} by {setting}",
        goodput_slo="recomputed under this SLO"
        if metric == "goodput_rps" and "goodput_slo" in df
        else None,
    )
    best, note = _rank_for_decision(d, sw, setting, df, vals, direction, use, defaults)
    ref = _reference(sw, setting, defaults, base)
    d["reference"] = ref
    best_value = sw.settings[best].get(setting, defaults.get(setting))
    if ref is None:
        d.update(
            status="kept: no default point",
            reason=note
            + (
                f"the sweep has no point at vLLM's default {setting}, so it cannot show that"
                f" changing it helps (best measured: {_value_label(sw, best, setting, defaults)})"
            ),
        )
        return d
    if ref not in vals:
        d.update(
            status="kept: default failed",
            reason=note + f"the default point ({ref}) has no successful runs",
        )
        return d
    if best == ref or (
        setting in sw.settings[best] and defaults.get(setting) == best_value and setting not in base
    ):
        d.update(
            status="kept: default is best", reason=note + f"vLLM's default ranks first on {metric}"
        )
        return d
    return _judge_best_vs_default(d, df, vals, ref, best, best_value, metric, note, use)


def _decision_of(sw: Sweep, setting: str, defaults: dict, base: dict) -> dict:
    """A decision's first fields: where its evidence is and the setting's default; not changed yet."""
    return {
        "setting": setting,
        "notebook": sw.notebook,
        "sweep": sw.name,
        "path": str(sw.path),
        "part": sw.part,
        "workload": ", ".join(sorted(set(sw.workloads.values()))),
        "changed": False,
        "value": None,
        "default": defaults.get(setting, base.get(setting)),
    }


def _rank_for_decision(
    d: dict,
    sw: Sweep,
    setting: str,
    df,
    vals: dict[str, list[float]],
    direction: str,
    slo: dict | None,
    defaults: dict,
) -> tuple[str, str]:
    """Rank the sweep's configs into ``d`` (ranking, best, runner-up and the gap between them).

    Returns (best config, note): the best of those that meet the SLO, or of all of them, with a
    note saying so, when none does.
    """
    d["ranking"] = [
        {
            "config": c,
            "value": _value_label(sw, c, setting, defaults),
            **{k: v for k, v in spread(vals[c]).items()},
            "meets_slo": _meets(df, c, slo)[0],
        }
        for c in _rank(vals, direction)
    ]
    eligible = [c for c in _rank(vals, direction) if _meets(df, c, slo)[0]]
    note = ""
    if not eligible:
        eligible = _rank(vals, direction)
        note = "no configuration meets the SLO; ranked without it. "
    best = eligible[0]
    runner = eligible[1] if len(eligible) > 1 else None
    d["best"] = best
    d["runner_up"] = runner
    if runner:
        c = compare(vals[runner], vals[best])
        d["gap_to_runner_up"] = {
            "ratio": c["ratio"],
            "within_noise": c["within_noise"],
        }
    return best, note


def _judge_best_vs_default(
    d: dict,
    df,
    vals: dict[str, list[float]],
    ref: str,
    best: str,
    best_value,
    metric: str,
    note: str,
    slo: dict | None,
) -> dict:
    """Change the setting to the best config's value only if it beats the default's point: beyond
    the noise of their repeats, or by meeting an SLO that the default misses in every repeat."""
    c = compare(vals[ref], vals[best])
    d["vs_default"] = {
        "ratio": c["ratio"],
        "within_noise": c["within_noise"],
        "p_chance": c["p_chance"],
        "n_default": c["a"]["n"],
        "n_best": c["b"]["n"],
    }
    ref_why = _meets(df, ref, slo)[1]
    if min(c["a"]["n"], c["b"]["n"]) < 2:
        d.update(
            status="kept: too few repeats",
            reason=note
            + (
                f"{_vs(best, c['ratio'], metric)}, but with fewer than two"
                " engine starts per configuration the gap cannot be told from noise"
            ),
        )
        return d
    if (
        slo
        and _slo_every_repeat(df, ref, slo) == "none"
        and _slo_every_repeat(df, best, slo) == "all"
    ):
        # An SLO gap counts only when it holds in every repeat of both (not just in the medians).
        d.update(
            status="changed",
            changed=True,
            value=best_value,
            reason=(
                f"the default misses the SLO in every repeat ({ref_why}); {best} meets it in every repeat"
            ),
        )
        return d
    if c["within_noise"]:
        d.update(
            status="kept: within noise",
            reason=note + f"{_vs(best, c['ratio'], metric)}, {c['noise']} (metrics.compare)",
        )
        return d
    d.update(
        status="changed",
        changed=True,
        value=best_value,
        reason=note + f"{_vs(best, c['ratio'], metric, 'gives')}, {c['noise']} (metrics.compare)",
    )
    return d


def compare_bundle(sw: Sweep, scenario: Scenario, slo: dict | None) -> list[dict]:
    """Sweeps that change several settings at once (e.g. default vs the article): each vs the plainest."""
    df = sw.frame(slo if scenario.use_slo else None)
    obj = _objective(df, scenario)
    if obj is None:
        return []
    metric, direction = obj
    vals = _config_values(df, metric)
    ref = min(sw.settings, key=lambda c: (len(sw.settings[c]), c != "default"))
    out = []
    for cfg in sw.settings:
        if cfg == ref or cfg not in vals or ref not in vals:
            continue
        c = compare(vals[ref], vals[cfg])
        extra = {k: v for k, v in sw.settings[cfg].items() if sw.settings[ref].get(k, MISSING) != v}
        out.append(
            {
                "notebook": sw.notebook,
                "sweep": sw.name,
                "part": sw.part,
                "config": cfg,
                "reference": ref,
                "settings": extra,
                "metric": metric,
                "ratio": c["ratio"],
                "within_noise": c["within_noise"],
                "n": min(c["a"]["n"], c["b"]["n"]),
            }
        )
    return out


def choose(
    sweeps: list[Sweep],
    scenario: str | Scenario,
    slo: dict | None = None,
    base_settings: dict | None = None,
    defaults: dict | None = None,
) -> dict:
    """The configuration for a scenario, with a decision (and its evidence) for every measured setting.

    ``slo``: {"ttft_ms": p99 TTFT limit, "tpot_ms": median TPOT limit}. ``base_settings``: the
    profile's platform settings, kept as they are. ``defaults``: what vLLM resolves defaulted
    settings to (read from the points' capacity when not given).
    """
    if isinstance(scenario, str) and scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; choose one of {', '.join(SCENARIOS)}")
    sc = SCENARIOS[scenario] if isinstance(scenario, str) else scenario
    base = dict(base_settings or {})
    dflt = {**resolved_defaults(sweeps), **(defaults or {})}
    slo = {k: float(v) for k, v in (slo or {}).items() if v is not None}

    single, bundles, context = _sort_sweeps(sweeps, sc, slo)
    decisions = [
        _decide_from_sweeps(setting, single[setting], sc, slo, dflt, base)
        for setting in sorted(single)
    ]
    changed = {d["setting"]: d["value"] for d in decisions if d["changed"]}
    settings = {**base, **changed}
    failed = [s.key for s in sweeps if s.n_ok == 0]
    return {
        "scenario": sc.name,
        "scenario_title": sc.title,
        "objective": sc.describe(),
        "slo": slo if sc.use_slo else {},
        "base_settings": base,
        "settings": settings,
        "changed": changed,
        "decisions": decisions,
        "bundles": bundles,
        "missing": _missing_evidence(single, bundles),
        "failed_sweeps": failed,
        "context_sweeps": context,
        "resolved_defaults": dflt,
        "sources": [
            {"notebook": s.notebook, "sweep": s.name, "points": len(s.rows), "ok": s.n_ok}
            for s in sweeps
        ],
    }


def _sort_sweeps(
    sweeps: list[Sweep], sc: Scenario, slo: dict
) -> tuple[dict[str, list[Sweep]], list[dict], list[str]]:
    """Sort the run's sweeps by what they varied: (setting -> sweeps that varied it alone, the
    comparisons of those that varied several settings at once, labels of those that varied none)."""
    single: dict[str, list[Sweep]] = {}
    bundles: list[dict] = []
    context: list[str] = []
    for whole in sweeps:
        if whole.n_ok == 0:
            continue
        # A sweep over several workloads is judged per workload (e.g. prefix caching per prefix share).
        for s in whole.split_by_workload() if whole.workload_varies else [whole]:
            v = s.varied
            if s.n_ok == 0:
                continue
            if len(v) == 1:
                single.setdefault(v[0], []).append(s)
            elif len(v) > 1:
                bundles += compare_bundle(s, sc, slo)
            else:
                context.append(s.label)
    return single, bundles, context


def _decide_from_sweeps(
    setting: str, sweeps: list[Sweep], sc: Scenario, slo: dict, dflt: dict, base: dict
) -> dict:
    """The decision for one setting from the sweeps that varied it alone: those that suit the
    scenario best decide (and must agree to change it); the policy can still keep it."""
    cands = sorted(sweeps, key=lambda s: (-_match_score(s, sc), -s.n_ok, s.label))
    top = [c for c in cands if _match_score(c, sc) == _match_score(cands[0], sc)]
    found = [decide_setting(c, setting, sc, slo, dflt, base) for c in top]
    d = dict.fromkeys(DECISION_KEYS)
    d.update(found[0])
    d["also_in"] = [s.label for s in cands if all(s is not t for t in top)]
    if len(found) > 1:
        _require_agreement(d, top, found)
    if setting in POLICY:
        if d.get("changed"):
            d["measured_best"] = d["value"]
        d.update(
            changed=False,
            value=None,
            status="kept: policy",
            reason=f"{setting} {POLICY[setting]}. " + d.get("reason", ""),
        )
    return d


def _require_agreement(d: dict, top: list[Sweep], found: list[dict]) -> None:
    """Record each equally suited sweep's verdict in ``d``; keep the default if they disagree."""
    # Equally suited evidence (several workloads, several sweeps) must agree to change.
    d["per_workload"] = [
        {
            "evidence": c.label,
            "status": x["status"],
            "best": x.get("best"),
            "best/default": (x.get("vs_default") or {}).get("ratio"),
        }
        for c, x in zip(top, found, strict=True)
    ]
    outcomes = {(x["changed"], json.dumps(x["value"], default=str)) for x in found}
    if len(outcomes) > 1:
        d.update(
            changed=False,
            value=None,
            status="kept: evidence disagrees",
            reason="equally suited sweeps disagree: "
            + "; ".join(f"{c.label}: {x['status']}" for c, x in zip(top, found, strict=True)),
        )


def _missing_evidence(single: dict[str, list[Sweep]], bundles: list[dict]) -> list[str]:
    """A line for each tuned setting (TOPICS) that no sweep of the run varied alone."""
    missing = []
    for name, topic in TOPICS.items():
        if name in single:
            continue
        with_others = sorted(
            {f"{b['notebook']}/{b['sweep']}" for b in bundles if name in b["settings"]}
        )
        if with_others:
            missing.append(
                f"no evidence for {topic} on its own in this run (varied only together with other"
                f" settings in {', '.join(with_others)}): {name} kept at vLLM's default"
            )
        else:
            missing.append(f"no evidence for {topic} in this run: {name} kept at vLLM's default")
    return missing


def evidence_sweep(sweeps: list[Sweep], decision: dict) -> Sweep | None:
    """The sweep (or the workload part of one) a decision was made on."""
    for s in sweeps:
        if s.notebook == decision.get("notebook") and s.name == decision.get("sweep"):
            if not decision.get("part"):
                return s
            for p in s.split_by_workload():
                if p.part == decision["part"]:
                    return p
    return None


def decisions_table(choice: dict):
    """One row per setting: the decision, the value, the evidence and the gap to the runner-up."""
    import pandas as pd

    rows = []
    for d in choice["decisions"]:
        gap = d.get("gap_to_runner_up") or {}
        vs = d.get("vs_default") or {}
        rows.append(
            {
                "setting": d["setting"],
                "decision": d["status"],
                "value": fmt_setting(d["value"]) if d["changed"] else "vLLM default",
                "best measured": d.get("best"),
                "evidence": f"{d['notebook']}/{d['sweep']}"
                + (f" [{d['part']}]" if d.get("part") else ""),
                "metric": d.get("metric"),
                "best/default": round(vs["ratio"], 3) if vs.get("ratio") is not None else None,
                "runner-up": d.get("runner_up"),
                "gap to runner-up": round(gap["ratio"], 3)
                if gap.get("ratio") is not None
                else None,
                "runner-up within noise": gap.get("within_noise"),
                "reason": d.get("reason"),
            }
        )
    cols = [
        "setting",
        "decision",
        "value",
        "best measured",
        "evidence",
        "metric",
        "best/default",
        "runner-up",
        "gap to runner-up",
        "runner-up within noise",
        "reason",
    ]
    return pd.DataFrame(rows, columns=cols)


def recommendation_text(choice: dict, html: bool = False) -> str:
    """The recommendation in a few lines (plain text, or HTML for the explorer)."""
    lines = [
        f"Scenario {choice['scenario']} ({choice['scenario_title']}); objective: {choice['objective']}."
    ]
    if choice["slo"]:
        lines.append("SLO: " + ", ".join(f"{k} <= {v:g}" for k, v in choice["slo"].items()) + ".")
    if choice["changed"]:
        for d in choice["decisions"]:
            if d["changed"]:
                lines.append(
                    f"Set {d['setting']} = {fmt_setting(d['value'])}: {d['reason']} [{evidence_where(d)}]."
                )
    else:
        lines.append("Keep vLLM's defaults: no measured setting beat its default beyond the noise.")
    for d in choice["decisions"]:
        if not d["changed"]:
            lines.append(f"{d['setting']}: {d['status']} [{evidence_where(d)}].")
    lines += [m[0].upper() + m[1:] + "." for m in choice["missing"]]
    if not html:
        return "\n".join(lines)
    import html as _h

    return "<div>" + "".join(f"<p>{_h.escape(x)}</p>" for x in lines) + "</div>"


# --------------------------------------------------------------------------- writers


def config_hash(configs: dict) -> str:
    """A short stable hash of validation configs (names a validation sweep so a new choice never resumes an old one)."""
    return hashlib.sha256(json.dumps(configs, sort_keys=True, default=str).encode()).hexdigest()[:8]


# --------------------------------------------------------------------------- validation summary

VALIDATION_METRICS = (
    ("output_throughput_tok_s", "max"),
    ("request_throughput_rps", "max"),
    ("goodput_rps", "max"),
    ("ttft_p99_ms", "min"),
    ("tpot_p50_ms", "min"),
    ("e2e_p99_ms", "min"),
)


def validation_table(df, reference: str = "default", metrics=VALIDATION_METRICS):
    """Each config vs the reference: median, min-max, ratio of medians, within noise (per metric)."""
    import pandas as pd

    rows = []
    for metric, direction in metrics:
        vals = _config_values(df, metric)
        if reference not in vals:
            continue
        for cfg, v in vals.items():
            c = compare(vals[reference], v)
            s = spread(v)
            rows.append(
                {
                    "metric": metric,
                    "better": "higher" if direction == "max" else "lower",
                    "config": cfg,
                    "median": s["median"],
                    "min": s["min"],
                    "max": s["max"],
                    "n": s["n"],
                    "rel_spread": s.get("rel_spread"),
                    f"ratio vs {reference}": c["ratio"],
                    "within noise": None if cfg == reference else c["within_noise"],
                    "noise": None if cfg == reference else c["noise"],
                }
            )
    return pd.DataFrame(rows)


# Below this relative gap on a throughput objective, two configurations serve the same load: under
# Poisson arrivals both finish at the arrival rate, and a 0.2% gap can come out "beyond noise" when
# the ranges happen to be tight. Not a noise rule: it adds the latency tail to the wording.
EQUAL_LOAD_GAP = 0.02


def versus_default(
    vt, config: str, objective: str | None, tail: str = "ttft_p99_ms", label: str | None = None
) -> str | None:
    """'<config> at 0.34x the default's goodput_rps (within noise, n=3)' from a validation_table.

    When the objective is a throughput that both configurations reach alike (gap below
    EQUAL_LOAD_GAP), the objective cannot tell them apart, so the latency tail is added: that is
    where the difference shows.
    """

    def row(metric):
        r = vt[(vt["config"] == config) & (vt["metric"] == metric)]
        return None if r.empty else r.iloc[0]

    def noise(r):
        return "within noise" if r["within noise"] else "beyond noise"

    r = row(objective) if objective else None
    if r is None:
        return None
    ratio = r["ratio vs default"]
    text = (
        f"{label or config} at {ratio:.3g}x the default's {objective} ({noise(r)}, n={int(r['n'])})"
    )
    same_load = r["better"] == "higher" and abs(ratio - 1) < EQUAL_LOAD_GAP
    t = row(tail) if same_load and tail != objective else None
    if t is not None:
        text += (
            f"; both serve the same load (a gap under {EQUAL_LOAD_GAP:.0%}), and {tail} is"
            f" {t['ratio vs default']:.3g}x the default's ({noise(t)})"
        )
    return text


def structure(files: dict) -> dict:
    """The shape of the written configuration (file names, choice.json keys), not its measured values."""
    doc = json.loads(Path(files["choice.json"]).read_text())
    return {
        "files": sorted(files),
        "choice.json keys": sorted(doc),
        "decision keys": list(DECISION_KEYS),
        "every decision has them": all(
            set(d) == set(DECISION_KEYS) for d in doc.get("decisions", [])
        ),
    }
