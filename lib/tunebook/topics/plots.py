"""Plotly figures from sweep DataFrames. Functions return figures; notebooks display them.

Every chart of a run gives a configuration the same colour (``config_colours``): vLLM's default,
the article's configuration and the chosen one have their own, any other name one of its own;
log axes are ticked at the values measured, or at 1-2-5 steps (``log_ticks``).
"""

from __future__ import annotations

import math
import zlib

import plotly.graph_objects as go

from tunebook.engine.vllm_http import KV_USAGE, RUNNING, WAITING

# --------------------------------------------------------------------------- colours and ticks
# The three configurations every run compares, in the same colour in every chart.
ROLE_COLOURS = {
    "default": "#6c757d",  # vLLM's defaults: grey, the reference
    "chosen": "#2a9d8f",  # the configuration 05 chose: green
    "article": "#e76f51",  # the article's configuration: orange-red
}
# Any other configuration (a sweep's values, 04's levers): one of these, from its name.
PALETTE = (
    "#457b9d",
    "#8338ec",
    "#f4a261",
    "#1d3557",
    "#d62828",
    "#3a86ff",
    "#6a994e",
    "#ff006e",
    "#bc6c25",
    "#0096c7",
    "#7209b7",
    "#b5838d",
)


def config_colours(names, roles: dict | None = None) -> dict[str, str]:
    """A colour per configuration, the same in every chart of a run.

    "default", "chosen" and "article" (or a name that ``roles`` maps to one of them, such as a
    sweep's reference value) get theirs; any other name gets a palette colour picked by a stable
    hash of the name, so it keeps it from chart to chart; where two names of one chart would
    share a colour, the later takes the next free one.
    """
    roles = roles or {}
    out: dict[str, str] = {}
    used: set[str] = set()
    rest = []
    for n in dict.fromkeys(str(x) for x in names):
        role = roles.get(n, n)
        if role in ROLE_COLOURS:
            out[n] = ROLE_COLOURS[role]
            used.add(out[n])
        else:
            rest.append(n)
    for n in rest:
        i = zlib.crc32(n.encode()) % len(PALETTE)
        for k in range(len(PALETTE)):
            c = PALETTE[(i + k) % len(PALETTE)]
            if c not in used:
                break
        else:
            c = PALETTE[i]  # more names than colours: share
        out[n] = c
        used.add(c)
    return out


def tick_text(v: float) -> str:
    """A tick label a reader reads at a glance: 32, 0.5, 2k, 1.5M, 16,384."""
    for unit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= unit:
            q = v / unit
            return f"{q:g}{suffix}" if q == round(q, 1) else f"{v:,.0f}"
    return f"{v:.3g}"


def log_ticks(values, measured: bool = True, most: int = 10) -> dict:
    """Tick values and labels for a log axis (``fig.update_xaxes(**log_ticks(xs))``).

    ``measured``: ticks at the values themselves (block sizes 16, 32, 128) where there are at most
    ``most`` of them; otherwise, and for a continuous quantity, at 1-2-5 steps over their range.
    Plotly's own log ticks label the minor steps with bare digits ("3 4 5 ... 9 100 2").
    """
    xs = sorted({float(v) for v in values if v is not None and not _nan(v) and float(v) > 0})
    if not xs:
        return {"type": "log"}
    if measured and len(xs) <= most:
        ticks = xs
    else:
        lo, hi = xs[0], xs[-1]
        ticks = []
        for d in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1):
            for m in (1, 2, 5):
                v = m * 10.0**d
                if lo / 1.5 <= v <= hi * 1.5:
                    ticks.append(v)
        if len(ticks) > most:  # many decades: the decades alone
            ticks = [v for v in ticks if f"{v:g}".lstrip("-")[0] == "1"]
    return {"type": "log", "tickvals": ticks, "ticktext": [tick_text(v) for v in ticks]}


def _nan(v) -> bool:
    try:
        return math.isnan(float(v))
    except (TypeError, ValueError):
        return True


# --------------------------------------------------------------------------- figures
def _agg(df, x: str, y: str, color: str | None):
    keys = [x] + ([color] if color else [])
    ok = df[df["status"] == "ok"] if "status" in df else df
    g = ok.groupby(keys, sort=False)[y]
    return g.median().reset_index(), g.min().reset_index(), g.max().reset_index()


