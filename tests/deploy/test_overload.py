"""A traffic spike must not become an outage (issue 44): the written deployment refuses the
excess of a burst at once and serves as before after it.

The engine test starts a 2-replica deployment of the tiny model exactly as
``writers.write_deployment`` writes it (start.sh run by bash: each replica bounded by
``--max-num-queued-reqs``, vllm-router without circuit breaker and retries), sends it the
deployment check's requests (completions and chat through the router), measures its
capacity there and then, drives a burst at 8x that capacity, then the capacity rate, and checks:
refusals came within a second, and after the burst nothing is refused and the SLO holds. The
rest checks how the overload check reads the load generator's records (no engine).
"""

from __future__ import annotations

import json
import os
import sys
import time

import pytest
from stub_server import stub_server
from test_served import wait_gone

from tunebook.deploy import serve, writers
from tunebook.engine import flags
from tunebook.measure.loadgen import LoadGenerator

# max_num_seqs sets each replica's bound (start.sh's MAX_QUEUED): 16 requests admitted each.
SETTINGS = {
    "enforce_eager": True,
    "kv_cache_memory_bytes": 32 << 20,
    "max_model_len": 512,
    "max_num_seqs": 16,
}
# The limits the tiny model meets on a shared 2-core machine (test_served's).
SLO = {"ttft_ms": 5000.0, "tpot_ms": 1000.0}
WORKLOAD = {"kind": "fixed", "prompt_len": 32, "output_len": 16}
CHOICE = {
    "scenario": "high_concurrency_chat",
    "scenario_title": "chat",
    "objective": "capacity",
    "slo": SLO,
    "changed": {},
    "decisions": [],
}


# --------------------------------------------------------------------------- records, no engine
def test_a_refusal_is_read_from_the_load_generators_error():
    assert serve.status_of({"ttft_ms": 5.0}) == 200
    assert serve.status_of({"error": 'RuntimeError: HTTP 503: {"error": ...}'}) == 503
    assert serve.status_of({"error": "RuntimeError: HTTP 429: "}) == 429
    assert serve.status_of({"error": "ClientConnectorError: Cannot connect to host"}) is None
    assert serve.status_of({"status": 429, "error": "x"}) == 429  # where a record says it
    assert serve.status_of({"stopped": True}) is None


def test_a_phase_counts_refused_failed_and_within_the_slo():
    ok = {"ttft_ms": 10.0, "tpot_ms": 5.0, "output_tokens": 16}
    slow = {"ttft_ms": 9000.0, "tpot_ms": 5.0, "output_tokens": 16}
    recs = (
        [ok] * 6
        + [slow]
        + [{"error": "RuntimeError: HTTP 503: busy"}] * 2
        + [{"error": "RuntimeError: HTTP 429: "}]
        + [{"error": "RuntimeError: HTTP 500: Request failed: error sending request"}]
    )
    s = serve.phase_summary(recs, SLO)
    assert (s["requests"], s["served"], s["refused"], s["failed"]) == (11, 7, 3, 1)
    assert s["statuses"] == {"200": 7, "429": 1, "500": 1, "503": 2}
    assert s["within_slo_pct"] == pytest.approx(100 * 6 / 11)
    assert not s["slo_holds"] and s["served_within_slo_pct"] == pytest.approx(100 * 6 / 7)
    assert list(s["errors"]) == ["RuntimeError: HTTP N: Request failed: error sending request"]
    assert "within_slo_pct" not in serve.phase_summary(recs, None)


def test_the_schedule_is_a_burst_then_the_capacity_rate():
    reqs = serve.schedule([("burst", 40.0, 2.0), ("after", 10.0, 3.0)], WORKLOAD, 1024)
    burst = [r for r in reqs if r.tag == "burst"]
    after = [r for r in reqs if r.tag == "after"]
    assert 60 <= len(burst) <= 80 and 20 <= len(after) <= 40  # Poisson, about rate x seconds
    assert all(r.arrival_s < 2.0 for r in burst) and all(2.0 <= r.arrival_s < 5.0 for r in after)
    assert [r.index for r in reqs] == list(range(len(reqs)))
    assert all(len(r.prompt) == 32 and r.max_tokens == 16 for r in reqs)


def test_no_capacity_is_said_before_any_request(capsys):
    res = serve.overload_check("http://127.0.0.1:9", {"replicas": 2}, "m")
    assert not res["ok"] and "pass --rate" in res["error"]


