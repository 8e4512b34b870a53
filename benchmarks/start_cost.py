"""What one `vllm serve` start costs, phase by phase, and what a warm compile cache saves.

Question: an engine start is most of a GPU run's cost (76% of 00's GPU-seconds on the H200).
vLLM keeps its torch.compile artefacts (and Inductor's and Triton's kernels) in cache folders
under the home directory, so a second start of the same configuration on a node loads them
instead of compiling. How much does that save, and where does the rest of a start go?

Two modes:

``--logs RUN_FOLDER`` (no engine): every served replica log under a run folder (``replica*.log``
or ``.log.gz``), in start order, with the phases vLLM itself logs: model loading, torch.compile
(and whether its graph was compiled or loaded from the cache), CUDA graph capture, the engine's
whole init, and the seconds from the server's first log line to "Starting vLLM server".

``--measure`` (real engines): starts of one configuration through ``tunebook.measure.served.Deployment``,
alternating a cold start (fresh, empty cache folders: ``VLLM_CACHE_ROOT``,
``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR``) and a warm one (folders that an earlier start
filled). The first start fills the warm folders and is itself cold: order C W C W ...; each start
is timed from spawn to healthy, its log parsed as above, and written as it finishes.

``--measure --arms mp``: every start warm (one filling start first, not counted), alternating
how the API server starts its engine-core process: ``spawn`` (what ``vllm serve`` sets when
``VLLM_WORKER_MULTIPROC_METHOD`` is unset: a fresh interpreter that imports vLLM again) and
``fork`` (that variable set to ``fork``: a copy of the already-imported API server), in ABBA
order. ``api_to_engine_s`` is the gap from the API server's first log line to the engine
core's first one: where a spawned engine core re-imports. ``--api-server fork`` forks every
API server from tunebook's launcher (what served points do), so only the engine core differs.

``--measure --arms launcher``: every start warm, alternating how the API server itself starts:
``spawned`` (a new ``vllm serve`` process that imports vLLM, torch and the server) and ``forked``
(``tunebook.engine.launcher``: a process that imported them once forks the server), ABBA after one
filling start, which is forked so that the launcher's one import (``launcher_ready_s``, paid once
per environment and sweep process) is reported apart. ``--engine-core fork`` applies to both.
``--measure --arms isolated``: the same question for an isolated in-process point (what the
h200 profile's 01 and 02 run): its process spawned afresh or forked from the engine launcher,
ABBA after one filling forked point; each row is the whole point (process, engine, 4 requests).
``--requests N`` then sends N requests (64 tokens in, 64 out, all at once, tunebook's client)
to each server once it is healthy: output tok/s per start, so that the arms' serving is compared
too, not only their starts.

    python benchmarks/start_cost.py --logs runs/h200-20261203-b
    python benchmarks/start_cost.py --measure --model ernie-4.5-0.3b-pt --starts 4 \\
        --out runs/<run>/bench/start_cost.json
    python benchmarks/start_cost.py --measure --arms mp --model ernie-4.5-0.3b-pt --starts 4
    python benchmarks/start_cost.py --measure --arms launcher --model ernie-4.5-0.3b-pt --starts 4
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

# vLLM 0.26.0's own log lines for the phases of an engine start.
PATTERNS = {
    "model_load_s": re.compile(r"Model loading took [\d.]+ GiB and ([\d.]+) seconds"),
    "compile_s": re.compile(r"torch\.compile took ([\d.]+) s in total"),
    "graph_capture_s": re.compile(r"Graph capturing finished in ([\d.]+) secs"),
    "engine_init_s": re.compile(
        r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+)"
    ),
}
COMPILED = re.compile(r"Compiling a graph for compile range")
LOADED = re.compile(r"Directly load the compiled graph")
STAMP = re.compile(r"(\d\d-\d\d \d\d:\d\d:\d\d)")
CACHE_ENV = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
QUESTIONS = {
    "cache": "one vllm serve start: cold (empty cache folders) vs warm (filled)",
    "mp": "one warm vllm serve start: engine core spawned (vllm serve's default) vs forked",
    "launcher": "one warm vllm serve start: a new process vs forked from tunebook's launcher",
}
# How the API server itself starts in each arm (Point.serve's "launcher").
SERVER_START = {"spawned": "spawn", "forked": "fork", "fill-forked": "fork"}


def _stamp(line: str) -> datetime | None:
    m = STAMP.search(line)
    return datetime.strptime(m.group(1), "%m-%d %H:%M:%S") if m else None


def start_phases(text: str) -> dict:
    """The start phases one server log records (absent phases are left out)."""
    out: dict = {}
    for key, pat in PATTERNS.items():
        m = pat.search(text)
        if m:
            out[key] = float(m.group(1))
    if COMPILED.search(text):
        out["compile_cache"] = "compiled"
    elif LOADED.search(text):
        out["compile_cache"] = "loaded"
    lines = text.splitlines()
    first = next((t for t in map(_stamp, lines) if t), None)
    up = next((_stamp(x) for x in lines if "Starting vLLM server" in x), None)
    if first and up:
        out["log_to_serving_s"] = (up - first).total_seconds()
    # vLLM's first inspection of the model class on a node (a fresh Python process, cached
    # under VLLM_CACHE_ROOT/modelinfos): 20 s of a fresh H100's first start, 0 s after it.
    resolved = next((_stamp(x) for x in lines if "Resolved architecture" in x), None)
    if first and resolved:
        out["resolve_s"] = (resolved - first).total_seconds()
    core = next((_stamp(x) for x in lines if x.startswith("(EngineCore")), None)
    if first and core:
        out["api_to_engine_s"] = (core - first).total_seconds()
    if "We must use the `spawn` multiprocessing start method" in text:
        out["forced_spawn"] = True  # vLLM overrode a requested fork (e.g. CUDA already initialised)
    return out


def _read(path: Path) -> str:
    if path.suffix == ".gz":
        return gzip.decompress(path.read_bytes()).decode(errors="replace")
    return path.read_text(errors="replace")


def from_logs(run: Path) -> list[dict]:
    """One row per served replica log under ``run``, in the order the servers started."""
    rows = []
    for p in sorted([*run.rglob("replica*.log"), *run.rglob("replica*.log.gz")]):
        text = _read(p)
        first = next((t for t in map(_stamp, text.splitlines()) if t), None)
        row = {"log": str(p.relative_to(run)), "first": first, **start_phases(text)}
        # <sweep>/logs/<point>/replica0.log.gz: the point's own file has spawn-to-healthy seconds.
        point = p.parent.parent.parent / f"{p.parent.name}.json"
        if point.is_file():
            seconds = json.loads(point.read_text()).get("seconds") or {}
            row["start_s"] = seconds.get("engine_start")
        rows.append(row)
    rows.sort(key=lambda r: (r["first"] is None, r["first"] or datetime.min))
    for r in rows:
        r["first"] = r["first"].strftime("%m-%d %H:%M:%S") if r["first"] else None
    return rows


def summarise(rows: list[dict], key: str = "compile_cache") -> dict:
    """Median [min-max] of each phase, per group (compiled vs loaded from the cache)."""
    out: dict = {}
    for group in sorted({r.get(key) for r in rows if r.get(key)}):
        sel = [r for r in rows if r.get(key) == group]
        out[group] = {"starts": len(sel)}
        phases = ("log_to_serving_s", "api_to_engine_s", "start_s", "output_tok_s")
        for phase in (*PATTERNS, *phases, "engine_start_s", "process_s"):
            vals = [r[phase] for r in sel if r.get(phase) is not None]
            if vals:
                out[group][phase] = [statistics.median(vals), min(vals), max(vals)]
    return out


def table(rows: list[dict]) -> str:
    cols = (
        "start_s",
        "log_to_serving_s",
        "resolve_s",
        "api_to_engine_s",
        "engine_init_s",
        "compile_s",
        "output_tok_s",
    )
    head = f"{'start':<24}{'cache':<12}" + "".join(f"{c:>17}" for c in cols)
    lines = [head, "-" * len(head)]
    for r in rows:
        name = r.get("arm") or Path(r.get("log", "")).parent.name
        cells = "".join(f"{r[c]:>17.1f}" if r.get(c) is not None else f"{'-':>17}" for c in cols)
        lines.append(f"{name[:23]:<24}{str(r.get('compile_cache', '-'))[:11]:<12}{cells}")
    return "\n".join(lines)


def arm_order(arms: str, starts: int, api_server: str = "spawn") -> list[str]:
    """Cache: C W C W ... (the first cold start fills the warm folders). mp: one filling start,
    then spawn and fork in ABBA order, so a drift over the run falls on both arms alike; with
    the API servers forked, one filling start per arm: the engine-core method is part of a
    launcher's environment, so each arm has a launcher whose one import is in no arm."""
    if arms == "cache":
        return ["cold" if i % 2 == 0 else "warm" for i in range(starts)]
    if arms == "launcher":
        abba = ("spawned", "forked", "forked", "spawned")
        return ["fill-forked"] + [abba[i % 4] for i in range(starts)]
    abba = ("spawn", "fork", "fork", "spawn")
    fills = ["fill", "fill-fork"] if api_server == "fork" else ["fill"]
    return fills + [abba[i % 4] for i in range(starts)]


