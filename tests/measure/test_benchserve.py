"""vLLM's own client as a served point's load generator: its arguments, its records, a real run."""

from __future__ import annotations

import gzip
import json

import pytest
from test_served import wait_gone

from tunebook.core.errors import ConfigError
from tunebook.core.points import Point
from tunebook.core.workloads import make_workload
from tunebook.measure import benchserve

SETTINGS = {"enforce_eager": True, "kv_cache_memory_bytes": 32 << 20, "max_model_len": 512}


def test_the_rate_and_the_requests_are_shared_by_the_workers():
    wl = make_workload(
        {"kind": "fixed", "num_requests": 7, "prompt_len": 32, "output_len": 8, "request_rate": 6.0}
    )
    args = benchserve.worker_args(
        "http://h:1", "tunebook", "/tok", wl, {"ttft_ms": 500, "tpot_ms": 50}, 2, "/out", "s1"
    )
    assert len(args) == 2
    get = lambda a, k: a[a.index(k) + 1]  # noqa: E731
    assert [get(a, "--num-prompts") for a in args] == ["4", "3"]
    assert [get(a, "--request-rate") for a in args] == ["3.0", "3.0"]
    assert get(args[0], "--seed") != get(args[1], "--seed")  # not the same prompts twice
    assert args[0][args[0].index("--goodput") + 1 : args[0].index("--goodput") + 3] == [
        "ttft:500",
        "tpot:50",
    ]
    assert get(args[1], "--result-filename") == "bench-s1-w1.json" and "--save-detailed" in args[0]
    one = make_workload({"kind": "fixed", "num_requests": 1, "prompt_len": 8, "output_len": 4})
    assert (
        len(benchserve.worker_args("u", "m", "t", one, None, 4, "/o", "s")) == 1
    )  # no empty worker
    mixed = make_workload({"kind": "mixed", "num_requests": 4, "output_len": 4})
    with pytest.raises(ConfigError, match="random dataset of fixed lengths"):
        benchserve.worker_args("u", "m", "t", mixed, None, 1, "/o", "s")


def test_its_detailed_result_becomes_tunebooks_records():
    res = {
        "ttfts": [0.1, 0.0],
        "itls": [[0.01, 0.02, 0.03], []],
        "latencies": [0.16, 0.0],
        "start_times": [100.5, 101.0],
        "output_lens": [4, 0],
        "input_lens": [32, 32],
        "errors": ["", "HTTP 503: Service Unavailable"],
    }
    ok, bad = benchserve.records(res, perf0=100.0)
    assert ok["sent_s"] == pytest.approx(0.5) and ok["ttft_ms"] == pytest.approx(100.0)
    assert ok["itl_ms"] == pytest.approx([10.0, 20.0, 30.0]) and ok["e2e_ms"] == pytest.approx(
        160.0
    )
    assert ok["tpot_ms"] == pytest.approx(20.0) and ok["output_tokens"] == 4 and "error" not in ok
    assert bad["error"].startswith("HTTP 503") and "ttft_ms" not in bad
    del res["latencies"]  # vLLM 0.26 leaves them out: TTFT plus the gaps
    assert benchserve.records(res, 100.0)[0]["e2e_ms"] == pytest.approx(160.0)


def test_a_refusal_keeps_its_status_though_bench_keeps_only_the_reason_phrase():
    """bench serve's error for an HTTP failure is the response's reason (``response.reason``):
    the overload check counts 429 and 503 as refused, so the record carries the code back."""
    res = {
        "ttfts": [0.0, 0.0, 0.0],
        "itls": [[], [], []],
        "start_times": [1.0, 1.1, 1.2],
        "output_lens": [0, 0, 0],
        "input_lens": [8, 8, 8],
        "errors": ["Service Unavailable", "Too Many Requests", "Traceback ...: ClientError"],
    }
    a, b, c = benchserve.records(res, perf0=1.0)
    assert (a["status"], b["status"]) == (503, 429) and "status" not in c
    assert a["error"] == "Service Unavailable"  # the words stay


def test_only_served_points_take_vllms_client():
    with pytest.raises(ConfigError, match="client="):
        Point.from_dict({"point_id": "p", "model": "tiny-ernie", "workload": {}, "client": "wrk"})
    with pytest.raises(ConfigError, match="is for mode 'served'"):
        Point.from_dict(
            {"point_id": "p", "model": "tiny-ernie", "workload": {}, "client": "vllm-bench"}
        )


@pytest.mark.engine
def test_vllm_bench_serve_measures_a_served_point_and_its_json_is_kept(tmp_path):
    """A served point measured by `vllm bench serve` (two processes forked from one import): its
    requests become records the SLO and the sustained rule read, and its result files are kept,
    gzipped, beside the point's logs."""
    from tunebook.measure.execute import run_point

    p = {
        "point_id": "bench",
        "model": "tiny-ernie",
        "mode": "served",
        "settings": dict(SETTINGS),
        "workload": {"kind": "fixed", "prompt_len": 32, "output_len": 16, "seed": 2},
        "slo": {"ttft_ms": 5000.0, "tpot_ms": 1000.0},
        "client": "vllm-bench",
        "serve": {"client_workers": 2},
        "rates": [6.0],
        "search": {"duration_s": 3.0, "min_requests": 12},
        "warmup_requests": 1,
    }
    try:
        res = run_point(p, log_path=tmp_path / "logs" / "bench.log")
    finally:
        assert wait_gone() == []
    assert res["status"] == "ok", res.get("error")
    (rate,) = [r for r in res["per_rate"] if not r.get("superseded")]
    assert rate["num_requests"] >= 12 and rate["slo_attainment_pct"] == 100.0
    assert rate["sustained"] in (True, False) and rate["window_s_needed"] >= 3.0
    assert res["env"]["client"] == "vllm bench serve (2 process(es))"
    kept = sorted((tmp_path / "logs" / "bench").glob("bench-*-w*.json.gz"))
    assert len(kept) >= 2
    saved = json.loads(gzip.open(kept[0], "rt").read())
    assert saved["completed"] >= 1 and "generated_texts" not in saved and "ttfts" in saved
    assert res["client"]["bench"]["files"] and res["client"]["bench"]["failed"] == 0
