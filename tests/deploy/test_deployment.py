"""Assembly's deployment from served capacity, and the N-replica files (pure; no engine)."""

from __future__ import annotations

import json

import pytest
from conftest import write_sweep

from tunebook.deploy import writers
from tunebook.engine import adapter, flags
from tunebook.topics import capacity

CHOICE = {
    "scenario": "high_concurrency_chat",
    "scenario_title": "chat",
    "objective": "capacity",
    "slo": {},
    "changed": {},
    "decisions": [],
}


def write_capacity(run_dir, caps: dict, lag_at_failure: float = 1.0):
    """A notebook-04-like capacity sweep: config -> (settings, serve, [capacity per start])."""
    write_sweep(
        run_dir / "04_engine_overhead" / "capacity",
        [
            {
                "config": cfg,
                "repeat": r,
                "mode": "served",
                "settings": settings,
                "serve": serve_opts,
                "workload": {"name": "chat"},
                "metrics": {"capacity_rps": cap, "first_failing_rps": cap * 1.5, "slo": "99% ..."},
                "per_rate": [
                    {"offered_rps": cap, "slo_holds": True, "lag_p99_ms": 1.0},
                    {"offered_rps": cap * 1.5, "slo_holds": False, "lag_p99_ms": lag_at_failure},
                ],
            }
            for cfg, (settings, serve_opts, values) in caps.items()
            for r, cap in enumerate(values)
        ],
    )


def test_a_configuration_that_serves_more_beyond_the_noise_is_chosen(tmp_path):
    write_capacity(
        tmp_path,
        {
            "default": ({}, {}, [90, 91, 90]),
            "replicas=4": (
                {"kv_cache_memory_bytes": 1 << 30},
                {"replicas": 4, "router_policy": "round_robin", "client_workers": 4},
                [700, 724, 720],
            ),
            "si16": ({"stream_interval": 16}, {}, [250, 256, 260]),
        },
    )
    d = capacity.choose_deployment(tmp_path)
    assert d["status"] == "changed" and d["config"] == "replicas=4" and d["replicas"] == 4
    assert d["serve"] == {"replicas": 4, "router_policy": "round_robin"}  # no client options
    assert d["settings"] == {"kv_cache_memory_bytes": 1 << 30}
    assert d["vs_default"] == pytest.approx(720 / 90) and "beyond noise" in d["noise"]
    assert "lower bound" not in d["reason"]
    assert [r["config"] for r in d["ranking"]] == ["replicas=4", "si16", "default"]


def test_within_noise_or_two_starts_keeps_the_default(tmp_path):
    write_capacity(
        tmp_path, {"default": ({}, {}, [90, 120]), "replicas=2": ({}, {"replicas": 2}, [100, 130])}
    )
    d = capacity.choose_deployment(tmp_path)
    assert d["status"] == "kept: within noise" and d["replicas"] == 1 and d["settings"] == {}
    assert "no configuration beats the default's capacity" in d["reason"]
    assert "best measured: replicas=2 at" in d["reason"]
    # The default measured highest: said plainly, not "default at 1.00x ((reference))".
    write_capacity(
        tmp_path, {"default": ({}, {}, [150, 160]), "replicas=2": ({}, {"replicas": 2}, [100, 130])}
    )
    d = capacity.choose_deployment(tmp_path)
    assert d["status"] == "kept: default is best"
    assert "(155 req/s); the default measured highest; runner-up: replicas=2 at 115" in d["reason"]
    # the margin to the runner-up, by the one noise rule (two starts a side: never beyond it)
    assert d["runner_up"]["config"] == "replicas=2" and d["runner_up"]["within_noise"] is True
    assert d["runner_up"]["ratio"] == pytest.approx(155 / 115)


