"""Device time of a run: device-seconds per notebook (GPU-seconds on a GPU), and where they went.

A notebook holds the device for its whole wall time, so its device-seconds are its wall time, summed over every call of the runner (``run.json``: a resumed notebook has several).
That time splits into the phases of its points (``seconds`` in every point file: engine start,
including an isolated child's process start and the engine's teardown; warm-up; measurement)
and idle: the wall time spent in none of them (kernel start, imports, arithmetic, charts, writing).
The runner's own seconds outside the notebooks (its start-up, the profile check that imports
vLLM, the report) are a row of their own, from ``run.json``'s ``runner`` record; read by the
runner itself while it writes the report, that row counts up to the moment of reading, so the
report and this command agree.

A run's words follow its device (``seconds_label``): GPU-seconds on a GPU, device-seconds
elsewhere (a CPU run holds no GPU).

Older run folders have points without ``seconds`` and a ``run.json`` holding the last call only;
there the figures are estimated (engine start from ``engine_start_s``, measurement from the
runs' ``duration_s``, warm-up as the rest of ``wall_s``) and each row says which.

    python -m tunebook cost runs/<run-id>
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import re
import statistics
import time
from collections import Counter
from pathlib import Path

from tunebook.core.errors import ConfigError
from tunebook.workbench.profiles import NOTEBOOKS

PHASES = ("engine_start", "warmup", "measure", "teardown", "process")
# What a row reports: engine start also holds process start and teardown (the engine's life
# outside its work), so the four add up to the wall time.
CATEGORIES = ("engine_start", "warmup", "measure", "idle")
ESTIMATED_NOTE = (
    "~ estimated: points without per-phase seconds (older runs, and points that failed before"
    " their engine was up) count engine start from engine_start_s, measurement from the runs'"
    " duration_s, warm-up as the rest of wall_s (a failed point's wall_s: engine start)"
)
LABELS = {
    "engine_start": "engine start/stop",
    "warmup": "warm-up",
    "measure": "measurement",
    "idle": "idle",
}


GPU_PLATFORMS = ("cuda", "rocm", "xpu")


def run_platform(run_dir: str | Path) -> str | None:
    """The platform most of a run's points ran on ('cuda', 'cpu', ...; their ``env``), or None."""
    run_dir = Path(run_dir)
    seen: Counter = Counter()
    folders = sorted(x for x in run_dir.iterdir() if x.is_dir()) if run_dir.is_dir() else []
    for d in folders:
        for p in point_files(d):
            if platform := (p.get("env") or {}).get("platform"):
                seen[str(platform)] += 1
    return seen.most_common(1)[0][0] if seen else None


def seconds_label(platform: str | None) -> str:
    """What a run's device time is called: GPU-seconds on a GPU, device-seconds elsewhere."""
    return "GPU-seconds" if platform in GPU_PLATFORMS else "device-seconds"


def device_name(platform: str | None) -> str:
    """The device a run held, in a word: 'GPU', 'CPU', or 'device' when unknown."""
    if platform in GPU_PLATFORMS:
        return "GPU"
    return "CPU" if platform == "cpu" else "device"


def point_files(folder: Path) -> list[dict]:
    """Point results in a notebook's folder: ``<folder>/<sweep>/<point>.json``."""
    out = []
    for f in sorted(Path(folder).glob("*/*.json")):
        try:
            d = json.loads(f.read_text())
        except (json.JSONDecodeError, OSError):
            continue
        if isinstance(d, dict) and "point_id" in d and "status" in d:
            out.append(d)
    return out


