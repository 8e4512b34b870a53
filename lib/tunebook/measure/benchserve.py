"""vLLM's own client, ``vllm bench serve``, as a served point's load generator: the independent
check of what tunebook's client measured.

A served point with ``serve: {client: vllm-bench}`` is measured by ``vllm bench serve`` (its
random dataset with the workload's prompt and output lengths, Poisson arrivals at the workload's
rate, ``--goodput`` with the point's SLO) instead of ``tunebook.measure.loadgen``. Everything else
is the same: the deployment, the /metrics sampler, the SLO and the sustained rule read the
per-request records that ``--save-detailed`` keeps (converted here to tunebook's record
fields). One ``vllm bench serve`` process keeps a schedule up to a few hundred requests a second;
above that ``client_workers`` processes share the rate, each at rate / N with its own seed, forked
from one process that imported vLLM once and released together from a barrier (the recipe that
held 512 req/s on an H200 node, FINDINGS 2026-12-06).

Each worker's result JSON is kept, gzipped and without its generated texts (random text from
dummy weights), beside the point's logs: ``bench-<step>-w<i>.json.gz``.

    python -m tunebook.measure.benchserve <job.json>    # the forking runner (a child process)
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import subprocess
import sys
import time
from http import HTTPStatus
from pathlib import Path

from tunebook.core.errors import ConfigError
from tunebook.core.workloads import Workload

CLIENT = "vllm-bench"  # serve.client's value that picks this client
SUPPORTED_KINDS = ("fixed",)
# HTTP reason phrases back to their codes: a failed request's error is the response's reason.
_REASONS = {s.phrase: s.value for s in HTTPStatus if s.value >= 400}


def worker_args(
    base_url: str,
    model_name: str,
    tokenizer: str,
    wl: Workload,
    slo: dict | None,
    workers: int,
    result_dir: Path,
    step: str,
) -> list[list[str]]:
    """The ``vllm bench serve`` arguments of each worker: the workload's lengths, its rate and
    request count split N ways, a seed each, and the files to save."""
    spec = wl.spec
    kind = spec.get("kind", "fixed")
    if kind not in SUPPORTED_KINDS:
        raise ConfigError(
            f"client vllm-bench runs the random dataset of fixed lengths; workload kind {kind!r}"
            f" is tunebook's own (use kinds {', '.join(SUPPORTED_KINDS)})",
            key="client",
        )
    rate = spec.get("request_rate")
    n = len(wl.requests)
    workers = max(1, min(workers, n))  # a worker with no prompt would fail
    out = []
    for i in range(workers):
        share = n // workers + (1 if i < n % workers else 0)
        args = [
            "--backend", "openai",
            "--base-url", base_url,
            "--endpoint", "/v1/completions",
            "--model", model_name,
            "--tokenizer", tokenizer,
            "--dataset-name", "random",
            "--random-input-len", str(int(spec["prompt_len"])),
            "--random-output-len", str(int(spec["output_len"])),
            "--random-range-ratio", "0.0",
            "--num-prompts", str(share),
            "--seed", str(int(spec.get("seed", 0)) + 7919 * i),
            "--ignore-eos",
            "--ready-check-timeout-sec", "0",  # the deployment answered /health already
            "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,90,99",
            "--save-result", "--save-detailed",
            "--result-dir", str(result_dir),
            "--result-filename", f"bench-{step}-w{i}.json",
            "--disable-tqdm",
            "--temperature", "0",  # greedy, as tunebook's points (bench serve leaves it to the server)
        ]  # fmt: skip
        if rate:
            args += ["--request-rate", repr(float(rate) / workers)]
        goodput = [
            f"{k}:{slo[k + '_ms']:g}" for k in ("ttft", "tpot") if slo and slo.get(k + "_ms")
        ]
        if goodput:
            args += ["--goodput", *goodput]
        out.append(args)
    return out


def records(result: dict, perf0: float) -> list[dict]:
    """tunebook's request records from one worker's detailed result (times in seconds there)."""
    out = []
    lat = result.get("latencies")  # vLLM 0.32; 0.26 leaves them out: ttft + the gaps
    for i, ttft in enumerate(result.get("ttfts") or []):
        err = (result.get("errors") or [""] * (i + 1))[i]
        n_out = (result.get("output_lens") or [0] * (i + 1))[i]
        rec = {
            "request_id": str(i),
            "prompt_tokens": (result.get("input_lens") or [0] * (i + 1))[i],
            "output_tokens": n_out,
            "sent_s": result["start_times"][i] - perf0,
        }
        if err or not n_out:
            rec["error"] = err or "no output"
            code = _REASONS.get(str(err).strip())
            if code:  # bench keeps a refusal's reason phrase ("Service Unavailable"), not its code
                rec["status"] = code
            out.append(rec)
            continue
        gaps = [1e3 * g for g in (result["itls"][i] or [])]
        e2e = 1e3 * lat[i] if lat else 1e3 * ttft + sum(gaps)
        rec.update(
            ttft_ms=1e3 * ttft,
            itl_ms=gaps,
            e2e_ms=e2e,
            tpot_ms=(e2e - 1e3 * ttft) / (n_out - 1) if n_out > 1 else None,
            chunks=len(gaps) + 1,
        )
        out.append(rec)
    return out


def run(
    base_url: str,
    model_name: str,
    tokenizer: str,
    wl: Workload,
    slo: dict | None,
    workers: int,
    result_dir: str | Path,
    step: str,
    timeout_s: float,
) -> tuple[list[dict], dict]:
    """Send ``wl`` with ``vllm bench serve``: (records on the schedule's clock, the client check)."""
    phase = {"step": step, "workload": wl, "workers": workers}
    return run_phases(base_url, model_name, tokenizer, [phase], slo, result_dir, timeout_s)


def run_phases(
    base_url: str,
    model_name: str,
    tokenizer: str,
    phases: list[dict],
    slo: dict | None,
    result_dir: str | Path,
    timeout_s: float,
    on_start=None,
) -> tuple[list[dict], dict]:
    """Phases of traffic sent by ``vllm bench serve`` workers released together: each phase
    (``step``, ``workload``, ``workers``, ``delay_s`` after the release, ``tag``) by its own
    workers, so that a phase starts on time whatever the one before it left waiting (the overload
    check's burst, then its steady rate). Records are on one clock, 0 at the first request any
    worker sent, each with its phase's ``tag`` where given. ``on_start()`` is called once the
    workers are released."""
    result_dir = Path(result_dir)
    result_dir.mkdir(parents=True, exist_ok=True)
    first_step = phases[0]["step"]
    argv, delays, owners = [], [], []
    for ph in phases:
        args = worker_args(
            base_url,
            model_name,
            tokenizer,
            ph["workload"],
            slo,
            int(ph.get("workers", 1)),
            result_dir,
            ph["step"],
        )
        for i, a in enumerate(args):
            argv.append(a)
            delays.append(float(ph.get("delay_s", 0.0)))
            owners.append((ph, i))
    job = {
        "argv": argv,
        "delays": delays,
        "timing": str(result_dir / f"bench-{first_step}-timing.json"),
    }
    job_file = result_dir / f"bench-{first_step}-job.json"
    job_file.write_text(json.dumps(job))
    timing_file = Path(job["timing"])
    timing_file.unlink(missing_ok=True)
    _spawn(job_file, result_dir / f"bench-{first_step}.log", timing_file, on_start, timeout_s)
    timing = json.loads(timing_file.read_text())
    recs, summary = _collect(owners, result_dir, timing["perf0"])
    # The schedule's 0: the first request any worker sent (each samples its prompts first).
    first = min((r["sent_s"] for r in recs), default=0.0)
    for i, r in enumerate(sorted(recs, key=lambda r: r["sent_s"])):
        r["request_id"], r["sent_s"] = str(i), r["sent_s"] - first
    workers = len(argv)
    check = {
        "client": f"vllm bench serve ({workers} process(es), vLLM {timing.get('vllm')})",
        "client_workers": workers,
        "start_wall": timing["wall0"] + first,
        "bench": summary,
        "errors": sum(1 for r in recs if r.get("error")),
        # bench serve draws its own Poisson schedule: no send lag is measured against one
        "kept_schedule": None,
    }
    return recs, check


def _spawn(job_file: Path, log: Path, timing_file: Path, on_start, timeout_s: float) -> None:
    """Run the forking runner on ``job_file``; ``on_start()`` once its workers are released (its
    timing file appears then). A runner that fails raises with its log's tail."""
    with open(log, "w") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tunebook.measure.benchserve", str(job_file)],
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            if on_start is not None:
                while proc.poll() is None and not timing_file.is_file():
                    time.sleep(0.05)
                if timing_file.is_file():
                    on_start()
            code = proc.wait(timeout=timeout_s)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-12:])
        raise RuntimeError(f"vllm bench serve exited with code {code}: {tail}")


