"""04's search: rank every candidate deployment by its predicted capacity, measure the few that
could win, and keep the prediction's error as a result.

1. ``rank``: every candidate of the grid, those that do not fit the card or the host set aside
   with the reason (never started), the rest by predicted sustained capacity
   (``tunebook.core.capacity_model``).
2. ``pick``: what gets a first engine start: the top few, vLLM's default, and one candidate the
   model ranks low (a check on the model). Each search starts at its predicted capacity
   (``search_starts``).
3. ``halving_step`` / ``successive_halving``: further starts only where the top is undecided.
   Each round the contenders (the candidates with the most starts) are ranked by their median;
   the race stops when the best's worst start beats the runner-up's best over enough starts for
   the noise rule to call a gap (``MIN_STARTS``, 3: ``metrics.chance_apart``), when the two
   medians are under ``metrics.MIN_GAP`` (3%) apart, or when the contenders have ``max_starts``;
   otherwise the better half (at least two, and the default: the reference the choice must beat)
   gets one more start each.
4. ``prediction_errors``: predicted against measured capacity for every measured candidate, the
   mean absolute percentage error, and the candidates the model got wrong by more than 15%, with
   the resource it said binds. ``error_figure`` and ``pareto_figure`` draw them.
"""

from __future__ import annotations

import math
import statistics

import plotly.graph_objects as go

from tunebook.core.capacity_model import Calibration, Candidate, Traffic, fits, predict
from tunebook.core.metrics import ALPHA, MIN_GAP, chance_apart, compare
from tunebook.topics.plots import config_colours, log_ticks

ERROR_BOUND = 0.15  # a prediction more than 15% off the measured capacity is wrong (issue 41)
REFERENCE = "default"
# The fewest starts a side at which two disjoint ranges can be beyond the noise (3: p = 0.1).
MIN_STARTS = next(n for n in range(1, 10) if chance_apart(n, n) <= ALPHA)


# --------------------------------------------------------------------------- rank and pick
def rank(
    candidates: list[Candidate] | dict[str, Candidate], calibration: Calibration, scenario: Traffic
) -> list[dict]:
    """One row per candidate (a list, each named by its knobs, or named ones): those that fit by
    predicted capacity (best first; on a tie the smaller deployment), then those that do not,
    with the reason and no prediction."""
    named = (
        candidates.items() if isinstance(candidates, dict) else [(c.name, c) for c in candidates]
    )
    fitting, unfit = [], []
    for name, c in named:
        reason = fits(c, calibration)
        row = {"config": name, "candidate": c, "fits": reason is None, "reason": reason}
        if reason:
            unfit.append({**row, "predicted_rps": None, "binding": None})
            continue
        p = predict(c, calibration, scenario).to_dict()
        p["predicted_rps"] = p.pop("capacity_rps")
        p["config"] = name  # a given configuration keeps its own name
        fitting.append({**row, **p})
    fitting.sort(
        key=lambda r: (
            -r["predicted_rps"],
            r["candidate"].replicas * r["candidate"].api_server_count,
            r["config"],
        )
    )
    for i, r in enumerate(fitting, start=1):
        r["rank"] = i
    return fitting + [{**r, "rank": None} for r in unfit]


def pick(ranked: list[dict], top: int = 4, check: bool = True) -> list[dict]:
    """What gets a first start: the ``top`` candidates by prediction, vLLM's default, and (with
    ``check``) the lowest-ranked one with a positive prediction, a check that the model's "low"
    is low. Only candidates that fit; each row says why it was picked."""
    fitting = [r for r in ranked if r["fits"]]
    n = len(fitting)
    out: dict[str, dict] = {}
    for r in fitting[:top]:
        out[r["config"]] = {**r, "why": f"ranked {r['rank']} of {n} by prediction"}
    ref = next((r for r in fitting if r["config"] == REFERENCE), None)
    if ref is not None and REFERENCE not in out:
        out[REFERENCE] = {**ref, "why": f"vLLM's default (ranked {ref['rank']} of {n})"}
    if check:
        # strictly below the top's prediction: a tie with it would check nothing
        best = fitting[0]["predicted_rps"] if fitting else 0
        low = [
            r
            for r in fitting
            if r["config"] not in out and 0 < r["predicted_rps"] < best * (1 - MIN_GAP)
        ]
        if low:
            r = low[-1]
            out[r["config"]] = {**r, "why": f"check on the model: ranked {r['rank']} of {n}"}
    return list(out.values())


def search_starts(rows: list[dict]) -> dict[str, float]:
    """04's ``search_start``: each picked candidate's search begins at its predicted capacity."""
    return {r["config"]: round(float(r["predicted_rps"]), 3) for r in rows if r["predicted_rps"]}


