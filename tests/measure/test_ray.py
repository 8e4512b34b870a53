"""The Ray executor: the same sweep through Ray and locally, failures isolated, nothing left behind.

A private local cluster with 2 worker CPUs and the tiny model.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from tunebook.core.errors import ConfigError  # noqa: E402
from tunebook.measure import ray_executor  # noqa: E402
from tunebook.measure.sweep import make_points, run_sweep  # noqa: E402

MARK = "TUNEBOOK_TEST_RAY_MARK"

BASE = {
    "model": "tiny-ernie",
    "settings": {
        "enforce_eager": True,
        "kv_cache_memory_bytes": 67108864,
        "max_model_len": 1024,
    },
    "env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
    "workload": {"kind": "fixed", "num_requests": 4, "prompt_len": 32, "output_len": 8},
    "warmup_requests": 1,
}
OK = {"bs32": {"settings": {"block_size": 32}}, "bs64": {"settings": {"block_size": 64}}}
# 64 KiB of KV holds 128 tokens of the tiny model: less than one max_model_len sequence.
BAD = {"tinykv": {"settings": {"block_size": 32, "kv_cache_memory_bytes": 65536}}}


def _points() -> list[dict]:
    # The failing point first: the worker it ran on then runs an ok point (no poisoned worker).
    return make_points(BASE, {**BAD, **OK}, repeats=1)


def _marked(mark: str) -> list[tuple[int, str]]:
    """Live processes (not zombies) other than this one whose environment carries the mark."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for d in Path("/proc").glob("[0-9]*"):
        if int(d.name) == os.getpid():
            continue
        try:
            if (d / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            if needle in (d / "environ").read_bytes().split(b"\0"):
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append((int(d.name), cmd))
        except (OSError, IndexError):
            continue
    return found


def _is_engine(pid: int, cmd: str) -> bool:
    """An isolated point's process: started as `-m tunebook.measure.execute`, or forked by a launcher."""
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        name = ""
    return "tunebook.measure.execute" in cmd or name == "tunebook-engine"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A local Ray cluster of 2 CPUs; afterwards, no process of it (or started by it) may remain."""
    if ray.is_initialized():
        pytest.skip("Ray already initialized in this process")
    mark = uuid.uuid4().hex
    saved = {k: os.environ.get(k) for k in (MARK, "RAY_AUTH_MODE")}
    os.environ[MARK] = mark  # inherited by gcs_server, raylet, workers and engine children
    os.environ["RAY_AUTH_MODE"] = "disabled"
    temp_dir = str(tmp_path_factory.mktemp("ray"))
    try:
        # ray.init(num_cpus=2, _temp_dir=..., include_dashboard=False), retried on a busy machine
        ray_executor.start_local_ray(num_cpus=2, _temp_dir=temp_dir, include_dashboard=False)
        yield temp_dir
    finally:
        ray.shutdown()
        deadline = time.monotonic() + 30
        while _marked(mark) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = _marked(mark)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        assert not left, f"processes left after ray.shutdown(): {left}"


def _by_id(folder: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in folder.glob("*.json")}


@pytest.mark.engine
@pytest.mark.extended  # Ray is opt-in (TUNEBOOK_EXECUTOR=ray)
def test_ray_sweep_matches_local_and_isolates_a_failure(cluster, tmp_path, monkeypatch):
    pts = _points()
    t0 = time.monotonic()
    df = run_sweep(
        pts, tmp_path / "ray", isolate=False, executor="ray", progress=False, timeout_s=600
    )
    ray_s = time.monotonic() - t0
    assert sorted(df["point_id"]) == sorted(p["point_id"] for p in pts)
    status = dict(zip(df["point_id"], df["status"], strict=True))
    assert status == {
        **{p["point_id"]: "ok" for p in pts if p["config"] != "tinykv"},
        "tinykv-r0": "failed",
    }
    ray_res = _by_id(tmp_path / "ray")
    assert "KV cache" in ray_res["tinykv-r0"]["error"]
    for r in ray_res.values():
        pl = r["env"]["placement"]
        assert pl["executor"] == "ray" and pl["ray_node_id"] and pl["hostname"]
        assert pl["worker_pid"] != os.getpid()
        assert pl["ray_gpu_ids"] == [] and "cuda_visible_devices" in pl
    assert (tmp_path / "ray" / "summary.csv").is_file()

    # The same sweep locally (in-process, as the cpu profile runs it): the same KV capacity.
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # restored after the test
    t0 = time.monotonic()
    df_local = run_sweep(pts, tmp_path / "local", isolate=False, progress=False)
    local_s = time.monotonic() - t0
    local_res = _by_id(tmp_path / "local")
    assert dict(zip(df_local["point_id"], df_local["status"], strict=True)) == status
    for pid, r in local_res.items():
        if r["status"] == "ok":
            assert (
                r["capacity"]["kv_capacity_tokens"]
                == ray_res[pid]["capacity"]["kv_capacity_tokens"]
            )
            assert r["capacity"]["num_gpu_blocks"] == ray_res[pid]["capacity"]["num_gpu_blocks"]
            assert r["capacity"]["block_size"] == ray_res[pid]["capacity"]["block_size"]
            assert r["metrics"]["output_tokens"] == ray_res[pid]["metrics"]["output_tokens"]
    assert "KV cache" in local_res["tinykv-r0"]["error"]
    print(f"ray {ray_s:.1f} s, local {local_s:.1f} s for {len(pts)} points")

    # Resume: a rerun skips every finished point and submits nothing.
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "ray").glob("*.json")}
    df2 = run_sweep(
        pts, tmp_path / "ray", isolate=False, executor="ray", progress=False, retry_failed=False
    )
    assert len(df2) == len(pts)
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "ray").glob("*.json")} == before


@pytest.mark.engine
@pytest.mark.extended  # Ray is opt-in (TUNEBOOK_EXECUTOR=ray)
def test_ray_isolated_points_ship_their_logs_and_leave_no_engine(cluster, tmp_path):
    pts = make_points(BASE, {"bs32": OK["bs32"], **BAD}, repeats=1)
    df = run_sweep(
        pts, tmp_path / "iso", isolate=True, executor="ray", progress=False, timeout_s=600
    )
    assert dict(zip(df["point_id"], df["status"], strict=True)) == {
        "bs32-r0": "ok",
        "tinykv-r0": "failed",
    }
    res = _by_id(tmp_path / "iso")
    assert res["bs32-r0"]["capacity"]["kv_capacity_tokens"] > 0
    assert "KV cache" in res["tinykv-r0"]["error"]
    for r in res.values():
        log = Path(r["log_file"])
        assert log.parent == tmp_path / "iso" / "logs" and log.stat().st_size > 0
    engines = [c for pid, c in _marked(os.environ[MARK]) if _is_engine(pid, c)]
    assert not engines, f"engine processes left: {engines}"


def test_repeats_spread_over_gpus():
    """Two GPUs, configs A and B, equal run times: plain FIFO would pin A to GPU 0 and B to GPU 1;
    each config's repeats are spread evenly over both instead."""
    from tunebook.core.points import Point

    pts = [
        Point.from_dict(p)
        for p in make_points({"model": "m", "workload": {"kind": "fixed"}}, {"A": {}, "B": {}}, 4)
    ]
    pending, ran, placed = list(pts), {}, []
    slots = [("n", ("0",)), ("n", ("1",))]
    first = [pending.pop(0), pending.pop(0)]  # A-r0 on GPU 0, B-r0 on GPU 1
    running = dict(zip(slots, first, strict=True))
    while running:
        slot = min(running, key=lambda s: running[s].point_id)  # equal times: FIFO finish
        p = running.pop(slot)
        placed.append((p.point_id, slot[1][0]))
        ran.setdefault(slot, Counter())[p.config] += 1
        if pending:
            running[slot] = ray_executor._pick(pending, slot, ran, lookahead=2)
    per_gpu = Counter((pid[0], g) for pid, g in placed)
    assert per_gpu == {(c, g): 2 for c in "AB" for g in "01"}, placed


def test_workbook_executor_from_env(monkeypatch, tmp_path):
    from tunebook.workbench.workbook import Workbook

    monkeypatch.setenv("TUNEBOOK_EXECUTOR", "ray")
    assert Workbook(str(tmp_path), "nb", "tiny-ernie").executor == "ray"
    monkeypatch.delenv("TUNEBOOK_EXECUTOR")
    assert Workbook(str(tmp_path), "nb", "tiny-ernie").executor == "local"


def test_missing_ray_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(ConfigError, match=r"pip install -e \.\[ray\]"):
        ray_executor.run_points_ray([{"point_id": "x"}], lambda r: None)
