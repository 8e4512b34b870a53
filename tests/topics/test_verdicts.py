"""Every claim's verdict function on synthetic results: each reachable verdict word, and the figures
that decide it. Pure logic (no engine, no vllm import): the numbers are made up so that each branch
of each verdict is taken on purpose.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from synthetic import point

from tunebook.core import claims
from tunebook.core.model import ERNIE_03B, load_shape
from tunebook.deploy import writers
from tunebook.topics import baseline, blocksize, kvcache, prefill, presets
from tunebook.topics.assemble import validation_table

EV = "runs/test/sweep"


@pytest.fixture(scope="module")
def ernie():
    return load_shape(ERNIE_03B)


@pytest.fixture(scope="module")
def tiny():
    return load_shape("tiny-ernie")


def _is_verdict(v: dict, claim: str, word: str) -> None:
    assert v["claim"] == claim and v["verdict"] == word, (v["verdict"], v["figure"], v["note"])
    assert v["text"] == claims.CLAIMS[claim]


# --------------------------------------------------------------------------- 00: C1, C6, C9
def _point(config, repeat, metrics, status="ok", capacity=None, memory=None, timeline=2, wl="chat"):
    return point(
        config,
        repeat,
        status,
        workload={"name": wl},
        metrics=metrics if status == "ok" else {},
        capacity=capacity or {},
        memory=memory or {},
        timeline=[{"t_s": i * 0.25} for i in range(timeline)],
    )


def _baseline_frames(e2e_default, e2e_article, memory=None):
    pts = []
    for r, (d, a) in enumerate(zip(e2e_default, e2e_article, strict=True)):
        for cfg, e2e in (("default", d), ("article", a)):
            m = {
                "e2e_mean_ms": e2e,
                "request_throughput_rps": 1000 / e2e,
                "duration_s": 2.0,
                "num_requests": 16,
            }
            cap = {"gpu_memory_utilization": 0.92 if cfg == "default" else 0.85}
            pts.append(_point(cfg, r, m, capacity=cap, memory=memory))
    return {"chat": baseline.points_frame(pts)}


def test_c1_not_reproducible_with_the_articles_own_arithmetic():
    frames = _baseline_frames([100.0, 120.0, 110.0], [90.0, 95.0, 93.0])
    v = baseline.c1_verdict(frames, "cpu", 3, EV, "0.32.0", card_gib=23.65)
    _is_verdict(v, "C1", "not reproducible")
    assert "chat: 110 ms per request (e2e mean), 9.1 QPS" in v["figure"]
    assert "no device memory on CPU" in v["figure"]
    # 3.2 s over 3 prompts is a 9.6 s run: 0.31 requests/s; gmu 0.92 of 23.65 GiB is 21.8 GiB
    assert "9.6 s run, 0.31 requests/s" in v["note"]
    assert "default 0.92 in vLLM 0.32.0" in v["note"] and "21.8 GiB on a 23.65 GiB" in v["note"]
    assert v["note"].endswith("say nothing about a GPU.")


def test_c1_on_a_gpu_reports_device_memory_and_no_cpu_caveat():
    mem = {"device_memory_used_gib": 130.2}
    frames = _baseline_frames([10.0, 11.0], [12.0, 13.0], memory=mem)
    v = baseline.c1_verdict(frames, "cuda", 2, EV, "0.26.0", card_gib=139.8)
    assert "on cuda device" in v["figure"] and "device memory 130.2 GiB" in v["figure"]
    assert "say nothing about a GPU" not in v["note"]


def test_c1_served_on_a_gpu_does_not_blame_the_cpu():
    """Served points carry no device memory (the engine is the server's): not a CPU caveat."""
    frames = _baseline_frames([10.0, 11.0], [12.0, 13.0])
    v = baseline.c1_verdict(frames, "cuda", 2, EV, "0.26.0", card_gib=139.8)
    assert "device memory not read (served" in v["figure"] and "CPU" not in v["figure"]


def _concurrent(peaks=(9.3, 9.4), status=("ok", "ok"), preemptions=(0, 0)):
    pts = []
    for cfg, peak, st, pre in zip(("default", "article"), peaks, status, preemptions, strict=True):
        m = {"num_preemptions": pre, "kv_cache_usage_peak_pct": peak}
        if cfg == "default":
            m["num_requests_running_peak"] = 100
        pts.append(_point(cfg, 0, m, status=st, timeline=1 if peak is None else 3))
    return baseline.points_frame(pts)


def test_c6_refuted_when_the_card_holds_100_requests(ernie):
    arith = baseline.c6_arithmetic(ernie, 23.65, 0.85, 4096)
    assert arith["bytes_per_token"] == 18432 and arith["kv_gib"] == pytest.approx(7.03, abs=0.01)
    assert arith["requests_that_fit"] == 276  # 19.43 GiB of KV after 0.67 GiB of weights
    frames = _baseline_frames([100.0, 101.0, 102.0], [200.0, 201.0, 202.0])
    v = baseline.c6_verdict(arith, "ernie", _concurrent(), 100, frames, EV, "cpu")
    _is_verdict(v, "C6", "refuted")
    assert "(276 such requests)" in v["figure"] and "ran on both configurations" in v["figure"]
    assert "0 preemptions" in v["figure"]
    assert (
        "article 9.4% (peak running unknown), default 9.3% (100 running at the peak)"
        in (v["figure"])
    )
    # e2e 2x slower over three starts each, ranges apart: the one noise rule says beyond noise
    assert "article/default e2e = 1.99 (beyond noise" in v["spread"]


def test_c6_inconclusive_when_the_card_is_too_small_and_failures_are_shown(ernie):
    arith = baseline.c6_arithmetic(ernie, 8.0, 0.85, 4096)  # 6.1 GiB of KV: 86 requests
    assert arith["requests_that_fit"] < 100
    frames = _baseline_frames([100.0, 101.0], [100.5, 99.0])
    conc = _concurrent(peaks=(None, 5.0), status=("ok", "failed"))
    v = baseline.c6_verdict(arith, "ernie", conc, 100, frames, EV, "cpu")
    _is_verdict(v, "C6", "inconclusive")
    assert "FAILED on some engines" in v["figure"]
    assert "default not sampled (run < 0.25 s)" in v["figure"]
    assert "within noise: ranges overlap" in v["spread"]


CHECKS = [
    {"setting": "block_size", "value": 16, "valid": False, "error": "not on CPU", "vllm": "ok"},
    {"setting": "max_num_seqs", "value": 256, "valid": True, "error": None, "vllm": "ok"},
    {
        "setting": "max_paddings",
        "value": 128,
        "valid": False,
        "error": "removed",
        "vllm": "TypeError: got an unexpected keyword argument 'max_paddings'",
    },
]


def test_c9_refuted_by_settings_vllm_does_not_have():
    v = baseline.c9_verdict(CHECKS, "0.32.0")
    _is_verdict(v, "C9", "refuted")
    assert v["figure"] == (
        "1 of the article's settings do not exist in vLLM 0.32.0: max_paddings=128: removed"
    )
    assert "block_size=16 is also rejected: not on CPU" in v["note"]
    assert "max_paddings=128 is also" not in v["note"]


def test_c9_inconclusive_when_every_name_exists():
    v = baseline.c9_verdict([r for r in CHECKS if r["setting"] != "max_paddings"], "0.32.0")
    _is_verdict(v, "C9", "inconclusive")
    assert v["figure"].startswith("0 of the article's settings")


# --------------------------------------------------------------------------- 01: C2, C3, C5, C12
def _cap_point(config, repeat, mem, dtype="auto", tokens=None, status="ok", tput=100.0, bs=32):
    shape = load_shape("tiny-ernie")
    settings = {"kv_cache_memory_bytes": mem}
    if dtype != "auto":
        settings["kv_cache_dtype"] = dtype
    predicted = shape.kv_capacity_tokens(mem, bs, dtype)
    return {
        "point_id": f"{config}-r{repeat}",
        "config": config,
        "repeat": repeat,
        "status": status,
        "settings": settings,
        "capacity": {
            "block_size": bs,
            "kv_capacity_tokens": predicted if tokens is None else tokens,
            "max_model_len": 512,
            "enable_prefix_caching": True,
        }
        if status == "ok"
        else {},
        "metrics": {"output_throughput_tok_s": tput} if status == "ok" else {},
        "error": None
        if status == "ok"
        else "NotImplementedError: FP8 KV cache on CPU requires x86",
    }


MIB8 = 8 << 20


def test_c2_refuted_with_the_engines_residual(ernie, tiny):
    pts = [_cap_point("a", 0, MIB8), _cap_point("a", 1, MIB8, tokens=16384 + 32)]
    cap = kvcache.capacity_table(pts, tiny)
    assert list(cap["residual %"]) == [0.0, pytest.approx(0.195, abs=1e-3)]
    v = kvcache.c2_verdict(ernie, "ernie", 4096, 100, cap, EV, "tiny-ernie")
    _is_verdict(v, "C2", "refuted")
    assert v["figure"].startswith("ernie: 18,432 B per token in bf16 (article 16,384); 72 MiB")
    assert "100 requests 7.03 GiB" in v["figure"] and "0.195% over 2 engines" in v["figure"]
    assert v["spread"] == "residual range 0.000-0.195%"
    assert "32 heads where the model has 2 KV heads (16x too many)" in v["note"]
    assert "18 layers (18x too few)" in v["note"] and "11% low" in v["note"]


def _prefix(shares: dict):
    """shares: prefix_share -> (predicted saved %, blocks on, blocks off, hit rate %)."""
    rows = []
    for share, (pred, on, off, hit) in shares.items():
        for enabled, blocks in ((True, on), (False, off)):
            rows.append(
                {
                    "enable_prefix_caching": enabled,
                    "prefix_share": share,
                    "predicted KV saved %": pred if enabled else 0.0,
                    "KV blocks at peak (sampled)": blocks,
                    "hit rate %": hit if enabled else 0.0,
                }
            )
    return pd.DataFrame(rows)


WL = {"num_requests": 12, "num_prefixes": 2}


@pytest.mark.parametrize(
    ("shares", "word"),
    [
        ({0.5: (40.0, 60.0, 100.0, 45.0), 0.6: (48.0, 52.0, 100.0, 50.0)}, "confirmed"),
        ({0.0: (0.0, 100.0, 100.0, 0.0), 0.9: (75.0, 25.0, 100.0, 80.0)}, "partly"),
        ({0.0: (0.0, 100.0, 100.0, 0.0), 0.25: (20.0, 80.0, 100.0, 22.0)}, "refuted"),
    ],
)
def test_c3_by_the_predicted_saving(shares, word):
    v = kvcache.c3_verdict(_prefix(shares), WL, 1, EV, True, speed_meaningful=True)
    _is_verdict(v, "C3", word)
    first = next(iter(shares))
    pred, on, off, hit = shares[first]
    assert f"share {first:g}: hit rate {hit:.0f}%, KV saved {pred:.0f}% predicted" in v["figure"]
    assert f"{100 * (1 - on / off):.0f}% measured" in v["figure"]
    assert "resolved it to True" in v["note"]


def test_c3_unsampled_peaks_and_an_unknown_default_are_said():
    df = _prefix({0.5: (40.0, float("nan"), float("nan"), 45.0)})
    v = kvcache.c3_verdict(df, WL, 1, EV, None, speed_meaningful=False)
    _is_verdict(v, "C3", "confirmed")
    assert "not sampled (run shorter than 0.25 s)" in v["figure"]
    assert "resolved it to n/a" in v["note"] and "say nothing about a GPU" in v["note"]


def _drift(agree_fp8, agree_floor):
    return pd.DataFrame(
        [
            {
                "kv_cache_dtype": dt,
                "token agreement %": a,
                "mean |d logprob| (same context)": d,
            }
            for dt, a, d in (("fp8", agree_fp8, 0.02), ("auto", agree_floor, 0.0002))
        ]
    )


def test_c5_partly_when_fp8_holds_exactly_twice(tiny):
    pts = [
        _cap_point("bf16", 0, MIB8, tput=100.0),
        _cap_point("bf16", 1, MIB8, tput=110.0),
        _cap_point("fp8", 0, MIB8, "fp8", tput=120.0),
        _cap_point("fp8", 1, MIB8, "fp8", tput=125.0),
    ]
    cap = kvcache.capacity_table(pts, tiny)
    v = kvcache.c5_verdict(cap, _drift(77.1, 99.85), pts, False, True, EV, True)
    _is_verdict(v, "C5", "partly")
    assert v["figure"].startswith("capacity fp8/bf16: 2.000; greedy token agreement with bf16:")
    assert "77.1% (floor, bf16 vs bf16: 99.85%)" in v["figure"]
    assert v["spread"] == (
        "fp8/bf16 output tokens/s 1.17 (within noise: ranges apart, but 2 and 2 engine starts"
        " come apart by chance p=0.33)"
    )
    assert "on random weights" in v["note"] and "flat" not in v["note"]


def test_c5_inconclusive_when_fp8_is_refused_says_why(tiny):
    pts = [_cap_point("bf16", 0, MIB8), _cap_point("fp8", 0, MIB8, "fp8", status="failed")]
    cap = kvcache.capacity_table(pts, tiny)
    v = kvcache.c5_verdict(cap, _drift(float("nan"), 100.0).iloc[1:], pts, True, False, EV, False)
    _is_verdict(v, "C5", "inconclusive")
    assert v["figure"].startswith(
        "capacity fp8/bf16: n/a (no fp8 point ran: NotImplementedError: FP8 KV cache on CPU"
    )
    assert "agreement with bf16: n/a" in v["figure"] and v["spread"] is None
    assert "on dummy weights" in v["note"] and "logits were flat" in v["note"]


def test_c5_inconclusive_when_capacity_is_not_twice(tiny):
    pts = [_cap_point("bf16", 0, MIB8), _cap_point("fp8", 0, MIB8, "fp8", tokens=20000)]
    cap = kvcache.capacity_table(pts, tiny)
    v = kvcache.c5_verdict(cap, pd.DataFrame(), pts, False, True, EV, True)
    _is_verdict(v, "C5", "inconclusive")
    assert "capacity fp8/bf16: 1.221;" in v["figure"]


def test_c12_partly_with_measured_slope_and_max_model_len(ernie):
    _, per_step = kvcache.headroom_table(ernie, {"H200": 139.8}, seq_len=4096)
    slope = [
        {
            "tokens per 0.05 gmu, measured": 407198,
            "tokens per 0.05 gmu, predicted": 407199,
            "residual %": -0.0,
        }
    ]
    groups = pd.DataFrame(
        [
            {"KV memory (MiB)": 8.0, "kv_cache_dtype": "auto", "block_size": 32, **r}
            for r in (
                {"max_model_len": 512, "engine tokens": [16384]},
                {"max_model_len": 2048, "engine tokens": [16384]},
            )
        ]
    )
    v = kvcache.c12_verdict(per_step, 4096, slope, groups, EV)
    _is_verdict(v, "C12", "partly")
    assert v["figure"] == (
        "H200: each 0.05 of gpu_memory_utilization = 407,197 tokens (99 requests of 4096)."
        " On this device: measured 407,198 tokens per 0.05 (predicted 407,199, residual -0.00%)"
    )
    assert "held equal numbers of tokens at max_model_len 512 and 2048" in v["note"]
    groups.loc[1, "engine tokens"] = [16000]
    assert "DIFFERENT" in kvcache.c12_verdict(per_step, 4096, [], groups, EV)["note"]
    cpu = kvcache.c12_verdict(per_step, 4096, [], pd.DataFrame(), EV)
    assert "not measurable on CPU" in cpu["figure"] and "not tested" in cpu["note"]


# --------------------------------------------------------------------------- 02: C4
def _block_point(bs, repeat, tput, cached=(464, 464)):
    reqs = [{"tag": "p0", "cached_tokens": 0}] + [{"tag": "p0", "cached_tokens": c} for c in cached]
    return {
        "point_id": f"b{bs}-r{repeat}",
        "config": f"block_size={bs}",
        "repeat": repeat,
        "status": "ok",
        "settings": {"block_size": bs},
        "capacity": {"block_size": bs, "num_gpu_blocks": 65536 // bs, "kv_capacity_tokens": 65536},
        "env": {"attention_backend": "FLASH_ATTN"},
        "metrics": {"output_throughput_tok_s": tput, "ttft_p50_ms": 10.0},
        "requests": reqs,
    }


def _c4(tputs: dict, valid=(16, 128), prefix_len=470):
    pts = [
        _block_point(bs, r, t, cached=[(prefix_len // bs) * bs] * 2)
        for bs, ts in tputs.items()
        for r, t in enumerate(ts)
    ]
    df = blocksize.per_point(pts, prefix_len)
    rows = [
        {
            "block_size": b,
            "settings check": "passed",
            "engine": "started",
            "valid": True,
            "error": "",
        }
        for b in valid
    ]
    gran = blocksize.granularity_check(df, prefix_len)
    return blocksize.c4_verdict(rows, df, gran, prefix_len, EV, speed_meaningful=True)


def test_c4_refuted_when_a_bigger_block_is_faster_beyond_noise():
    v = _c4({16: [100, 101, 102], 128: [130, 131, 132]})
    _is_verdict(v, "C4", "refuted")
    assert (
        "16: 101, 128: 131" in v["figure"] and "faster than 16 beyond the noise: 128" in v["note"]
    )
    assert "16: 464, 128: 384 cached tokens per later request (exactly" in v["note"]
    assert "up to 86 tokens lost" in v["note"]


def test_c4_confirmed_when_16_wins_beyond_noise():
    _is_verdict(_c4({16: [130, 131, 132], 128: [100, 101, 102]}), "C4", "confirmed")


def test_c4_inconclusive_within_noise():
    v = _c4({16: [100, 120, 110], 128: [105, 125, 115]})
    _is_verdict(v, "C4", "inconclusive")
    assert v["note"].startswith("No size differs from 16 beyond the spread")


def test_c4_refuted_when_16_is_not_valid():
    pts = [_block_point(32, r, 100 + r, cached=[448, 448]) for r in range(2)]
    df = blocksize.per_point(pts, 470)
    rows = [
        {
            "block_size": 16,
            "settings check": "rejected",
            "engine": "not started",
            "valid": False,
            "error": "block_size=16 is not valid on CPU",
        },
        {"block_size": 32, "settings check": "passed", "engine": "started", "valid": True},
    ]
    gran = blocksize.granularity_check(df, 470)
    v = blocksize.c4_verdict(rows, df, gran, 470, EV, speed_meaningful=False)
    _is_verdict(v, "C4", "refuted")
    assert v["figure"] == "block_size 16 is not valid here: block_size=16 is not valid on CPU"
    assert "Valid sizes found: 32" in v["note"] and "say nothing about a GPU" in v["note"]


# --------------------------------------------------------------------------- 03: C7, C8, C10
def _c7(ttft, starts=3, seed=0, noise=0.0):
    rng = np.random.default_rng(seed)
    rows, runs = [], []
    s = np.linspace(100, 16000, 24)
    for r in range(starts):
        t = ttft(s) * (1 + noise * rng.standard_normal(len(s)))
        t = np.abs(t) + 0.1
        rows += [
            {"repeat": r, "prompt_tokens": a, "alone_ms": b} for a, b in zip(s, t, strict=True)
        ]
        runs.append(prefill.fit_all(s, t))
    curve = pd.DataFrame(rows)
    pooled = prefill.fit_all(curve["prompt_tokens"], curve["alone_ms"])
    cmp_in = prefill.compare_fits(runs)
    cmp_out = prefill.compare_fits(runs, score="extrap_rms_rel_pct")
    return prefill.c7_verdict(pooled, cmp_in, cmp_out, curve, EV, True, 6913.0)


def test_c7_refuted_by_a_polynomial_curve():
    v = _c7(lambda s: 20 + 0.002 * s + 1.6e-7 * s**2, noise=0.01)
    _is_verdict(v, "C7", "refuted")
    assert v["note"].startswith("linear+quadratic fits better in every engine start")
    assert "S ~ 6,913 tokens" in v["note"] and "residual ratio exp/poly" in v["spread"]


def test_c7_partly_when_an_exponential_fits_better():
    v = _c7(lambda s: 5 * np.exp(s / 2000), noise=0.01)
    _is_verdict(v, "C7", "partly")
    assert "look for a non-compute cause" in v["note"]


def test_c7_inconclusive_when_too_noisy():
    v = _c7(lambda s: 20 + 0.002 * s, noise=0.6, seed=3)
    _is_verdict(v, "C7", "inconclusive")
    assert v["note"].startswith("too noisy to tell shapes")


def test_c7_inconclusive_when_neither_fit_wins_every_start():
    v = _c7(lambda s: 20 + 0.002 * s, noise=0.05, seed=3)
    _is_verdict(v, "C7", "inconclusive")
    assert "within noise of each other" in v["note"]
    assert "in-sample 1.00, 1.00, 1.00; out-of-sample 1.24, 1.07, 1.22" in v["spread"]


def _c8_frame(series: dict):
    """series: metric column -> {value: [three starts]}."""
    rows = []
    for value in (2048, 8192):
        for r in range(3):
            row = {"max_num_batched_tokens": value, "repeat": r}
            for col, by in series.items():
                row[col] = by[value][r]
            rows.append(row)
    return pd.DataFrame(rows)


APART_LOW = {2048: [10, 11, 12], 8192: [20, 21, 22]}  # 2048 better on a lower-is-better metric
APART_HIGH = {2048: [20, 21, 22], 8192: [10, 11, 12]}
OVERLAP = {2048: [10, 15, 20], 8192: [11, 16, 21]}


@pytest.mark.parametrize(
    ("ttft", "itl", "tput", "word"),
    [
        (APART_LOW, OVERLAP, APART_HIGH, "confirmed"),
        (OVERLAP, OVERLAP, {2048: [10, 15, 20], 8192: [9, 14, 19]}, "inconclusive"),
        (APART_HIGH, OVERLAP, OVERLAP, "partly"),
        (APART_HIGH, APART_HIGH, APART_LOW, "refuted"),
    ],
)
def test_c8_every_word(ttft, itl, tput, word):
    df = _c8_frame({"ttft_short_p90_ms": ttft, "itl_p99_ms": itl, "output_throughput_tok_s": tput})
    v = prefill.c8_verdict(df, 2048, EV, True, serve_default=8192)
    _is_verdict(v, "C8", word)
    assert "swept 2048, 8192 under a mixed load" in v["note"] and "default here: 8192" in v["note"]


def test_c8_words_of_the_h200_run():
    """8192 vs 2048 as measured on the H200 (README): 2048 loses short TTFT beyond the noise."""
    df = _c8_frame(
        {
            "ttft_short_p90_ms": {2048: [80.1, 87.3, 95.0], 8192: [33.0, 36.8, 40.2]},
            "itl_p99_ms": {2048: [18.0, 18.8, 21.0], 8192: [19.0, 20.2, 22.0]},
            "output_throughput_tok_s": {2048: [4093, 4197, 4302], 8192: [4149, 4240, 4274]},
        }
    )
    v = prefill.c8_verdict(df, 2048, EV, True, serve_default=8192)
    _is_verdict(v, "C8", "partly")
    assert "short-request TTFT p90: best 8192 (36.8 ms), 2048 87.3 ms (beyond noise" in v["figure"]
    assert "ITL p99: 2048 is best (18.8 ms; beyond noise against none)" in v["figure"]


def test_c8_inconclusive_when_2048_was_not_swept():
    df = _c8_frame({"ttft_short_p90_ms": OVERLAP, "itl_p99_ms": OVERLAP})
    v = prefill.c8_verdict(df, 1024, EV, False, None)
    _is_verdict(v, "C8", "inconclusive")
    assert v["figure"] == "1024 was not swept"


def _c10(short, long, mixed=None):
    rows = []
    for value, idx in ((8192, 0), (2048, 1)):
        for r in range(3):
            row = {"max_num_batched_tokens": value, "repeat": r}
            for c, by in (("short", short), ("long", long), ("mixed", mixed)):
                if by is not None:
                    row[f"ttft_{c}_p50_ms"] = by[idx][r]
            rows.append(row)
    table = prefill.c10_table(pd.DataFrame(rows), {"short": [5.0, 6.0]}, 8192, 2048)
    return prefill.c10_verdict(table, EV, speed_meaningful=False), table


HALVED = ([100, 101, 102], [40, 41, 42])
WORSE = ([40, 41, 42], [100, 101, 102])
SAME = ([100, 110, 120], [101, 111, 121])
SOMEWHAT = ([100, 110, 120], [70, 77, 84])  # x0.70, ranges overlap


@pytest.mark.parametrize(
    ("short", "long", "word"),
    [
        (HALVED, HALVED, "confirmed"),
        (HALVED, SAME, "partly"),
        (SAME, WORSE, "refuted"),
        (SAME, SAME, "not reproducible"),
        (SOMEWHAT, SAME, "inconclusive"),
    ],
)
def test_c10_every_word(short, long, word):
    v, table = _c10(short, long)
    _is_verdict(v, "C10", word)
    assert list(table["class"]) == ["short", "medium", "long", "mixed"]
    assert table.loc[0, "alone, one at a time (ms)"] == 5.5 and table.loc[0, "alone: requests"] == 2
    assert "Not in the mixed load: medium, mixed" in v["note"]
    assert "say nothing about a GPU" in v["note"]


def test_c10_figure_and_nothing_measured():
    v, _ = _c10(HALVED, HALVED)
    assert v["figure"].startswith("short: 101.0 ms -> 41.0 ms (x0.41, beyond noise")
    assert "article x0.37)" in v["figure"]
    empty = prefill.c10_table(pd.DataFrame({"max_num_batched_tokens": []}), None, 8192, 2048)
    _is_verdict(prefill.c10_verdict(empty, EV, True), "C10", "inconclusive")


# --------------------------------------------------------------------------- 04: C11, C13
def _validation(chosen=None, article=(50.0, 60.0, 55.0)):
    rows = []
    cfgs = {"default": (100.0, 110.0, 105.0), "article": article}
    if chosen:
        cfgs["chosen"] = chosen
    for cfg, vals in cfgs.items():
        for r, v in enumerate(vals):
            rows.append(
                {
                    "config": cfg,
                    "repeat": r,
                    "status": "ok",
                    "goodput_rps": v,
                    "ttft_p99_ms": 1000.0 / v,
                }
            )
    return validation_table(pd.DataFrame(rows))


def _choice(changed=None, missing=("no evidence for fp8",)):
    return {"scenario": "high_concurrency_chat", "changed": changed or {}, "missing": list(missing)}


def test_c11_partly_with_the_aa_pair_and_the_other_scenarios():
    val = _validation(chosen=(101.0, 108.0, 104.0))
    other = _validation(article=(99.0, 111.0, 104.0))
    other.insert(0, "scenario", "high_throughput")
    v = presets.c11_verdict(_choice(), val, [other], EV, 3, had_sweeps=True)
    _is_verdict(v, "C11", "partly")
    assert v["figure"] == (
        "high_concurrency_chat: 0 setting(s) changed from vLLM's defaults; chosen = vLLM's"
        " default, so two runs of one configuration differ by 0.99x (within noise): the noise"
        " floor of this machine; article's configuration at 0.524x the default's goodput_rps"
        " (beyond noise, n=3)"
    )
    # high_throughput's objective (output tok/s) was not measured here: no line for it
    assert v["spread"] == "min-max over 3 engine starts per configuration"
    assert "1 topic(s) had no evidence" in v["note"]
    assert presets.aa_check(val).endswith("no metric differs beyond the noise.")


def test_c11_changed_setting_and_no_validation():
    val = _validation(chosen=(150.0, 160.0, 155.0))
    v = presets.c11_verdict(_choice({"max_num_seqs": 128}), val, [], EV, 3, had_sweeps=True)
    assert "1 setting(s) changed" in v["figure"]
    assert "chosen at 1.48x the default's goodput_rps (beyond noise)" in v["figure"]
    v = presets.c11_verdict(_choice(), pd.DataFrame(), [], EV, 3, had_sweeps=False)
    _is_verdict(v, "C11", "inconclusive")
    assert "chosen not validated" in v["figure"] and v["spread"] is None
    assert "no validation of the article's configuration in this run" in v["figure"]


def test_c11_served_deployment_is_the_chosen_one_not_the_noise_floor():
    # An H100 run (h100-20261206c): no engine setting of 00-03 changed, 04's 4 replicas won on
    # capacity, and the served "chosen" was that deployment, 2.9x the default's goodput. The
    # verdict called that "two runs of one configuration": the A/A wording is for "chosen" = default.
    val = _validation(chosen=(290.0, 300.0, 310.0))
    dep = {"status": "changed", "config": "replicas=4_stream_interval=16", "vs_default": 5.657}
    v = presets.c11_verdict(_choice(), val, [], EV, 3, had_sweeps=True, deployment=dep)
    assert v["figure"].startswith(
        "high_concurrency_chat: 0 setting(s) changed from vLLM's defaults, served as"
        " replicas=4_stream_interval=16 (5.66x the default's capacity under the SLO in 04);"
        " chosen deployment replicas=4_stream_interval=16 (04's capacity ranking) at 2.86x the"
        " default's goodput_rps (beyond noise);"
    )
    assert "noise floor" not in v["figure"]
    # A deployment that kept the default is the A/A pair again.
    kept = {**dep, "status": "kept: within noise"}
    assert "noise floor" in presets.chosen_text(_choice(), val, "goodput_rps", kept)


def test_config_header_names_the_deployment_when_only_it_changed():
    served = {"status": "changed", "reason": "4 replicas serve 5.66x"}
    head = writers._header({"scenario": "s", "changed": {}, "served_choice": served})
    assert "those defaults kept; the deployment has its own reason (its 'chosen:' line)" in head
    assert "defaults kept\n" in writers._header({"scenario": "s", "changed": {}})


def test_aa_check_counts_metrics_beyond_noise():
    val = _validation(chosen=(150.0, 160.0, 155.0))
    assert "2 of 2 metric(s) come out beyond noise (goodput_rps, ttft_p99_ms)" in presets.aa_check(
        val
    )


def test_c13_partly_from_card_arithmetic(ernie):
    cards = presets.card_table(ernie, [8, 16, 24, 80])
    row = cards[(cards["card GiB"] == 16) & (cards["gpu_memory_utilization"] == 0.9)].iloc[0]
    assert row["KV tokens (upper bound)"] == 799717 and row["4096-token requests"] == 195
    v = presets.c13_verdict(cards, "ernie", ernie, "cpu")
    _is_verdict(v, "C13", "partly")
    assert v["figure"] == (
        "16 GiB: 799,717 KV tokens; 24 GiB: 1,219,147 KV tokens; 80 GiB: 4,155,160 KV tokens"
        " (gmu 0.9, upper bound)"
    )
    assert "ernie weighs 0.67 GiB" in v["note"] and v["note"].endswith("only on cpu.")
