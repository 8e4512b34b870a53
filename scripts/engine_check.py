"""Check that tunebook drives the installed vLLM on this machine, and that KV arithmetic is exact.

For bf16 and fp8 KV at two block sizes, the capacity predicted from config.json and
kv_cache_memory_bytes must equal the engine's (blocks x block_size, and the "KV cache size"
line vLLM logs). Then one offline and one online point report their timings. ``--model`` may be
given several times: each model is checked in turn, in a folder of its own under ``--run-dir``
(one model: the run folder itself); the exit status is 1 if any started engine's capacity differs from the prediction.

    python scripts/engine_check.py --model tiny-ernie --run-dir runs/check       # CPU
    python scripts/engine_check.py --model tiny-qwen3 --model tiny-llama --quick --no-timing
    python scripts/engine_check.py --model ernie-4.5-0.3b-pt --run-dir runs/h200-check
"""

from __future__ import annotations

import argparse
import json
import sys

from tunebook.core.model import ModelShape, load_shape
from tunebook.measure.execute import platform_name
from tunebook.measure.sweep import make_points, run_sweep


def shape_line(model: str, shape: ModelShape) -> str:
    """The KV arithmetic of a model, from its config, in one line."""
    L, kv, d = shape.num_hidden_layers, shape.num_key_value_heads, shape.head_dim
    return (
        f"{model} ({shape.model_type}): 2 (K, V) x {L} layers x {kv} KV heads x head_dim {d}"
        f" x 2 B = {shape.kv_bytes_per_token('bfloat16'):,} B a token in bf16;"
        f" {shape.param_count:,} parameters ({shape.weight_bytes() / 1e6:,.1f} MB)"
    )


def check_capacity(model: str, args, cpu: bool) -> tuple[list[tuple], dict, dict]:
    """The capacity points of one model: rows (point, status, predicted, engine, logged, error),
    and the base point and settings the timing points reuse."""
    shape = load_shape(model)  # an unsupported config stops here, before any engine starts
    print(shape_line(model, shape))
    kv_bytes = args.kv_bytes or (64 << 20 if cpu else 8 << 30)
    base_settings = {"kv_cache_memory_bytes": kv_bytes, "max_model_len": 2048}
    env = {}
    if cpu:
        base_settings["enforce_eager"] = True
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    blocks = (32, 64) if cpu else (16, 64)
    if args.quick:
        blocks = blocks[:1]
        base_settings["enforce_eager"] = (
            True  # capacity does not depend on graphs when KV bytes are given
        )
    configs = {
        f"{dt}-bs{bs}": {"settings": {"kv_cache_dtype": dt, "block_size": bs}}
        for dt in ("auto", "fp8")
        for bs in blocks
    }
    wl = {"kind": "fixed", "num_requests": 8, "prompt_len": 64, "output_len": 16}
    base = {
        "model": model,
        "settings": base_settings,
        "env": env,
        "workload": wl,
        "warmup_requests": 2,
    }
    out = f"{model_dir(model, args)}/capacity"
    df = run_sweep(make_points(base, configs), out, isolate=True, desc="capacity")
    rows = []
    for _, r in df.iterrows():
        point = json.loads(open(f"{out}/{r.point_id}.json").read())
        cap = point.get("capacity") or {}
        s = point["settings"]
        pred = shape.kv_capacity_tokens(kv_bytes, s["block_size"], s["kv_cache_dtype"])
        rows.append(
            (
                r.point_id,
                point["status"],
                pred,
                cap.get("kv_capacity_tokens"),
                cap.get("engine_kv_tokens"),
                point.get("error"),
            )
        )
    print(f"\nplatform {platform_name()}, model {model}, kv_cache_memory_bytes {kv_bytes:,}")
    print(f"{'point':16s} {'status':7s} {'predicted':>12s} {'blocks*bs':>12s} {'logged':>12s}")
    for pid, st, pred, rep, logged, err in rows:
        # a point that did not start has no capacity to compare (its error says why)
        flag = "  MISMATCH" if st == "ok" and pred != rep else ""
        print(
            f"{pid:16s} {st:7s} {pred:12,} {rep or 0:12,} {logged or 0:12,}{flag}"
            + (f"  {err[:120]}" if err else "")
        )
    return rows, base, base_settings


def check_timing(model: str, args, cpu: bool, base: dict, base_settings: dict) -> None:
    timing = {"offline": {"mode": "offline"}, "online": {"mode": "online", "max_concurrency": 8}}
    wl2 = {
        "kind": "fixed",
        "num_requests": 32 if cpu else 256,
        "prompt_len": 128 if cpu else 512,
        "output_len": 32 if cpu else 128,
        "request_rate": 0,
    }
    # Timings with the platform's normal engine: vLLM sizes KV itself on GPU; graphs on.
    settings2 = base_settings if cpu else {"max_model_len": 2048}
    base2 = {**base, "settings": settings2, "workload": wl2}
    out = f"{model_dir(model, args)}/modes"
    df2 = run_sweep(make_points(base2, timing), out, isolate=True, desc="modes")
    cols = [
        "point_id",
        "status",
        "ttft_p50_ms",
        "tpot_p50_ms",
        "e2e_p50_ms",
        "output_throughput_tok_s",
        "error",
    ]
    print(df2.reindex(columns=cols).to_string(index=False))


def model_dir(model: str, args) -> str:
    """The run folder itself for one model (as before), a folder per model for several."""
    if len(args.model or ()) < 2:
        return args.run_dir
    return f"{args.run_dir}/{str(model).rstrip('/').replace('/', '_')}"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--model",
        action="append",
        help="a model folder or name under models/ (repeatable; default tiny-ernie)",
    )
    ap.add_argument("--run-dir", default="runs/engine-check")
    ap.add_argument(
        "--kv-bytes",
        type=int,
        default=None,
        help="kv_cache_memory_bytes (default: 64 MiB CPU, 8 GiB GPU)",
    )
    ap.add_argument(
        "--quick", action="store_true", help="one block size, eager engines for the capacity points"
    )
    ap.add_argument("--no-timing", action="store_true", help="the capacity points only")
    args = ap.parse_args()
    models = args.model or ["tiny-ernie"]

    cpu = platform_name() == "cpu"
    mismatched = []
    for model in models:
        rows, base, base_settings = check_capacity(model, args, cpu)
        mismatched += [(model, r[0]) for r in rows if r[1] == "ok" and r[2] != r[3]]
        if not args.no_timing:
            check_timing(model, args, cpu, base, base_settings)
    if mismatched:
        print(f"capacity differs from the prediction: {mismatched}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
