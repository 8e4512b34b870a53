"""04's search on synthetic calibration and synthetic measurements: what is ranked, what is
started, when the race stops, and the prediction's error. No engine; figures through to_dict()."""

from __future__ import annotations

import itertools
import math

import pytest
from synthetic import point
from test_capacity_model import calibration, traffic

from tunebook.core.capacity_model import GIB, Candidate, enumerate_candidates, predict
from tunebook.core.metrics import MIN_GAP
from tunebook.topics import search
from tunebook.topics.plots import ROLE_COLOURS

SPACE = {"replicas": [1, 2, 4, 8], "stream_interval": [1, 16], "api_server_count": [1, 2]}
# fits every core count below, but not the card: 2 x (2 GiB + 40 GiB)
TOO_BIG = Candidate(replicas=2, stream_interval=16, kv_cache_memory_bytes=40 * GIB)


def _ranked(host_cores: int = 8):
    cands = [*enumerate_candidates(SPACE), TOO_BIG]
    return search.rank(cands, calibration(host_cores=host_cores), traffic())


def test_a_candidate_that_cannot_fit_is_never_picked_nor_started():
    ranked = _ranked()
    unfit = {r["config"] for r in ranked if not r["fits"]}
    # 8 replicas leave no core of 8 for the API servers; TOO_BIG overflows the card
    assert unfit == {c.name for c in enumerate_candidates(SPACE) if c.replicas == 8} | {
        TOO_BIG.name
    }
    assert all(
        r["reason"] and r["predicted_rps"] is None and r["rank"] is None
        for r in ranked
        if not r["fits"]
    )
    # on a host with the cores, 8 replicas would be the model's first choice: the exclusion matters
    roomy = _ranked(host_cores=64)
    assert roomy[0]["candidate"].replicas == 8
    picked = search.pick(ranked, top=len(ranked))
    assert not unfit & {r["config"] for r in picked}
    started = search.successive_halving([r["config"] for r in picked], lambda n: 100.0)
    assert not unfit & set(started["measured"])


def test_the_ranking_follows_the_prediction():
    ranked = [r for r in _ranked() if r["fits"]]
    cal, t = calibration(host_cores=8), traffic()
    preds = [predict(r["candidate"], cal, t).capacity_rps for r in ranked]
    assert [r["predicted_rps"] for r in ranked] == preds
    assert preds == sorted(preds, reverse=True)
    assert [r["rank"] for r in ranked] == list(range(1, len(ranked) + 1))
    # 4 replicas with 1 or 2 API servers each predict the same (the engine loops bind): the
    # smaller deployment ranks first
    assert ranked[0]["config"] == "replicas=4_stream_interval=16"
    assert ranked[1]["config"] == "replicas=4_stream_interval=16_api_server_count=2"
    assert ranked[0]["binding"] == "engine_core_loop"


def test_pick_takes_the_top_the_default_and_one_the_model_ranks_low():
    ranked = _ranked()
    picked = search.pick(ranked, top=2)
    names = [r["config"] for r in picked]
    assert names[:2] == [r["config"] for r in ranked[:2]]
    assert "default" in names and len(names) == len(set(names)) == 4
    check = picked[-1]
    assert check["why"].startswith("check on the model")
    low = [
        r for r in ranked if r["fits"] and r["predicted_rps"] > 0 and r["config"] not in names[:3]
    ]
    assert check["rank"] == max(r["rank"] for r in low)
    assert len(search.pick(ranked, top=2, check=False)) == 3
    starts = search.search_starts(picked)
    assert starts[names[0]] == round(ranked[0]["predicted_rps"], 3)


# --------------------------------------------------------------------------- successive halving
def test_one_start_each_never_decides_however_far_apart():
    step = search.halving_step({"a": [200.0], "b": [100.0], "c": [90.0]})
    assert not step["decided"] and step["next"] == ["a", "b"]


def test_the_default_keeps_its_starts_while_the_race_goes_on():
    step = search.halving_step({"a": [200.0], "b": [190.0], "c": [180.0], "default": [50.0]})
    assert step["next"] == ["a", "b", "default"]


def test_the_race_stops_when_the_bests_worst_start_beats_the_runner_ups_best():
    measured = {"a": [100.0, 102.0], "b": [50.0, 52.0], "default": [30.0, 31.0]}
    assert search.halving_step(measured)["next"] == ["a", "b", "default"]  # 2 starts: too few
    measured = {k: [*v, v[0]] for k, v in measured.items()}
    step = search.halving_step(measured)
    assert step["decided"] and step["best"] == "a" and step["runner_up"] == "b"
    assert step["next"] == [] and "worst start (100) beats b's best (52)" in step["why"]


