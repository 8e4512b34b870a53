"""The capacity model on synthetic calibration: a host-bound engine (an 8 ms step, +0.01 ms a
sequence) whose GPU work (0.5 ms + 0.002 ms a sequence) binds only when many replicas share it,
and one API-server process that pays 0.5 ms a request and 0.1 ms a streamed chunk. Each test
changes one knob and checks the resource that binds moves as the arithmetic says."""

from __future__ import annotations

import math

import pytest

from tunebook.core.capacity_model import (
    GIB,
    Calibration,
    Candidate,
    Traffic,
    enumerate_candidates,
    fits,
    predict,
)
from tunebook.core.errors import ConfigError

BATCHES = (1, 64, 256, 512, 1024)


def host(b: float) -> float:
    return 8.0 + 0.01 * b


def gpu(b: float) -> float:
    return 0.5 + 0.002 * b


def calibration(**over) -> Calibration:
    """N engines sharing the GPU each step in max(host, N x gpu): the GPU runs one step at a time."""
    kw = {
        "step_ms": {n: {b: max(host(b), n * gpu(b)) for b in BATCHES} for n in (1, 2, 4, 8)},
        "prefill_ms": {128: 2.0, 512: 5.0, 2048: 20.0},
        "api_request_ms": 0.5,
        "api_chunk_ms": 0.1,
        "host_cores": 64,
        "kv_capacity_tokens": int(70 * GIB / 18432),
        "kv_bytes_per_token": 18432,
        "card_memory_bytes": 80 * GIB,
        "max_model_len": 4096,
        "replica_memory_bytes": 2 * GIB,
        "default_max_num_seqs": 1024,
        "capture_size": 2048,  # every calibrated step ran in a CUDA graph
    }
    return Calibration(**{**kw, **over})


def traffic(**over) -> Traffic:
    return Traffic(
        **{"prompt_len": 256, "output_len": 128, "ttft_ms": 500.0, "tpot_ms": 30.0, **over}
    )


# --------------------------------------------------------------------------- the resource that binds
def test_one_api_server_binds_vllms_default_and_stream_interval_lifts_it():
    cal, t = calibration(), traffic()
    default = predict(Candidate(), cal, t)
    # 128 chunks a request: 0.5 + 128 x 0.1 = 13.3 ms of one process, run at most 90% busy
    assert default.binding == "api_server"
    assert default.capacity_rps == pytest.approx(0.9 * 1000 / 13.3)
    by_k = {k: predict(Candidate(stream_interval=k), cal, t) for k in (1, 2, 4, 16)}
    api = [by_k[k].ceilings["api_server"] for k in (1, 2, 4, 16)]
    assert api == sorted(api) and len(set(api)) == 4  # fewer chunks, more requests a process
    assert by_k[2].binding == "api_server" and by_k[2].capacity_rps > default.capacity_rps
    # 16 tokens a chunk: 9 chunks, 1.4 ms a request; the engine's loop binds now
    assert by_k[16].binding == "engine_core_loop"
    assert by_k[16].capacity_rps > 2 * default.capacity_rps
    assert by_k[16].capacity_rps == by_k[4].capacity_rps  # past the API server, k changes nothing


def test_api_server_count_multiplies_the_api_servers_ceiling():
    cal, t = calibration(), traffic()
    one = predict(Candidate(), cal, t)
    two = predict(Candidate(api_server_count=2), cal, t)
    assert two.ceilings["api_server"] == pytest.approx(2 * one.ceilings["api_server"])
    assert two.binding == "api_server" and two.capacity_rps == pytest.approx(2 * one.capacity_rps)