def point_seconds(p: dict) -> tuple[dict[str, float], set[str]]:
    """A point's seconds per phase, and the phases that are estimated (older points)."""
    secs = p.get("seconds")
    if isinstance(secs, dict) and secs:
        return {k: float(secs.get(k) or 0.0) for k in PHASES}, set()
    out = dict.fromkeys(PHASES, 0.0)
    wall = p.get("wall_s")
    if p.get("engine_start_s") is None and not p.get("metrics"):
        # A point that failed before recording anything: its time went into trying to start.
        out["engine_start"] = float(wall or 0.0)
        return out, {"engine_start"} if wall else set()
    out["engine_start"] = float(p.get("engine_start_s") or 0.0)
    runs = p.get("repeat_metrics") or ([p["metrics"]] if p.get("metrics") else [])
    out["measure"] = float(sum((m or {}).get("duration_s") or 0.0 for m in runs))
    est = {"measure"}
    if wall:
        out["warmup"] = max(float(wall) - out["engine_start"] - out["measure"], 0.0)
        est.add("warmup")
    return out, est


def notebook_calls(state: dict, notebook: str) -> tuple[list[dict], bool]:
    """The runner's calls of a notebook (``run.json``), and whether that record is complete."""
    entry = (state.get("notebooks") or {}).get(notebook)
    if not entry:
        return [], False
    if isinstance(entry.get("calls"), list):
        return entry["calls"], True
    # Older run.json: one entry, overwritten by each call; earlier calls are lost.
    if entry.get("seconds") is not None:
        return [{"seconds": entry["seconds"], "status": entry.get("status")}], False
    return [], False


def notebook_cost(
    run_dir: str | Path, notebook: str, state: dict | None = None, running_s: float = 0.0
) -> dict:
    """Device-seconds of one notebook of a run, split into engine start, warm-up, measurement, idle.

    ``running_s`` adds the wall time of a call still in progress (a notebook's own last cell).
    """
    run_dir = Path(run_dir)
    if state is None:
        state = read_state(run_dir)
    points = point_files(run_dir / notebook)
    phases = dict.fromkeys(PHASES, 0.0)
    estimated: set[str] = set()
    points_wall = 0.0
    for p in points:
        secs, est = point_seconds(p)
        for k, v in secs.items():
            phases[k] += v
        estimated |= est
        points_wall += float(p.get("wall_s") or sum(secs.values()))
    calls, complete = notebook_calls(state, notebook)
    wall = sum(float(c.get("seconds") or 0.0) for c in calls) + float(running_s or 0.0)
    in_phases = sum(phases.values())
    notes = []
    if not calls and not running_s:
        wall = points_wall
        estimated.add("wall")
        notes.append("no runner record: wall time is the points' own")
    elif not complete and calls:
        estimated.add("wall")
        notes.append("run.json holds the last call only")
    if wall < points_wall:
        # Points ran in calls the record does not hold (older run.json, or copied points).
        wall = points_wall
        estimated.add("wall")
        notes.append("points outlast the recorded calls: wall time is the points' own")
    row = {
        "notebook": notebook,
        "calls": len(calls) + (1 if running_s else 0),
        "points": len(points),
        "failed_points": sum(1 for p in points if p.get("status") != "ok"),
        "gpu_s": wall,
        "engine_start": phases["engine_start"] + phases["process"] + phases["teardown"],
        "warmup": phases["warmup"],
        "measure": phases["measure"],
        "idle": max(wall - in_phases, 0.0),
        "phases": phases,
        "estimated": sorted(estimated),
        "notes": notes,
    }
    if "wall" in estimated:
        row["estimated"] = sorted(estimated | {"idle"})
    return row


def read_state(run_dir: str | Path) -> dict:
    f = Path(run_dir) / "run.json"
    try:
        return json.loads(f.read_text()) if f.is_file() else {}
    except json.JSONDecodeError:
        return {}


def run_cost(run_dir: str | Path, now: float | None = None) -> list[dict]:
    """One row per notebook of the run (those run, then any other folder holding points), and
    the runner's own row (``runner_cost``, its live seconds up to ``now`` where this process is
    the runner)."""

    run_dir = Path(run_dir)
    state = read_state(run_dir)
    names = list(state.get("notebooks") or {})
    for d in sorted(p for p in run_dir.iterdir() if p.is_dir()) if run_dir.is_dir() else []:
        if d.name not in names and point_files(d):
            names.append(d.name)
    order = {n: i for i, n in enumerate(NOTEBOOKS)}
    names.sort(key=lambda n: (order.get(n, len(order)), n))
    rows = [notebook_cost(run_dir, n, state) for n in names]
    runner = runner_cost(state, now)
    return rows + [runner] if runner else rows


