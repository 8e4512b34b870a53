"""The deployment scenarios (the article's presets, C11): what each optimises and the workload
that stands for it. Pure data; the assembly topic ranks configurations by them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Scenario:
    """What a deployment optimises, and the workload that stands for it in the validation."""

    name: str
    title: str
    objectives: tuple[tuple[str, str], ...]  # (metric, "max" | "min"), first one present is used
    use_slo: bool  # configurations whose medians miss the SLO are not eligible
    workload_hints: tuple[str, ...]  # words in a sweep's workload (name, kind) that suit it
    workload: dict  # the validation workload (scaled by the notebook's parameters)
    # a reader watches the reply stream in: the SLO bounds the gap between streamed chunks too
    chat: bool = False

    def describe(self) -> str:
        obj = ", then ".join(f"{'max' if d == 'max' else 'min'} {m}" for m, d in self.objectives)
        return obj + (" under the SLO" if self.use_slo else "")


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "high_concurrency_chat",
            "many concurrent chat sessions sharing system prompts",
            (
                ("goodput_rps", "max"),
                ("request_throughput_rps", "max"),
                ("output_throughput_tok_s", "max"),
            ),
            True,
            ("chat", "shared_prefix", "prefix", "text", "mixed"),
            {
                "kind": "shared_prefix",
                "num_requests": 64,
                "prompt_len": 256,
                "prefix_share": 0.5,
                "num_prefixes": 4,
                "output_len": 32,
                "seed": 0,
            },
            chat=True,
        ),
        Scenario(
            "long_documents",
            "long prompts (documents) with short answers",
            (
                ("goodput_rps", "max"),
                ("total_token_throughput_tok_s", "max"),
                ("request_throughput_rps", "max"),
            ),
            True,
            ("long", "document", "prefill", "mixed"),
            {"kind": "fixed", "num_requests": 8, "prompt_len": 1536, "output_len": 32, "seed": 0},
        ),
        Scenario(
            "low_latency",
            "few users, each waiting for the first token",
            (("ttft_p99_ms", "min"), ("e2e_p99_ms", "min"), ("tpot_p50_ms", "min")),
            True,
            ("short", "latency", "single", "fixed"),
            {"kind": "fixed", "num_requests": 8, "prompt_len": 128, "output_len": 32, "seed": 0},
            chat=True,
        ),
        Scenario(
            "high_throughput",
            "offline batch jobs: tokens per second, latency secondary",
            (
                ("output_throughput_tok_s", "max"),
                ("total_token_throughput_tok_s", "max"),
                ("request_throughput_rps", "max"),
            ),
            False,
            ("throughput", "batch", "fixed", "uniform"),
            {"kind": "fixed", "num_requests": 64, "prompt_len": 256, "output_len": 64, "seed": 0},
        ),
    )
}