# --------------------------------------------------------------------------- successive halving
def halving_step(
    measured: dict[str, list[float]], max_starts: int = 3, reference: str = REFERENCE
) -> dict:
    """Given each candidate's capacity per engine start so far, is the top decided, and who gets
    another start? Returns ``decided`` (bool), ``best``, ``runner_up``, ``why`` and ``next``
    (names to start once more; empty when the race is over)."""
    most = max((len(v) for v in measured.values()), default=0)
    contenders = {k: v for k, v in measured.items() if len(v) == most and most > 0}
    order = sorted(contenders, key=lambda k: (-statistics.median(contenders[k]), k))
    out = {"decided": False, "best": order[0] if order else None, "runner_up": None, "next": []}
    if len(order) < 2:
        return {**out, "decided": bool(order), "why": "one candidate left"}
    best, second = order[0], order[1]
    out["runner_up"] = second
    a, b = contenders[best], contenders[second]
    gap = statistics.median(a) / statistics.median(b) - 1 if statistics.median(b) else math.inf
    if most >= MIN_STARTS and min(a) > max(b):
        why = f"{best}'s worst start ({min(a):.4g}) beats {second}'s best ({max(b):.4g})"
        return {**out, "decided": True, "why": why}
    if most >= 2 and abs(gap) < MIN_GAP:
        why = (
            f"{best} and {second} are {100 * gap:.2g}% apart, under the {100 * MIN_GAP:g}%"
            " that matters"
        )
        return {**out, "decided": True, "why": why}
    if most >= max_starts:
        why = f"undecided after {most} starts each: {compare(b, a)['noise']}"
        return {**out, "why": why}
    keep = order[: max(2, math.ceil(len(order) / 2))]
    if reference in contenders and reference not in keep:
        keep.append(reference)  # the choice must beat it by the noise rule: it keeps its starts
    return {**out, "next": keep, "why": f"{len(keep)} of {len(order)} go on to start {most + 1}"}


def successive_halving(
    names: list[str], measure, max_starts: int = 3, reference: str = REFERENCE
) -> dict:
    """Run the race: one start each, then ``halving_step`` until it stops. ``measure(name)`` is
    one engine start's sustained capacity (None where the SLO held at no rate: counts as 0).
    Returns the last step's verdict with ``measured`` and ``starts`` (engine starts spent)."""
    measured = {n: [float(measure(n) or 0.0)] for n in names}
    while True:
        step = halving_step(measured, max_starts, reference)
        if not step["next"]:
            break
        for n in step["next"]:
            measured[n].append(float(measure(n) or 0.0))
    return {**step, "measured": measured, "starts": sum(len(v) for v in measured.values())}


# --------------------------------------------------------------------------- the model's error
def mape(pairs: list[tuple[float, float]]) -> float:
    """Mean absolute percentage error of (predicted, measured) pairs, in %; a measured 0 has no
    percentage and is left out (NaN where nothing is left)."""
    errs = [abs(p - m) / m for p, m in pairs if m]
    return 100.0 * statistics.fmean(errs) if errs else float("nan")


def prediction_errors(
    ranked: list[dict],
    measured: dict[str, list[float]],
    lower_bounds: set | None = None,
    steps: dict[str, tuple] | None = None,
) -> dict:
    """Predicted against measured capacity for every measured candidate (``rank``'s rows and
    each candidate's capacity per start): ``rows``, ``mape_pct``, ``wrong`` (more than
    ``ERROR_BOUND`` off, with the resource the model said binds) and a ``text`` line.

    Two kinds of row are kept but left out of the mean and of ``wrong``, each named in the text:
    ``lower_bounds``, candidates whose search stopped at its cap (the capacity is at least what
    was measured); and, from ``steps`` (name -> (capacity, first failing rate)), candidates whose
    prediction falls inside the search's last step where that step is wider than the bound: a
    search started at the prediction that held there and failed at the next rate measures the
    prediction itself, so its 0% says only that the truth lies in that step."""
    lower_bounds, steps = set(lower_bounds or ()), steps or {}
    by = {r["config"]: r for r in ranked}
    rows = []
    for name, vals in measured.items():
        r = by.get(name)
        if r is None or not vals or r.get("predicted_rps") is None:
            continue
        med = statistics.median(vals)
        pred = float(r["predicted_rps"])
        err = (pred - med) / med if med else math.inf
        cap, fail = steps.get(name) or (None, None)
        coarse = bool(cap and fail and cap <= pred < fail and fail / cap - 1 > ERROR_BOUND)
        left_out = name in lower_bounds or coarse
        rows.append(
            {
                "config": name,
                "predicted_rps": pred,
                "measured_median": med,
                "measured_min": min(vals),
                "measured_max": max(vals),
                "n": len(vals),
                "error_pct": 100.0 * err,
                "wrong": abs(err) > ERROR_BOUND and not left_out,
                "lower_bound": name in lower_bounds,
                "within_step": coarse,
                "step_pct": 100.0 * (fail / cap - 1) if cap and fail else None,
                "binding": r.get("binding"),
                "batch_limit": r.get("batch_limit"),
            }
        )
    for row in rows:
        row["why"] = (
            f"predicted {row['predicted_rps']:.4g} req/s, measured {row['measured_median']:.4g}"
            f" ({row['error_pct']:+.0f}%); the model had {row['binding']} binding"
            f" (batch limited by {row['batch_limit']})"
            if row["wrong"]
            else ""
        )
    counted = [r for r in rows if not (r["lower_bound"] or r["within_step"])]
    err = mape([(r["predicted_rps"], r["measured_median"]) for r in counted])
    wrong = [r for r in rows if r["wrong"]]
    text = _errors_text(rows, counted, err, wrong)
    return {"rows": rows, "mape_pct": err, "wrong": wrong, "text": text}


