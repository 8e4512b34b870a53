"""Decode steps against the roofline floor, and where a step's time goes (GPU work vs the rest).

Pure Python and numpy (no vllm). The prefill floor lives in ``prefill``; this module adds the
decode step and reads the engine's own profiler trace.

The arithmetic. One decode step of a batch of B sequences, each with C tokens of context, must

    read every weight once            weight_bytes
    read the KV of every sequence     B * C * kv_bytes_per_token
    compute                           B * (2 N + 4 L H d C + 2 V h)  FLOPs

(N: parameters without the embedding table, L layers, H query heads of size d, all read from
the model's config; the attention term is QK^T and PV over C keys, the last the logits; an untied
embedding table is not read whole, only its B rows). The floor is the larger of bytes /
bandwidth and FLOPs / peak. For ERNIE-4.5-0.3B the weights alone are ~0.72 GB: 0.15 ms per step on
an H200 at 4.8 TB/s, at any batch up to a few hundred sequences of short context.

Where the rest goes. vLLM's torch profiler (``profiler_config={"profiler": "torch", ...}``)
annotates every engine step with its batch (``execute_context_<n>(<tokens>)_generation_<n>(<tokens>)``)
and records every GPU kernel. Over a run of like steps, the kernels' busy time (overlaps merged)
per step is the GPU's work; the step period minus that is time the GPU waited on the host
(scheduling, input preparation, sampling and output processing, Python).
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from tunebook.core.model import ModelShape
from tunebook.engine import host
from tunebook.topics.prefill import prefill_coefficients

STEP_RE = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def decode_step_flops(shape: ModelShape, batch: int, context: float) -> float:
    c = prefill_coefficients(shape)
    attn = 4.0 * shape.num_hidden_layers * shape.num_attention_heads * shape.head_dim * context
    return batch * (c["linear_flops"] + attn + c["const_flops"])


def decode_step_bytes(
    shape: ModelShape, batch: int, context: float, kv_cache_dtype="auto"
) -> float:
    kv = shape.kv_bytes_per_token(kv_cache_dtype)
    # every weight a step uses (an untied embedding table only as the batch's rows), then KV:
    # read C, write 1
    return float(shape.weight_bytes_read()) + batch * (context + 1) * kv


def decode_floor_ms(
    shape: ModelShape,
    batch: int,
    context: float,
    peak_tflops: float,
    hbm_tb_s: float,
    kv_cache_dtype: str = "auto",
) -> dict:
    """Floor of one decode step (ms), with which bound sets it."""
    if batch < 1 or context < 0 or peak_tflops <= 0 or hbm_tb_s <= 0:
        raise ValueError(
            f"need batch >= 1, context >= 0 and positive peaks, got batch={batch}, "
            f"context={context}, peak_tflops={peak_tflops}, hbm_tb_s={hbm_tb_s}"
        )
    compute_ms = 1e3 * decode_step_flops(shape, batch, context) / (peak_tflops * 1e12)
    memory_ms = 1e3 * decode_step_bytes(shape, batch, context, kv_cache_dtype) / (hbm_tb_s * 1e12)
    return {
        "floor_ms": max(compute_ms, memory_ms),
        "compute_ms": compute_ms,
        "memory_ms": memory_ms,
        "bound": "memory" if memory_ms >= compute_ms else "compute",
    }


# --------------------------------------------------------------------------- profiler traces


def load_trace(path: str | Path) -> list[dict]:
    """The events of a Chrome/Kineto trace (``.json`` or ``.json.gz``)."""
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def _merged_busy(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of intervals, clipped to [lo, hi]."""
    busy, end = 0.0, lo
    for a, b in sorted(intervals):
        a, b = max(a, end), min(b, hi)
        if b > a:
            busy += b - a
            end = b
    return busy


