"""Decode steps and prefills against the roofline floor, and where the rest of the time goes.

Method, in one engine (vLLM's defaults for the profile's model):
1. Decode: for each batch size B, B requests of ``prompt_len`` tokens start together and decode
   ``output_len`` tokens each (greedy, ignore_eos). All of them decode in the same steps, so a
   request's TPOT is the step time at batch B. Repeated (fresh prompts each time, so no prefix
   hits); the median over requests, then median and spread over repeats.
2. Prefill: one prompt of S tokens alone, one output token: its TTFT (engine-side, from
   scheduling to first token) against the prefill floor. Repeated with fresh prompts.
3. One pass under vLLM's torch profiler (after the timed runs, which it would slow): the same
   decode batches (shorter) and prefills; the trace's step annotations and GPU kernels give the
   GPU's busy time per step, the rest of the step being host time the GPU waited for.

    python benchmarks/roofline.py --profile cpu --out runs/bench/roofline
    python benchmarks/roofline.py --profile h200 --out runs/<run>/bench/roofline

Writes roofline.json (every figure, the environment), roofline.csv (one row per measurement),
engine.log, and the profiler trace (trace.json.gz).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

# What to measure per profile; the model and engine settings come from params/<profile>.yaml.
PROFILES = {
    "cpu": dict(
        batches=[1, 8],
        prompt_len=64,
        output_len=16,
        prefill_lens=[128, 512],
        profile_output_len=12,
        peak_tflops=None,  # a shared CPU has no meaningful peak: fractions are not computed
        hbm_tb_s=None,
    ),
    "h200": dict(
        batches=[1, 16, 64, 256],
        prompt_len=512,
        output_len=128,
        prefill_lens=[512, 2048, 8192, 16000],
        profile_output_len=40,
        peak_tflops=989.0,  # dense bf16
        hbm_tb_s=4.8,
    ),
}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--profile", choices=sorted(PROFILES), default="cpu")
    ap.add_argument(
        "--repeats", type=int, default=3, help="timed runs per batch size / prompt length"
    )
    ap.add_argument("--no-trace", action="store_true", help="skip the profiler pass")
    ap.add_argument("--out", default="runs/bench/roofline")
    ap.add_argument("--reanalyse", action="store_true",
                    help="rebuild --out's rows from its saved timings and trace, no engine")  # fmt: skip
    args = ap.parse_args()
    if args.reanalyse:
        report(reanalyse(Path(args.out)), Path(args.out))
        return
    from tunebook.workbench.profiles import engine_base

    prof = {**PROFILES[args.profile], **engine_base(args.profile)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    # The engine's log (attention backend and the like) goes to a file: vLLM logs to stdout and
    # stderr, and its engine core is a child process that inherits both from here.
    global _console
    log_fd = os.open(out / "engine.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    _console = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    try:
        result = measure(prof, args, out)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(log_fd)
    report(result, out)


_console = sys.stdout


def say(msg: str) -> None:
    print(f"[roofline] {msg}", file=_console, flush=True)


def measure(prof: dict, args, out: Path) -> dict:
    from tunebook.core.model import load_shape
    from tunebook.core.workloads import make_workload
    from tunebook.measure.execute import Engine, parse_log, vllm_version
    from tunebook.topics.roofline import (
        load_trace,
        step_phases,
    )

    shape = load_shape(prof["model"])
    peak, bw = prof["peak_tflops"], prof["hbm_tb_s"]
    trace_dir = Path(tempfile.mkdtemp(prefix="tunebook-trace-"))
    settings = dict(prof["settings"])
    if not args.no_trace:
        settings["profiler_config"] = {
            "profiler": "torch",
            "torch_profiler_dir": str(trace_dir),
            "torch_profiler_with_stack": False,
            "torch_profiler_dump_cuda_time_total": False,
            "ignore_frontend": True,
        }
    point = {"point_id": "roofline", "model": prof["model"], "workload": {}, "settings": settings}
    seed = iter(range(1000, 100000))

    def workload(n: int, prompt_len: int, output_len: int):
        spec = {
            "kind": "fixed",
            "num_requests": n,
            "prompt_len": prompt_len,
            "output_len": output_len,
            "seed": next(seed),
        }
        return make_workload(spec, vocab_size=shape.vocab_size)

    rows: list[dict] = []
    decode: dict[int, list[float]] = {b: [] for b in prof["batches"]}
    prefill: dict[int, list[float]] = {s: [] for s in prof["prefill_lens"]}
    t0 = time.perf_counter()
    with Engine(point) as eng:
        env = {**eng.fingerprint(), "vllm_version": vllm_version()}
        env["settings"] = prof["settings"]  # the profiler config is not a setting under test
        say(f"engine up in {eng.start_s:.0f}s")
        eng.warmup(8)
        # Interleaved: every batch size and prompt length once per round, so drift hits all alike.
        for rep in range(args.repeats):
            for b in prof["batches"]:
                r = eng.run(workload(b, prof["prompt_len"], prof["output_len"]))
                tpots = [q["tpot_ms"] for q in r["requests"] if q.get("tpot_ms") is not None]
                decode[b].append(statistics.median(tpots))
            for s in prof["prefill_lens"]:
                r = eng.run(workload(1, s, 1))
                prefill[s].append(r["requests"][0]["prefill_ms"])
            say(f"round {rep + 1}/{args.repeats} done ({time.perf_counter() - t0:.0f}s)")
        runs = []
        if not args.no_trace:
            eng.llm.start_profile()
            for b in prof["batches"]:
                eng.run(workload(b, prof["prompt_len"], prof["profile_output_len"]), record=False)
            for s in prof["prefill_lens"]:
                eng.run(workload(1, s, 1), record=False)
            eng.llm.stop_profile()
            traces = wait_for_traces(trace_dir)
            if traces:
                shutil.copy(traces[0], out / "trace.json.gz")
                runs = step_phases(load_trace(traces[0]))
            say(f"profiled pass: {len(traces)} trace file(s), {len(runs)} step runs")
    shutil.rmtree(trace_dir, ignore_errors=True)
    sys.stdout.flush()
    sys.stderr.flush()
    env.update(
        {
            k: v
            for k, v in parse_log(Path(out / "engine.log").read_text(errors="replace")).items()
            if k == "attention_backend"
        }
    )

    rows = build_rows(prof, shape, decode, prefill, runs)
    return {
        "profile": args.profile,
        "model": prof["model"],
        "peak_tflops": peak,
        "hbm_tb_s": bw,
        "repeats": args.repeats,
        "rows": rows,
        "raw_ms": {
            "decode_step": {str(k): v for k, v in decode.items()},
            "prefill": {str(k): v for k, v in prefill.items()},
        },
        "profiled_step_runs": runs,
        "seconds": time.perf_counter() - t0,
        "env": env,
    }


def build_rows(prof: dict, shape, decode: dict, prefill: dict, runs: list[dict]) -> list[dict]:
    """One row per batch size and prompt length: step time, floor, fraction, GPU share."""
    from tunebook.core.metrics import spread
    from tunebook.topics.prefill import prefill_floor_ms
    from tunebook.topics.roofline import decode_floor_ms, decode_runs, prefill_runs

    peak, bw = prof["peak_tflops"], prof["hbm_tb_s"]
    rows: list[dict] = []
    context = prof["prompt_len"] + prof["output_len"] / 2  # mean context over the decode
    for b, vals in decode.items():
        row = {
            "phase": "decode",
            "batch": b,
            "prompt_len": prof["prompt_len"],
            "output_len": prof["output_len"],
            "mean_context_tokens": context,
        }
        s = spread(vals)
        row.update(step_ms=s["median"], step_ms_min=s["min"], step_ms_max=s["max"], repeats=s["n"])
        if peak and bw:
            f = decode_floor_ms(shape, b, context, peak, bw)
            row.update(
                floor_ms=f["floor_ms"],
                floor_bound=f["bound"],
                floor_fraction=f["floor_ms"] / s["median"],
            )
        prof_runs = decode_runs(runs, b)
        if prof_runs:
            best = max(prof_runs, key=lambda r: r["steps"])
            row.update(
                profiled_step_period_ms=best["step_period_ms"],
                gpu_busy_ms=best["gpu_busy_ms"],
                gpu_busy_share_profiled=best["gpu_busy_share"],
            )
            if best["gpu_busy_ms"] is not None:
                # GPU work per step against the unprofiled step: the rest is the host's.
                row["gpu_share_of_step"] = best["gpu_busy_ms"] / s["median"]
        rows.append(row)
    for p_len, vals in prefill.items():
        row = {"phase": "prefill", "batch": 1, "prompt_len": p_len, "output_len": 1}
        s = spread(vals)
        row.update(step_ms=s["median"], step_ms_min=s["min"], step_ms_max=s["max"], repeats=s["n"])
        if peak and bw:
            f = float(prefill_floor_ms(shape, p_len, peak, bw))
            row.update(floor_ms=f, floor_fraction=f / s["median"])
        prof_runs = prefill_runs(runs, p_len)
        if prof_runs and prof_runs[0]["gpu_busy_ms"] is not None:
            row["gpu_busy_ms"] = prof_runs[0]["gpu_busy_ms"]
            row["gpu_share_of_step"] = prof_runs[0]["gpu_busy_ms"] / s["median"]
        rows.append(row)
    return rows


def reanalyse(folder: Path) -> dict:
    """Rebuild the rows of a saved result from its raw timings and trace (no engine)."""
    from tunebook.core.model import load_shape
    from tunebook.topics.roofline import load_trace, step_phases

    result = json.loads((folder / "roofline.json").read_text())
    prof = {**PROFILES[result["profile"]], "peak_tflops": result["peak_tflops"],
            "hbm_tb_s": result["hbm_tb_s"]}  # fmt: skip
    raw = result["raw_ms"]
    decode = {int(k): v for k, v in raw["decode_step"].items()}
    prefill = {int(k): v for k, v in raw["prefill"].items()}
    trace = folder / "trace.json.gz"
    runs = step_phases(load_trace(trace)) if trace.exists() else []
    result["profiled_step_runs"] = runs
    result["rows"] = build_rows(prof, load_shape(result["model"]), decode, prefill, runs)
    return result


def wait_for_traces(trace_dir: Path, timeout_s: float = 120.0) -> list[Path]:
    """The worker writes its trace after stop_profile returns on some versions: wait for it."""
    end = time.time() + timeout_s
    while time.time() < end:
        found = sorted(trace_dir.rglob("*.pt.trace.json*"))
        if found and all(_stable(p) for p in found):
            return found
        time.sleep(1.0)
    return sorted(trace_dir.rglob("*.pt.trace.json*"))


def _stable(p: Path) -> bool:
    a = p.stat().st_size
    time.sleep(0.5)
    return a > 0 and p.stat().st_size == a


def report(result: dict, out: Path) -> None:
    (out / "roofline.json").write_text(json.dumps(result, indent=2, default=str))
    keys = sorted(
        {k for r in result["rows"] for k in r},
        key=lambda k: (k not in ROW_ORDER, ROW_ORDER.index(k) if k in ROW_ORDER else 0, k),
    )
    with open(out / "roofline.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(result["rows"])
    env = result["env"]
    print(
        f"roofline ({result['profile']}: {env.get('device')}, vLLM {env.get('vllm_version')}, "
        f"{env.get('attention_backend')}, {result['repeats']} repeats)"
    )
    cols = [("phase", "phase"), ("batch", "B"), ("prompt_len", "S"), ("step_ms", "step ms"),
            ("step_ms_min", "min"), ("step_ms_max", "max"), ("floor_ms", "floor ms"),
            ("floor_fraction", "floor/step"), ("gpu_busy_ms", "GPU ms"),
            ("gpu_share_of_step", "GPU/step")]  # fmt: skip
    print("  ".join(f"{h:>10s}" for _, h in cols))
    for r in result["rows"]:
        cells = []
        for k, _ in cols:
            v = r.get(k)
            cells.append(
                f"{v:>10.3f}" if isinstance(v, float) else f"{v if v is not None else '-':>10}"
            )
        print("  ".join(cells))
    print(f"written: {out}/roofline.json, roofline.csv")


ROW_ORDER = [
    "phase",
    "batch",
    "prompt_len",
    "output_len",
    "mean_context_tokens",
    "repeats",
    "step_ms",
    "step_ms_min",
    "step_ms_max",
    "floor_ms",
    "floor_bound",
    "floor_fraction",
    "profiled_step_period_ms",
    "gpu_busy_ms",
    "gpu_busy_share_profiled",
    "gpu_share_of_step",
]

if __name__ == "__main__":
    main()
