"""Notebook 04's helpers: is the engine host-bound, and which host-side lever lifts it?

A small model's decode step is cheap on the GPU, so the step time is set by what the host does
around it: scheduling, input preparation, sampling, detokenization and, for a served model, the
API server that turns every token into an SSE chunk. The levers that act on that:

- ``compilation_config.max_cudagraph_capture_size`` / ``cudagraph_capture_sizes``: a decode batch
  larger than the largest captured size runs without a CUDA graph (vLLM 0.26 caps capture at 512);
- ``max_num_seqs``: the batch width;
- ``performance_mode``;
- on the server path only: ``stream_interval`` (tokens per SSE chunk) and ``api_server_count``;
- engine replicas per GPU, each with its share of the KV cache, behind vllm-router.

Every configuration is judged by its *capacity under the SLO* (``served.search_rates``) over
several engine starts, interleaved, and compared with vLLM's default by the one noise rule.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tunebook.core import claims
from tunebook.core.capacity_model import Calibration, Candidate, Traffic, enumerate_candidates
from tunebook.core.errors import ConfigError
from tunebook.core.metrics import compare, slo_text, spread
from tunebook.core.model import ModelShape
from tunebook.core.results import point_row
from tunebook.engine.host import device_memory_bytes
from tunebook.topics import search
from tunebook.topics.plots import config_colours, log_ticks
from tunebook.topics.roofline import decode_floor_ms


# --------------------------------------------------------------------------- configurations
def replica_configs(counts, kv_bytes_total: int | None = None) -> dict[str, dict]:
    """``replicas=N`` configurations: N servers behind vllm-router, the KV cache split N ways
    (``kv_bytes_total`` fixed: each gets its share; else each gets gpu_memory_utilization / N)."""
    out = {}
    for n in counts:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"replica count {n!r} must be a whole number >= 1", key="replicas")
        if n == 1:
            continue  # the default itself
        cfg: dict = {"serve": {"replicas": n}}
        if kv_bytes_total:
            cfg["settings"] = {"kv_cache_memory_bytes": int(kv_bytes_total) // n}
        out[f"replicas={n}"] = cfg
    return out


def merge_config(a: dict, b: dict) -> dict:
    """Two lever configurations combined (settings and serve options merged key by key)."""
    out = {k: v for k, v in a.items() if k not in ("settings", "serve")}
    out.update({k: v for k, v in b.items() if k not in ("settings", "serve")})
    for key in ("settings", "serve"):
        merged = {**a.get(key, {}), **b.get(key, {})}
        if merged:
            out[key] = merged
    return out


def served_slo(
    ttft_ms: float, tpot_ms: float, attainment_pct: float = 99.0, chunk_gap_ms: float = 0.0
) -> dict:
    """The SLO of 04's chat workload: TTFT, TPOT and, when bounded, every gap between chunks."""
    slo = {
        "ttft_ms": float(ttft_ms),
        "tpot_ms": float(tpot_ms),
        "attainment_pct": float(attainment_pct),
    }
    if chunk_gap_ms:
        slo["itl_ms"] = float(chunk_gap_ms)
    return slo


def lever_configs(
    levers: dict,
    replica_counts,
    kv_bytes_total: int | None,
    router_policy: str,
    client_workers: int,
    search_start: dict | None = None,
) -> dict[str, dict]:
    """vLLM's default, the levers given, and N replicas behind vllm-router: the configurations
    04 serves, each with the load generator's processes and, where ``search_start`` names it,
    the rate its first search starts at."""
    configs = {"default": {}, **levers}
    for name, cfg in replica_configs(replica_counts, kv_bytes_total or None).items():
        configs[name] = merge_config(cfg, {"serve": {"router_policy": router_policy}})
    unknown = sorted(set(search_start or {}) - set(configs))
    if unknown:
        raise ConfigError(
            f"search_start: {unknown} are not configurations ({', '.join(configs)})",
            key="search_start",
        )
    out = {}
    for n, c in configs.items():
        c = merge_config(c, {"serve": {"client_workers": client_workers}})
        if n in (search_start or {}):
            c["search"] = {"start_rps": float(search_start[n])}
        out[n] = c
    return out