def test_the_race_stops_when_the_top_two_are_under_the_gap_that_matters():
    step = search.halving_step({"a": [100.0, 101.0], "b": [99.0, 100.5], "c": [50.0, 50.0]})
    assert step["decided"] and {step["best"], step["runner_up"]} == {"a", "b"}
    assert (100.5 / 99.75 - 1) < MIN_GAP and "under the 3%" in step["why"]
    # the same two, 10% apart, go on
    assert not search.halving_step({"a": [110.0, 111.0], "b": [99.0, 100.5]})["decided"]


def test_an_undecided_race_stops_at_its_budget():
    step = search.halving_step({"a": [100.0, 80.0, 120.0], "b": [95.0, 110.0, 85.0]}, max_starts=3)
    assert not step["decided"] and step["next"] == [] and "undecided after 3 starts" in step["why"]


def test_successive_halving_spends_starts_only_where_the_top_is_undecided():
    true = {"a": 200, "b": 150, "c": 140, "d": 100, "e": 90, "f": 60, "default": 50}
    noise = {n: itertools.cycle([1.0, 0.95, 1.05]) for n in true}
    out = search.successive_halving(list(true), lambda n: true[n] * next(noise[n]))
    assert out["decided"] and out["best"] == "a"
    # 7 first starts, then the better 4 and the default, then the better 3 and the default
    assert out["starts"] == 7 + 5 + 4 < 3 * len(true)
    assert len(out["measured"]["f"]) == 1 and len(out["measured"]["default"]) == 3


# --------------------------------------------------------------------------- the model's error
def test_mape_arithmetic():
    assert search.mape([(110.0, 100.0), (90.0, 100.0), (100.0, 100.0)]) == pytest.approx(20 / 3)
    assert search.mape([(50.0, 200.0)]) == pytest.approx(75.0)
    assert math.isnan(search.mape([(5.0, 0.0)]))


def _rows():
    return [
        {"config": "a", "predicted_rps": 110.0, "binding": "gpu", "batch_limit": "tpot"},
        {
            "config": "b",
            "predicted_rps": 90.0,
            "binding": "engine_core_loop",
            "batch_limit": "tpot",
        },
        {
            "config": "default",
            "predicted_rps": 100.0,
            "binding": "api_server",
            "batch_limit": "tpot",
        },
        {"config": "c", "predicted_rps": 116.0, "binding": "api_server", "batch_limit": "tpot"},
        {"config": "d", "predicted_rps": 50.0, "binding": "kv", "batch_limit": "kv"},
        {"config": "unmeasured", "predicted_rps": 500.0, "binding": "gpu", "batch_limit": "tpot"},
    ]


def _measured():
    return {"a": [100.0, 98.0, 102.0], "b": [100.0], "default": [100.0], "c": [100.0], "d": [0.0]}


def test_prediction_errors_name_what_the_model_got_wrong_and_why():
    err = search.prediction_errors(_rows(), _measured())
    rows = {r["config"]: r for r in err["rows"]}
    assert set(rows) == {"a", "b", "default", "c", "d"}
    assert rows["a"]["error_pct"] == pytest.approx(10.0) and rows["b"][
        "error_pct"
    ] == pytest.approx(-10.0)
    assert (rows["a"]["measured_min"], rows["a"]["measured_max"], rows["a"]["n"]) == (
        98.0,
        102.0,
        3,
    )
    # d held no rate: no percentage, left out of the mean, but wrong
    assert err["mape_pct"] == pytest.approx((10 + 10 + 0 + 16) / 4)
    assert [r["config"] for r in err["wrong"]] == ["c", "d"]
    assert "+16%" in rows["c"]["why"] and "api_server binding" in rows["c"]["why"]
    assert rows["a"]["why"] == ""
    assert "within 15%: mean absolute error 9.0% over 4" in err["text"]
    assert "d held no rate" in err["text"] and "c: predicted 116" in err["text"]


def test_a_model_off_by_more_than_15_percent_says_so():
    err = search.prediction_errors(_rows()[:1], {"a": [50.0]})
    assert err["mape_pct"] == pytest.approx(120.0) and "NOT within 15%" in err["text"]


