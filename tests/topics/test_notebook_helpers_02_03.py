"""The functions notebooks 02 (block size) and 03 (prefill) call cell by cell: texts, tables and
figures on synthetic point results. No engine and no vllm import."""

from __future__ import annotations

import base64
import math

import numpy as np
import pandas as pd
import pytest
from synthetic import point as _point

from tunebook.core.model import load_shape
from tunebook.topics import blocksize, prefill


@pytest.fixture(scope="module")
def tiny():
    return load_shape("tiny-ernie")


def _figure(fig) -> dict:
    """fig.to_dict() with arrays as lists (plotly 6 writes numbers as base64 ``bdata``)."""

    def plain(x):
        if isinstance(x, np.ndarray):
            return x.tolist()
        if isinstance(x, dict) and "bdata" in x:
            return np.frombuffer(base64.b64decode(x["bdata"]), dtype=x["dtype"]).tolist()
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [plain(v) for v in x]
        return x

    return plain(fig.to_dict())


# --------------------------------------------------------------------------- blocksize (02)


def test_shared_prefix_workload_and_setup_text():
    w = blocksize.shared_prefix_workload(16, 600, 470, 4, 16)
    assert w["kind"] == "shared_prefix" and w["prefix_share"] == pytest.approx(470 / 600)
    assert (w["num_requests"], w["num_prefixes"], w["output_len"], w["seed"]) == (16, 4, 16, 0)
    assert blocksize.setup_text("cpu", "0.32.0", "tiny-ernie", w) == (
        "platform cpu, vLLM 0.32.0, model tiny-ernie\n"
        "workload: 16 x (600 prompt tokens, 470 of them shared; 16 out)"
    )


def test_validity_text_first_error_line_then_valid_sizes():
    rows = [
        {
            "block_size": 8,
            "settings check": "rejected",
            "engine": "not started",
            "valid": False,
            "error": "block_size=8 is not valid\nsecond line",
        },
        {
            "block_size": 128,
            "settings check": "passed",
            "engine": "started",
            "valid": True,
            "error": "",
        },
    ]
    assert blocksize.validity_text(rows) == (
        "block_size    8: invalid (check rejected, engine not started): block_size=8 is not valid\n"
        "block_size  128: valid (check passed, engine started)\n"
        "valid block sizes: [128]"
    )


def test_failed_points_and_results_for():
    df = pd.DataFrame(
        {
            "point_id": ["a", "b"],
            "status": ["ok", "failed"],
            "error": [None, "boom"],
            "x": [1, 2],
        }
    )
    failed = blocksize.failed_points(df)
    assert failed.columns.tolist() == ["point_id", "status", "error"]
    assert failed["point_id"].tolist() == ["b"]
    pts = [_point(f"b{b}", settings={"block_size": b}) for b in (16, 32, 64)] + [_point("none")]
    kept = blocksize.results_for(pts, [32, 64])
    assert [p["config"] for p in kept] == ["b32", "b64"]


