"""Run folders and sweep logic: atomic writes, resume, failures, summary, ids, interleaving.

run_point is replaced by a fake here (and only here): these tests are about the sweep's
bookkeeping, not the engine. Points are still validated by the real engine.prepare.
"""

from __future__ import annotations

import csv
import json
import os

import pytest

from tunebook.core.errors import ConfigError
from tunebook.core.results import SweepDir, atomic_write_text, dumps_point, point_row, safe_name
from tunebook.measure import execute as engine
from tunebook.measure.sweep import grid, make_points, point_id, run_sweep


# --------------------------------------------------------------------------- results
def test_atomic_write_leaves_no_tmp_and_replaces(tmp_path):
    p = tmp_path / "sub" / "a.json"
    atomic_write_text(p, "one")
    atomic_write_text(p, "two")
    assert p.read_text() == "two"
    assert sorted(x.name for x in p.parent.iterdir()) == ["a.json"]


def test_point_files_are_readable_by_others(tmp_path):
    """mkstemp creates 0600 files; a run folder is shared (Jupyter, CI artifacts)."""
    sd = SweepDir(tmp_path)
    p = sd.write("a", {"point_id": "a", "status": "ok"})
    assert p.stat().st_mode & 0o777 == 0o644
    assert sd.write_summary().stat().st_mode & 0o777 == 0o644


def test_atomic_write_failure_keeps_the_old_file(tmp_path, monkeypatch):
    p = tmp_path / "a.json"
    atomic_write_text(p, "old")

    def boom(*a):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_text(p, "new")
    assert p.read_text() == "old"
    assert [x.name for x in tmp_path.iterdir()] == ["a.json"]


def test_sweepdir_roundtrip_and_done(tmp_path):
    sd = SweepDir(tmp_path / "s")
    sd.write("a-r0", {"point_id": "a-r0", "status": "ok", "metrics": {"x": float("nan")}})
    sd.write("b-r0", {"point_id": "b-r0", "status": "failed", "error": "boom"})
    assert sd.read("a-r0")["metrics"]["x"] is None  # NaN stored as null: valid JSON
    assert sd.done("a-r0") and not sd.done("b-r0") and not sd.done("c-r0")
    assert sd.read("c-r0") is None
    (sd.root / "broken.json").write_text("{half")
    assert sd.read("broken") is None
    assert [p["point_id"] for p in sd.points()] == ["a-r0", "b-r0"]
    assert not list(sd.root.glob("*.tmp")) and not list(sd.root.glob(".*"))


@pytest.mark.parametrize("bad", ["../x", "..", "a/b", "/abs", ".hidden", "", "a b", "x/../y", None])
def test_safe_name_rejects_escapes(bad):
    with pytest.raises(ConfigError):
        safe_name(bad)


def test_point_files_keep_bulky_lists_one_item_per_line(tmp_path):
    """Per-request records are most of a point: compact lines, floats to 4 decimals, summary exact."""
    point = {
        "metrics": {"ttft_p99_ms": 123.456789123, "nan_ms": float("nan")},
        "requests": [{"itl_ms": [1.234567891, 2.0], "ttft_ms": 10.00004999}, {"itl_ms": []}],
        "timeline": [],
        "status": "ok",
    }
    text = dumps_point(point)
    back = json.loads(text)
    assert back["metrics"] == {"ttft_p99_ms": 123.456789123, "nan_ms": None}  # summary unrounded
    assert back["requests"] == [{"itl_ms": [1.2346, 2.0], "ttft_ms": 10.0}, {"itl_ms": []}]
    assert back["timeline"] == [] and back["status"] == "ok"
    lines = text.splitlines()
    assert '    {"itl_ms":[1.2346,2.0],"ttft_ms":10.0},' in lines  # one request per line
    d = SweepDir(tmp_path / "s")
    d.write("p1", point)
    assert d.read("p1")["requests"][0]["itl_ms"] == [1.2346, 2.0]
    assert json.loads(dumps_point({})) == {} and json.loads(dumps_point({"requests": []})) == {
        "requests": []
    }


def test_safe_name_accepts_ordinary_names():
    for ok in ("bs32-r0", "block_size=32-r0", "cpu-20261202-130000-abc123", "a.b_c-1"):
        assert safe_name(ok) == ok
    with pytest.raises(ConfigError):
        SweepDir("/tmp").path("../etc/passwd")


