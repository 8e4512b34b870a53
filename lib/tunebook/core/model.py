"""Model shapes from a Hugging Face config.json, and the KV-cache and weight arithmetic that follows.

Pure Python: no vllm, no torch.
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

    @property
    def param_count(self) -> int:
        """Parameters of a Llama-style block stack (no biases), embeddings and final norm."""
        h, q, kv = self.hidden_size, self.num_attention_heads, self.num_key_value_heads
        attn = h * q * self.head_dim + 2 * h * kv * self.head_dim + q * self.head_dim * h
        mlp = 3 * h * self.intermediate_size
        norms = 2 * h
        emb = self.vocab_size * h
        lm_head = 0 if self.tie_word_embeddings else emb
        return self.num_hidden_layers * (attn + mlp + norms) + emb + lm_head + h

    def weight_bytes(self, dtype: str | None = None) -> int:
        return self.param_count * dtype_bytes(dtype or self.torch_dtype)

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
    heads = int(cfg["num_attention_heads"])
    return ModelShape(
        model_type=str(cfg.get("model_type", "unknown")),
        architectures=tuple(cfg.get("architectures") or ()),
        num_hidden_layers=int(cfg["num_hidden_layers"]),
        hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg.get("intermediate_size", 4 * cfg["hidden_size"])),
        num_attention_heads=heads,
        num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
        # head_dim is explicit for ERNIE-4.5 (128, not 1024/16 = 64); fall back to hidden/heads.
        head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
        vocab_size=int(cfg["vocab_size"]),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"),
    )


def seed_article_kv_bytes_per_token() -> int:
    """The source article's formula (C2), per token: 2 (K, V) x 32 heads x 128 x 2 B = 16,384 B.

    Its L is the sequence length ("for a sequence of length L"), so the formula has no layer
    count, and it takes 32 heads where ERNIE-4.5-0.3B has 2 KV heads. Per layer it is 16x too
    high; over the 18 layers it leaves out, the two errors nearly cancel: 11% below 18,432 B.
    """
    return 2 * 32 * 128 * 2