def test_replicas_raise_an_engine_loop_bound_capacity_until_the_gpu_binds():
    cal, t = calibration(), traffic()
    caps = {r: predict(Candidate(replicas=r, stream_interval=16), cal, t) for r in range(1, 13)}
    loop = [r for r, p in caps.items() if p.binding == "engine_core_loop"]
    on_gpu = [r for r, p in caps.items() if p.binding == "gpu"]
    assert loop == list(range(1, 8)) and on_gpu == list(range(8, 13))
    for r in loop:  # each replica its own host loop: capacity in proportion
        assert caps[r].capacity_rps == pytest.approx(r * caps[1].capacity_rps)
    # the shared GPU: less than proportional at first, then fewer requests a replica serve less
    assert caps[7].capacity_rps < caps[8].capacity_rps < 8 / 7 * caps[7].capacity_rps
    assert caps[12].capacity_rps < caps[8].capacity_rps
    assert caps[12].batch < caps[8].batch  # the GPU's term sets TPOT at a smaller batch


def test_without_an_engines_sharing_calibration_the_gpu_never_binds():
    cal = calibration(step_ms={1: {b: host(b) for b in BATCHES}})
    p = predict(Candidate(replicas=12, stream_interval=16), cal, traffic())
    assert p.binding == "engine_core_loop"
    assert p.capacity_rps == pytest.approx(
        12 * predict(Candidate(stream_interval=16), cal, traffic()).capacity_rps
    )


def test_a_small_kv_cache_binds():
    # 65,536 tokens hold 204 requests of 256 + 64 tokens (mean length)
    small = Candidate(stream_interval=16, kv_cache_memory_bytes=65536 * 18432)
    p = predict(small, calibration(), traffic())
    assert p.binding == "kv" and p.batch_limit == "kv"
    assert p.batch_peak <= 65536 / 320
    assert (
        p.capacity_rps
        < predict(Candidate(stream_interval=16), calibration(), traffic()).capacity_rps
    )


def test_the_api_servers_share_the_cores_the_engine_loops_leave():
    cal = calibration(host_cores=4)
    p = predict(Candidate(replicas=2, api_server_count=4), cal, traffic())
    # 8 API-server processes on the 2 cores left: the cores bind, not the processes
    assert p.binding == "host_cores"
    assert p.capacity_rps == pytest.approx(2 * 0.9 * 1000 / 13.3)
    assert p.ceilings["api_server"] == pytest.approx(4 * p.capacity_rps)


def test_a_load_aware_router_lets_replicas_run_fuller():
    cal, t = calibration(), traffic()
    rr = predict(Candidate(replicas=4, stream_interval=16), cal, t)
    p2 = predict(Candidate(replicas=4, stream_interval=16, router_policy="power_of_two"), cal, t)
    assert p2.capacity_rps > rr.capacity_rps
    # the p99 request's excess over the mean is shared by 4 replicas: sqrt(4) = 2 x smaller
    assert (p2.batch_peak - p2.batch) == pytest.approx((rr.batch_peak - rr.batch) / 2, rel=0.1)
    # one replica has no router: the policy is no knob there
    assert Candidate(router_policy="power_of_two") == Candidate()


def test_a_larger_cuda_graph_capture_helps_only_past_the_default_size():
    cal, t = calibration(eager_factor=1.5), traffic()
    default = predict(Candidate(stream_interval=16), cal, t)
    big = predict(Candidate(stream_interval=16, max_cudagraph_capture_size=1024), cal, t)
    assert (
        default.batch_peak <= 512 < big.batch_peak
    )  # vLLM's 512 stops the batch at the graphs' edge
    assert big.capacity_rps > default.capacity_rps
    # where the batch stays under 512 anyway (a tight TPOT), the capture size changes nothing
    tight = traffic(tpot_ms=15.0)
    assert predict(Candidate(stream_interval=16), cal, tight).capacity_rps == pytest.approx(
        predict(
            Candidate(stream_interval=16, max_cudagraph_capture_size=1024), cal, tight
        ).capacity_rps
    )


