"""Spread a sweep's points over a Ray cluster: one point is one Ray task.

``run_sweep(points, out, executor="ray")`` (or ``TUNEBOOK_EXECUTOR=ray`` for a Workbook) sends
each point to :func:`run_points_ray`. Each task calls ``tunebook.measure.execute.run_point`` inside a Ray
worker and returns the result dict to the driver, which writes it (``finish``) as soon as it
arrives, in the same run-folder layout as the local executor. A point that fails (engine error,
exception in the task, worker killed, no result in time) is written as that point's failure with
its error; the other points go on.

Where Ray runs
    ``address`` (or the ``TUNEBOOK_RAY_ADDRESS`` environment variable; ``RAY_ADDRESS`` is read by
    Ray itself) names an existing cluster: ``"auto"``, ``"host:6379"`` or ``"ray://host:10001"``.
    Without one a private local cluster is started for this call and shut down afterwards. If
    the caller already called ``ray.init()``, that connection is used and left open.

Resources and placement
    On a cluster with GPUs each task asks for ``num_gpus`` = tensor_parallel_size x
    pipeline_parallel_size (1 by default); Ray gives it that many GPUs of one node and sets
    ``CUDA_VISIBLE_DEVICES`` for it. On a CPU-only cluster each task asks for ``num_cpus=1``
    (Ray then sets ``OMP_NUM_THREADS=1`` in the worker unless you set it yourself).
    The driver keeps at most ``num_workers`` tasks in flight (default: as many as the cluster has
    GPUs, or CPUs on a CPU-only cluster) and submits in the order the points arrive. Points come
    interleaved (A-r0 B-r0 A-r1 B-r1 ...), so repeats of one configuration are not run back to
    back on one worker. Because interleaving alone can still pin a configuration to a GPU (two
    configurations, two GPUs, equal run times: A always lands on the GPU that A just freed), the
    driver also remembers which configurations each (node, GPU set) has run: when a slot frees,
    the next point submitted is the first of the next few in order whose configuration has not
    yet run on that slot. With every other slot busy, the new task lands on the freed one, so
    a configuration's repeats spread over the GPUs (best effort: Ray chooses the GPU, and a
    shared cluster may move work around). Each result records where it ran under
    ``env["placement"]``: Ray node id and IP, hostname, GPU ids, ``CUDA_VISIBLE_DEVICES``, worker
    pid, OMP threads.

Isolation and engine mode
    ``isolate=True`` (the default, as for the local executor): the task starts the engine in a
    child process of its own session and kills that process group afterwards; the engine log
    is shipped back and written to ``<sweep>/logs/<point_id>.log``. Workers are reused (only the
    child imports vLLM afresh). ``isolate=False``: the engine runs inside the Ray worker; the
    point's ``env`` is the task's runtime environment (set before vLLM is imported, so each
    distinct env gets its own workers). Use ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` there: workers
    are then reused and pay the vLLM import once; in vLLM's default multiprocess mode each task
    gets a fresh worker (``max_calls=1``, the EngineCore child would outlive the point). On GPU
    nodes Ray's own default applies (a fresh worker per task, which releases GPU memory). On CPU
    nodes ``VLLM_CPU_OMP_THREADS_BIND=nobind`` is set unless the point's env says otherwise
    (otherwise every concurrent engine binds itself to the same cores).

Nothing is left running
    Tasks get no retries (a point that kills its worker is a failed point, not run again). On an
    interrupt or error the driver cancels the tasks in flight (first gently, so an isolated point
    kills its engine group, then by force), shuts Ray down if this call started it, and kills any
    process on this machine still carrying this driver's tag (engine children of killed workers;
    Ray's own workers too when this call started Ray, else Ray keeps its idle workers for reuse).

Workers must import ``tunebook`` and find the model folder at the same path: on a multi-node
cluster install the repository on every node (``pip install -e .[ray]``).
"""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from tunebook.core.errors import ConfigError, TunebookError
from tunebook.core.points import failed_result
from tunebook.measure.execute import run_point

