"""Plotly figures from sweep DataFrames. Functions return figures; notebooks display them."""

from __future__ import annotations

import plotly.graph_objects as go


def _agg(df, x: str, y: str, color: str | None):
    keys = [x] + ([color] if color else [])
    ok = df[df["status"] == "ok"] if "status" in df else df
    g = ok.groupby(keys, sort=False)[y]
    return g.median().reset_index(), g.min().reset_index(), g.max().reset_index()


def bar_with_spread(df, x: str, y: str, color: str | None = None, title: str = "", yaxis: str | None = None):
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
            error_y=dict(type="data", symmetric=False, array=(mx[y] - m[y]).tolist(), arrayminus=(m[y] - mn[y]).tolist()),
        )
    fig.update_layout(title=title, barmode="group", xaxis_title=x, yaxis_title=yaxis or y, template="plotly_white")
    return fig


def line_with_spread(df, x: str, y: str, color: str | None = None, title: str = "", log_x: bool = False, yaxis: str | None = None):
    """Median line per group with a min-max band."""
    med, lo, hi = _agg(df, x, y, color)
    fig = go.Figure()
    groups = [None] if not color else list(dict.fromkeys(med[color]))
    for gname in groups:
        sel = (med[color] == gname) if color else slice(None)
        m, mn, mx = med[sel], lo[sel], hi[sel]
        name = str(gname) if color else y
        fig.add_scatter(x=m[x], y=m[y], mode="lines+markers", name=name,
                        error_y=dict(type="data", symmetric=False, array=(mx[y] - m[y]).tolist(), arrayminus=(m[y] - mn[y]).tolist()))
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=yaxis or y, template="plotly_white")
    if log_x:
        fig.update_xaxes(type="log")
    return fig


def timeline(samples: list[dict], title: str = "engine state during the run"):
    """KV usage and queue depths over time, from a point's sampled gauges."""
    fig = go.Figure()
    t = [s["t_s"] for s in samples]
    for key, name in (
        ("vllm:kv_cache_usage_perc", "KV cache usage (fraction)"),
        ("vllm:num_requests_running", "running"),
        ("vllm:num_requests_waiting", "waiting"),
    ):
        fig.add_scatter(x=t, y=[s.get(key, 0) for s in samples], name=name, mode="lines",
                        yaxis="y" if key.endswith("perc") else "y2")
    fig.update_layout(title=title, xaxis_title="time (s)", template="plotly_white",
                      yaxis=dict(title="KV usage", range=[0, 1]),
                      yaxis2=dict(title="requests", overlaying="y", side="right"))
    return fig
