"""Model shapes from a Hugging Face config.json, and the KV-cache and weight arithmetic that follows.

Pure Python: no vllm, no torch. Every figure is read from the config (layers, KV heads, head_dim,
vocabulary, tied embeddings, biases, per-head q/k norms), so the arithmetic holds for any dense,
decoder-only, full-attention transformer: ERNIE-4.5, Qwen3, Llama 3 and their tiny variants are
checked against the engine to the token. A config it would get wrong (sliding-window or hybrid
layers, mixture of experts, multi-latent attention, ...) is refused by ``load_shape`` with a
ConfigError naming what is unsupported, before any engine starts.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from tunebook.core.errors import ConfigError

GIB = 1024**3
MIB = 1024**2

# Bytes per element of the KV cache, by vLLM's kv_cache_dtype names (and torch dtype names).
KV_DTYPE_BYTES: dict[str, int] = {
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "float32": 4,
    "float": 4,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
}

REPO_ROOT = Path(__file__).resolve().parents[3]  # lib/tunebook/core/model.py
MODELS_DIR = REPO_ROOT / "models"
ERNIE_03B = MODELS_DIR / "ernie-4.5-0.3b-pt"
QWEN3_06B = MODELS_DIR / "qwen3-0.6b"
LLAMA32_1B = MODELS_DIR / "llama-3.2-1b"

# Families whose attention normalises q and k per head (an RMSNorm of head_dim, two per layer).
QK_NORM_TYPES = frozenset({"qwen3"})
# Families whose q, k and v projections carry a bias whatever the config says (Qwen2's do).
QKV_BIAS_TYPES = frozenset({"qwen2"})


@dataclass(frozen=True)
class ModelShape:
    """What the KV and weight arithmetic needs to know about a decoder-only transformer."""

    model_type: str
    architectures: tuple[str, ...]
    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    torch_dtype: str = "bfloat16"
    qkv_bias: bool = False  # biases on the q, k, v projections (attention_bias, use_bias, Qwen2)
    o_bias: bool = False  # a bias on the output projection (attention_bias, use_bias)
    mlp_bias: bool = False  # biases on gate, up and down (mlp_bias, use_bias)
    qk_norm: bool = False  # per-head RMSNorm of q and k (Qwen3): 2 x head_dim weights a layer

    @property
    def embedding_params(self) -> int:
        """The token embedding table, V x h (the LM head too where they are tied)."""
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """A separate LM head: 0 where it is tied to the embedding table (counted once)."""
        return 0 if self.tie_word_embeddings else self.embedding_params

    @property
    def non_embedding_params(self) -> int:
        """What every token passes through once: the blocks and the final norm."""
        return self.param_count - self.embedding_params - self.lm_head_params

    @property
    def param_count(self) -> int:
        """Parameters of a Llama-style block stack (gated MLP, two RMSNorms a layer, the biases
        and q/k norms the config names), the embedding table, an untied LM head, the final norm."""
        h, q, kv, d = (
            self.hidden_size,
            self.num_attention_heads,
            self.num_key_value_heads,
            self.head_dim,
        )
        attn = h * q * d + 2 * h * kv * d + q * d * h  # q, k, v, o projections
        attn += (q * d + 2 * kv * d) * self.qkv_bias + h * self.o_bias
        attn += 2 * d * self.qk_norm
        mlp = 3 * h * self.intermediate_size + (2 * self.intermediate_size + h) * self.mlp_bias
        norms = 2 * h
        blocks = self.num_hidden_layers * (attn + mlp + norms)
        return blocks + self.embedding_params + self.lm_head_params + h

    def weight_bytes(self, dtype: str | None = None) -> int:
        return self.param_count * dtype_bytes(dtype or self.torch_dtype)

    def weight_bytes_read(self, dtype: str | None = None) -> int:
        """Weight bytes one forward pass must read: all of them but an untied embedding table, of
        which only the batch's rows are gathered (a tied table is read whole, as the LM head)."""
        untied_table = 0 if self.tie_word_embeddings else self.embedding_params
        return (self.param_count - untied_table) * dtype_bytes(dtype or self.torch_dtype)

    def kv_bytes_per_token(self, kv_cache_dtype: str = "auto") -> int:
        """K and V, every layer, every KV head: 2 x L x kv_heads x head_dim x bytes."""
        dt = self.torch_dtype if kv_cache_dtype == "auto" else kv_cache_dtype
        return (
            2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes(dt)
        )

    def kv_capacity_tokens(
        self, kv_cache_bytes: int, block_size: int, kv_cache_dtype: str = "auto"
    ) -> int:
        """Tokens that fit in `kv_cache_bytes`, rounded down to whole blocks as vLLM allocates."""
        per_block = self.kv_bytes_per_token(kv_cache_dtype) * block_size
        return (kv_cache_bytes // per_block) * block_size

    def max_concurrency(
        self, kv_cache_bytes: int, max_model_len: int, block_size: int, kv_cache_dtype="auto"
    ) -> float:
        """Requests of full max_model_len that fit at once (vLLM logs the same figure)."""
        blocks_per_req = -(-max_model_len // block_size)
        return self.kv_capacity_tokens(kv_cache_bytes, block_size, kv_cache_dtype) / (
            blocks_per_req * block_size
        )

    def to_dict(self) -> dict:
        d = asdict(self)
        d["architectures"] = list(self.architectures)
        d["param_count"] = self.param_count
        d["weight_bytes"] = self.weight_bytes()
        d["kv_bytes_per_token_bf16"] = self.kv_bytes_per_token("bfloat16")
        d["kv_bytes_per_token_fp8"] = self.kv_bytes_per_token("fp8")
        return d


def dtype_bytes(dtype: str) -> int:
    key = str(dtype).replace("torch.", "")
    if key not in KV_DTYPE_BYTES:
        raise ConfigError(
            f"unknown dtype {dtype!r}; known: {', '.join(sorted(KV_DTYPE_BYTES))}", key="dtype"
        )
    return KV_DTYPE_BYTES[key]


def resolve_model_dir(model: str | Path) -> Path:
    """A local folder holding config.json. Short names resolve under the repo's models/."""
    p = Path(model)
    for cand in (p, MODELS_DIR / str(model)):
        if (cand / "config.json").is_file():
            return cand
    if p.exists() and p.is_dir():
        raise ConfigError(f"model folder {p} has no config.json", key="model")
    raise ConfigError(
        f"model {model!r} is neither a folder with config.json nor a name under {MODELS_DIR}"
        " (no model hub is reachable: download the checkpoint and pass its folder)",
        key="model",
    )


def load_shape(model: str | Path | dict) -> ModelShape:
    """Read a config.json (folder, file, or an already-parsed dict) into a ModelShape."""
    if isinstance(model, dict):
        cfg, where = model, "<dict>"
    else:
        path = Path(model)
        path = path if path.suffix == ".json" else resolve_model_dir(model) / "config.json"
        try:
            cfg = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON ({e})", key="model") from e
        where = str(path)
    # Multimodal configs nest the LM under text_config.
    cfg = cfg.get("text_config", cfg)
    missing = [
        k
        for k in ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")
        if k not in cfg
    ]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)}", key="model")
    model_type = str(cfg.get("model_type", "unknown"))
    if unsupported := unsupported_features(cfg):
        raise ConfigError(
            f"{where}: {model_type} has {'; '.join(unsupported)}. The workbook's KV and weight"
            " arithmetic (tunebook.core.model.ModelShape) models dense decoder-only transformers"
            " whose every layer attends over the whole context; for this model its KV capacity,"
            " weights and roofline figures would be wrong, so it is not run",
            key="model",
        )
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    if kv_heads < 1 or heads % kv_heads:
        raise ConfigError(
            f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads"
            f" {kv_heads}",
            key="model",
        )
    bias = bool(cfg.get("attention_bias") or cfg.get("use_bias"))
    return ModelShape(
        model_type=model_type,
        architectures=tuple(cfg.get("architectures") or ()),
        num_hidden_layers=int(cfg["num_hidden_layers"]),
        hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg.get("intermediate_size", 4 * cfg["hidden_size"])),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        # head_dim is explicit for ERNIE-4.5 (128, not 1024/16 = 64); fall back to hidden/heads.
        head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
        vocab_size=int(cfg["vocab_size"]),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"),
        qkv_bias=bias or model_type in QKV_BIAS_TYPES,
        o_bias=bias,
        mlp_bias=bool(cfg.get("mlp_bias") or cfg.get("use_bias")),
        qk_norm=model_type in QK_NORM_TYPES,
    )


