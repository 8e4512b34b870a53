"""Reliability: bad inputs are found before any engine starts, and nothing a point or a sweep
runner does when killed can lose finished results or leave an engine process behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ENGINE_ENV, ENGINE_SETTINGS, FP8_KV, engine_processes, kill_processes

from tunebook.core.errors import ConfigError
from tunebook.core.points import Point
from tunebook.engine import interrupt, isolation
from tunebook.measure import execute as engine
from tunebook.measure.sweep import make_points, run_sweep
from tunebook.workbench import profiles
from tunebook.workbench.runner import claim_run_dir, new_run_id

REPO = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- params files
PARAMS_CELL = """\
model: str = "tiny-ernie"
repeats: int = 2
slo_ttft_ms: float = 500.0
engine_settings: dict = {}
engine_env: dict[str, str] = {}
isolate: bool = True
run_dir: str | None = None
"""


def _notebook(path: Path, params_src: str | None = PARAMS_CELL) -> Path:
    cells = [{"cell_type": "markdown", "metadata": {}, "source": ["# question"]}]
    if params_src is not None:
        cells.append(
            {
                "cell_type": "code",
                "metadata": {"tags": ["parameters"]},
                "source": params_src.splitlines(keepends=True),
                "outputs": [],
                "execution_count": None,
            }
        )
    path.write_text(
        json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    )
    return path


@pytest.fixture
def nb_dir(tmp_path, monkeypatch) -> Path:
    """A notebooks/ folder with one small 00_baseline notebook (the real ones are elsewhere)."""
    d = tmp_path / "notebooks"
    d.mkdir()
    _notebook(d / "00_baseline.ipynb")
    monkeypatch.setattr(profiles, "NOTEBOOKS_DIR", d)
    return d


def _profile(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "prof.yaml"
    p.write_text(text)
    return p


def test_missing_params_file(tmp_path):
    with pytest.raises(ConfigError, match=r"no params file .*nope\.yaml"):
        profiles.load_profile(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match=r"no params file .*no-such-profile\.yaml; profiles here"):
        profiles.load_profile("no-such-profile")


@pytest.mark.parametrize(
    "text,match",
    [
        ("common: [unclosed\n", r"malformed YAML"),
        ("common:\n  model: a\n   bad: indent\n", r"malformed YAML"),
        ("- a\n- b\n", r"must be a mapping of sections"),
        ("05_nonexistent: {}\n", r"unknown section\(s\) \['05_nonexistent'\]; valid: common"),
        ("common: 3\n", r"section 'common' must be a mapping"),
    ],
)
def test_malformed_params_files(tmp_path, text, match):
    p = _profile(tmp_path, text)
    with pytest.raises(ConfigError, match=match) as err:
        profiles.load_profile(p)
    assert str(p) in str(err.value)  # the message names the file


def test_yaml_python_tags_are_rejected_and_never_run(tmp_path):
    marker = tmp_path / "pwned"
    p = _profile(tmp_path, f'common: !!python/object/apply:os.system ["touch {marker}"]\n')
    with pytest.raises(ConfigError, match="malformed YAML"):
        profiles.load_profile(p)
    assert not marker.exists()


def test_notebook_params_merge_and_check(tmp_path, nb_dir):
    prof = profiles.load_profile(
        _profile(tmp_path, "common:\n  repeats: 3\n  model: a\n00_baseline:\n  model: b\n")
    )
    assert profiles.notebook_params(prof, "00_baseline") == {"repeats": 3, "model": "b"}
    declared = profiles.notebook_parameters("00_baseline")
    assert declared["slo_ttft_ms"] == {"type": "float", "default": 500.0}
    # int for float, None for an Optional, dicts for dicts: fine
    ok = "common:\n  slo_ttft_ms: 300\n  run_dir: null\n  engine_env: {A: '1'}\n"
    profiles.notebook_params(profiles.load_profile(_profile(tmp_path, ok)), "00_baseline")


@pytest.mark.parametrize(
    "text,match",
    [
        (
            "common:\n  modle: tiny-ernie\n",
            r"'modle' is not a parameter of 00_baseline; did you mean 'model'\? Its param",
        ),
        (
            "00_baseline:\n  repeats: two\n",
            r"00_baseline.repeats = 'two' \(str\) does not match int",
        ),
        ("common:\n  repeats: 2.5\n", r"repeats = 2.5 \(float\) does not match int"),
        ("common:\n  repeats: true\n", r"repeats = True \(bool\) does not match int"),
        ("common:\n  isolate: 'no'\n", r"isolate = 'no' \(str\) does not match bool"),
        (
            "common:\n  engine_settings: [1]\n",
            r"engine_settings = \[1\] \(list\) does not match dict",
        ),
        ("common:\n  run_dir: 5\n", r"run_dir = 5 \(int\) does not match str \| None"),
    ],
)
def test_notebook_params_errors(tmp_path, nb_dir, text, match):
    p = _profile(tmp_path, text)
    prof = profiles.load_profile(p)
    with pytest.raises(ConfigError, match=match) as err:
        profiles.notebook_params(prof, "00_baseline")
    assert str(err.value).startswith(str(p))


def test_notebook_without_parameters_cell_or_missing(tmp_path, nb_dir):
    _notebook(nb_dir / "01_kv_cache_sizing.ipynb", params_src=None)
    prof = profiles.load_profile(_profile(tmp_path, "common: {}\n"))
    with pytest.raises(ConfigError, match="no cell tagged 'parameters'"):
        profiles.notebook_params(prof, "01_kv_cache_sizing")
    with pytest.raises(ConfigError, match=r"no notebook .*02_block_size_sweep\.ipynb"):
        profiles.notebook_params(prof, "02_block_size_sweep")


def test_shipped_profiles_parse():
    for name in profiles.available_profiles():
        prof = profiles.load_profile(name)
        assert set(prof) - {"_path"} <= {"common", *profiles.NOTEBOOKS, *profiles.META_KEYS}


def test_engine_base_is_the_profiles_common_engine():
    """The benchmarks run the same model and engine settings as the profile's notebooks."""
    assert profiles.engine_base("h200") == {"model": "ernie-4.5-0.3b-pt", "settings": {}}
    cpu = profiles.engine_base("cpu")
    assert cpu["model"] == "tiny-ernie"
    assert cpu["settings"]["kv_cache_memory_bytes"] == 64 * 2**20