def search_plan(
    space: dict,
    configs: dict[str, dict],
    calibration: Calibration | None,
    workload: dict,
    slo: dict,
    top: int = 3,
    kv_bytes_total: int | None = None,
    client_workers: int = 1,
    search_start: dict | None = None,
    max_rps: float | None = None,
) -> dict:
    """What 04 measures, and what the model predicted of it: ``{"ranked", "picked", "configs"}``.

    ``configs`` (vLLM's default and the levers given, ``lever_configs``) are always measured,
    each predicted where the model knows its knobs. With a ``space`` (knob -> values) every
    candidate of that grid is ranked too (``search.rank``: those that cannot fit the card or the
    cores set aside, never started) and the few ``search.pick`` gives are measured beside them.
    A search without a given start (``search_start``) starts at its prediction, for requests of
    ``workload``'s shape under ``slo`` (``served_slo``). ``calibration`` None: nothing predicted
    (and no grid to rank)."""
    traffic = Traffic.from_params(workload, slo)
    if space and calibration is None:
        raise ConfigError(
            "search_space needs the calibration (calibrate: true)", key="search_space"
        )
    modelled, unmodelled = {}, []
    for name, cfg in configs.items():
        try:
            modelled[name] = Candidate.from_config(cfg)
        except ConfigError as e:  # performance_mode ...: measured, not predicted
            unmodelled.append({"config": name, "fits": None, "reason": str(e), "rank": None})
    # a configuration given stands for the grid's candidate of its name or of its knobs
    grid = {
        c.name: c
        for c in (enumerate_candidates(space) if space else [])
        if c.name not in configs and c not in modelled.values()
    }
    unknown = sorted(set(search_start or {}) - set(configs) - set(grid))
    if unknown:
        raise ConfigError(
            f"search_start: {unknown} are not configurations ({', '.join([*configs, *grid])})",
            key="search_start",
        )
    candidates = {**grid, **modelled}
    if calibration:
        ranked = search.rank(candidates, calibration, traffic)
    else:
        ranked = [
            {"config": n, "candidate": c, "fits": None, "reason": None}
            for n, c in candidates.items()
        ]
    ranked += [{**r, "predicted_rps": None} for r in unmodelled]
    picked = search.pick(ranked, top=top) if space else []
    chosen = {r["config"] for r in picked}
    picked += [
        {**r, "why": "given"}
        for r in ranked
        if r["config"] in configs and r["config"] not in chosen
    ]
    picked.sort(key=lambda r: r["config"] != search.REFERENCE)  # vLLM's default first
    # each search starts at its prediction (at most the search's max_rps: a start above it
    # would "hold" there and report the prediction itself as the capacity)
    predicted = search.search_starts([r for r in picked if r.get("predicted_rps")])
    if max_rps:
        predicted = {n: min(v, float(max_rps)) for n, v in predicted.items()}
    starts = {**predicted, **(search_start or {})}
    out = {}
    for r in picked:
        name = r["config"]
        if name in configs:
            cfg = dict(configs[name])
        else:
            cfg = candidate_config(r["candidate"], kv_bytes_total, client_workers)
        if name in starts and "search" not in cfg:
            cfg["search"] = {"start_rps": float(starts[name])}
        out[name] = cfg
    return {"ranked": ranked, "picked": picked, "configs": out}