RUNNER_ROW = "runner, outside notebooks"


def _this_process_start() -> float | None:
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # psutil comes with vLLM; without it nothing is read as live
        return None


def live_seconds(proc: dict, now: float | None = None) -> float:
    """A runner record's seconds; if this process is that runner, still running (it reads its
    own record while it writes the report), its seconds up to ``now``. The runner started as
    ``python -m tunebook run`` counts from its process start, recorded (to the second) in
    ``started``; no other process has that start."""
    recorded = float(proc.get("seconds") or 0.0)
    began = _this_process_start()
    try:
        started = dt.datetime.fromisoformat(str(proc.get("started"))).timestamp()
    except ValueError:
        return recorded
    if began is None or int(began) != int(started):
        return recorded
    return max(recorded, (time.time() if now is None else now) - began)


def runner_cost(state: dict, now: float | None = None) -> dict | None:
    """The runner processes' own seconds outside the notebooks' calls (start-up, the profile
    check, the report, shut-down after a stop), as a row whose time is all idle; None for runs
    whose ``run.json`` predates the record. The runner reading its own record (``live_seconds``)
    counts its seconds up to ``now``."""
    procs = [p for p in state.get("runner") or [] if p.get("seconds") is not None]
    if not procs:
        return None
    outside = sum(max(live_seconds(p, now) - float(p.get("notebook_s") or 0.0), 0.0) for p in procs)
    return {
        "notebook": RUNNER_ROW,
        "calls": len(procs),
        "points": 0,
        "failed_points": 0,
        "gpu_s": outside,
        **dict.fromkeys(("engine_start", "warmup", "measure"), 0.0),
        "idle": outside,
        "phases": dict.fromkeys(PHASES, 0.0),
        "estimated": [],
        "notes": [],
    }


def warm_up_text(state: dict) -> str:
    """What the runner's background warm-ups did (``runner.start_warm_up``), one line each; ""
    where none ran. Their seconds overlap the runner's and the first notebook's, so they are in
    no row of the table."""
    lines = []
    for p in state.get("runner") or []:
        w = p.get("warm_up")
        if not w:
            continue
        if w.get("resolved"):
            lines.append(
                f"model inspection cached in the background ({', '.join(w['resolved'])}):"
                f" {float(w['seconds']):.1f} s, done {float(w['ended_after_s']):.0f} s after the"
                " runner started"
            )
        else:
            lines.append(
                f"model inspection warm-up of {', '.join(w.get('models') or [])} did not complete"
                f" (exit code {w.get('returncode')})"
            )
    return "\n".join(lines)


def start_kind(p: dict) -> str:
    """How a point's engine started, in words: the process that holds it and how it was made."""
    env = p.get("env") or {}
    if p.get("mode") == "served":
        server = env.get("server_start") or "start not recorded"
        core = env.get("engine_core")
        n = env.get("replicas") or 1
        what = f"vllm serve x{n}" if n > 1 else "vllm serve"
        return f"{what} ({server}" + (f", engine core {core})" if core else ")")
    how = env.get("process_start")
    return f"in-process ({how} point process)" if how else "in-process (in the kernel)"


# A launch that waited this long waited for its launcher's imports (a ready one answers in
# milliseconds).
LAUNCHER_WAIT_S = 1.0


