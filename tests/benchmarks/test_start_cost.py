"""benchmarks/start_cost.py: the start phases read from vLLM's own server log lines."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("start_cost", ROOT / "benchmarks" / "start_cost.py")
sc = importlib.util.module_from_spec(spec)
sys.modules["start_cost"] = sc
spec.loader.exec_module(sc)

COLD = """\
(APIServer pid=764) INFO 12-03 18:50:40 [api_utils.py:273] non-default args: {}
(EngineCore pid=892) INFO 12-03 18:51:16 [model_runner.py:305] Model loading took 0.7 GiB and 2.103102 seconds
(EngineCore pid=892) INFO 12-03 18:51:34 [backends.py:393] Compiling a graph for compile range (1, 8192) takes 11.18 s
(EngineCore pid=892) INFO 12-03 18:51:37 [monitor.py:53] torch.compile took 20.46 s in total
(EngineCore pid=892) INFO 12-03 18:51:44 [model_runner.py:747] Graph capturing finished in 4 secs, took 0.40 GiB
(EngineCore pid=892) INFO 12-03 18:52:00 [core.py:340] init engine (profile, create kv cache, warmup model) took 43.60 s (compilation: 20.46 s)
(APIServer pid=764) INFO 12-03 18:52:02 [api_server.py:677] Starting vLLM server on http://127.0.0.1:53901
"""
WARM = """\
(APIServer pid=1635) INFO 12-03 18:54:28 [api_utils.py:273] non-default args: {}
(EngineCore pid=1704) INFO 12-03 18:54:56 [backends.py:292] Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 1.077 s
(EngineCore pid=1704) INFO 12-03 18:54:56 [monitor.py:53] torch.compile took 3.42 s in total
(EngineCore pid=1704) INFO 12-03 18:55:05 [core.py:340] init engine (profile, create kv cache, warmup model) took 8.51 s (compilation: 3.42 s)
(APIServer pid=1635) INFO 12-03 18:55:10 [api_server.py:677] Starting vLLM server on http://127.0.0.1:48119
"""


def test_a_cold_start_log():
    out = sc.start_phases(COLD)
    assert out == {
        "model_load_s": pytest.approx(2.103102),
        "compile_s": 20.46,
        "graph_capture_s": 4.0,
        "engine_init_s": 43.6,
        "compile_cache": "compiled",
        "log_to_serving_s": 82.0,  # 18:50:40 -> 18:52:02
        "api_to_engine_s": 36.0,  # 18:50:40 -> the engine core's first line, 18:51:16
    }


def test_a_warm_start_log_loads_from_the_cache():
    out = sc.start_phases(WARM)
    assert out["compile_cache"] == "loaded"
    assert out["compile_s"] == 3.42 and out["engine_init_s"] == 8.51
    assert "graph_capture_s" not in out  # not logged: left out, not zero
    assert out["log_to_serving_s"] == 42.0
    assert "forced_spawn" not in out


def test_a_fork_that_vllm_overrode_is_flagged():
    line = (
        "(APIServer pid=9) WARNING 12-05 06:00:00 [system_utils.py:1] We must use the `spawn`"
        " multiprocessing start method. Overriding VLLM_WORKER_MULTIPROC_METHOD to 'spawn'.\n"
    )
    assert sc.start_phases(line + WARM)["forced_spawn"] is True


def test_arm_orders():
    assert sc.arm_order("cache", 4) == ["cold", "warm", "cold", "warm"]
    # mp: a filling start (not counted), then ABBA so a drift over the run hits both arms alike
    assert sc.arm_order("mp", 4) == ["fill", "spawn", "fork", "fork", "spawn"]
    # the API servers forked: each engine-core method has its own launcher, filled apart
    assert sc.arm_order("mp", 4, "fork") == ["fill", "fill-fork", "spawn", "fork", "fork", "spawn"]
    # launcher: the filling start is forked, so the launcher's one import is not in an arm
    assert sc.arm_order("launcher", 4) == ["fill-forked", "spawned", "forked", "forked", "spawned"]
    assert {sc.SERVER_START[a] for a in sc.arm_order("launcher", 4)} == {"fork", "spawn"}


def test_logs_of_a_run_folder_in_start_order_with_the_points_start_seconds(tmp_path):
    sweep = tmp_path / "00_baseline" / "served"
    for name, text, start_s in (("b-r0", WARM, 50.0), ("a-r0", COLD, 101.0)):
        (sweep / "logs" / name).mkdir(parents=True)
        (sweep / "logs" / name / "replica0.log.gz").write_bytes(gzip.compress(text.encode()))
        (sweep / f"{name}.json").write_text(json.dumps({"seconds": {"engine_start": start_s}}))
    rows = sc.from_logs(tmp_path)
    assert [r["compile_cache"] for r in rows] == ["compiled", "loaded"]  # by first log line
    assert [r["start_s"] for r in rows] == [101.0, 50.0]
    summary = sc.summarise(rows)
    assert summary["compiled"]["starts"] == 1
    assert summary["loaded"]["engine_init_s"] == [8.51, 8.51, 8.51]
    assert "a-r0" in sc.table(rows)


def test_the_model_inspection_of_a_fresh_node_is_read_from_the_first_server_log():
    """runs/h100-20261206c: the node's first server waited 20 s for vLLM to inspect the model
    class (uncached); every later one resolved it in the second it started."""
    rows = sc.from_logs(ROOT / "runs" / "h100-20261206c" / "00_baseline")
    assert rows[0]["log"].startswith("baseline_served/logs/default--chat-r0/")
    assert rows[0]["resolve_s"] == 20.0
    assert all(r["resolve_s"] == 0.0 for r in rows[1:]), [r["resolve_s"] for r in rows]