def test_point_row_is_the_one_layout():
    row = point_row(
        {
            "point_id": "a-r0",
            "config": "a",
            "repeat": 0,
            "status": "ok",
            "settings": {"block_size": 32, "compilation_config": {"level": 0}},
            "workload": {"name": "fixed"},
            "metrics": {"ttft_p50_ms": 1.5, "nested": {"x": 1}},
            "capacity": {"num_gpu_blocks": 8, "max_num_seqs": 256, "per_layer": [1, 2]},
            "memory": {"device_memory_used_gib": 1.5},
            "engine_start_s": 3.0,
        }
    )
    assert row["block_size"] == 32 and row["compilation_config"] == '{"level": 0}'
    assert row["ttft_p50_ms"] == 1.5 and "nested" not in row and row["error"] is None
    assert row["cap_num_gpu_blocks"] == 8 and row["cap_max_num_seqs"] == 256
    assert "cap_per_layer" not in row and row["device_memory_used_gib"] == 1.5
    # identity, then settings, then the workload, then everything measured (summary.csv's order,
    # which assembly reads back where only a summary.csv is left)
    cols = list(row)
    assert cols[:6] == [
        "point_id",
        "config",
        "repeat",
        "status",
        "block_size",
        "compilation_config",
    ]
    assert cols[6] == "workload" and cols[-2:] == ["engine_start_s", "error"]


# --------------------------------------------------------------------------- sweep
def test_make_points_interleaves_repeats(base_point):
    pts = make_points(base_point, {"A": {}, "B": {"settings": {"block_size": 64}}}, repeats=2)
    assert [p["point_id"] for p in pts] == ["A-r0", "B-r0", "A-r1", "B-r1"]
    assert [(p["config"], p["repeat"]) for p in pts] == [("A", 0), ("B", 0), ("A", 1), ("B", 1)]
    # settings merge key by key; the base is not mutated and points do not share dicts
    assert pts[1]["settings"]["block_size"] == 64
    assert (
        pts[1]["settings"]["kv_cache_memory_bytes"]
        == base_point["settings"]["kv_cache_memory_bytes"]
    )
    assert "block_size" not in pts[0]["settings"] and "block_size" not in base_point["settings"]
    pts[0]["workload"]["num_requests"] = 99
    assert pts[2]["workload"]["num_requests"] != 99


def test_make_points_rejects_zero_repeats(base_point):
    with pytest.raises(ConfigError, match="repeats"):
        make_points(base_point, {"A": {}}, repeats=0)


def test_grid_and_point_id():
    assert grid("block_size", [32, 64]) == {
        "block_size=32": {"settings": {"block_size": 32}},
        "block_size=64": {"settings": {"block_size": 64}},
    }
    assert point_id("a", 2) == "a-r2" and point_id("a") == "a"
    pts = make_points({"model": "tiny-ernie"}, grid("block_size", [32, 64]), repeats=2)
    assert [p["point_id"] for p in pts][:2] == ["block_size=32-r0", "block_size=64-r0"]
    with pytest.raises(ConfigError):
        point_id("../a", 0)


class FakeRunner:
    """Stands in for engine.run_point: records calls, fails the configs it is told to."""

    def __init__(self, fail=()):
        self.calls: list[str] = []
        self.fail = set(fail)

    def __call__(self, point, **kw):
        assert point._valid  # the sweep validated it once, before any point ran
        self.calls.append(point.point_id)
        res = {
            "point_id": point.point_id,
            "config": point.config,
            "repeat": point.repeat,
            "settings": point.settings,
            "workload": {"name": "fixed"},
        }
        if point.config in self.fail:
            return {**res, "status": "failed", "error": "ValueError: synthetic failure"}
        return {
            **res,
            "status": "ok",
            "metrics": {"output_throughput_tok_s": 100.0 + len(self.calls)},
        }


@pytest.fixture
def fake(monkeypatch):
    def install(fail=()):
        f = FakeRunner(fail)
        monkeypatch.setattr(engine, "run_point", f)
        return f

    return install


def _points(base_point, repeats=1):
    return make_points(base_point, {"A": {}, "B": {"settings": {"block_size": 64}}}, repeats)


