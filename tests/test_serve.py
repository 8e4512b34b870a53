"""`vllm serve` with an assembled configuration, on CPU with the tiny model, checked over HTTP.

One server start (~30-60 s on two cores: the API server and its EngineCore each import vLLM).
The configuration includes a false boolean (prefix caching off) to prove that the YAML spelling
reaches the engine, and is first parsed with vLLM's own `vllm serve` parser.
"""

from __future__ import annotations

import psutil
import pytest

from tunebook import assemble, serve

MIB = 1024**2
SETTINGS = {
    "enforce_eager": True,
    "kv_cache_memory_bytes": 8 * MIB,
    "max_model_len": 512,
    "enable_prefix_caching": False,
}
ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    out = tmp_path_factory.mktemp("assembled")
    choice = assemble.choose([], "low_latency", {"ttft_ms": 5000.0, "tpot_ms": 500.0}, SETTINGS)
    kwargs = assemble.deploy_kwargs("tiny-ernie", choice["settings"])
    return assemble.write_config(
        out, choice, kwargs, env=ENV, served_model_name="tiny-ernie"
    ), kwargs


def test_main_rejects_a_missing_file(tmp_path, capsys):
    assert serve.main([str(tmp_path / "nope.yaml"), "--check"]) == 2
    assert "no such file" in capsys.readouterr().err


@pytest.mark.engine
def test_serve_files_parse_to_the_chosen_settings(files):
    paths, kwargs = files
    ns_sh = serve.parse_serve_args(serve.serve_sh_args(paths["serve.sh"]))
    ns_yaml = serve.parse_serve_args(["--config", str(paths["serve.yaml"])])
    for k, v in kwargs.items():
        assert ns_sh[k] == v, (k, ns_sh[k], v)
        assert ns_yaml[k] == v, (k, ns_yaml[k], v)
    assert ns_yaml["enable_prefix_caching"] is False  # not dropped (vLLM drops `key: false`)
    assert ns_sh["served_model_name"] == ns_yaml["served_model_name"] == ["tiny-ernie"]


@pytest.mark.engine
def test_serve_check_answers_and_shuts_down(files):
    paths, _ = files
    lines: list[str] = []
    res = serve.check(paths["serve.yaml"], timeout_s=300, out=lines.append)
    log = open(res["log"]).read()
    assert res["ok"], "\n".join(lines) + "\n" + log[-3000:]
    names = [s["name"] for s in res["steps"]]
    assert names == [
        "GET /v1/models",
        "POST /v1/completions",
        "POST /v1/completions (stream)",
        "POST /v1/chat/completions",
    ]
    assert res["steps"][0]["text"] == "tiny-ernie"
    assert res["steps"][2]["chunks"] > 0 and res["steps"][2]["ttft_ms"] > 0
    assert all(s["latency_ms"] > 0 for s in res["steps"])
    assert res["shutdown"]["clean"], res["shutdown"]
    assert "enable_prefix_caching=False" in log  # the engine got the false boolean
    assert "healthy after" in lines[1]
    # Nothing of the server is left: not its process, nor anything started for this config.
    assert (
        not psutil.pid_exists(res["pid"])
        or psutil.Process(res["pid"]).status() == psutil.STATUS_ZOMBIE
    )
    left = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if str(paths["serve.yaml"]) in " ".join(p.info["cmdline"] or []):
                left.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    assert not left, left