def starts(run_dir: str | Path, notebook: str | None = None) -> list[dict]:
    """Every engine start of a run (or of one notebook), grouped by how it started: count and
    seconds (start plus stop, process start included). A point that reused another's start
    (``shared_start``) and a point that failed before its engine was up are not starts."""
    run_dir = Path(run_dir)
    groups: dict[str, list[float]] = {}
    waits: dict[str, list[float]] = {}
    folders = sorted(x for x in run_dir.iterdir() if x.is_dir()) if run_dir.is_dir() else []
    for d in [x for x in folders if notebook in (None, x.name)]:
        for p in point_files(d):
            secs = p.get("seconds")
            if p.get("shared_start") or not isinstance(secs, dict) or not secs.get("engine_start"):
                continue
            s = sum(float(secs.get(k) or 0.0) for k in ("engine_start", "process", "teardown"))
            groups.setdefault(start_kind(p), []).append(s)
            wait = float((p.get("env") or {}).get("launcher_wait_s") or 0.0)
            if wait >= LAUNCHER_WAIT_S:
                waits.setdefault(start_kind(p), []).append(wait)
    rows = []
    for kind, xs in sorted(groups.items()):
        rows.append(
            {
                "kind": kind,
                "starts": len(xs),
                "median_s": statistics.median(xs),
                "min_s": min(xs),
                "max_s": max(xs),
                "total_s": sum(xs),
                "launcher_waits": len(waits.get(kind, [])),
                "launcher_wait_s": sum(waits.get(kind, [])),
            }
        )
    return rows


def starts_table(rows: list[dict]) -> str:
    if not rows:
        return "engine starts: none recorded with per-phase seconds"
    lines = ["engine starts (start + stop, seconds):"]
    for r in rows:
        waited = (
            f"; {r['launcher_waits']} of them waited {r['launcher_wait_s']:.0f} s for their"
            " launcher's imports"
            if r.get("launcher_waits")
            else ""
        )
        lines.append(
            f"  {r['kind']}: {r['starts']} start(s), median {r['median_s']:.1f}"
            f" [{r['min_s']:.1f}-{r['max_s']:.1f}], {r['total_s']:.0f} in all{waited}"
        )
    return "\n".join(lines)


# vLLM's engine log, per engine start: how long torch.compile took, and whether it compiled
# afresh (it then saves what it compiled) or loaded vLLM's compile cache.
_COMPILE_TOOK = re.compile(r"torch\.compile took ([0-9.]+) s in total")
_COMPILED_AFRESH = ("saved AOT compiled function", "Compiling a graph for")


