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
    assert d["reason"].endswith("(155 req/s); the default measured highest"), d["reason"]


def test_a_client_that_fell_behind_makes_the_capacity_a_lower_bound(tmp_path):
    write_capacity(
        tmp_path,
        {"default": ({}, {}, [90, 90, 90]), "r2": ({}, {"replicas": 2}, [300, 300, 300])},
        lag_at_failure=400.0,
    )
    d = capacity.choose_deployment(tmp_path)
    assert d["status"] == "changed" and "a lower bound" in d["reason"]


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
    assert sh.count("vllm serve --config replica") == 2 and "--policy power_of_two" in sh
    assert "trap 'kill" in sh and "# chosen: r2 serves 3x" in sh
    assert paths["start.sh"].stat().st_mode & 0o111