ADDRESS_ENV = "TUNEBOOK_RAY_ADDRESS"
TAG_ENV = "TUNEBOOK_RAY_SWEEP"  # set in every task's environment: finds this driver's processes
# One tag per driver process, so that successive sweeps on one Ray connection reuse its workers.
_TAG = f"{os.getpid()}-{uuid.uuid4().hex}"
GRACE_S = 300.0  # on top of timeout_s: worker start, vLLM import, log shipping
LOG_TAIL_CHARS = 2_000_000


def import_ray():
    """``import ray`` or a ConfigError saying how to install it (local runs never need Ray)."""
    try:
        import ray
    except ImportError as e:
        raise ConfigError(
            "executor 'ray' needs Ray: install the ray extra: pip install -e .[ray]",
            key="executor",
        ) from e
    return ray


# --------------------------------------------------------------------------- inside the worker
def _placement(t0: float) -> dict:
    import ray

    ctx = ray.get_runtime_context()
    try:
        gpu_ids = [str(g) for g in ray.get_gpu_ids()]
    except Exception:
        gpu_ids = []
    return {
        "executor": "ray",
        "ray_node_id": ctx.get_node_id(),
        "ray_node_ip": ray.util.get_node_ip_address(),
        "hostname": socket.gethostname(),
        "ray_gpu_ids": gpu_ids,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "worker_pid": os.getpid(),
        "task_s": time.perf_counter() - t0,
    }


def _failed(point, error: str) -> dict:

    return failed_result(point, error[:4000])


def run_task(point: dict, isolate: bool, timeout_s: float | None) -> tuple[dict, str | None]:
    """The body of one Ray task: run the point, never raise; return (result, engine log text)."""

    t0 = time.perf_counter()
    log_text = None
    try:
        if isolate:
            with tempfile.TemporaryDirectory(prefix="tunebook-ray-") as tmp:
                log = Path(tmp) / "engine.log"
                try:
                    result = run_point(point, isolate=True, timeout_s=timeout_s, log_path=log)
                finally:
                    if log.is_file():
                        log_text = log.read_text(errors="replace")[-LOG_TAIL_CHARS:]
        else:
            result = run_point(point, isolate=False, timeout_s=timeout_s)
    except Exception as e:  # a ConfigError from prepare(), or anything else: this point fails alone
        result = _failed(point, f"{type(e).__name__}: {e}")
        result["traceback"] = traceback.format_exc()[-4000:]
    result.pop("log_file", None)  # a temporary path on the worker; the driver sets the real one
    env = result.get("env") or {}
    env["placement"] = _placement(t0)
    result["env"] = env
    return result, log_text


# --------------------------------------------------------------------------- the driver
def _ray_children() -> set[int]:
    """Pids of this process's direct children that run Ray's programs (gcs_server, agents...)."""
    me, out = os.getpid(), set()
    for d in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == me and b"/ray/" in (d / "cmdline").read_bytes():
                out.add(int(d.name))
        except (OSError, IndexError, ValueError):
            continue
    return out


def start_local_ray(attempts: int = 3, **init_kwargs) -> None:
    """``ray.init(**init_kwargs)`` for a new local cluster, retried on a failed start.

    Ray 2.60's raylet waits a fixed 15 s for its agents to report their ports and aborts if they
    are late, which happens on a heavily loaded machine. A failed start leaves the processes it
    had already started (gcs_server, dashboard, monitors) running: they are killed here before
    the next attempt.
    """
    ray = import_ray()
    init_kwargs.setdefault("log_to_driver", False)
    last = None
    for attempt in range(attempts):
        if attempt:
            time.sleep(5)
        before = _ray_children()
        try:
            ray.init(**init_kwargs)
            return
        except Exception as e:
            last = e
            ray.shutdown()
            for pid in _ray_children() - before:
                try:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                except OSError:
                    pass
    raise TunebookError(
        f"could not start a local Ray cluster in {attempts} attempts ({last}); on a busy "
        f"machine start one with `ray start --head` and set {ADDRESS_ENV}=auto"
    ) from last


def _connect(ray, address: str | None) -> bool:
    """Connect to (or start) Ray; True if this call did, so it must shut Ray down."""
    if ray.is_initialized():
        return False
    address = address or os.environ.get(ADDRESS_ENV) or None
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        start_local_ray(include_dashboard=False)
    return True