def test_a_client_that_fell_behind_makes_the_capacity_a_lower_bound(tmp_path):
    write_capacity(
        tmp_path,
        {"default": ({}, {}, [90, 90, 90]), "r2": ({}, {"replicas": 2}, [300, 300, 300])},
        lag_at_failure=400.0,
    )
    d = capacity.choose_deployment(tmp_path)
    assert d["status"] == "changed" and "a lower bound" in d["reason"]
    # the start script's "chosen:" line names the runner-up and the margin
    assert d["reason"].endswith(
        "runner-up: default at 90 req/s, the chosen one 3.33x it (beyond noise: ranges apart over"
        " 3 and 3 engine starts, p=0.10 by chance)"
    ), d["reason"]


def test_a_best_measured_without_enough_starts_does_not_hide_one_that_beats_the_default(tmp_path):
    # As on an H100 (runs/h100-20261205-p): 4 replicas served most, but two of their three
    # starts failed; stream_interval=16 beat the default over three starts each.
    write_capacity(
        tmp_path,
        {
            "default": ({}, {}, [181, 181, 181]),
            "replicas=4": ({}, {"replicas": 4}, [724]),
            "si16": ({"stream_interval": 16}, {}, [362, 362, 362]),
        },
    )
    d = capacity.choose_deployment(tmp_path)
    assert d["status"] == "changed" and d["config"] == "si16" and d["replicas"] == 1
    assert d["settings"] == {"stream_interval": 16} and d["vs_default"] == pytest.approx(2.0)
    assert "replicas=4 measured more (4.00x) but not beyond the noise" in d["reason"]
    assert [r["config"] for r in d["ranking"]] == ["replicas=4", "si16", "default"]
    assert [r["failed_starts"] for r in d["ranking"]] == [0, 0, 0]


def test_failed_starts_are_counted_and_said(tmp_path):
    write_capacity(
        tmp_path,
        {"default": ({}, {}, [181, 181, 181]), "replicas=4": ({}, {"replicas": 4}, [724])},
    )
    folder = tmp_path / "04_engine_overhead" / "capacity"
    for r in (1, 2):
        (folder / f"replicas=4-r{r}.json").write_text(
            json.dumps(
                {
                    "point_id": f"replicas=4-r{r}",
                    "config": "replicas=4",
                    "repeat": r,
                    "status": "failed",
                    "error": "RuntimeError: replica 0 died during the run (killed by SIGKILL)",
                }
            )
        )
    d = capacity.choose_deployment(tmp_path)
    assert d["status"] == "kept: within noise"
    assert "2 of its 3 starts failed" in d["reason"], d["reason"]
    assert d["ranking"][0]["failed_starts"] == 2


def test_no_capacity_evidence_is_none(tmp_path):
    assert capacity.choose_deployment(tmp_path) is None


@pytest.mark.vllm
def test_replica_files_share_the_card_and_parse_with_vllm(tmp_path):
    kwargs = flags.deploy_kwargs(
        "tiny-ernie",
        {"kv_cache_memory_bytes": 1 << 25, "stream_interval": 8, "enforce_eager": True},
    )
    paths = writers.write_deployment(
        tmp_path, {**CHOICE, "served_choice": {"reason": "r2 serves 3x"}}, kwargs, 2, "power_of_two"
    )
    assert sorted(paths) == ["deployment.json", "replica0.yaml", "replica1.yaml", "start.sh"]
    for i in range(2):
        ns = adapter.parse_serve_args(["--config", str(paths[f"replica{i}.yaml"])])
        assert ns["kv_cache_memory_bytes"] == 1 << 25 and ns["stream_interval"] == 8
        # vLLM's own default (not a copy of it) shared by 2
        gmu = adapter.engine_default("gpu_memory_utilization")
        assert ns["gpu_memory_utilization"] == pytest.approx(round(gmu / 2, 4))
    sh = paths["start.sh"].read_text()
    assert sh.count('vllm serve "$MODEL" --config replica') == 2 and "--policy power_of_two" in sh
    assert "trap 'kill" in sh and "# chosen: r2 serves 3x" in sh
    assert paths["start.sh"].stat().st_mode & 0o111
    # start.sh passes the model it found as the positional argument: it wins over the YAML's
    ns = adapter.parse_serve_args(["/elsewhere/ckpt", "--config", str(paths["replica0.yaml"])])
    assert ns["model"] == "/elsewhere/ckpt" and ns["kv_cache_memory_bytes"] == 1 << 25
    # the bound is written where the installed vLLM has it, and that vLLM parses it
    doc = json.loads(paths["deployment.json"].read_text())
    assert doc["overload"]["written_for"]["vllm"] == adapter.vllm_version()
    if "max_num_queued_reqs" in adapter.engine_fields():
        assert '--max-num-queued-reqs "$MAX_QUEUED"' in sh
        ns = adapter.parse_serve_args(["m", "--max-num-queued-reqs", "7"])
        assert ns["max_num_queued_reqs"] == 7
    else:
        assert "--max-num-queued-reqs" not in sh.split("set -euo pipefail")[1]


