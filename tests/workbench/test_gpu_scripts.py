"""The GPU-node scripts' own logic, off a GPU: which runner calls `scripts/gpu_run.sh` makes for
its notebook steps, `scripts/gpu_detached.sh` running it across commands, and
`scripts/scrub_paths.py` on plain and gzipped files. The runner here is a
stand-in that only writes run.json; what the real one does is tested in test_cost and
test_reliability."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Stands in for `python3 -m tunebook run`: logs its notebooks, records a call of each in run.json
# (status from FAIL, a notebook number), and stops at a failure as the runner does.
FAKE_RUNNER = r"""
import json, os, sys, time
argv = sys.argv[1:]
if argv[:3] != ["-m", "tunebook", "run"]:
    os.execv(os.environ["REAL_PY"], [os.environ["REAL_PY"], *argv])
books = [argv[i + 1] for i, a in enumerate(argv) if a == "--notebook"]
rid = argv[argv.index("--run-id") + 1]
with open(os.environ["CALLS"], "a") as f:
    f.write(" ".join(books) + "\n")
time.sleep(float(os.environ.get("SLEEP") or 0))
path = os.path.join("runs", rid, "run.json")
state = json.load(open(path)) if os.path.exists(path) else {"notebooks": {}}
for b in books:
    name = b + "_nb"
    entry = state["notebooks"].get(name, {"calls": []})
    if entry.get("status") == "ok":
        continue
    status = "failed" if b == os.environ.get("FAIL") else "ok"
    entry["calls"].append({"status": status, "seconds": 1.0})
    entry["status"] = status
    state["notebooks"][name] = entry
    json.dump(state, open(path, "w"))
    if status == "failed":
        print("[tunebook] " + name + ": FAILED")
        sys.exit(1)