def measure_isolated(args) -> dict:
    """``--arms isolated``: an isolated in-process point (``run_point(isolate=True)``, what the
    h200 profile's 01 and 02 run), its process spawned afresh (``TUNEBOOK_LAUNCHER=0``) or forked
    from the engine launcher; ABBA after one filling forked point. Whole point, seconds."""
    import os

    from tunebook.measure.execute import run_point

    settings = json.loads(args.settings) if args.settings else {}
    root = Path(args.work_dir or tempfile.mkdtemp(prefix="start-cost-"))
    order = arm_order("launcher", args.starts)
    rows: list[dict] = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    for i, arm in enumerate(order):
        os.environ["TUNEBOOK_LAUNCHER"] = "0" if arm == "spawned" else "1"
        point = {
            "point_id": f"iso-{i}-{arm}",
            "model": args.model,
            "settings": settings,
            "workload": {"kind": "fixed", "num_requests": 4, "prompt_len": 16, "output_len": 4},
        }
        res = run_point(point, isolate=True, log_path=root / f"iso-{i}.log")
        secs = res.get("seconds") or {}
        rows.append(
            {
                "arm": arm,
                "start": i,
                "status": res["status"],
                "error": res.get("error"),
                "start_s": res.get("wall_s"),  # the whole point: process, engine, 4 requests
                "engine_start_s": secs.get("engine_start"),
                "process_s": secs.get("process"),
                "process_start": (res.get("env") or {}).get("process_start"),
            }
        )
        print(rows[-1], flush=True)
        result = {
            "question": "an isolated point: its process spawned afresh vs forked from a launcher",
            "date": time.strftime("%Y-%m-%d", time.localtime(t0)),
            "model": args.model,
            "settings": settings,
            "order": order,
            "starts": rows,
            "summary": summarise([r for r in rows if not r["arm"].startswith("fill")], "arm"),
            "wall_s": time.time() - t0,
        }
        out.write_text(json.dumps(result, indent=2))
    return result


