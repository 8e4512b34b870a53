"""Plotly figures from sweep DataFrames. Functions return figures; notebooks display them."""

from __future__ import annotations

import plotly.graph_objects as go

from tunebook.engine.vllm_http import KV_USAGE, RUNNING, WAITING


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
    for gname in groups:
        sel = (med[color] == gname) if color else slice(None)
        m, mn, mx = med[sel], lo[sel], hi[sel]
        fig.add_bar(
            x=m[x].astype(str),
            y=m[y],
            name=str(gname) if color else y,
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
        fig.update_xaxes(type="log")
        fig.update_yaxes(type="log")
    return fig


def panels(df, x: str, ys: list, color: str | None = None, title: str = "", log_x: bool = False):
    """Several metrics against one x, side by side: median per group with min-max whiskers.

    ``ys`` is a list of column names or (column, axis title) pairs.
    """
    from plotly.subplots import make_subplots

    ys = [(y, y) if isinstance(y, str) else tuple(y) for y in ys]
    fig = make_subplots(rows=1, cols=len(ys), subplot_titles=[t for _, t in ys])
    palette = ["#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A", "#19D3F3"]
    for i, (y, _) in enumerate(ys, start=1):
        med, lo, hi = _agg(df, x, y, color)
        groups = [None] if not color else list(dict.fromkeys(med[color]))
        for j, gname in enumerate(groups):
            sel = (med[color] == gname) if color else slice(None)
            m, mn, mx = med[sel], lo[sel], hi[sel]
            fig.add_scatter(
                x=m[x],
                y=m[y],
                mode="lines+markers",
                name=str(gname) if color else y,
                legendgroup=str(gname),
                showlegend=(i == 1 and color is not None),
                line=dict(color=palette[j % len(palette)]),
                error_y=dict(
                    type="data",
                    symmetric=False,
                    array=(mx[y] - m[y]).tolist(),
                    arrayminus=(m[y] - mn[y]).tolist(),
                ),
                row=1,
                col=i,
            )
        fig.update_xaxes(title_text=x, type="log" if log_x else None, row=1, col=i)
    fig.update_layout(title=title, template="plotly_white", height=380)
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
    if log_x:
        fig.update_xaxes(type="log")
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
    if log_x:
        fig.update_xaxes(type="log")
    if log_y:
        fig.update_yaxes(type="log")
    return fig