def bar_with_spread(
    df, x: str, y: str, color: str | None = None, title: str = "", yaxis: str | None = None
):
    """Median bar per group with min-max whiskers (repeats over engine starts)."""
    med, lo, hi = _agg(df, x, y, color)
    fig = go.Figure()
    groups = [None] if not color else list(dict.fromkeys(med[color]))
    colours = config_colours([str(g) for g in groups]) if color else {}
    for gname in groups:
        sel = (med[color] == gname) if color else slice(None)
        m, mn, mx = med[sel], lo[sel], hi[sel]
        if color:
            marker = {"color": colours[str(gname)]}
        elif x == "config":  # one bar per configuration: each in its colour
            marker = {"color": list(config_colours(m[x].astype(str)).values())}
        else:
            marker = None
        fig.add_bar(
            x=m[x].astype(str),
            y=m[y],
            name=str(gname) if color else y,
            marker=marker,
            error_y=dict(
                type="data",
                symmetric=False,
                array=(mx[y] - m[y]).tolist(),
                arrayminus=(m[y] - mn[y]).tolist(),
            ),
        )
    fig.update_layout(
        title=title, barmode="group", xaxis_title=x, yaxis_title=yaxis or y, template="plotly_white"
    )
    if color:  # one group is a series too: the legend names it
        fig.update_layout(showlegend=True, legend_title_text=color)
    return fig


def timeline(samples: list[dict], title: str = "engine state during the run"):
    """KV usage and queue depths over time, from a point's sampled gauges."""
    fig = go.Figure()
    t = [s["t_s"] for s in samples]
    for key, name in (
        (KV_USAGE, "KV cache usage (fraction)"),
        (RUNNING, "running"),
        (WAITING, "waiting"),
    ):
        fig.add_scatter(
            x=t,
            y=[s.get(key, 0) for s in samples],
            name=name,
            mode="lines",
            yaxis="y" if key.endswith("perc") else "y2",
        )
    fig.update_layout(
        title=title,
        xaxis_title="time (s)",
        template="plotly_white",
        yaxis=dict(title="KV usage", range=[0, 1]),
        yaxis2=dict(title="requests", overlaying="y", side="right"),
    )
    return fig


def predicted_vs_measured(
    df,
    predicted: str,
    measured: str,
    label: str,
    title: str = "",
    log: bool = False,
    unit: str = "",
):
    """Measured (engine-reported) against predicted values, one marker per row, with y = x."""
    ok = df.dropna(subset=[predicted, measured])
    fig = go.Figure()
    fig.add_scatter(
        x=ok[predicted],
        y=ok[measured],
        mode="markers+text",
        text=ok[label].astype(str),
        textposition="top center",
        name="engines",
    )
    if len(ok):
        lo = float(min(ok[predicted].min(), ok[measured].min()))
        hi = float(max(ok[predicted].max(), ok[measured].max()))
        fig.add_scatter(
            x=[lo, hi],
            y=[lo, hi],
            mode="lines",
            name="measured = predicted",
            line=dict(dash="dot", color="grey"),
        )
    suffix = f" ({unit})" if unit else ""
    fig.update_layout(
        title=title,
        xaxis_title=f"predicted{suffix}",
        yaxis_title=f"engine{suffix}",
        template="plotly_white",
    )
    if log:
        fig.update_xaxes(**log_ticks([*ok[predicted], *ok[measured]], measured=False))
        fig.update_yaxes(**log_ticks([*ok[predicted], *ok[measured]], measured=False))
    return fig


def panels(df, x: str, ys: list, color: str | None = None, title: str = "", log_x: bool = False):
    """Several metrics against one x, side by side: median per group with min-max whiskers.

    ``ys`` is a list of column names or (column, axis title) pairs.
    """
    from plotly.subplots import make_subplots

    ys = [(y, y) if isinstance(y, str) else tuple(y) for y in ys]
    fig = make_subplots(rows=1, cols=len(ys), subplot_titles=[t for _, t in ys])
    for i, (y, _) in enumerate(ys, start=1):
        med, lo, hi = _agg(df, x, y, color)
        groups = [None] if not color else list(dict.fromkeys(med[color]))
        colours = config_colours([str(g) for g in groups])
        for gname in groups:
            sel = (med[color] == gname) if color else slice(None)
            m, mn, mx = med[sel], lo[sel], hi[sel]
            fig.add_scatter(
                x=m[x],
                y=m[y],
                mode="lines+markers",
                name=str(gname) if color else y,
                legendgroup=str(gname),
                showlegend=(i == 1 and color is not None),
                line=dict(color=colours[str(gname)]),
                error_y=dict(
                    type="data",
                    symmetric=False,
                    array=(mx[y] - m[y]).tolist(),
                    arrayminus=(m[y] - mn[y]).tolist(),
                ),
                row=1,
                col=i,
            )
        ticks = log_ticks(med[x]) if log_x else {}
        fig.update_xaxes(title_text=x, row=1, col=i, **ticks)
    fig.update_layout(title=title, template="plotly_white", height=380)
    if color:
        fig.update_layout(legend_title_text=color)
    return fig


