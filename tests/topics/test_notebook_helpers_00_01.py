"""The functions notebooks 00 (baseline) and 01 (kvcache) call to build what their cells show:
texts, tables, figures and sweep points, on synthetic point results. No engine and no vllm import.
"""

from __future__ import annotations

import pandas as pd
import pytest
from synthetic import point as _point

from tunebook.core.model import ERNIE_03B, load_shape
from tunebook.topics import baseline, kvcache


@pytest.fixture(scope="module")
def ernie():
    return load_shape(ERNIE_03B)


@pytest.fixture(scope="module")
def tiny():
    return load_shape("tiny-ernie")


# --------------------------------------------------------------------------- 00: baseline
def test_checks_text_keeps_long_errors_whole():
    error = "x" * 150  # longer than pandas' default column width (50)
    rows = [
        {"setting": "max_num_seqs", "value": 256, "valid": True, "error": None},
        {"setting": "max_paddings", "value": 128, "valid": False, "error": error},
    ]
    text = baseline.checks_text(rows)
    assert error in text and "..." not in text
    lines = text.splitlines()
    assert lines[0].split() == ["setting", "value", "valid", "error"] and len(lines) == 3


def test_runnable_text_says_the_config_then_each_change():
    changes = [{"setting": "block_size", "article": 16, "run with": 32, "why": "CPU: x32"}]
    text = baseline.runnable_text({"block_size": 32}, changes)
    first, header, row = text.splitlines()
    assert first == "article, as run here: {'block_size': 32}"
    assert header.split() == ["setting", "article", "run", "with", "why"]
    assert row.split() == ["block_size", "16", "32", "CPU:", "x32"]
    assert baseline.runnable_text({}, []) == "article, as run here: {}\n(no changes)"


def test_named_workloads_adds_each_name_without_touching_the_specs():
    specs = {"short": {"kind": "fixed", "num_requests": 2}}
    named = baseline.named_workloads(specs)
    assert named == {"short": {"kind": "fixed", "num_requests": 2, "name": "short"}}
    assert "name" not in specs["short"]


def test_baseline_runs_adds_c6_uncapped_and_limits_its_starts_in_process():
    wls = {"chat": {"name": "chat"}, "long": {"name": "long"}}
    conc = {"name": "concurrent", "num_requests": 100}
    runs = baseline.baseline_runs(wls, conc, 8, "offline", 1)
    assert list(runs["workloads"]) == ["chat", "long", "concurrent"]
    assert runs["workloads"]["concurrent"] is conc
    assert runs["point_overrides"] == {
        "chat": {"max_concurrency": 8},
        "long": {"max_concurrency": 8},
    }
    assert runs["workload_repeats"] == {"concurrent": 1}
    assert baseline.baseline_runs(wls, conc, None, "served", 1)["workload_repeats"] is None
    with pytest.raises(ValueError, match="rename that workload"):
        baseline.baseline_runs({"concurrent": {}}, conc, None, "offline", 1)


def test_workload_frames_split_a_sweep_by_workload():
    pts = [
        _point("default", 0, workload={"name": "chat"}),
        _point("default", 0, workload={"name": "concurrent"}),
        _point("article", 0, workload={"name": "chat"}),
        _point("article", 1, workload=None),
    ]
    assert [p["config"] for p in baseline.workload_points(pts, "chat")] == ["default", "article"]
    frames = baseline.workload_frames(pts, ["chat", "long"])
    assert list(frames["chat"]["config"]) == ["article", "default"]  # sorted by config, repeat
    assert set(frames["chat"]["workload"]) == {"chat"} and len(frames["long"]) == 0


def test_failed_text_lists_failed_points_per_workload_only():
    frames = {
        "chat": baseline.points_frame([_point("a", 0), _point("b", 1, status="failed")]),
        "long": baseline.points_frame([_point("a", 0)]),
        "none": baseline.points_frame([]),
    }
    text = baseline.failed_text(frames)
    assert text.splitlines()[0] == "chat: failed points"
    assert "b-r1" in text and "EngineFailure: boom" in text and "a-r0" not in text
    assert "long" not in text
    assert baseline.failed_text({"long": frames["long"]}) == ""