"""


def _node(tmp_path: Path, fail: str = "", sleep: float = 0.0) -> tuple[Path, dict, Path]:
    """A checkout with the scripts, and the environment of a node whose runner is the stand-in."""
    work = tmp_path / "work"
    (work / "scripts").mkdir(parents=True, exist_ok=True)
    for script in ("gpu_run.sh", "gpu_detached.sh"):
        (work / "scripts" / script).write_text((REPO / "scripts" / script).read_text())
    shim = tmp_path / "bin"
    shim.mkdir(exist_ok=True)
    (shim / "python3").write_text(f"#!{sys.executable}\n{FAKE_RUNNER}")
    (shim / "python3").chmod(0o755)
    (shim / "nvidia-smi").write_text("#!/bin/sh\nexit 1\n")
    (shim / "nvidia-smi").chmod(0o755)
    calls = tmp_path / "calls.txt"
    if not calls.exists():
        calls.write_text("")
    env = {
        **os.environ,
        "PATH": f"{shim}:{os.environ['PATH']}",
        "REAL_PY": sys.executable,
        "CALLS": str(calls),
        "FAIL": fail,
        "SLEEP": str(sleep),
        "OUT": str(tmp_path),
        "TMPDIR": str(tmp_path),
    }
    return work, env, calls


def _calls(calls: Path) -> list[list[str]]:
    return [line.split() for line in calls.read_text().splitlines()]


def _gpu_run(tmp_path: Path, *steps: str, fail: str = "") -> tuple[list[list[str]], str]:
    work, env, calls = _node(tmp_path, fail)
    calls.write_text("")
    r = subprocess.run(
        ["bash", "scripts/gpu_run.sh", "rid", "600", *steps],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return _calls(calls), r.stdout


@pytest.mark.slow
def test_consecutive_notebooks_share_one_runner_and_a_failure_leaves_out_only_itself(tmp_path):
    calls, out = _gpu_run(tmp_path, "00", "01", "02", fail="01")
    assert calls == [["00", "01", "02"], ["02"]], out  # 01 failed: the rest in a second runner
    state = json.loads((tmp_path / "work" / "runs" / "rid" / "run.json").read_text())
    assert {k: v["status"] for k, v in state["notebooks"].items()} == {
        "00_nb": "ok",
        "01_nb": "failed",
        "02_nb": "ok",
    }
    assert (tmp_path / "run.tgz").is_file()
    # The same plan again: what is done is skipped; the failed notebook is tried again.
    calls, out = _gpu_run(tmp_path, "00", "01", "02")
    assert calls == [["01"]], out
    assert "00: finished by an earlier call, skipped" in out


@pytest.mark.slow
def test_a_detached_run_goes_on_after_its_command_and_each_wait_brings_back_what_is_done(tmp_path):
    work, env, calls = _node(tmp_path, sleep=4.0)  # long enough to be found running twice

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", "scripts/gpu_detached.sh", *args],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    r = run("start", "rid", "0", "600", "00", "01")
    assert r.returncode == 0 and "still running; snapshot packed" in r.stdout, r.stdout + r.stderr
    assert (tmp_path / "run.tgz").is_file()
    assert run("start", "rid", "0", "600", "00").returncode == 1  # one run of an id at a time
    r = run("wait", "rid", "30")
    assert "rid finished" in r.stdout, r.stdout + r.stderr
    assert _calls(calls) == [["00", "01"]]  # one runner, not cut between commands
    with tarfile.open(tmp_path / "run.tgz") as tar:
        state = json.load(tar.extractfile("rid/run.json"))
    assert {k: v["status"] for k, v in state["notebooks"].items()} == {"00_nb": "ok", "01_nb": "ok"}
    # It ran in its own copy of the checkout, which the next command's copy cannot change.
    assert not (work / "runs").exists()
    assert run("wait", "nope", "1").returncode == 1


def test_scrub_paths_rewrites_plain_and_gzipped_files(tmp_path):
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "run.log").write_text("running -> /abs/checkout/runs/r/00.ipynb\n")
    (run / "replica0.log.gz").write_bytes(gzip.compress(b"model=/abs/checkout/models/m\n"))
    # how a node installed its packages: a virtualenv, and the bundle's pip --target folder
    trace = (
        'File "/opt/x/.venv/lib/python3.12/site-packages/torch/a.py"\n'
        'File "/tmp/site/vllm/b.py"\n'
        "a relative .venv/lib/python3.12/site-packages/ stays\n"
    )
    (run / "trace.log").write_text(trace)
    (run / "blob.bin").write_bytes(b"/abs/checkout/")  # not a text file: left alone
    r = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "scrub_paths.py"), str(run)]
        + ["--prefix", "/abs/checkout/", "--home", "/nohome/"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "scrubbed 3 files" in r.stdout
    assert (run / "trace.log").read_text() == trace.replace(
        "/opt/x/.venv/lib/python3.12/site-packages/", "site-packages/"
    ).replace("/tmp/site/", "site-packages/")
    assert (run / "run.log").read_text() == "running -> runs/r/00.ipynb\n"
    assert gzip.decompress((run / "replica0.log.gz").read_bytes()) == b"model=models/m\n"
    assert (run / "blob.bin").read_bytes() == b"/abs/checkout/"


@pytest.mark.slow
def test_kv_exact_checks_every_familys_full_shape_sized_in_bytes(tmp_path):
    """The step that shows KV arithmetic exact on a GPU (issue 43): engine_check.py on the three
    families' full shapes, engines sized in bytes (a gpu_memory_utilization engine's KV size is
    known only to the log's rounding)."""
    work, env, calls = _node(tmp_path)
    (work / "scripts" / "engine_check.py").write_text(
        "import os, sys\nopen(os.environ['CALLS'], 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
    )
    r = subprocess.run(
        ["bash", "scripts/gpu_run.sh", "rid", "600", "kv-exact"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    (argv,) = _calls(calls)
    models = [argv[i + 1] for i, a in enumerate(argv) if a == "--model"]
    assert models == ["ernie-4.5-0.3b-pt", "qwen3-0.6b", "llama-3.2-1b"]
    assert all((REPO / "models" / m / "config.json").is_file() for m in models)
    assert argv[argv.index("--run-dir") + 1] == "runs/rid/kv-exact"
    assert "--kv-bytes" not in argv  # engine_check sizes GPU engines in bytes itself (8 GiB)
