"""GPU-seconds: every call of every notebook is counted, and the split into engine start, warm-up,
measurement and idle adds up to the wall time. Old run folders (points without ``seconds``, a
``run.json`` with the last call only) get estimated figures, said so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tunebook.core.results import SweepDir
from tunebook.workbench import cost

REPO = Path(__file__).resolve().parents[2]


def _point(pid: str, seconds: dict | None, wall: float, **extra) -> dict:
    p = {"point_id": pid, "config": pid, "repeat": 0, "status": "ok", "wall_s": wall, **extra}
    if seconds is not None:
        p["seconds"] = seconds
    return p


def test_split_adds_up_and_calls_accumulate(tmp_path):
    sd = SweepDir(tmp_path / "02_block_size_sweep" / "s")
    secs = {"engine_start": 3.0, "warmup": 1.0, "measure": 4.0, "teardown": 0.5, "process": 1.5}
    sd.write("a", _point("a", secs, 10.5))
    sd.write("b", _point("b", secs, 10.5))
    state = {
        "notebooks": {
            "02_block_size_sweep": {
                "status": "ok",
                "calls": [{"seconds": 20.0, "status": "failed"}, {"seconds": 15.0, "status": "ok"}],
            }
        }
    }
    (tmp_path / "run.json").write_text(json.dumps(state))
    (r,) = cost.run_cost(tmp_path)
    assert r["calls"] == 2 and r["points"] == 2
    assert r["gpu_s"] == pytest.approx(35.0)  # both calls, not the last one
    assert r["engine_start"] == pytest.approx(2 * (3.0 + 1.5 + 0.5))
    assert r["warmup"] == pytest.approx(2.0) and r["measure"] == pytest.approx(8.0)
    assert r["idle"] == pytest.approx(35.0 - 20.0)
    assert sum(r[c] for c in cost.CATEGORIES) == pytest.approx(r["gpu_s"])
    assert r["estimated"] == []
    assert "~" not in cost.table([r])


def test_old_run_folder_is_estimated_and_says_so():
    """runs/h200-20261202: points without seconds, run.json with one entry per notebook."""
    rows = cost.run_cost(REPO / "runs" / "h200-20261202")
    assert [r["notebook"] for r in rows][:5] == [
        "00_baseline",
        "01_kv_cache_sizing",
        "02_block_size_sweep",
        "03_prefill_scaling",
        "04_assemble_config",
    ]
    for r in rows:
        assert r["gpu_s"] > 0 and min(r[c] for c in cost.CATEGORIES) >= 0
        assert sum(r[c] for c in cost.CATEGORIES) == pytest.approx(r["gpu_s"], abs=1e-6)
        assert {"measure", "warmup", "wall"} <= set(r["estimated"])
        assert r["notes"]  # which record is incomplete
    text = cost.table(rows)
    assert "~ estimated" in text and "run.json holds the last call only" in text


def test_cost_command_on_an_old_run_folder():
    r = subprocess.run(
        [sys.executable, "-m", "tunebook", "cost", str(REPO / "runs" / "h200-20261202")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "04_assemble_config" in r.stdout and "~ estimated" in r.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "tunebook", "cost", "/nonexistent/run"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "no run folder" in bad.stderr and "Traceback" not in bad.stderr


def test_figure_stacks_the_four_parts(tmp_path):
    rows = [
        {
            "notebook": "00_x",
            "gpu_s": 10.0,
            "engine_start": 4.0,
            "warmup": 1.0,
            "measure": 3.0,
            "idle": 2.0,
        }
    ]
    d = cost.figure(rows).to_dict()
    assert d["layout"]["barmode"] == "stack"
    assert [t["name"] for t in d["data"]] == [cost.LABELS[c] for c in cost.CATEGORIES]
    assert sum(t["y"][0] for t in d["data"]) == pytest.approx(10.0)


# --------------------------------------------------------------------------- a real run
NOTEBOOK_CELLS = [
    "import tunebook.workbench.notebook\n\nrun_dir = tunebook.workbench.notebook.begin(globals(), '00_baseline')",
    "import os\n"
    "from tunebook.workbench.workbook import Workbook\n"
    "wb = Workbook(run_dir, '00_baseline', 'tiny-ernie', engine_settings, {'VLLM_ENABLE_V1_MULTIPROCESSING': '0'}, isolate=False)\n"
    "wb.sweep('s', {'a': {}, 'b': {}}, {'kind': 'fixed', 'num_requests': 4, 'prompt_len': 16, 'output_len': 6, 'seed': 1}, warmup_requests=1)\n"
    "flag = os.path.join(run_dir, 'stop-once')\n"
    "if not os.path.exists(flag):\n"
    "    open(flag, 'w').close()\n"
    "    raise RuntimeError('stopped after the first sweep, to be resumed')\n"
    "wb.sweep('t', {'c': {}}, {'kind': 'fixed', 'num_requests': 4, 'prompt_len': 16, 'output_len': 6, 'seed': 2}, warmup_requests=1)",
    "tunebook.workbench.notebook.end(run_dir, '00_baseline')",
]
PARAMS = (
    "run_dir: str = ''  # where results go\n"
    "engine_settings: dict = {'enforce_eager': True, 'kv_cache_memory_bytes': 8388608, 'max_model_len': 512}  # settings\n"
)


@pytest.mark.engine
def test_gpu_seconds_of_a_resumed_run_add_up_to_its_wall_time(tmp_path, monkeypatch):
    """A notebook stopped after its first sweep, then resumed: run.json keeps both calls, the
    points keep their seconds, and the split adds up to the wall time of both calls. The idle
    part is checked against the points' own clocks: the wall time of the calls covers every
    point (from the progress file's end times and each point's wall_s), and the phases cover
    most of each point."""
    import nbformat

    from tunebook.core.errors import NotebookFailed
    from tunebook.workbench import console, profiles
    from tunebook.workbench.runner import run_workbook

    nb_dir = tmp_path / "notebooks"
    nb_dir.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "py"}
    params = nbformat.v4.new_code_cell(PARAMS)
    params.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# q"), params]
    nb.cells += [nbformat.v4.new_code_cell(c) for c in NOTEBOOK_CELLS]
    nbformat.write(nb, nb_dir / "00_baseline.ipynb")
    monkeypatch.setattr(profiles, "NOTEBOOKS_DIR", nb_dir)
    monkeypatch.setattr("tunebook.workbench.runner.NOTEBOOKS_DIR", nb_dir)
    prof = tmp_path / "p.yaml"
    prof.write_text("common: {}\n")
    runs = tmp_path / "runs"
    import time

    t0 = time.time()
    with pytest.raises(NotebookFailed, match="to be resumed"):
        run_workbook(str(prof), "r", ["00"], runs_dir=runs, report=False, log=lambda _: None)
    t1 = time.time()
    run_dir = run_workbook(
        str(prof), "r", ["00"], runs_dir=runs, resume=True, report=False, log=lambda _: None
    )
    t2 = time.time()
    state = json.loads((run_dir / "run.json").read_text())
    calls = state["notebooks"]["00_baseline"]["calls"]
    assert [c["status"] for c in calls] == ["failed", "ok"]

    r, runner = cost.run_cost(run_dir)
    wall = sum(c["seconds"] for c in calls)
    assert r["gpu_s"] == pytest.approx(wall)
    # The runner's own record covers each whole call of run_workbook (its profile check, papermill
    # around the kernel), and the notebook's calls are part of it: nothing is counted twice.
    procs = state["runner"]
    assert len(procs) == 2 and runner["notebook"] == cost.RUNNER_ROW and runner["calls"] == 2
    for p, c, (a, b) in zip(procs, calls, [(t0, t1), (t1, t2)], strict=True):
        assert p["notebook_s"] == pytest.approx(c["seconds"])
        # Contained in the test's own measure of the call (the same clock), and containing the
        # notebook's: nothing here depends on how fast the machine is.
        assert c["seconds"] < p["seconds"] <= b - a + 0.01
    assert r["gpu_s"] + runner["gpu_s"] == pytest.approx(sum(p["seconds"] for p in procs))
    assert cost.total([r, runner])["idle"] == pytest.approx(r["idle"] + runner["gpu_s"])
    assert r["points"] == 3 and r["estimated"] == []
    assert sum(r[c] for c in cost.CATEGORIES) == pytest.approx(wall, rel=1e-9)

    points = cost.point_files(run_dir / "00_baseline")
    for p in points:
        phases = sum(p["seconds"].values())
        assert set(p["seconds"]) >= {"engine_start", "warmup", "measure", "teardown"}
        assert phases <= p["wall_s"] + 0.05  # phases never double-count
        assert phases >= 0.8 * p["wall_s"]  # and hold most of the point
    events = [
        e
        for e in console.read_progress(run_dir / "00_baseline" / console.PROGRESS_FILE)
        if e["event"] == "point"
    ]
    assert len(events) == 3
    # Every point lies inside one of the two calls (their recorded start and seconds), so the
    # calls' wall time covers all of the points and idle holds every gap between them.
    import datetime as dt

    spans = [(dt.datetime.fromisoformat(c["started"]).timestamp(), c["seconds"]) for c in calls]
    for e in events:
        assert any(
            t0 - 1.0 <= e["t"] - e["wall_s"] and e["t"] <= t0 + secs + 1.0 for t0, secs in spans
        ), (e, spans)
    busy = sum(e["wall_s"] for e in events)
    assert busy <= wall + 1.0
    assert r["idle"] >= wall - busy - 0.05
    # The notebook's last cell printed the same figures for the call it ran in.
    out = json.loads((run_dir / "00_baseline.ipynb").read_text())
    printed = "".join(
        "".join(o.get("text", ""))
        for c in out["cells"]
        for o in c.get("outputs", [])
        if o.get("output_type") == "stream"
    )
    assert "CPU time of 00_baseline over 2 calls" in printed  # a CPU run: no "GPU" in its words
    assert "device-seconds (" in printed and "GPU" not in printed.split("CPU time of")[1][:120]
    assert "engine starts (start + stop, seconds):" in printed
    assert "engine log:" in printed
    # vLLM's own lines went to the engine log, not into the cells
    assert "(MainProcess" not in printed and "The global random seed" not in printed
    log = (run_dir / "00_baseline" / "logs" / "engine.log").read_text()
    assert "The global random seed" in log


def test_the_cli_counts_the_runner_from_its_process_start():
    import time

    from tunebook.__main__ import _process_start

    began = _process_start()
    assert began is not None and began < time.time() - 0.1  # this process began before the test


def test_starts_are_grouped_by_how_they_started(tmp_path):
    secs = {"engine_start": 10.0, "warmup": 1.0, "measure": 4.0, "teardown": 1.0, "process": 0.0}
    served = {"server_start": "forked", "engine_core": "forked", "replicas": 1}
    sd = SweepDir(tmp_path / "00_baseline" / "s")
    # b's launch waited for its launcher's imports; a's did not (ms: a ready launcher)
    waited = {**served, "launcher_wait_s": 9.5}
    sd.write("a", _point("a", secs, 16.0, mode="served", env={**served, "launcher_wait_s": 0.01}))
    sd.write("b", _point("b", {**secs, "engine_start": 20.0}, 26.0, mode="served", env=waited))
    # reused a's server: not a start
    sd.write("c", _point("c", {**secs, "engine_start": 0.0}, 5.0, mode="served", env=served))
    sd.write("d", _point("d", secs, 16.0, mode="served", env=served, shared_start="a"))
    sd = SweepDir(tmp_path / "01_kv_cache_sizing" / "s")
    sd.write("e", _point("e", {**secs, "process": 3.0}, 19.0, env={"process_start": "forked"}))
    sd.write("f", _point("f", None, 30.0, engine_start_s=25.0))  # no per-phase seconds
    rows = {r["kind"]: r for r in cost.starts(tmp_path)}
    assert set(rows) == {
        "vllm serve (forked, engine core forked)",
        "in-process (forked point process)",
    }
    r = rows["vllm serve (forked, engine core forked)"]
    assert r["starts"] == 2 and r["median_s"] == pytest.approx(16.0)  # (11 + 21) / 2
    assert (r["min_s"], r["max_s"], r["total_s"]) == pytest.approx((11.0, 21.0, 32.0))
    assert rows["in-process (forked point process)"]["total_s"] == pytest.approx(14.0)
    assert (r["launcher_waits"], r["launcher_wait_s"]) == (1, pytest.approx(9.5))
    assert rows["in-process (forked point process)"]["launcher_waits"] == 0
    printed = cost.starts_table(cost.starts(tmp_path))
    assert "2 start(s), median 16.0 [11.0-21.0], 32 in all; 1 of them waited 10 s" in printed
    only = cost.starts(tmp_path, "01_kv_cache_sizing")
    assert [r["kind"] for r in only] == ["in-process (forked point process)"]


# Lines as vLLM 0.26 writes them (runs/h100-20261206c), one engine compiling afresh, the next
# loading what it saved.
_AFRESH = (
    "(EngineCore pid=1) INFO [backends.py:393] Compiling a graph for compile range (1, 8192) takes 7.46 s\n"
    "(EngineCore pid=1) INFO [decorators.py:708] saved AOT compiled function to /c/torch_aot_compile/x\n"
    "(EngineCore pid=1) INFO [monitor.py:53] torch.compile took 13.88 s in total\n"
)
_CACHED = (
    "(EngineCore pid=2) INFO [decorators.py:311] Directly load AOT compilation from path /c/x/model\n"
    "(EngineCore pid=2) INFO [monitor.py:53] torch.compile took 2.51 s in total\n"
)


def test_compiles_afresh_and_from_the_cache_and_what_a_warm_cache_saves(tmp_path):
    import gzip

    logs = tmp_path / "02_nb" / "sweep" / "logs"
    logs.mkdir(parents=True)
    (logs / "a-r0.log").write_text(_AFRESH + _CACHED)  # two engines in one log, in turn
    (logs / "a-r1.log.gz").write_bytes(gzip.compress((_CACHED * 2).encode()))
    (logs / "eager.log").write_text("INFO init engine took 1.2 s\n")  # no compile: not counted
    rows = cost.compiles(tmp_path)
    assert [(r["seconds"], r["cached"]) for r in rows] == [
        (13.88, False),
        (2.51, True),
        (2.51, True),
        (2.51, True),
    ]
    assert cost.compiles_text(rows) == (
        "torch.compile: 4 run(s) in the engine logs; 1 compiled afresh (13.9-13.9 s, 14 in all);"
        " 3 loaded the compile cache (median 2.5 s): a warm cache would have saved about 11 s"
    )
    assert cost.compiles(tmp_path, "01_other") == [] and cost.compiles_text([]) == ""


def test_compiles_of_a_kept_gpu_run():
    # The H100 run's README counts these by hand: 62 compiles, 9 afresh (one per configuration
    # new to the node, 9.2-13.9 s), 53 from the cache (2.4-3.2 s).
    rows = cost.compiles(REPO / "runs" / "h100-20261206c")
    fresh = sorted(r["seconds"] for r in rows if not r["cached"])
    hits = [r["seconds"] for r in rows if r["cached"]]
    assert len(rows) == 62 and len(fresh) == 9 and (fresh[0], fresh[-1]) == (9.22, 13.88)
    assert len(hits) == 53 and 2.4 <= min(hits) and max(hits) <= 3.2
    assert "a warm cache would have saved about 70 s" in cost.compiles_text(rows)


def test_the_background_warm_up_is_said_below_the_table_and_adds_to_no_row():
    state = cost.read_state(REPO / "runs" / "h100-20261206d")
    assert cost.warm_up_text(state) == (
        "model inspection cached in the background (ernie-4.5-0.3b-pt): 36.9 s, done 38 s after"
        " the runner started"
    )
    # its 36.9 s ran beside the runner's own: the runner row is the runner's wall time alone
    rows = cost.run_cost(REPO / "runs" / "h100-20261206d")
    runner = next(r for r in rows if r["notebook"] == cost.RUNNER_ROW)
    assert runner["gpu_s"] == pytest.approx(1212.272 - 1193.530, abs=0.01)
    assert cost.warm_up_text({"runner": [{"seconds": 5.0}]}) == ""
    w = {"models": ["m"], "resolved": [], "seconds": 0.0, "returncode": 1}
    assert cost.warm_up_text({"runner": [{"warm_up": w}]}) == (
        "model inspection warm-up of m did not complete (exit code 1)"
    )


def test_a_cpu_run_is_told_in_device_seconds_and_a_gpu_run_in_gpu_seconds(tmp_path, capsys):
    """A CPU run holds no GPU: its table, its chart and the command's first line say
    device-seconds; a GPU run keeps GPU-seconds."""
    sd = SweepDir(tmp_path / "00_baseline" / "s")
    secs = {"engine_start": 3.0, "warmup": 1.0, "measure": 4.0, "teardown": 0.5, "process": 1.5}
    sd.write("a", _point("a", secs, 10.5, env={"platform": "cpu"}))
    assert cost.run_platform(tmp_path) == "cpu"
    assert cost.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "device-seconds = wall time holding the CPU" in out and "device-s" in out
    assert "GPU" not in out
    assert cost.main([str(REPO / "runs" / "h100-20261206e")]) == 0
    out = capsys.readouterr().out
    assert "GPU-seconds = wall time holding the GPU" in out and "GPU-s" in out
    fig = cost.figure(cost.run_cost(tmp_path), label="device-seconds").to_dict()
    assert fig["layout"]["title"]["text"] == "device-seconds per notebook"
    assert fig["layout"]["yaxis"]["title"]["text"] == "device-seconds"


def test_a_runner_record_counts_up_to_now_only_in_the_runners_own_process(tmp_path):
    """The runner reads run.json while it writes the report: its own record then counts up to
    that moment. Any other process (the cost command, later) reads the record as written."""
    import datetime as dt

    import psutil

    began = psutil.Process().create_time()
    started = dt.datetime.fromtimestamp(began).isoformat(timespec="seconds")
    state = {"runner": [{"started": started, "seconds": 5.0, "notebook_s": 1.0}]}
    (tmp_path / "run.json").write_text(json.dumps(state))
    (runner,) = cost.run_cost(tmp_path, now=began + 100.0)
    assert runner["gpu_s"] == pytest.approx(99.0)  # this process is that runner
    code = (
        "import sys; from tunebook.workbench import cost;"
        " print(cost.run_cost(sys.argv[1])[-1]['gpu_s'])"
    )
    other = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert float(other.stdout) == pytest.approx(4.0), other.stderr
    # a record of another start is never extended
    state["runner"][0]["started"] = "2000-01-01T00:00:00"
    (tmp_path / "run.json").write_text(json.dumps(state))
    assert cost.run_cost(tmp_path, now=began + 100.0)[0]["gpu_s"] == pytest.approx(4.0)