def test_metric_charts_one_figure_per_metric_with_a_bar_per_config():
    pts = []
    for cfg, e2e in (("default", 100.0), ("article", 200.0)):
        m = {
            "e2e_mean_ms": e2e,
            "ttft_p99_ms": 5.0,
            "tpot_p50_ms": 1.0,
            "request_throughput_rps": 3.0,
            "duration_s": 1.0,
            "num_requests": 2,
        }
        pts.append(_point(cfg, 0, metrics=m, workload={"name": "chat"}))
    figs = baseline.metric_charts({"chat": baseline.points_frame(pts)})
    titles = [f.layout.title.text for f in figs]
    assert titles == [title for _, title in baseline.BASELINE_CHARTS]
    bars = {t.name: list(t.y) for t in figs[0].data}
    assert bars == {"article": [200.0], "default": [100.0]}


def test_c6_text_from_the_arithmetic(ernie):
    c6 = baseline.c6_arithmetic(ernie, 23.65, 0.85, 4096)
    assert baseline.c6_text(c6, "ernie").splitlines() == [
        "ernie: 18,432 B per token (bf16)",
        "100 requests x 4096 tokens = 7,549,747,200 B = 7.03 GiB of KV",
        "RTX 4090 (23.65 GiB) at gpu_memory_utilization 0.85: at most 19.43 GiB for KV after"
        " 0.67 GiB of weights -> 276 requests of 4096 tokens",
    ]


def test_concurrent_view_predicts_the_share_of_blocks_and_skips_failures(tiny):
    wl = {"kind": "fixed", "num_requests": 4, "prompt_len": 100, "output_len": 28, "seed": 1}
    cap = {"num_gpu_blocks": 64, "block_size": 32, "kv_capacity_tokens": 2048}
    pts = [_point("a", 0, capacity=cap), _point("b", 0, status="failed")]
    view = baseline.concurrent_view(baseline.points_frame(pts), wl, tiny)
    # 4 requests of 128 tokens = 4 blocks of 32 each: 16 of 64 blocks
    predicted = view["KV blocks predicted %"]
    assert predicted[0] == 25.0 and pd.isna(predicted[1])
    assert list(view.columns) == [c for c in baseline.CONCURRENT_COLUMNS if c in view]
    assert "point_id" not in view and "cap_block_size" not in view


def test_concurrent_timelines_first_sampled_start_of_each_config():
    samples = [{"t_s": 0.0}, {"t_s": 0.25}]
    pts = [
        _point("a", 0, timeline=samples),
        _point("a", 1, timeline=samples),  # a later start: left out
        _point("b", 0, timeline=[]),  # never sampled: left out
        _point("c", 0, status="failed", timeline=samples),
    ]
    figs = baseline.concurrent_timelines(pts, 100)
    assert [f.layout.title.text for f in figs] == ["a: 100 requests at once"]
    assert list(figs[0].data[0].x) == [0.0, 0.25]


# --------------------------------------------------------------------------- 01: kvcache
def test_drift_model_random_init_only_when_asked(monkeypatch):
    calls = []

    def fake(model, early=None):
        calls.append((model, early))
        return f"/tmp/random-init/{model}"

    monkeypatch.setattr(kvcache, "random_init_checkpoint", fake)
    assert kvcache.drift_model("tiny-ernie", False) == "tiny-ernie" and not calls
    assert kvcache.drift_model("tiny-ernie", True, early="proc") == "/tmp/random-init/tiny-ernie"
    assert calls == [("tiny-ernie", "proc")]


def test_arithmetic_text_shape_then_formulas(ernie):
    text = kvcache.arithmetic_text(ernie, "ernie", 4096, 100)
    shape_txt, formula_txt = text.split("\n\n")
    assert shape_txt == kvcache.shape_table(ernie, "ernie").to_string()
    assert formula_txt.splitlines()[1].split()[-4:] == ["16384", "64.0", "6.250", "0.8889"]
    assert formula_txt.splitlines()[2].split()[-4:] == ["18432", "72.0", "7.031", "1.0000"]


def test_capacity_points_every_config_on_the_drift_model():
    pts = kvcache.capacity_points({"kv8m": {"kv_cache_memory_bytes": 8}}, "/ckpt")
    assert pts == {"kv8m": {"settings": {"kv_cache_memory_bytes": 8}, "model": "/ckpt"}}


def test_failed_text_one_line_per_failed_point():
    pts = [_point("a", 0), _point("fp8", 1, status="failed")]
    assert kvcache.failed_text(pts) == "fp8-r1 failed: EngineFailure: boom"
    assert kvcache.failed_text(pts[:1]) == ""