def _log_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
        return (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode(errors="replace")
    except (OSError, EOFError, gzip.BadGzipFile):
        return ""


def compiles(run_dir: str | Path, notebook: str | None = None) -> list[dict]:
    """Every torch.compile of a run's engines (each replica's too), from the engine logs kept in
    the run folder: ``{"log", "seconds", "cached"}``. ``cached`` is False when the engine compiled
    afresh, the cost a node pays once per configuration and a node with a warm cache does not."""
    run_dir = Path(run_dir)
    folders = sorted(x for x in run_dir.iterdir() if x.is_dir()) if run_dir.is_dir() else []
    out = []
    for d in [x for x in folders if notebook in (None, x.name)]:
        for log in sorted([*d.rglob("*.log"), *d.rglob("*.log.gz")]):
            afresh = False
            for line in _log_text(log).splitlines():
                if any(m in line for m in _COMPILED_AFRESH):
                    afresh = True
                elif m := _COMPILE_TOOK.search(line):
                    rel = str(log.relative_to(run_dir))
                    out.append({"log": rel, "seconds": float(m.group(1)), "cached": not afresh})
                    afresh = False
    return out


def compiles_text(rows: list[dict]) -> str:
    """One line: compiles afresh against cache loads, and what a warm cache would have saved
    (each fresh compile's seconds less the median cache load). Empty without compiles (an eager
    engine, as on CPU)."""
    if not rows:
        return ""
    fresh = [r["seconds"] for r in rows if not r["cached"]]
    hits = [r["seconds"] for r in rows if r["cached"]]
    text = f"torch.compile: {len(rows)} run(s) in the engine logs"
    if fresh:
        text += (
            f"; {len(fresh)} compiled afresh ({min(fresh):.1f}-{max(fresh):.1f} s,"
            f" {sum(fresh):.0f} in all)"
        )
    if hits:
        text += f"; {len(hits)} loaded the compile cache (median {statistics.median(hits):.1f} s)"
    if fresh and hits:
        saved = sum(fresh) - len(fresh) * statistics.median(hits)
        text += f": a warm cache would have saved about {saved:.0f} s"
    return text


def total(rows: list[dict]) -> dict:
    out = {"notebook": "total", "calls": sum(r["calls"] for r in rows)}
    for k in ("points", "failed_points", "gpu_s", *CATEGORIES):
        out[k] = sum(r[k] for r in rows)
    out["estimated"] = sorted({e for r in rows for e in r["estimated"]})
    out["notes"] = []
    return out


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


def table(rows: list[dict], label: str = "GPU-seconds") -> str:
    """A text table: device-seconds per notebook (``label``: ``seconds_label``) and their split;
    estimated figures marked '~'."""
    if not rows:
        return "no notebooks and no points in this run folder"
    cols = [label.replace("-seconds", "-s"), *(LABELS[c] for c in CATEGORIES), "points"]
    body = []
    for r in [*rows, total(rows)]:
        est = set(r["estimated"])
        cells = [("~" if "wall" in est else "") + f"{r['gpu_s']:.0f}"]
        for k in CATEGORIES:
            cells.append(("~" if k in est else "") + f"{r[k]:.0f} ({_pct(r[k], r['gpu_s'])})")
        cells.append(
            f"{r['points']}" + (f" ({r['failed_points']} failed)" if r["failed_points"] else "")
        )
        body.append([r["notebook"], *cells])
    widths = [max(len(x) for x in col) for col in zip(["notebook", *cols], *body, strict=True)]

    def line(cells):
        first = cells[0].ljust(widths[0])
        return "  ".join([first, *(c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))])

    lines = [line(["notebook", *cols]), "-" * (sum(widths) + 2 * len(cols))]
    lines += [line(b) for b in body]
    notes = [f"{r['notebook']}: {n}" for r in rows for n in r["notes"]]
    if any(r["estimated"] for r in rows):
        notes.insert(
            0,
            ESTIMATED_NOTE + "; idle is what the recorded wall time leaves",
        )
    return "\n".join(lines + ([""] + notes if notes else []))


def figure(rows: list[dict], title: str | None = None, label: str = "device-seconds"):
    """Stacked bars: each notebook's device time split into engine start, warm-up, measurement,
    idle (``label``: ``seconds_label`` of the run; the title says it unless given)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    names = [r["notebook"] for r in rows]
    for c in CATEGORIES:
        fig.add_bar(
            x=names,
            y=[round(r[c], 1) for r in rows],
            name=LABELS[c],
            hovertemplate="%{x}: %{y:.0f} s " + LABELS[c] + "<extra></extra>",
        )
    fig.update_layout(
        title=title or f"{label} per notebook",
        barmode="stack",
        yaxis_title=label,
        template="plotly_white",
        legend_orientation="h",
    )
    return fig


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="tunebook cost", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", help="a run folder, e.g. runs/<run-id>")
    ap.add_argument("--json", action="store_true", help="rows as JSON instead of a table")
    args = ap.parse_args(argv)
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"no run folder {run_dir}")
    rows = run_cost(run_dir)
    if args.json:
        print(json.dumps([*rows, total(rows)] if rows else [], indent=1))
    else:
        platform = run_platform(run_dir)
        label = seconds_label(platform)
        print(
            f"run {run_dir.name}: device time ({label} = wall time holding the"
            f" {device_name(platform)})"
        )
        print(table(rows, label))
        print()
        print(starts_table(starts(run_dir)))
        if text := compiles_text(compiles(run_dir)):
            print(text)
        if text := warm_up_text(read_state(run_dir)):
            print(text)
    return 0