@pytest.mark.slow
def test_the_check_reads_a_bounded_server_right():
    """overload_check's own logic against a stub bounded at 4 requests in flight, 0.2 s each
    (20 req/s at most): a burst at 8x 4 req/s is partly refused with 503 at once, probes among
    them; after it, at 2 req/s, nothing is refused and the SLO holds: passed, and said so."""
    srv = stub_server("Paris.", bound=4, delay_s=0.2)
    lines: list[str] = []
    try:
        res = serve.overload_check(
            f"http://127.0.0.1:{srv.server_port}",
            {},
            "stub",
            rate=4.0,
            factor=8.0,
            after_rate=2.0,
            burst_s=2.0,
            settle_s=1.0,
            window_s=3.0,
            workload=WORKLOAD,
            slo=SLO,
            out=lines.append,
        )
    finally:
        srv.shutdown()
    said = "\n".join(lines)
    b, a = res["burst"], res["after"]
    assert b["refused"] > 0 and b["failed"] == 0 and b["statuses"].get("503") == b["refused"], said
    assert b["probes_refused"] > 0 and b["refusal_ms_max"] < 1000, said
    assert a["requests"] >= 3 and a["refused"] == 0 and a["slo_holds"], said
    assert res["ok"] and res["why"] == [], said
    assert (
        lines[-1] == "[serve] overload: passed: the excess refused at once, then served as before"
    )
    assert "probes refused" in lines[1] and "503 x" in lines[1], said


# --------------------------------------------------------------------------- the real thing
def tiny_deployment(tmp_path) -> tuple:
    """Two replicas of the tiny model as writers.write_deployment writes them, and the
    environment start.sh runs in (vLLM's own multiprocessing, the venv's ``vllm`` on PATH)."""
    folder = tmp_path / "deployment"
    kwargs = flags.deploy_kwargs("tiny-ernie", SETTINGS)
    writers.write_deployment(
        folder, {**CHOICE, "served_choice": {}}, kwargs, 2, served_model_name="tunebook"
    )
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env["PATH"] = f"{os.path.dirname(sys.executable)}:{env['PATH']}"  # an activated venv
    return folder, env


def capacity(base: str, model: str, out) -> float:
    """The highest of 2, 4, 8, ... req/s (5 s each) at which nothing was refused or failed and
    the SLO held: the deployment's capacity on this machine now (the next rate failed)."""
    cap = 0.0
    with LoadGenerator(1) as gen:
        gen.run(base, model, serve.schedule([("warm", 4.0, 3.0)], WORKLOAD, 1024))
        rate = 2.0
        while rate <= 64:
            time.sleep(1.0)  # what the last rate left running finishes
            recs, _ = gen.run(
                base,
                model,
                serve.schedule([(f"{rate:g}", rate, 5.0)], WORKLOAD, 1024),
                sampling={"temperature": 0.0, "ignore_eos": True},
            )
            s = serve.phase_summary(recs, SLO)
            out(f"capacity: {rate:g} req/s: {json.dumps(s)}")
            if s["refused"] or s["failed"] or not s["slo_holds"]:
                break
            cap, rate = rate, 2 * rate
    return cap


@pytest.mark.engine
def test_after_a_burst_at_8x_capacity_the_deployment_serves_as_before(tmp_path):
    """The issue's incident in small: a burst at 8x the capacity, then a rate it served before.
    The excess is refused with 503 or 429 within a second, and after the burst (5 s for what it
    admitted to finish) nothing is refused and the SLO holds; then nothing is left.

    8x, not the product's 4x: the capacity found by doubling can be half the true one, and at
    4x of that a faster machine reached the bound only in the burst's last moment (8 of 118
    refused, none of the 24 probes among them), so how fast a refusal comes went unmeasured.

    The window after the burst runs at a quarter of the capacity measured: on two shared cores a
    rate that held in one 5 s window can, at the bound's edge, refuse a few requests in the next,
    burst or no burst (seen: 16 req/s held, then 16 of 192 refused at 16 req/s after a burst; and
    in CI, 4 of 192 at 16 req/s, half of the 32 measured). A stall of a second doubles what a
    replica holds; at a quarter it stays under its bound of 16. The incident refused every
    request at 724 req/s, which a fresh deployment served."""
    folder, env = tiny_deployment(tmp_path)
    sh = (folder / "start.sh").read_text()
    assert "MAX_QUEUED=${MAX_QUEUED:-16}" in sh and "--disable-circuit-breaker" in sh
    lines: list[str] = []
    t0 = time.monotonic()
    try:
        with serve.running_deployment(folder, timeout_s=600, env=env, out=lines.append) as res:
            assert "start_s" in res, "\n".join(lines) + res.get("log_tail", "")
            # what `python -m tunebook.serve <folder> --check` asks, through vllm-router
            steps = serve.ask_deployment(folder, res["url"], out=lines.append)
            deploy = json.loads((folder / "deployment.json").read_text())
            cap = capacity(res["url"], "tunebook", lines.append)
            assert cap >= 2, "\n".join(lines)
            over = serve.overload_check(
                res["url"],
                deploy,
                "tunebook",
                rate=cap,
                factor=8.0,
                after_rate=cap / 4,
                burst_s=4.0,
                settle_s=5.0,
                window_s=12.0,
                workload=WORKLOAD,
                slo=SLO,
                # A 503 passes through the replica's API server, which on two shared cores
                # waits for one now and then: 7 ms median but 1.8 s at most in a CI run
                # (2026-12-07). The test bounds the typical refusal, not the machine's worst.
                refusal_limit_s=5.0,
                out=lines.append,
            )
    finally:
        lines.append(f"test: {time.monotonic() - t0:.0f} s")
        print("\n".join(lines))
    said = "\n".join(lines)
    assert [x["name"] for x in steps if x["ok"]] == [
        "GET /v1/models",
        "POST /v1/completions",
        "POST /v1/completions (stream)",
        "POST /v1/chat/completions",
    ], said
    burst, after = over["burst"], over["after"]
    # the excess was refused, with a status that says to try again, and at once
    assert burst["refused"] > 0 and burst["failed"] == 0, said
    assert burst["probes_refused"] > 0, said
    assert burst["refusal_ms_p50"] < 1000 and burst["refusal_ms_max"] < 5000, said
    # after it: served as before, without a restart
    assert after["requests"] >= 6 and after["refused"] == 0 and after["failed"] == 0, said
    assert after["slo_holds"], said
    assert over["ok"], said
    assert wait_gone() == []