# --------------------------------------------------------------------------- models and workloads
@pytest.fixture
def no_engine(monkeypatch):
    """Fail the test if anything tries to start an engine (in-process or isolated)."""

    real_popen = subprocess.Popen

    def boom(*a, **k):
        raise AssertionError("an engine was started")

    def popen(cmd, *a, **k):
        if "tunebook.measure.execute" in cmd:
            boom()
        return real_popen(cmd, *a, **k)

    monkeypatch.setattr(engine.Engine, "start", boom)
    monkeypatch.setattr(isolation.subprocess, "Popen", popen)
    monkeypatch.setenv("TUNEBOOK_LAUNCHER", "0")  # isolated children through the Popen above


@pytest.mark.vllm
def test_model_path_without_config_json(tmp_path, base_point, no_engine):
    d = tmp_path / "weights-only"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"")
    for isolate in (False, True):
        with pytest.raises(ConfigError, match=r"weights-only has no config\.json"):
            engine.run_point({**base_point, "model": str(d)}, isolate=isolate)


def _unsupported_model(tmp_path: Path) -> Path:
    from tunebook.core.model import resolve_model_dir

    cfg = json.loads((resolve_model_dir("tiny-ernie") / "config.json").read_text())
    cfg["architectures"] = ["NoSuchForCausalLM"]
    d = tmp_path / "nosuch"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.vllm
def test_unsupported_architecture_is_a_config_error_before_any_engine(
    tmp_path, base_point, run_dir, no_engine
):
    point = {**base_point, "model": str(_unsupported_model(tmp_path))}
    with pytest.raises(ConfigError, match=r"\['NoSuchForCausalLM'\], none of which vLLM 0\.\d+"):
        engine.prepare(point)
    for isolate in (False, True):
        with pytest.raises(ConfigError, match="NoSuchForCausalLM"):
            engine.run_point(point, isolate=isolate)
    pts = make_points(base_point, {"ok": {}, "bad": {"model": point["model"]}})
    with pytest.raises(ConfigError, match="NoSuchForCausalLM"):
        run_sweep(pts, run_dir, progress=False)
    assert not list(run_dir.glob("*.json"))  # not even the good point ran