def test_the_chunk_gap_bound_charges_a_large_stream_interval():
    cal = calibration()
    free = predict(Candidate(stream_interval=16), cal, traffic())
    bound = predict(Candidate(stream_interval=16), cal, traffic(chunk_gap_ms=200.0))
    assert bound.batch_limit == "chunk_gap" and bound.chunk_gap_p99_ms <= 200.0
    assert bound.capacity_rps < free.capacity_rps
    # k = 4 chunks fit the same bound at the TPOT's own batch
    assert (
        predict(Candidate(stream_interval=4), cal, traffic(chunk_gap_ms=200.0)).batch_limit
        == "tpot"
    )


def test_latencies_meet_the_slo_at_the_predicted_capacity_and_littles_law_holds():
    # a flat 10 ms step and no prefill: TPOT is 10 ms at any batch, so batch = rate x O x 10 ms
    flat = {1: {1: 10.0, 1024: 10.0}}
    cal = calibration(step_ms=flat, prefill_ms={256: 0.0})
    p = predict(Candidate(), cal, traffic())
    assert p.binding == "api_server"
    assert p.batch == pytest.approx(p.capacity_rps * 128 * 10.0 / 1000, rel=1e-6)
    t = traffic()
    for q in (predict(Candidate(stream_interval=k), calibration(), t) for k in (1, 16)):
        assert q.ttft_p99_ms <= t.ttft_ms and q.tpot_p99_ms <= t.tpot_ms


def test_an_slo_no_batch_meets_predicts_no_capacity():
    p = predict(Candidate(), calibration(), traffic(ttft_ms=5.0))
    assert p.capacity_rps == 0.0 and p.batch_limit == "ttft"


def test_longer_prompts_serve_fewer_requests():
    caps = [
        predict(Candidate(stream_interval=16), calibration(), traffic(prompt_len=n)).capacity_rps
        for n in (128, 512, 2048)
    ]
    assert caps[0] > caps[1] > caps[2]


# --------------------------------------------------------------------------- what fits
def test_a_candidate_beyond_the_cards_memory_does_not_fit():
    cal = calibration()
    why = fits(Candidate(replicas=2, kv_cache_memory_bytes=40 * GIB), cal)
    assert why and "84.0 GiB" in why and "80.0 GiB" in why
    assert fits(Candidate(replicas=2, kv_cache_memory_bytes=30 * GIB), cal) is None
    with pytest.raises(ConfigError, match="does not fit"):
        predict(Candidate(replicas=2, kv_cache_memory_bytes=40 * GIB), cal, traffic())


def test_replicas_whose_share_of_the_card_holds_no_full_sequence_do_not_fit():
    cal = calibration()
    # 72 GiB / 36 = 2 GiB a replica, all of it the replica's own overhead: no KV left
    assert "refuses to start" in fits(Candidate(replicas=36), cal)
    assert fits(Candidate(replicas=8), cal) is None


def test_engine_loops_need_a_core_each_and_some_left_for_the_api_servers():
    cal = calibration(host_cores=8, other_cores=2.0)
    assert fits(Candidate(replicas=5), cal) is None
    assert "no core for the API servers" in fits(Candidate(replicas=6), cal)


# --------------------------------------------------------------------------- candidates
def test_enumerate_candidates_puts_the_default_first_and_each_candidate_once():
    space = {
        "replicas": [1, 2, 4],
        "stream_interval": [1, 16],
        "router_policy": ["round_robin", "power_of_two"],
    }
    cands = enumerate_candidates(space)
    # one replica: 2 stream intervals (no router to choose); 2 and 4 replicas: 2 x 2 each
    assert len(cands) == 2 + 2 * 4
    assert cands[0] == Candidate() and cands[0].name == "default"
    assert len({c.name for c in cands}) == len(cands)
    assert enumerate_candidates({"stream_interval": 16}) == [
        Candidate(),
        Candidate(stream_interval=16),
    ]
    with pytest.raises(ConfigError, match="replica_count"):
        enumerate_candidates({"replica_count": [2]})


