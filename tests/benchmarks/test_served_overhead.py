"""benchmarks/served_overhead.py: the ABBA order, the bootstrap and paired ratios, the verdict, the
request set both clients send, and one short real comparison (engine-marked)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location(
        "served_overhead", ROOT / "benchmarks" / "served_overhead.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


so = _load()


# --------------------------------------------------------------------------- ABBA order
def test_abba_order():
    assert so.abba_order(1) == ["A", "B", "B", "A"]
    assert so.abba_order(3) == ["A", "B", "B", "A"] * 3
    order = so.abba_order(5)
    assert order.count("A") == order.count("B") == 10


def test_abba_order_rejects_no_blocks():
    with pytest.raises(ValueError):
        so.abba_order(0)


# --------------------------------------------------------------------------- bootstrap ratio
def test_identical_arms_give_ratio_one_with_a_tight_interval():
    rng = np.random.default_rng(1)
    a = (100 + rng.normal(0, 0.2, size=16)).tolist()
    est = so.bootstrap_ratio(a, list(a))
    assert est["ratio"] == pytest.approx(1.0)
    lo, hi = est["ci95"]
    assert lo <= 1.0 <= hi
    assert hi - lo < 0.01
    assert so.within(est)


def test_a_ten_percent_shift_is_detected():
    rng = np.random.default_rng(2)
    a = (100 + rng.normal(0, 1, size=16)).tolist()
    b = (90 + rng.normal(0, 1, size=16)).tolist()
    est = so.bootstrap_ratio(a, b)
    assert est["ratio"] == pytest.approx(0.9, abs=0.01)
    assert est["ci95"][1] < 0.97  # the whole interval is below the band
    assert not so.within(est)
    assert "NOT within" in so.verdict("x", est)


def test_bootstrap_is_seeded():
    a, b = [1.0, 2.0, 3.0, 4.0], [1.1, 2.1, 2.9, 4.2]
    assert so.bootstrap_ratio(a, b, seed=5) == so.bootstrap_ratio(a, b, seed=5)


def test_noisy_arms_fail_on_the_interval_not_the_ratio():
    """Equal medians but a wide spread: the ratio is 1, the interval is not inside +-3 %."""
    a = [80.0, 90.0, 100.0, 110.0, 120.0]
    est = so.bootstrap_ratio(a, list(reversed(a)))
    assert est["ratio"] == pytest.approx(1.0)
    line = so.verdict("tok/s", est)
    assert "interval is not inside" in line and "ratio is outside" not in line


# --------------------------------------------------------------------------- paired ratio
def test_paired_ratio_cancels_a_linear_drift():
    """B costs 5 %; the machine slows linearly over the runs. ABBA pairs still give 0.95."""
    order = so.abba_order(4)
    values = [(100.0 - 2.0 * i) * (0.95 if arm == "B" else 1.0) for i, arm in enumerate(order)]
    est = so.paired_ratio(order, values)
    assert est["blocks"] == 4
    # Within a block the drift is symmetric (A at 0 and 3, B at 1 and 2): exact for a mean.
    assert est["ratio"] == pytest.approx(0.95, abs=1e-3)


def test_a_paired_verdict_over_too_few_blocks_decides_nothing():
    order = so.abba_order(1)
    est = so.paired_ratio(order, [10.0, 10.0, 10.0, 10.0])
    assert est["ci95"] == [1.0, 1.0]  # one block: a zero-width "interval"
    assert "too few to decide" in so.verdict("x", est)
    assert "within" not in so.verdict("x", est)


def test_paired_ratio_needs_whole_blocks():
    with pytest.raises(ValueError):
        so.paired_ratio(["A", "B", "B"], [1.0, 1.0, 1.0])


def test_compare_reports_each_shared_metric():
    order = so.abba_order(2)
    runs = [
        {name: 10.0 for name in [*so.METRICS, "output_tok_s_span"]} | {"arm": arm} for arm in order
    ]
    out = so.compare(order, runs)
    assert set(out) == {*so.METRICS, "output_tok_s_span"}
    assert out["output_tok_s"]["kind"] == "client cost"
    assert out["ttft_median_ms"]["kind"] == "measurement difference"
    assert out["tpot_median_ms"]["bootstrap"]["ratio"] == pytest.approx(1.0)
    assert (
        out["output_tok_s"]["bench"] == [10.0] * 4
        and "tunebook/bench" in out["output_tok_s"]["verdict"]
    )
    sampler = so.compare(order, runs, so.ARMS["sampler"])["output_tok_s"]
    assert sampler["sampler_off"] == sampler["sampler_on"] == [10.0] * 4
    assert sampler["verdict"].startswith("output_tok_s: sampler_on/sampler_off 1.000")


# --------------------------------------------------------------------------- both clients' records
def test_span_throughput():
    assert so.span_throughput([0.0, 0.5], [1.0, 2.0], [10, 30]) == pytest.approx(20.0)


def test_bench_and_tunebook_records_use_one_span_definition():
    bench = {
        "output_throughput": 1.0,
        "median_ttft_ms": 2.0,
        "median_tpot_ms": 3.0,
        "median_itl_ms": 3.0,
        "median_e2el_ms": 4.0,
        "start_times": [10.0, 10.5],
        "latencies": [1.0, 1.5],
        "output_lens": [8, 8],
    }
    run = {
        "metrics": {"output_throughput_tok_s": 1.0, "ttft_p50_ms": 2.0},
        "requests": [
            {"sent_s": 0.0, "e2e_ms": 1000.0, "output_tokens": 8},
            {"sent_s": 0.5, "e2e_ms": 1500.0, "output_tokens": 8},
        ],
    }
    assert so.bench_record(bench)["output_tok_s_span"] == pytest.approx(8.0)
    assert so.tunebook_record(run)["output_tok_s_span"] == pytest.approx(8.0)
    assert so.tunebook_record(run)["ttft_median_ms"] == 2.0
    assert so.bench_record(bench)[so.SEND_SPREAD] == pytest.approx(500.0)
    assert so.tunebook_record(run)[so.SEND_SPREAD] == pytest.approx(500.0)


# --------------------------------------------------------------------------- the request set
def test_prompts_have_the_exact_token_count(tiny_model):
    from tokenizers import Tokenizer

    from tunebook.core.model import resolve_model_dir

    tj = resolve_model_dir(tiny_model) / "tokenizer.json"
    prompts = so.make_prompts(tj, 12, 64, seed=3)
    tok = Tokenizer.from_file(str(tj))
    assert len(prompts) == 12 and len(set(prompts)) == 12
    assert all(len(tok.encode(p, add_special_tokens=False).ids) == 64 for p in prompts)
    assert prompts == so.make_prompts(tj, 12, 64, seed=3)


def test_bench_argv_names_the_same_request_set(tmp_path):
    class Args:
        num_prompts, output_len = 7, 5

    argv = so.bench_argv("http://h:1", "tunebook", "tok", "req.jsonl", Args, str(tmp_path), "r")
    flags = dict(zip(argv[::2], argv[1::2], strict=False))
    assert "--ignore-eos" in argv and "--disable-shuffle" in argv
    assert "--skip-chat-template" in argv
    i = argv.index
    assert argv[i("--num-prompts") + 1] == "7"
    assert argv[i("--custom-output-len") + 1] == "5"
    assert argv[i("--request-rate") + 1] == "inf"
    assert argv[i("--temperature") + 1] == "0"
    assert flags["--backend"] == "openai"
    assert "--max-concurrency" not in argv  # no cap unless asked

    class Capped(Args):
        max_concurrency = 16

    argv = so.bench_argv("http://h:1", "tunebook", "tok", "req.jsonl", Capped, str(tmp_path), "r")
    assert argv[argv.index("--max-concurrency") + 1] == "16"


# --------------------------------------------------------------------------- one real comparison
@pytest.mark.engine
@pytest.mark.extended  # the benchmark's harness on a real server; its arithmetic is tested above
def test_one_block_on_a_real_server(tmp_path, monkeypatch):
    """1 ABBA block, 2 prompts, on one `vllm serve` of the tiny model: both clients finish, send
    the same requests, and nothing is left running. No timing assertions."""
    out = tmp_path / "out.json"
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "served_overhead.py",
            "--blocks",
            "1",
            "--num-prompts",
            "2",
            "--input-len",
            "8",
            "--output-len",
            "4",
            "--work-dir",
            str(tmp_path / "work"),
            "--out",
            str(out),
        ],
    )
    written, write = [], so.write_result
    monkeypatch.setattr(
        so,
        "write_result",
        lambda path, r: written.append((r["complete"], r["blocks"])) or write(path, r),
    )
    so.main()
    result = json.loads(out.read_text())
    # each whole block is written as it ends (a run cut by its budget keeps its blocks), then the end
    assert written == [(False, 1), (True, 1)]
    assert (
        result["env"]["server_start"] in ("forked", "spawned")
        and result["env"]["server_start_s"] > 0
    )
    assert result["processes_left"] == []
    assert result["failed_requests"] == 0
    assert [r["arm"] for r in result["runs"]] == ["A", "B", "B", "A"]
    assert result["request_set"]["output_tokens_per_run"] == [8]
    assert result["request_set"]["prompt_tokens_seen_by_server"] == [16]
    assert "output_tok_s" in result["comparison"]
    # The server saw each run's 2 requests, whichever client sent them.
    assert [r["server_requests"] for r in result["runs"]] == [2, 2, 2, 2]
    assert result["comparison"]["server_e2e_mean_ms"]["kind"] == "client cost, the server's view"
    assert result["env"]["bench_command"].startswith("vllm bench serve ")


def test_server_view_is_the_mean_of_the_run_from_histogram_deltas():
    before = {
        "vllm:e2e_request_latency_seconds_sum": 4.0,
        "vllm:e2e_request_latency_seconds_count": 8,
        "vllm:time_to_first_token_seconds_sum": 1.0,
        "vllm:time_to_first_token_seconds_count": 8,
    }
    after = {
        "vllm:e2e_request_latency_seconds_sum": 7.0,  # 3 s over 2 requests
        "vllm:e2e_request_latency_seconds_count": 10,
        "vllm:time_to_first_token_seconds_sum": 1.1,
        "vllm:time_to_first_token_seconds_count": 10,
    }
    out = so.server_view(before, after)
    assert out["server_e2e_mean_ms"] == pytest.approx(1500.0)
    assert out["server_ttft_mean_ms"] == pytest.approx(50.0)
    assert out["server_requests"] == 2
    assert "server_queue_mean_ms" not in out  # not exposed: left out, not zero
    assert so.server_view(after, after) == {}  # no request in between: nothing to average


def test_client_cpu_is_compared_without_a_verdict():
    order = so.abba_order(1)
    runs = [
        {name: 10.0 for name in [*so.METRICS, "output_tok_s_span"]}
        | {so.CLIENT_CPU: 0.2 if arm == "A" else 0.1}
        for arm in order
    ]
    out = so.compare(order, runs)[so.CLIENT_CPU]
    assert out["bootstrap"]["ratio"] == pytest.approx(0.5)
    assert "within" not in out["verdict"]


def test_server_settings_keep_prefix_caching_off():
    args = argparse.Namespace(settings='{"max_model_len": 2048, "enable_prefix_caching": true}')
    assert so.server_settings(args) == {"max_model_len": 2048, "enable_prefix_caching": False}
    assert so.server_settings(argparse.Namespace(settings=None))["enforce_eager"] is True
    with pytest.raises(SystemExit, match="JSON object"):
        so.server_settings(argparse.Namespace(settings="[1, 2]"))


def test_pooled_runs_take_each_blocks_ratio_within_its_own_server():
    """Two runs at different levels (two server starts), B 2 % above A within each: the pooled
    paired ratio is 1.02 exactly, whatever the levels; runs of different questions refuse."""
    order = so.abba_order(3)

    def result(level: float, arms=None) -> dict:
        runs = [{"output_tok_s": level * (1.02 if arm == "B" else 1.0)} for arm in order]
        return {"order": order, "runs": runs, **({"arms": arms} if arms else {})}

    pooled = so.pool([result(100.0), result(300.0)])
    est = pooled["comparison"]["output_tok_s"]["paired"]
    assert est["ratio"] == pytest.approx(1.02) and est["blocks"] == 6
    assert (
        "(paired, 2 runs): tunebook/bench 1.020"
        in pooled["comparison"]["output_tok_s"]["verdict_paired"]
    )
    with pytest.raises(ValueError, match="cannot pool"):
        so.pool([result(1.0), result(1.0, {"A": "sampler_off", "B": "sampler_on"})])
