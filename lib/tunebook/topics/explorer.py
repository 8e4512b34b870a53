"""The assembly explorer: widgets that recompute the recommendation from saved results.

    ex = Explorer(run_dir, scenario="high_concurrency_chat", slo_ttft_ms=2000, slo_tpot_ms=200,
                  base_settings=engine_settings, model="tiny-ernie")
    ex            # in Jupyter: controls, the recommendation, a figure

Controls: scenario, SLO fields (p99 TTFT, median TPOT; exact numbers, classes
``tunebook-slo-ttft`` / ``tunebook-slo-tpot``), the sweep and metric to plot, the
configurations to compare. Every change recomputes ``assemble.choose`` on the results already on
disk (no engine starts) and redraws the figure. The recommendation is an HTML widget with the CSS
class ``tunebook-recommendation`` (a browser test finds it by that class).

Nothing the notebook prints depends on the widgets: the notebook's recommendation comes from its
parameters; the explorer is for looking around.
"""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go

from tunebook.core.results import IDENT
from tunebook.engine import flags
from tunebook.topics import assemble
from tunebook.topics.plots import config_colours


def pd_is_numeric(col) -> bool:
    from pandas.api.types import is_numeric_dtype

    return bool(is_numeric_dtype(col))


RECOMMENDATION_CLASS = "tunebook-recommendation"
SLO_TTFT_CLASS = "tunebook-slo-ttft"
SLO_TPOT_CLASS = "tunebook-slo-tpot"


# --------------------------------------------------------------------------- figures
def evidence_bars(
    df,
    metric: str,
    configs=None,
    reference: str | None = None,
    chosen: str | None = None,
    title: str = "",
    limit: float | None = None,
):
    """Median of ``metric`` per config with min-max whiskers over repeats; the reference (vLLM's
    default) and the chosen config are marked; an SLO limit is a dashed line when given."""
    ok = df[df["status"] == "ok"] if "status" in df else df
    if configs is not None:
        ok = ok[ok["config"].isin(list(configs))]
    ok = ok[ok[metric].notna()] if metric in ok else ok.iloc[0:0]
    g = ok.groupby("config", sort=False)[metric]
    med, lo, hi, n = g.median(), g.min(), g.max(), g.count()
    names = [str(c) for c in med.index]
    # the run's colours: the reference is vLLM's default, the kept or chosen value "chosen"
    roles = {str(reference): "default", **({str(chosen): "chosen"} if chosen else {})}
    colors = list(config_colours(names, roles).values())
    labels = [
        f"{c}{' (default)' if c == reference else ''}{' (chosen)' if c == chosen else ''}"
        for c in names
    ]
    fig = go.Figure()
    fig.add_bar(
        x=labels,
        y=med.tolist(),
        marker_color=colors,
        text=[f"n={k}" for k in n.tolist()],
        textposition="inside",
        error_y=dict(
            type="data", symmetric=False, array=(hi - med).tolist(), arrayminus=(med - lo).tolist()
        ),
        name=metric,
    )
    if limit is not None:
        fig.add_hline(y=limit, line_dash="dash", annotation_text=f"SLO {limit:g}")
    fig.update_layout(
        title=title,
        xaxis_title="configuration",
        yaxis_title=metric,
        template="plotly_white",
        showlegend=False,
    )
    return fig


def ratio_bars(
    table, reference: str = "default", title: str = "", labels: dict[str, str] | None = None
):
    """Validation: each config's median over the reference's median, per metric, min/max as
    whiskers; each configuration in its colour of the run, named in the legend (``labels``:
    config -> legend text)."""
    fig = go.Figure()
    ref_col = f"ratio vs {reference}"
    ref = table[table["config"] == reference].set_index("metric")
    configs = [c for c in dict.fromkeys(table["config"]) if c != reference]
    colours = config_colours([str(c) for c in configs])
    for cfg in configs:
        t = table[table["config"] == cfg].set_index("metric")
        t = t[t.index.isin(ref.index)]
        r = ref.loc[t.index, "median"]
        fig.add_bar(
            x=list(t.index),
            y=t[ref_col].tolist() if ref_col in t else (t["median"] / r).tolist(),
            name=(labels or {}).get(str(cfg), str(cfg)),
            marker_color=colours[str(cfg)],
            error_y=dict(
                type="data",
                symmetric=False,
                array=((t["max"] - t["median"]) / r).tolist(),
                arrayminus=((t["median"] - t["min"]) / r).tolist(),
            ),
        )
    fig.add_hline(y=1.0, line_dash="dot", annotation_text=f"{reference} = 1")
    fig.update_layout(
        title=title,
        barmode="group",
        yaxis_title=f"median / {reference}'s median",
        template="plotly_white",
        showlegend=True,  # one configuration is a series too: the legend names it
    )
    return fig