# --------------------------------------------------------------------------- start.sh, no engine
# What the installed vLLM and vllm-router are, given (so no test here imports vLLM): 0.32 can bound
# a replica's queue, 0.26 cannot.
V32 = {"vllm": "0.32.0", "vllm_router": "0.1.17", "max_num_queued_reqs": True}
V26 = {"vllm": "0.26.0", "vllm_router": "0.1.17", "max_num_queued_reqs": False}
KW = {
    "model": "models/tiny-ernie",
    "enforce_eager": True,
    "max_num_seqs": 16,
    "gpu_memory_utilization": 0.9,
}


def files_for(kwargs=KW, versions=V32, replicas=2, choice=None):
    return writers.deployment_files(
        choice or {**CHOICE, "served_choice": {"capacity_rps": 12.5, "slo": "99% ..."}},
        kwargs,
        replicas,
        served_model_name="tunebook",
        overload=writers.overload_settings(kwargs, replicas, versions),
    )


def test_start_sh_sheds_an_overload_and_says_why_for_each_setting():
    sh = files_for()["start.sh"]
    # each router setting against an overload on a line of its own, with its reason
    for flag, why in writers.ROUTER_OVERLOAD + writers.ROUTER_BOUNDED:
        line = next(x for x in sh.splitlines() if x.strip().startswith(flag + " "))
        assert line.rstrip().endswith("# " + why), line
    assert '"${router_flags[@]}"' in sh.splitlines()[-1]  # the router gets them
    # each replica admits max_num_seqs requests (overridable), and why
    assert "MAX_QUEUED=${MAX_QUEUED:-16}  # requests a replica admits" in sh
    assert "16 = max_num_seqs: the batch it runs at once" in sh
    assert sh.count('${MAX_QUEUED:+--max-num-queued-reqs "$MAX_QUEUED"} &') == 2
    assert "written for vLLM 0.32.0 and vllm-router 0.1.17" in sh
    # the open-file limit: raised to the hard one, and one line when that is below the need
    assert "hard=$(ulimit -Hn)" in sh and 'ulimit -n "$hard" 2>/dev/null || true' in sh
    assert "NEED_FILES=$((4 * REPLICAS * MAX_QUEUED + 1024))" in sh
    assert "every streamed request holds a client socket and a replica socket in the router" in sh
    doc = json.loads(files_for()["deployment.json"])
    assert doc["capacity_rps"] == 12.5 and doc["model"] == "models/tiny-ernie"
    assert doc["overload"]["max_num_queued_reqs"] == 16
    assert doc["overload"]["open_files_needed"] == 4 * 2 * 16 + 1024
    flags_written = [r["flag"] for r in doc["overload"]["router"]]
    assert "--max-concurrent-requests 32" in flags_written and "--queue-size 0" in flags_written


