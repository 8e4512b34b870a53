"""Capacity evidence: 04's served capacity sweeps read back, the deployment chosen from them, and
05's check that it holds what 04 found.

Notebook 04 measures configurations served as users are served (``vllm serve``, replicas behind
vllm-router) by their sustained capacity under the SLO (``tunebook.core.sustained``).
``choose_deployment`` takes the best of those that beat vLLM's default beyond the noise
(``metrics.compare``); where none does, the default stays.

``check_plan`` is 05's check of that choice: the chosen deployment and vLLM's default, each
driven by vLLM's own ``vllm bench serve`` at the capacity 04 found and at 1.25x it (the SLO
should hold at the first and break at the second), and each searched for its sustained capacity
on held-out workloads the choice was not made on. ``check_table``, ``bench_table`` and
``not_for`` read the results.
"""

from __future__ import annotations

import math
from pathlib import Path

from tunebook.core.errors import ConfigError
from tunebook.core.metrics import compare, spread
from tunebook.core.results import SweepDir
from tunebook.measure.loadgen import LAG_OK_MS


# --------------------------------------------------------------------------- the choice
def capacity_sweeps(run_dir: str | Path, notebook: str = "04_engine_overhead") -> list[Path]:
    """Sweep folders of a notebook whose points carry a capacity under the SLO (04's)."""
    out = []
    for summary in sorted(Path(run_dir).glob(f"{notebook}/*/summary.csv")):
        head = summary.read_text().split("\n", 1)[0]
        if "capacity_rps" in head.split(","):
            out.append(summary.parent)
    return out


def _capacities(points: list[dict]) -> dict[str, dict]:
    by: dict[str, dict] = {}
    failed: dict[str, int] = {}
    for p in points:
        if p.get("status") != "ok":
            failed[str(p.get("config"))] = failed.get(str(p.get("config")), 0) + 1
            continue
        m = p.get("metrics") or {}
        cfg = str(p.get("config"))
        e = by.setdefault(
            cfg, {"values": [], "settings": p.get("settings") or {}, "serve": p.get("serve") or {}}
        )
        cap = m.get("capacity_rps")
        e["values"].append(float(cap) if cap is not None else 0.0)
        e.setdefault("lower_bound", False)
        if m.get("capacity_capped") or _client_limited(p):
            e["lower_bound"] = True
        e.setdefault("slo", m.get("slo"))
        e.setdefault("workload", (p.get("workload") or {}).get("name"))
    for cfg, e in by.items():
        e["failed"] = failed.get(cfg, 0)
    return by


def _failed(row: dict) -> str:
    """What a ranking row's failed starts leave unsaid: fewer starts than asked, and why."""
    n = row.get("failed_starts") or 0
    if not n:
        return ""
    return (
        f"; {n} of its {n + row['capacity_n']} starts failed (their points hold the error):"
        " rerun it before trusting or dismissing it"
    )


def _client_limited(point: dict) -> bool:
    """True when the client fell behind its schedule at the first rate that broke the SLO: that
    rate's failure may be the client's, so the capacity found is a lower bound."""

    m = point.get("metrics") or {}
    fail = m.get("first_failing_rps")
    for r in point.get("per_rate") or []:
        if fail is not None and math.isclose(r.get("offered_rps") or 0, fail):
            return (r.get("lag_p99_ms") or 0) > LAG_OK_MS
    return False


def _ranking(by: dict[str, dict], reference: str) -> list[dict]:
    """Each configuration's capacity (median, min-max over starts) against the reference's by
    the one noise rule, best first."""
    ref = by[reference]
    ranking = []
    for cfg, e in by.items():
        c = compare(ref["values"], e["values"])
        ranking.append(
            {
                "config": cfg,
                **{f"capacity_{k}": v for k, v in spread(e["values"]).items()},
                "vs_default": c["ratio"],
                "noise": c["noise"] if cfg != reference else "(reference)",
                "beyond_noise": cfg != reference and not c["within_noise"],
                "lower_bound": e["lower_bound"],
                "failed_starts": e["failed"],
            }
        )
    return sorted(ranking, key=lambda r: -(r["capacity_median"] or 0))


