"""Assembly's deployment choice from served capacity, and the files of an N-replica deployment.

Notebook 04 measures configurations served as users are served (``vllm serve``, replicas behind
vllm-router) by their capacity under the SLO. ``choose_deployment`` takes the best of those that
beat vLLM's default beyond the noise (``metrics.compare``); where none does, the default stays.

``deployment_files`` writes what a user runs: one ``vllm serve --config`` file per replica (its
KV share and its share of ``gpu_memory_utilization``), and ``start.sh``, which starts every
replica and vllm-router in front of them and stops them all when it ends.
``python -m tunebook.serve <folder> --check`` runs that script as written and checks OpenAI
completions and chat through the router.
"""

from __future__ import annotations

import math
from pathlib import Path

from tunebook.core.errors import ConfigError
from tunebook.core.metrics import compare, spread
from tunebook.core.results import SweepDir
from tunebook.measure.loadgen import LAG_OK_MS


# --------------------------------------------------------------------------- the choice
def capacity_sweeps(run_dir: str | Path) -> list[Path]:
    """Sweep folders of a run whose points carry a capacity under the SLO (notebook 04's)."""
    out = []
    for summary in sorted(Path(run_dir).glob("*/*/summary.csv")):
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
        ranking.sort(key=lambda r: -(r["capacity_median"] or 0))
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
        return {
            "status": status,
            "config": best["config"] if winner else reference,
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