def candidate_config(c: Candidate, kv_bytes_total: int | None, client_workers: int) -> dict:
    """A grid candidate as a 04 configuration: its knobs, its replicas' share of
    ``kv_bytes_total`` (as ``replica_configs`` splits it) and the load generator's processes."""
    cfg = c.to_config()
    if c.replicas > 1 and kv_bytes_total and c.kv_cache_memory_bytes is None:
        kv = {"kv_cache_memory_bytes": int(kv_bytes_total) // c.replicas}
        cfg = merge_config(cfg, {"settings": kv})
    return merge_config(cfg, {"serve": {"client_workers": client_workers}})


def ranked_frame(plan: dict):
    """Every candidate: its rank, predicted capacity, the resource the model says binds, and
    whether (and why) it is measured; those that cannot fit with the reason."""
    import pandas as pd

    why = {r["config"]: r["why"] for r in plan["picked"]}
    return pd.DataFrame(
        [
            {
                "config": r["config"],
                "rank": r.get("rank"),
                "predicted_rps": r.get("predicted_rps"),
                "binding": r.get("binding"),
                "ttft_p99_ms": r.get("ttft_p99_ms"),
                "measured": why.get(r["config"], ""),
                "why": r.get("why") if r.get("fits") else r.get("reason"),
            }
            for r in plan["ranked"]
        ]
    )


def race(sweep, configs: dict[str, dict], max_starts: int) -> dict:
    """Measure ``configs``: one engine start each, then more only where the top is undecided
    (``search.halving_step``: the better half and vLLM's default, up to ``max_starts``).
    ``sweep(configs, repeats)`` runs (or resumes) the capacity sweep and returns every point of
    it. Returns the last step (``decided``, ``best``, ``why``), ``measured`` and ``results``
    (the points of ``configs``: the sweep may hold others, from an earlier run of it)."""
    results, had = sweep(configs, 1), -1
    while True:
        results = [p for p in results if p.get("config") in configs]
        caps = search.measured_capacities(results)
        measured = {n: caps[n]["capacity"] for n in configs if n in caps}
        step = search.halving_step(measured, max_starts)
        ok = sum(len(v) for v in measured.values())
        if ok == had:  # a round whose every start failed: more of them would fail alike
            step = {
                **step,
                "next": [],
                "why": "the last round's starts all failed (their points hold why)",
            }
        if not step["next"]:
            return {**step, "measured": measured, "results": results}
        had, most = ok, max(len(v) for v in measured.values())
        results = sweep({n: configs[n] for n in step["next"]}, most + 1)


def errors_view(
    plan: dict, measured: dict[str, list[float]], title: str, results: list[dict] | None = None
) -> dict:
    """``search.prediction_errors`` of the measured candidates (those whose search stopped at
    its cap in ``results`` as lower bounds), with its table (``frame``) and its figure
    (``figure``: ``search.error_figure``)."""
    import pandas as pd

    predicted = [r for r in plan["ranked"] if r.get("predicted_rps")]
    caps = search.measured_capacities(results or [])
    capped = {n for n, v in caps.items() if v["capped"]}
    steps = {n: (v["capacity_rps"], v["first_failing_rps"]) for n, v in caps.items()}
    errors = search.prediction_errors(predicted, measured, capped, steps)
    return {
        **errors,
        "frame": pd.DataFrame(errors["rows"]),
        "figure": search.error_figure(errors, title),
    }


def write_search(
    path,
    calibration: Calibration | None,
    plan: dict,
    errors: dict | None,
    measured: dict[str, list[float]] | None = None,
) -> Path:
    """``search.json``: the calibration, every candidate's prediction (measured or not, and why),
    and each measured one's error: what a later run or a reader checks the model against."""
    from dataclasses import asdict

    def row(r: dict) -> dict:
        out = {k: v for k, v in r.items() if k != "candidate"}
        if r.get("candidate") is not None:
            out["candidate"] = r["candidate"].to_config()
        return out

    doc = {
        "calibration": asdict(calibration) if calibration else None,
        "ranked": [row(r) for r in plan["ranked"]],
        "measured": {r["config"]: r["why"] for r in plan["picked"]},
        "capacity_rps": measured or {},  # each measured candidate's capacity, one per start
        "errors": {k: v for k, v in (errors or {}).items() if k not in ("frame", "figure")} or None,
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_finite(doc), indent=1, default=str, allow_nan=False) + "\n")
    return path


def _finite(x):
    """``x`` with inf and NaN as None: strict JSON (a capacity of 0 gives an infinite error)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


def search_recorded_text(path) -> str:
    """Whether search.json holds a prediction and an error for every measured candidate (what
    the golden checks: the figures themselves vary from run to run)."""
    doc = json.loads(Path(path).read_text())
    modelled = {r["config"] for r in doc["ranked"] if r.get("predicted_rps") is not None}
    erred = {r["config"] for r in (doc.get("errors") or {}).get("rows", [])}
    measured = {n for n, v in doc["capacity_rps"].items() if v} & modelled
    ok = bool(measured) and measured <= erred
    return f"every measured candidate has its prediction and its error recorded: {ok}"


def search_error_figure(search_json, title: str = "Predicted against measured capacity"):
    """The prediction's error figure from a kept ``search.json`` (None: no file, or nothing
    measured was predicted): what the report shows beside 04's capacity."""
    path = Path(search_json)
    if not path.is_file():
        return None
    errors = json.loads(path.read_text()).get("errors") or {}
    if not errors.get("rows"):
        return None
    return search.error_figure(errors, f"{title}: {errors.get('text', '').split(':')[0]}")


