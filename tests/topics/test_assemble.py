"""Assembling a configuration from saved sweeps: discovery, the choice rule, writers, explorer.

Pure logic on synthetic sweep folders written with tunebook.core.results (no engine): the numbers are
made up so that each rule (beyond noise, within noise, single run, no default point, SLO, policy)
is exercised on purpose.
"""

from __future__ import annotations

import json
import os
import stat

import pytest
import yaml
from conftest import write_sweep as write_points

from tunebook.core.results import SweepDir
from tunebook.deploy import writers
from tunebook.engine import flags
from tunebook.topics import assemble

BASE = {"enforce_eager": True, "kv_cache_memory_bytes": 67108864, "max_model_len": 2048}
SLO = {"ttft_ms": 1000.0, "tpot_ms": 100.0}


def _requests(n: int, ttft: float, tpot: float) -> list[dict]:
    return [
        {"ttft_ms": ttft, "tpot_ms": tpot, "prompt_tokens": 16, "output_tokens": 8}
        for _ in range(n)
    ]


def write_sweep(
    run_dir,
    notebook: str,
    sweep: str,
    configs: dict,
    workload: str = "fixed",
    capacity: dict | None = None,
    status: dict | None = None,
) -> SweepDir:
    """configs: name -> (settings, [metrics per repeat]); metrics may carry '_req' = (ttft, tpot)."""
    pts = []
    for name, (settings, reps) in configs.items():
        for r, m in enumerate(reps):
            m = dict(m)
            req = m.pop("_req", None)
            ok = (status or {}).get(f"{name}-r{r}", "ok")
            cap = {
                "block_size": 128,
                "enable_prefix_caching": True,
                "max_num_batched_tokens": 4096,
                "kv_capacity_tokens": 131072,
                **(capacity or {}),
            }
            cap.update({k: v for k, v in settings.items() if k in cap})
            pts.append(
                {
                    "config": name,
                    "repeat": r,
                    "status": ok,
                    "settings": {**BASE, **settings},
                    "workload": {"name": workload, "kind": workload},
                    "metrics": {"duration_s": 1.0, **m} if ok == "ok" else {},
                    "capacity": cap if ok == "ok" else {},
                    "requests": _requests(10, *req) if req and ok == "ok" else [],
                    "error": None if ok == "ok" else "EngineFailure: boom",
                }
            )
    return write_points(run_dir / notebook / sweep, pts)


def tput(*vals, ttft=100.0, tpot=10.0):
    return [
        {
            "output_throughput_tok_s": v,
            "request_throughput_rps": v / 10,
            "ttft_p99_ms": ttft,
            "tpot_p50_ms": tpot,
            "_req": (ttft, tpot),
        }
        for v in vals
    ]


def decision(choice, setting):
    return next(d for d in choice["decisions"] if d["setting"] == setting)


# --------------------------------------------------------------------------- discovery
def test_discover_lists_sweeps_and_what_they_vary(tmp_path):
    write_sweep(
        tmp_path,
        "02_block_size_sweep",
        "block_size",
        {
            "default": ({}, tput(100, 101, 100.5)),
            "block_size=64": ({"block_size": 64}, tput(120, 121, 120.5)),
        },
    )
    write_sweep(tmp_path, "03_prefill_scaling", "prompt_length", {"len=128": ({}, tput(5))})
    write_sweep(
        tmp_path, "05_assemble_config", "validate-x", {"chosen": ({}, tput(1))}
    )  # own output: skipped
    (tmp_path / "claims").mkdir()
    (tmp_path / "claims" / "00_baseline.json").write_text("[]")
    (tmp_path / "01_kv_cache_sizing" / "empty").mkdir(
        parents=True
    )  # no points, no summary: skipped
    sweeps = assemble.discover(tmp_path)
    assert [s.key for s in sweeps] == [
        "02_block_size_sweep/block_size",
        "03_prefill_scaling/prompt_length",
    ]
    bs = sweeps[0]
    assert bs.varied == ["block_size"] and bs.n_ok == 6
    names = bs.metric_names()  # measured and engine-sized figures; settings are not metrics
    assert "output_throughput_tok_s" in names and "cap_kv_capacity_tokens" in names
    assert "block_size" not in names and "point_id" not in names
    inv = assemble.inventory(sweeps)
    assert list(inv["varies"]) == ["block_size", "-"]
    assert assemble.resolved_defaults(sweeps)["block_size"] == 128


