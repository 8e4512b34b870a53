"""The live view of sweeps: samples -> panel figures, tailing an isolated engine's progress file,
and (engine) the in-process callback receiving samples while a point runs."""

from __future__ import annotations

import json
import time

import pytest

from tunebook.measure.live import (
    GEN_TOKENS,
    KV,
    PREEMPTIONS,
    RUNNING,
    WAITING,
    LivePanel,
    LiveState,
    ProgressTail,
)


def sample(t, gen, running=4, waiting=2, kv=0.25, preempt=3.0):
    return {
        "t_s": t,
        GEN_TOKENS: gen,
        RUNNING: running,
        WAITING: waiting,
        KV: kv,
        PREEMPTIONS: preempt,
    }


def test_state_tokens_per_second_and_preemptions_since_the_point_started():
    st = LiveState(window_s=1.0)
    st.reset("p-r0")
    assert "starting" in st.text() and st.tokens_per_s is None
    st.update(sample(0.0, 1000.0, preempt=3.0))
    assert st.tokens_per_s is None  # one sample is no rate
    st.update(sample(0.25, 1100.0, preempt=3.0))
    assert st.tokens_per_s == pytest.approx(400.0)
    st.update(sample(0.5, 1150.0, preempt=5.0))
    f = st.fields()
    assert f["tokens_per_s"] == pytest.approx(300.0)
    assert f["preemptions"] == 2 and f["generated_tokens"] == 150
    assert f["running"] == 4 and f["waiting"] == 2 and f["kv_cache_pct"] == pytest.approx(25.0)
    assert st.text() == "p-r0: running 4, waiting 2, KV 25.0%, preemptions 2, 300 tok/s"
    # The window slides: after 2 s only the last ~1 s counts.
    for i in range(3, 9):
        st.update(sample(0.25 * i, 1150.0 + 10.0 * (i - 2)))
    assert st.tokens_per_s == pytest.approx(40.0)
    # A new sampler (next repeat) restarts its clock: no negative or huge rate.
    st.update(sample(0.0, 1300.0))
    assert st.tokens_per_s is None


def test_panel_logs_at_once_then_throttled_and_widget_updates_in_place():
    lines = []
    panel = LivePanel("02/block_size", total=2, widget=False, log_every_s=5.0, log=lines.append)
    panel.start_point("a-r0")
    panel.update(sample(0.0, 0.0))
    panel.update(sample(0.25, 100.0))
    assert len(lines) == 1 and lines[0].startswith("[tunebook] 02/block_size [0/2 points] a-r0:")
    panel.end_point({"point_id": "a-r0", "status": "ok"})
    panel.start_point("b-r0")
    panel.update(sample(0.0, 0.0))
    assert len(lines) == 2 and "[1/2 points] b-r0" in lines[1]

    w = LivePanel("sweep", total=1, widget=True)
    w.start_point("a-r0")
    w.update(sample(0.0, 0.0))
    w.update(sample(0.5, 100.0, running=7))
    w._emit(force=True)
    assert "tunebook-live" in w.widget._dom_classes
    assert "running requests" in w.widget.value and ">7<" in w.widget.value
    assert ">200<" in w.widget.value  # tokens/s
    w.end_point({"point_id": "a-r0", "status": "failed"})
    assert "a-r0: failed" in w.widget.value and "[1/1 points]" in w.widget.value


def test_progress_tail_reads_complete_lines_only(tmp_path):
    path = tmp_path / "p.progress.jsonl"
    got = []
    tail = ProgressTail(path, got.append, interval_s=0.05)
    assert tail.poll() == 0  # no file yet
    with open(path, "w") as f:
        f.write(json.dumps(sample(0.0, 1.0)) + "\n" + json.dumps(sample(0.25, 2.0))[:10])
    assert tail.poll() == 1 and got[0][GEN_TOKENS] == 1.0
    with open(path, "a") as f:  # the rest of the half-written line, a bad line, one more
        f.write(json.dumps(sample(0.25, 2.0))[10:] + "\nnot json\n")
    tail.start()
    with open(path, "a") as f:
        f.write(json.dumps(sample(0.5, 3.0)) + "\n")
    end = time.monotonic() + 5
    while len(got) < 3 and time.monotonic() < end:
        time.sleep(0.05)
    tail.stop()
    assert [s[GEN_TOKENS] for s in got] == [1.0, 2.0, 3.0]


@pytest.mark.engine
def test_in_process_point_feeds_on_sample_while_it_runs(base_point, tmp_path, monkeypatch):
    from tunebook.measure import execute as engine
    from tunebook.measure.sweep import run_sweep

    seen = []
    p = {**base_point, "point_id": "live"}
    p["workload"] = {**p["workload"], "num_requests": 16, "output_len": 24}
    res = engine.run_point(p, isolate=False, on_sample=seen.append)
    assert res["status"] == "ok", res.get("error")
    assert seen, "no samples reached the callback"
    assert all(GEN_TOKENS in s and RUNNING in s and KV in s for s in seen)
    assert seen[-1][GEN_TOKENS] > seen[0][GEN_TOKENS] or len(seen) == 1

    # Through run_sweep(live=True): the panel (log lines outside Jupyter) saw the point.
    lines = []
    import tunebook.measure.live as live

    orig = live.LivePanel.__init__

    def init(self, *a, **kw):
        orig(self, *a, **{**kw, "log": lines.append})

    monkeypatch.setattr(live.LivePanel, "__init__", init)
    p2 = {**p, "point_id": "live2", "workload": dict(base_point["workload"])}
    run_sweep([p2], tmp_path / "sw", isolate=False, progress=False, live=True)
    assert lines and "live2:" in lines[0], lines