def setup_text(platform: str, vllm: str, model: str, slo: dict, configs: dict, card: tuple) -> str:
    peak, bw, source = card
    return "\n".join(
        [
            f"platform {platform}, vLLM {vllm}, model {model}",
            f"SLO: {slo_text(slo)}",
            f"roofline: {peak} TFLOP/s, {bw} TB/s ({source})",
            "configurations: " + ", ".join(configs),
        ]
    )


# --------------------------------------------------------------------------- the diagnosis
def diagnosis_view(diag, workload: dict, shape: ModelShape, peak_tflops, hbm_tb_s):
    """(the floor, its one-row table, a line) from the diagnosis sweep's frame (None: not run)."""
    import pandas as pd

    if diag is None:
        return None, None, "diagnosis skipped (diagnose: false)"
    ok = diag[diag["status"] == "ok"]
    if not len(ok):
        return None, diag[["point_id", "error"]], "the diagnosis engine failed"
    if not (peak_tflops and hbm_tb_s):
        return None, None, "no roofline floor: no card figures (give peak_tflops and hbm_tb_s)"
    batch = workload["num_requests"]
    context = workload["prompt_len"] + workload["output_len"] / 2
    floor = decode_vs_floor(ok.iloc[0]["tpot_p50_ms"], batch, context, shape, peak_tflops, hbm_tb_s)
    text = (
        f"decode step {floor['step_ms']:.3g} ms at batch {batch}: the floor ({floor['bound']}-bound)"
        f" is {floor['floor_ms']:.3g} ms, {floor['of_floor_pct']:.1f}% of the step"
    )
    return floor, pd.DataFrame([floor]).round(4), text


def decode_vs_floor(
    tpot_ms: float,
    batch: float,
    context: float,
    shape: ModelShape,
    peak_tflops: float,
    hbm_tb_s: float,
) -> dict:
    """A measured decode step (TPOT at a steady batch) against its roofline floor."""
    floor = decode_floor_ms(shape, max(int(round(batch)), 1), context, peak_tflops, hbm_tb_s)
    return {
        "batch": batch,
        "context": context,
        "step_ms": tpot_ms,
        **floor,
        "of_floor_pct": 100.0 * floor["floor_ms"] / tpot_ms if tpot_ms else float("nan"),
    }


# --------------------------------------------------------------------------- results
def capacity_frame(results: list[dict]):
    """One row per point: configuration, start, capacity under the SLO and the client check."""
    import pandas as pd

    rows = []
    for r in results:
        row = point_row(r)
        serve = (r.get("env") or {}).get("serve") or r.get("serve") or {}
        rows.append(
            {
                "config": row["config"],
                "repeat": row["repeat"],
                "status": row["status"],
                "capacity_rps": row.get("capacity_rps"),
                "first_failing_rps": row.get("first_failing_rps"),
                "capped": row.get("capacity_capped"),
                "max_goodput_rps": row.get("max_goodput_rps"),
                "window_s_total": row.get("window_s_total"),
                "client_kept_schedule": row.get("client_kept_schedule"),
                "lag_p99_ms_max": row.get("lag_p99_ms_max"),
                "replicas": (serve or {}).get("replicas", 1),
                "engine_start_s": row["engine_start_s"],
                "error": row["error"],
            }
        )
    return pd.DataFrame(rows)


def curve_frame(results: list[dict]):
    """Goodput (and attainment) against the offered rate, one row per point and rate."""
    import pandas as pd

    rows = []
    for r in results:
        for x in r.get("per_rate") or []:
            rows.append({"config": r.get("config"), "repeat": r.get("repeat"), **x})
    return pd.DataFrame(rows)


def ranking(df, reference: str = "default") -> list[dict]:
    """Each configuration's capacity (median, min-max over starts) against the reference's,
    by the one noise rule; best first. A start where the SLO held at no rate counts as 0."""
    ok = df[df["status"] == "ok"]
    vals = {
        cfg: [float(v) if v is not None and not _nan(v) else 0.0 for v in g["capacity_rps"]]
        for cfg, g in ok.groupby("config")
    }
    ref = vals.get(reference, [])
    rows = []
    for cfg, v in vals.items():
        c = compare(ref, v)
        rows.append(
            {
                "config": cfg,
                **{f"capacity_{k}": x for k, x in spread(v).items() if k != "rel_spread"},
                f"vs_{reference}": c["ratio"] if cfg != reference else 1.0,
                "noise": c["noise"] if cfg != reference else "(reference)",
                "beyond_noise": (not c["within_noise"]) if cfg != reference else None,
                "capped": bool(ok[ok["config"] == cfg]["capped"].fillna(False).any()),
            }
        )
    return sorted(rows, key=lambda r: -(r["capacity_median"] or 0))