@pytest.mark.vllm
def test_architecture_check_is_not_stricter_than_vllm(tmp_path, base_point):
    """Architectures vLLM can load stay accepted: native, Transformers fallback, remote code."""
    d = _unsupported_model(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    for archs, extra in (
        (["LlamaForCausalLM"], {}),
        (["NoSuchForCausalLM", "Ernie4_5ForCausalLM"], {}),
        (["Ernie4_5ForSequenceClassification"], {}),
        (["NoSuchForCausalLM"], {"auto_map": {"AutoModelForCausalLM": "m.NoSuchForCausalLM"}}),
    ):
        (d / "config.json").write_text(json.dumps({**cfg, "architectures": archs, **extra}))
        engine.prepare({**base_point, "model": str(d)})
    (d / "config.json").write_text(json.dumps({**cfg, "architectures": ["NoSuchForCausalLM"]}))
    engine.prepare({**base_point, "model": str(d), "settings": {"model_impl": "transformers"}})


@pytest.mark.vllm
def test_workload_too_long_for_max_model_len(base_point, no_engine):
    point = {
        **base_point,
        "workload": {"kind": "fixed", "num_requests": 2, "prompt_len": 500, "output_len": 20},
    }
    for isolate in (False, True):
        with pytest.raises(ConfigError, match=r"520 tokens, more than max_model_len 512"):
            engine.run_point(point, isolate=isolate)
    # without max_model_len the model's max_position_embeddings (4096) is the limit
    long = {**point, "settings": {}, "workload": {**point["workload"], "prompt_len": 4090}}
    with pytest.raises(ConfigError, match="max_model_len 4096"):
        engine.prepare(long)


def test_trust_remote_code_is_false_unless_set(base_point):
    assert Point.from_dict(base_point).engine_kwargs()["trust_remote_code"] is False
    assert Point.from_dict({**base_point, "trust_remote_code": True}).engine_kwargs()[
        "trust_remote_code"
    ]
    on = {**base_point, "settings": {**base_point["settings"], "trust_remote_code": True}}
    assert Point.from_dict(on).engine_kwargs()["trust_remote_code"] is True


# --------------------------------------------------------------------------- run folders
def test_run_ids_are_unique_and_never_share_folders(run_dir):
    ids = {new_run_id("cpu") for _ in range(50)}
    assert len(ids) == 50  # same second, same profile: still distinct
    a, b = sorted(ids)[:2]
    da, db = claim_run_dir(run_dir, a), claim_run_dir(run_dir, b)
    assert da != db and da.parent == db.parent == run_dir.resolve()
    assert json.loads((da / "run.json").read_text())["run_id"] == a


def test_a_run_folder_is_claimed_once(run_dir):
    d = claim_run_dir(run_dir, "r1")
    with pytest.raises(ConfigError, match="exists; pass --resume"):
        claim_run_dir(run_dir, "r1")
    assert claim_run_dir(run_dir, "r1", resume=True) == d
    (run_dir / "r2").mkdir()  # an empty folder made by hand: still claimable, once
    claim_run_dir(run_dir, "r2")
    with pytest.raises(ConfigError):
        claim_run_dir(run_dir, "r2")
    for bad in ("../r3", "a/b", ".r4"):
        with pytest.raises(ConfigError):
            claim_run_dir(run_dir, bad)
    assert sorted(p.name for p in run_dir.iterdir()) == ["r1", "r2"]


def test_concurrent_claims_of_one_id_give_one_winner(run_dir):
    results: list = []

    def claim():
        try:
            results.append(claim_run_dir(run_dir, "same"))
        except ConfigError as e:
            results.append(e)

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(isinstance(r, Path) for r in results) == 1


# --------------------------------------------------------------------------- killing engines
def _point(tiny_model, pid: str, **workload) -> dict:
    return {
        "point_id": pid,
        "model": tiny_model,
        "settings": {**ENGINE_SETTINGS, "max_model_len": 2048},
        "env": dict(ENGINE_ENV),
        "workload": {
            "kind": "fixed",
            "num_requests": 4,
            "prompt_len": 16,
            "output_len": 6,
            **workload,
        },
        "warmup_requests": 1,
    }


def _wait(cond, timeout_s: float, what: str, step: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(step)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.engine
def test_engine_killed_mid_point_fails_that_point_and_the_next_runs(tiny_model, tmp_path):
    long = _point(tiny_model, "long", num_requests=8, prompt_len=64, output_len=1500)
    progress = tmp_path / "long.progress.jsonl"
    pids: list[int] = []
    killed = threading.Event()

    def killer():
        # the engine is running a workload once the child reports metrics samples
        try:
            _wait(lambda: pids and progress.is_file() and progress.stat().st_size, 300, "progress")
        except AssertionError:
            return
        os.killpg(pids[0], signal.SIGKILL)
        killed.set()

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    try:
        res = engine.run_point(
            long,
            isolate=True,
            timeout_s=400,
            log_path=tmp_path / "long.log",
            progress_path=progress,
            on_spawn=pids.append,
        )
    finally:
        t.join(timeout=5)
        kill_processes(engine_processes())
    assert killed.is_set()
    assert res["status"] == "failed"
    assert "killed by signal 9" in res["error"], res["error"]
    assert res["point_id"] == "long" and "metrics" not in res
    assert engine_processes() == []

    nxt = engine.run_point(_point(tiny_model, "next"), isolate=True, timeout_s=300)
    assert nxt["status"] == "ok", nxt.get("error")
    assert nxt["metrics"]["num_requests"] == 4
    assert engine_processes() == []


@pytest.mark.engine
def test_isolated_point_past_its_timeout_is_failed_and_killed(tiny_model, tmp_path):
    # 1,500 decode steps: a process forked from a warm launcher can start the tiny engine and
    # finish a few short requests within the second.
    slow = _point(tiny_model, "slow", num_requests=8, prompt_len=64, output_len=1500)
    res = engine.run_point(slow, isolate=True, timeout_s=1, log_path=tmp_path / "slow.log")
    assert res["status"] == "failed" and res["error"].startswith("timed out after 1 s")
    assert engine_processes() == []


@pytest.mark.engine
def test_ctrl_c_while_waiting_on_an_isolated_point_kills_its_engine(tiny_model):
    pids: list[int] = []

    def interrupt(pid):
        pids.append(pid)
        _wait(lambda: engine_processes(), 30, "the engine child")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        engine.run_point(_point(tiny_model, "ctrl-c"), isolate=True, on_spawn=interrupt)
    assert pids and engine_processes() == []


SWEEP_SCRIPT = """\
import json, sys
from tunebook.measure.sweep import make_points, run_sweep

def main():
    out, mode, base, configs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
    run_sweep(make_points(base, configs), out, isolate=(mode == "isolated"), progress=False)

if __name__ == "__main__":
    main()
"""


def _sweep_cmd(tmp_path: Path, out: Path, mode: str, base: dict, configs: dict) -> list[str]:
    script = tmp_path / "sweep_script.py"
    script.write_text(SWEEP_SCRIPT)
    return [sys.executable, str(script), str(out), mode, json.dumps(base), json.dumps(configs)]


def _valid_points(out: Path) -> dict[str, dict]:
    """Every point file parses as JSON (a kill never leaves half a file) and no temp file remains."""
    assert not list(out.glob("*.tmp")) and not list(out.glob(".*.tmp"))
    return {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}


def _start(cmd: list[str], log) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)


def _interrupt_after(runner, out: Path, point_file: str, sig: int, logf: Path, isolated: bool):
    """Send ``sig`` to the runner once ``point_file`` is written (and, if isolated, once the next
    point's engine child is up); return the point files as they stood after the kill."""
    _wait(lambda: (out / point_file).is_file() or runner.poll() is not None, 400, point_file)
    assert runner.poll() is None, logf.read_text()[-3000:]
    if isolated:
        _wait(lambda: engine_processes(), 60, "the next point's engine")
    runner.send_signal(sig)
    assert runner.wait(timeout=120) != 0  # interrupted, not finished
    done = _valid_points(out)
    assert all(p["status"] == "ok" for p in done.values())
    # no engine outlives its runner, even one killed with SIGKILL (the child notices)
    _wait(lambda: not engine_processes(), 30, "engine processes to go", step=0.25)
    return done


@pytest.mark.engine
def test_sweep_runner_interrupted_by_sigint_and_sigkill_resumes(tiny_model, tmp_path):
    """Run 1 (in-process engines) gets SIGINT after its first point, run 2 (isolated engines)
    resumes and gets SIGKILL after its first point with the next engine running, run 3 finishes.
    Points written before each kill stay byte for byte as they were."""
    base = _point(tiny_model, "x")
    del base["point_id"]
    configs = {
        "a": {"settings": {"block_size": 32}},
        "b": {"settings": {"block_size": 64}},
        "c": {"settings": {"block_size": 32, "kv_cache_dtype": FP8_KV}},
    }
    out = tmp_path / "sweep"
    logf = tmp_path / "runner.log"
    log = open(logf, "w")
    runner = None
    try:
        runner = _start(_sweep_cmd(tmp_path, out, "inprocess", base, configs), log)
        done1 = _interrupt_after(runner, out, "a-r0.json", signal.SIGINT, logf, isolated=False)
        assert "a-r0" in done1 and "c-r0" not in done1
        a_text = (out / "a-r0.json").read_text()

        runner = _start(_sweep_cmd(tmp_path, out, "isolated", base, configs), log)
        done2 = _interrupt_after(runner, out, "b-r0.json", signal.SIGKILL, logf, isolated=True)
        assert sorted(done2) == ["a-r0", "b-r0"]
        assert (out / "a-r0.json").read_text() == a_text  # resume skipped it
        b_text = (out / "b-r0.json").read_text()

        rerun = subprocess.run(
            _sweep_cmd(tmp_path, out, "inprocess", base, configs),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            timeout=500,
        )
        assert rerun.returncode == 0, logf.read_text()[-3000:]
    finally:
        if runner is not None and runner.poll() is None:
            runner.kill()
        log.close()
        kill_processes(engine_processes())
    final = _valid_points(out)
    assert sorted(final) == ["a-r0", "b-r0", "c-r0"]
    assert all(p["status"] == "ok" for p in final.values())
    assert (out / "a-r0.json").read_text() == a_text
    assert (out / "b-r0.json").read_text() == b_text
    assert final["b-r0"]["log_file"].endswith("logs/b-r0.log")  # b ran isolated, in run 2
    assert (out / "summary.csv").read_text().count("\n") == 4
    assert engine_processes() == []


# --------------------------------------------------------------------------- SIGINT at each phase
@pytest.fixture
def sigint_ignored():
    """SIGINT ignored on entry, as a job started with `cmd &` by a script inherits it: that is how
    CI's runner once finished a whole sweep after Ctrl-C. The sweep must stop anyway."""
    prev = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, prev)


