"""Consoles: vLLM's log goes to a file with a short summary, known-harmless warnings are hidden
from the terminal and counted, and the runner keeps one progress line per notebook."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import time
import warnings

import pytest

from tunebook.workbench import console

NUMA = (
    "[W1203 12:35:21.756175514 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for"
    " memory allocation on the NUMA nodes (0). (function init_cpu_memory_env)"
)


def test_engine_log_takes_vllm_records_warnings_and_c_level_output(tmp_path):
    path = tmp_path / "nb" / "logs" / "engine.log"
    vlog = logging.getLogger("vllm")
    level = vlog.level
    vlog.setLevel(logging.INFO)  # as vLLM sets it at its default level
    log = console.capture_engine_log(path)
    try:
        os.write(2, (NUMA + "\n").encode())  # what C++ code writes, below Python
        os.write(1, b"a C-level stdout line\n")
        logging.getLogger("vllm.worker").warning("CPU backend doesn't support chunked local attn")
        logging.getLogger("vllm.core").info("Resolved architecture: Ernie4_5ForCausalLM")
        logging.getLogger("vllm.core").error("EngineCore failed to start")
        warnings.warn("torch.distributed.reduce_op is deprecated", FutureWarning, stacklevel=1)
        # vLLM's handler, configured again at each engine start, writes to descriptor 1 (the file)
        assert os.environ[console.VLLM_STREAM_ENV] == "ext://sys.__stdout__"
    finally:
        console.release_engine_log()
        vlog.setLevel(level)
    text = path.read_text()
    for s in (
        "NUMA binding",
        "a C-level stdout line",
        "CPU backend",
        "Resolved architecture",
        "reduce_op",
    ):
        assert s in text
    summary = log.summary()
    assert summary.startswith(f"engine log: {len(text.splitlines())} lines in {path}")
    assert "3 warnings, 3 of them known to be harmless; 1 error)" in summary
    assert "error: ERROR" in summary and "EngineCore failed to start" in summary
    assert len(summary.splitlines()) <= 1 + 3 + 5
    # released: file descriptors and loggers are as before
    os.write(2, b"after release\n")
    logging.getLogger("vllm.core").warning("after release")
    assert "after release" not in path.read_text()
    assert console.VLLM_STREAM_ENV not in os.environ


def test_summary_of_a_missing_log():
    assert console.summarize_log("/nonexistent/engine.log").startswith("engine log: none written")


def test_classify_reads_vllm_glog_and_python_forms():
    assert (
        console.classify("\x1b[0;36m(MainProcess pid=1)\x1b[0;0m WARNING 12-03 [x.py:1] w")
        == "warning"
    )
    assert console.classify(NUMA) == "warning"
    coloured = "\x1b[0;36m(MainProcess pid=1)\x1b[0;0m \x1b[33mWARNING\x1b[0m \x1b[90m12-03 13:17:03\x1b[0m"
    assert console.classify(coloured + " w") == "warning"
    assert (
        console._gist(coloured + " \x1b[90m[arg_utils.py:1945]\x1b[0m The seed is 0.")
        == "The seed is N."
    )
    assert console.classify("E1203 12:00:00.1 x.cc:1] bad") == "error"
    assert console.classify("INFO 12:00:00 [vllm] fine") == "info"
    assert console.classify("plain text") == "other"


def _filter_child(lines: list[str], log_path) -> subprocess.CompletedProcess:
    """A process whose stderr goes through StderrFilter, writing the lines as a kernel would."""
    code = (
        "import os, sys, json\n"
        "from tunebook.workbench.console import StderrFilter\n"
        f"with open({str(log_path)!r}, 'a') as log, StderrFilter(log) as f:\n"
        f"    for ln in {lines!r}:\n"
        "        os.write(2, (ln + '\\n').encode())\n"
        "counts = f.take_counts()\n"
        "print(json.dumps(counts))\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_stderr_filter_hides_known_harmless_lines_and_counts_them(tmp_path):
    log = tmp_path / "run.log"
    lines = [
        NUMA,
        "[IPKernelApp] WARNING | Kernel is running over TCP without encryption. All ...",
        "/x/dispatcher.py:12: FutureWarning: `torch.distributed.reduce_op` is deprecated",
        "  wrapper = lookup(vars(value).get('kernel'))",
        "a real problem: disk full",
        NUMA,
    ]
    r = _filter_child(lines, log)
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip().splitlines() == ["a real problem: disk full"]
    assert json.loads(r.stdout) == {"numa": 2, "tcp": 1, "reduce-op": 1}
    assert log.read_text().splitlines() == lines  # the log keeps everything
    assert "2 x numa" in console.hidden_text({"numa": 2})


# What a kernel stopped mid-cell prints (seen on `timeout 70 python -m tunebook run ... 04`).
KERNEL_TEARDOWN = [
    "[IPKernelApp] ERROR | Exception in message handler:",
    "Traceback (most recent call last):",
    '  File "/x/ipykernel/kernelbase.py", line 508, in dispatch_shell',
    "    await result",
    '  File "zmq/backend/cython/_zmq.py", line 1339, in zmq.backend.cython._zmq._check_closed',
    "zmq.error.ZMQError: Socket operation on non-socket",
]


def test_stderr_filter_hides_a_stopped_kernels_traceback_and_shows_any_other(tmp_path):
    log = tmp_path / "run.log"
    other = [*KERNEL_TEARDOWN[:5], "KeyError: 'msg_id'"]
    cut_off = KERNEL_TEARDOWN[:3]  # the run ends inside the traceback
    lines = [*KERNEL_TEARDOWN, "after", *other, *cut_off]
    r = _filter_child(lines, log)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == ["after", *other, *cut_off]
    assert json.loads(r.stdout) == {"kernel-teardown": 1}
    assert log.read_text().splitlines() == lines


def test_progress_text_counts_points_and_estimates_the_sweep():
    events = [
        {"t": 1, "event": "start", "sweep": "a", "points": 2, "done": 0},
        {"t": 2, "event": "point", "sweep": "a", "wall_s": 4.0},
        {"t": 3, "event": "point", "sweep": "a", "wall_s": 6.0},
        {"t": 4, "event": "start", "sweep": "b", "points": 4, "done": 1},
        {"t": 5, "event": "point", "sweep": "b", "wall_s": 2.0},
    ]
    assert (
        console.progress_text("02_x", events[:1], 3)
        == "02_x: a point 0/2 (0 points done), 0:03 elapsed"
    )
    text = console.progress_text("02_x", events, 75)
    # b: 1 done before this call (resume) + 1 now; 2 left at the mean point time (4 s)
    assert text == "02_x: b point 2/4 (3 points done), 1:15 elapsed, sweep ETA 0:08"
    assert console.progress_text("02_x", [], 5) == "02_x: starting, 0:05 elapsed"
    # between points the ETA counts down from the last finished point
    assert console.progress_text("02_x", events, 78, now=8.0).endswith("sweep ETA 0:05")


def test_progress_line_follows_the_file(tmp_path):
    path = tmp_path / "progress.jsonl"
    out, log = io.StringIO(), io.StringIO()
    with console.ProgressLine("00_x", path, log, stream=out, every_s=0.05):
        with open(path, "a") as f:
            f.write(
                json.dumps(
                    {"t": time.time(), "event": "start", "sweep": "s", "points": 2, "done": 0}
                )
                + "\n"
            )
            f.write(
                json.dumps({"t": time.time(), "event": "point", "sweep": "s", "wall_s": 1.0}) + "\n"
            )
        time.sleep(0.5)
    lines = out.getvalue().splitlines()
    assert lines and lines[-1].startswith("[tunebook] 00_x: s point 1/2 (1 point done)")
    assert "[tunebook] 00_x: s point 1/2" in log.getvalue()


@pytest.mark.engine
def test_an_isolated_engine_started_under_the_engine_log_keeps_its_own_log(
    tmp_path, base_point, monkeypatch
):
    """The kernel's setting (vLLM's stream: descriptor 1) reaches an isolated engine child, whose
    descriptor 1 is its own log file: the facts read from that log (attention backend, KV size)
    are still there."""
    from tunebook.measure.execute import run_point

    monkeypatch.setenv(console.VLLM_STREAM_ENV, "ext://sys.__stdout__")
    log = tmp_path / "point.log"
    r = run_point(base_point, isolate=True, timeout_s=600, log_path=log)
    assert r["status"] == "ok", r.get("error")
    assert r["env"].get("attention_backend")
    assert "engine_kv_tokens" in r["capacity"]
    assert "Resolved architecture" in log.read_text() or "KV cache" in log.read_text()


@pytest.mark.slow
def test_after_a_stop_a_cells_dead_kernel_task_is_dropped_and_any_other_lost_exception_shown(
    caplog,
):
    import asyncio
    import gc

    from nbclient.exceptions import DeadKernelError

    from tunebook.workbench.console import _StoppedCellTask, hide_stopped_cell_task

    async def fail(exc):
        raise exc

    def lose(exc):  # a task whose exception nobody retrieves, as papermill's cell after Ctrl-C
        loop = asyncio.new_event_loop()
        task = loop.create_task(fail(exc))
        loop.run_until_complete(asyncio.wait([task]))
        loop.close()
        del task
        gc.collect()

    log = logging.getLogger("asyncio")
    # A stop earlier in this process (another test's runner) may have installed the filter
    # already: set it aside, so that this test sees asyncio's report first, and restore it after.
    earlier = [f for f in log.filters if isinstance(f, _StoppedCellTask)]
    for f in earlier:
        log.removeFilter(f)
    try:
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            lose(DeadKernelError("Kernel died"))
            assert "never retrieved" in caplog.text, "asyncio reports it before the stop"
            caplog.clear()
            hide_stopped_cell_task()
            hide_stopped_cell_task()  # a second stop adds nothing
            lose(DeadKernelError("Kernel died"))
            lose(KeyError("msg_id"))
        said = [r.getMessage().splitlines()[0] for r in caplog.records]
        assert said == ["Task exception was never retrieved"], said
        assert "KeyError" in caplog.text and "DeadKernelError" not in caplog.text, caplog.text
        assert sum(isinstance(f, _StoppedCellTask) for f in log.filters) == 1
    finally:
        for f in [f for f in log.filters if isinstance(f, _StoppedCellTask)]:
            log.removeFilter(f)
        for f in earlier:
            log.addFilter(f)