def test_start_sh_for_a_vllm_without_the_queue_bound_writes_no_such_flag():
    sh = files_for(versions=V26)["start.sh"]
    serves = [x for x in sh.splitlines() if x.startswith("vllm serve")]
    assert len(serves) == 2 and not any("--max-num-queued-reqs" in x for x in serves)
    assert "MAX_QUEUED" not in sh and "--max-concurrent-requests" not in sh
    assert "no bound on the requests a replica admits: vLLM 0.26.0 has no" in sh
    assert "NEED_FILES=65535" in sh and "--disable-circuit-breaker" in sh
    # max_num_seqs unknown (vLLM's default): no bound written, the way to set one said
    kw = {k: v for k, v in KW.items() if k != "max_num_seqs"}
    settings = writers.overload_settings(kw, 2, V32)
    if settings["max_num_queued_reqs"] is None:  # tunebook cannot read vLLM's default here
        sh = files_for(kw)["start.sh"]
        assert "MAX_QUEUED=${MAX_QUEUED:-}  # unset: no bound" in sh


def test_the_model_folder_is_the_measured_one_or_its_place_in_this_checkout():
    from tunebook.core.model import REPO_ROOT

    assert writers.model_candidates("models/x") == ["models/x"]
    assert writers.model_candidates(str(REPO_ROOT / "models" / "x")) == [
        str(REPO_ROOT / "models" / "x"),
        "models/x",
    ]
    assert writers.model_candidates("/elsewhere/x") == ["/elsewhere/x"]


# --------------------------------------------------------------------------- start.sh run by bash
def stub_bin(tmp_path):
    """`vllm` and `vllm-router` that only write down how they were called (and the router its
    open-file limit), so start.sh runs to its end in a second."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text('#!/bin/sh\necho "vllm $*" >> "$STUB_LOG"\n')
    (bin_dir / "vllm-router").write_text(
        '#!/bin/sh\necho "router nofile=$(ulimit -Sn) $*" >> "$STUB_LOG"\n'
    )
    for p in bin_dir.iterdir():
        p.chmod(0o755)
    return bin_dir


def run_script(script, tmp_path, env=None, limits=None):
    """Run ``script`` with bash as a user does, from ``tmp_path``, with the stubs on PATH;
    ``limits``: ulimit commands run first (the machine's limits, as a node's administrator sets
    them). Returns (the finished process, the stubs' calls)."""
    import os
    import subprocess

    log = tmp_path / "calls.log"
    log.write_text("")
    cmd = ["bash", str(script)]
    if limits:
        cmd = ["bash", "-c", f'{limits}; exec bash "{script}"']
    r = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,  # not the script's folder
        env={
            "PATH": f"{stub_bin_dir(tmp_path)}{os.pathsep}{os.environ['PATH']}",
            "STUB_LOG": str(log),
            "HOME": str(tmp_path),
            **(env or {}),
        },
    )
    return r, log.read_text().splitlines()


def stub_bin_dir(tmp_path):
    d = tmp_path / "bin"
    return d if d.is_dir() else stub_bin(tmp_path)


def kept_run(tmp_path, model="models/m"):
    """A checkout with models/m, and a deployment kept in a run folder inside it."""
    checkout = tmp_path / "checkout"
    (checkout / "models" / "m").mkdir(parents=True)
    (checkout / "models" / "m" / "config.json").write_text("{}")
    dep = checkout / "runs" / "r1" / "05_assemble_config" / "deployment"
    dep.mkdir(parents=True)
    for name, text in files_for({**KW, "model": model}).items():
        (dep / name).write_text(text)
    return checkout, dep