def _phase_chain(
    tmp_path: Path, monkeypatch, isolate: bool, steps: list[tuple[str, list[str]]], n_points: int
) -> dict:
    """Run one sweep once per step, each signalled at its phase (``phase@point``), and check what
    each run left: the points written (the step's list), those written earlier unchanged byte for
    byte, no temp file, no engine process, and a signal that stayed as it was. A last run without
    a signal finishes the sweep."""
    base = _point(TINY_MODEL, "x")
    del base["point_id"]
    configs = {f"p{i}": {"settings": {"block_size": 32 if i % 2 else 64}} for i in range(n_points)}
    points = make_points(base, configs)
    out = tmp_path / "sweep"
    texts: dict[str, str] = {}
    try:
        for signal_at, expect in steps:
            monkeypatch.setenv(interrupt.SIGNAL_AT_ENV, signal_at)
            with pytest.raises(interrupt.Interrupted):
                run_sweep(points, out, isolate=isolate, progress=False)
            done = _valid_points(out)
            assert sorted(done) == [f"{p}-r0" for p in expect], signal_at
            assert all(p["status"] == "ok" for p in done.values())
            for pid, text in texts.items():
                assert (out / f"{pid}.json").read_text() == text, f"{pid} changed"
            texts = {pid: (out / f"{pid}.json").read_text() for pid in done}
            assert engine_processes() == [], signal_at
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # put back as it was
        monkeypatch.delenv(interrupt.SIGNAL_AT_ENV)
        run_sweep(points, out, isolate=isolate, progress=False)
    finally:
        kill_processes(engine_processes())
    final = _valid_points(out)
    assert sorted(final) == [f"p{i}-r0" for i in range(n_points)]
    assert all(p["status"] == "ok" for p in final.values())
    for pid, text in texts.items():
        assert (out / f"{pid}.json").read_text() == text
    return final