def measure(args) -> dict:
    from tunebook.measure.served import Deployment

    if args.arms == "isolated":
        return measure_isolated(args)

    settings = json.loads(args.settings) if args.settings else {}
    root = Path(args.work_dir or tempfile.mkdtemp(prefix="start-cost-"))
    warm = root / "warm"
    order = arm_order(args.arms, args.starts, args.api_server)
    rows: list[dict] = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    for i, arm in enumerate(order):
        # The first start fills the warm folders (cold itself); later cold starts get empty ones.
        base = root / f"cold-{i}" if (arm == "cold" and i > 0) else warm
        env = {k: str(base / k.lower()) for k in CACHE_ENV}
        core = "fork" if arm in ("fork", "fill-fork") or args.engine_core == "fork" else "spawn"
        point = {
            "point_id": f"start-{i}-{arm}",
            "model": args.model,
            "mode": "served",
            "workload": {
                "kind": "fixed",
                "num_requests": max(args.requests, 1),
                "prompt_len": 64 if args.requests else 16,
                "output_len": 64 if args.requests else 4,
            },
            "settings": settings,
            "env": env,
            # the cache and mp arms start every server afresh, as they always have
            "serve": {
                "launcher": args.api_server
                if args.arms == "mp"
                else SERVER_START.get(arm, "spawn"),
                "engine_core": core,
            },
        }
        log_dir = root / f"logs-{i}"
        dep = Deployment(point, log_dir)
        row: dict = {"arm": arm, "start": i, "server_start": dep.server_start}
        try:
            dep.start()
            row["start_s"] = dep.start_s
            row["server_start"] = dep.server_start  # "spawned" where a forked start failed
            if args.requests:
                from tunebook.measure.execute import workload_of

                dep.warmup(2)
                m = dep.run(workload_of(dep.point))["metrics"]
                row["output_tok_s"] = m["output_throughput_tok_s"]
                row["ttft_p50_ms"] = m.get("ttft_p50_ms")
        except Exception as e:  # written with its error; the next start may still work
            row["error"] = f"{type(e).__name__}: {e}"
        finally:
            if dep.fork_failure:
                row["fork_failure"] = dep.fork_failure
            t = time.perf_counter()
            dep.shutdown()
            row["shutdown_s"] = time.perf_counter() - t
        text = "".join(_read(p) for p in sorted(log_dir.glob("replica*.log*")))
        row.update(start_phases(text))
        if "error" in row:  # the log stays on the node: keep what it says beyond INFO
            row["log_tail"] = [x for x in text.splitlines() if " INFO " not in x][-30:]
        rows.append(row)
        print(table(rows).splitlines()[-1], flush=True)
        result = {
            "question": QUESTIONS[args.arms],
            "date": time.strftime("%Y-%m-%d", time.localtime(t0)),
            "model": args.model,
            "settings": settings,
            "cache_env": list(CACHE_ENV),
            "order": order,
            "starts": rows,
            "summary": summarise([r for r in rows if not r["arm"].startswith("fill")], "arm"),
            "launcher_ready_s": launcher_ready_s(),
            "engine_core": args.engine_core,
            "api_server": args.api_server if args.arms == "mp" else None,
            "wall_s": time.time() - t0,
        }
        out.write_text(json.dumps(result, indent=2))  # after every start: a cut run keeps its rows
    return result


