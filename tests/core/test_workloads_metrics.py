"""Seeded workloads and the latency / throughput / goodput arithmetic (pure Python)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tunebook.core.errors import ConfigError
from tunebook.core.metrics import (
    GaugeSampler,
    broken_limits,
    chance_apart,
    compare,
    meets_slo,
    percentile,
    slo_breaks,
    spread,
    summarize,
)
from tunebook.core.workloads import FIRST_ORDINARY_ID, KINDS, check_fits, make_workload

SPECS = {
    "fixed": {"kind": "fixed", "num_requests": 8, "prompt_len": 32, "output_len": 4},
    "lognormal": {
        "kind": "lognormal",
        "num_requests": 8,
        "median_prompt_len": 32,
        "median_output_len": 8,
        "max_prompt_len": 128,
        "max_output_len": 32,
    },
    "uniform": {"kind": "uniform", "num_requests": 8, "min_prompt_len": 8, "max_prompt_len": 64},
    "normal": {
        "kind": "normal",
        "num_requests": 8,
        "mean_prompt_len": 40,
        "std_prompt_len": 10,
        "min_prompt_len": 20,
        "max_prompt_len": 60,
    },
    "shared_prefix": {
        "kind": "shared_prefix",
        "num_requests": 8,
        "prompt_len": 40,
        "prefix_share": 0.75,
        "num_prefixes": 2,
    },
    "mixed": {
        "kind": "mixed",
        "num_requests": 32,
        "short_len": 8,
        "long_len": 100,
        "long_fraction": 0.5,
        "long_output_len": 20,
        "output_len": 4,
    },
    "text": {"kind": "text", "num_requests": 3, "prompts": ["a", "b"]},
}


def ids(wl):
    return [r.prompt_token_ids for r in wl.requests]


def test_every_kind_has_a_spec():
    assert set(SPECS) == set(KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_same_spec_same_requests(kind):
    a = make_workload({**SPECS[kind], "seed": 3}, vocab_size=1024)
    b = make_workload({**SPECS[kind], "seed": 3}, vocab_size=1024)
    assert ids(a) == ids(b)
    assert [r.max_tokens for r in a.requests] == [r.max_tokens for r in b.requests]
    assert [r.prompt for r in a.requests] == [r.prompt for r in b.requests]


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "text"])
def test_different_seed_different_requests(kind):
    a = make_workload({**SPECS[kind], "seed": 1}, vocab_size=1024)
    b = make_workload({**SPECS[kind], "seed": 2}, vocab_size=1024)
    assert ids(a) != ids(b)


def test_fixed():
    wl = make_workload({**SPECS["fixed"], "seed": 0}, vocab_size=50)
    assert len(wl) == 8 and {len(r.prompt_token_ids) for r in wl.requests} == {32}
    assert {r.max_tokens for r in wl.requests} == {4}
    flat = [t for r in wl.requests for t in r.prompt_token_ids]
    assert min(flat) >= FIRST_ORDINARY_ID and max(flat) < 50  # no special ids, within vocab
    assert wl.summary() == {
        "name": "fixed",
        "num_requests": 8,
        "prompt_tokens": 256,
        "max_prompt_len": 32,
        "output_tokens": 32,
    }
    assert wl.max_total_len == 36


def test_uniform_and_normal_stay_in_bounds():
    u = make_workload(SPECS["uniform"])
    assert all(8 <= r.prompt_len <= 64 for r in u.requests)
    assert len({r.prompt_len for r in u.requests}) > 1
    n = make_workload(SPECS["normal"])
    assert all(20 <= r.prompt_len <= 60 for r in n.requests)


def test_shared_prefix_really_shares_its_prefix():
    wl = make_workload(SPECS["shared_prefix"], vocab_size=1024)
    pre = 30  # round(40 * 0.75)
    by_tag: dict[str, list] = {}
    for r in wl.requests:
        assert r.prompt_len == 40
        by_tag.setdefault(r.tag, []).append(r.prompt_token_ids)
    assert sorted(by_tag) == ["p0", "p1"] and all(len(v) == 4 for v in by_tag.values())
    for prompts in by_tag.values():
        assert all(p[:pre] == prompts[0][:pre] for p in prompts)  # the shared part is shared
        assert len({tuple(p[pre:]) for p in prompts}) == len(prompts)  # the rest is not
    assert by_tag["p0"][0][:pre] != by_tag["p1"][0][:pre]


def test_mixed_has_both_classes_with_their_lengths():
    wl = make_workload(SPECS["mixed"])
    tags = {r.tag for r in wl.requests}
    assert tags == {"short", "long"}
    for r in wl.requests:
        assert (r.prompt_len, r.max_tokens) == ((100, 20) if r.tag == "long" else (8, 4))


def test_text_cycles_prompts_without_token_ids():
    wl = make_workload(SPECS["text"])
    assert [r.prompt for r in wl.requests] == ["a", "b", "a"]
    assert all(r.prompt_token_ids is None and r.prompt_len == -1 for r in wl.requests)
    check_fits(wl, 1)  # text prompts have no known length: not checked


def test_request_rate_gives_poisson_arrivals():
    wl = make_workload({**SPECS["fixed"], "request_rate": 10.0, "seed": 5})
    t = [r.arrival_s for r in wl.requests]
    assert t == sorted(t) and t[0] > 0 and len(set(t)) == len(t)
    assert (
        make_workload({**SPECS["fixed"], "request_rate": 10.0, "seed": 5}).requests[3].arrival_s
        == t[3]
    )
    assert all(r.arrival_s == 0 for r in make_workload(SPECS["fixed"]).requests)
    inf = make_workload({**SPECS["fixed"], "request_rate": float("inf")})
    assert all(r.arrival_s == 0 for r in inf.requests)


@pytest.mark.parametrize(
    "spec,match",
    [
        ({"kind": "zipf"}, r"kind 'zipf' unknown; valid: fixed"),
        ({"prompt_len": 8}, r"kind None unknown"),
        ({"kind": "fixed", "prompt_len": 8, "promt_len": 8}, r"unknown key\(s\) \['promt_len'\]"),
        ({"kind": "fixed", "prompt_len": 8, "prefix_share": 0.5}, r"unknown key.*prefix_share"),
        ({"kind": "fixed", "prompt_len": 0}, r"prompt_len must be a positive int"),
        ({"kind": "fixed"}, r"prompt_len must be a positive int, got None"),
        ({"kind": "fixed", "prompt_len": 8, "num_requests": 2.5}, r"num_requests"),
        ({"kind": "fixed", "prompt_len": 8, "output_len": True}, r"output_len"),
        ({"kind": "uniform", "min_prompt_len": 9, "max_prompt_len": 8}, r"min_prompt_len 9 >"),
        ({"kind": "shared_prefix", "prompt_len": 8, "prefix_share": 1.5}, r"prefix_share"),
        ({"kind": "fixed", "prompt_len": 8, "request_rate": -1}, r"request_rate"),
        ({"kind": "fixed", "prompt_len": 8, "seed": "x"}, r"seed"),
    ],
)
def test_bad_specs_are_config_errors(spec, match):
    with pytest.raises(ConfigError, match=match):
        make_workload(spec)


def test_spec_must_be_a_mapping():
    with pytest.raises(ConfigError, match="mapping"):
        make_workload("fixed")


def test_check_fits_raises_for_prompt_plus_output_over_max_model_len():
    wl = make_workload({"kind": "fixed", "num_requests": 2, "prompt_len": 500, "output_len": 13})
    check_fits(wl, 513)  # exactly fits
    with pytest.raises(
        ConfigError, match=r"500 prompt \+ 13 output = 513 tokens.*max_model_len 512"
    ):
        check_fits(wl, 512)


# --------------------------------------------------------------------------- metrics
@pytest.mark.parametrize("q", [0, 1, 25, 50, 90, 99, 100])
def test_percentile_matches_numpy(q):
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100):
        xs = rng.exponential(10, size=n).tolist()
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_percentile_ignores_none_and_nan():
    assert percentile([3.0, None, float("nan"), 1.0], 50) == 2.0
    assert math.isnan(percentile([], 50))


def _rec(ttft, e2e, itl, out=4, prompt=16):
    return {
        "ttft_ms": ttft,
        "e2e_ms": e2e,
        "itl_ms": itl,
        "output_tokens": out,
        "prompt_tokens": prompt,
    }


def test_summarize_throughput_percentiles_and_goodput():
    recs = [
        _rec(10, 40, [10, 10, 10]),
        _rec(20, 50, [10, 10, 10]),
        _rec(30, 90, [10, 40, 10]),  # one slow gap
        _rec(400, 430, [10, 10, 10]),  # slow first token
    ]
    m = summarize(recs, 2.0, slo={"ttft_ms": 100, "itl_ms": 25})
    assert m["num_requests"] == 4
    assert m["request_throughput_rps"] == 2.0
    assert m["output_throughput_tok_s"] == 8.0
    assert m["total_token_throughput_tok_s"] == 40.0
    assert m["ttft_p50_ms"] == pytest.approx(np.percentile([10, 20, 30, 400], 50))
    assert m["ttft_mean_ms"] == pytest.approx(115.0)
    # itl percentiles pool every gap of every request
    assert m["itl_p99_ms"] == pytest.approx(np.percentile([10] * 11 + [40], 99))
    assert m["goodput_rps"] == 1.0  # only the first two meet both limits
    assert m["slo_attainment_pct"] == 50.0
    assert math.isnan(m["tpot_p50_ms"])  # no tpot in these records
    assert "goodput_rps" not in summarize(recs, 2.0)


def test_summarize_rejects_non_positive_duration():
    with pytest.raises(ValueError):
        summarize([], 0)


def test_meets_slo():
    assert meets_slo({"ttft_ms": 99}, {"ttft_ms": 100})
    assert not meets_slo({"ttft_ms": 101}, {"ttft_ms": 100})
    assert meets_slo({"ttft_ms": 100}, {"tpot_ms": 5})  # missing metrics are not judged
    assert not meets_slo({"itl_ms": [1, 2, 60]}, {"itl_ms": 50})
    assert meets_slo({"itl_ms": [], "ttft_ms": 1}, {"itl_ms": 50})  # one output token: no gaps


def test_spread_and_compare():
    s = spread([10.0, 12.0, 11.0, None, float("nan")])
    assert s == {
        "median": 11.0,
        "min": 10.0,
        "max": 12.0,
        "n": 3,
        "rel_spread": pytest.approx(2 / 11),
    }
    e = spread([])
    assert e["n"] == 0 and math.isnan(e["median"]) and math.isnan(e["rel_spread"])

    c = compare([10, 11, 12], [20, 21, 22])
    assert c["ratio"] == pytest.approx(21 / 11) and c["within_noise"] is False
    c = compare([10, 11, 15], [12, 13, 14])
    assert c["ratio"] == pytest.approx(13 / 11) and c["within_noise"] is True


def test_chance_that_ranges_come_out_apart_by_luck():
    assert chance_apart(2, 2) == pytest.approx(1 / 3)
    assert chance_apart(3, 3) == pytest.approx(0.1)
    assert chance_apart(0, 3) == 1.0


def test_the_one_noise_rule_and_its_wording():
    """Beyond noise = ranges apart AND apart by chance at most 10%: three starts a side."""
    c = compare([10, 11, 12], [20, 21, 22])
    assert c["ranges_apart"] and c["p_chance"] == pytest.approx(0.1) and not c["within_noise"]
    assert c["noise"] == "beyond noise: ranges apart over 3 and 3 engine starts, p=0.10 by chance"
    c = compare([10, 11], [20, 21])  # as far apart, but two a side split that cleanly 1 time in 3
    assert c["ranges_apart"] and c["within_noise"]
    assert c["noise"] == (
        "within noise: ranges apart, but 2 and 2 engine starts come apart by chance p=0.33"
    )
    c = compare([10, 11, 15], [12, 13, 14])
    assert (
        not c["ranges_apart"]
        and c["noise"] == "within noise: ranges overlap over 3 and 3 engine starts"
    )
    c = compare([10], [20, 21, 22, 23])  # one start on a side never decides anything
    assert c["ranges_apart"] and c["within_noise"] and c["p_chance"] == pytest.approx(0.4)
    c = compare([], [1, 2, 3])
    assert c["within_noise"] and c["noise"] == "not measured on both sides"
    # a stricter alpha is the only knob; direction does not matter
    assert compare([20, 21, 22], [10, 11, 12])["within_noise"] is False
    assert compare([10, 11, 12], [20, 21, 22], alpha=0.05)["within_noise"] is True


def test_gauge_sampler_keeps_its_closing_sample_and_the_peaks():
    """The sampler's last sample is the run's closing counters (no second snapshot after it)."""
    values = iter([{"vllm:num_requests_running": 3.0}, {"vllm:num_requests_running": 1.0}])
    sampler = GaugeSampler(lambda: next(values, {}), interval_s=3600)
    sampler.start()
    sampler.sample()  # a sample while the work runs
    peaks = sampler.stop()
    assert sampler.final == {"t_s": sampler.final["t_s"], "vllm:num_requests_running": 1.0}
    assert peaks["num_requests_running_peak"] == 3.0
    failing = GaugeSampler(lambda: 1 / 0, interval_s=3600)
    failing.start()
    failing.stop()
    assert failing.final is None  # a failed closing sample: the caller takes its own snapshot


def test_a_clean_gap_under_three_percent_is_no_practical_difference():
    from tunebook.core.metrics import MIN_GAP, compare

    c = compare([100.0, 100.1, 100.2], [100.4, 100.5, 100.6])  # apart, p = 0.1, +0.4%
    assert c["ranges_apart"] and c["p_chance"] <= 0.1 and not c["matters"]
    assert c["within_noise"] and c["noise"].startswith("no practical difference")
    c = compare([100.0, 100.1, 100.2], [103.5, 103.6, 103.7])  # apart and 3.5%
    assert not c["within_noise"] and c["noise"].startswith("beyond noise") and MIN_GAP == 0.03


def test_lognormal_lengths_are_long_tailed_and_clipped():
    wl = make_workload(
        {
            "kind": "lognormal",
            "num_requests": 2000,
            "median_prompt_len": 512,
            "median_output_len": 128,
            "max_prompt_len": 4096,
            "max_output_len": 1024,
            "seed": 3,
        }
    )
    prompts = sorted(r.prompt_len for r in wl.requests)
    outs = sorted(r.max_tokens for r in wl.requests)
    assert 450 < prompts[1000] < 580 and 110 < outs[1000] < 145  # medians near the asked ones
    assert prompts[-1] <= 4096 and outs[-1] <= 1024 and prompts[-1] > 3 * prompts[1000]  # a tail
    with pytest.raises(ConfigError, match="sigma"):
        make_workload({"kind": "lognormal", "num_requests": 2, "sigma_prompt": -1})


def test_the_breaks_say_which_limit_each_request_broke():
    slo = {"ttft_ms": 500, "tpot_ms": 50, "itl_ms": 1000}
    recs = [
        {"ttft_ms": 100, "tpot_ms": 10, "itl_ms": [20, 30]},  # good
        {"ttft_ms": 1500, "tpot_ms": 10, "itl_ms": [20]},  # TTFT
        {"ttft_ms": 100, "tpot_ms": 60, "itl_ms": [1200, 30]},  # TPOT and a chunk gap
        {"tpot_ms": None, "itl_ms": []},  # no first token: not served in time
        {"error": "HTTP 503"},
        {"stopped": True},
    ]
    assert slo_breaks(recs, slo) == {
        "broke_ttft_ms": 2,
        "broke_tpot_ms": 1,
        "broke_itl_ms": 1,
        "broke_failed": 2,
    }
    assert slo_breaks(recs[:1], {"ttft_ms": 500}) == {"broke_ttft_ms": 0, "broke_failed": 0}
    # One rule for a request's breaks, whether counted or judged (meets_slo).
    assert [broken_limits(r, slo) for r in recs[:4]] == [
        [],
        ["ttft_ms"],
        ["tpot_ms", "itl_ms"],
        ["ttft_ms"],
    ]
    assert [meets_slo(r, slo) for r in recs] == [True, False, False, False, False, False]
