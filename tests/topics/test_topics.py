"""The topic modules' pure functions (baseline, kvcache, blocksize, prefill, claims, plots) on
synthetic point results: arithmetic by hand, tables, and figures through ``fig.to_dict()``.
No engine and no vllm import.
"""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from synthetic import point as _point

from tunebook.core import claims
from tunebook.core.model import ERNIE_03B, GIB, MIB, load_shape
from tunebook.topics import baseline, blocksize, kvcache, plots, prefill


@pytest.fixture(scope="module")
def ernie():
    return load_shape(ERNIE_03B)


@pytest.fixture(scope="module")
def tiny():
    return load_shape("tiny-ernie")


# --------------------------------------------------------------------------- baseline
def test_points_frame_blanks_gauge_peaks_the_sampler_never_saw():
    gauges = {"kv_cache_usage_peak_pct": 0.0, "num_requests_running_peak": 0}
    pts = [
        _point("b", 0, metrics=dict(gauges), timeline=[{"t_s": 0.0}]),
        _point("a", 1, metrics={**gauges, "kv_cache_usage_peak_pct": 7.5}, timeline=[{}, {}]),
        _point("a", 0, capacity={"num_gpu_blocks": 8}, memory={"device_memory_used_gib": 1.5}),
    ]
    df = baseline.points_frame(pts)
    assert list(zip(df["config"], df["repeat"], strict=True)) == [("a", 0), ("a", 1), ("b", 0)]
    assert df.loc[0, "cap_num_gpu_blocks"] == 8 and df.loc[0, "device_memory_used_gib"] == 1.5
    assert df.loc[1, "sampled"] and df.loc[1, "kv_cache_usage_peak_pct"] == 7.5
    assert not df.loc[2, "sampled"] and pd.isna(df.loc[2, "kv_cache_usage_peak_pct"])


def _frames():
    pts = []
    for r, (d, a) in enumerate([(100.0, 200.0), (110.0, 210.0), (105.0, 205.0)]):
        for cfg, e2e in (("default", d), ("article", a)):
            m = {"e2e_mean_ms": e2e, "duration_s": 3.0, "num_requests": 6}
            cap = {"block_size": 16 if cfg == "default" else 32, "max_num_seqs": 256}
            pts.append(_point(cfg, r, metrics=m, capacity=cap))
    pts.append(_point("article", 3, status="failed"))
    return {"chat": baseline.points_frame(pts)}


def test_side_by_side_and_comparison_use_the_one_noise_rule():
    frames = _frames()
    t = baseline.side_by_side(frames, "default", "article")
    e2e = t[t["metric"] == "latency per request, mean (ms)"].iloc[0]
    assert e2e["default"] == "105 [100-110]" and e2e["article"] == "205 [200-210]"
    assert e2e["article/default"] == pytest.approx(1.952, abs=1e-3)
    assert not e2e["within noise"] and e2e["n"] == "3/3"  # the failed point is left out
    per_req = t[t["metric"].str.startswith("article's 'per request'")].iloc[0]
    assert per_req["default"] == "0.5 [0.5-0.5]" and per_req["within noise"]
    c = baseline.comparison(frames, "default", "article", "e2e_mean_ms")["chat"]
    assert c["ratio"] == pytest.approx(205 / 105) and c["noise"].startswith("beyond noise")
    assert baseline.comparison(frames, "default", "article", "nope") == {}


def test_effective_settings_one_row_per_config():
    eff = baseline.effective_settings(_frames())
    assert eff.loc["default", "block_size"] == 16 and eff.loc["article", "block_size"] == 32
    assert eff.loc["article", "max_num_seqs"] == 256


def test_fmt_rounds_by_size():
    assert [baseline._fmt(x) for x in (None, float("nan"), 12345.6, 123.4, 1.23456)] == [
        "n/a",
        "n/a",
        "12,346",
        "123",
        "1.23",
    ]


def test_article_arithmetic(ernie):
    q = baseline.article_qps_from_per_request(3.2, 3)
    assert q["run_s"] == pytest.approx(9.6) and q["implied_qps"] == pytest.approx(0.3125)
    need = baseline.concurrent_kv_need(ernie, 100, 4096)
    assert need["kv_bytes"] == 100 * 4096 * 18432 and need["kv_gib"] == pytest.approx(7.03, 1e-3)
    assert baseline.concurrent_kv_need(ernie, 1, 10, "fp8")["bytes_per_token"] == 9216
    space = baseline.card_kv_space(ernie, 23.65, 0.85)
    assert space == pytest.approx(0.85 * 23.65 - ernie.weight_bytes() / GIB)
    assert baseline.card_kv_space(ernie, 23.65, 0.85, activation_gib=1.0) == pytest.approx(
        space - 1
    )


def test_workload_need_counts_whole_blocks(tiny):
    spec = {"kind": "fixed", "num_requests": 4, "prompt_len": 20, "output_len": 13, "seed": 1}
    need = baseline.workload_need(spec, tiny, block_size=16)
    assert need == {"requests": 4, "tokens": 4 * 33, "blocks": 4 * 3, "tokens_max": 33}


