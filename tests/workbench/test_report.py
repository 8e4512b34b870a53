"""The HTML report: a summary page to read instead of the notebooks, and pages that keep their
charts. Built here from a small synthetic run folder (no engine); the browser test in
tests/test_browser.py opens the page in Chromium."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import plotly.graph_objects as go
import pytest

from tunebook.core import claims
from tunebook.core.results import SweepDir
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
    run = tmp_path / "cpu-20990101-000000-abcdef"
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


@pytest.mark.slow
def test_summary_page_holds_the_ledger_the_choice_the_fingerprint_and_gpu_time(run):
    index = report.write_report(run)
    assert index == run / "report" / "index.html"
    page = index.read_text()
    # the ledger, its text in full (the notebooks' tables cut it off)
    assert "C4" in page and "refuted" in page and "THE-END-OF-THE-NOTE" in page
    assert "02_block_size_sweep/block_size" in page and str(run) not in page.split("<body>")[1]
    # the chosen configuration with its evidence, and the side-by-side validation
    assert "high_concurrency_chat" in page and "max_num_seqs=512" in page
    assert "512 served 1.5x the goodput of 256" in page
    assert "vllm serve models/tiny-ernie --max-num-seqs 512" in page
    assert "Side by side: high_concurrency_chat" in page and "1.50x default" in page
    # fingerprint and GPU time
    for value in ("0.32.0", "x86_64", "CPU_ATTN", "2.13.0+cpu"):
        assert value in page
    assert "GPU-seconds" in page and "30 s" in page
    # plotly.js inside the page: it works offline
    assert '<script src="http' not in page and len(page) > 1_000_000
    assert page.count("Plotly.newPlot") >= 2
    # a page per notebook, with its chart and without the stale widget
    nb_page = (run / "report" / "02_block_size_sweep.html").read_text()
    assert "Plotly.newPlot" in nb_page and 'src="plotly.min.js"' in nb_page
    assert "stale 0%" not in nb_page
    assert (run / "report" / report.PLOTLY_JS).stat().st_size > 1_000_000


def test_key_figures(run):
    figs = report.key_figures(run)
    caps = [c for c, _ in figs]
    assert caps[0].startswith("Validation, high_concurrency_chat")
    val = figs[0][1].to_dict()
    names = [t["name"] for t in val["data"]]
    assert names == ["chosen", "article"]  # relative to the default
    chosen = val["data"][0]["y"]
    assert chosen[0] == pytest.approx(150.5 / 100.5)  # output_throughput_tok_s median ratio
    nb_fig = dict(figs)["02_block_size_sweep: its first chart (all of them are on its page)"]
    assert nb_fig.to_dict()["layout"]["title"]["text"] == "Throughput by size"
    gpu = figs[-1][1].to_dict()
    assert caps[-1] == "GPU time per notebook" and gpu["layout"]["barmode"] == "stack"


def test_fingerprint_counts_values(run):
    fp = report.fingerprint(run)
    assert dict(fp["vllm_version"]) == {"0.32.0": 8}
    assert dict(fp["model"]) == {"tiny-ernie": 8}


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
    assert report._fmt(float("nan")) == "n/a"
    assert report._fmt(True) == "True"


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
