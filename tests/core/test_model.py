"""Model shapes and the KV / weight arithmetic (pure Python, no engine)."""

from __future__ import annotations

import json

import pytest

from tunebook.core.errors import ConfigError
from tunebook.core.model import (
    ERNIE_03B,
    ModelShape,
    load_shape,
    resolve_model_dir,
    seed_article_kv_bytes_per_token,
)


@pytest.fixture(scope="module")
def ernie() -> ModelShape:
    return load_shape(ERNIE_03B)


def test_ernie_shape_read_from_config(ernie):
    assert ernie.model_type == "ernie4_5"
    assert ernie.architectures == ("Ernie4_5ForCausalLM",)
    assert (ernie.num_hidden_layers, ernie.num_attention_heads, ernie.num_key_value_heads) == (
        18,
        16,
        2,
    )
    assert ernie.tie_word_embeddings is True
    assert ernie.torch_dtype == "bfloat16"


def test_ernie_head_dim_is_explicit_not_hidden_over_heads(ernie):
    assert ernie.head_dim == 128
    assert ernie.hidden_size // ernie.num_attention_heads == 64  # what a derived value would be


def test_ernie_kv_bytes_per_token(ernie):
    assert ernie.kv_bytes_per_token("auto") == 18432  # bf16 from torch_dtype
    assert ernie.kv_bytes_per_token("bfloat16") == 18432
    assert ernie.kv_bytes_per_token("fp8") == 9216
    assert ernie.kv_bytes_per_token("fp8_e5m2") == 9216
    assert ernie.kv_bytes_per_token("float32") == 36864
    # 2 (K and V) x 18 layers x 2 KV heads x 128 x 2 B
    assert ernie.kv_bytes_per_token() == 2 * 18 * 2 * 128 * 2


def test_ernie_param_count(ernie):
    assert abs(ernie.param_count - 360.7e6) / 360.7e6 < 0.005
    # The formula, term by term (Llama-style, no biases, tied embeddings):
    h, q, kv, d, i, L, V = 1024, 16, 2, 128, 3072, 18, 103424
    attn = h * q * d + 2 * h * kv * d + q * d * h  # q, k, v, o projections
    mlp = 3 * h * i  # gate, up, down
    per_layer = attn + mlp + 2 * h  # + two RMSNorm weights
    assert ernie.param_count == L * per_layer + V * h + h  # + one embedding (tied) + final norm
    assert ernie.param_count == 360_748_032
    assert ernie.weight_bytes() == 2 * ernie.param_count


def test_untied_embeddings_add_an_lm_head(ernie):
    untied = ModelShape(**{**ernie.__dict__, "tie_word_embeddings": False})
    assert untied.param_count - ernie.param_count == ernie.vocab_size * ernie.hidden_size


def test_seed_article_formula_errors_nearly_cancel(ernie):
    """32 heads instead of 2 KV heads (16x per layer) and no layer count (18 layers left out)."""
    article = seed_article_kv_bytes_per_token()
    assert article == 16384 and article * 4096 == 64 * 2**20  # the article's "4096 tokens ~ 64 MB"
    per_layer_true = ernie.kv_bytes_per_token() // ernie.num_hidden_layers
    assert article / per_layer_true == 16
    assert ernie.kv_bytes_per_token() * 4096 == 72 * 2**20  # 72 MiB per 4096 tokens
    assert round(1 - article / ernie.kv_bytes_per_token(), 3) == 0.111


def test_kv_capacity_rounds_down_to_whole_blocks(ernie):
    per_tok = ernie.kv_bytes_per_token()
    assert ernie.kv_capacity_tokens(per_tok * 100, 32) == 96  # 3 whole blocks of 32
    assert ernie.kv_capacity_tokens(per_tok * 100, 64) == 64
    assert ernie.kv_capacity_tokens(per_tok * 100, 32, "fp8") == 192  # 200 tokens -> 6 blocks
    # 68.48 GiB held 3,989,040 tokens on the H200 (FINDINGS): the arithmetic agrees to the block
    assert ernie.kv_capacity_tokens(3_989_040 * 18432, 16) == 3_989_040


def test_max_concurrency(ernie):
    cap_bytes = ernie.kv_bytes_per_token() * 4096
    assert ernie.max_concurrency(cap_bytes, 1024, 32) == 4.0
    assert ernie.max_concurrency(cap_bytes, 1000, 32) == pytest.approx(4096 / 1024)


def test_head_dim_falls_back_to_hidden_over_heads():
    cfg = {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 8, "vocab_size": 100}
    s = load_shape(cfg)
    assert s.head_dim == 32
    assert s.num_key_value_heads == 8  # no num_key_value_heads: multi-head attention
    assert s.kv_bytes_per_token("bfloat16") == 2 * 2 * 8 * 32 * 2


def test_text_config_nesting(tmp_path):
    inner = json.loads((ERNIE_03B / "config.json").read_text())
    (tmp_path / "config.json").write_text(
        json.dumps(
            {"model_type": "some_vl", "vision_config": {"hidden_size": 7}, "text_config": inner}
        )
    )
    s = load_shape(tmp_path)
    assert s.kv_bytes_per_token() == 18432
    assert s.head_dim == 128


@pytest.mark.parametrize(
    "drop", ["num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size"]
)
def test_missing_keys_are_config_errors(tmp_path, drop):
    cfg = json.loads((ERNIE_03B / "config.json").read_text())
    del cfg[drop]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=drop):
        load_shape(tmp_path)


def test_folder_without_config_json_names_it(tmp_path):
    empty = tmp_path / "no-config-here"
    empty.mkdir()
    with pytest.raises(ConfigError, match="no-config-here.*no config.json"):
        load_shape(empty)
    with pytest.raises(ConfigError, match="no-config-here"):
        resolve_model_dir(empty)


def test_unknown_model_name_is_a_config_error():
    with pytest.raises(ConfigError, match="no-such-model"):
        load_shape("no-such-model")


def test_invalid_json_is_a_config_error(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_shape(tmp_path)


def test_unknown_kv_dtype_is_a_config_error(ernie):
    with pytest.raises(ConfigError, match="fp9"):
        ernie.kv_bytes_per_token("fp9")


def test_tiny_model_resolves_by_name_and_has_ernie_shape(tiny_model):
    s = load_shape(tiny_model)
    assert s.model_type == "ernie4_5" and s.architectures == ("Ernie4_5ForCausalLM",)
    assert s.head_dim == 32 and s.num_key_value_heads == 2
    assert s.kv_bytes_per_token() == 2 * 2 * 2 * 32 * 2