def _bs_point(bs, repeat, tput, cached, backend="CPU_ATTN", asked=None):
    reqs = [{"tag": "p", "cached_tokens": 0}] + [{"tag": "p", "cached_tokens": c} for c in cached]
    settings = {"block_size": bs} | ({"attention_backend": asked} if asked else {})
    return _point(
        f"block_size={bs}" + (f",{asked}" if asked else ""),
        repeat,
        settings=settings,
        capacity={"block_size": bs, "num_gpu_blocks": 4096 // bs, "kv_capacity_tokens": 4096},
        env={"attention_backend": backend},
        metrics={
            "output_throughput_tok_s": tput,
            "ttft_p50_ms": 1.0 + repeat,
            "ttft_p99_ms": 2.0,
            "tpot_p50_ms": 3.0,
            "tpot_p99_ms": 4.0,
        },
        requests=reqs,
    )


@pytest.fixture()
def pp():
    pts = [
        _bs_point(32, 0, 100.0, [448]),
        _bs_point(32, 1, 120.0, [448]),
        _bs_point(128, 0, 90.0, [384]),
        _bs_point(128, 1, 80.0, [384]),
    ]
    return blocksize.per_point(pts, prefix_len=470)


def test_throughput_and_latency_figures(pp):
    fig = _figure(blocksize.throughput_figure(pp))
    (bar,) = fig["data"]
    assert bar["x"] == ["32", "128"] and bar["y"] == [110.0, 85.0]
    assert bar["error_y"]["array"] == [10.0, 5.0]
    assert fig["layout"]["title"]["text"].startswith("Output throughput per block size")
    lat = _figure(blocksize.latency_figure(pp))
    assert [t["name"] for t in lat["data"]] == ["TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99"]
    assert lat["data"][0]["y"] == [1.5, 1.5] and lat["data"][0]["error_y"]["array"] == [0.5, 0.5]
    assert lat["layout"]["yaxis"]["title"]["text"] == "ms"


def test_capacity_text_with_and_without_the_arithmetic(tiny, pp):
    summary = blocksize.summary(pp, 470)
    text = blocksize.capacity_text(summary, tiny, 4096 * 512)
    assert text.splitlines() == [
        "KV bytes per token: 512",
        "block_size   32:    128 blocks,      4,096 tokens (arithmetic 4,096)",
        "block_size  128:     32 blocks,      4,096 tokens (arithmetic 4,096)",
    ]
    assert "arithmetic" not in blocksize.capacity_text(summary, tiny, None)


def test_granularity_text_says_match_or_mismatch():
    gran = [
        {"block_size": 32, "measured": [448], "expected": 448, "match": True},
        {"block_size": 256, "measured": [0, 256], "expected": 256, "match": False},
    ]
    assert blocksize.granularity_text(gran, 470) == (
        "block_size   32: cached tokens per later request [448], floor(470/32)*32 = 448, match\n"
        "block_size  256: cached tokens per later request [0, 256], floor(470/256)*256 = 256,"
        " MISMATCH"
    )


def test_prefix_hits_figure_leaves_the_summary_alone(pp):
    summary = blocksize.summary(pp, 470)
    fig = _figure(blocksize.prefix_hits_figure(summary, 470))
    assert "shared prefix" not in summary.columns
    measured, floor, prefix = fig["data"]
    assert measured["y"] == [448.0, 384.0] and floor["y"] == [448, 384]
    assert prefix["y"] == [470, 470] and prefix["line"]["dash"] == "dash"
    assert fig["layout"]["xaxis"]["type"] == "log"
    assert fig["layout"]["title"]["text"] == "Prefix-cache hits of a 470-token shared prefix"


def test_backend_configs():
    assert blocksize.backend_configs(["FLASH_ATTN"], 128) == {
        "attention_backend=FLASH_ATTN": {
            "settings": {"attention_backend": "FLASH_ATTN", "block_size": 128}
        }
    }
    assert blocksize.backend_configs([], 128) == {}


def test_failures_text_names_config_and_error():
    pts = [_point("a"), _point("attention_backend=X", 0, "failed")]
    assert blocksize.failures_text(pts) == "attention_backend=X: EngineFailure: boom"
    assert blocksize.failures_text(pts[:1]) == ""


def test_backends_frame_text_and_figure(pp):
    extra = [_bs_point(128, 0, 70.0, [384], asked="FLASH_ATTN"), _point("x", 1, "failed")]
    backends = blocksize.backends_frame(pp, extra, 470, 128)
    assert backends["block_size"].tolist() == [128, 128, 128]
    assert backends["attention_backend (asked)"].tolist() == ["default", "default", "FLASH_ATTN"]
    assert blocksize.backends_text(backends) == (
        "attention_backend asked default: used CPU_ATTN\n"
        "attention_backend asked FLASH_ATTN: used CPU_ATTN\n"
        "backends in use here: ['CPU_ATTN']"
    )
    assert len(blocksize.backends_frame(pp, [], 470, 32)) == 2  # no backend sweep
    fig = _figure(blocksize.backend_figure(backends, 128))
    (bar,) = fig["data"]
    assert bar["x"] == ["default -> CPU_ATTN", "FLASH_ATTN -> CPU_ATTN"]
    assert bar["y"] == [85.0, 70.0]
    assert "backend" not in backends.columns
    assert fig["layout"]["title"]["text"].endswith("(block_size 128)")


# --------------------------------------------------------------------------- prefill (03)


def test_plan_fills_before_values_and_curve_length(tiny):
    settings = {"max_model_len": 2048}
    p = prefill.plan(settings, tiny, [8192, 2048], 4096, 2048, None, "online", serve_default=8192)
    assert (p.max_model_len, p.before, p.after, p.serve_default) == (2048, 4096, 2048, 8192)
    assert p.values == [2048, 4096, 8192] and p.curve_max_prompt_len == 2047
    assert p.mixed_sweep == "max_num_batched_tokens"
    served = prefill.plan(settings, tiny, [1024], None, 2048, 500, "served", serve_default=8192)
    assert served.before == 8192 and served.values == [1024, 2048, 8192]
    assert served.curve_max_prompt_len == 500
    assert served.mixed_sweep == "max_num_batched_tokens_served"
    no_len = prefill.plan({}, tiny, [], 4096, 2048, None, "online", None)
    assert no_len.max_model_len == tiny.max_position_embeddings
    with pytest.raises(ValueError, match="set before_max_num_batched_tokens"):
        prefill.plan(settings, tiny, [], None, 2048, None, "online", serve_default=None)
    assert prefill.setup_text(p, "cpu", "0.32.0", "tiny-ernie").splitlines() == [
        "platform cpu, vLLM 0.32.0, model tiny-ernie, max_model_len 2048",
        "vllm serve's max_num_batched_tokens here: 8192; before 4096 -> after 2048",
        "max_num_batched_tokens swept under mixed load (online): [2048, 4096, 8192]",
    ]


def test_arithmetic_text(tiny):
    lines = prefill.arithmetic_text(tiny, None, None).splitlines()
    assert lines == [
        "FLOPs(S) = 5.911e+05 * S + 512 * S^2 + 2.62e+05",
        "non-embedding parameters N = 295,552; L=2, H=4, d=32",
        "attention term overtakes the weight term at S = 1,154 tokens",
        "weights 0.001 GB, KV 512 B per token",
        "roofline floor: not drawn (no peak figures for this device)",
    ]
    with_peak = prefill.arithmetic_text(tiny, 989.0, 3.35).splitlines()[-1]
    assert with_peak == "roofline floor: 989.0 TFLOP/s, 3.35 TB/s"
    assert prefill.arithmetic_text(tiny, 989.0, None).endswith(
        "not drawn (no peak figures for this device)"
    )


def test_curve_configs_and_workload():
    assert prefill.curve_configs(4096) == {
        "max_num_batched_tokens=4096": {
            "settings": {"max_num_batched_tokens": 4096, "max_num_seqs": 1}
        }
    }
    w = prefill.curve_workload(24, 16, 2047)
    assert w == {
        "kind": "uniform",
        "num_requests": 24,
        "min_prompt_len": 16,
        "max_prompt_len": 2047,
        "output_len": 1,
        "seed": 0,
    }


def test_failures_text_names_point_and_error():
    pts = [_point("a"), _point("b", 1, "failed")]
    assert prefill.failures_text(pts) == "b-r1 failed: EngineFailure: boom"
    assert prefill.failures_text([]) == ""


def _curve(quadratic=1e-4, repeats=(0, 1)):
    s = np.linspace(20, 2000, 12)
    rows = [
        {"repeat": r, "prompt_tokens": int(x), "alone_ms": 5.0 + 0.05 * x + quadratic * x**2 + r}
        for r in repeats
        for x in s
    ]
    return pd.DataFrame(rows)


def test_curve_summary_per_engine_start():
    t = prefill.curve_summary(_curve())
    assert t.index.tolist() == [0, 1]
    assert t.columns.tolist() == [
        "requests",
        "shortest",
        "longest",
        "fastest_ms",
        "median_ms",
        "slowest_ms",
    ]
    assert t.loc[0, "requests"] == 12 and t.loc[0, "shortest"] == 20 and t.loc[0, "longest"] == 2000
    assert t.loc[1, "fastest_ms"] == pytest.approx(t.loc[0, "fastest_ms"] + 1)


def test_compare_per_start_one_ratio_per_engine_start():
    cmp_in, cmp_out = prefill.compare_per_start(_curve())
    assert cmp_in["score"] == "rms_rel_pct" and cmp_out["score"] == "extrap_rms_rel_pct"
    assert len(cmp_in["ratios"]) == 2 and len(cmp_out["ratios"]) == 2
    assert cmp_in["a"] == "linear+quadratic" and cmp_in["b"] == "constant+exponential"
    assert len(prefill.compare_per_start(_curve(repeats=(0,)))[0]["ratios"]) == 1


def test_curve_figure_fits_floor_and_axes(tiny):
    curve = _curve()
    fits = prefill.fit_all(curve["prompt_tokens"], curve["alone_ms"])
    fig = _figure(prefill.curve_figure(curve, fits, tiny))
    names = [t["name"] for t in fig["data"]]
    assert names[:2] == ["measured, engine start 0", "measured, engine start 1"]
    assert [n.split(" (")[0] for n in names[2:]] == ["linear+quadratic", "constant+exponential"]
    assert "type" not in fig["layout"]["xaxis"]
    assert fig["layout"]["title"]["text"] == prefill.CURVE_TITLES[False]
    floor = _figure(prefill.curve_figure(curve, fits, tiny, 989.0, 3.35, log=True))
    assert floor["data"][-1]["name"] == "roofline floor"
    assert floor["data"][-1]["line"]["dash"] == "dash"
    assert floor["data"][-1]["x"][-1] == 2000.0
    assert floor["data"][-1]["y"][0] == pytest.approx(
        float(prefill.prefill_floor_ms(tiny, 1.0, 989.0, 3.35))
    )
    assert floor["layout"]["xaxis"]["type"] == "log" and floor["layout"]["yaxis"]["type"] == "log"
    assert floor["layout"]["title"]["text"] == prefill.CURVE_TITLES[True]


def test_floor_table_bins_and_ratio(tiny):
    curve = pd.DataFrame({"prompt_tokens": [100, 1000, 2000], "alone_ms": [2.0, 4.0, 8.0]})
    t = prefill.floor_table(curve, tiny, 989.0, 3.35, bins=3)  # one request per bin
    assert t.columns.tolist() == ["alone_ms", "floor_ms", "floor / measured"]
    floor = prefill.prefill_floor_ms(tiny, [100, 1000, 2000], 989.0, 3.35)
    assert t["alone_ms"].tolist() == [2.0, 4.0, 8.0]
    assert t["floor_ms"].to_numpy() == pytest.approx(floor)
    assert t["floor / measured"].to_numpy() == pytest.approx(floor / [2.0, 4.0, 8.0])
    assert "floor_ms" not in curve.columns
    assert len(prefill.floor_table(_curve(), tiny, 989.0, 3.35)) == 6


def test_mixed_workload_and_swept_results():
    w = prefill.mixed_workload(24, 64, 1536, 0.25, 32, 8, 10.0)
    assert w == {
        "kind": "mixed",
        "num_requests": 24,
        "short_len": 64,
        "long_len": 1536,
        "long_fraction": 0.25,
        "output_len": 32,
        "long_output_len": 8,
        "request_rate": 10.0,
        "seed": 0,
    }
    pts = [_point(f"m={m}", settings={"max_num_batched_tokens": m}) for m in (1024, 2048, 4096)] + [
        _point("none")
    ]
    assert [p["config"] for p in prefill.swept_results(pts, [2048, 4096])] == ["m=2048", "m=4096"]


def _req(tokens, ttft, tag):
    return {"prompt_tokens": tokens, "ttft_ms": ttft, "tag": tag}


@pytest.fixture()
def loaded():
    pts = []
    for m, r, short, itl, tput in [
        (2048, 0, 10.0, 2.0, 50.0),
        (2048, 1, 14.0, 4.0, 60.0),
        (4096, 0, 20.0, 6.0, 70.0),
    ]:
        reqs = [_req(64, short, "short"), _req(64, short + 2, "short"), _req(1536, 100.0, "long")]
        metrics = {"itl_p50_ms": itl, "itl_p99_ms": 2 * itl, "output_throughput_tok_s": tput}
        pts.append(
            _point(
                f"m={m}",
                r,
                settings={"max_num_batched_tokens": m},
                metrics=metrics,
                requests=reqs,
            )
        )
    return prefill.mixed_load_table(pts)


def test_mixed_table_shows_its_columns(loaded):
    t = prefill.mixed_table(loaded)
    assert t.columns.tolist() == prefill.MIXED_COLUMNS
    assert t["n_short"].tolist() == [2, 2, 2] and t["n_long"].tolist() == [1, 1, 1]


def test_mixed_figures(loaded):
    ttft = _figure(prefill.mixed_ttft_figure(loaded))
    assert [t["name"] for t in ttft["data"]] == [
        "short TTFT p50",
        "short TTFT p90",
        "long TTFT p50",
    ]
    assert ttft["data"][0]["x"] == ["2048", "4096"]
    assert ttft["data"][0]["y"] == [13.0, 21.0]  # median over starts of each start's p50
    itl = _figure(prefill.mixed_itl_figure(loaded))
    assert [t["name"] for t in itl["data"]] == ["ITL p50", "ITL p99"]
    assert itl["data"][1]["y"] == [6.0, 12.0] and itl["data"][1]["error_y"]["array"] == [2.0, 0.0]
    tput = _figure(prefill.mixed_throughput_figure(loaded))
    assert tput["data"][0]["y"] == [55.0, 70.0]
    assert tput["layout"]["yaxis"]["title"]["text"] == "output tokens/s"
    assert "status" not in loaded.columns


def test_alone_by_class_splits_at_the_bounds():
    curve = pd.DataFrame({"prompt_tokens": [50, 99, 100, 499, 500], "alone_ms": [1, 2, 3, 4, 5.0]})
    assert prefill.alone_by_class(curve, [100, 500]) == {
        "short": [1, 2],
        "medium": [3, 4],
        "long": [5.0],
    }
    assert math.isclose(sum(sum(v) for v in prefill.alone_by_class(curve, [0, 1000]).values()), 15)