def _errors_text(rows: list[dict], counted: list[dict], err: float, wrong: list[dict]) -> str:
    """``prediction_errors``' line: the mean error, and each row left out of it and why."""
    zero = [r["config"] for r in counted if not r["measured_median"]]
    text = (
        f"predicted capacity {'within' if err <= 100 * ERROR_BOUND else 'NOT within'}"
        f" {100 * ERROR_BOUND:g}%: mean absolute error {err:.1f}% over {len(counted) - len(zero)}"
        " measured candidates"
        if counted and not math.isnan(err)
        else "no measured candidate resolves the model's error"
    )
    if zero:
        text += f" ({', '.join(zero)} held no rate: left out of the mean)"
    capped = [r["config"] for r in rows if r["lower_bound"]]
    if capped:
        text += f" ({', '.join(capped)}: the search stopped at its cap, a lower bound: left out)"
    inside = [r for r in rows if r["within_step"]]
    if inside:
        text += (
            " ("
            + ", ".join(
                f"{r['config']}: held at its prediction, failed {r['step_pct']:.0f}% above it"
                for r in inside
            )
            + ": the truth lies in that step, which the search did not split; left out)"
        )
    if wrong:
        text += "; wrong by more than 15%: " + "; ".join(
            f"{r['config']}: {r['why']}" for r in wrong
        )
    return text


def measured_capacities(results: list[dict]) -> dict[str, dict]:
    """From 04's capacity points: per configuration, the capacity of every ok start (0 where the
    SLO held at no rate) and the median TTFT p99 and chunk-gap p99 at the capacity."""
    out: dict[str, dict] = {}
    for p in results:
        if p.get("status") != "ok":
            continue
        m = p.get("metrics") or {}
        e = out.setdefault(
            str(p.get("config")), {"capacity": [], "ttft": [], "gap": [], "capped": False}
        )
        e["capacity"].append(float(m.get("capacity_rps") or 0.0))
        e["capped"] = e["capped"] or bool(m.get("capacity_capped"))
        if m.get("first_failing_rps"):
            e.setdefault("failing", []).append(float(m["first_failing_rps"]))
        for key, col in (
            ("ttft", "ttft_p99_ms_at_capacity"),
            ("gap", "chunk_gap_p99_ms_at_capacity"),
        ):
            if m.get(col) is not None:
                e[key].append(float(m[col]))
    return {
        name: {
            "capacity": e["capacity"],
            "capacity_rps": statistics.median(e["capacity"]),
            "capped": e["capped"],  # a search stopped at its max_rps: a lower bound
            "first_failing_rps": statistics.median(e["failing"]) if e.get("failing") else None,
            "ttft_p99_ms": statistics.median(e["ttft"]) if e["ttft"] else None,
            "chunk_gap_p99_ms": statistics.median(e["gap"]) if e["gap"] else None,
        }
        for name, e in out.items()
    }


# --------------------------------------------------------------------------- figures
def _roles(chosen: str | None, article: str | None) -> dict[str, str]:
    return {k: v for k, v in ((chosen, "chosen"), (article, "article")) if k}


