"""Each notebook's kernel started while the notebook before it runs (``tunebook.workbench.early``).

Real Jupyter kernels and papermill throughout. The notebooks here are small stand-ins (a cell
that records its kernel), and ``TUNEBOOK_PRESTART=0`` keeps ``notebook.prepare`` from starting
launchers: what is tested is the kernels' life, not vLLM.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil
import pytest

from tunebook.core.errors import ConfigError, NotebookFailed
from tunebook.workbench import early, profiles
from tunebook.workbench.runner import _hand_over, run_workbook

NOTES = ("00_baseline", "02_block_size_sweep")


def _notebook(path: Path, cells: list[str]) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "py"}
    params = nbformat.v4.new_code_cell("run_dir: str = ''  # where results go")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# question"), params]
    nb.cells += [nbformat.v4.new_code_cell(c) for c in cells]
    nbformat.write(nb, path)


def _recording(out: Path, fail: bool = False) -> list[str]:
    """Cells that write the kernel's pid, its start and the call's start to ``out``."""
    return [
        "import json, os, time\n"
        "import psutil\n"
        "me = psutil.Process()\n"
        f"json.dump({{'pid': me.pid, 'created': me.create_time(),"
        f" 'call_start': os.environ.get('TUNEBOOK_CALL_START')}}, open({str(out)!r}, 'w'))",
        "time.sleep(2)  # the next notebook's kernel starts meanwhile",
        "raise ValueError('this notebook fails')" if fail else "print('done')",
    ]


@pytest.fixture
def stand_ins(tmp_path, monkeypatch):
    nb_dir = tmp_path / "notebooks"
    nb_dir.mkdir()
    monkeypatch.setattr(profiles, "NOTEBOOKS_DIR", nb_dir)
    monkeypatch.setattr("tunebook.workbench.runner.NOTEBOOKS_DIR", nb_dir)
    monkeypatch.setenv("TUNEBOOK_EARLY_KERNEL", "1")
    monkeypatch.setenv("TUNEBOOK_PRESTART", "0")  # the kernels inherit it: no launchers
    prof = tmp_path / "prof.yaml"
    prof.write_text("common: {}\n")
    return nb_dir, prof


def _kernels() -> list[psutil.Process]:
    """Live ipykernel processes under this one. A zombie (exited, not yet reaped by whoever
    started it, often an earlier test's subprocess) has no command line and runs nothing."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "ipykernel" in " ".join(p.cmdline()):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
    return found


@pytest.mark.vllm
def test_each_notebook_runs_in_a_kernel_started_before_its_turn(tmp_path, stand_ins):
    nb_dir, prof = stand_ins
    for n in NOTES:
        _notebook(nb_dir / f"{n}.ipynb", _recording(tmp_path / f"{n}.json"))
    runs = tmp_path / "runs"
    run_workbook(str(prof), "r", ["00", "02"], runs_dir=runs, report=False, log=lambda _: None)
    state = json.loads((runs / "r" / "run.json").read_text())
    for n in NOTES:
        seen = json.loads((tmp_path / f"{n}.json").read_text())
        call = state["notebooks"][n]["calls"][0]
        info = call["early_kernel"]
        assert info["prepare"] == "ok"
        # the kernel was there before the call began, and the call's start reached it
        call_start = float(seen["call_start"])
        assert seen["created"] < call_start
        assert call_start - seen["created"] == pytest.approx(info["started_before_s"], abs=1.5)
        assert not psutil.pid_exists(seen["pid"])  # shut down after its notebook
        # the preparation left no trace in the notebook: its cells count from 1
        nb = json.loads((runs / "r" / f"{n}.ipynb").read_text())
        counts = [c["execution_count"] for c in nb["cells"] if c["cell_type"] == "code"]
        assert counts == list(range(1, len(counts) + 1))
    # 02's kernel started during 00, which ran for over 2 s
    assert (
        state["notebooks"]["02_block_size_sweep"]["calls"][0]["early_kernel"]["started_before_s"]
        >= 2.0
    )
    log = (runs / "r" / "run.log").read_text()
    assert "02_block_size_sweep: kernel started" in log and "preparation ok" in log
    assert not _kernels()


@pytest.mark.vllm
def test_a_kernel_started_for_a_notebook_that_never_runs_is_stopped_and_leaves_nothing(
    tmp_path, stand_ins
):
    nb_dir, prof = stand_ins
    _notebook(nb_dir / "00_baseline.ipynb", _recording(tmp_path / "00.json", fail=True))
    _notebook(nb_dir / "02_block_size_sweep.ipynb", _recording(tmp_path / "02.json"))
    runs = tmp_path / "runs"
    with pytest.raises(NotebookFailed, match="this notebook fails"):
        run_workbook(str(prof), "r", ["00", "02"], runs_dir=runs, report=False, log=lambda _: None)
    assert not (tmp_path / "02.json").exists()
    assert not (runs / "r" / "02_block_size_sweep").exists()
    assert not _kernels()


@pytest.mark.slow
def test_a_failed_preparation_gives_the_notebook_a_kernel_of_its_own(tmp_path, monkeypatch):
    """prepare() raising (here: a notebook it does not know) is said in run.log; the kernel goes."""
    monkeypatch.setenv("TUNEBOOK_PRESTART", "1")
    monkeypatch.setenv("TUNEBOOK_LAUNCHER", "0")  # prepare() goes on without launchers
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    mine = early.EarlyKernel.start("99_nope", {"run_dir": str(run_dir)}, tmp_path, run_dir)
    pid = mine.km.provisioner.pid
    log = tmp_path / "run.log"
    with open(log, "w") as f:
        info = _hand_over(mine, 0.0, f)
    assert info["prepare"].startswith("ConfigError") and "99_nope" in info["prepare"]
    assert mine.km is None and not psutil.pid_exists(pid)
    assert not (run_dir / "99_nope").exists()
    assert "99_nope: kernel started" in log.read_text()


@pytest.mark.vllm
def test_a_bad_value_found_while_the_first_kernel_prepares_leaves_nothing(tmp_path, monkeypatch):
    """The run folder is made before the checks that import vLLM when the first notebook's kernel
    starts early; a value they refuse removes it again, with that kernel."""
    monkeypatch.setenv("TUNEBOOK_EARLY_KERNEL", "1")
    monkeypatch.setenv("TUNEBOOK_PRESTART", "0")
    prof = tmp_path / "prof.yaml"
    prof.write_text("02_block_size_sweep:\n  block_sizes: [7]\n")
    runs = tmp_path / "runs"
    with pytest.raises(ConfigError, match="none is a valid block_size"):
        run_workbook(str(prof), "bad", ["02"], runs_dir=runs, report=False, log=lambda _: None)
    assert not runs.exists()
    assert not _kernels()


def test_early_kernels_are_for_gpu_nodes_unless_asked_for(monkeypatch):
    monkeypatch.delenv("TUNEBOOK_EARLY_KERNEL", raising=False)
    monkeypatch.setenv("TUNEBOOK_PRESTART", "0")
    assert not early.wanted()
    monkeypatch.setenv("TUNEBOOK_PRESTART", "1")
    assert early.wanted()
    monkeypatch.setenv("TUNEBOOK_EARLY_KERNEL", "off")
    assert not early.wanted()
    assert os.environ["TUNEBOOK_PRESTART"] == "1"


@pytest.mark.vllm
def test_begin_takes_over_what_prepare_started(tmp_path, monkeypatch):
    """The launchers prepare() starts are those begin() asks for (the same environments), and what
    was printed while it prepared is in the notebook's engine log."""
    import tunebook.workbench.notebook as tbn
    from tunebook.engine import isolation, launcher
    from tunebook.workbench import console

    monkeypatch.setenv("TUNEBOOK_PRESTART", "1")
    monkeypatch.setattr(isolation, "_BASE_ENV", None)  # a fresh kernel's
    asked: list[tuple] = []
    monkeypatch.setattr(
        launcher, "prestart", lambda kind, env, log_dir: asked.append((kind, env)) or True
    )
    run_dir = tmp_path / "run"
    params = {"run_dir": str(run_dir), "engine_env": {"A": "1"}, "isolate": True}
    try:
        tbn.prepare("02_block_size_sweep", params)
        os.write(1, b"printed while it prepared\n")
        ns = {
            **{
                k: v["default"]
                for k, v in profiles.notebook_parameters("02_block_size_sweep").items()
            },
            **params,
            "In": [],
        }
        assert tbn.begin(ns, "02_block_size_sweep") == str(run_dir)
    finally:
        console.release_engine_log()
    kinds = [k for k, _ in asked]
    assert kinds == ["serve", "engine", "serve", "engine"]
    assert asked[:2] == asked[2:]  # begin asked for the very launchers prepare started
    log = (run_dir / "02_block_size_sweep" / "logs" / "engine.log").read_text()
    assert "printed while it prepared" in log
    assert "02_block_size_sweep" not in tbn._PREPARED


@pytest.mark.vllm
def test_ctrl_c_stops_the_notebook_and_the_kernel_started_for_the_next(tmp_path, stand_ins):
    import signal
    import threading

    nb_dir, prof = stand_ins
    _notebook(nb_dir / "00_baseline.ipynb", ["import time\ntime.sleep(60)"])
    _notebook(nb_dir / "02_block_size_sweep.ipynb", _recording(tmp_path / "02.json"))
    runs = tmp_path / "runs"
    timer = threading.Timer(8.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises((KeyboardInterrupt, NotebookFailed)):
            run_workbook(
                str(prof), "r", ["00", "02"], runs_dir=runs, report=False, log=lambda _: None
            )
    finally:
        timer.cancel()
    state = json.loads((runs / "r" / "run.json").read_text())
    assert state["notebooks"]["00_baseline"]["status"] == "interrupted"
    assert not (tmp_path / "02.json").exists()
    assert not (runs / "r" / "02_block_size_sweep").exists()
    assert not _kernels()