def test_discover_missing_run_dir_is_empty(tmp_path):
    assert assemble.discover(tmp_path / "nope") == []
    choice = assemble.choose([], "high_throughput", None, BASE)
    assert choice["changed"] == {} and choice["settings"] == BASE
    text = assemble.recommendation_text(choice)
    assert "No evidence for prefix caching" in text and "No evidence for KV block size" in text


def test_summary_csv_only_sweep_is_read(tmp_path):
    sd = write_sweep(
        tmp_path,
        "02_block_size_sweep",
        "block_size",
        {
            "default": ({}, tput(100, 101, 100.5)),
            "block_size=64": ({"block_size": 64}, tput(150, 152, 151)),
        },
    )
    for p in sd.root.glob("*.json"):
        p.unlink()
    (sw,) = assemble.discover(tmp_path)
    assert sw.points == [] and sw.varied == ["block_size"]
    assert sw.settings["block_size=64"]["block_size"] == 64
    choice = assemble.choose([sw], "high_throughput", None, BASE)
    assert choice["changed"] == {"block_size": 64}


# --------------------------------------------------------------------------- the choice rule
def test_change_only_beyond_noise_and_report_runner_up(tmp_path):
    write_sweep(
        tmp_path,
        "02_block_size_sweep",
        "block_size",
        {
            "default": ({}, tput(100, 105, 102.5)),
            "block_size=32": ({"block_size": 32}, tput(140, 152, 146)),
            "block_size=64": ({"block_size": 64}, tput(150, 155, 152.5)),
        },
    )
    choice = assemble.choose(assemble.discover(tmp_path), "high_throughput", None, BASE)
    d = decision(choice, "block_size")
    assert d["status"] == "changed" and d["value"] == 64 and choice["changed"] == {"block_size": 64}
    assert choice["settings"] == {**BASE, "block_size": 64}
    assert (
        d["reference"] == "default"
        and d["best"] == "block_size=64"
        and d["runner_up"] == "block_size=32"
    )
    assert d["gap_to_runner_up"]["within_noise"] is True  # 140-152 overlaps 150-155
    assert d["vs_default"]["within_noise"] is False and d["vs_default"]["ratio"] == pytest.approx(
        152.5 / 102.5
    )
    assert d["notebook"] == "02_block_size_sweep" and d["sweep"] == "block_size"
    assert d["figure"] == "02_block_size_sweep/block_size: output_throughput_tok_s by block_size"
    assert set(d) == set(assemble.DECISION_KEYS)


def test_within_noise_keeps_the_default(tmp_path):
    write_sweep(
        tmp_path,
        "02_block_size_sweep",
        "block_size",
        {
            "default": ({}, tput(95, 110, 102.5)),
            "block_size=64": ({"block_size": 64}, tput(100, 130, 115)),
        },
    )
    choice = assemble.choose(assemble.discover(tmp_path), "high_throughput", None, BASE)
    d = decision(choice, "block_size")
    assert d["status"] == "kept: within noise" and not d["changed"] and choice["changed"] == {}
    assert "within noise: ranges overlap" in d["reason"]


def test_ranges_apart_over_two_starts_a_side_are_noise(tmp_path):
    # Ranges 100-110 and 112-125 do not overlap, but two starts a side come apart by chance one
    # time in three: the one noise rule (metrics.compare) needs three starts a side.
    write_sweep(
        tmp_path,
        "02_block_size_sweep",
        "block_size",
        {
            "default": ({}, tput(100, 110)),
            "block_size=64": ({"block_size": 64}, tput(112, 125)),
        },
    )
    d = decision(
        assemble.choose(assemble.discover(tmp_path), "high_throughput", None, BASE), "block_size"
    )
    assert d["vs_default"]["within_noise"] is True
    assert d["vs_default"]["p_chance"] == pytest.approx(1 / 3)
    assert d["status"] == "kept: within noise" and not d["changed"]
    assert "ranges apart, but 2 and 2 engine starts come apart by chance p=0.33" in d["reason"]


