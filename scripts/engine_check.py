"""Check that tunebook drives the installed vLLM on this machine, and that KV arithmetic is exact.

For bf16 and fp8 KV at two block sizes, the capacity predicted from config.json and
kv_cache_memory_bytes must equal the engine's (blocks x block_size, and the "KV cache size"
line vLLM logs). Then one offline and one online point report their timings.

    python scripts/engine_check.py --model tiny-ernie --run-dir runs/check       # CPU
    python scripts/engine_check.py --model ernie-4.5-0.3b-pt --run-dir runs/h200-check
"""

from __future__ import annotations

import argparse
import json

from tunebook.core.model import load_shape
from tunebook.measure.execute import platform_name
from tunebook.measure.sweep import make_points, run_sweep


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="tiny-ernie")
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
    args = ap.parse_args()

    plat = platform_name()
    cpu = plat == "cpu"
    shape = load_shape(args.model)
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
        "model": args.model,
        "settings": base_settings,
        "env": env,
        "workload": wl,
        "warmup_requests": 2,
    }
    df = run_sweep(
        make_points(base, configs), f"{args.run_dir}/capacity", isolate=True, desc="capacity"
    )
    rows = []
    for _, r in df.iterrows():
        point = json.loads(open(f"{args.run_dir}/capacity/{r.point_id}.json").read())
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
    print(f"\nplatform {plat}, model {args.model}, kv_cache_memory_bytes {kv_bytes:,}")
    print(f"{'point':16s} {'status':7s} {'predicted':>12s} {'blocks*bs':>12s} {'logged':>12s}")
    for pid, st, pred, rep, logged, err in rows:
        flag = "" if pred == rep else "  MISMATCH"
        print(
            f"{pid:16s} {st:7s} {pred:12,} {rep or 0:12,} {logged or 0:12,}{flag}"
            + (f"  {err[:120]}" if err else "")
        )

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
    df2 = run_sweep(make_points(base2, timing), f"{args.run_dir}/modes", isolate=True, desc="modes")
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


if __name__ == "__main__":
    main()