def _gpus_per_point(point: dict) -> int:
    s = point.settings
    return max(
        1, int(s.get("tensor_parallel_size") or 1) * int(s.get("pipeline_parallel_size") or 1)
    )


def _task_env(point: dict, isolate: bool, tag: str, gpu: bool) -> dict[str, str]:
    env = {TAG_ENV: tag}
    if not gpu:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    if not isolate:  # in-process engine: the point's env must be there before vLLM is imported
        env.update({k: str(v) for k, v in point.env.items()})
    return env


def _task_options(point: dict, isolate: bool, tag: str, gpu: bool) -> tuple[int, dict]:
    """(max_calls, options) of a point's task: max_calls is fixed per remote function in Ray."""
    env = _task_env(point, isolate, tag, gpu)
    opts: dict = {"max_retries": 0, "num_cpus": 1, "runtime_env": {"env_vars": env}}
    if gpu:
        opts["num_gpus"] = _gpus_per_point(point)
        return 1, opts  # Ray's default for GPU tasks: a fresh worker releases the device's memory
    mp = env.get("VLLM_ENABLE_V1_MULTIPROCESSING", os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"))
    in_process = mp == "0"
    # Multiprocess mode in the worker: the EngineCore child lingers until the worker exits.
    return (0 if isolate or in_process else 1), opts


def _slot_of(result: dict) -> tuple | None:
    pl = (result.get("env") or {}).get("placement") or {}
    if not pl.get("ray_node_id"):
        return None
    return (pl["ray_node_id"], tuple(pl.get("ray_gpu_ids") or ()))


def _pick(
    pending: list[dict], slot: tuple | None, ran: dict[tuple, Counter], lookahead: int
) -> dict:
    """The next point for a freed slot: of the next few in order, the one whose configuration
    ran least on that slot (the earliest on a tie); plain order when the slot is unknown."""
    if slot is None or slot not in ran:
        return pending.pop(0)
    counts = ran[slot]
    window = pending[:lookahead]
    best = min(range(len(window)), key=lambda i: (counts[_config(window[i])], i))
    return pending.pop(best)


def _config(point: dict) -> str:
    return str(point.config or point.point_id)


def _error_text(e: BaseException) -> str:
    cause = getattr(e, "cause", None)
    if cause is not None and cause is not e:
        return f"{type(cause).__name__}: {cause}"
    text = str(e).strip()
    return f"{type(e).__name__}: {text}"


def _tagged_pids(tag: str) -> list[tuple[int, str]]:
    """(pid, command line) of processes on this machine whose environment carries the tag."""
    needle = f"{TAG_ENV}={tag}".encode()
    out = []
    for d in Path("/proc").glob("[0-9]*"):
        pid = int(d.name)
        if pid == os.getpid():
            continue
        try:
            if needle in (d / "environ").read_bytes().split(b"\0"):
                out.append(
                    (
                        pid,
                        (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"),
                    )
                )
        except OSError:
            continue
    return out


def kill_tagged(tag: str, workers_too: bool) -> list[int]:
    """SIGKILL this sweep's leftover processes here; Ray's own idle workers only if ``workers_too``."""
    killed = []
    for pid, cmd in _tagged_pids(tag):
        if not workers_too and (cmd.startswith("ray::") or "default_worker.py" in cmd):
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            pass
    return killed


def _cancel(ray, refs: list, grace_s: float = 15.0) -> None:
    """Cancel tasks: KeyboardInterrupt first (an isolated point then kills its engine group)."""
    if not refs:
        return
    for r in refs:
        try:
            ray.cancel(r, force=False)
        except Exception:
            pass
    try:
        _, left = ray.wait(refs, num_returns=len(refs), timeout=grace_s)
    except Exception:
        left = refs
    for r in left:
        try:
            ray.cancel(r, force=True)
        except Exception:
            pass


def _submit(
    ray, remotes: dict, point: dict, isolate: bool, tag: str, gpu: bool, timeout_s: float | None
):
    """Submit one point's task; its ref. ``remotes`` keeps one remote function per max_calls."""
    max_calls, opts = _task_options(point, isolate, tag, gpu)
    if max_calls not in remotes:
        remotes[max_calls] = ray.remote(max_calls=max_calls)(run_task)
    return remotes[max_calls].options(**opts).remote(point, isolate, timeout_s)


def _task_result(ray, ref, point: dict) -> tuple[dict, str | None]:
    """A finished task's (result, engine log text); a task that did not return one is the
    point's failure."""
    try:
        result, log_text = ray.get(ref)
    except Exception as e:  # worker died (OOM kill, crash), task cancelled, ...
        result, log_text = _failed(point, f"ray task failed: {_error_text(e)}"), None
        result["env"] = {"placement": {"executor": "ray"}}
    return result, log_text


def _give_up_overdue(
    ray, inflight: dict, freed: list, timeout_s: float | None, deliver: Callable
) -> None:
    """Cancel the tasks in flight past their deadline and deliver each as a timed-out point."""
    now = time.monotonic()
    for ref, (p, deadline) in list(inflight.items()):
        if deadline is not None and now > deadline:
            del inflight[ref]
            _cancel(ray, [ref], grace_s=10.0)
            freed.append(None)
            res = _failed(p, f"timed out: no result within {timeout_s} s + {GRACE_S:.0f} s grace")
            res["env"] = {"placement": {"executor": "ray"}}
            deliver(p, res, None)


def run_points_ray(
    points: list[dict],
    finish: Callable[[dict], None],
    timeout_s: float | None = None,
    address: str | None = None,
    num_workers: int | None = None,
    isolate: bool = True,
    log_dir: str | Path | None = None,
) -> None:
    """Run each point as a Ray task and call ``finish(result)`` as each one completes.

    ``timeout_s`` bounds one point (the isolated child is killed after it; the driver gives a
    task ``timeout_s`` + 300 s from submission before it cancels it and records a timeout).
    ``num_workers`` caps the points in flight. See the module docstring for placement.
    """
    ray = import_ray()
    if not points:
        return
    started = _connect(ray, address)
    tag = _TAG
    inflight: dict = {}  # ref -> (point, deadline)
    clean = False
    try:
        total = ray.cluster_resources()
        gpu = total.get("GPU", 0) > 0
        slots = num_workers or int(total.get("GPU", 0) if gpu else total.get("CPU", 1)) or 1
        remotes: dict[int, object] = {}  # max_calls -> remote function
        pending = list(points)
        lookahead = max(2, len({_config(p) for p in points}))
        ran: dict[tuple, Counter] = {}
        freed: list[tuple | None] = []
        logs = Path(log_dir) if log_dir else None

        def deliver(point: dict, result: dict, log_text: str | None) -> None:
            if logs is not None and log_text is not None:
                logs.mkdir(parents=True, exist_ok=True)
                path = logs / f"{point.point_id}.log"
                path.write_text(log_text)
                result["log_file"] = str(path)
            finish(result)

        while pending or inflight:
            while pending and len(inflight) < slots:
                p = _pick(pending, freed.pop(0) if freed else None, ran, lookahead)
                ref = _submit(ray, remotes, p, isolate, tag, gpu, timeout_s)
                deadline = time.monotonic() + timeout_s + GRACE_S if timeout_s else None
                inflight[ref] = (p, deadline)
            ready, _ = ray.wait(list(inflight), num_returns=1, timeout=1.0)
            for ref in ready:
                p, _ = inflight.pop(ref)
                result, log_text = _task_result(ray, ref, p)
                slot = _slot_of(result)
                if slot is not None:
                    ran.setdefault(slot, Counter())[_config(p)] += 1
                freed.append(slot)
                deliver(p, result, log_text)
            _give_up_overdue(ray, inflight, freed, timeout_s, deliver)
        clean = True
    finally:
        if not clean:
            _cancel(ray, list(inflight))
        if started:
            ray.shutdown()
        # Engine children of force-killed workers (their own sessions) are not Ray's to reap.
        kill_tagged(tag, workers_too=started)
