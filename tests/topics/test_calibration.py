"""04's calibration and search plan on synthetic points: the model's inputs read from the
diagnosis and the served calibration, the plan's candidates, the race over engine starts and the
record of predictions. No engine."""

from __future__ import annotations

import json

import pytest
from test_capacity_model import calibration

from tunebook.core.capacity_model import GIB
from tunebook.core.errors import ConfigError
from tunebook.core.model import load_shape
from tunebook.topics import calibration as calib
from tunebook.topics import headroom


def offline(name: str, wl: dict, metrics: dict, status: str = "ok") -> dict:
    return {
        "point_id": f"default--{name}-r0",
        "status": status,
        "workload": {**wl, "name": name},
        "metrics": metrics,
        "capacity": {
            "kv_capacity_tokens": 4096,
            "max_model_len": 2048,
            "kv_cache_dtype": "auto",
            "max_num_seqs": 256,
            "model_load_gib": 0.5,
        },
        "env": {"platform": "cpu", "cpu_count": 2},
        "memory": {},
    }


def served(output_len: int, cpu_s: float | None, n: int = 64) -> dict:
    return {
        "status": "ok",
        "workload": {"output_len": output_len, "name": f"api-o{output_len}"},
        "metrics": {"num_requests": n, "api_server_cpu_s": cpu_s},
    }


def test_the_api_servers_cost_splits_into_a_request_and_a_chunk():
    # 0.5 ms a request + 0.1 ms a chunk (one a token at stream_interval 1), 64 requests a run
    pts = [served(o, 64 * (0.5 + 0.1 * o) / 1000) for o in (4, 32)]
    c = calib.api_costs(pts)
    assert c["api_request_ms"] == pytest.approx(0.5) and c["api_chunk_ms"] == pytest.approx(0.1)
    # one length only, or no CPU figure (a server without process metrics): no split to make
    with pytest.raises(ConfigError, match="two reply lengths"):
        calib.api_costs([pts[0], served(32, None)])


def test_a_calibration_is_read_from_the_diagnosis_and_the_served_start():
    steps = calib.step_workloads([1, 8], [64, 512])
    assert set(steps) == {"step-b1", "step-b8", "prefill-p64", "prefill-p512"}
    assert steps["step-b8"]["num_requests"] == 8 and steps["prefill-p512"]["num_requests"] == 1
    pts = [
        offline("decode", {"num_requests": 32, "prompt_len": 64}, {"tpot_mean_ms": 9.0}),
        offline("step-b1", steps["step-b1"], {"tpot_mean_ms": 4.0}),
        offline("step-b8", steps["step-b8"], {"tpot_mean_ms": 5.0}),
        offline("prefill-p64", steps["prefill-p64"], {"ttft_mean_ms": 3.0}),
        offline("prefill-p512", steps["prefill-p512"], {"ttft_mean_ms": 12.0}),
        offline("step-b32", {"num_requests": 32}, {}, status="error"),  # a failed point: left out
    ]
    api = [served(o, 64 * (0.5 + 0.1 * o) / 1000) for o in (4, 32)]
    shape = load_shape("tiny-ernie")
    cal = calib.from_results(pts, api, shape, kv_bytes_shared=64 << 20)
    assert cal.step_ms == {1: {1: 4.0, 8: 5.0}}  # the diagnosis's own batch is not a step point
    assert cal.prefill_ms == {64: 3.0, 512: 12.0}
    assert cal.host_cores == 2 and cal.kv_capacity_tokens == 4096 and cal.max_model_len == 2048
    assert cal.kv_bytes_per_token == shape.kv_bytes_per_token()
    assert cal.replica_memory_bytes == GIB // 2  # on CPU: what loading the model took
    assert cal.api_request_ms == pytest.approx(0.5)
    assert list(calib.table(cal)["figure"])[0] == "decode step at batch 1, ms"
    # no engines-sharing calibration: with the card's figures, each step's roofline floor is the
    # GPU's part of it (a lower bound); without them, none (0: replicas see no GPU contention)
    assert cal.gpu_floor_ms is None and cal.gpu_step_ms(8) == 0.0
    floored = calib.from_results(pts, api, shape, card=(0.2, 0.02, "given"))
    assert set(floored.gpu_floor_ms) == {1, 8}
    assert 0 < floored.gpu_step_ms(8) == floored.gpu_floor_ms[8] < floored.host_step_ms(8)
    assert "GPU floor of a step at batch 8, ms" in set(calib.table(floored)["figure"])
    with pytest.raises(ConfigError, match="no decode step"):
        calib.from_results(pts[:1], api, shape)
    with pytest.raises(ConfigError, match="whole numbers"):
        calib.step_workloads([0, 8], [64])
    with pytest.raises(ConfigError, match="two reply lengths"):
        calib.api_workloads([16, 16], 64)