def test_single_run_per_config_is_not_evidence(tmp_path):
    write_sweep(
        tmp_path,
        "02_block_size_sweep",
        "block_size",
        {
            "default": ({}, tput(100)),
            "block_size=64": ({"block_size": 64}, tput(300)),
        },
    )
    d = decision(
        assemble.choose(assemble.discover(tmp_path), "high_throughput", None, BASE), "block_size"
    )
    assert d["status"] == "kept: too few repeats" and not d["changed"]


def test_no_default_point_means_no_change(tmp_path):
    write_sweep(
        tmp_path,
        "03_prefill_scaling",
        "max_num_batched_tokens",
        {
            "max_num_batched_tokens=512": ({"max_num_batched_tokens": 512}, tput(50, 51, 50.5)),
            "max_num_batched_tokens=8192": (
                {"max_num_batched_tokens": 8192},
                tput(200, 201, 200.5),
            ),
        },
    )  # vLLM's resolved default (4096 here) is not among them
    d = decision(
        assemble.choose(assemble.discover(tmp_path), "high_throughput", None, BASE),
        "max_num_batched_tokens",
    )
    assert d["status"] == "kept: no default point" and not d["changed"]


def test_reference_found_by_resolved_default(tmp_path):
    # 00 ran vLLM's default (block_size left out; the engine resolved it to 128) ...
    write_sweep(tmp_path, "00_baseline", "plain", {"default": ({}, tput(10, 10, 10))})
    # ... and 02 swept explicit values only: 128 is the default, so it is the reference.
    write_sweep(
        tmp_path,
        "02_block_size_sweep",
        "block_size",
        {
            "block_size=32": ({"block_size": 32}, tput(100, 104, 102)),
            "block_size=128": ({"block_size": 128}, tput(150, 155, 152.5)),
        },
    )
    choice = assemble.choose(assemble.discover(tmp_path), "high_throughput", None, BASE)
    d = decision(choice, "block_size")
    assert d["reference"] == "block_size=128" and d["status"] == "kept: default is best"
    assert choice["resolved_defaults"]["block_size"] == 128


def write_seqs_tradeoff(run_dir):
    """max_num_seqs 1024 has more throughput, 16 a lower TTFT; both separated from the default."""
    write_sweep(
        run_dir,
        "03_prefill_scaling",
        "max_num_seqs",
        {
            "default": ({}, tput(100, 102, 101, ttft=500.0)),
            "max_num_seqs=16": ({"max_num_seqs": 16}, tput(60, 62, 61, ttft=100.0)),
            "max_num_seqs=1024": ({"max_num_seqs": 1024}, tput(150, 152, 151, ttft=900.0)),
        },
    )


def test_scenario_decides_the_metric(tmp_path):
    write_seqs_tradeoff(tmp_path)
    sweeps = assemble.discover(tmp_path)
    assert assemble.choose(sweeps, "high_throughput", None, BASE)["changed"] == {
        "max_num_seqs": 1024
    }
    low = assemble.choose(sweeps, "low_latency", SLO, BASE)
    assert low["changed"] == {"max_num_seqs": 16}
    assert decision(low, "max_num_seqs")["metric"] == "ttft_p99_ms"


def test_slo_excludes_configs_and_goodput_is_recomputed(tmp_path):
    write_sweep(
        tmp_path,
        "03_prefill_scaling",
        "max_num_seqs",
        {
            "default": ({}, tput(100, 101, 100.5, ttft=400.0, tpot=20.0)),
            "max_num_seqs=1024": (
                {"max_num_seqs": 1024},
                tput(200, 202, 201, ttft=1500.0, tpot=20.0),
            ),
        },
    )
    sweeps = assemble.discover(tmp_path)
    # Under a 1 s TTFT limit the faster config misses the SLO: goodput 0, default kept.
    strict = assemble.choose(sweeps, "high_concurrency_chat", SLO, BASE)
    d = decision(strict, "max_num_seqs")
    assert d["metric"] == "goodput_rps" and d["goodput_slo"]
    assert strict["changed"] == {} and d["best"] == "default"
    assert {r["config"]: r["meets_slo"] for r in d["ranking"]} == {
        "default": True,
        "max_num_seqs=1024": False,
    }
    # With a 2 s limit both meet it and every request counts: goodput 10 rps for both -> a tie.
    loose = assemble.choose(
        sweeps, "high_concurrency_chat", {"ttft_ms": 2000.0, "tpot_ms": 100.0}, BASE
    )
    assert decision(loose, "max_num_seqs")["status"] in (
        "kept: within noise",
        "kept: default is best",
    )