def _capacity(tiny):
    def cap_point(config, repeat, dtype, mem):
        settings = {"kv_cache_memory_bytes": mem, "kv_cache_dtype": dtype}
        tokens = tiny.kv_capacity_tokens(mem, 128, dtype)
        capacity = {"block_size": 128, "max_model_len": 2048, "kv_capacity_tokens": tokens}
        return _point(config, repeat, settings=settings, capacity=capacity)

    pts = [
        cap_point("kv8m-auto", 0, "auto", 8 << 20),
        cap_point("kv64m-auto", 0, "auto", 64 << 20),
        cap_point("kv64m-fp8", 0, "fp8", 64 << 20),
    ]
    return kvcache.capacity_table(pts, tiny)


def test_capacity_text_bf16_or_fp8_rows(tiny):
    cap = _capacity(tiny)
    bf16 = kvcache.capacity_text(cap).splitlines()
    assert bf16[0].split()[:3] == ["config", "repeat", "kv_cache_dtype"]
    assert [line.split()[0] for line in bf16[1:]] == ["kv8m-auto", "kv64m-auto"]
    fp8 = kvcache.capacity_text(cap, fp8=True).splitlines()
    assert [line.split()[0] for line in fp8[1:]] == ["kv64m-fp8"]
    only_bf16 = cap[cap["kv_cache_dtype"] == "auto"]
    assert kvcache.capacity_text(only_bf16, fp8=True) == "no fp8 KV point ran here (errors above)"
    assert "no capacity engine" in kvcache.capacity_text(pd.DataFrame())


def test_capacity_figure_engine_against_arithmetic(tiny):
    fig = kvcache.capacity_figure(_capacity(tiny))
    assert fig.layout.title.text == "KV capacity: engine against arithmetic"
    assert list(fig.data[0].y) == [16384, 131072, 262144] and fig.layout.xaxis.type == "log"


def test_max_concurrency_text_of_the_reference_engine(tiny):
    cap = _capacity(tiny)
    lines = kvcache.max_concurrency_text(cap, tiny, "kv64m-auto", [2048, 4096]).splitlines()
    assert lines[0] == "kv64m-auto: 131,072 tokens, block_size 128"
    assert lines[2].split() == ["2048", "131072", "16", "64.0"]
    assert lines[3].split() == ["4096", "131072", "32", "32.0"]
    assert kvcache.max_concurrency_text(cap, tiny, "nope", [2048]) == "no engine of 'nope' finished"


def test_weights_text():
    assert kvcache.weights_text(True, False) == (
        "weights: random init (transformers); flat logits (every logprob = -ln vocab): False"
    )
    assert kvcache.weights_text(False, True).startswith("weights: vLLM dummy;")


def _speed_points():
    return [
        _point(cfg, r, settings={"kv_cache_dtype": dt}, metrics={"output_throughput_tok_s": v})
        for cfg, dt, r, v in (
            ("bf16", "auto", 0, 100.0),
            ("bf16", "auto", 1, 110.0),
            ("fp8", "fp8", 0, 200.0),
            ("fp8", "fp8", 1, 220.0),
        )
    ]


def test_speed_figure_median_per_config():
    fig = kvcache.speed_figure(_speed_points())
    assert list(fig.data[0].x) == ["bf16", "fp8"] and list(fig.data[0].y) == [105.0, 210.0]


def test_fp8_speed_text_only_when_both_ran():
    assert kvcache.fp8_speed_text(_speed_points()).startswith("fp8 / bf16 output tokens/s: 2.000 (")
    assert kvcache.fp8_speed_text(_speed_points()[:2]) == ""


def test_pressure_points_one_config_per_value():
    pts = kvcache.pressure_points("kv_cache_memory_bytes", [1, 2], {"max_model_len": 512})
    assert pts == {
        "kv_cache_memory_bytes-1": {"settings": {"max_model_len": 512, "kv_cache_memory_bytes": 1}},
        "kv_cache_memory_bytes-2": {"settings": {"max_model_len": 512, "kv_cache_memory_bytes": 2}},
    }


def _pressure():
    return pd.DataFrame(
        {
            "config": ["small", "big"],
            "status": ["ok", "ok"],
            "KV tokens (engine)": [2048, 16384],
            "workload needs (tokens, all at once)": [6144, 6144],
            "capacity / need": [0.333, 2.667],
            "preemptions": [4, 0],
            "ttft_p99_ms": [50.0, 10.0],
            "output_throughput_tok_s": [100.0, 200.0],
            "running peak": [4, 16],
            "error": [None, None],
        }
    )