def decision_figure(decision: dict, sweep: assemble.Sweep, slo: dict | None = None):
    """The figure behind one decision: the scenario's metric for each value of the setting."""
    metric = decision.get("metric")
    if not metric:
        return None
    limit = None
    if slo and metric == "ttft_p99_ms":
        limit = slo.get("ttft_ms")
    if slo and metric == "tpot_p50_ms":
        limit = slo.get("tpot_ms")
    df = sweep.frame(slo if decision.get("goodput_slo") else None)
    chosen = decision["best"] if decision.get("changed") else decision.get("reference")
    return evidence_bars(
        df,
        metric,
        reference=decision.get("reference"),
        chosen=chosen,
        title=decision.get("figure", ""),
        limit=limit,
    )


def has_figure_widget() -> bool:
    """plotly's FigureWidget needs anywidget (plotly >= 6); without it the explorer redraws a Figure."""
    try:
        import anywidget  # noqa: F401
    except ImportError:
        return False
    return True


# --------------------------------------------------------------------------- the widget
class Explorer:
    """Controls + recommendation + figure over the sweeps of one run (no engine)."""

    def __init__(
        self,
        run_dir: str | Path,
        scenario: str = "high_concurrency_chat",
        slo_ttft_ms: float = 2000.0,
        slo_tpot_ms: float = 200.0,
        base_settings: dict | None = None,
        model: str = "",
        sweeps: list[assemble.Sweep] | None = None,
        extra_sweeps: list[assemble.Sweep] | None = None,
        figure_widget: bool | None = None,
    ):
        self.run_dir = Path(run_dir)
        self.base = dict(base_settings or {})
        self.model = model
        self.sweeps = list(sweeps) if sweeps is not None else assemble.discover(self.run_dir)
        self.plottable = {s.key: s for s in [*self.sweeps, *(extra_sweeps or [])]}
        self.choice: dict = {}
        self._make_controls(scenario, slo_ttft_ms, slo_tpot_ms)
        self._make_outputs(figure_widget)
        self._busy = False
        self._open_on_first_decision(scenario)
        self._fill_sweep_controls()
        self.recompute()
        self._observe_controls()
        self.widget = self._layout()

    # -- building
    def _make_controls(self, scenario: str, slo_ttft_ms: float, slo_tpot_ms: float) -> None:
        """The scenario and SLO inputs, and the sweep, metric and configs to plot."""
        import ipywidgets as W

        self.scenario = W.Dropdown(
            options=list(assemble.SCENARIOS), value=scenario, description="scenario"
        )
        # Exact numbers, not log sliders: a log slider snaps to its grid in the browser and sends
        # the snapped value back on first render (200 -> 199.526), which would change the SLO.
        self.ttft = W.BoundedFloatText(
            value=float(slo_ttft_ms),
            min=1.0,
            max=1e6,
            step=50.0,
            description="p99 TTFT ≤ (ms)",
            style={"description_width": "initial"},
        )
        self.ttft.add_class(SLO_TTFT_CLASS)
        self.tpot = W.BoundedFloatText(
            value=float(slo_tpot_ms),
            min=0.1,
            max=1e5,
            step=5.0,
            description="median TPOT ≤ (ms)",
            style={"description_width": "initial"},
        )
        self.tpot.add_class(SLO_TPOT_CLASS)
        keys = list(self.plottable)
        self.sweep = W.Dropdown(
            options=keys or ["(none)"], value=keys[0] if keys else "(none)", description="sweep"
        )
        self.metric = W.Dropdown(options=["(none)"], description="metric")
        self.configs = W.SelectMultiple(options=[], description="configs", rows=5)

    def _make_outputs(self, figure_widget: bool | None) -> None:
        """The recommendation, the serve command and the figure: a FigureWidget where plotly can
        make one, else an Output that shows a redrawn Figure."""
        import ipywidgets as W

        self.recommendation = W.HTML()
        self.recommendation.add_class(RECOMMENDATION_CLASS)
        self.command = W.HTML()
        self.command.add_class("tunebook-serve-command")
        use_fw = has_figure_widget() if figure_widget is None else figure_widget
        if use_fw:
            self.fig = go.FigureWidget()
            self.out = None
        else:
            self.fig = None
            self.out = W.Output()

    def _open_on_first_decision(self, scenario: str) -> None:
        """Plot first the sweep behind the first decision (a changed setting before a kept one)."""
        first = assemble.choose(self.sweeps, scenario, self.slo, self.base)["decisions"]
        first = sorted(first, key=lambda d: not d["changed"])
        if first and f"{first[0]['notebook']}/{first[0]['sweep']}" in self.plottable:
            self.sweep.value = f"{first[0]['notebook']}/{first[0]['sweep']}"

    def _observe_controls(self) -> None:
        """Recompute on a new scenario or SLO, refill the plot controls on a new sweep, redraw."""
        self.scenario.observe(self._on_choice, names="value")
        for w in (self.ttft, self.tpot):
            w.observe(self._on_slo, names="value")
        self.sweep.observe(self._on_sweep, names="value")
        for w in (self.metric, self.configs):
            w.observe(self._on_plot, names="value")

    def _layout(self):
        """Controls in two columns, then the recommendation, the command and the figure."""
        import ipywidgets as W

        controls = W.HBox(
            [
                W.VBox([self.scenario, self.ttft, self.tpot]),
                W.VBox([self.sweep, self.metric, self.configs]),
            ]
        )
        widget = W.VBox(
            [
                controls,
                self.recommendation,
                self.command,
                self.fig if self.fig is not None else self.out,
            ]
        )
        widget.add_class("tunebook-explorer")
        return widget

    # -- state
    @property
    def slo(self) -> dict:
        return {"ttft_ms": float(self.ttft.value), "tpot_ms": float(self.tpot.value)}

    def recompute(self) -> dict:
        """Recommendation under the current controls; updates the text and the figure."""
        self.choice = assemble.choose(self.sweeps, self.scenario.value, self.slo, self.base)
        self.recommendation.value = assemble.recommendation_text(self.choice, html=True)
        if self.model:
            kw = {"model": self.model, **self.choice["settings"]}
            cmd = flags.serve_command(kw, multiline=False)
            import html

            self.command.value = f"<pre>{html.escape(cmd)}</pre>"
        self.redraw()
        return self.choice

    def _decision_for(self, key: str) -> dict | None:
        for d in self.choice.get("decisions", []):
            if f"{d['notebook']}/{d['sweep']}" == key:
                return d
        return None

    def _fill_sweep_controls(self, keep_metric: bool = False) -> None:
        sw = self.plottable.get(self.sweep.value)
        current = self.metric.value
        self._busy = True
        try:
            if sw is None:
                self.metric.options, self.configs.options = ["(none)"], []
                return
            names = self.metric_names(sw) or ["(none)"]
            want = next(
                (m for m, _ in assemble.SCENARIOS[self.scenario.value].objectives if m in names),
                names[0],
            )
            if keep_metric and current in names:
                want = current
            self.metric.options = names
            self.metric.value = want
            self.configs.options = sw.configs
            self.configs.value = tuple(sw.configs)
        finally:
            self._busy = False

    def metric_names(self, sw: assemble.Sweep) -> list[str]:
        """Numeric columns of the sweep's frame under the current SLO (so ``goodput_rps``, which
        is computed under the SLO, is offered too), identifiers and settings left out."""
        df = sw.frame(self.slo)
        names = []
        skip = {*IDENT, *sw.setting_names}
        for c in df.columns:
            if c in skip:
                continue
            col = df[c]
            if col.dtype == bool or str(col.dtype) == "boolean":
                continue
            if pd_is_numeric(col) and col.notna().any():
                names.append(str(c))
        return names

    def figure(self):
        """The current plot as a plain plotly Figure (what the widget shows)."""
        sw = self.plottable.get(self.sweep.value)
        metric = self.metric.value
        if sw is None or metric in (None, "(none)"):
            return go.Figure(
                layout=dict(title="no saved sweep to plot in this run", template="plotly_white")
            )
        d = self._decision_for(sw.key) or {}
        chosen = d.get("best") if d.get("changed") else d.get("reference")
        limit = {"ttft_p99_ms": self.slo["ttft_ms"], "tpot_p50_ms": self.slo["tpot_ms"]}.get(metric)
        return evidence_bars(
            sw.frame(self.slo),
            metric,
            configs=self.configs.value or None,
            reference=d.get("reference"),
            chosen=chosen,
            title=f"{sw.key}: {metric}",
            limit=limit,
        )

    def redraw(self) -> None:
        if self._busy:
            return
        fig = self.figure()
        if self.fig is not None:
            with self.fig.batch_update():
                self.fig.data = ()
                self.fig.layout.shapes = ()
                self.fig.layout.annotations = ()
                self.fig.add_traces(list(fig.data))
                self.fig.update_layout(fig.layout)
        elif self.out is not None:
            from IPython.display import display

            self.out.clear_output(wait=True)
            with self.out:
                display(fig)

    # -- events
    def _on_choice(self, _change) -> None:
        self._fill_sweep_controls()
        self.recompute()

    def _on_slo(self, _change) -> None:
        self._fill_sweep_controls(keep_metric=True)  # the SLO changes goodput, not what is plotted
        self.recompute()

    def _on_sweep(self, _change) -> None:
        self._fill_sweep_controls()
        self.redraw()

    def _on_plot(self, _change) -> None:
        self.redraw()

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)