def test_default_missing_the_slo_in_every_repeat_is_a_reason(tmp_path):
    # Low latency: the default misses the TTFT limit in both repeats, the other meets it in both.
    write_sweep(
        tmp_path,
        "03_prefill_scaling",
        "max_num_batched_tokens",
        {
            "default": ({}, tput(100, 100, 100, ttft=1200.0)),
            "max_num_batched_tokens=1024": (
                {"max_num_batched_tokens": 1024},
                tput(100, 100, 100, ttft=800.0),
            ),
        },
    )
    sweeps = assemble.discover(tmp_path)
    d = decision(assemble.choose(sweeps, "low_latency", SLO, BASE), "max_num_batched_tokens")
    assert d["changed"] and d["value"] == 1024


def test_sweep_over_several_workloads_is_judged_per_workload(tmp_path):
    # Prefix caching on vs off at two prefix shares: off wins without sharing, on wins with it.
    sd = SweepDir(tmp_path / "01_kv_cache_sizing" / "prefix")
    cells = {
        ("share0", "off"): (120, 125, 122),
        ("share0", "on"): (100, 104, 102),
        ("share0.9", "off"): (100, 104, 102),
        ("share0.9", "on"): (300, 310, 305),
    }
    for (share, onoff), vals in cells.items():
        for r, v in enumerate(vals):
            pid = f"{share}-{onoff}-r{r}"
            sd.write(
                pid,
                {
                    "point_id": pid,
                    "config": f"{share}-{onoff}",
                    "repeat": r,
                    "status": "ok",
                    "settings": {**BASE, "enable_prefix_caching": onoff == "on"},
                    "workload": {"name": f"shared_prefix_{share[5:]}", "kind": "shared_prefix"},
                    "metrics": {"output_throughput_tok_s": v, "duration_s": 1.0},
                    "capacity": {"enable_prefix_caching": onoff == "on"},
                },
            )
    (sw,) = assemble.discover(tmp_path)
    assert sw.workload_varies and [p.part for p in sw.split_by_workload()] == [
        "shared_prefix_0",
        "shared_prefix_0.9",
    ]
    assert "several workloads" in assemble.inventory([sw])["varies"][0]
    # Every point set the flag, so vLLM's resolved default comes from outside (as 00's would).
    choice = assemble.choose(
        [sw], "high_throughput", None, BASE, defaults={"enable_prefix_caching": True}
    )
    d = decision(choice, "enable_prefix_caching")
    assert d["status"] == "kept: evidence disagrees" and not d["changed"]
    assert [(w["evidence"], w["status"]) for w in d["per_workload"]] == [
        ("01_kv_cache_sizing/prefix [shared_prefix_0.9]", "kept: default is best"),
        ("01_kv_cache_sizing/prefix [shared_prefix_0]", "changed"),
    ]
    assert assemble.evidence_sweep([sw], d).part == "shared_prefix_0.9"
    assert (
        assemble.decisions_table(choice)["evidence"][0]
        == "01_kv_cache_sizing/prefix [shared_prefix_0.9]"
    )


def test_policy_settings_are_never_changed_on_speed(tmp_path):
    write_sweep(
        tmp_path,
        "01_kv_cache_sizing",
        "kv_cache_dtype",
        {
            "default": ({}, tput(100, 101, 100.5)),
            "kv_cache_dtype=fp8": ({"kv_cache_dtype": "fp8"}, tput(200, 201, 200.5)),
        },
    )
    choice = assemble.choose(assemble.discover(tmp_path), "high_throughput", None, BASE)
    d = decision(choice, "kv_cache_dtype")
    assert d["status"] == "kept: policy" and d["measured_best"] == "fp8" and choice["changed"] == {}
    assert "accuracy" in d["reason"]