def _collect(owners: list, result_dir: Path, perf0: float) -> tuple[list[dict], dict]:
    """Every worker's records (tagged with its phase's tag) and bench's summary over them; each
    result JSON kept gzipped, without its generated texts."""
    recs: list[dict] = []
    summary = {"completed": 0, "failed": 0, "request_goodput": 0.0, "files": []}
    for ph, i in owners:
        path = result_dir / f"bench-{ph['step']}-w{i}.json"
        res = json.loads(path.read_text())
        got = records(res, perf0)
        if ph.get("tag"):
            for r in got:
                r["tag"] = ph["tag"]
        recs += got
        summary["completed"] += int(res.get("completed") or 0)
        summary["failed"] += int(res.get("failed") or 0)
        summary["request_goodput"] += float(res.get("request_goodput") or 0.0)
        res.pop("generated_texts", None)  # random text from dummy weights: most of the file
        kept = path.with_suffix(".json.gz")
        with gzip.open(kept, "wt") as f:
            json.dump(res, f)
        path.unlink()
        summary["files"].append(kept.name)
    return recs, summary


def _known(argv: list[str], options: dict) -> list[str]:
    """``argv`` without the options this vLLM's bench client lacks (``--temperature`` is newer
    than 0.26's, which sends greedy requests anyway), each with its value."""
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a.startswith("--") and a not in options:
            skip = i + 1 < len(argv) and not argv[i + 1].startswith("--")
            print(f"tunebook: this vllm bench serve has no {a}; left out", file=sys.stderr)
            continue
        out.append(a)
    return out