def launcher_ready_s() -> list[float]:
    """Seconds each launcher of this process took to import vLLM's CLI (once per environment)."""
    from tunebook.engine import launcher

    return [x.ready_s for x in launcher._LAUNCHERS.values() if x.ready_s is not None]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--logs", type=Path, help="a run folder: tabulate its server logs")
    mode.add_argument("--measure", action="store_true", help="start real servers, cold and warm")
    ap.add_argument("--model", default="tiny-ernie", help="model folder or name under models/")
    ap.add_argument("--settings", default=None, help="vLLM settings as JSON (default: vLLM's)")
    ap.add_argument(
        "--arms",
        choices=("cache", "mp", "launcher", "isolated"),
        default="cache",
        help="cache: cold vs warm compile cache; mp: engine core spawned vs forked (all warm);"
        " launcher: the API server spawned vs forked from tunebook's launcher (all warm);"
        " isolated: an isolated in-process point's process spawned vs forked",
    )
    ap.add_argument(
        "--engine-core",
        choices=("spawn", "fork"),
        default="spawn",
        help="every arm: how the API server starts its engine core (VLLM_WORKER_MULTIPROC_METHOD)",
    )
    ap.add_argument(
        "--api-server",
        choices=("spawn", "fork"),
        default="spawn",
        help="--arms mp: every API server a new process (spawn) or forked from tunebook's launcher",
    )
    ap.add_argument("--starts", type=int, default=4, help="engine starts, alternating the arms")
    ap.add_argument(
        "--requests",
        type=int,
        default=0,
        help="after each start, N requests (64 in, 64 out, all at once): output tok/s per start",
    )
    ap.add_argument("--work-dir", default=None, help="cache folders and logs (else a temp dir)")
    ap.add_argument("--out", default="runs/bench/start_cost.json")
    args = ap.parse_args()
    if args.logs:
        if not args.logs.is_dir():
            sys.exit(f"--logs: {args.logs} is not a folder")
        rows = from_logs(args.logs)
        if not rows:
            sys.exit(f"--logs: no replica*.log(.gz) under {args.logs}")
        print(table(rows))
        print(json.dumps(summarise(rows), indent=1))
        return
    if args.starts < 2:
        sys.exit("--starts must be >= 2 (one of each arm)")
    result = measure(args)
    print(json.dumps(result["summary"], indent=1))
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
