"""One point, start to finish: validate it once, run it in this process or in an isolated child,
and always return a result (a failure is a result with its error).

The pieces: ``tunebook.core.points`` (the typed Point and Result), ``tunebook.engine.adapter`` (the only module
that imports vllm: the engine itself), ``tunebook.engine.isolation`` (process groups), and, for points in
``served`` mode, ``tunebook.measure.served`` (``vllm serve`` driven over HTTP).

``run_point(point)`` with ``isolate=True`` (the default) runs the engine in a child process in its
own session: an out-of-memory, crash or kill of one configuration is recorded as that point's
failure and cannot take the sweep down, and the whole process group is killed afterwards so no
engine process outlives its point.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

from tunebook.core.model import load_shape
from tunebook.core.points import Point, Result
from tunebook.core.results import _jsonable
from tunebook.core.workloads import Workload, check_fits, make_workload
from tunebook.engine import launcher
from tunebook.engine.adapter import (
    Engine,
    check_architecture,
    failure_reason,
    parse_log,
    platform_name,
    point_env,
    vllm_version,
)
from tunebook.engine.interrupt import phase
from tunebook.engine.isolation import process_env, wait_or_kill, watch_parent_from_env
from tunebook.engine.knobs import validate_settings
from tunebook.measure.served import execute_served


# --------------------------------------------------------------------------- validation
def prepare(point: dict | Point) -> Point:
    """Validate a point once: every error here comes before any engine starts.

    Checks its keys (``Point.from_dict``), its settings against the installed vLLM, the model's
    architecture, and that the workload fits ``max_model_len``. Returns the Point, marked valid so
    that later stages do not check it again.
    """
    p = Point.from_dict(point)
    if getattr(p, "_valid", False):
        return p

    validate_settings(p.settings)
    shape = load_shape(p.model)
    check_architecture(shape, p)
    wl = make_workload(p.workload, vocab_size=shape.vocab_size)
    mml = p.settings.get("max_model_len") or shape.max_position_embeddings
    check_fits(wl, int(mml))
    p._valid = True
    return p


def workload_of(point: Point) -> Workload:
    """The point's requests (deterministic from its spec and the model's vocabulary)."""
    return make_workload(point.workload, vocab_size=load_shape(point.model).vocab_size)


# --------------------------------------------------------------------------- in this process
def execute(
    point: dict | Point, on_sample=None, shutdown: bool = True, log_dir: str | Path | None = None
) -> dict:
    """Run a point in this process: start, warm up, repeat the workload, collect, shut down.

    ``shutdown=False`` is for the isolated child, which exits (and is killed as a group) instead:
    a result must never be lost to a shutdown that hangs. Seconds are accounted per phase.
    """
    point = prepare(point)
    wl = workload_of(point)
    if point.mode == "served":
        return execute_served(point, wl, on_sample=on_sample, log_dir=log_dir)
    out: list[dict] = []
    execute_group([point], [wl], out.append, on_sample, shutdown=shutdown, raise_errors=True)
    return out[0]


# Engines of an isolated child (execute(..., shutdown=False)), kept referenced until it exits.
_LEFT_RUNNING: list = []


def execute_group(
    points: list[Point],
    workloads: list[Workload],
    on_result,
    on_sample=None,
    on_begin=None,
    shutdown: bool = True,
    raise_errors: bool = False,
) -> None:
    """In-process points of one configuration and one engine start (``start_key`` equal) on one
    engine: start and warm up once, measure each point's workload in turn, shut down.

    As ``served.execute_served_group``: each result goes to ``on_result`` as it is measured, the
    first carries the start and warm-up seconds and the others name it in ``shared_start``; a
    failed start fails every point, a failed measurement only its own point. ``raise_errors``
    (one point, run by ``run_point``) raises instead, so that the caller keeps the traceback.
    """
    first = points[0]
    eng = Engine(first, on_sample=on_sample)
    seconds0: dict[str, float] = {}
    error = None
    t0 = time.perf_counter()
    try:
        try:
            t = time.perf_counter()
            phase("engine_start", first.point_id)
            eng.start()
            seconds0["engine_start"] = time.perf_counter() - t
            t = time.perf_counter()
            phase("warmup", first.point_id)
            eng.warmup(first.warmup_requests)
            seconds0["warmup"] = time.perf_counter() - t
        except Exception as e:
            if raise_errors:
                raise
            error = f"{type(e).__name__}: {e}"[:4000]
        for i, (point, wl) in enumerate(zip(points, workloads, strict=True)):
            t_point = time.perf_counter() if i else t0
            if on_begin is not None:
                on_begin(point.point_id)
            result = Result.in_group(point, wl.summary(), i, first.point_id, seconds0)
            eng.point = point  # this point's sampling, SLO, concurrency cap and output collection
            if eng.start_s is not None:
                result.engine_start_s = eng.start_s
                result.capacity = eng.capacity()
                result.env = eng.fingerprint()
            if error is not None:
                result.error = error if i == 0 else f"{error} (engine start of {first.point_id})"
            else:
                t = time.perf_counter()
                try:
                    _measure(eng, point, wl, result)
                except Exception as e:
                    if raise_errors:
                        raise
                    result.status = "failed"
                    result.error = f"{type(e).__name__}: {e}"[:4000]
                finally:
                    result.seconds["measure"] = time.perf_counter() - t
            if i == len(points) - 1 and shutdown:
                t = time.perf_counter()
                eng.shutdown()
                result.seconds["teardown"] = time.perf_counter() - t
            result.wall_s = time.perf_counter() - t_point
            on_result(result.to_dict())
    finally:
        if shutdown:
            eng.shutdown()
        else:  # the isolated child exits at once and is killed as a group: no teardown at all,
            _LEFT_RUNNING.append(eng)  # not even vLLM's own when the last reference goes (~3.5 s)


def _measure(eng: Engine, point: Point, wl: Workload, result: Result) -> None:
    runs = []
    for _ in range(point.repeats):
        phase("measure", point.point_id)
        runs.append(eng.run(wl))
    result.memory = eng.device_memory()
    # The last repeat is the point's figure; all repeats' headline metrics are kept.
    result.metrics = runs[-1]["metrics"]
    result.repeat_metrics = [r["metrics"] for r in runs]
    result.requests = runs[-1]["requests"]
    result.timeline = runs[-1]["timeline"]
    result.status = "ok"


# --------------------------------------------------------------------------- one point
def run_point(
    point: dict | Point,
    isolate: bool = True,
    timeout_s: float | None = 3600,
    log_path: str | Path | None = None,
    progress_path: str | Path | None = None,
    on_spawn=None,
    on_sample=None,
) -> dict:
    """Run one point and always return a result dict; a failure is a result with its error.

    Validation errors (bad settings, workloads that cannot fit) are raised: they are the user's
    input to fix, found before any engine starts. ``on_spawn(pid)`` is called with the isolated
    child's pid (also its process group id) as soon as it starts. ``on_sample(dict)`` gets the
    engine's metrics samples of an in-process point (``isolate=False``); an isolated child appends
    them as JSON lines to ``progress_path`` instead. A served point runs its servers as child
    process groups of their own, so it is never wrapped in another child.
    """
    point = prepare(point)  # raises ConfigError early, in the caller's process
    t0 = time.perf_counter()
    if not isolate or point.mode == "served":
        result = _run_here(point, log_path, on_sample)
        result["wall_s"] = time.perf_counter() - t0
        return result

    with tempfile.TemporaryDirectory(prefix="tunebook-point-") as tmp:
        tmp = Path(tmp)
        (tmp / "point.json").write_text(json.dumps(point.to_dict()))
        log_path = Path(log_path) if log_path else tmp / "engine.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = process_env(point.env)
        cmd = [
            sys.executable,
            "-m",
            "tunebook.measure.execute",
            str(tmp / "point.json"),
            str(tmp / "result.json"),
        ]
        if progress_path:
            cmd.append(str(progress_path))
        result, log_text = _run_child(
            point, cmd, env, log_path, tmp / "result.json", timeout_s, on_spawn
        )
        _add_engine_log(result, log_text)
        result["wall_s"] = time.perf_counter() - t0
        # The child's own process start and vLLM import are part of the point's cost too.
        secs = result.get("seconds")
        if isinstance(secs, dict):
            secs["process"] = max(result["wall_s"] - sum(secs.values()), 0.0)
        result["log_file"] = str(log_path)
        return result


def _run_here(point: Point, log_path: str | Path | None, on_sample) -> dict:
    """Run the point in this process (a served point's servers are child processes of their
    own); an exception is the point's failure, with its traceback."""
    with point_env(point.env if point.mode != "served" else None):
        try:
            served_logs = None
            if point.mode == "served" and log_path:
                served_logs = Path(log_path).with_suffix("")  # <point>/replica0.log ...
            result = execute(point, on_sample=on_sample, log_dir=served_logs)
        except Exception as e:
            result = _failed(point, f"{type(e).__name__}: {e}")
            result["traceback"] = traceback.format_exc()[-4000:]
    return result