CONFIGS = {
    "default": {"serve": {"client_workers": 1}},
    "perf": {"settings": {"performance_mode": "throughput"}, "serve": {"client_workers": 1}},
}
SPACE = {"replicas": [1, 2, 8], "stream_interval": [1, 16]}
# test_capacity_model's WORKLOAD, SLO: 256-token prompts, 128-token replies, TTFT 500 ms, TPOT 30 ms
WORKLOAD, SLO = {"prompt_len": 256, "output_len": 128}, {"ttft_ms": 500.0, "tpot_ms": 30.0}


def test_a_plan_measures_the_top_the_default_the_check_and_what_was_given():
    cal = calibration(host_cores=8)
    plan = headroom.search_plan(SPACE, CONFIGS, cal, WORKLOAD, SLO, top=1, client_workers=3)
    picked = [r["config"] for r in plan["picked"]]
    ranked = {r["config"]: r for r in plan["ranked"]}
    assert picked[0] == "default"  # the reference first
    top = next(r for r in plan["ranked"] if r.get("rank") == 1)["config"]
    assert top in picked and "perf" in picked  # given: measured though the model cannot say
    assert (
        ranked["perf"]["predicted_rps"] is None and "performance_mode" in ranked["perf"]["reason"]
    )
    # 8 replicas leave no core for the API servers on 8 cores: ranked, never measured
    assert not ranked["replicas=8"]["fits"] and "replicas=8" not in plan["configs"]
    cfg = plan["configs"][top]
    assert cfg["serve"]["client_workers"] == 3
    assert cfg["search"]["start_rps"] == pytest.approx(ranked[top]["predicted_rps"], rel=1e-3)
    assert plan["configs"]["perf"] == CONFIGS["perf"]  # no prediction: its own start
    frame = headroom.ranked_frame(plan)
    assert set(frame["config"]) == set(ranked) and frame["measured"].astype(bool).sum() == len(
        picked
    )
    with pytest.raises(ConfigError, match="needs the calibration"):
        headroom.search_plan(SPACE, CONFIGS, None, WORKLOAD, SLO)
    # no grid: what was given, each predicted where the model knows its knobs
    given = headroom.search_plan({}, CONFIGS, cal, WORKLOAD, SLO)
    assert [r["config"] for r in given["picked"]] == ["default", "perf"]


def test_the_race_starts_again_only_where_the_top_is_undecided(tmp_path):
    # measured capacity per config and start: "b" clearly best, "c" far behind
    truth = {"default": [10.0, 11.0, 10.5], "b": [30.0, 31.0, 29.0], "c": [1.0, 1.1, 0.9]}
    starts: list[tuple[str, int]] = []
    done: list[dict] = []

    def sweep(cfgs: dict, n: int) -> list[dict]:
        have = {(p["config"], p["repeat"]) for p in done}
        for r in range(n):
            for name in cfgs:
                if (name, r) not in have:
                    starts.append((name, r))
                    cap = truth[name][r]
                    done.append(
                        {
                            "config": name,
                            "repeat": r,
                            "status": "ok",
                            "metrics": {"capacity_rps": cap},
                        }
                    )
        return list(done)

    out = headroom.race(sweep, {n: {} for n in truth}, max_starts=3)
    assert out["decided"] and out["best"] == "b"
    assert ("c", 1) not in starts  # the worse half stopped after one start
    assert out["measured"]["b"] == [30.0, 31.0, 29.0] and len(out["measured"]["default"]) == 3
    plan = headroom.search_plan({}, {n: {} for n in truth}, calibration(), WORKLOAD, SLO)
    errors = headroom.errors_view(plan, out["measured"], "Figure")
    assert {d["name"] for d in errors["figure"].to_dict()["data"]} >= set(truth)
    path = headroom.write_search(
        tmp_path / "search.json", calibration(), plan, errors, out["measured"]
    )
    doc = json.loads(path.read_text())
    assert doc["calibration"]["host_cores"] == 64 and doc["capacity_rps"]["c"] == [1.0]
    assert {r["config"] for r in doc["errors"]["rows"]} == set(truth)
    assert headroom.search_recorded_text(path).endswith("recorded: True")
    fig = headroom.search_error_figure(path).to_dict()  # the report's, from the kept file
    assert "within 15%" in fig["layout"]["title"]["text"] and fig["data"]
    assert headroom.search_error_figure(tmp_path / "none.json") is None
    # a measured candidate without its error row is reported as such
    doc["errors"]["rows"] = doc["errors"]["rows"][1:]
    path.write_text(json.dumps(doc))
    assert headroom.search_recorded_text(path).endswith("recorded: False")