def _nan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)


def verdict(rank: list[dict], reference: str = "default", floor: dict | None = None) -> dict:
    """Name the bottleneck and what lifted it, with figures.

    ``floor``: the diagnosis (``decode_vs_floor``), if measured. Returns ``{bottleneck, lifted_by,
    text, best}``: ``lifted_by`` is the best configuration whose capacity beats the reference
    beyond the noise (None if none does).
    """
    ref = next((r for r in rank if r["config"] == reference), None)
    winners = [
        r
        for r in rank
        if r["config"] != reference and r["beyond_noise"] and r[f"vs_{reference}"] > 1
    ]
    host = floor is not None and floor.get("of_floor_pct", 100) < 50
    parts = []
    if floor is not None:
        parts.append(
            f"a decode step of {floor['batch']:.0f} sequences took {floor['step_ms']:.3g} ms against a"
            f" {floor['bound']}-bound floor of {floor['floor_ms']:.3g} ms ({floor['of_floor_pct']:.0f}% of"
            " the floor): "
            + ("the engine waits on the host" if host else "the device does most of the work")
        )
    if ref is None:
        return {
            "bottleneck": None,
            "lifted_by": None,
            "best": None,
            "text": "no reference measured",
        }
    ref_txt = f"{reference}: {ref['capacity_median']:.3g} req/s [{ref['capacity_min']:.3g}-{ref['capacity_max']:.3g}]"
    if winners:
        best = winners[0]
        lever = best["config"]
        kind = (
            "the front end (one API-server process)"
            if any(k in lever for k in ("stream_interval", "api_server_count", "replicas"))
            else "the host side of the engine"
        )
        text = (
            f"Capacity under the SLO: {ref_txt}; {lever}: {best['capacity_median']:.3g} req/s"
            f" [{best['capacity_min']:.3g}-{best['capacity_max']:.3g}], {best[f'vs_{reference}']:.2f}x,"
            f" {best['noise']}. The bottleneck was {kind}; {lever} lifted it."
        )
        out = {"bottleneck": kind, "lifted_by": lever, "best": best}
    else:
        text = f"Capacity under the SLO: {ref_txt}; no configuration beat it beyond the noise."
        out = {"bottleneck": "not identified", "lifted_by": None, "best": ref}
    if parts:
        text = parts[0][0].upper() + parts[0][1:] + ". " + text
    if any(r["capped"] for r in rank):
        text += " (Some searches reached their maximum rate: those capacities are lower bounds.)"
    out["text"] = text
    return out


def c14_verdict(v: dict, rank: list[dict], evidence: str, speed_meaningful: bool) -> dict:
    """C14 (vLLM's default serves a small model at its capacity), from ``verdict``'s outcome.

    refuted: a configuration serves more beyond the noise (the figure says how much more);
    confirmed: none does, over at least three starts a side; inconclusive: fewer starts.
    """

    spread_txt = "; ".join(
        f"{r['config']}: {r['capacity_min']:.3g}-{r['capacity_max']:.3g} req/s (n={r['capacity_n']})"
        for r in rank
    )
    note = (
        ""
        if speed_meaningful
        else "CPU with a tiny model: the host is the device, replicas share two cores."
    )
    if v.get("lifted_by"):
        b = v["best"]
        fig = (
            f"{b['config']} serves {b['vs_default']:.2f}x the default's capacity under the SLO"
            f" ({b['capacity_median']:.3g} vs the default's req/s, {b['noise']})"
        )
        ref = next((r for r in rank if r["config"] == "default"), None)
        if ref:
            fig = fig.replace("the default's req/s", f"{ref['capacity_median']:.3g} req/s")
        return claims.verdict("C14", "refuted", fig, evidence, spread=spread_txt, note=note)
    enough = all(r["capacity_n"] >= 3 for r in rank) and len(rank) > 1
    word = "confirmed" if enough else "inconclusive"
    fig = v["text"]
    if not enough:
        note = (
            note + " Fewer than three starts per configuration: no gap can be beyond the noise."
        ).strip()
    return claims.verdict("C14", word, fig, evidence, spread=spread_txt, note=note)