def test_bundles_and_failures_are_reported(tmp_path):
    article = {"max_num_batched_tokens": 2048, "max_num_seqs": 256, "block_size": 32}
    write_sweep(
        tmp_path,
        "00_baseline",
        "default_vs_article",
        {"default": ({}, tput(100, 104, 102)), "article": (article, tput(60, 62, 61))},
    )
    write_sweep(
        tmp_path,
        "02_block_size_sweep",
        "block_size",
        {"default": ({}, tput(1)), "block_size=64": ({"block_size": 64}, tput(1))},
        status={"default-r0": "failed", "block_size=64-r0": "failed"},
    )
    choice = assemble.choose(assemble.discover(tmp_path), "high_throughput", None, BASE)
    (b,) = choice["bundles"]
    assert b["config"] == "article" and b["reference"] == "default" and b["within_noise"] is False
    assert b["ratio"] == pytest.approx(61 / 102)
    assert choice["failed_sweeps"] == ["02_block_size_sweep/block_size"]
    assert "No evidence for KV block size" in assemble.recommendation_text(choice)


def test_unknown_scenario_is_an_error():
    with pytest.raises(ValueError, match="unknown scenario"):
        assemble.choose([], "fastest", None, BASE)


def test_article_settings_per_platform():
    gpu, notes = assemble.article_settings("cuda")
    cpu, cpu_notes = assemble.article_settings("cpu")
    assert gpu["block_size"] == 16 and cpu["block_size"] == 32
    assert "max_paddings" not in gpu and "scheduler_policy" not in gpu
    assert any("max_paddings" in n for n in notes) and any("32" in n for n in cpu_notes)


# --------------------------------------------------------------------------- writers
def test_cli_flags_as_vllm_spells_them():
    args = flags.cli_args(
        {
            "model": "m",
            "block_size": 64,
            "enable_prefix_caching": False,
            "enforce_eager": True,
            "disable_log_stats": False,
            "compilation_config": {"mode": 0},
            "served_model_name": ["a", "b"],
            "max_num_seqs": None,
        }
    )
    assert args == [
        "m",
        "--block-size",
        "64",
        "--no-enable-prefix-caching",
        "--enforce-eager",
        "--compilation-config",
        '{"mode":0}',
        "--served-model-name",
        "a",
        "b",
    ]
    cmd = flags.serve_command({"model": "/x y/m", "block_size": 64}, served_model_name="m")
    assert cmd == "vllm serve '/x y/m' \\\n  --block-size 64 \\\n  --served-model-name m"


def test_split_env_keeps_deployment_choices_and_gives_the_measurement_reason():
    deploy, measurement = flags.split_env(
        {
            "VLLM_ENABLE_V1_MULTIPROCESSING": 0,
            "VLLM_LOGGING_LEVEL": "DEBUG",
            "TUNEBOOK_EXECUTOR": "ray",
            "VLLM_CPU_KVCACHE_SPACE": 4,
        }
    )
    assert deploy == {"VLLM_CPU_KVCACHE_SPACE": "4"}
    assert sorted(measurement) == [
        "TUNEBOOK_EXECUTOR",
        "VLLM_ENABLE_V1_MULTIPROCESSING",
        "VLLM_LOGGING_LEVEL",
    ]
    assert all(m["why"].startswith("measurement only") for m in measurement.values())
    assert measurement["VLLM_ENABLE_V1_MULTIPROCESSING"]["value"] == "0"