def test_error_figure_draws_each_candidate_against_measured_equals_predicted():
    fig = search.error_figure(search.prediction_errors(_rows(), _measured())).to_dict()
    traces = {t["name"]: t for t in fig["data"]}
    assert {"a", "b", "default", "c", "measured = predicted", "-15%", "+15%"} <= set(traces)
    line = traces["measured = predicted"]
    assert list(line["x"]) == list(line["y"])
    assert list(traces["+15%"]["y"]) == pytest.approx([1.15 * x for x in traces["+15%"]["x"]])
    assert traces["c"]["marker"]["symbol"] == "x" and traces["a"]["marker"]["symbol"] == "circle"
    assert traces["default"]["marker"]["color"] == ROLE_COLOURS["default"]
    assert list(traces["a"]["error_y"]["array"]) == [2.0]
    assert "mean absolute error 9.0%" in fig["layout"]["title"]["text"]


# --------------------------------------------------------------------------- the Pareto view
POINTS = {
    "default": {"capacity_rps": 50.0, "ttft_p99_ms": 40.0},
    "a": {"capacity_rps": 100.0, "ttft_p99_ms": 50.0},
    "b": {"capacity_rps": 200.0, "ttft_p99_ms": 100.0},
    "c": {"capacity_rps": 150.0, "ttft_p99_ms": 120.0},  # b serves more, sooner
    "article": {"capacity_rps": 40.0, "ttft_p99_ms": 60.0},  # a serves more, sooner
}


def test_the_pareto_front_holds_only_candidates_nothing_beats_on_both():
    assert search.pareto_front(POINTS) == ["default", "a", "b"]
    tie = {
        "x": {"capacity_rps": 10.0, "ttft_p99_ms": 5.0},
        "y": {"capacity_rps": 10.0, "ttft_p99_ms": 5.0},
    }
    assert search.pareto_front(tie) == ["x", "y"]
    assert search.pareto_front(POINTS, latency="chunk_gap_p99_ms") == []


def test_pareto_figure_marks_the_default_the_article_and_the_chosen():
    fig = search.pareto_figure(POINTS, chosen="b", article="article").to_dict()
    traces = {t["name"]: t for t in fig["data"]}
    assert traces["default"]["marker"]["color"] == ROLE_COLOURS["default"]
    assert traces["article"]["marker"]["color"] == ROLE_COLOURS["article"]
    chosen = traces["b (chosen)"]
    assert (
        chosen["marker"]["color"] == ROLE_COLOURS["chosen"] and chosen["marker"]["symbol"] == "star"
    )
    assert traces["a"]["marker"]["symbol"] == "circle"
    front = traces["Pareto front"]
    assert list(front["x"]) == [40.0, 50.0, 100.0] and list(front["y"]) == [50.0, 100.0, 200.0]
    assert fig["layout"]["xaxis"]["title"]["text"] == "TTFT p99 at the capacity (ms)"


def test_pareto_figure_draws_the_slos_bound_where_given():
    fig = search.pareto_figure(POINTS, limit_ms=500.0).to_dict()
    (line,) = fig["layout"]["shapes"]
    assert line["x0"] == line["x1"] == 500.0 and line["line"]["dash"] == "dot"
    assert fig["layout"]["annotations"][0]["text"] == "SLO: 500 ms"
    assert "shapes" not in search.pareto_figure(POINTS).to_dict()["layout"]


def test_measured_capacities_read_04s_points():
    pts = [
        point("a", 0, metrics={"capacity_rps": 100.0, "ttft_p99_ms_at_capacity": 40.0}),
        point("a", 1, metrics={"capacity_rps": 120.0, "ttft_p99_ms_at_capacity": 60.0}),
        point("a", 2, status="failed"),
        point("b", 0, metrics={"capacity_rps": None}),  # the SLO held at no rate
    ]
    got = search.measured_capacities(pts)
    assert got["a"]["capacity"] == [100.0, 120.0] and got["a"]["capacity_rps"] == 110.0
    assert got["a"]["ttft_p99_ms"] == 50.0 and got["a"]["chunk_gap_p99_ms"] is None
    assert got["b"]["capacity"] == [0.0] and got["b"]["ttft_p99_ms"] is None


def test_no_check_on_the_model_when_every_candidate_predicts_the_same():
    cands = {"default": Candidate(), "same": Candidate()}  # one deployment under two names
    ranked = search.rank(cands, calibration(host_cores=64), traffic())
    assert ranked[0]["predicted_rps"] == ranked[1]["predicted_rps"]
    assert [r["why"] for r in search.pick(ranked, top=1)] == ["ranked 1 of 2 by prediction"]