RATE_COLUMNS = (
    "config",
    "repeat",
    "offered_rps",
    "window_s",
    "slo_attainment_pct",
    "keep_up_requests",
    "in_system_middle",
    "in_system_last",
    "chunk_gap_p99_ms",
    "slo_holds_first_4s",
    "holds",
    "why_not_sustained",
)


def tradeoff_figures(
    results: list[dict],
    slo: dict | None = None,
    chosen: str | None = None,
    numbers: tuple = ("4.3", "4.4"),
) -> list:
    """04's Pareto view: each configuration's sustained capacity against the TTFT p99 at it and
    against the chunk-gap p99 at it (what a reader of the stream sees), each where measured.
    Medians over starts; ``chosen`` starred; the limits of ``slo`` drawn (None: the SLO the
    points were judged by, where they keep it)."""
    if slo is None:
        slo = next((p["slo"] for p in results if isinstance(p.get("slo"), dict)), None)
    slo = slo or {}
    points = search.measured_capacities(results)
    views = [
        (latency, search.LATENCY_WORDS[latency], slo.get(bound))
        for latency, bound in (("ttft_p99_ms", "ttft_ms"), ("chunk_gap_p99_ms", "itl_ms"))
        if any(p.get(latency) is not None for p in points.values())  # none: nothing to draw
    ]
    return [
        search.pareto_figure(
            points,
            latency,
            chosen=chosen,
            title=f"Figure {n}. Sustained capacity against the {word} at it (median over starts)",
            limit_ms=limit,
        )
        for n, (latency, word, limit) in zip(numbers, views, strict=False)
    ]


def rates_frame(results: list[dict]):
    """Every rate every search judged, by the sustained rule (``tunebook.core.sustained``): its
    window, the SLO share, how much of what arrived completed, whether the system was still
    filling up, and what a 4-s window would have said (the SLO over its first 4 s)."""
    import pandas as pd

    rows = [
        {"config": r.get("config"), "repeat": r.get("repeat"), **x}
        for r in results
        for x in r.get("per_rate") or []
        if not x.get("superseded")
    ]
    df = pd.DataFrame(rows)
    return df[[c for c in RATE_COLUMNS if c in df.columns]] if len(df) else df


def short_window_text(rates) -> str:
    """The rates a 4-s window would have passed that the sustained rule failed, in words."""
    if not len(rates) or "slo_holds_first_4s" not in rates:
        return "no rate was judged on a window longer than 4 s"
    fooled = rates[(rates["slo_holds_first_4s"] == True) & (rates["holds"] == False)]  # noqa: E712
    if not len(fooled):
        return (
            "no rate passed its first 4 s and then failed: the short windows would have agreed here"
        )
    parts = [
        f"{r['config']} r{r['repeat']} at {r['offered_rps']:.4g} req/s ({r['why_not_sustained']})"
        for _, r in fooled.iterrows()
    ]
    return f"{len(fooled)} rate(s) met the SLO over their first 4 s but did not hold: " + "; ".join(
        parts
    )


def client_text(cap) -> str:
    """Whether the client kept its schedule (p99 send lag within 20 ms) in every search."""
    if not len(cap):
        return "no searches ran"
    kept = bool(cap["client_kept_schedule"].fillna(False).all())
    return (
        f"client kept its schedule in every search: {kept}"
        f" (worst p99 send lag {cap['lag_p99_ms_max'].max():.3g} ms)"
    )


# --------------------------------------------------------------------------- plots
def _replicas(config: str) -> int:
    """N of a ``replicas=N...`` configuration name (1 for any other)."""
    import re

    m = re.search(r"replicas=(\d+)", str(config))
    return int(m.group(1)) if m else 1


def machine_bound(rank: list[dict], platform: str | None) -> list[str]:
    """The configurations that lost because of the machine: replicas below the default on a CPU,
    where every replica, the router and the load generator share its few cores."""
    if platform != "cpu":
        return []
    return [
        r["config"] for r in rank if _replicas(r["config"]) > 1 and (r.get("vs_default") or 0) < 1
    ]


