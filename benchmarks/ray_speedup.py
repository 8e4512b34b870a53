"""The same N-point sweep through the local and the Ray executor, in one session: wall times, ratio.

    .venv/bin/python benchmarks/ray_speedup.py --points 8            # tiny model, in-process engines
    .venv/bin/python benchmarks/ray_speedup.py --points 8 --isolate  # one engine process per point

Local runs the points one after another in this process; Ray runs them as tasks on a private
local cluster (one CPU, or one GPU, per point), started first and idle while the local sweep
runs. The Ray figure is reported without and with the cluster's start-up; the ratio is
local / Ray (above 1: Ray is faster). On a CPU-only machine each Ray task gets OMP_NUM_THREADS=1
while the local engine uses every core, so the ratio there measures start-up overlap more than
engine speed. Needs the ray extra (pip install -e .[ray]).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=8, help="points in the sweep (default 8)")
    ap.add_argument("--model", default="tiny-ernie")
    ap.add_argument("--isolate", action="store_true", help="engine in a child process per point")
    ap.add_argument("--num-cpus", type=int, default=None, help="CPUs of the Ray cluster")
    ap.add_argument("--num-requests", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--out", default=None, help="folder for both sweeps (default: a temp dir)")
    args = ap.parse_args(argv)

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private cluster of this process
    from tunebook.measure import ray_executor
    from tunebook.measure.sweep import make_points, run_sweep

    ray = ray_executor.import_ray()
    base = {
        "model": args.model,
        "settings": {
            "enforce_eager": True,
            "kv_cache_memory_bytes": 67108864,
            "max_model_len": 1024,
        },
        "env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
        "workload": {
            "kind": "fixed",
            "num_requests": args.num_requests,
            "prompt_len": args.prompt_len,
            "output_len": args.output_len,
        },
        "warmup_requests": 2,
    }
    configs = {"bs32": {"settings": {"block_size": 32}}, "bs64": {"settings": {"block_size": 64}}}
    repeats = max(1, -(-args.points // len(configs)))
    points = make_points(base, configs, repeats=repeats)[: args.points]
    out = Path(args.out or tempfile.mkdtemp(prefix="tunebook-ray-speedup-"))
    if not args.isolate:
        os.environ.update(base["env"])  # the local in-process engines read it from this process

    t0 = time.perf_counter()
    kw = {"num_cpus": args.num_cpus} if args.num_cpus else {}
    ray_executor.start_local_ray(include_dashboard=False, **kw)
    start_s = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        df_local = run_sweep(points, out / "local", isolate=args.isolate, progress=False)
        local_s = time.perf_counter() - t0

        slots = ray.cluster_resources()
        t0 = time.perf_counter()
        df_ray = run_sweep(
            points, out / "ray", isolate=args.isolate, executor="ray", progress=False
        )
        ray_s = time.perf_counter() - t0
    finally:
        ray.shutdown()

    def kv(folder: Path) -> dict:
        return {
            p.stem: json.loads(p.read_text()).get("capacity", {}).get("kv_capacity_tokens")
            for p in folder.glob("*.json")
        }

    ok_local = int((df_local["status"] == "ok").sum())
    ok_ray = int((df_ray["status"] == "ok").sum())
    same_kv = kv(out / "local") == kv(out / "ray")
    print(
        f"points {len(points)} (isolate={args.isolate}), cores {os.cpu_count()}, "
        f"ray cluster CPU {slots.get('CPU', 0):.0f} GPU {slots.get('GPU', 0):.0f}"
    )
    print(f"local: {local_s:7.1f} s  ({ok_local} ok)")
    print(f"ray:   {ray_s:7.1f} s  ({ok_ray} ok) + {start_s:.1f} s cluster start")
    print(
        f"speed-up local/ray: {local_s / ray_s:.2f}x sweep only, {local_s / (ray_s + start_s):.2f}x with start"
    )
    print(f"same KV capacity per point: {same_kv}; results in {out}")
    return 0 if ok_local == ok_ray == len(points) and same_kv else 1


if __name__ == "__main__":
    sys.exit(main())
