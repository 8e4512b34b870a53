"""05's check of the served deployment and 04's sustained tables, on synthetic points."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tunebook.core.errors import ConfigError
from tunebook.core.scenarios import SCENARIOS
from tunebook.topics import capacity, headroom, validation

CHOICE = {"capacity_rps": 512.0, "default_capacity_rps": 90.5}
CONFIGS = {"chosen": {"serve": {"replicas": 4}}, "default": {"serve": {}}}
CHAT = {"kind": "fixed", "prompt_len": 512, "output_len": 128, "seed": 31}


def test_the_check_runs_each_configuration_at_its_own_capacity_and_above():
    cfgs, wls, over = capacity.check_plan(
        CHOICE, CONFIGS, CHAT, capacity.HELD_OUT, {"duration_s": 20.0}
    )
    assert cfgs["chosen"]["per_workload"][capacity.BENCH] == {
        "rates": [512.0, 640.0],
        "client": "vllm-bench",
    }
    assert cfgs["default"]["per_workload"][capacity.BENCH]["rates"] == [90.5, 113.125]
    assert cfgs["chosen"]["serve"] == {"replicas": 4}  # the configuration itself is kept
    # a decode-heavy request asks ~3.6x the work of a chat one: its search starts lower
    start = cfgs["chosen"]["per_workload"]["decode_heavy"]["search"]["start_rps"]
    assert 100 < start < 200
    assert set(wls) == {capacity.BENCH, "decode_heavy", "prefill_heavy", "lognormal"}
    assert over == {w: {"search": {"duration_s": 20.0}} for w in capacity.HELD_OUT}
    with pytest.raises(ConfigError, match="no capacity"):
        capacity.check_plan(
            {"capacity_rps": None, "default_capacity_rps": None}, CONFIGS, CHAT, {}, {}
        )


def _held(cfg, wl, caps):
    return [
        {
            "config": cfg,
            "repeat": i,
            "status": "ok",
            "workload": {"name": wl},
            "search": {"start_rps": 1.0},
            "metrics": {"capacity_rps": c},
        }
        for i, c in enumerate(caps)
    ]


def test_the_held_out_table_ranks_by_the_noise_rule_and_names_where_the_deployment_loses():
    pts = (
        _held("default", "decode_heavy", [40, 41, 42])
        + _held("chosen", "decode_heavy", [20, 21, 22])  # half: worse, beyond noise
        + _held("default", "lognormal", [80, 90, 100])
        + _held("chosen", "lognormal", [300, 320, 340])
    )
    t = capacity.check_table(pts)
    row = t[(t["workload"] == "decode_heavy") & (t["config"] == "chosen")].iloc[0]
    assert row["vs_default"] == pytest.approx(21 / 41) and row["worse"]
    assert not t[(t["workload"] == "lognormal") & (t["config"] == "chosen")].iloc[0]["worse"]
    avoid = capacity.not_for(t)
    assert len(avoid) == 1 and avoid[0].startswith("decode_heavy traffic: 0.51x")


def test_not_for_reads_the_other_scenarios_objective_too():
    table = pd.DataFrame(
        [
            {
                "metric": "ttft_p99_ms",
                "better": "lower",
                "config": "chosen",
                "ratio vs default": 2.7,
                "within noise": False,
                "noise": "beyond noise",
            },
            {
                "metric": "goodput_rps",
                "better": "higher",
                "config": "chosen",
                "ratio vs default": 0.99,
                "within noise": True,
                "noise": "within noise",
            },
        ]
    )
    avoid = capacity.not_for(
        None, {"low_latency": (table, "ttft_p99_ms"), "chat": (table, "goodput_rps")}
    )
    assert avoid == ["low_latency: 2.70x the default's ttft_p99_ms (beyond noise)"]


def _bench(cfg, at_ok, above_ok, rate):
    def r(x, ok):
        return {
            "offered_rps": x,
            "sustained": ok,
            "slo_attainment_pct": 100.0 if ok else 50.0,
            "why_not_sustained": "" if ok else "the SLO broke",
            "goodput_rps": 0.98 * x,
        }

    return {
        "config": cfg,
        "repeat": 0,
        "status": "ok",
        "workload": {"name": capacity.BENCH},
        "per_rate": [r(rate, at_ok), r(1.25 * rate, above_ok)],
    }


def test_vllms_client_agrees_when_the_slo_holds_at_capacity_and_breaks_above():
    # 04 names the chosen deployment by its levers, the check "chosen" (the H100 run of
    # 2026-12-07 lost tunebook's figure to that)
    ours = [
        {
            "config": "replicas=4",
            "per_rate": [{"offered_rps": 512.0, "slo_attainment_pct": 100.0, "goodput_rps": 500.0}],
        }
    ]
    t = capacity.bench_table([_bench("chosen", True, False, 512.0)], ours, {"chosen": "replicas=4"})
    assert (
        list(t["offered_rps"]) == [512.0, 640.0] and t.iloc[0]["tunebook_within_slo_rps"] == 500.0
    )
    text = capacity.bench_verdict(t)
    assert "vllm bench serve agrees" in text and "(+0%, within 10%)" in text
    # like for like: requests within the SLO per second of arrivals (bench serve's own goodput
    # divides by its whole duration, the drain included)
    rec = {"num_requests": 7242, "window_s": 20.0, "slo_attainment_pct": 99.7, "goodput_rps": 295.0}
    assert capacity._good_per_s(rec) == pytest.approx(361.0, abs=0.1)
    t = capacity.bench_table([_bench("default", True, True, 90.5)], [])
    assert "does NOT agree: it still held at 1.25x" in capacity.bench_verdict(t)


def test_the_rates_table_shows_what_a_4s_window_would_have_passed():
    per = [
        {"offered_rps": 256, "holds": True, "slo_holds_first_4s": True, "why_not_sustained": ""},
        {
            "offered_rps": 724,
            "holds": False,
            "slo_holds_first_4s": True,
            "why_not_sustained": "fell behind (completed 60% of what arrived)",
        },
        {
            "offered_rps": 724,
            "holds": None,
            "superseded": True,
        },  # a rerun's first, too-short window
    ]
    rates = headroom.rates_frame([{"config": "replicas=4", "repeat": 0, "per_rate": per}])
    assert len(rates) == 2
    text = headroom.short_window_text(rates)
    assert (
        text.startswith("1 rate(s) met the SLO over their first 4 s but did not hold")
        and "724" in text
    )


def test_the_chat_scenarios_bound_the_gap_between_chunks_and_bad_names_are_refused():
    chat, docs = SCENARIOS["high_concurrency_chat"], SCENARIOS["long_documents"]
    assert validation.scenario_slo(chat, 500, 50, 500) == {
        "ttft_ms": 500.0,
        "tpot_ms": 50.0,
        "itl_ms": 500.0,
    }
    assert "itl_ms" not in validation.scenario_slo(docs, 500, 50, 500)
    assert headroom.served_slo(500, 50, 99, 0) == {
        "ttft_ms": 500.0,
        "tpot_ms": 50.0,
        "attainment_pct": 99.0,
    }
    with pytest.raises(ValueError, match="scenario 'chatt' unknown"):
        validation.scenario_of("chatt", {}, "served", ["chosen"])
    with pytest.raises(ValueError, match="validation_mode"):
        validation.scenario_of("low_latency", {}, "servd", ["chosen"])


def test_a_validation_workload_sharing_the_starts_is_not_read_as_a_capacity():
    pts = _held("default", "decode_heavy", [40, 41])
    pts.append(
        {
            "config": "default",
            "repeat": 0,
            "status": "ok",
            "workload": {"name": "low_latency"},
            "metrics": {},
        }
    )
    assert list(capacity.check_table(pts)["workload"]) == ["decode_heavy"]


def test_the_check_shares_the_validations_starts_when_it_validates_the_same_configurations():
    check = {
        "configs": {
            n: {**c, "per_workload": {capacity.BENCH: {"rates": [1.0]}}} for n, c in CONFIGS.items()
        },
        "workloads": {capacity.BENCH: CHAT, "decode_heavy": capacity.HELD_OUT["decode_heavy"]},
        "point_overrides": {"decode_heavy": {"search": {}}},
        "workload_repeats": {capacity.BENCH: 1, "decode_heavy": 2},
    }
    choice = {"changed": {}}
    served = {"status": "changed", "settings": {}, "serve": {"replicas": 4}}
    sc = SCENARIOS["high_concurrency_chat"]
    plan = validation.served_plan(
        choice, served, {}, ["chosen", "default"], 1, sc, {"kind": "fixed"}, {}, check
    )
    assert set(plan["workloads"]) == {sc.name, capacity.BENCH, "decode_heavy"}
    assert plan["configs"]["chosen"]["per_workload"][capacity.BENCH] == {"rates": [1.0]}
    assert plan["workload_repeats"] == {capacity.BENCH: 1, "decode_heavy": 2}
    assert not validation.check_needs_its_own(plan, check)
    # with the article validated too, the check cannot join (the article has no capacity from 04)
    alone = validation.served_plan(
        choice, served, {}, ["chosen", "default", "article"], 1, sc, {}, {}, check
    )
    assert capacity.BENCH not in alone["workloads"] and validation.check_needs_its_own(alone, check)


def test_a_rate_short_only_of_its_window_is_held_but_says_so():
    # vLLM's client runs a rate once, in the window 04's latency asked for; its own latency can
    # ask for a little more. Every other rule held: not "the SLO did not hold".
    b = _bench("chosen", False, False, 362.0)
    for r, pct in zip(b["per_rate"], (99.7, 99.99), strict=True):
        r.update(
            slo_attainment_pct=pct,
            sustained_broke="window",
            why_not_sustained="window 20 s < the 20 s needed",
        )
    text = capacity.bench_verdict(capacity.bench_table([b], []))
    assert "held on every rule but the window's length" in text
    assert "does NOT agree: it still held at 1.25x" in text
    assert "the SLO did not hold" not in text


def test_check_repeats_0_runs_vllms_client_only():
    # 04's points of a kept GPU run; the h200-30min profile checks with vLLM's client alone
    run = Path(__file__).resolve().parents[2] / "runs" / "h100-20261207"
    plan = validation.check_plan(run, CHOICE, CONFIGS, capacity.HELD_OUT, {}, 0)
    assert set(plan["workloads"]) == {capacity.BENCH}
    assert plan["workload_repeats"] == {capacity.BENCH: 1}
    plan = validation.check_plan(run, CHOICE, CONFIGS, capacity.HELD_OUT, {}, 2)
    assert set(plan["workloads"]) == {capacity.BENCH, *capacity.HELD_OUT}