def machine_note(rank: list[dict], platform: str | None, cpu_count: int | None) -> str:
    """Why replicas lost here, where the machine is the reason (``machine_bound``); "" where
    that does not apply."""
    lost = machine_bound(rank, platform)
    if not lost:
        return ""
    cores = f"{cpu_count} cores" if cpu_count else "a few cores"
    ratios = {r["config"]: r.get("vs_default") or 0 for r in rank}
    each = ", ".join(f"{c} ({ratios[c]:.2f}x the default)" for c in lost)
    return (
        f"lost because of the machine: {each} ran {'its' if len(lost) == 1 else 'their'} servers,"
        f" vllm-router and the load generator on one CPU with {cores}, all sharing them; on a GPU"
        " each replica has its own share of the device"
    )


def capacity_figure(
    rank: list[dict],
    title: str = "Capacity under the SLO",
    platform: str | None = None,
    cpu_count: int | None = None,
):
    """Sustained capacity per configuration (median bar, min-max over starts), each in its
    colour of the run, labelled with its ratio to the default. ``platform`` and ``cpu_count``
    (default: this machine's) let the chart say when replicas lost because of the machine
    (replicas sharing a CPU's two cores)."""
    import os

    import plotly.graph_objects as go

    # plotly (plots imports it) only where a chart is drawn: the module's text helpers go without
    if platform is None:
        # this machine's device, asked only when the caller does not say (nvidia-smi)
        platform = device_memory_bytes()[0]
        cpu_count = cpu_count or os.cpu_count()
    note = machine_note(rank, platform, cpu_count)
    lost = machine_bound(rank, platform)
    names = [r["config"] for r in rank]
    med = [r["capacity_median"] for r in rank]
    colours = config_colours(names)
    text = [
        f"{r.get('vs_default', 1):.2f}x" + (" (the machine)" if r["config"] in lost else "")
        for r in rank
    ]
    fig = go.Figure(
        go.Bar(
            x=names,
            y=med,
            marker_color=[colours[n] for n in names],
            error_y={
                "type": "data",
                "symmetric": False,
                "array": [r["capacity_max"] - r["capacity_median"] for r in rank],
                "arrayminus": [r["capacity_median"] - r["capacity_min"] for r in rank],
            },
            text=text,
            name="capacity",
        )
    )
    import textwrap

    sub = "<br>".join(f"<sup>{line}</sup>" for line in textwrap.wrap(note, 120))
    fig.update_layout(
        title=title + (f"<br>{sub}" if note else ""),
        xaxis_title="configuration",
        yaxis_title="capacity (req/s), median and min-max over starts",
        template="plotly_white",
    )
    if note:  # room for the note's lines between the title and the plot
        lines = sub.count("<br>") + 1
        fig.update_layout(margin={"t": 90 + 26 * lines}, height=450 + 26 * lines)
    return fig


def curve_figure(curves, title: str = "Goodput against the offered rate"):
    import plotly.graph_objects as go

    # plotly (plots imports it) only where a chart is drawn: the module's text helpers go without
    fig = go.Figure()
    if len(curves):
        colours = config_colours([str(c) for c in dict.fromkeys(curves["config"])])
        for (cfg, rep), g in curves.groupby(["config", "repeat"]):
            g = g.sort_values("offered_rps")
            fig.add_trace(
                go.Scatter(
                    x=g["offered_rps"],
                    y=g["goodput_rps"],
                    mode="lines+markers",
                    name=f"{cfg} r{rep}",
                    legendgroup=str(cfg),
                    line={"color": colours[str(cfg)]},
                )
            )
        lo = float(curves["offered_rps"][curves["offered_rps"] > 0].min())
        hi = float(curves["offered_rps"].max())
        fig.add_trace(
            go.Scatter(
                x=[lo, hi],
                y=[lo, hi],
                mode="lines",
                name="goodput = offered",
                line={"dash": "dot", "color": "#999999"},
            )
        )
        good = [v for v in curves["goodput_rps"] if v and v > 0]
        fig.update_xaxes(**log_ticks(curves["offered_rps"], measured=False))
        fig.update_yaxes(**log_ticks([*good, lo, hi], measured=False))
    else:
        fig.update_xaxes(type="log")
        fig.update_yaxes(type="log")
    fig.update_layout(
        title=title,
        xaxis_title="offered rate (req/s, Poisson)",
        yaxis_title="goodput (req/s within the SLO)",
        template="plotly_white",
        showlegend=True,
    )
    return fig
