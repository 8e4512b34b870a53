"""The claims ledger: each notebook records verdicts on the source article's claims (CLAIMS.md).

A verdict is data: claim id, verdict, the measured figure with its spread, and where it came from
(notebook, sweep folder). Notebooks write theirs to ``<run_dir>/claims/<notebook>.json``; the
assembly notebook and the README read them all.

A claim's scope (``CLAIM_SCOPE``) says whether it is about the article's model (ERNIE-4.5-0.3B-PT
on the article's card: its KV formula, its memory figures, its presets) or a question about vLLM's
settings whose answer any model can give. On a run of another model, ``scoped`` turns the verdict
of an article-model claim into "not about this model", naming the model; the generic questions
keep the verdict the run measured.
"""

from __future__ import annotations

import json
from pathlib import Path

from tunebook.core.errors import ConfigError
from tunebook.core.model import load_shape
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
NOT_ABOUT_THIS_MODEL = "not about this model"
VERDICTS = (
    "confirmed",
    "refuted",
    "partly",
    "not reproducible",
    "outdated",
    "inconclusive",
    NOT_ABOUT_THIS_MODEL,
)

# The article's model, and its family: the full shape (models/ernie-4.5-0.3b-pt) and the cpu
# profile's tiny stand-in (models/tiny-ernie) share its config's model_type.
ARTICLE_MODEL = "ernie-4.5-0.3b-pt"
ARTICLE_MODEL_TYPE = "ernie4_5"
ARTICLE = "article model"  # its figures are ERNIE-4.5-0.3B-PT's (and the article's card's)
GENERIC = "generic"  # a question about vLLM's settings: its verdict stands for any model
CLAIM_SCOPE = {
    "C1": ARTICLE,  # the default configuration's figures for ERNIE on a 4090
    "C2": ARTICLE,  # ERNIE's KV formula (its heads and layers)
    "C3": GENERIC,
    "C4": GENERIC,
    "C5": GENERIC,
    "C6": ARTICLE,  # ERNIE's memory before and after KV tuning
    "C7": GENERIC,
    "C8": GENERIC,
    "C9": GENERIC,
    "C10": GENERIC,
    "C11": GENERIC,
    "C12": GENERIC,
    "C13": ARTICLE,  # presets by card memory, from ERNIE's weights
    "C14": GENERIC,
}
assert set(CLAIM_SCOPE) == set(CLAIMS), "every claim has a scope"


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


def is_article_model(model: str | Path) -> bool:
    """Whether ``model`` (a folder or a name under models/) is of the article's model's family,
    by its config's model_type; a model whose config cannot be read is not."""
    try:
        return load_shape(model).model_type == ARTICLE_MODEL_TYPE
    except ConfigError:
        return False


def scoped(v: dict, model: str | Path | None) -> dict:
    """A verdict as it stands for a run of ``model``.

    The model is recorded with the verdict. A claim about the article's model, judged on a run of
    another model, becomes "not about this model": what the run measured stays in the figure,
    ``measured_verdict`` and the note, which names both models. Generic claims, and every claim
    on the article's model's family, keep their verdict. ``model`` None (not known): unchanged.
    """
    if model is None:
        return v
    out = {**v, "model": str(model)}
    if CLAIM_SCOPE.get(v["claim"]) != ARTICLE or v["verdict"] == NOT_ABOUT_THIS_MODEL:
        return out
    if is_article_model(model):
        return out
    return {
        **out,
        "verdict": NOT_ABOUT_THIS_MODEL,
        "measured_verdict": v["verdict"],
        "note": (
            f"Not about {model}: {v['claim']} concerns the article's model ({ARTICLE_MODEL}), and"
            f" this run's model is {model}. What the run measured said {v['verdict']!r}."
            + (f" {v['note']}" if v.get("note") else "")
        ),
    }


def scope(verdicts: list[dict], model: str | Path | None) -> list[dict]:
    """``scoped`` for each verdict of a run of ``model``."""
    return [scoped(v, model) for v in verdicts]


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
    if any(v.get("verdict") == NOT_ABOUT_THIS_MODEL for v in verdicts):
        cols.insert(2, "model")  # which model the verdicts are of, where one is not about it
    return pd.DataFrame(verdicts).reindex(
        columns=cols + (["notebook"] if verdicts and "notebook" in verdicts[0] else [])
    )