def test_pressure_text_capacity_against_need():
    lines = kvcache.pressure_text(_pressure()).splitlines()
    assert lines[0].split()[:2] == ["config", "status"] and "preemptions" not in lines[0]
    assert lines[1].split() == ["small", "ok", "2048", "6144", "0.333"]


def test_pressure_figure_four_panels_on_log_x():
    fig = kvcache.pressure_figure(_pressure())
    assert [t.name for t in fig.data] == [
        "preemptions",
        "ttft_p99_ms",
        "output_throughput_tok_s",
        "running peak",
    ]
    assert list(fig.data[0].y) == [4, 0] and fig.layout.xaxis.type == "log"


def test_prefix_points_on_and_off_at_each_share():
    wl = {"kind": "shared_prefix", "prompt_len": 512}
    pts = kvcache.prefix_points([0.0, 0.5], wl)
    assert list(pts) == ["share0-on", "share0-off", "share0.5-on", "share0.5-off"]
    assert pts["share0.5-off"] == {
        "settings": {"enable_prefix_caching": False},
        "workload": {**wl, "prefix_share": 0.5, "name": "shared_prefix_0.5"},
    }
    assert "prefix_share" not in wl


def _prefix(tiny):
    wl = {"kind": "shared_prefix", "num_requests": 4, "prompt_len": 256, "output_len": 4}
    pts = []
    for share in (0.0, 0.5):
        for on in (True, False):
            spec = {**wl, "num_prefixes": 1, "prefix_share": share, "seed": 1}
            m = {
                "prefix_cache_hit_rate_pct": 10.0 * share * on,
                "cached_tokens": 1,
                "ttft_p50_ms": 2,
            }
            cap = {"block_size": 32, "num_gpu_blocks": 100, "enable_prefix_caching": on}
            pts.append(_point(f"s{share}-{on}", 0, workload=spec, metrics=m, capacity=cap))
    return kvcache.prefix_table(pts, tiny).sort_values(["prefix_share", "enable_prefix_caching"])


def test_prefix_text_and_view(tiny):
    pfx = _prefix(tiny)
    lines = kvcache.prefix_text(pfx).splitlines()
    assert lines[0].split()[:2] == ["config", "enable_prefix_caching"] and len(lines) == 5
    # share 0.5, caching on: 128 prefix tokens = 4 whole blocks shared by 3 later requests
    assert lines[-1].split()[:6] == ["s0.5-True", "True", "0.5", "32", "128", "4"]
    assert "33.33" in lines[-1]  # predicted KV saved %, rounded to 2 decimals
    assert list(kvcache.prefix_view(pfx).columns) == kvcache.PREFIX_VIEW_COLUMNS


def test_prefix_figure_one_line_per_setting_per_panel(tiny):
    fig = kvcache.prefix_figure(_prefix(tiny))
    assert [t.name for t in fig.data] == ["False", "True"] * 3
    assert list(fig.data[1].y) == [0.0, 5.0]  # hit rate with caching on, against the share


def test_headroom_text_table_then_price_per_step(ernie):
    head, per_step = kvcache.headroom_table(ernie, {"RTX 4090": 23.65}, seq_len=4096)
    lines = kvcache.headroom_text(head, per_step, "ernie", 4096).splitlines()
    assert lines[0] == "ernie, bf16 KV:" and lines[1].split()[0] == "card" and len(lines) == 7
    assert lines[-1] == (
        "RTX 4090: each 0.05 of gpu_memory_utilization = 68,886 tokens = 17 requests of 4096 tokens"
    )


def test_slope_text_table_or_why_none():
    assert kvcache.slope_text([]).startswith("no pair of engines differing only in")
    text = kvcache.slope_text([{"kv_cache_dtype": "auto", "residual %": 0.5}])
    assert text.splitlines()[1].split() == ["auto", "0.5"]


def test_same_memory_text_table_or_none():
    assert kvcache.same_memory_text(pd.DataFrame()) == (
        "no engines with equal KV memory and different max_model_len"
    )
    groups = pd.DataFrame({"max_model_len": [512, 2048], "engines": [1, 2]})
    assert kvcache.same_memory_text(groups).splitlines()[2].split() == ["2048", "2"]