def _run_child(
    point: Point,
    cmd: list[str],
    env: dict[str, str],
    log_path: Path,
    res_file: Path,
    timeout_s: float | None,
    on_spawn,
) -> tuple[dict, str]:
    """Run the isolated child to its end: forked from the launcher, and started once more as a
    new process where ``launcher.settle`` blames the fork for its failure.

    Returns (result, engine log text); the result's ``env`` says how the child was started.
    """
    fork, fork_failure = True, None
    while True:
        proc, process_start = launcher.start(
            "engine", cmd[3:], log_path, env, cmd, module=cmd[2], fork=fork
        )
        if on_spawn is not None:
            try:
                on_spawn(proc.pid)
            except BaseException:
                wait_or_kill(proc, 0)
                raise
        rc, timed_out = wait_or_kill(proc, timeout_s)
        killed = proc.returncode is not None and proc.returncode < 0
        log_text = log_path.read_text(errors="replace")
        result = _child_result(point, proc, rc, timed_out, timeout_s, res_file, log_text)
        afresh = launcher.settle(
            "engine",
            env,
            forked=process_start == "forked",
            ok=result.get("status") == "ok",
            external=timed_out or killed,
            retried=fork_failure is not None,
            own=launcher.refused_by_vllm(failure_reason(log_text)),
        )
        if afresh:
            print(
                f"tunebook: point {point.point_id} forked from the launcher failed"
                f" ({result.get('error')}); running it as a new process",
                file=sys.stderr,
            )
            log_path.replace(log_path.with_suffix(".forked.log"))
            res_file.unlink(missing_ok=True)
            fork, fork_failure = False, result.get("error")
            continue
        break
    env_fp = result.setdefault("env", {})
    env_fp["process_start"] = process_start
    if process_start == "forked":
        env_fp["launcher_wait_s"] = round(getattr(proc, "waited_s", 0.0), 3)
    if fork_failure:
        env_fp["fork_failure"] = fork_failure
    return result, log_text