def choose_deployment(run_dir: str | Path, reference: str = "default") -> dict | None:
    """The deployment for served chat traffic, from the run's capacity evidence, or None.

    Returns ``{status, config, settings, serve, replicas, capacity, vs_default, noise, reason,
    evidence, ranking}``: ``status`` is ``changed`` when the best configuration's capacity beats
    the reference's beyond the noise, else ``kept: ...`` with the reference's settings.
    """
    for folder in capacity_sweeps(run_dir):
        by = _capacities(SweepDir(folder).points())
        if reference not in by:
            continue
        ref = by[reference]
        ranking = _ranking(by, reference)
        # The highest capacity that beats the default beyond the noise. The highest measured may
        # not: a configuration with failed starts has too few left to rank (n=1 ranks nothing),
        # and that must not hide a second one that does beat the default.
        top = ranking[0]
        beating = [
            r
            for r in ranking
            if r["config"] != reference and r["beyond_noise"] and r["vs_default"] > 1
        ]
        winner = bool(beating)
        best = beating[0] if winner else top
        pick = by[best["config"]] if winner else ref
        serve = {
            k: v
            for k, v in (pick["serve"] or {}).items()
            if k in ("replicas", "router_policy", "api_server_count")
        }
        r0 = next(r for r in ranking if r["config"] == reference)
        lb = " (a lower bound: the search stopped at its cap, or the client fell behind at the next rate)"
        if winner:
            reason = (
                f"{best['config']} serves {best['vs_default']:.2f}x the default's capacity under the"
                f" SLO ({best['capacity_median']:.3g} vs {r0['capacity_median']:.3g} req/s;"
                f" {best['noise']})" + (lb if best["lower_bound"] else "")
            )
            if top is not best:
                reason += (
                    f"; {top['config']} measured more ({top['vs_default']:.2f}x) but not"
                    f" beyond the noise ({top['noise']}){_failed(top)}"
                )
            status = "changed"
        else:
            reason = (
                f"no configuration beats the default's capacity ({r0['capacity_median']:.3g} req/s)"
                + (
                    f" beyond the noise; best measured: {best['config']} at {best['vs_default']:.2f}x"
                    f" ({best['noise']}){_failed(best)}"
                    if best["config"] != reference
                    else "; the default measured highest"
                )
            )
            status = (
                "kept: within noise" if best["config"] != reference else "kept: default is best"
            )
        chosen = best["config"] if winner else reference
        # (where a best measured one was kept out by the noise, the reason has named it already)
        runner = _runner_up(ranking, by, chosen) if status != "kept: within noise" else None
        if runner:
            reason += f"; runner-up: {runner['text']}"
        return {
            "status": status,
            "config": chosen,
            "runner_up": runner,
            "settings": dict(pick["settings"]),
            "serve": serve,
            "replicas": int(serve.get("replicas", 1)),
            "capacity_rps": best["capacity_median"] if winner else r0["capacity_median"],
            "default_capacity_rps": r0["capacity_median"],
            "vs_default": best["vs_default"] if winner else 1.0,
            "noise": best["noise"] if winner else r0["noise"],
            "slo": ref.get("slo"),
            "workload": ref.get("workload"),
            "reason": reason,
            "evidence": str(folder),
            "ranking": ranking,
        }
    return None


def _runner_up(ranking: list[dict], by: dict, chosen: str) -> dict | None:
    """The configuration measured next-highest after ``chosen``, and the margin between them by
    the one noise rule (None where nothing else was measured)."""
    names = [r["config"] for r in ranking]
    below = ranking[names.index(chosen) + 1 :] if chosen in names else []
    rest = [r for r in below if r["capacity_median"]]
    if not rest or not by[chosen]["values"]:
        return None
    r = rest[0]
    c = compare(by[r["config"]]["values"], by[chosen]["values"])
    text = (
        f"{r['config']} at {r['capacity_median']:.3g} req/s, the chosen one {c['ratio']:.2f}x it"
        f" ({c['noise']})"
    )
    return {
        "config": r["config"],
        "capacity_rps": r["capacity_median"],
        "ratio": c["ratio"],
        "within_noise": c["within_noise"],
        "text": text,
    }