# --------------------------------------------------------------------------- kvcache
def test_formula_table_against_the_article(ernie):
    assert kvcache.article_bytes_per_token() == 16384
    t = kvcache.formula_table(ernie, 4096, 100)
    assert list(t["bytes per token"]) == [16384, 18432, 9216]
    assert list(t["MiB per 4096 tokens"]) == [64.0, 72.0, 36.0]
    assert t["vs correct"].tolist() == [round(16384 / 18432, 4), 1.0, 0.5]
    assert "2 x 18 layers x 2 KV heads x 128 x 2 B" in t["formula"][1]
    shape = kvcache.shape_table(ernie, "ernie")
    assert shape.loc["KV bytes per token (fp8)", "value"] == "9,216"


def test_max_concurrency_and_headroom(ernie):
    t = kvcache.max_concurrency_table(ernie, 16384, 32, [512, 1000])
    assert t["blocks per request"].tolist() == [16, 32]  # 1000 rounds up to 1024
    assert t["max concurrency (full-length requests)"].tolist() == [32.0, 16.0]
    df, per_step = kvcache.headroom_table(ernie, {"card": 10.0}, gmus=(0.8, 0.9), seq_len=4096)
    w = ernie.weight_bytes() / GIB
    assert df["KV GiB (upper bound)"].tolist() == [round(8 - w, 2), round(9 - w, 2)]
    assert df["left to other processes (GiB)"].tolist() == [2.0, 1.0]
    assert per_step["card"] == pytest.approx(0.05 * 10 * GIB / 18432)


def test_kv_memory_and_predicted_tokens(tiny):
    blocks = _point(settings={"num_gpu_blocks_override": 100}, capacity={"block_size": 32})
    assert kvcache.kv_memory_bytes(blocks) == (None, "num_gpu_blocks_override")
    assert kvcache.predicted_tokens(blocks, tiny) == 3200
    sized = _point(settings={"kv_cache_memory_bytes": 8 * MIB, "kv_cache_dtype": "fp8"})
    assert kvcache.predicted_tokens(sized, tiny) == 2 * 16384  # 256 B a token in fp8, block 16
    logged = _point(capacity={"available_kv_gib": 1.5, "block_size": 16})
    assert kvcache.kv_memory_bytes(logged) == (1.5 * GIB, "engine log (GiB, 2 decimals)")
    assert kvcache.predicted_tokens(_point(), tiny) is None


def test_capacity_table_and_same_memory_groups(tiny):
    pts = []
    for mml, tokens in ((512, 16384), (2048, 16384), (2048, 16384)):
        pts.append(
            _point(
                f"m{mml}",
                len(pts),
                settings={"kv_cache_memory_bytes": 8 * MIB},
                capacity={"block_size": 32, "kv_capacity_tokens": tokens, "max_model_len": mml},
            )
        )
    pts.append(_point("x", 9, status="failed"))
    cap = kvcache.capacity_table(pts, tiny)
    assert len(cap) == 3 and cap["residual %"].tolist() == [0.0, 0.0, 0.0]
    assert cap["max concurrency at max_model_len"].tolist() == [32.0, 8.0, 8.0]
    groups = kvcache.same_memory_groups(cap)
    assert groups["max_model_len"].tolist() == [512, 2048]
    assert groups["engine tokens"].tolist() == [[16384], [16384]]
    assert groups["engines"].tolist() == [1, 2]
    assert kvcache.same_memory_groups(cap[cap["max_model_len"] == 2048]).empty