def lines(
    df,
    x: str,
    series: dict[str, str],
    title: str = "",
    xaxis: str | None = None,
    yaxis: str | None = None,
    dashed: tuple[str, ...] = (),
    log_x: bool = False,
):
    """One line per column: ``series`` maps a legend label to a column of ``df`` (one row per x).

    Labels in ``dashed`` are drawn dashed (reference lines: arithmetic, floors, claims).
    """
    fig = go.Figure()
    d = df.sort_values(x)
    for label, col in series.items():
        fig.add_scatter(
            x=d[x],
            y=d[col],
            name=label,
            mode="lines+markers",
            line=dict(dash="dash") if label in dashed else None,
        )
    fig.update_layout(
        title=title, xaxis_title=xaxis or x, yaxis_title=yaxis, template="plotly_white"
    )
    if log_x:  # ticks at the values measured (block sizes), not plotly's "3 4 5 ... 100 2"
        fig.update_xaxes(**log_ticks(d[x]))
    return fig


def scatter_with_curves(
    points: dict,
    curves: dict | None = None,
    title: str = "",
    xaxis: str = "",
    yaxis: str = "",
    log_x: bool = False,
    log_y: bool = False,
    dashed: tuple[str, ...] = (),
):
    """Measured points (name -> (x, y)) with model curves (name -> (x, y)) over them."""
    fig = go.Figure()
    for name, (xs, ys) in points.items():
        fig.add_scatter(
            x=list(xs), y=list(ys), name=name, mode="markers", marker=dict(size=7, opacity=0.75)
        )
    for name, (xs, ys) in (curves or {}).items():
        fig.add_scatter(
            x=list(xs),
            y=list(ys),
            name=name,
            mode="lines",
            line=dict(dash="dash" if name in dashed else "solid"),
        )
    fig.update_layout(title=title, xaxis_title=xaxis, yaxis_title=yaxis, template="plotly_white")
    every = [*points.values(), *(curves or {}).values()]
    xs = [v for xs, _ in every for v in xs]
    ys = [v for _, ys in every for v in ys]
    if log_x:
        fig.update_xaxes(**log_ticks(xs, measured=False))
    if log_y:
        fig.update_yaxes(**log_ticks(ys, measured=False))
    return fig


def readable(fig):
    """A figure drawn before these rules (a notebook's saved output), given them: the colour of
    vLLM's default, the chosen and the article's configuration to traces so named, and ticks on
    every log axis that has none (``log_ticks``). Returns the figure."""
    for t in fig.data:
        colour = ROLE_COLOURS.get(str(getattr(t, "name", None)))
        if colour is None:
            continue
        if t.type == "bar":
            t.marker.color = colour
        elif t.type == "scatter":
            t.marker.color = colour
            t.line.color = colour
    for key in [k for k in fig.layout.to_plotly_json() if k.startswith(("xaxis", "yaxis"))]:
        axis = fig.layout[key]
        if axis.type != "log" or axis.tickvals is not None:
            continue
        ref = key[0] + key[len("xaxis") :]  # xaxis2 -> x2
        values = []
        for t in fig.data:
            if (getattr(t, f"{key[0]}axis", None) or key[0]) == ref:
                values += [v for v in _array(getattr(t, key[0], None)) if _number(v)]
        if values:
            axis.update(**log_ticks(values))
    return fig


def _array(v) -> list:
    """A trace's data as a list: plotly JSON may hold it as a typed array ({dtype, bdata})."""
    if v is None:
        return []
    if isinstance(v, dict) and "bdata" in v:
        import base64

        import numpy as np

        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v.get("dtype", "f8")).tolist()
    try:
        return list(v)
    except TypeError:
        return []


def _number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and not _nan(v)