def test_start_sh_finds_the_model_from_its_folder_upwards_and_model_wins(tmp_path):
    checkout, dep = kept_run(tmp_path)
    r, calls = run_script(dep / "start.sh", tmp_path)
    assert r.returncode == 0, r.stderr
    serves = [c for c in calls if c.startswith("vllm serve")]
    assert len(serves) == 2
    want = f"vllm serve {checkout}/models/m --config replica"
    assert all(c.startswith(want) for c in serves), serves
    assert all("--max-num-queued-reqs 16" in c for c in serves)
    router = next(c for c in calls if c.startswith("router"))
    for flag in ("--disable-circuit-breaker", "--disable-retries", "--queue-size 0"):
        assert flag in router
    assert "--max-concurrent-requests 32" in router and "--health-check-interval-secs 10" in router
    # $MODEL wins; MAX_QUEUED sets the bound and the router's with it
    r, calls = run_script(
        dep / "start.sh", tmp_path, env={"MODEL": "/data/ckpt", "MAX_QUEUED": "5"}
    )
    assert r.returncode == 0, r.stderr
    serves = [c for c in calls if c.startswith("vllm serve")]
    assert all(c.startswith("vllm serve /data/ckpt --config replica") for c in serves), serves
    assert all("--max-num-queued-reqs 5" in c for c in serves)
    assert "--max-concurrent-requests 10" in next(c for c in calls if c.startswith("router"))


def test_start_sh_without_its_model_exits_2_with_one_line(tmp_path):
    _, dep = kept_run(tmp_path)
    away = tmp_path / "away" / "deployment"
    away.parent.mkdir()
    dep.rename(away)
    r, calls = run_script(away / "start.sh", tmp_path)
    assert r.returncode == 2 and calls == []  # nothing started
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0] == (
        f"start.sh: no model folder models/m (in {away} or a folder above it) holds a"
        " config.json; set MODEL=<checkpoint folder>"
    )


def test_start_sh_raises_the_open_file_limit_and_says_when_the_hard_one_is_too_low(tmp_path):
    _, dep = kept_run(tmp_path)
    # soft 256, hard 4096: raised to the hard limit, which is enough (4*2*16+1024 = 1152)
    r, calls = run_script(dep / "start.sh", tmp_path, limits="ulimit -Sn 256; ulimit -Hn 4096")
    assert r.returncode == 0, r.stderr
    assert "nofile=4096" in next(c for c in calls if c.startswith("router"))
    assert "open-file hard limit" not in r.stderr
    # hard 512: one line on stderr, with why, and the deployment still starts
    r, calls = run_script(dep / "start.sh", tmp_path, limits="ulimit -n 512")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stderr.splitlines() if "open-file hard limit" in x)
    assert line.startswith("start.sh: open-file hard limit 512 is below the 1152 this deployment")
    assert "every streamed request holds a client socket and a replica socket" in line
    assert "nofile=512" in next(c for c in calls if c.startswith("router"))


def test_serve_sh_finds_the_model_like_start_sh(tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / "models" / "m").mkdir(parents=True)
    (checkout / "models" / "m" / "config.json").write_text("{}")
    out = checkout / "runs" / "r1" / "05_assemble_config"
    files = writers.render_files(CHOICE, {"model": "models/m", "max_num_seqs": 8}, None, "tunebook")
    out.mkdir(parents=True)
    (out / "serve.sh").write_text(files["serve.sh"])
    r, calls = run_script(out / "serve.sh", tmp_path)
    assert r.returncode == 0, r.stderr
    assert calls == [
        f"vllm serve {checkout}/models/m --max-num-seqs 8 --served-model-name tunebook"
    ]
    r, calls = run_script(out / "serve.sh", tmp_path, env={"MODEL": "/data/ckpt"})
    assert calls == ["vllm serve /data/ckpt --max-num-seqs 8 --served-model-name tunebook"]
    # the line tunebook's checks read still names the model as measured
    assert flags.serve_sh_args(out / "serve.sh")[:1] == ["models/m"]
    (out / "serve.sh").rename(tmp_path / "serve.sh")
    r, calls = run_script(tmp_path / "serve.sh", tmp_path)
    assert r.returncode == 2 and calls == []
    assert r.stderr.strip() == (
        f"serve.sh: no model folder models/m (in {tmp_path} or a folder above it) holds a"
        " config.json; set MODEL=<checkpoint folder>"
    )
