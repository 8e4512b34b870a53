"""The claims ledger: each notebook records verdicts on the source article's claims (CLAIMS.md).

A verdict is data: claim id, verdict, the measured figure with its spread, and where it came from
(notebook, sweep folder). Notebooks write theirs to ``<run_dir>/claims/<notebook>.json``; the
assembly notebook and the README read them all.
"""

from __future__ import annotations

import json
from pathlib import Path

from tunebook.core.results import atomic_write_text

CLAIMS = {
    "C1": "Default config baseline on a 4090: 3.2 s per request, 4.8 GB GPU memory, ~10 QPS",
    "C2": "KV per token = L x 2 x 32 heads x 128 x 2 B; 4096 tokens ~ 64 MB; 100 requests ~ 6.4 GB",
    "C3": "Prefix caching saves 30-50% of KV memory in chat use",
    "C4": "block_size 16 is best; too small fragments, too large wastes",
    "C5": "fp8 KV cache, negligible accuracy loss",
    "C6": "After KV tuning: 4.8 -> 3.2 GB single request, 100 concurrent OOM -> 8.1 GB, 3.2 -> 2.1 s",
    "C7": "Prefill time grows exponentially with prompt length",
    "C8": "max_num_batched_tokens 2048 is a good start; sweep 1024-8192 under mixed load",
    "C9": "max_paddings, scheduler_policy='hybrid'",
    "C10": "Prefill table: short 0.8 -> 0.3 s, medium 2.5 -> 1.2 s, long 6.8 -> 3.1 s, mixed 3.2 -> 1.5 s",
    "C11": "Scenario presets: high-concurrency chat, long documents, low latency, high throughput",
    "C12": "Leave headroom in gpu_memory_utilization (start at 0.8); set max_model_len to need",
    "C13": "GPU-memory-dependent presets (<16 GB, >24 GB cards)",
    # Not the article's: the workbook's own hypothesis, tested because a small model is host-bound.
    "C14": "vLLM's default configuration serves a small model at (close to) its capacity",
}
VERDICTS = ("confirmed", "refuted", "partly", "not reproducible", "outdated", "inconclusive")


def verdict(
    claim: str,
    verdict: str,
    figure: str,
    evidence: str,
    spread: str | None = None,
    note: str = "",
) -> dict:
    """One verdict. ``figure`` is the measured number with its unit; ``evidence`` the sweep folder."""
    if claim not in CLAIMS:
        raise ValueError(f"unknown claim {claim!r}; known: {', '.join(CLAIMS)}")
    if verdict not in VERDICTS:
        raise ValueError(f"verdict must be one of {VERDICTS}, got {verdict!r}")
    return {
        "claim": claim,
        "text": CLAIMS[claim],
        "verdict": verdict,
        "figure": figure,
        "spread": spread,
        "evidence": evidence,
        "note": note,
    }


def describe(v: dict) -> str:
    """A verdict in full, for a notebook to print: claim, verdict, figure, spread and note."""
    return (
        f"{v['claim']} {v['verdict'].upper()}: {v['figure']}\n  spread: {v['spread']}\n"
        f"  note: {v['note']}"
    )


def headline(v: dict) -> str:
    """Claim, verdict and the article's words, without the measured figures.

    For regression checks of claims whose verdict is stable while their figures are not (a
    verdict decided by arithmetic, reported with timings beside it).
    """
    return f"{v['claim']} {v['verdict']}: {v['text']}"


def write(run_dir: str | Path, notebook: str, verdicts: list[dict]) -> Path:
    path = Path(run_dir) / "claims" / f"{notebook}.json"
    atomic_write_text(path, json.dumps(verdicts, indent=2, ensure_ascii=False) + "\n")
    return path


def read_all(run_dir: str | Path) -> list[dict]:
    out: list[dict] = []
    for p in sorted((Path(run_dir) / "claims").glob("*.json")):
        for v in json.loads(p.read_text()):
            out.append({**v, "notebook": p.stem})
    return sorted(out, key=lambda v: int(v["claim"][1:]))


def table(verdicts: list[dict]):
    """A DataFrame for display: one row per verdict."""
    import pandas as pd

    cols = ["claim", "verdict", "figure", "spread", "evidence", "note", "text"]
    return pd.DataFrame(verdicts).reindex(
        columns=cols + (["notebook"] if verdicts and "notebook" in verdicts[0] else [])
    )
