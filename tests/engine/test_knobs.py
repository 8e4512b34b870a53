"""Engine settings are checked against the installed vLLM's EngineArgs before any engine starts."""

from __future__ import annotations

import pytest

from tunebook.core.errors import ConfigError
from tunebook.engine import adapter, isolation
from tunebook.engine.knobs import check_settings, valid_block_sizes, validate_settings
from tunebook.measure import execute as engine

# (settings, what the error must say)
BAD = [
    ({"gpu_memory_utilisation": 0.9}, r"gpu_memory_utilization"),
    ({"max_num_batched_token": 4096}, r"did you mean 'max_num_batched_tokens'"),
    ({"max_num_seq": 8}, r"did you mean 'max_num_seqs'"),
    ({"max_paddings": 256}, r"max_paddings.*removed"),
    ({"scheduler_policy": "fcfs"}, r"scheduling_policy.*'fcfs' or 'priority'"),
    ({"scheduling_policy": "hybrid"}, r"hybrid.*\['fcfs', 'priority'\]"),
    ({"kv_cache_dtype": "fp9"}, r"fp9.*choose one of.*'auto'.*'fp8'"),
    ({"gpu_memory_utilization": 0}, r"gpu_memory_utilization.*\(0, 1\]"),
    ({"gpu_memory_utilization": 1.5}, r"gpu_memory_utilization.*\(0, 1\]"),
    ({"max_model_len": -5}, r"max_model_len=-5 must be a positive integer"),
    ({"max_model_len": 0}, r"max_model_len=0 must be a positive integer"),
    ({"block_size": 16}, r"block_size=16.*CPU.*multiple of 32"),
    ({"max_num_seqs": "many"}, r"max_num_seqs='many' has type str; expected int"),
    ({"enforce_eager": "yes"}, r"enforce_eager='yes' has type str; expected bool"),
    ({"max_num_batched_tokens": True}, r"max_num_batched_tokens=True"),
]


@pytest.fixture(scope="module")
def fields() -> dict:
    return adapter.engine_fields()


@pytest.mark.vllm
def test_fields_come_from_the_installed_vllm(fields):
    assert engine.vllm_version().startswith("0.")
    for name in ("block_size", "kv_cache_dtype", "kv_cache_memory_bytes", "scheduling_policy"):
        assert name in fields
    assert "max_paddings" not in fields


@pytest.mark.vllm
@pytest.mark.parametrize(
    "settings,message", BAD, ids=lambda x: str(x) if isinstance(x, dict) else ""
)
def test_bad_setting_raises_with_a_useful_message(settings, message):
    if "block_size" in settings and engine.platform_name() != "cpu":
        pytest.skip("the multiple-of-32 rule is the CPU backend's")
    with pytest.raises(ConfigError, match=message) as err:
        validate_settings(settings)
    assert err.value.key == next(iter(settings))


@pytest.mark.vllm
def test_good_settings_pass_unchanged():
    s = {
        "block_size": 64,
        "kv_cache_dtype": "fp8",
        "max_model_len": 2048,
        "max_num_seqs": 8,
        "gpu_memory_utilization": 0.5,
        "scheduling_policy": "priority",
        "enable_prefix_caching": True,
        "kv_cache_memory_bytes": 1 << 26,
    }
    assert validate_settings(dict(s)) == s


@pytest.mark.vllm
def test_source_prefixes_the_message():
    with pytest.raises(ConfigError, match=r"^params/x.yaml: unknown engine setting"):
        validate_settings({"nonsense_knob": 1}, source="params/x.yaml")


@pytest.mark.vllm
def test_settings_must_be_a_mapping():
    with pytest.raises(ConfigError, match="mapping"):
        validate_settings([("block_size", 32)])


@pytest.mark.vllm
def test_bad_setting_raises_before_any_engine_starts(monkeypatch, base_point):
    """run_point validates in the caller: the engine is never constructed."""

    real_popen = isolation.subprocess.Popen

    def no_engine(*a, **k):
        raise AssertionError("an engine was started for an invalid point")

    def popen(cmd, *a, **k):
        if "tunebook.measure.execute" in cmd:
            no_engine()
        return real_popen(cmd, *a, **k)

    monkeypatch.setattr(engine.Engine, "start", no_engine)
    monkeypatch.setattr(isolation.subprocess, "Popen", popen)
    monkeypatch.setenv("TUNEBOOK_LAUNCHER", "0")  # isolated children through the Popen above
    for settings, _ in BAD:
        point = {**base_point, "settings": {**base_point["settings"], **settings}}
        if "block_size" in settings and engine.platform_name() != "cpu":
            continue
        for isolate in (False, True):
            with pytest.raises(ConfigError):
                engine.run_point(point, isolate=isolate)


def test_block_size_rules_per_platform():
    fields = {"block_size": int | None}
    check_settings({"block_size": 16}, fields, "cuda")
    with pytest.raises(ConfigError, match="multiple of 16"):
        check_settings({"block_size": 8}, fields, "cuda")
    check_settings({"block_size": 32}, fields, "cpu")
    assert valid_block_sizes("cpu") == [32, 64, 128, 256]
    assert valid_block_sizes("cuda") == [16, 32, 64, 128, 256]


def test_batched_tokens_below_model_len_without_chunked_prefill():
    fields = {"max_num_batched_tokens": int, "max_model_len": int, "enable_chunked_prefill": bool}
    s = {"max_num_batched_tokens": 1024, "max_model_len": 2048, "enable_chunked_prefill": False}
    with pytest.raises(ConfigError, match="max_num_batched_tokens.*>= max_model_len"):
        check_settings(s, fields, "cpu")
    check_settings({**s, "enable_chunked_prefill": True}, fields, "cpu")


def test_replaced_name_that_a_vllm_version_does_have_is_accepted():
    """REPLACED only applies when the installed vLLM lacks the field."""
    check_settings({"max_paddings": 8}, {"max_paddings": int}, "cpu")


@pytest.mark.vllm
def test_literal_or_str_fields_accept_other_strings():
    """tokenizer_mode is Literal[...] | str in vLLM: a custom mode is valid, not a typo."""
    from typing import Literal

    fields = {"mode": Literal["auto", "hf"] | str, "policy": Literal["fcfs", "priority"] | None}
    check_settings({"mode": "my_custom_mode", "policy": None}, fields, "cpu")
    with pytest.raises(ConfigError, match=r"choose one of \['fcfs', 'priority'\]"):
        check_settings({"policy": "lifo"}, fields, "cpu")
    validate_settings({"tokenizer_mode": "my_custom_mode"})


def test_a_measured_server_keeps_idle_connections_longer_than_the_client_does(monkeypatch):
    """The client drops an idle connection after 4 s, the server (unless told) after 60: a
    starved client never sends on a connection the server just closed. A user's value stands."""
    from tunebook.engine import flags
    from tunebook.measure.loadgen import KEEPALIVE_S

    monkeypatch.delenv("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", raising=False)
    assert float(flags.server_env({}, {})["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"]) > 10 * KEEPALIVE_S
    kept = flags.server_env({"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "7"}, {})
    assert kept["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] == "7"