def test_a_candidate_is_a_04_configuration_and_back():
    lever = {
        "settings": {"stream_interval": 16, "kv_cache_memory_bytes": 12884901888},
        "serve": {"replicas": 4, "router_policy": "round_robin"},
    }
    c = Candidate.from_config(lever)
    assert c.name == "replicas=4_stream_interval=16_kv_cache_memory_bytes=12884901888"
    assert c.to_config() == lever
    graphs = Candidate(max_cudagraph_capture_size=1024, api_server_count=2)
    assert graphs.to_config() == {
        "settings": {"compilation_config": {"max_cudagraph_capture_size": 1024}},
        "serve": {"api_server_count": 2},
    }
    assert Candidate.from_config(graphs.to_config()) == graphs
    assert Candidate.from_config({}) == Candidate()
    with pytest.raises(ConfigError, match="performance_mode"):
        Candidate.from_config({"settings": {"performance_mode": "throughput"}})
    with pytest.raises(ConfigError, match="replicas"):
        Candidate(replicas=0)


def test_traffic_and_calibration_read_04s_parameters_and_json():
    slo = {"ttft_ms": 500.0, "tpot_ms": 50.0, "attainment_pct": 99.0, "itl_ms": 1000.0}
    t = Traffic.from_params({"kind": "fixed", "prompt_len": 512, "output_len": 128}, slo)
    assert (t.prompt_len, t.output_len, t.chunk_gap_ms) == (512, 128, 1000.0)
    assert (
        Traffic.from_params(
            {"prompt_len": 1, "output_len": 1}, {"ttft_ms": 1, "tpot_ms": 1}
        ).chunk_gap_ms
        is None
    )
    # a result file's JSON holds the keys as strings
    cal = calibration(step_ms={"1": {"32": 8.0, "96": 9.0}}, prefill_ms={"512": 5.0})
    assert cal.host_step_ms(64) == pytest.approx(8.5) and cal.prefill(512) == 5.0
    with pytest.raises(ConfigError, match="one engine"):
        calibration(step_ms={2: {1: 8.0}})


def test_interpolation_keeps_a_steps_fixed_cost_and_extends_the_last_slope():
    cal = calibration(step_ms={1: {64: 9.0, 256: 11.0}})
    assert cal.host_step_ms(1) == 9.0  # below the smallest batch measured: not cheaper
    assert cal.host_step_ms(160) == pytest.approx(10.0)
    assert cal.host_step_ms(448) == pytest.approx(13.0)
    assert cal.gpu_step_ms(64) == 0.0
    assert math.isclose(calibration().gpu_step_ms(1024), gpu(1024))  # 8 engines: the GPU's own work


def test_the_gpus_part_of_a_step_is_measured_sharing_else_its_floor_else_nothing():
    shared = calibration()
    alone = calibration(step_ms={1: {b: host(b) for b in BATCHES}})
    floored = calibration(
        step_ms={1: {b: host(b) for b in BATCHES}}, gpu_floor_ms={1: 0.2, 1024: 1.0}
    )
    assert shared.gpu_step_ms(64) == pytest.approx(
        min(max(host(64), n * gpu(64)) / n for n in (2, 4, 8))
    )
    assert alone.gpu_step_ms(64) == 0.0
    assert floored.gpu_step_ms(1024) == pytest.approx(1.0)
    # the floor makes many replicas pay for sharing the GPU: 8 replicas predict less with it
    c = Candidate(replicas=8, stream_interval=16)
    roomy = {"host_cores": 64}
    cheap = predict(c, calibration(step_ms=alone.step_ms, **roomy), traffic()).capacity_rps
    costly = calibration(step_ms=alone.step_ms, gpu_floor_ms={1: 2.0, 1024: 20.0}, **roomy)
    assert predict(c, costly, traffic()).capacity_rps < cheap


def test_shared_kv_bytes_split_between_replicas_only():
    cal = calibration(kv_bytes_shared=8 * GIB)
    assert cal.kv_tokens(Candidate()) == cal.kv_capacity_tokens  # one replica: the engine's own
    assert cal.kv_tokens(Candidate(replicas=2)) == 4 * GIB // cal.kv_bytes_per_token