TINY_MODEL = "tiny-ernie"


@pytest.mark.engine
def test_sigint_at_every_phase_stops_an_in_process_sweep_and_a_rerun_resumes(
    tmp_path, monkeypatch, sigint_ignored
):
    """In-process engines: each phase stops the sweep; the point being written is kept whole."""
    _phase_chain(
        tmp_path,
        monkeypatch,
        False,
        [
            ("engine_start@p0-r0", []),
            ("warmup@p1-r0", ["p0"]),
            ("measure@p2-r0", ["p0", "p1"]),
            ("between@p3-r0", ["p0", "p1", "p2"]),
            ("write@p3-r0", ["p0", "p1", "p2", "p3"]),
        ],
        n_points=4,
    )


@pytest.mark.engine
@pytest.mark.extended  # the in-process sweep above runs every phase; Ctrl-C of an isolated one too
def test_sigint_at_every_engine_phase_stops_an_isolated_sweep_and_a_rerun_resumes(
    tmp_path, monkeypatch, sigint_ignored
):
    """Isolated engines: the child signals the sweep at its phase, as Ctrl-C in the terminal
    would; the sweep kills the child's process group."""
    final = _phase_chain(
        tmp_path,
        monkeypatch,
        True,
        [
            ("engine_start@p0-r0", []),
            ("warmup@p0-r0", []),
            ("measure@p1-r0", ["p0"]),
        ],
        n_points=2,
    )
    assert final["p1-r0"]["log_file"].endswith("logs/p1-r0.log")


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.engine
def test_sigint_with_vllm_multiprocessing_leaves_no_engine_core(tmp_path):
    """A runner started in the background (SIGINT ignored), in-process with vLLM's own EngineCore
    child (the GPU profiles' mode): SIGINT stops it, and no EngineCore outlives it."""
    base = _point(TINY_MODEL, "x")
    del base["point_id"]
    base["env"] = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    out = tmp_path / "sweep"
    cmd = _sweep_cmd(tmp_path, out, "inprocess", base, {"mp": {}})
    env_mp = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    logf = tmp_path / "runner.log"
    with open(logf, "w") as log:
        try:
            proc = subprocess.run(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                env={**env_mp, interrupt.SIGNAL_AT_ENV: "measure@mp-r0"},
                timeout=400,
                preexec_fn=_ignore_sigint,
            )
        finally:
            leftover = engine_processes()
            kill_processes(leftover)
    assert proc.returncode != 0, logf.read_text()[-3000:]
    assert "Interrupted: SIGINT" in logf.read_text()
    assert "EngineCore" in logf.read_text()  # vLLM did run its engine in a child process
    assert leftover == [] and not _valid_points(out)