@pytest.mark.vllm
def test_sweep_writes_every_point_and_a_summary(fake, base_point, run_dir):
    f = fake(fail={"B"})
    out = run_dir / "nb" / "s"
    df = run_sweep(_points(base_point, 2), out, progress=False)
    assert f.calls == ["A-r0", "B-r0", "A-r1", "B-r1"]  # a failure does not stop the sweep
    assert sorted(p.name for p in out.glob("*.json")) == [
        "A-r0.json",
        "A-r1.json",
        "B-r0.json",
        "B-r1.json",
    ]
    failed = json.loads((out / "B-r0.json").read_text())
    assert failed["status"] == "failed" and "synthetic failure" in failed["error"]
    assert list(df["point_id"]) == ["A-r0", "A-r1", "B-r0", "B-r1"]
    assert list(df["status"]) == ["ok", "ok", "failed", "failed"]
    with open(out / "summary.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["point_id"] for r in rows] == ["A-r0", "A-r1", "B-r0", "B-r1"]
    assert rows[2]["error"] == "ValueError: synthetic failure" and rows[0]["error"] == ""
    assert rows[2]["block_size"] == "64" and rows[0]["output_throughput_tok_s"]
    assert not list(out.glob("*.tmp")) and not list(out.glob(".*"))


@pytest.mark.vllm
def test_resume_skips_ok_points_and_retries_failed(fake, base_point, run_dir):
    f = fake(fail={"B"})
    run_sweep(_points(base_point), run_dir, progress=False)
    before = (run_dir / "A-r0.json").read_text()
    f2 = fake(fail=())
    df = run_sweep(_points(base_point), run_dir, progress=False)
    assert f.calls == ["A-r0", "B-r0"] and f2.calls == ["B-r0"]
    assert (run_dir / "A-r0.json").read_text() == before  # untouched
    assert list(df["status"]) == ["ok", "ok"]
    f3 = fake()
    run_sweep(_points(base_point), run_dir, progress=False)
    assert f3.calls == []  # all done: nothing runs


@pytest.mark.vllm
def test_resume_without_retry_keeps_failed_points(fake, base_point, run_dir):
    fake(fail={"B"})
    run_sweep(_points(base_point), run_dir, progress=False)
    f2 = fake()
    df = run_sweep(_points(base_point), run_dir, progress=False, retry_failed=False)
    assert f2.calls == [] and list(df["status"]) == ["ok", "failed"]


@pytest.mark.vllm
def test_sweep_frame_only_has_this_sweeps_points(fake, base_point, run_dir):
    fake()
    run_sweep(_points(base_point), run_dir, progress=False)
    df = run_sweep(make_points(base_point, {"C": {}}), run_dir, progress=False)
    assert list(df["point_id"]) == ["C-r0"]


@pytest.mark.vllm
def test_duplicate_point_ids_are_rejected_before_anything_runs(fake, base_point, run_dir):
    f = fake()
    pts = _points(base_point) + make_points(base_point, {"A": {}})
    with pytest.raises(ConfigError, match=r"duplicate point ids.*A-r0"):
        run_sweep(pts, run_dir, progress=False)
    assert f.calls == [] and not list(run_dir.glob("*.json"))


@pytest.mark.vllm
def test_an_invalid_point_stops_the_sweep_before_any_engine(fake, base_point, run_dir):
    f = fake()
    pts = _points(base_point) + make_points(base_point, {"C": {"settings": {"block_size": 16}}})
    with pytest.raises(ConfigError, match="block_size"):
        run_sweep(pts, run_dir, progress=False)
    assert f.calls == []


@pytest.mark.vllm
def test_unknown_executor_is_a_config_error(fake, base_point, run_dir):
    fake()
    with pytest.raises(ConfigError, match="executor"):
        run_sweep(_points(base_point), run_dir, progress=False, executor="slurm")


def test_compacted_points_read_back_whole(tmp_path):
    """compact_point moves per-request records into a gzipped sidecar; every reader sees them."""
    from tunebook.core.results import SIDECAR, compact_point, load_point
    from tunebook.topics.assemble import load_sweep_dir

    sd = SweepDir(tmp_path / "sw")
    reqs = [{"ttft_ms": 1.5 + i, "output_tokens": 3} for i in range(50)]
    sd.write("a-r0", {"point_id": "a-r0", "config": "a", "status": "ok", "requests": reqs})
    f = sd.path("a-r0")
    whole = load_point(f)
    assert compact_point(f) > 0 and compact_point(f) == 0  # idempotent
    assert "requests" not in json.loads(f.read_text())
    assert (f.parent / f"a-r0{SIDECAR}").is_file()
    assert load_point(f) == whole == sd.read("a-r0") == sd.points()[0]
    assert load_sweep_dir(sd.root).points[0]["requests"] == reqs


def test_a_configuration_sets_its_own_rate_and_search_start_for_one_workload():
    base = {"model": "tiny-ernie", "mode": "served", "slo": {"ttft_ms": 1}, "workload": {}}
    wls = {
        "at_cap": {"kind": "fixed", "prompt_len": 8, "output_len": 4},
        "held": {"kind": "fixed", "prompt_len": 64, "output_len": 4},
    }
    configs = {
        "a": {
            "per_workload": {"at_cap": {"workload": {"request_rate": 90.0}, "client": "vllm-bench"}}
        },
        "b": {"per_workload": {"held": {"search": {"start_rps": 512.0}}}},
    }
    pts = make_points(
        base, configs, 1, wls, point_overrides={"held": {"search": {"duration_s": 20.0}}}
    )
    by = {p["point_id"]: p for p in pts}
    assert (
        by["a--at_cap-r0"]["workload"]["request_rate"] == 90.0
        and by["a--at_cap-r0"]["client"] == "vllm-bench"
    )
    assert (
        "request_rate" not in by["b--at_cap-r0"]["workload"] and "client" not in by["b--at_cap-r0"]
    )
    assert by["b--held-r0"]["search"] == {"duration_s": 20.0, "start_rps": 512.0}
    assert by["a--held-r0"]["search"] == {"duration_s": 20.0}
    with pytest.raises(ConfigError, match="per_workload"):
        make_points(base, {"a": {"per_workload": {"nope": {}}}}, 1, wls)