# --------------------------------------------------------------------------- the files


def validation_configs(
    choice: dict,
    served_choice: dict | None,
    article: dict,
    names: list[str],
    client_workers: int = 1,
) -> dict[str, dict]:
    """Configurations for assembly's served validation, as sweep configs.

    "chosen" is the deployment written: the in-process choice's settings with the served choice's
    settings, replicas and router when it changed anything; "default" is ``vllm serve`` with
    vLLM's defaults; "article" the article's settings as run here. ``names`` picks among them
    ("default", the reference, is always measured).
    """
    known = ("chosen", "default", "article")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(
            f"validation_configs: {unknown} unknown; choose from {', '.join(known)}",
            key="validation_configs",
        )
    common = {"client_workers": int(client_workers)}
    chosen = {"settings": dict(choice["changed"]), "serve": dict(common)}
    if served_choice and served_choice.get("status") == "changed":
        chosen["settings"].update(served_choice["settings"])
        chosen["serve"].update(served_choice["serve"])
    configs = {
        "chosen": chosen,
        "default": {"serve": dict(common)},
        "article": {"settings": dict(article), "serve": dict(common)},
    }
    return {k: v for k, v in configs.items() if k in names or k == "default"}


def capacity_points(run_dir: str | Path) -> list[dict]:
    """The points of 04's capacity sweep (the first capacity sweep of 04 in the run)."""
    folders = capacity_sweeps(run_dir)
    return SweepDir(folders[0]).points() if folders else []


def workload_of(points: list[dict]) -> dict:
    """The request shape 04's capacity was found on (its rate and count set by each search)."""
    for p in points:
        wl = dict(p.get("workload") or {})
        if wl:
            for k in (
                "name",
                "num_requests",
                "request_rate",
                "prompt_tokens",
                "output_tokens",
                "max_prompt_len",
            ):
                wl.pop(k, None)
            return wl
    raise ConfigError("no capacity points from 04 in this run: nothing to check", key="check")


# --------------------------------------------------------------------------- 05's check
CHECK_FACTOR = 1.25  # the rate above the capacity at which the SLO should break
BENCH = "bench"  # the check's workload measured by vllm bench serve
# Workloads the choice was not made on (the choice is made on 04's chat workload).
HELD_OUT = {
    "decode_heavy": {"kind": "fixed", "prompt_len": 128, "output_len": 512, "seed": 41},
    "prefill_heavy": {"kind": "fixed", "prompt_len": 2048, "output_len": 128, "seed": 42},
    # a seeded log-normal of prompt and reply lengths (medians 512 and 128): traffic is not one length
    "lognormal": {
        "kind": "lognormal",
        "median_prompt_len": 512,
        "median_output_len": 128,
        "max_prompt_len": 4096,
        "max_output_len": 1024,
        "seed": 43,
    },
}


def _cost(wl: dict) -> float:
    """A request's work, roughly: decode steps dominate a small model; a prefill token costs
    about a sixteenth of a decode step's host time. Only to start a search near its answer."""
    out = wl.get("output_len") or wl.get("median_output_len") or 128
    prompt = wl.get("prompt_len") or wl.get("median_prompt_len") or 512
    return float(out) + float(prompt) / 16.0