# Config keys that name a number of experts (Mixtral, Qwen-MoE, DeepSeek, ERNIE-4.5-MoE, ...).
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
# Config keys that carry the KV head count under a name ModelShape does not read (Falcon,
# ChatGLM): read as multi-head attention they would give a KV figure many times too large.
OTHER_KV_HEAD_KEYS = ("num_kv_heads", "n_head_kv", "multi_query", "multi_query_group_num")


def unsupported_features(cfg: dict) -> list[str]:
    """What in a (text) config.json the KV and weight arithmetic does not model, in words.

    Empty for a dense decoder-only transformer whose every layer attends over the whole context
    (full attention, one K and one V per KV head and layer). A flag that is present but off
    (``use_sliding_window: false``, ``sliding_window: null``, ``layer_types`` all
    ``full_attention``, one expert) is not a feature.
    """
    out: list[str] = []
    window = cfg.get("sliding_window")
    use_window = cfg.get("use_sliding_window")
    if use_window or (window is not None and use_window is None):
        out.append(f"sliding-window attention (sliding_window: {window})")
    kinds = sorted({str(t) for t in cfg.get("layer_types") or ()} - {"full_attention"})
    if kinds:
        out.append(f"layers that are not full attention (layer_types: {', '.join(kinds)})")
    for key in ("sliding_window_pattern", "interleaved_sliding_window", "attention_chunk_size"):
        if cfg.get(key) is not None:
            out.append(f"local attention in some layers ({key}: {cfg[key]})")
    for key in EXPERT_KEYS:
        n = cfg.get(key)
        n = max(n) if isinstance(n, list | tuple) and n else n
        if isinstance(n, int | float) and n > 1:
            out.append(f"a mixture of experts ({key}: {n})")
            break
    if cfg.get("kv_lora_rank") is not None or cfg.get("q_lora_rank") is not None:
        out.append(f"multi-latent attention (kv_lora_rank: {cfg.get('kv_lora_rank')})")
    if cfg.get("num_kv_shared_layers"):
        out.append(f"KV shared across layers (num_kv_shared_layers: {cfg['num_kv_shared_layers']})")
    if "num_key_value_heads" not in cfg:
        others = [k for k in OTHER_KV_HEAD_KEYS if cfg.get(k) not in (None, False)]
        if others:
            out.append(f"KV heads given as {others[0]} (not num_key_value_heads)")
    if cfg.get("is_encoder_decoder"):
        out.append("an encoder-decoder architecture (is_encoder_decoder: true)")
    mt = str(cfg.get("model_type", ""))
    if any(k in mt for k in ("mamba", "rwkv", "jamba")) or cfg.get("layers_block_type"):
        out.append("state-space or recurrent layers")
    return out


def seed_article_kv_bytes_per_token() -> int:
    """The source article's formula (C2), per token: 2 (K, V) x 32 heads x 128 x 2 B = 16,384 B.

    Its L is the sequence length ("for a sequence of length L"), so the formula has no layer
    count, and it takes 32 heads where ERNIE-4.5-0.3B has 2 KV heads. Per layer it is 16x too
    high; over the 18 layers it leaves out, the two errors nearly cancel: 11% below 18,432 B.
    """
    return 2 * 32 * 128 * 2