def test_a_race_whose_further_starts_all_fail_stops():
    calls: list[int] = []

    def sweep(cfgs: dict, n: int) -> list[dict]:
        calls.append(n)
        ok = [
            {"config": c, "repeat": 0, "status": "ok", "metrics": {"capacity_rps": v}}
            for c, v in (("default", 10.0), ("b", 10.5))
        ]
        return ok + [
            {"config": c, "repeat": r, "status": "error"} for c in cfgs for r in range(1, n)
        ]

    out = headroom.race(sweep, {"default": {}, "b": {}}, max_starts=3)
    assert calls == [1, 2] and out["next"] == [] and "all failed" in out["why"]


def test_a_plan_clamps_starts_to_the_cap_and_takes_a_start_for_a_grid_candidate():
    cal = calibration(host_cores=8)
    top = headroom.search_plan(SPACE, CONFIGS, cal, WORKLOAD, SLO, top=1)
    name = next(n for n in top["configs"] if n not in CONFIGS)
    assert top["configs"][name]["search"]["start_rps"] > 5.0
    capped = headroom.search_plan(SPACE, CONFIGS, cal, WORKLOAD, SLO, top=1, max_rps=5.0)
    assert capped["configs"][name]["search"]["start_rps"] == 5.0  # not above the search's cap
    given = headroom.search_plan(
        SPACE, CONFIGS, cal, WORKLOAD, SLO, top=1, search_start={name: 7.0}
    )
    assert given["configs"][name]["search"]["start_rps"] == 7.0
    with pytest.raises(ConfigError, match="search_start"):
        headroom.search_plan(SPACE, CONFIGS, cal, WORKLOAD, SLO, search_start={"nope": 1.0})
    # a given configuration named like a grid candidate, or with its knobs, stands for it: once
    odd = {
        **CONFIGS,
        "stream_interval=16": {"settings": {"performance_mode": "x"}},
        "two": {"serve": {"replicas": 2}},
    }
    plan = headroom.search_plan(SPACE, odd, cal, WORKLOAD, SLO, top=1)
    names = [r["config"] for r in plan["ranked"]]
    assert names.count("stream_interval=16") == 1 and "replicas=2" not in names and "two" in names


def test_capped_searches_are_lower_bounds_and_search_json_is_strict(tmp_path):
    plan = headroom.search_plan(
        {}, {"default": {}, "b": {"settings": {"stream_interval": 4}}}, calibration(), WORKLOAD, SLO
    )
    results = [
        {"config": "default", "status": "ok", "metrics": {"capacity_rps": 0.0}},
        {
            "config": "b",
            "status": "ok",
            "metrics": {"capacity_rps": 256.0, "capacity_capped": True},
        },
    ]
    errors = headroom.errors_view(plan, {"default": [0.0], "b": [256.0]}, "F", results)
    b = next(r for r in errors["rows"] if r["config"] == "b")
    assert b["lower_bound"] and not b["wrong"] and "stopped at its cap" in errors["text"]
    path = headroom.write_search(
        tmp_path / "s.json", calibration(), plan, errors, {"default": [0.0]}
    )
    doc = json.loads(path.read_text())  # the infinite error of a 0 capacity is null, not Infinity
    assert next(r for r in doc["errors"]["rows"] if r["config"] == "default")["error_pct"] is None


def test_a_search_that_held_at_its_prediction_does_not_resolve_the_error():
    plan = headroom.search_plan({}, {"default": {}}, calibration(), WORKLOAD, SLO)
    pred = plan["ranked"][0]["predicted_rps"]  # the search started here, held, failed at 2x
    held = [
        {
            "config": "default",
            "status": "ok",
            "metrics": {"capacity_rps": pred, "first_failing_rps": 2 * pred},
        }
    ]
    errors = headroom.errors_view(plan, {"default": [pred]}, "F", held)
    assert errors["rows"][0]["within_step"] and errors["rows"][0]["step_pct"] == pytest.approx(100)
    assert (
        errors["text"].startswith("no measured candidate resolves")
        and "failed 100% above" in errors["text"]
    )
    # a bisected search (steps of 10%) does resolve it
    fine = [
        {
            "config": "default",
            "status": "ok",
            "metrics": {"capacity_rps": pred, "first_failing_rps": 1.1 * pred},
        }
    ]
    assert headroom.errors_view(plan, {"default": [pred]}, "F", fine)["text"].startswith(
        "predicted capacity within 15%"
    )