def check_plan(
    served_choice: dict,
    configs: dict[str, dict],
    workload: dict,
    held_out: dict[str, dict],
    search: dict,
) -> tuple[dict, dict, dict]:
    """(configs, workloads, point_overrides) of 05's check sweep.

    ``configs``: the chosen deployment and the default as sweep configs
    (``validation_configs``); ``workload``: 04's (the capacity was found on it); ``served_choice``
    carries both capacities. Each configuration gets its own rates for the bench workload and its
    own search start on each held-out workload (its chat capacity scaled by the work a request
    asks for); the searches share ``search``.
    """
    caps = {
        "chosen": served_choice["capacity_rps"],
        "default": served_choice["default_capacity_rps"],
    }
    out = {}
    for name, cfg in configs.items():
        cap = caps.get(name) or caps["default"]
        if not cap:
            raise ConfigError(f"no capacity was found for {name} in 04: nothing to check", key=name)
        per = {
            BENCH: {"rates": [round(cap, 3), round(CHECK_FACTOR * cap, 3)], "client": "vllm-bench"}
        }
        for w, spec in held_out.items():
            per[w] = {"search": {"start_rps": round(cap * _cost(workload) / _cost(spec), 3)}}
        out[name] = {**cfg, "per_workload": per}
    workloads = {BENCH: dict(workload), **held_out}
    overrides = {w: {"search": dict(search)} for w in held_out}
    return out, workloads, overrides


def check_table(points: list[dict], reference: str = "default"):
    """Sustained capacity per held-out workload and configuration (median, min-max over starts),
    and the chosen one's ratio to the reference by the one noise rule."""
    import pandas as pd

    rows = []
    by: dict[tuple, list[float]] = {}
    for p in points:
        wl = (p.get("workload") or {}).get("name")
        if wl == BENCH or p.get("status") != "ok" or p.get("search") is None:
            continue  # vLLM's client, or a validation workload sharing the starts
        cap = (p.get("metrics") or {}).get("capacity_rps")
        by.setdefault((wl, p.get("config")), []).append(float(cap) if cap else 0.0)
    for (wl, cfg), vals in sorted(by.items()):
        ref = by.get((wl, reference), [])
        c = compare(ref, vals)
        s = spread(vals)
        rows.append(
            {
                "workload": wl,
                "config": cfg,
                "capacity_median": s["median"],
                "capacity_min": s["min"],
                "capacity_max": s["max"],
                "n": s["n"],
                f"vs_{reference}": c["ratio"] if cfg != reference else 1.0,
                "noise": c["noise"] if cfg != reference else "(reference)",
                "worse": cfg != reference and not c["within_noise"] and c["ratio"] < 1,
            }
        )
    return pd.DataFrame(rows)


def bench_table(points: list[dict], run_04: list[dict], names: dict | None = None):
    """``vllm bench serve`` at 04's capacity and at 1.25x it, beside what tunebook's own client
    measured at that capacity in 04 (the start whose search found it). ``names``: the check's
    configuration names as 04 called them (``{"chosen": "replicas=4_stream_interval=16"}``)."""
    import pandas as pd

    names = names or {}
    rows = []
    for p in points:
        if (p.get("workload") or {}).get("name") != BENCH:
            continue
        for r in p.get("per_rate") or []:
            if r.get("superseded"):
                continue
            cfg = p.get("config")
            ours = _ours_at(run_04, names.get(cfg, cfg), r["offered_rps"])
            rows.append(
                {
                    "config": p.get("config"),
                    "repeat": p.get("repeat"),
                    "offered_rps": r["offered_rps"],
                    "client": "vllm bench serve",
                    "slo_attainment_pct": r.get("slo_attainment_pct"),
                    "sustained": r.get("sustained"),
                    "why_not": r.get("why_not_sustained") or "",
                    # only its window was short of what its latency asks for: not shown to hold,
                    # but not shown to fail either (every other rule held)
                    "window_only": r.get("sustained_broke") == "window",
                    "ttft_p99_ms": r.get("ttft_p99_ms"),
                    "tpot_p99_ms": r.get("tpot_p99_ms"),
                    "chunk_gap_p99_ms": r.get("chunk_gap_p99_ms"),
                    # requests within the SLO per second of arrivals, by either client
                    "within_slo_rps": _good_per_s(r),
                    "tunebook_slo_attainment_pct": (ours or {}).get("slo_attainment_pct"),
                    "tunebook_within_slo_rps": _good_per_s(ours) if ours else None,
                    "window_s": r.get("window_s"),
                }
            )
    return pd.DataFrame(rows)