def _child_result(
    point: Point,
    proc,
    rc: int | None,
    timed_out: bool,
    timeout_s: float | None,
    res_file: Path,
    log_text: str,
) -> dict:
    """The result the child wrote, or, where it wrote none, a failure saying how it ended."""
    if res_file.is_file():
        return json.loads(res_file.read_text())
    if timed_out:
        error = f"timed out after {timeout_s} s"
    else:
        how = (
            f"killed by signal {-proc.returncode}"
            if proc.returncode and proc.returncode < 0
            else f"exit code {rc}"
        )
        error = f"engine process died ({how}) before writing a result"
    reason = failure_reason(log_text)
    return _failed(point, error + (f"; log: {reason}" if reason else ""))


def _add_engine_log(result: dict, log_text: str) -> None:
    """What the engine log adds to the result: why the engine failed to start (vLLM's own error
    only says that it did), the attention backend, and the capacity vLLM sized."""
    if (
        result.get("status") != "ok"
        and result.get("error")
        and "Engine core initialization failed" in result["error"]
    ):
        reason = failure_reason(log_text)
        if reason:
            result["error"] = reason
    facts = parse_log(log_text)
    env_fp = result.setdefault("env", {})
    if facts.get("attention_backend") and not env_fp.get("attention_backend"):
        env_fp["attention_backend"] = facts["attention_backend"]
    result.setdefault("capacity", {}).update(
        {k: v for k, v in facts.items() if k != "attention_backend"}
    )


def _failed(point: Point, error: str) -> dict:
    r = Result.skeleton(point)
    r.error = error[:4000]
    return r.to_dict()


# --------------------------------------------------------------------------- the isolated child
def _child_main(argv: list[str]) -> int:
    watch_parent_from_env(Path(argv[0]).parent)
    point = Point.from_dict(json.loads(Path(argv[0]).read_text()))
    point._valid = True  # validated by the parent before it started us
    out = Path(argv[1])
    progress = Path(argv[2]) if len(argv) > 2 else None

    def on_sample(s: dict) -> None:
        with open(progress, "a") as f:
            f.write(json.dumps(s) + "\n")

    try:
        result = execute(point, on_sample=on_sample if progress else None, shutdown=False)
    except Exception as e:
        result = _failed(point, f"{type(e).__name__}: {e}")
        result["traceback"] = traceback.format_exc()[-4000:]

    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(_jsonable(result)))
    os.replace(tmp, out)
    # vLLM's shutdown can hang on leftover threads; the parent kills our group anyway.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))


__all__ = ["Engine", "execute", "platform_name", "prepare", "run_point", "vllm_version"]
