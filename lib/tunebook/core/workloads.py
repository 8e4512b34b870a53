"""Seeded, reproducible request sets.

A workload is built from a plain spec dict (what params files hold), so that a sweep point is fully
described by data: ``{"kind": "fixed", "num_requests": 64, "prompt_len": 512, "output_len": 128}``.
Prompts are token ids (no tokenizer needed) unless the kind is ``text``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from tunebook.core.errors import ConfigError

FIRST_ORDINARY_ID = 4  # ids 0..3 are pad/bos/eos/unk in ERNIE and the tiny model


@dataclass
class Request:
    prompt_token_ids: list[int] | None
    max_tokens: int
    prompt: str | None = None
    arrival_s: float = 0.0  # offset from the start of the run (online mode)
    tag: str = ""  # class of request, e.g. "short" or "long"

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids) if self.prompt_token_ids is not None else -1


@dataclass
class Workload:
    name: str
    requests: list[Request]
    spec: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def max_total_len(self) -> int:
        return max((r.prompt_len + r.max_tokens for r in self.requests), default=0)

    def summary(self) -> dict:
        lens = [r.prompt_len for r in self.requests]
        return {
            "name": self.name,
            "num_requests": len(self.requests),
            "prompt_tokens": int(sum(max(n, 0) for n in lens)),
            "max_prompt_len": int(max(lens, default=0)),
            "output_tokens": int(sum(r.max_tokens for r in self.requests)),
        }

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "spec": self.spec,
            "requests": [asdict(r) for r in self.requests],
        }


KINDS = ("fixed", "uniform", "normal", "lognormal", "shared_prefix", "mixed", "text")
_COMMON = {"kind", "name", "num_requests", "output_len", "seed", "vocab_size", "request_rate"}
_KIND_KEYS = {
    "fixed": {"prompt_len"},
    "uniform": {"min_prompt_len", "max_prompt_len"},
    "normal": {"mean_prompt_len", "std_prompt_len", "min_prompt_len", "max_prompt_len"},
    # prompt and output lengths each drawn from a log-normal (median, sigma of its log), clipped
    "lognormal": {
        "median_prompt_len",
        "sigma_prompt",
        "median_output_len",
        "sigma_output",
        "min_prompt_len",
        "max_prompt_len",
        "max_output_len",
    },
    "shared_prefix": {"prompt_len", "prefix_share", "num_prefixes"},
    "mixed": {"short_len", "long_len", "long_fraction", "long_output_len"},
    "text": {"prompts"},
}

CHAT_PROMPTS = [
    "请用中文介绍一下人工智能的发展历史。",
    "写一篇关于环境保护的短文，三百字左右。",
    "解释一下什么是机器学习，用简单的语言说明。",
    "你好，我想了解一下今天的天气和交通情况。",
    "请把下面这段话翻译成英文：模型部署需要根据证据选择参数。",
]


def _ids(rng: np.random.Generator, n: int, vocab: int) -> list[int]:
    return rng.integers(FIRST_ORDINARY_ID, vocab, size=n).tolist()


def _positive(spec: dict, key: str, default=None) -> int:
    v = spec.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ConfigError(
            f"workload {spec.get('name') or spec.get('kind')!r}: {key} must be a positive int,"
            f" got {v!r}",
            key=key,
        )
    return v


def poisson_arrivals(n: int, request_rate: float, seed: int) -> list[float]:
    """Arrival offsets (s) of a Poisson process; rate inf or 0 means all at t=0."""
    if not request_rate or request_rate == float("inf"):
        return [0.0] * n
    rng = np.random.default_rng(seed + 7919)
    return np.cumsum(rng.exponential(1.0 / request_rate, size=n)).tolist()


def make_workload(spec: dict, vocab_size: int | None = None) -> Workload:
    """Build the workload a spec describes. Unknown kinds and keys are errors, not ignored."""
    if not isinstance(spec, dict):
        raise ConfigError(f"a workload spec must be a mapping, got {type(spec).__name__}")
    kind = spec.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"workload kind {kind!r} unknown; valid: {', '.join(KINDS)}", key="kind")
    unknown = set(spec) - _COMMON - _KIND_KEYS[kind]
    if unknown:
        valid = sorted(_COMMON | _KIND_KEYS[kind])
        raise ConfigError(
            f"workload {kind!r}: unknown key(s) {sorted(unknown)}; valid: {valid}", key="workload"
        )
    n = _positive(spec, "num_requests", 16)
    out = _positive(spec, "output_len", 64)
    seed = spec.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"workload {kind!r}: seed must be an int, got {seed!r}", key="seed")
    rate = spec.get("request_rate") or 0
    if isinstance(rate, bool) or not isinstance(rate, int | float) or rate < 0:
        raise ConfigError(
            f"workload {kind!r}: request_rate must be a number >= 0 (requests/s; 0 or inf: all"
            f" at once), got {rate!r}",
            key="request_rate",
        )
    vocab = int(spec.get("vocab_size") or vocab_size or 1024)
    rng = np.random.default_rng(seed)
    reqs = _BUILDERS[kind](spec, rng, n, out, vocab)
    for r, t in zip(reqs, poisson_arrivals(n, float(rate), seed), strict=True):
        r.arrival_s = t
    return Workload(name=str(spec.get("name") or kind), requests=reqs, spec=dict(spec))


# --------------------------------------------------------------------------- one builder per kind
# Each: (spec, rng, num_requests, output_len, vocab) -> the requests, drawn from ``rng`` in order.
def _fixed(spec, rng, n, out, vocab) -> list[Request]:
    plen = _positive(spec, "prompt_len")
    return [Request(_ids(rng, plen, vocab), out) for _ in range(n)]


def _spread(spec, rng, n, out, vocab) -> list[Request]:
    """uniform and normal prompt lengths, clipped to [min_prompt_len, max_prompt_len]."""
    kind = spec["kind"]
    lo = _positive(spec, "min_prompt_len", 1)
    hi = _positive(spec, "max_prompt_len", 4096 if kind == "normal" else None)
    if lo > hi:
        raise ConfigError(f"min_prompt_len {lo} > max_prompt_len {hi}", key="min_prompt_len")
    if kind == "uniform":
        lens = rng.integers(lo, hi + 1, size=n)
    else:
        mean = _positive(spec, "mean_prompt_len")
        std = float(spec.get("std_prompt_len", mean / 4))
        lens = np.clip(np.rint(rng.normal(mean, std, size=n)), lo, hi).astype(int)
    return [Request(_ids(rng, int(k), vocab), out) for k in lens]


def _lognormal(spec, rng, n, out, vocab) -> list[Request]:
    # Real traffic is not one length: chat logs' prompt and reply lengths are long-tailed,
    # roughly log-normal. Seeded, clipped, drawn per request (prompt and output apart).
    med_p = _positive(spec, "median_prompt_len", 512)
    med_o = _positive(spec, "median_output_len", out)
    lo = _positive(spec, "min_prompt_len", 1)
    hi_p = _positive(spec, "max_prompt_len", 8 * med_p)
    hi_o = _positive(spec, "max_output_len", 8 * med_o)
    sp, so = float(spec.get("sigma_prompt", 0.8)), float(spec.get("sigma_output", 0.6))
    if sp < 0 or so < 0:
        raise ConfigError("sigma_prompt and sigma_output must be >= 0", key="sigma_prompt")
    plens = np.clip(np.rint(rng.lognormal(np.log(med_p), sp, size=n)), lo, hi_p).astype(int)
    olens = np.clip(np.rint(rng.lognormal(np.log(med_o), so, size=n)), 1, hi_o).astype(int)
    return [Request(_ids(rng, int(a), vocab), int(b)) for a, b in zip(plens, olens, strict=True)]


def _shared_prefix(spec, rng, n, out, vocab) -> list[Request]:
    plen = _positive(spec, "prompt_len")
    share = float(spec.get("prefix_share", 0.5))
    if not 0.0 <= share <= 1.0:
        raise ConfigError(f"prefix_share must be in [0, 1], got {share}", key="prefix_share")
    n_pre = _positive(spec, "num_prefixes", 4)
    pre_len = int(round(plen * share))
    prefixes = [_ids(rng, pre_len, vocab) for _ in range(n_pre)]
    # Round-robin over system prompts: every prefix is reused n / num_prefixes times.
    return [
        Request(prefixes[i % n_pre] + _ids(rng, plen - pre_len, vocab), out, tag=f"p{i % n_pre}")
        for i in range(n)
    ]


def _mixed(spec, rng, n, out, vocab) -> list[Request]:
    short, long = _positive(spec, "short_len", 128), _positive(spec, "long_len", 2048)
    frac = float(spec.get("long_fraction", 0.25))
    long_out = _positive(spec, "long_output_len", out)
    is_long = rng.random(n) < frac
    return [
        Request(
            _ids(rng, long if lg else short, vocab),
            long_out if lg else out,
            tag="long" if lg else "short",
        )
        for lg in is_long
    ]


def _text(spec, rng, n, out, vocab) -> list[Request]:
    prompts = spec.get("prompts") or CHAT_PROMPTS
    return [Request(None, out, prompt=prompts[i % len(prompts)], tag="text") for i in range(n)]


_BUILDERS = {
    "fixed": _fixed,
    "uniform": _spread,
    "normal": _spread,
    "lognormal": _lognormal,
    "shared_prefix": _shared_prefix,
    "mixed": _mixed,
    "text": _text,
}


def check_fits(workload: Workload, max_model_len: int) -> None:
    """Raise before any engine starts if a request cannot fit in max_model_len."""
    for i, r in enumerate(workload.requests):
        if r.prompt_len >= 0 and r.prompt_len + r.max_tokens > max_model_len:
            raise ConfigError(
                f"workload {workload.name!r}: request {i} needs {r.prompt_len} prompt +"
                f" {r.max_tokens} output = {r.prompt_len + r.max_tokens} tokens, more than"
                f" max_model_len {max_model_len}; raise max_model_len or shorten the workload",
                key="max_model_len",
            )