KERNEL_CODE = """\
import json, os, time
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from tunebook.measure.sweep import make_points, run_sweep
base, configs = json.loads({base!r}), json.loads({configs!r})
def on_result(r):
    print("WRITTEN", r["point_id"], flush=True)
    if r["point_id"] == "a-r0":
        # The sweep waits here for the test's interrupt: the line above may reach the test late
        # (the kernel's iopub thread competes with the engine), after b had already finished.
        time.sleep(120)
run_sweep(make_points(base, configs), {out!r}, isolate=False, progress=False, on_result=on_result)
print("SWEEP DONE", flush=True)
"""


@pytest.mark.engine
def test_jupyter_kernel_interrupt_stops_a_sweep_and_a_rerun_resumes(tmp_path):
    """'Interrupt kernel' in JupyterLab while a sweep runs: the cell stops with Interrupted, the
    kernel lives on, no engine is left, and running the cell again resumes."""
    from jupyter_client.manager import start_new_kernel

    base = _point(TINY_MODEL, "x")
    del base["point_id"]
    configs = {"a": {}, "b": {"settings": {"block_size": 64}}}
    out = tmp_path / "sweep"
    code = KERNEL_CODE.format(base=json.dumps(base), configs=json.dumps(configs), out=str(out))
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(REPO))
    try:

        def run_cell(interrupt_after: str | None) -> tuple[str, list[str]]:
            """Execute the cell; interrupt the kernel when ``interrupt_after`` is printed."""
            msg_id = kc.execute(code)
            printed: list[str] = []
            status = None
            while True:
                msg = kc.get_iopub_msg(timeout=400)
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                kind, content = msg["msg_type"], msg["content"]
                if kind == "stream":
                    printed += content["text"].splitlines()
                    if interrupt_after and f"WRITTEN {interrupt_after}" in content["text"]:
                        km.interrupt_kernel()  # what JupyterLab's "Interrupt kernel" does
                elif kind == "error":
                    status = content["ename"]
                elif kind == "status" and content["execution_state"] == "idle":
                    break
            return status or "ok", printed

        status, printed = run_cell(interrupt_after="a-r0")
        assert status in ("Interrupted", "KeyboardInterrupt"), printed
        assert "SWEEP DONE" not in printed
        assert sorted(_valid_points(out)) == ["a-r0"]
        a_text = (out / "a-r0.json").read_text()
        assert engine_processes() == []
        assert km.is_alive()

        status, printed = run_cell(interrupt_after=None)
        assert status == "ok" and "SWEEP DONE" in printed, printed
        assert "WRITTEN a-r0" not in printed  # resumed: a was not measured again
        assert sorted(_valid_points(out)) == ["a-r0", "b-r0"]
        assert (out / "a-r0.json").read_text() == a_text
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        kill_processes(engine_processes())


