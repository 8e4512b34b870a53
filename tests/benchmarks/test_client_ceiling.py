"""The client-ceiling benchmark runs end to end at one low rate: its JSON has every row key, the
client completed requests, and no stub server outlives it. No assertion on speed: that depends on
the machine, and the benchmark exists to measure it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TEST_TAG_ENV

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_client_ceiling_benchmark_runs_at_one_low_rate(tmp_path):
    import psutil

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from client_ceiling import ROW_KEYS
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    out = tmp_path / "cc.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "lib")}
    p = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/client_ceiling.py"), "--rates", "16",
         "--workers", "1", "--duration-s", "1.5", "--stub-procs", "1", "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["benchmark"] == "client_ceiling" and res["lag_ok_ms"] > 0
    assert res["config"]["rates"] == [16.0] and res["config"]["workers"] == [1]
    assert res["machine"]["cpu_count"] >= 1
    (row,) = res["rows"]
    assert set(ROW_KEYS) <= set(row)
    assert row["workers"] == 1 and row["offered_rps"] == 16.0 and row["requests"] >= 1
    assert row["achieved_rps"] > 0 and row["output_tok_s"] > 0 and row["errors"] == 0
    assert isinstance(row["kept_schedule"], bool)
    assert "achieved" in p.stdout  # the table was printed
    tag = os.environ[TEST_TAG_ENV]
    left = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "--stub-server" in (proc.info["cmdline"] or []):
                if proc.environ().get(TEST_TAG_ENV) == tag:
                    left.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    assert left == []