def _main(job_file: str) -> int:
    """Import vLLM's bench client once, fork one worker per argument list, and start their
    schedules together once every worker has drawn its prompts (a later phase's ``delay_s``
    after that)."""
    import multiprocessing as mp
    import threading

    import vllm.benchmarks.serve as bench

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # vLLM 0.26 keeps it in vllm.utils
        from vllm.utils import FlexibleArgumentParser

    job = json.loads(Path(job_file).read_text())
    parsed = []
    for argv in job["argv"]:
        parser = FlexibleArgumentParser()
        bench.add_cli_args(parser)
        parsed.append(parser.parse_args(_known(argv, parser._option_string_actions)))
    ctx = mp.get_context("fork")
    # bench serve draws its prompts before its schedule starts: 10 s for 3,000 prompts of 512
    # tokens, 39 s for 9,900 on an H100 node. A phase that must start when the one before it
    # ends would start that much late (seen: 18.7 s, the burst's backlog gone by then), so each
    # worker waits, prompts drawn, until every worker has them: bench.benchmark is where the
    # schedule starts.
    ready = ctx.Barrier(len(parsed) + 1)
    schedule = bench.benchmark

    def work(args, delay_s: float) -> None:
        async def aligned(*a, **kw):
            ready.wait(timeout=1800)
            if delay_s > 0:  # a later phase's workers (run_phases): on the same clock
                await asyncio.sleep(delay_s)
            return await schedule(*a, **kw)

        bench.benchmark = aligned
        bench.main(args)

    delays = job.get("delays") or [0.0] * len(parsed)
    procs = [ctx.Process(target=work, args=(a, d)) for a, d in zip(parsed, delays, strict=True)]
    for p in procs:
        p.start()
    # the schedule starts now, on every worker's clock (a worker that died first breaks it)
    waiter = threading.Thread(target=_release, args=(ready, job["timing"]), daemon=True)
    waiter.start()
    codes = []
    for p in procs:
        p.join()
        codes.append(p.exitcode)
    bad = [c for c in codes if c]
    if bad and ready.n_waiting:
        ready.abort()
    return bad[0] if bad else 0


def _release(ready, timing: str) -> None:
    """Wait with the workers until each has drawn its prompts, then note the clock's 0."""
    import threading

    import vllm

    try:
        ready.wait(timeout=1800)
    except threading.BrokenBarrierError:
        return
    perf0, wall0 = time.perf_counter(), time.time()
    Path(timing).write_text(json.dumps({"perf0": perf0, "wall0": wall0, "vllm": vllm.__version__}))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tunebook.measure.benchserve JOB.json")
    sys.exit(_main(sys.argv[1]))