def error_figure(errors: dict, title: str = "Predicted against measured capacity"):
    """Measured capacity (median, min-max over starts) against predicted, one marker per
    candidate in its colour of the run, with measured = predicted and the +-15% band."""
    rows = errors["rows"]
    names = [r["config"] for r in rows]
    colours = config_colours(names)
    fig = go.Figure()
    for r in rows:
        fig.add_scatter(
            x=[r["predicted_rps"]],
            y=[r["measured_median"]],
            mode="markers+text",
            name=r["config"],
            text=[f"{r['error_pct']:+.0f}%"],
            textposition="top center",
            marker={
                "color": colours[r["config"]],
                "size": 10,
                "symbol": "x" if r["wrong"] else "circle",
            },
            error_y={
                "type": "data",
                "symmetric": False,
                "array": [r["measured_max"] - r["measured_median"]],
                "arrayminus": [r["measured_median"] - r["measured_min"]],
            },
        )
    values = [
        v for r in rows for v in (r["predicted_rps"], r["measured_min"], r["measured_max"]) if v > 0
    ]
    if values:
        lo, hi = min(values) / 1.2, max(values) * 1.2
        for k, label, dash in (
            (1.0, "measured = predicted", "dot"),
            (1 - ERROR_BOUND, f"-{100 * ERROR_BOUND:g}%", "dash"),
            (1 + ERROR_BOUND, f"+{100 * ERROR_BOUND:g}%", "dash"),
        ):
            fig.add_scatter(
                x=[lo, hi],
                y=[k * lo, k * hi],
                mode="lines",
                name=label,
                line={"dash": dash, "color": "#999999"},
            )
        if hi / lo > 10:  # capacities a decade or more apart: log axes, ticked to be read
            fig.update_xaxes(**log_ticks(values, measured=False))
            fig.update_yaxes(**log_ticks(values, measured=False))
    mape_txt = (
        ""
        if math.isnan(errors["mape_pct"])
        else f" (mean absolute error {errors['mape_pct']:.1f}%)"
    )
    fig.update_layout(
        title=title + mape_txt,
        xaxis_title="predicted capacity (req/s)",
        yaxis_title="measured capacity (req/s), median and min-max over starts",
        template="plotly_white",
        showlegend=True,
    )
    return fig


# The latencies a Pareto chart can set capacity against, as its axis names them.
LATENCY_WORDS = {"ttft_p99_ms": "TTFT p99", "chunk_gap_p99_ms": "chunk-gap p99"}


def pareto_front(points: dict[str, dict], latency: str = "ttft_p99_ms") -> list[str]:
    """The candidates no other beats on both: capacity at least as high and ``latency`` at
    least as low, one strictly; by latency, lowest first."""
    ok = {
        n: p
        for n, p in points.items()
        if p.get(latency) is not None and p.get("capacity_rps") is not None
    }

    def dominated(n: str) -> bool:
        a = ok[n]
        return any(
            b["capacity_rps"] >= a["capacity_rps"]
            and b[latency] <= a[latency]
            and (b["capacity_rps"] > a["capacity_rps"] or b[latency] < a[latency])
            for m, b in ok.items()
            if m != n
        )

    return sorted((n for n in ok if not dominated(n)), key=lambda n: ok[n][latency])


def pareto_figure(
    points: dict[str, dict],
    latency: str = "ttft_p99_ms",
    chosen: str | None = None,
    article: str | None = None,
    title: str = "Sustained capacity against latency",
    limit_ms: float | None = None,
):
    """Each measured candidate's sustained capacity against its ``latency`` at that capacity
    (``measured_capacities``), the Pareto front joined, vLLM's default and the article's
    configuration in their colours, the chosen one highlighted; ``limit_ms``: the SLO's bound on
    that latency, drawn (how near its limit each candidate runs at its capacity)."""
    front = pareto_front(points, latency)
    names = [n for n, p in points.items() if p.get(latency) is not None]
    colours = config_colours(names, _roles(chosen, article))
    fig = go.Figure()
    for n in names:
        p = points[n]
        star = n == chosen
        fig.add_scatter(
            x=[p[latency]],
            y=[p["capacity_rps"]],
            mode="markers+text",
            name=n + (" (chosen)" if star else ""),
            text=[n],
            textposition="top center",
            marker={
                "color": colours[n],
                "size": 16 if star else 10,
                "symbol": "star" if star else "circle",
            },
        )
    if len(front) > 1:  # one candidate alone on the front: no line to draw
        fig.add_scatter(
            x=[points[n][latency] for n in front],
            y=[points[n]["capacity_rps"] for n in front],
            mode="lines",
            name="Pareto front",
            line={"dash": "dash", "color": "#999999", "shape": "hv"},
        )
    word = LATENCY_WORDS.get(latency, latency)
    if limit_ms:
        fig.add_vline(
            x=limit_ms,
            line={"dash": "dot", "color": "#cf222e"},
            annotation_text=f"SLO: {limit_ms:g} ms",
            annotation_position="top left",
        )
    fig.update_layout(
        title=title,
        xaxis_title=f"{word} at the capacity (ms)",
        yaxis_title="sustained capacity (req/s, median over starts)",
        template="plotly_white",
        showlegend=True,
    )
    # from zero: capacities compared by eye as ratios, and room for the labels of the leftmost
    fig.update_xaxes(rangemode="tozero")
    fig.update_yaxes(rangemode="tozero")
    return fig