def test_shell_script_is_reusable_around_other_launch_lines():
    argv = flags.serve_argv({"model": "m", "block_size": 64}, served_model_name="m")
    assert argv == ["vllm", "serve", "m", "--block-size", "64", "--served-model-name", "m"]
    launch = "\n".join(
        flags.shell_join([*argv, "--port", str(p)], multiline=False) + " &" for p in (8001, 8002)
    )
    sh = writers.shell_script(
        {"scenario": "s"}, {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, launch + "\nwait"
    )
    assert sh.startswith("#!/usr/bin/env bash\n# Assembled by tunebook")
    assert "vllm serve m --block-size 64 --served-model-name m --port 8002 &\nwait\n" in sh
    assert "export" not in sh and "set -euo pipefail" in sh


def test_yaml_config_spells_false_as_no_flag():
    cfg = flags.yaml_config(
        {
            "model": "m",
            "enable_prefix_caching": False,
            "max_model_len": 2048,
            "disable_log_stats": False,
            "enforce_eager": True,
        }
    )
    assert cfg == {
        "model": "m",
        "no-enable-prefix-caching": True,
        "max-model-len": 2048,
        "enforce-eager": True,
    }


def test_write_config_files(tmp_path):
    write_sweep(
        tmp_path,
        "02_block_size_sweep",
        "block_size",
        {
            "default": ({}, tput(100, 105, 102.5)),
            "block_size=64": ({"block_size": 64}, tput(150, 155, 152.5)),
        },
    )
    choice = assemble.choose(assemble.discover(tmp_path), "high_throughput", None, BASE)
    kwargs = flags.deploy_kwargs("tiny-ernie", choice["settings"])
    assert kwargs["model"].endswith("models/tiny-ernie") and kwargs["load_format"] == "dummy"
    assert kwargs["block_size"] == 64 and "seed" not in kwargs and "disable_log_stats" not in kwargs
    # The cpu profile's measurement setting and one deployment choice.
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    files = writers.write_config(
        tmp_path / "05_assemble_config", choice, kwargs, env=env, served_model_name="tiny-ernie"
    )
    assert sorted(files) == ["choice.json", "llm_kwargs.py", "serve.sh", "serve.yaml"]
    sh = files["serve.sh"].read_text()
    assert sh.startswith("#!/usr/bin/env bash") and "export VLLM_CPU_OMP_THREADS_BIND=nobind" in sh
    assert (
        "exec vllm serve " in sh
        and "--block-size 64" in sh
        and "--served-model-name tiny-ernie" in sh
    )
    assert "block_size=64: 02_block_size_sweep/block_size (changed)" in sh
    assert os.stat(files["serve.sh"]).st_mode & stat.S_IXUSR
    y = yaml.safe_load(files["serve.yaml"].read_text())
    assert (
        y["block-size"] == 64
        and y["load-format"] == "dummy"
        and y["served-model-name"] == "tiny-ernie"
    )
    assert all("_" not in k for k in y)
    ns: dict = {}
    exec(
        compile(files["llm_kwargs.py"].read_text(), "llm_kwargs.py", "exec"), ns
    )  # __name__ != main
    assert ns["kwargs"] == kwargs
    doc = json.loads(files["choice.json"].read_text())
    assert doc["settings"]["block_size"] == 64 and doc["llm_kwargs"] == kwargs
    assert doc["env"] == {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    assert doc["measurement_env"]["VLLM_ENABLE_V1_MULTIPROCESSING"]["value"] == "0"
    # Measurement-only environment is named as left out, never set, in every written file.
    for name in ("serve.sh", "serve.yaml", "llm_kwargs.py"):
        text = files[name].read_text()
        assert "VLLM_CPU_OMP_THREADS_BIND" in text
        set_lines = [x for x in text.splitlines() if "VLLM_ENABLE_V1_MULTIPROCESSING" in x]
        assert all(x.startswith("# left out: ") for x in set_lines), (name, set_lines)
    # A server on every interface says so, and points to --host and --api-key.
    for name, host, key in (
        ("serve.sh", "--host", "--api-key"),
        ("serve.yaml", "host:", "api-key:"),
    ):
        note = [x for x in files[name].read_text().splitlines() if "all interfaces" in x]
        assert len(note) == 1 and host in note[0] and key in note[0], (name, note)
    assert doc["decisions"][0]["notebook"] == "02_block_size_sweep"
    st = assemble.structure(files)
    assert st["every decision has them"] and "decisions" in st["choice.json keys"]


def test_config_hash_is_stable_and_sensitive():
    a = assemble.config_hash({"chosen": {"settings": {"block_size": 64}}})
    assert a == assemble.config_hash({"chosen": {"settings": {"block_size": 64}}})
    assert a != assemble.config_hash({"chosen": {"settings": {"block_size": 32}}})


def test_validation_table_ratios(tmp_path):
    import pandas as pd

    df = pd.DataFrame(
        [
            {"config": c, "status": "ok", "output_throughput_tok_s": v}
            for c, vs in {
                "default": (100, 110, 105),
                "chosen": (100, 108, 104),
                "article": (50, 52, 51),
            }.items()
            for v in vs
        ]
    )
    vt = assemble.validation_table(df, metrics=(("output_throughput_tok_s", "max"),))
    row = vt.set_index("config").loc["article"]
    assert row["ratio vs default"] == pytest.approx(51 / 105) and not row["within noise"]
    assert vt.set_index("config").loc["chosen"]["within noise"]
    assert vt.set_index("config").loc["default"]["within noise"] is None


# --------------------------------------------------------------------------- explorer
@pytest.mark.slow
def test_explorer_recomputes_without_an_engine(tmp_path):
    from tunebook.topics.explorer import RECOMMENDATION_CLASS, Explorer

    write_seqs_tradeoff(tmp_path)
    ex = Explorer(
        tmp_path,
        scenario="high_throughput",
        slo_ttft_ms=1000,
        slo_tpot_ms=100,
        base_settings=BASE,
        model="tiny-ernie",
        figure_widget=False,
    )
    assert RECOMMENDATION_CLASS in ex.recommendation._dom_classes
    assert "max_num_seqs = 1024" in ex.recommendation.value
    assert "--max-num-seqs 1024" in ex.command.value
    assert ex.sweep.value == "03_prefill_scaling/max_num_seqs"
    assert ex.metric.value == "output_throughput_tok_s"
    ex.scenario.value = "low_latency"  # the event recomputes
    assert (
        ex.choice["changed"] == {"max_num_seqs": 16}
        and "max_num_seqs = 16" in ex.recommendation.value
    )
    assert ex.metric.value == "ttft_p99_ms"
    ex.ttft.value = 50.0  # nothing meets a 50 ms TTFT: ranked without the SLO, still 16 is best
    assert "no configuration meets the SLO" in json.dumps(ex.choice["decisions"])
    ex.configs.value = ("default", "max_num_seqs=16")
    fig = ex.figure()
    assert list(fig.data[0].x) == ["default (default)", "max_num_seqs=16 (chosen)"]
    assert fig.layout.shapes[0].y0 == pytest.approx(50.0)  # the SLO line follows the slider


@pytest.mark.slow
def test_explorer_with_figure_widget_when_available(tmp_path):
    pytest.importorskip("anywidget")
    from tunebook.topics.explorer import Explorer

    write_sweep(
        tmp_path,
        "02_block_size_sweep",
        "block_size",
        {
            "default": ({}, tput(100, 105, 102.5)),
            "block_size=64": ({"block_size": 64}, tput(150, 155, 152.5)),
        },
    )
    ex = Explorer(tmp_path, scenario="high_throughput", base_settings=BASE, figure_widget=True)
    assert ex.fig is not None and len(ex.fig.data) == 1
    ex.metric.value = "ttft_p99_ms"
    assert ex.fig.layout.yaxis.title.text == "ttft_p99_ms"


def test_explorer_on_an_empty_run(tmp_path):
    from tunebook.topics.explorer import Explorer

    ex = Explorer(tmp_path, figure_widget=False)
    assert ex.choice["changed"] == {} and "No evidence" in ex.recommendation.value
    assert ex.figure().layout.title.text == "no saved sweep to plot in this run"


def test_versus_default_adds_the_latency_tail_when_both_serve_the_load():
    import pandas as pd

    def table(goodput_art):
        rows = [
            {"config": c, "status": "ok", "goodput_rps": g, "ttft_p99_ms": t}
            for c, g, t in [
                ("default", 10.50, 55),
                ("default", 10.51, 53),
                ("default", 10.505, 54),
                ("article", goodput_art, 160),
                ("article", goodput_art - 0.01, 140),
                ("article", goodput_art - 0.005, 150),
            ]
        ]
        return assemble.validation_table(pd.DataFrame(rows))

    same = assemble.versus_default(table(10.49), "article", "goodput_rps")
    # Ranges cleanly apart, but a 0.2% gap is under the 3% that matters (metrics.MIN_GAP).
    assert same.startswith("article at 0.998x the default's goodput_rps (within noise, n=3)")
    assert "ttft_p99_ms is 2.78x the default's (beyond noise)" in same
    apart = assemble.versus_default(table(5.0), "article", "goodput_rps", label="the article's")
    assert apart == "the article's at 0.475x the default's goodput_rps (beyond noise, n=3)"
    assert assemble.versus_default(table(5.0), "article", "no_such_metric") is None
    assert assemble.versus_default(table(5.0), "article", None) is None