@pytest.mark.vllm
def test_ctrl_c_of_the_headless_runner_stops_it_and_records_the_notebook(
    tmp_path, nb_dir, run_dir, monkeypatch, sigint_ignored
):
    """SIGINT to `tunebook run` (here sent by the notebook's own cell to its runner, the kernel's
    parent): the run stops, run.json says which notebook was interrupted, and the kernel is gone."""
    import psutil

    from tunebook.workbench.runner import run_workbook

    nb = json.loads((nb_dir / "00_baseline.ipynb").read_text())
    nb["cells"].append(
        {
            "cell_type": "code",
            "metadata": {},
            "outputs": [],
            "execution_count": None,
            "source": [
                "import os, signal, time\n",
                "print(os.getpid(), flush=True)\n",
                "os.kill(os.getppid(), signal.SIGINT)\n",
                "time.sleep(3600)\n",
            ],
        }
    )
    nb["metadata"] = {"kernelspec": {"name": "python3", "language": "python"}}
    (nb_dir / "00_baseline.ipynb").write_text(json.dumps(nb))
    monkeypatch.setattr("tunebook.workbench.runner.NOTEBOOKS_DIR", nb_dir)
    prof = _profile(tmp_path, "common: {}\n")
    kernels_before = {p.pid for p in psutil.Process().children(recursive=True)}
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_workbook(str(prof), "r", ["00"], runs_dir=run_dir, report=False, log=lambda _: None)
    # Stopped inside the cell: had the runner waited for it, its call would hold the hour.
    assert time.monotonic() - t0 < 3600
    state = json.loads((run_dir / "r" / "run.json").read_text())
    assert state["notebooks"]["00_baseline"]["status"] == "interrupted"
    # The stopped runner recorded its own seconds too, the interrupted call inside them.
    (me,) = state["runner"]
    assert me["notebook_s"] == pytest.approx(state["notebooks"]["00_baseline"]["seconds"])
    assert me["notebook_s"] < me["seconds"] <= time.monotonic() - t0
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in kernels_before]
    gone, alive = psutil.wait_procs(left, timeout=30)
    assert not alive, [p.cmdline() for p in alive]


def test_kill_group_returns_once_the_whole_group_is_gone():
    """An engine core outlives its API server by a moment when both are killed: kill_group waits
    for the group's last member (no timing asserted), so its memory is free for the next start."""
    from tunebook.engine.isolation import group_alive, kill_group, spawn

    code = (
        "import subprocess, sys, time;"
        " subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
        " print('up', flush=True); time.sleep(600)"
    )
    proc = spawn([sys.executable, "-c", code], subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"up"
    assert group_alive(proc.pid)
    kill_group(proc)
    assert proc.returncode is not None and not group_alive(proc.pid)