def _good_per_s(r: dict) -> float | None:
    """Requests within the SLO per second of arrivals: the same figure from either client.
    (Goodput over a run's whole duration is not: vllm bench serve's includes the drain, so it
    reads about window / (window + e2e) of the rate even where every request is good.)"""
    n, w, pct = r.get("num_requests"), r.get("window_s"), r.get("slo_attainment_pct")
    if n and w and pct is not None:
        return pct / 100.0 * n / w
    return r.get("goodput_rps")


def _ours_at(run_04: list[dict], config: str | None, rate: float) -> dict | None:
    """tunebook's own figures at ``rate`` for ``config`` in 04's capacity search (any start)."""
    for p in run_04:
        if p.get("config") != config:
            continue
        for r in p.get("per_rate") or []:
            if not r.get("superseded") and math.isclose(
                r.get("offered_rps") or 0, rate, rel_tol=1e-3
            ):
                return r
    return None


def bench_verdict(bench: pd.DataFrame) -> str:  # noqa: F821
    """Does vLLM's own client agree: the SLO held at the capacity and broke at 1.25x it?"""
    if bench is None or not len(bench):
        return "vllm bench serve did not run (no capacity from 04, or the check was skipped)"
    lines = []
    for cfg, g in bench.groupby("config", sort=False):
        g = g.sort_values("offered_rps")
        at, above = g.iloc[0], g.iloc[-1]
        # A rate that held on every rule but the window's length counts as held here, said so:
        # vLLM's client runs each rate once, with the window 04's latency asked for.
        held = bool(at["sustained"]) or bool(at.get("window_only"))
        broke = not (bool(above["sustained"]) or bool(above.get("window_only")))
        agree = ""
        if at["tunebook_within_slo_rps"] and at["within_slo_rps"]:
            gap = at["within_slo_rps"] / at["tunebook_within_slo_rps"] - 1
            agree = (
                f"; within the SLO {at['within_slo_rps']:.3g} req/s of arrivals against tunebook's"
                f" {at['tunebook_within_slo_rps']:.3g} ({100 * gap:+.0f}%,"
                f" {'within' if abs(gap) <= 0.10 else 'NOT within'} 10%)"
            )
        word = (
            "agrees"
            if held and broke
            else "does NOT agree: "
            + ("the SLO did not hold at the capacity" if not held else "")
            + (" and " if not held and not broke else "")
            + ("it still held at 1.25x" if not broke else "")
        )
        lines.append(
            f"{cfg}: at {at['offered_rps']:.4g} req/s {at['slo_attainment_pct']:.1f}% within the"
            f" SLO ({_held_words(at)}), at {above['offered_rps']:.4g}"
            f" {above['slo_attainment_pct']:.1f}% ({_held_words(above)})"
            f" - vllm bench serve {word}{agree}"
        )
    return "\n".join(lines)


def _held_words(r) -> str:
    if r["sustained"]:
        return "held"
    if r.get("window_only"):
        return f"held on every rule but the window's length: {r['why_not']}"
    return "failed: " + r["why_not"]


def not_for(check: pd.DataFrame, validations: dict | None = None) -> list[str]:  # noqa: F821
    """The traffic the chosen deployment should not be used for: where it sustained less than the
    default beyond the noise (held-out workloads), or measured worse on another scenario's
    objective (05's side-by-side validation, ``{scenario: (validation table, objective)}``)."""
    out = []
    if check is not None and len(check):
        for _, r in check[check["worse"]].iterrows():
            out.append(
                f"{r['workload']} traffic: {r['vs_default']:.2f}x the default's sustained capacity"
                f" ({r['noise']})"
            )
    for scenario, (table, metric) in (validations or {}).items():
        if table is None or not len(table) or metric is None:
            continue
        row = table[(table["metric"] == metric) & (table["config"] == "chosen")]
        if not len(row):
            continue
        r = row.iloc[0]
        ratio = r[[c for c in table.columns if c.startswith("ratio vs")][0]]
        worse = (ratio < 1) if r["better"] == "higher" else (ratio > 1)
        beyond = r["within noise"] is not None and not bool(r["within noise"])
        if worse and beyond:
            out.append(f"{scenario}: {ratio:.2f}x the default's {metric} ({r['noise']})")
    return out
