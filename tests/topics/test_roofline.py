"""Decode roofline arithmetic, the profiler-trace reader, and the roofline benchmark on a real
CPU engine (its trace must carry vLLM's step annotations)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tunebook.core.model import load_shape
from tunebook.topics.roofline import (
    decode_floor_ms,
    decode_runs,
    decode_step_bytes,
    decode_step_flops,
    load_trace,
    prefill_runs,
    step_phases,
)

ROOT = Path(__file__).resolve().parents[2]
ERNIE = load_shape("ernie-4.5-0.3b-pt")


def test_decode_floor_by_hand():
    s = ERNIE
    h, L, H, d, V = (
        s.hidden_size,
        s.num_hidden_layers,
        s.num_attention_heads,
        s.head_dim,
        s.vocab_size,
    )
    non_emb = s.param_count - V * h * (1 if s.tie_word_embeddings else 2)
    flops = 64 * (2 * non_emb + 4 * L * H * d * 1000 + 2 * V * h)
    assert decode_step_flops(s, 64, 1000) == pytest.approx(flops, rel=1e-12)
    kv = 2 * L * s.num_key_value_heads * d * 2  # bf16
    assert kv == 18_432
    assert decode_step_bytes(s, 64, 1000) == s.param_count * 2 + 64 * 1001 * kv
    f = decode_floor_ms(s, 64, 1000, peak_tflops=989.0, hbm_tb_s=4.8)
    assert f["memory_ms"] == pytest.approx(1e3 * (s.param_count * 2 + 64 * 1001 * kv) / 4.8e12)
    assert f["bound"] == "memory" and f["floor_ms"] == f["memory_ms"]
    # fp8 KV halves the KV bytes, not the weights
    f8 = decode_floor_ms(s, 64, 1000, 989.0, 4.8, kv_cache_dtype="fp8")
    assert f["memory_ms"] - f8["memory_ms"] == pytest.approx(1e3 * 64 * 1001 * kv / 2 / 4.8e12)


def test_decode_floor_rejects_bad_input():
    for kw in ({"batch": 0}, {"context": -1}, {"peak_tflops": 0}, {"hbm_tb_s": -4.8}):
        args = {"batch": 8, "context": 100, "peak_tflops": 989.0, "hbm_tb_s": 4.8, **kw}
        with pytest.raises(ValueError, match="need batch"):
            decode_floor_ms(ERNIE, **args)


def _step(ts, name, dur=1.0):
    return {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur}


def _kernel(ts, dur):
    return {"ph": "X", "cat": "kernel", "name": "k", "ts": ts, "dur": dur}


def test_step_phases_from_a_synthetic_trace(tmp_path):
    dec = "execute_context_0(0)_generation_4(4)"
    pre = "execute_context_1(512)_generation_0(0)"
    events = [_step(0, pre), _kernel(100, 300)]
    # three decode steps every 1000 us; kernels 1+2 overlap (union 500 us), then 200 and 200
    events += [_step(1000, dec), _step(2000, dec), _step(3000, dec)]
    events += [_kernel(1100, 400), _kernel(1300, 300), _kernel(2100, 200), _kernel(3100, 200)]
    events += [_step(4000, pre), _kernel(4100, 900)]
    events += [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1200, "dur": 50}]
    path = tmp_path / "t.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    runs = step_phases(load_trace(path))
    assert [r["steps"] for r in runs] == [1, 3, 1]
    d = decode_runs(runs, 4, min_steps=3)[0]
    assert d["step_period_ms"] == pytest.approx(1.0)
    assert d["gpu_busy_ms"] == pytest.approx((500 + 200 + 200) / 3 / 1e3)
    assert d["gpu_busy_share"] == pytest.approx(0.3)
    assert decode_runs(runs, 4, min_steps=4) == []
    last = prefill_runs(runs, 512)[-1]
    assert last["gpu_busy_ms"] == pytest.approx(0.9)  # the last run reaches to the last kernel


def test_step_phases_without_gpu_kernels():
    runs = step_phases([_step(0, "execute_context_0(0)_generation_1(1)")])
    assert runs[0]["gpu_busy_ms"] is None and runs[0]["gpu_busy_share"] is None


@pytest.mark.engine
def test_roofline_benchmark_on_a_cpu_engine(tmp_path):
    """The benchmark drives a real engine, and vLLM's profiler trace carries step annotations."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "lib")}
    out = tmp_path / "rl"
    p = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/roofline.py"), "--profile", "cpu",
         "--repeats", "1", "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads((out / "roofline.json").read_text())
    assert {(r["phase"], r["batch"], r["prompt_len"]) for r in res["rows"]} == {
        ("decode", 1, 64), ("decode", 8, 64), ("prefill", 1, 128), ("prefill", 1, 512)
    }  # fmt: skip
    assert all(r["step_ms"] > 0 for r in res["rows"])
    assert res["env"]["attention_backend"] == "CPU_ATTN"
    assert (out / "roofline.csv").read_text().startswith("phase,batch,prompt_len")
    assert "non-default args" in (out / "engine.log").read_text()  # vLLM's log went to the file
    runs = res["profiled_step_runs"]
    assert decode_runs(runs, 1, min_steps=5), runs  # pure decode steps of batch 1 were traced
    assert prefill_runs(runs, 512), runs
    assert all(r["gpu_busy_ms"] is None for r in runs)  # no GPU here: no kernel time invented


def test_step_phases_take_the_gpu_side_span_of_a_lone_step():
    """The GPU runs a prefill past the host's next step: its kernels still count for it."""
    pre = "execute_context_1(8000)_generation_0(0)"
    idle = "execute_context_0(0)_generation_0(0)"
    events = [_step(0, pre, dur=50), _step(100, idle, dur=5)]
    events += [{"ph": "X", "cat": "gpu_user_annotation", "name": pre, "ts": 40, "dur": 400}]
    events += [_kernel(40, 200), _kernel(250, 190)]  # runs to 440, past the host's step at 100
    runs = step_phases(events)
    assert prefill_runs(runs, 8000)[0]["gpu_busy_ms"] == pytest.approx(0.39)
    # without the GPU-side span, the host window [0, 100) sees only 60 us of it
    plain = [e for e in events if e["cat"] != "gpu_user_annotation"]
    assert prefill_runs(step_phases(plain), 8000)[0]["gpu_busy_ms"] == pytest.approx(0.06)


def test_the_floor_takes_the_detected_cards_datasheet_not_another_cards():
    from tunebook.engine import host
    from tunebook.topics.roofline import card_figures

    h100 = card_figures(device="NVIDIA H100 80GB HBM3")
    assert h100[:2] == (989.0, 3.35) and "H100" in h100[2]  # not the H200's 4.8 TB/s
    assert card_figures(device="NVIDIA H200")[:2] == (989.0, 4.8)
    assert card_figures(device="NVIDIA H100 PCIe")[:2] == (756.0, 2.0)
    assert card_figures(500.0, 1.0, device="NVIDIA H200")[:2] == (500.0, 1.0)  # given wins
    none = card_figures(device="")
    assert none[:2] == (None, None) and "no GPU" in none[2]
    assert host.card_specs("Some Future GPU") is None