def step_phases(events: Iterable[dict]) -> list[dict]:
    """Split a trace into runs of like engine steps; per run: period, GPU busy and idle per step.

    A run is a maximal sequence of consecutive steps with the same (context requests, context
    tokens, generation requests, generation tokens) signature; its period is the time from the
    first step's start to the start of the step after the run, per step. A step's GPU work is
    the union of the kernels inside its GPU-side annotation (the profiler's
    ``gpu_user_annotation``, matched to the host's steps in order); a trace without those falls
    back to the kernels inside the run's host window, which misses the tail of a lone step the
    GPU is still running when the host moves on. Times in ms; ``gpu_busy_ms`` is None where the
    trace has no GPU kernels (a CPU engine).
    """
    events = list(events)

    def annotations(cat: str) -> list[tuple[float, float, tuple]]:
        out = []
        for e in events:
            if e.get("ph") == "X" and e.get("cat") == cat:
                m = STEP_RE.fullmatch(str(e.get("name", "")))
                if m:
                    out.append(
                        (float(e["ts"]), float(e.get("dur", 0.0)), tuple(map(int, m.groups())))
                    )
        return sorted(out)

    steps = annotations("user_annotation")
    gpu_queue: dict[tuple, list] = {}
    for g in annotations("gpu_user_annotation"):
        gpu_queue.setdefault(g[2], []).append(g)
    kernels = sorted(
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))
        for e in events
        if e.get("ph") == "X" and e.get("cat") in GPU_CATS
    )
    last = kernels[-1][1] if kernels else None
    # the GPU span of each host step: the next GPU annotation of the same signature
    spans = []
    for ts, _, sig in steps:
        q = gpu_queue.get(sig) or []
        spans.append((q[0][0], q[0][0] + q[0][1]) if q and q[0][0] + q[0][1] >= ts else None)
        if spans[-1] is not None:
            q.pop(0)
    runs: list[dict] = []
    i = 0
    while i < len(steps):
        sig = steps[i][2]
        j = i
        while j + 1 < len(steps) and steps[j + 1][2] == sig:
            j += 1
        n = j - i + 1
        lo = steps[i][0]
        hi = steps[j + 1][0] if j + 1 < len(steps) else steps[j][0] + steps[j][1]
        busy = None
        if kernels:
            matched = [sp for sp in spans[i : j + 1] if sp is not None]
            if matched:
                busy = sum(_merged_busy(kernels, a, b) for a, b in matched) / len(matched)
            else:
                end = hi if j + 1 < len(steps) else max(hi, last)
                busy = _merged_busy(kernels, lo, end) / n
        ctx_req, ctx_tok, gen_req, gen_tok = sig
        period = (hi - lo) / n / 1e3
        runs.append(
            {
                "context_requests": ctx_req,
                "context_tokens": ctx_tok,
                "generation_requests": gen_req,
                "generation_tokens": gen_tok,
                "steps": n,
                "step_period_ms": period,
                "host_ms_per_step": float(np.mean([d for _, d, _ in steps[i : j + 1]])) / 1e3,
                "gpu_busy_ms": None if busy is None else busy / 1e3,
                "gpu_busy_share": None if busy is None or period <= 0 else busy / 1e3 / period,
            }
        )
        i = j + 1
    return runs


def decode_runs(runs: list[dict], batch: int, min_steps: int = 8) -> list[dict]:
    """The pure-decode runs of a batch (no prefill in the step) with at least ``min_steps``."""
    return [
        r
        for r in runs
        if r["context_requests"] == 0
        and r["generation_requests"] == batch
        and r["steps"] >= min_steps
    ]


def prefill_runs(runs: list[dict], prompt_len: int) -> list[dict]:
    """Steps that prefilled one prompt of ``prompt_len`` tokens alone."""
    return [
        r
        for r in runs
        if r["context_requests"] == 1
        and r["context_tokens"] == prompt_len
        and r["generation_requests"] == 0
    ]


def card_figures(
    peak_tflops: float | None = None, hbm_tb_s: float | None = None, device: str | None = None
) -> tuple[float | None, float | None, str]:
    """The figures a roofline floor is drawn with: those given, else the detected card's
    datasheet figures (``engine.host.CARD_SPECS``); None on a CPU or an unknown card. With where
    they came from, in words. An H100 run drew the H200's 4.8 TB/s floor before: never again."""
    if peak_tflops is not None and hbm_tb_s is not None:
        return peak_tflops, hbm_tb_s, "given as parameters"
    name = device if device is not None else host.gpu_name()
    spec = host.card_specs(name)
    if spec is None:
        why = f"{name}: no datasheet figures known" if name else "no GPU"
        return peak_tflops, hbm_tb_s, f"{why}; no floor unless peak_tflops and hbm_tb_s are given"
    return (
        peak_tflops if peak_tflops is not None else spec["peak_tflops"],
        hbm_tb_s if hbm_tb_s is not None else spec["hbm_tb_s"],
        f"the datasheet of the detected {name}",
    )
