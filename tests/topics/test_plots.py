"""Charts that read alone: one colour per configuration across every chart of a run, a legend on
every chart with series, log axes ticked where a reader can read them, and a capacity chart that
says when the machine, not the setting, lost (replicas sharing a CPU's two cores). Figures are
checked through ``fig.to_dict()``; no browser, no engine."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import pytest

from tunebook.topics import blocksize, headroom, plots
from tunebook.topics.explorer import evidence_bars, ratio_bars


def _bars(fig) -> dict[str, object]:
    """Trace name -> its marker colour."""
    return {t["name"]: t["marker"]["color"] for t in fig.to_dict()["data"]}


def _sweep(configs: dict[str, float]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"config": c, "workload": w, "status": "ok", "e2e_mean_ms": v * k, "goodput_rps": v}
            for c, v in configs.items()
            for w, k in (("short", 1.0), ("long", 3.0))
            for _ in range(2)
        ]
    )


def _validation(configs: dict[str, float]) -> pd.DataFrame:
    rows = []
    for metric in ("goodput_rps", "ttft_p99_ms"):
        for c, v in configs.items():
            rows.append(
                {
                    "metric": metric,
                    "better": "higher" if metric == "goodput_rps" else "lower",
                    "config": c,
                    "median": v,
                    "min": v * 0.9,
                    "max": v * 1.1,
                    "n": 2,
                    "ratio vs default": v / configs["default"],
                    "within noise": None if c == "default" else True,
                }
            )
    return pd.DataFrame(rows)


def test_a_configuration_keeps_its_colour_in_every_chart_of_a_run():
    # 00's chart: configurations as bar groups
    baseline = plots.bar_with_spread(
        _sweep({"default": 10.0, "article": 8.0}), "workload", "e2e_mean_ms", color="config"
    )
    # 05's validation: each configuration relative to the default (the default is the 1.0 line)
    validation = ratio_bars(_validation({"default": 10.0, "chosen": 12.0, "article": 8.0}))
    # 04's capacity ranking: one bar per configuration
    rank = [
        {"config": c, "capacity_median": v, "capacity_min": v, "capacity_max": v, "vs_default": r}
        for c, v, r in (("replicas=2", 20.0, 2.0), ("default", 10.0, 1.0), ("article", 8.0, 0.8))
    ]
    cap = headroom.capacity_figure(rank, platform="cuda").to_dict()["data"][0]
    cap_colours = dict(zip(cap["x"], cap["marker"]["color"], strict=True))

    colours = plots.ROLE_COLOURS
    assert _bars(baseline) == {"default": colours["default"], "article": colours["article"]}
    assert _bars(validation) == {"chosen": colours["chosen"], "article": colours["article"]}
    assert cap_colours["default"] == colours["default"]
    assert cap_colours["article"] == colours["article"]
    # a candidate's colour comes from its name: the same wherever it is drawn, never a role's
    again = plots.config_colours(["article", "replicas=2", "stream_interval=16"])["replicas=2"]
    assert cap_colours["replicas=2"] == again
    assert again not in colours.values()


def test_colours_of_one_chart_are_distinct_and_a_reference_can_take_the_defaults():
    names = [f"block_size={b}" for b in (8, 16, 32, 64, 128, 256, 512)]
    got = plots.config_colours(names)
    assert len(set(got.values())) == len(names)
    assert set(got.values()) <= set(plots.PALETTE)
    roles = plots.config_colours(names, {"block_size=16": "default", "block_size=128": "chosen"})
    assert roles["block_size=16"] == plots.ROLE_COLOURS["default"]
    assert roles["block_size=128"] == plots.ROLE_COLOURS["chosen"]
    # 05's decision figure: vLLM's default value grey, the kept value green, as in every chart
    df = pd.DataFrame(
        [
            {"config": f"block_size={b}", "status": "ok", "goodput_rps": v}
            for b, v in ((16, 10.0), (32, 12.0), (128, 9.0))
            for _ in range(2)
        ]
    )
    bars = evidence_bars(df, "goodput_rps", reference="block_size=16", chosen="block_size=32")
    data = bars.to_dict()["data"][0]
    by = dict(zip(data["x"], data["marker"]["color"], strict=True))
    assert by["block_size=16 (default)"] == plots.ROLE_COLOURS["default"]
    assert by["block_size=32 (chosen)"] == plots.ROLE_COLOURS["chosen"]


def test_a_chart_of_one_series_still_names_it_in_a_legend():
    # low_latency's validation: the article alone against the default (chosen not run again)
    fig = ratio_bars(_validation({"default": 10.0, "article": 8.0})).to_dict()
    assert len(fig["data"]) == 1 and fig["layout"]["showlegend"] is True
    assert fig["data"][0]["name"] == "article"
    aa = ratio_bars(
        _validation({"default": 10.0, "chosen": 9.8}), labels={"chosen": "default, run again"}
    ).to_dict()
    assert aa["data"][0]["name"] == "default, run again"
    one_group = plots.bar_with_spread(
        _sweep({"default": 10.0}), "workload", "e2e_mean_ms", color="config"
    ).to_dict()
    assert one_group["layout"]["showlegend"] is True


def test_log_axes_are_ticked_at_the_sizes_measured():
    """02's prefix-hit chart: points at block sizes 32, 128, 256 on a log axis were labelled
    "3 4 5 6 7 8 9 100 2" by plotly; the ticks are the sizes themselves."""
    summary = pd.DataFrame(
        {
            "block_size": [32, 128, 256],
            "cached tokens / warm request": [448, 384, 256],
            "floor(prefix/block)*block": [448, 384, 256],
        }
    )
    x = blocksize.prefix_hits_figure(summary, 470).to_dict()["layout"]["xaxis"]
    assert x["type"] == "log"
    assert list(x["tickvals"]) == [32, 128, 256] and list(x["ticktext"]) == ["32", "128", "256"]


def test_log_ticks_of_a_continuous_quantity_are_1_2_5_steps():
    t = plots.log_ticks([0.7, 3.3, 41.0, 180.0], measured=False)
    assert t["tickvals"] == pytest.approx([0.5, 1, 2, 5, 10, 20, 50, 100, 200])
    assert t["ticktext"] == ["0.5", "1", "2", "5", "10", "20", "50", "100", "200"]
    assert plots.tick_text(16384) == "16,384" and plots.tick_text(2000) == "2k"
    assert plots.tick_text(2.8284271) == "2.83"
    assert plots.log_ticks([]) == {"type": "log"}
    curves = pd.DataFrame(
        {
            "config": ["default"] * 3 + ["replicas=2"] * 3,
            "repeat": [0] * 6,
            "offered_rps": [2.0, 4.0, 8.0, 2.0, 4.0, 8.0],
            "goodput_rps": [2.0, 3.9, 5.0, 1.0, 1.5, 0.0],
        }
    )
    fig = headroom.curve_figure(curves).to_dict()
    assert fig["layout"]["xaxis"]["ticktext"] == ["2", "5", "10"]
    assert fig["layout"]["showlegend"] is True
    lines = [t for t in fig["data"] if t["name"] != "goodput = offered"]
    assert lines[0]["line"]["color"] == plots.ROLE_COLOURS["default"]


def test_the_capacity_chart_says_when_the_machine_lost():
    """Fig. 4.1 on the cpu profile: replicas=2 at 0.02x the default reads as a failure of the tool
    unless the chart says that two replicas shared two cores."""
    rank = [
        {"config": "default", "capacity_median": 90.5, "capacity_min": 90.5, "capacity_max": 90.5},
        {"config": "replicas=2", "capacity_median": 2.0, "capacity_min": 2.0, "capacity_max": 2.0},
    ]
    rank[0]["vs_default"], rank[1]["vs_default"] = 1.0, 2.0 / 90.5
    cpu = headroom.capacity_figure(rank, "Figure 4.1", platform="cpu", cpu_count=2).to_dict()
    title = cpu["layout"]["title"]["text"]
    assert title.startswith("Figure 4.1<br>")
    assert "lost because of the machine: replicas=2 (0.02x the default)" in title
    assert "2 cores" in title
    assert cpu["data"][0]["text"] == ["1.00x", "0.02x (the machine)"]
    gpu = headroom.capacity_figure(rank, "Figure 4.1", platform="cuda").to_dict()
    assert gpu["layout"]["title"]["text"] == "Figure 4.1"
    assert gpu["data"][0]["text"] == ["1.00x", "0.02x"]


def test_a_saved_figure_is_given_the_runs_colours_and_readable_ticks():
    """A notebook's saved chart (drawn before these rules) as the report shows it."""
    fig = go.Figure()
    fig.add_bar(x=["short"], y=[1.0], name="article", marker_color="#636efa")
    fig.add_bar(x=["short"], y=[2.0], name="default", marker_color="#ef553b")
    fig.add_scatter(x=[16384, 131072], y=[16000, 130000], name="engines", xaxis="x")
    fig.update_xaxes(type="log")
    saved = go.Figure(fig.to_dict())
    d = plots.readable(saved).to_dict()
    assert _bars_of(d) == {
        "article": plots.ROLE_COLOURS["article"],
        "default": plots.ROLE_COLOURS["default"],
    }
    assert list(d["layout"]["xaxis"]["ticktext"]) == ["16,384", "131,072"]


def _bars_of(d: dict) -> dict:
    return {t["name"]: t["marker"]["color"] for t in d["data"] if t["type"] == "bar"}