def test_the_bench_client_takes_a_fixed_workload_and_a_known_name():
    """vllm bench serve sends fixed lengths from a tokenizer: anything else is said before any
    request is sent (no server here: the errors come first)."""
    deploy = {"capacity_rps": 4.0}
    with pytest.raises(ValueError, match="one of tunebook, vllm-bench"):
        serve.overload_check("http://127.0.0.1:9", deploy, "m", client="wrk", out=lambda s: None)
    with pytest.raises(ValueError, match="tokenizer folder"):
        serve.overload_check(
            "http://127.0.0.1:9", deploy, "m", client="vllm-bench", out=lambda s: None
        )
    lognormal = {"kind": "lognormal", "median_prompt_len": 32, "median_output_len": 8}
    with pytest.raises(ValueError, match="fixed lengths"):
        serve.overload_check(
            "http://127.0.0.1:9",
            deploy,
            "m",
            client="vllm-bench",
            tokenizer="models/tiny-ernie",
            workload=lognormal,
            out=lambda s: None,
        )


@pytest.mark.engine
@pytest.mark.extended
def test_vllms_own_client_drives_the_overload_check_and_its_json_is_kept(tmp_path):
    """The check with ``--client vllm-bench``: the burst and the rate after it sent by vLLM's
    ``vllm bench serve`` workers released together, the steady rate's workers ``burst_s`` later.
    Every request is tagged with its phase on one clock, nothing fails that is not a refusal, a
    refusal carries its status, and bench's result JSONs are kept where asked."""
    folder, env = tiny_deployment(tmp_path)
    lines: list[str] = []
    try:
        with serve.running_deployment(folder, timeout_s=600, env=env, out=lines.append) as res:
            assert "start_s" in res, "\n".join(lines) + res.get("log_tail", "")
            deploy = json.loads((folder / "deployment.json").read_text())
            over = serve.overload_check(
                res["url"],
                deploy,
                "tunebook",
                rate=4.0,
                factor=8.0,
                burst_s=3.0,
                settle_s=3.0,
                window_s=6.0,
                workload=WORKLOAD,
                slo=SLO,
                refusal_limit_s=30.0,
                client="vllm-bench",
                tokenizer=str(serve._model_folder(deploy, folder)),
                result_dir=tmp_path / "bench",
                out=lines.append,
            )
    finally:
        print("\n".join(lines))
    b, settle, after = over["burst"], over["settle"], over["after"]
    said = "\n".join([*lines, f"burst errors: {b.get('errors')}"])
    assert any("of vllm bench serve" in x for x in lines), said
    assert b["requests"] == 96 and settle["requests"] + after["requests"] == 36, said
    # A burst request now and then fails other than by refusal, with no status (seen: 1-2 of
    # 96; bench's words: "Never received a valid chunk to calculate TTFT", a stream that ended
    # before its first token); the check says so with the error's words, and after the burst
    # none does.
    assert b["failed"] <= 0.05 * b["requests"] and (not b["failed"] or b.get("errors")), said
    assert settle["failed"] == after["failed"] == 0, said
    assert set(b["statuses"]) <= {"200", "429", "503", "None"}, said
    assert over["client"]["client"].startswith("vllm bench serve"), said
    # the steady rate starts when the burst ends, not once its workers have drawn their prompts
    assert 2.5 < over["after_start_s"] < 4.5, said
    kept = sorted(p.name for p in (tmp_path / "bench").glob("bench-*-w*.json.gz"))
    assert kept and all(
        p.startswith(("bench-overload-burst", "bench-overload-after")) for p in kept
    )
    assert wait_gone() == []