def test_residual_bound_explains_the_gpu_residuals_and_sized_engines_are_exact():
    """Qwen3-0.6B on an H100 (runs/h100-20261207q): engines sized by gpu_memory_utilization are
    predicted from the log's 2-decimal GiB and came out 0.014% and 0.002% off; one sized in
    bytes has no rounding to hide behind."""
    qwen3 = load_shape("qwen3-0.6b")

    def logged(gib, tokens):
        return _point(
            settings={"gpu_memory_utilization": 0.5},
            capacity={"available_kv_gib": gib, "block_size": 16, "kv_capacity_tokens": tokens},
        )

    sized = _point(
        settings={"kv_cache_memory_bytes": 16 * GIB},
        capacity={"block_size": 16, "kv_capacity_tokens": 16 * GIB // (16 * 114688) * 16},
    )
    pts = [logged(37.81, 353936), logged(69.43, 650000), sized]
    # (0.005 GiB + one block of 16 x 114,688 B) over 37.81 GiB
    assert kvcache.residual_bound_pct(pts[0], qwen3) == pytest.approx(
        100 * (0.005 * GIB + 16 * 114688) / (37.81 * GIB)
    )
    assert kvcache.residual_bound_pct(sized, qwen3) == 0.0
    assert kvcache.residual_bound_pct(_point(), qwen3) is None
    cap = kvcache.capacity_table(pts, qwen3)
    assert cap["residual %"].tolist() == [-0.014, -0.002, 0.0]
    assert cap["residual bound %"].tolist() == [0.018, 0.01, 0.0]
    assert "residual bound %" in kvcache.capacity_text(cap).splitlines()[0]
    words = kvcache._rounding_words(cap)
    assert "2 sized from the engine log's GiB (2 decimals), which allows up to 0.018%" in words
    assert "all within it" in words and "NOT" not in words
    assert words.endswith("1 sized in bytes: largest |residual| 0.000%")
    # A residual beyond the rounding is arithmetic that is wrong, and says so.
    off = kvcache.capacity_table([logged(37.81, 350000)], qwen3)
    assert "NOT all within it" in kvcache._rounding_words(off)
    # Engines all sized in bytes (the CPU profiles): no bound column, no extra words.
    exact = kvcache.capacity_table([sized], qwen3)
    assert "bound" not in kvcache.capacity_text(exact) and kvcache._rounding_words(exact) == ""


def test_gmu_slope_pairs_engines_that_differ_in_gmu_only(ernie):
    def gpu(gmu, tokens):
        return _point(
            capacity={
                "gpu_memory_utilization": gmu,
                "kv_capacity_tokens": tokens,
                "block_size": 16,
            },
            memory={"device_memory_total_gib": 139.8},
        )

    (s,) = kvcache.gmu_slope([gpu(0.5, 3989040), gpu(0.9, 7246624)], ernie)
    assert s["tokens per 0.05 gmu, measured"] == 407198
    assert s["tokens per 0.05 gmu, predicted"] == int(0.05 * 139.8 * GIB / 18432)
    assert abs(s["residual %"]) < 0.01
    assert kvcache.gmu_slope([gpu(0.9, 1)], ernie) == []


def test_pressure_table_needs_and_unsampled_peaks(tiny):
    reqs = [{"prompt_tokens": 20, "output_tokens": 13}] * 4  # 3 blocks of 16 each
    p = _point(
        settings={"num_gpu_blocks_override": 6},
        capacity={"block_size": 16, "kv_capacity_tokens": 96},
        metrics={"num_preemptions": 3, "kv_cache_usage_peak_pct": 0.0},
        requests=reqs,
        timeline=[{}],
    )
    assert kvcache.held_blocks(p, 16) == 12 and not kvcache.sampled(p)
    row = kvcache.pressure_table([p], tiny, "num_gpu_blocks_override").iloc[0]
    assert (
        row["num_gpu_blocks_override"] == 6 and row["workload needs (tokens, all at once)"] == 192
    )
    assert row["capacity / need"] == 0.5 and row["preemptions"] == 3
    assert row["KV usage peak %"] is None


def test_spec_of_keeps_the_keys_of_its_kind():
    p = _point(workload={"kind": "fixed", "prompt_len": 8, "num_requests": 4, "prompt_tokens": 32})
    assert kvcache.spec_of(p) == {"kind": "fixed", "prompt_len": 8, "num_requests": 4}


def test_prefix_prediction_counts_whole_blocks(tiny):
    spec = {
        "kind": "shared_prefix",
        "num_requests": 12,
        "prompt_len": 512,
        "prefix_share": 0.5,
        "num_prefixes": 2,
        "output_len": 8,
        "seed": 13,
    }
    on = kvcache.prefix_prediction(spec, tiny, 32, enabled=True)
    assert on["prefix_len"] == 256 and on["shared blocks per prefix"] == 8
    assert on["predicted cached tokens"] == 10 * 8 * 32  # every request after each prefix's first
    assert on["KV blocks without sharing"] == 12 * 17 and on["predicted KV blocks"] == 204 - 80
    assert on["predicted hit rate %"] == pytest.approx(100 * 2560 / (12 * 512))
    off = kvcache.prefix_prediction(spec, tiny, 32, enabled=False)
    assert off["predicted KV saved %"] == 0.0 and off["predicted cached tokens"] == 0
    # a 100-token prefix in blocks of 64 shares one block, not 100/64 of one
    assert (
        kvcache.prefix_prediction({**spec, "prefix_share": 100 / 512}, tiny, 64, True)[
            "shared blocks per prefix"
        ]
        == 1
    )


def test_prefix_table_joins_prediction_and_measurement(tiny):
    spec = {"kind": "shared_prefix", "num_requests": 4, "prompt_len": 64, "num_prefixes": 1}
    p = _point(
        settings={"enable_prefix_caching": True},
        workload={**spec, "prefix_share": 0.5, "output_len": 4, "seed": 0},
        capacity={"block_size": 16, "num_gpu_blocks": 200},
        metrics={"kv_cache_usage_peak_pct": 5.0, "prefix_cache_hit_rate_pct": 37.5},
        timeline=[{}, {}],
    )
    row = kvcache.prefix_table([p], tiny).iloc[0]
    assert row["KV blocks at peak (sampled)"] == 10.0 and row["hit rate %"] == 37.5
    assert row["predicted cached tokens"] == 3 * 32 and row["prefix_share"] == 0.5


def _outputs(tokens, logprobs):
    return [{"token_ids": t, "logprobs": lp} for t, lp in zip(tokens, logprobs, strict=True)]


def test_drift_pairs_runs_up_to_the_first_divergence():
    a = _outputs([[1, 2, 3, 4], [5, 6]], [[-1.0, -2.0, -3.0, -4.0], [-1.0, -1.0]])
    b = _outputs([[1, 2, 9, 4], [5, 6]], [[-1.5, -2.0, -3.5, -9.0], [-1.0, -1.25]])
    d = kvcache._pair(a, b)
    assert d["token agreement %"] == pytest.approx(100 * 5 / 6)
    assert d["identical outputs %"] == 50.0 and d["mean first divergence (tokens)"] == 2.0
    # same context: positions 0-2 of the first request, 0-1 of the second; position 3 is not
    assert d["max |d logprob| (same context)"] == 0.5
    assert d["mean |d logprob| (same context)"] == pytest.approx(1.25 / 5)
    assert d["mean |d logprob| first token"] == 0.25
    ref = _point("ref", 0, requests=a)
    pts = [ref, _point("ref", 1, requests=a), _point("fp8", 0, requests=b)]
    pts[2]["settings"] = {"kv_cache_dtype": "fp8"}
    t = kvcache.drift_table(pts, "ref")
    assert t["config"].tolist() == ["fp8", "ref"] and t["vs"].tolist() == ["ref r0", "ref r0"]
    assert t["kv_cache_dtype"].tolist() == ["fp8", "auto"]
    assert t.loc[1, "token agreement %"] == 100.0
    assert kvcache.drift_table(pts, "missing").empty


def test_flat_logprobs():
    flat = -math.log(1024)
    assert kvcache.flat_logprobs([_point(requests=[{"logprobs": [flat, None, flat]}])], 1024)
    assert not kvcache.flat_logprobs([_point(requests=[{"logprobs": [flat, -1.0]}])], 1024)
    assert not kvcache.flat_logprobs([_point(requests=[{"logprobs": []}])], 1024)


def test_fp8_speed_and_resolved_default():
    def run(dtype, tput, status="ok", **cap):
        settings = {} if dtype == "auto" else {"kv_cache_dtype": dtype}
        m = {"output_throughput_tok_s": tput}
        return _point(status=status, settings=settings, metrics=m, capacity=cap)

    pts = [run("auto", 100.0), run("auto", 110.0), run("fp8", 121.0), run("fp8", 0, "failed")]
    c = kvcache.fp8_speed(pts)
    assert c["ratio"] == pytest.approx(121 / 105) and c["a"]["n"] == 2 and c["b"]["n"] == 1
    assert kvcache.fp8_speed(pts[:2]) is None
    on = [run("auto", 1, enable_prefix_caching=True), run("auto", 1, enable_prefix_caching=True)]
    assert kvcache.resolved_default(on, "enable_prefix_caching") is True
    mixed = [*on, run("auto", 1, enable_prefix_caching=False)]
    assert kvcache.resolved_default(mixed, "enable_prefix_caching") is False
    explicit = _point(settings={"enable_prefix_caching": False}, capacity={})
    assert kvcache.resolved_default([explicit], "enable_prefix_caching") is None


# --------------------------------------------------------------------------- blocksize
def _engine_point(bs, status="ok", used=None, repeat=0):
    return _point(
        f"b{bs}",
        repeat,
        status,
        settings={"block_size": bs},
        capacity={"block_size": used or bs} if status == "ok" else {},
    )


def test_validity_check_then_engine():
    screened = [
        {"block_size": 8, "settings check": "rejected", "error": "too small"},
        {"block_size": 16, "settings check": "passed", "error": ""},
        {"block_size": 32, "settings check": "passed", "error": ""},
        {"block_size": 64, "settings check": "passed", "error": ""},
        {"block_size": 128, "settings check": "passed", "error": ""},
    ]
    assert blocksize.passed(screened) == [16, 32, 64, 128]
    probe = [
        _engine_point(16, "failed"),
        _engine_point(32, used=64),
        _engine_point(64, repeat=1),
        _engine_point(64, "failed", repeat=0),
    ]
    rows = {r["block_size"]: r for r in blocksize.validity(screened, probe)}
    assert rows[8]["engine"] == "not started" and rows[8]["error"] == "too small"
    assert rows[16]["engine"] == "rejected" and "boom" in rows[16]["error"]
    assert rows[32]["engine"] == "started with block_size 64" and not rows[32]["valid"]
    assert rows[64]["engine"] == "rejected"  # the first repeat decides
    assert rows[128]["engine"] == "not probed"
    assert blocksize.valid_sizes(blocksize.validity(screened, [_engine_point(128)])) == [128]


def test_prefix_hits_in_whole_blocks():
    assert [blocksize.floor_blocks(470, b) for b in (16, 128)] == [464, 384]
    reqs = [
        {"tag": "a", "cached_tokens": 0},
        {"tag": "b", "cached_tokens": 0},
        {"tag": "a", "cached_tokens": 464},
        {"tag": "b", "cached_tokens": None},
    ]
    assert blocksize.warm_cached_tokens(reqs) == [464, 0]


def _bs_point(bs, repeat, tput, cached, backend="FLASH_ATTN"):
    reqs = [{"tag": "p", "cached_tokens": 0}] + [{"tag": "p", "cached_tokens": c} for c in cached]
    return _point(
        f"block_size={bs}",
        repeat,
        settings={"block_size": bs},
        capacity={"block_size": bs, "num_gpu_blocks": 1024 // bs, "kv_capacity_tokens": 1024},
        env={"attention_backend": backend},
        metrics={"output_throughput_tok_s": tput, "ttft_p50_ms": 1.0, "tpot_p50_ms": 2.0},
        requests=reqs,
    )


def test_per_point_summary_granularity_and_ranking():
    pts = [
        _bs_point(128, 0, 130.0, [384, 384]),
        _bs_point(16, 1, 110.0, [464, 464, 464]),
        _bs_point(16, 0, 100.0, [464, 448, 464]),
        _bs_point(128, 1, 140.0, [384, 384]),
        _point("x", 0, "failed"),
    ]
    df = blocksize.per_point(pts, prefix_len=470)
    assert df["block_size"].tolist() == [16, 16, 128, 128]
    assert df["cached_tokens_per_warm_request"].tolist() == [464.0, 464.0, 384.0, 384.0]
    assert df["arithmetic floor(prefix/block)*block"].tolist() == [464, 464, 384, 384]
    s = blocksize.summary(df, prefix_len=470)
    assert s["output tok/s (median)"].tolist() == [105.0, 135.0]
    assert s["output tok/s (min-max)"].tolist() == ["100-110", "130-140"]
    assert s["prefix tokens lost"].tolist() == [6, 86]
    gran = blocksize.granularity_check(df, 470)
    assert [g["match"] for g in gran] == [True, True]
    df.loc[0, "cached_tokens_per_warm_request"] = 448.0
    assert blocksize.granularity_check(df, 470)[0] == {
        "block_size": 16,
        "measured": [448, 464],
        "expected": 464,
        "match": False,
    }
    rank = blocksize.speed_ranking(df)
    assert rank["best"] == 128 and rank["vs_best"][16]["ratio"] == pytest.approx(105 / 135)
    assert blocksize.per_point([], 470).columns.tolist() == blocksize.PER_POINT_COLUMNS


def test_backend_rows_group_by_asked_and_used():
    pts = [_bs_point(16, r, 100.0 + r, [464], backend=b) for r, b in enumerate("AAB")]
    pts[2]["settings"]["attention_backend"] = "B"
    rows = blocksize.backend_rows(blocksize.per_point(pts))
    assert rows["attention_backend (asked)"].tolist() == ["default", "B"]
    assert rows["engine starts"].tolist() == [2, 1]
    assert rows["output tok/s (median)"].tolist() == [100.5, 102.0]


# --------------------------------------------------------------------------- prefill
def test_flops_polynomial_and_floor(ernie):
    c = prefill.prefill_coefficients(ernie)
    assert c["quadratic_flops"] == 2 * 18 * 16 * 128 == 73728
    emb = ernie.vocab_size * ernie.hidden_size
    assert c["linear_flops"] == 2 * (ernie.param_count - emb)  # tied: one embedding table
    s = np.array([1000.0, 8192.0])
    assert prefill.prefill_flops(ernie, s) == pytest.approx(
        c["const_flops"] + c["linear_flops"] * s + 73728 * s**2
    )
    assert prefill.crossover_len(ernie) == pytest.approx(c["linear_flops"] / 73728)
    assert 6800 < prefill.crossover_len(ernie) < 7000
    # one token: the weights must be read once (memory-bound); long prompts are compute-bound
    floor = prefill.prefill_floor_ms(ernie, [1, 16000], peak_tflops=989.0, hbm_tb_s=4.8)
    assert floor[0] == pytest.approx(1e3 * (c["weight_bytes"] + 18432) / 4.8e12)
    assert floor[1] == pytest.approx(1e3 * prefill.prefill_flops(ernie, 16000) / 989e12)
    assert "73,728 * S^2" in prefill.doc_coefficients(ernie)


@pytest.mark.parametrize(
    ("model", "params", "truth"),
    [
        ("linear", {"c0": 5.0, "c1": 0.01}, lambda s: 5 + 0.01 * s),
        (
            "linear+quadratic",
            {"c0": 5.0, "c1": 0.01, "c2": 1e-6},
            lambda s: 5 + 0.01 * s + 1e-6 * s**2,
        ),
        ("exponential", {"a": 2.0, "b": 1e-3}, lambda s: 2 * np.exp(1e-3 * s)),
        (
            "constant+exponential",
            {"c": 10.0, "a": 2.0, "b": 1e-3},
            lambda s: 10 + 2 * np.exp(1e-3 * s),
        ),
    ],
)
def test_fit_recovers_its_own_model(model, params, truth):
    s = np.linspace(100, 4000, 30)
    f = prefill.fit(model, s, truth(s))
    assert f.rms_rel_pct < 1e-3 and f.extrap_rms_rel_pct < 1e-2
    for k, v in params.items():
        assert f.params[k] == pytest.approx(v, rel=1e-3)
    assert f.predict(2000.0) == pytest.approx(truth(2000.0), rel=1e-5)
    row = f.row()
    assert row["formula"] == prefill.FORMULAS[model] and row["n"] == 30
    if "b" in params:
        assert f.extra["doubling_tokens"] == pytest.approx(math.log(2) / 1e-3, rel=1e-3)


def test_fit_needs_more_points_than_parameters():
    with pytest.raises(ValueError, match="3 points, need at least 4"):
        prefill.fit("linear+quadratic", [1, 2, 3, float("nan")], [1, 2, 3, 4])


def _fits(rms):
    """rms: model -> in-sample residual %, as a list of Fit stubs."""
    return [prefill.Fit(m, {}, r, r, extrap_rms_rel_pct=r) for m, r in rms.items()]


def test_compare_fits_and_ranking_lines():
    poly = [_fits({"linear+quadratic": 1.0, "constant+exponential": 2.0})] * 3
    c = prefill.compare_fits(poly)
    assert c["winner"] == "linear+quadratic" and c["robust"] and c["ratios"] == [2.0] * 3
    mixed = [*poly, _fits({"linear+quadratic": 1.0, "constant+exponential": 1.2})]
    assert prefill.compare_fits(mixed)["robust"] is False
    expo = prefill.compare_fits([_fits({"linear+quadratic": 3.0, "constant+exponential": 1.0})])
    assert expo["winner"] == "constant+exponential" and expo["robust"]
    assert (
        prefill.compare_fits([_fits({"linear+quadratic": 0.0, "constant+exponential": 1.0})])[
            "winner"
        ]
        is None
    )
    lines = prefill.ranking_lines(poly[0], c, prefill.compare_fits(mixed))
    assert (
        lines[-2]
        == "in-sample residual: linear+quadratic fits better in every engine start (by >= 1.5x)"
    )
    assert lines[-1].startswith("extrapolation to the longer half: no robust winner")
    noisy = _fits({"linear+quadratic": 30.0, "constant+exponential": 40.0})
    assert prefill.ranking_lines(noisy, c, c)[-1].startswith("too noisy to rank")


def _req(tokens, ttft, tag="", prefill_ms=None):
    return {"prompt_tokens": tokens, "ttft_ms": ttft, "tag": tag, "prefill_ms": prefill_ms}


def test_curve_points_and_classes():
    p = _point(requests=[_req(300, 30.0, prefill_ms=20.0), _req(50, 5.0, prefill_ms=4.0)])
    curve = prefill.curve_points([p, _point("y", 0, "failed")])
    assert curve["prompt_tokens"].tolist() == [50, 300] and curve["alone_ms"].tolist() == [
        4.0,
        20.0,
    ]
    assert prefill.curve_points([p], field="ttft_ms")["alone_ms"].tolist() == [5.0, 30.0]
    assert [prefill.length_class(n, (100, 500)) for n in (99, 100, 499, 500)] == [
        "short",
        "medium",
        "medium",
        "long",
    ]
    by_len = prefill.class_ttft([p], bounds=(100, 500))[("a", 0)]
    assert by_len["short"] == 5.0 and by_len["medium"] == 30.0 and by_len["n_mixed"] == 2


def test_mixed_load_table_per_class_percentiles():
    reqs = [_req(16, t, "short") for t in (10.0, 20.0, 30.0)] + [_req(900, 100.0, "long")]
    pts = [
        _point(
            "m=2048",
            0,
            settings={"max_num_batched_tokens": 2048},
            metrics={"itl_p99_ms": 9.0, "output_throughput_tok_s": 50.0},
            requests=reqs,
        ),
        _point("m=8192", 0, settings={"max_num_batched_tokens": 8192}, metrics={}, requests=[]),
    ]
    df = prefill.mixed_load_table(pts)
    row = df.iloc[0]
    assert row["max_num_batched_tokens"] == 2048 and row["itl_p99_ms"] == 9.0
    assert row["ttft_short_p50_ms"] == 20.0 and row["ttft_short_p90_ms"] == pytest.approx(28.0)
    assert row["ttft_mixed_p50_ms"] == 25.0 and row["n_short"] == 3 and row["n_long"] == 1
    assert math.isnan(df.iloc[1]["ttft_short_p50_ms"]) and df.iloc[1]["n_short"] == 0
    long = prefill.long_form(df, "max_num_batched_tokens", {"short p50": "ttft_short_p50_ms"})
    assert long.columns.tolist() == [
        "max_num_batched_tokens",
        "repeat",
        "value",
        "metric",
        "status",
    ]
    assert long["metric"].unique().tolist() == ["short p50"]


def test_fit_curves_label_each_model_with_its_residual():
    f = prefill.fit("linear", [1, 2, 3, 4], [2, 4, 6, 8])
    ((label, (xs, ys)),) = prefill.fit_curves([f], s_max=10, n=5).items()
    assert label == "linear (0.0%)" and xs.tolist() == [1.0, 3.25, 5.5, 7.75, 10.0]
    assert ys == pytest.approx(2 * xs)


# --------------------------------------------------------------------------- claims
def test_verdict_is_checked():
    with pytest.raises(ValueError, match="unknown claim 'C99'"):
        claims.verdict("C99", "refuted", "x", "y")
    with pytest.raises(ValueError, match="verdict must be one of"):
        claims.verdict("C1", "wrong", "x", "y")


def test_ledger_round_trip_sorted_by_claim_number(tmp_path):
    v2 = claims.verdict("C2", "refuted", "18,432 B", "cap", spread="0%", note="n")
    v10 = claims.verdict("C10", "partly", "x0.5", "mnbt")
    v9 = claims.verdict("C9", "refuted", "2 missing", "checks")
    claims.write(tmp_path, "03_prefill_scaling", [v10])
    path = claims.write(tmp_path, "00_baseline", [v9, v2])
    assert json.loads(path.read_text())[0]["claim"] == "C9"
    ledger = claims.read_all(tmp_path)
    assert [v["claim"] for v in ledger] == ["C2", "C9", "C10"]
    assert [v["notebook"] for v in ledger] == ["00_baseline", "00_baseline", "03_prefill_scaling"]
    t = claims.table(ledger)
    assert t.columns.tolist() == [*["claim", "verdict", "figure", "spread"], "evidence", "note"] + [
        "text",
        "notebook",
    ]
    assert "notebook" not in claims.table([v2]).columns


def test_describe_and_headline():
    v = claims.verdict("C4", "refuted", "16 not valid", "ev", spread="s", note="n")
    assert claims.describe(v) == "C4 REFUTED: 16 not valid\n  spread: s\n  note: n"
    assert claims.headline(v) == f"C4 refuted: {claims.CLAIMS['C4']}"


# --------------------------------------------------------------------------- plots
def _figure(fig) -> dict:
    """fig.to_dict() with numeric arrays as lists (plotly 6 writes them as base64 ``bdata``)."""

    def plain(x):
        if isinstance(x, dict) and "bdata" in x:
            return np.frombuffer(base64.b64decode(x["bdata"]), dtype=x["dtype"]).tolist()
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [plain(v) for v in x]
        return x

    return plain(fig.to_dict())


def _spread_frame():
    return pd.DataFrame(
        {
            "x": [1, 1, 1, 2, 2, 2],
            "y": [10.0, 12.0, 14.0, 20.0, 21.0, 25.0],
            "g": ["a", "a", "b", "a", "a", "b"],
            "status": ["ok", "ok", "ok", "ok", "ok", "failed"],
        }
    )


def test_bar_with_spread_median_and_whiskers():
    d = _figure(plots.bar_with_spread(_spread_frame(), "x", "y", title="t", yaxis="ms"))
    (bar,) = d["data"]
    assert list(bar["x"]) == ["1", "2"] and list(bar["y"]) == [12.0, 20.5]
    assert list(bar["error_y"]["array"]) == [2.0, 0.5]
    assert list(bar["error_y"]["arrayminus"]) == [2.0, 0.5]
    assert d["layout"]["yaxis"]["title"]["text"] == "ms" and d["layout"]["title"]["text"] == "t"
    grouped = _figure(plots.bar_with_spread(_spread_frame(), "x", "y", color="g"))
    assert [t["name"] for t in grouped["data"]] == ["a", "b"]
    assert list(grouped["data"][1]["y"]) == [14.0]  # b at x=2 failed


def test_panels_one_subplot_per_metric():
    df = _spread_frame().assign(z=lambda f: f["y"] * 2)
    d = _figure(plots.panels(df, "x", ["y", ("z", "z doubled")], color="g", log_x=True))
    assert [a["text"] for a in d["layout"]["annotations"]] == ["y", "z doubled"]
    assert len(d["data"]) == 4 and [t["showlegend"] for t in d["data"]] == [
        True,
        True,
        False,
        False,
    ]
    assert d["data"][2]["xaxis"] == "x2" and list(d["data"][2]["y"]) == [22.0, 41.0]
    assert d["layout"]["xaxis"]["type"] == "log"


def test_timeline_two_axes():
    samples = [
        {"t_s": 0.0, "vllm:kv_cache_usage_perc": 0.1, "vllm:num_requests_running": 4},
        {"t_s": 0.25, "vllm:kv_cache_usage_perc": 0.3, "vllm:num_requests_waiting": 2},
    ]
    d = _figure(plots.timeline(samples))
    kv, running, waiting = d["data"]
    assert list(kv["y"]) == [0.1, 0.3] and kv["yaxis"] == "y"
    assert list(running["y"]) == [4, 0] and list(waiting["y"]) == [0, 2]
    assert waiting["yaxis"] == "y2" and d["layout"]["yaxis"]["range"] == [0, 1]


def test_predicted_vs_measured_draws_the_diagonal():
    df = pd.DataFrame({"p": [100, 1000, None], "m": [110, 990, 5], "name": ["a", "b", "c"]})
    d = _figure(plots.predicted_vs_measured(df, "p", "m", "name", log=True, unit="tokens"))
    engines, diagonal = d["data"]
    assert list(engines["text"]) == ["a", "b"] and list(diagonal["x"]) == [100.0, 1000.0]
    assert list(diagonal["y"]) == [100.0, 1000.0]
    assert d["layout"]["xaxis"]["title"]["text"] == "predicted (tokens)"
    assert d["layout"]["yaxis"]["type"] == "log"


def test_lines_and_scatter_with_curves():
    df = pd.DataFrame({"s": [3, 1, 2], "a": [30, 10, 20], "b": [3, 1, 2]})
    d = _figure(plots.lines(df, "s", {"measured": "a", "floor": "b"}, dashed=("floor",)))
    assert list(d["data"][0]["x"]) == [1, 2, 3] and list(d["data"][0]["y"]) == [10, 20, 30]
    assert d["data"][1]["line"]["dash"] == "dash" and "dash" not in d["data"][0].get("line", {})
    d = _figure(
        plots.scatter_with_curves(
            {"pts": ([1, 2], [3, 4])}, {"fit": ([1, 2], [3, 5])}, log_x=True, log_y=True
        )
    )
    assert [t["mode"] for t in d["data"]] == ["markers", "lines"]
    assert d["layout"]["xaxis"]["type"] == "log" and d["layout"]["yaxis"]["type"] == "log"


def test_04s_tradeoff_views_from_the_kept_qwen3_run():
    """runs/h100-20261207q: both configurations' sustained capacity against the TTFT p99 and the
    chunk-gap p99 at it, with the SLO's bounds; the deployment serves more at longer gaps, so
    both sit on the chunk-gap front, and more at a shorter TTFT p99, so it alone is on that one."""
    from tunebook.core.results import SweepDir
    from tunebook.topics import headroom

    root = Path(__file__).resolve().parents[2]
    folder = root / "runs" / "h100-20261207q" / "04_engine_overhead" / "capacity"
    pts = SweepDir(folder).points()
    slo = headroom.served_slo(500, 50, 99, 1000)
    lever = "replicas=4_stream_interval=16"
    ttft, gap = (f.to_dict() for f in headroom.tradeoff_figures(pts, slo, chosen=lever))
    assert ttft["layout"]["title"]["text"].startswith("Figure 4.3. Sustained capacity against")
    assert [s["x0"] for s in ttft["layout"]["shapes"]] == [500.0]
    assert [s["x0"] for s in gap["layout"]["shapes"]] == [1000.0]
    by = {t["name"]: t for t in gap["data"]}
    assert by[f"{lever} (chosen)"]["y"][0] == 152.25299732622676  # median of 152.3, 128, 152.3
    assert by["default"]["y"][0] == 45.26166902404526
    assert 600 < by[f"{lever} (chosen)"]["x"][0] < 800 and by["default"]["x"][0] < 100
    assert len(by["Pareto front"]["x"]) == 2
    # on TTFT the deployment beats the default on both axes: a front of one, no line drawn
    assert "Pareto front" not in {t["name"] for t in ttft["data"]}
    assert ttft["layout"]["yaxis"]["rangemode"] == "tozero"


def test_04s_tradeoff_views_draw_the_slo_the_points_were_judged_by():
    """A point keeps its SLO as limits (``Result.slo``), so a reader of the run folder alone (the
    report) draws the same bounds as the notebook that had the SLO in hand."""
    from tunebook.core.points import Point, Result
    from tunebook.topics import headroom

    slo = {"ttft_ms": 500.0, "tpot_ms": 50.0, "itl_ms": 1000.0}
    point = Point.from_dict(
        {"point_id": "p", "model": "tiny-ernie", "workload": {}, "mode": "served", "slo": slo}
    )
    assert Result.skeleton(point).to_dict()["slo"] == slo

    def pt(config, cap, ttft, gap):
        m = {
            "capacity_rps": cap,
            "ttft_p99_ms_at_capacity": ttft,
            "chunk_gap_p99_ms_at_capacity": gap,
        }
        return {"config": config, "status": "ok", "metrics": m, "slo": slo}

    pts = [pt("default", 100.0, 80.0, 20.0), pt("replicas=2", 180.0, 120.0, 400.0)]
    ttft, gap = (f.to_dict() for f in headroom.tradeoff_figures(pts))
    assert [s["x0"] for s in ttft["layout"]["shapes"]] == [500.0]
    assert [s["x0"] for s in gap["layout"]["shapes"]] == [1000.0]
    # an SLO given wins; a run folder of points without one draws no bound
    assert (
        not headroom.tradeoff_figures(pts, {"ttft_ms": 300.0})[1].to_dict()["layout"].get("shapes")
    )
    bare = [{k: v for k, v in p.items() if k != "slo"} for p in pts]
    assert not headroom.tradeoff_figures(bare)[0].to_dict()["layout"].get("shapes")
