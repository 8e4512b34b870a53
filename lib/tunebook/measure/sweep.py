"""Sweeps: a list of independent points, run in order (interleaved repeats), written one by one.

A sweep never stops on a failed point: the failure is written with its error and the next point
runs. A rerun of the same folder skips points already done (resume). Points carry all they need
(settings + workload in, one result file out), so an executor may run them anywhere.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterable
from pathlib import Path

from tunebook.core.errors import ConfigError
from tunebook.core.results import SweepDir, load_sweep, safe_name
from tunebook.engine.adapter import point_env
from tunebook.engine.interrupt import deferred, phase, requested, stop_on_signal
from tunebook.measure import execute  # module-qualified: tests stand a fake run_point in
from tunebook.measure.live import LivePanel, ProgressTail, in_jupyter
from tunebook.measure.ray_executor import run_points_ray
from tunebook.measure.served import anchor_search, deployment_key, execute_served_group


def point_id(config: str, repeat: int | None = None) -> str:
    return safe_name(config if repeat is None else f"{config}-r{repeat}", "point id")


def make_points(
    base: dict,
    configs: dict[str, dict],
    repeats: int = 1,
    workloads: dict[str, dict] | None = None,
    point_overrides: dict[str, dict] | None = None,
    workload_repeats: dict[str, int] | None = None,
) -> list[dict]:
    """Points for named configurations, repeats interleaved: A-r0 B-r0 A-r1 B-r1 ...

    ``base`` holds what every point shares (model, workload, mode, sampling ...); each config's
    dict is merged over it, with ``settings`` merged key by key. Each point is its own engine
    start, so repeats also span engine instances (the dominant noise on a shared GPU).

    ``workloads`` (name -> spec) gives each configuration several workloads, in order within
    each repeat: A/x-r0 A/y-r0 B/x-r0 B/y-r0 A/x-r1 ... Points of one configuration and repeat
    then share one engine start (``run_sweep``); point ids read ``<config>--<name>-r<i>``.
    ``workload_repeats`` (name -> n) runs a workload on the first n repeats only.
    ``point_overrides`` (name -> point keys) sets client-side keys per workload, such as
    ``max_concurrency``; a configuration's ``per_workload`` (name -> point keys) sets its own for
    one workload (the rate at its own capacity, say). Workloads that would draw their prompts from one seed get distinct
    seeds (+1000 per position): on a shared start, a prompt seen by an earlier workload would
    hit the prefix cache.
    """
    if repeats < 1:
        raise ConfigError(f"repeats must be >= 1, got {repeats}", key="repeats")
    if workloads is not None and not workloads:
        raise ConfigError("workloads must name at least one workload", key="workloads")
    for key, given in (
        ("point_overrides", point_overrides),
        ("workload_repeats", workload_repeats),
    ):
        unknown = sorted(set(given or {}) - set(workloads or {}))
        if unknown:
            raise ConfigError(f"{key}: {unknown} are not workloads", key=key)
    for name, cfg in configs.items():
        unknown = sorted(set(cfg.get("per_workload") or {}) - set(workloads or {}))
        if unknown:
            raise ConfigError(
                f"{name}: per_workload {unknown} are not workloads", key="per_workload"
            )
    named = list(_distinct_seeds(workloads).items()) if workloads else [(None, None)]
    points = []
    for r, (name, cfg), (wl_name, wl) in itertools.product(range(repeats), configs.items(), named):
        if r >= (workload_repeats or {}).get(wl_name, repeats):
            continue
        p = copy.deepcopy(base)
        cfg = copy.deepcopy(cfg)
        per_workload = cfg.pop("per_workload", {})
        p["settings"] = {**(p.get("settings") or {}), **cfg.pop("settings", {})}
        if "search" in cfg:  # a configuration's own search keys (its start) over the sweep's
            p["search"] = {**(p.get("search") or {}), **(cfg.pop("search") or {})}
        p.update(cfg)
        p["config"] = name
        p["repeat"] = r
        p["point_id"] = point_id(name if wl_name is None else f"{name}--{wl_name}", r)
        if wl_name is not None:
            p["workload"] = {**copy.deepcopy(wl), "name": wl_name}
            p.update(copy.deepcopy((point_overrides or {}).get(wl_name, {})))
            # This configuration's own keys for this workload (its rate, its search's start):
            # ``workload`` and ``search`` merge key by key, anything else replaces.
            for k, v in copy.deepcopy(per_workload.get(wl_name, {})).items():
                p[k] = {**(p.get(k) or {}), **v} if k in ("workload", "search") else v
        points.append(p)
    return points


def _distinct_seeds(workloads: dict[str, dict]) -> dict[str, dict]:
    out, seen = {}, set()
    for i, (name, wl) in enumerate(workloads.items()):
        seed = int(wl.get("seed", 0))
        if seed in seen:
            wl = {**wl, "seed": seed + 1000 * i}
        seen.add(int(wl.get("seed", 0)))
        out[name] = wl
    return out


def grid(name: str, values: Iterable, key: str = "settings") -> dict[str, dict]:
    """Configs varying one setting: grid("block_size", [32, 64]) -> {"block_size=32": {...}}."""
    return {f"{name}={v}": {key: {name: v}} if key else {name: v} for v in values}


def _progress(total: int, desc: str, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="point")


def _in_jupyter() -> bool:

    return in_jupyter()


def _run_point_live(p: dict, panel, isolate: bool, timeout_s, log_path: Path) -> dict:
    """execute.run_point with the live panel fed: on_sample in-process, a tailed progress file isolated."""

    panel.start_point(p.point_id)
    if not isolate:
        result = execute.run_point(
            p, isolate=False, timeout_s=timeout_s, log_path=log_path, on_sample=panel.update
        )
    else:
        progress = log_path.with_name(f"{p.point_id}.progress.jsonl")
        progress.parent.mkdir(parents=True, exist_ok=True)
        progress.unlink(missing_ok=True)
        tail = ProgressTail(progress, panel.update)
        tail.start()
        try:
            result = execute.run_point(
                p, isolate=True, timeout_s=timeout_s, log_path=log_path, progress_path=progress
            )
        finally:
            tail.stop()
        if result.get("status") == "ok":
            progress.unlink(missing_ok=True)  # the result's timeline has the same samples
    panel.end_point(result)
    return result


def run_sweep(
    points: list[dict],
    out_dir: str | Path,
    isolate: bool = True,
    progress: bool = True,
    retry_failed: bool = True,
    executor: str = "local",
    timeout_s: float | None = 3600,
    on_result: Callable[[dict], None] | None = None,
    desc: str | None = None,
    live: bool | None = None,
):
    """Run points, writing ``<point_id>.json`` as each finishes and ``summary.csv`` at the end.

    Returns the sweep's DataFrame (every point in the folder, failed ones with their error).
    ``executor="ray"`` hands the points to tunebook.measure.ray_executor (optional extra).
    ``live`` shows the engine's state while each point runs (tunebook.measure.live.LivePanel: a widget in
    Jupyter, a log line every few seconds elsewhere); None means on in a Jupyter kernel only. The
    local executor only: an isolated point's samples come through ``logs/<point>.progress.jsonl``
    (removed once the point is ``ok``).
    """

    sweep = SweepDir(out_dir)
    # Every bad key, setting or impossible workload is reported before any engine starts; the
    # points are validated here once (typed Points from now on).
    points = [execute.prepare(p) for p in points]
    ids = [p.point_id for p in points]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise ConfigError(f"duplicate point ids in sweep: {sorted(dup)}", key="point_id")

    def is_done(p: dict) -> bool:
        prev = sweep.read(p.point_id)
        return bool(prev) and (prev.get("status") == "ok" or not retry_failed)

    todo = [p for p in points if not is_done(p)]
    bar = _progress(len(points), desc or Path(out_dir).name, progress)
    if bar is not None:
        bar.update(len(points) - len(todo))

    def finish(result: dict) -> None:
        with deferred():  # a signal here lets the finished point be written, then stops the sweep
            phase("write", result["point_id"])
            # A point that failed because the stop cut it short is not a finished point: not written.
            if result.get("status") == "ok" or requested() is None:
                sweep.write(result["point_id"], result)
        if bar is not None:
            bar.set_postfix_str(f"{result['point_id']}: {result.get('status')}")
            bar.update(1)
        if on_result:
            on_result(result)

    # Ctrl-C (SIGINT) or SIGTERM stops the sweep at every moment: tunebook.engine.interrupt.
    with stop_on_signal():
        try:
            if executor == "local":
                _run_local(
                    todo, sweep, isolate, timeout_s, finish, desc or Path(out_dir).name, live
                )
            elif executor == "ray":
                run_points_ray(
                    todo, finish, timeout_s=timeout_s, isolate=isolate, log_dir=sweep.root / "logs"
                )
            else:
                raise ConfigError(
                    f"executor must be 'local' or 'ray', got {executor!r}", key="executor"
                )
        finally:
            if bar is not None:
                bar.close()
            sweep.write_summary()

    df = load_sweep(sweep.root)
    return df[df["point_id"].isin(ids)].reset_index(drop=True) if len(df) else df


def _run_local(todo, sweep, isolate, timeout_s, finish, desc, live) -> None:
    """Points one after another in this process's control; consecutive points that differ only
    in their workload share one engine start (``start_groups``)."""

    logs = sweep.root / "logs"
    panel = None
    if todo and (live if live is not None else _in_jupyter()):
        panel = LivePanel(desc, total=len(todo))
    try:
        for group in start_groups(todo, isolate):
            if any(p.search is not None and p.repeat for p in group):
                earlier = sweep.points()
                group = [anchor_search(p, earlier) for p in group]
            p = group[0]
            phase("between", p.point_id)
            log_path = logs / f"{p.point_id}.log"
            if len(group) > 1:
                _run_group(group, logs / p.point_id, finish, panel)
            elif panel is None:
                finish(
                    execute.run_point(p, isolate=isolate, timeout_s=timeout_s, log_path=log_path)
                )
            else:
                finish(_run_point_live(p, panel, isolate, timeout_s, log_path))
    finally:
        if panel is not None:
            panel.close()


def start_key(point, isolate: bool) -> str | None:
    """What points must share to be measured on one engine start: the engine, its server, the
    configuration's name and which start (repeat) of it this is; only the workload and its
    measurement may differ. ``None`` for a point that needs a start of its own: an in-process
    point run isolated (one child process per point)."""

    if point.mode == "served":
        return deployment_key(point)
    return None if isolate else point.mode + ":" + deployment_key(point)


def start_groups(points: list, isolate: bool = False) -> list[list]:
    """Consecutive points that can share one engine start (``start_key`` equal); every other
    point alone. Served points share a deployment; in-process points (``isolate=False``) an
    engine."""
    groups: list[list] = []
    last = None
    for p in points:
        key = start_key(p, isolate)
        if key is not None and key == last:
            groups[-1].append(p)
        else:
            groups.append([p])
        last = key
    return groups


def _run_group(group: list, log_dir: Path, finish, panel) -> None:
    """Points on one engine start, each result written as soon as it is measured."""

    def done(result: dict) -> None:
        if panel is not None:
            panel.end_point(result)
        finish(result)

    hooks = {
        "on_sample": panel.update if panel is not None else None,
        "on_begin": panel.start_point if panel is not None else None,
    }
    workloads = [execute.workload_of(p) for p in group]
    if group[0].mode == "served":
        execute_served_group(group, workloads, log_dir, done, **hooks)
        return
    with point_env(group[0].env):
        execute.execute_group(group, workloads, done, **hooks)
