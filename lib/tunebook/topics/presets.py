"""The article's presets judged (notebook 05): C11 per scenario, C13 per card.

C11 rests on 05's side-by-side validation (``assemble.validation_table`` frames: one row per
metric and configuration, ratios to vLLM's default); C13 on the model's arithmetic.
"""

from __future__ import annotations

from tunebook.core.claims import verdict
from tunebook.core.metrics import slo_text
from tunebook.core.model import GIB, ModelShape
from tunebook.topics.assemble import SCENARIOS, versus_default


def card_table(shape: ModelShape, card_sizes_gib, gmus=(0.85, 0.9), seq_len: int = 4096):
    """Per card and gpu_memory_utilization: weights, and the KV tokens left (an upper bound:
    activations and CUDA graphs also take memory; the engine reports its own KV size)."""
    import pandas as pd

    per_tok = shape.kv_bytes_per_token()
    rows = []
    for gib in card_sizes_gib:
        for gmu in gmus:
            kv = max(gib * GIB * gmu - shape.weight_bytes(), 0)
            rows.append(
                {
                    "card GiB": gib,
                    "gpu_memory_utilization": gmu,
                    "weights GiB": round(shape.weight_bytes() / GIB, 2),
                    "KV tokens (upper bound)": int(kv // per_tok),
                    f"{seq_len}-token requests": int(kv // (per_tok * seq_len)),
                }
            )
    return pd.DataFrame(rows)


def objective_metric(scenario: str, validation) -> str | None:
    """The scenario's first objective that the validation measured."""
    if validation.empty:
        return None
    measured = set(validation["metric"])
    return next((m for m, _ in SCENARIOS[scenario].objectives if m in measured), None)


def _row(validation, config: str, metric: str | None):
    if validation.empty or metric is None:
        return None
    r = validation[(validation["config"] == config) & (validation["metric"] == metric)]
    return None if r.empty else r.iloc[0]


def aa_check(validation) -> str:
    """When "chosen" is vLLM's default: how many metrics the A/A pair puts beyond the noise."""
    beyond = validation[(validation["config"] == "chosen") & validation["within noise"].eq(False)]
    if not len(beyond):
        return "A/A check: 'chosen' is vLLM's default itself; no metric differs beyond the noise."
    return (
        f"A/A check: 'chosen' is vLLM's default itself; {len(beyond)} of"
        f" {validation['metric'].nunique()} metric(s) come out beyond noise"
        f" ({', '.join(beyond['metric'])}): the rule lets one comparison in ten through by"
        " chance, so expect about that many here."
    )


def _deployed(deployment: dict | None) -> bool:
    """Whether the served validation's "chosen" is 04's deployment, not vLLM's default."""
    return bool(deployment) and deployment.get("status") == "changed"


def chosen_text(
    choice: dict, validation, objective: str | None, deployment: dict | None = None
) -> str:
    """The chosen configuration against vLLM's default on the scenario's objective.

    ``deployment`` is ``capacity.choose_deployment()``'s result when the validation was served:
    then "chosen" is that deployment whenever it changed something (04's capacity ranking), even
    with no engine setting of 00-03 changed.
    """
    r = _row(validation, "chosen", objective)
    if r is None:
        return "chosen not validated"
    noise = "within noise" if r["within noise"] else "beyond noise"
    if _deployed(deployment):
        return (
            f"chosen deployment {deployment['config']} (04's capacity ranking) at"
            f" {r['ratio vs default']:.3g}x the default's {objective} ({noise})"
        )
    if not choice["changed"]:
        return (
            f"chosen = vLLM's default, so two runs of one configuration differ by"
            f" {r['ratio vs default']:.3g}x ({noise}): the noise floor of this machine"
        )
    return f"chosen at {r['ratio vs default']:.3g}x the default's {objective} ({noise})"


def article_text(validation, objective: str | None) -> str:
    """The article's configuration against vLLM's default on the scenario's objective."""
    text = None
    if not validation.empty:
        text = versus_default(validation, "article", objective, label="article's configuration")
    return text or "no validation of the article's configuration in this run"


def c11_verdict(
    choice: dict,
    validation,
    others: list,
    evidence: str,
    repeats: int,
    had_sweeps: bool,
    deployment: dict | None = None,
) -> dict:
    """C11 (scenario presets) from 05's choice and validation.

    ``validation`` is validation_table() of the main scenario, ``others`` those of the other
    scenarios (each with a "scenario" column). partly when the run had sweeps to choose from
    (presets are worth having, but only from measurements); inconclusive when it had none.
    ``deployment``: as in chosen_text(), when the validation was served.
    """

    objective = objective_metric(choice["scenario"], validation)
    other_txt = []
    for other in others:
        name = other["scenario"].iloc[0]
        t = versus_default(other, "article", objective_metric(name, other))
        if t:
            other_txt.append(f"{name}: {t}")
    return verdict(
        "C11",
        "partly" if had_sweeps else "inconclusive",
        f"{choice['scenario']}: {len(choice['changed'])} setting(s) changed from vLLM's defaults"
        + (
            f", served as {deployment['config']} ({deployment['vs_default']:.2f}x the default's"
            " capacity under the SLO in 04)"
            if _deployed(deployment)
            else ""
        )
        + f"; {chosen_text(choice, validation, objective, deployment)};"
        f" {article_text(validation, objective)}" + "".join(f"; {t}" for t in other_txt),
        evidence,
        spread=(
            f"min-max over {repeats} engine starts per configuration" if len(validation) else None
        ),
        note=(
            "Presets per scenario are worth having, but they should come from measurements under"
            " a stated SLO, not be copied: a setting changes only when its sweep beats vLLM's"
            f" default beyond the noise. {len(choice['missing'])} topic(s) had no evidence in"
            " this run."
        ),
    )


def c13_verdict(
    cards, claim_model: str, shape: ModelShape, platform: str, shown=(16, 24, 80)
) -> dict:
    """C13 (presets by card memory) from card_table(): partly. The model's weights are a small
    part of any card, so per-card presets differ in KV capacity, which is arithmetic."""

    at = cards[(cards["gpu_memory_utilization"] == 0.9) & cards["card GiB"].isin(shown)]
    return verdict(
        "C13",
        "partly",
        "; ".join(
            f"{r['card GiB']} GiB: {r['KV tokens (upper bound)']:,} KV tokens"
            for r in at.to_dict("records")
        )
        + " (gmu 0.9, upper bound)",
        "05_assemble_config (arithmetic on the model config)",
        note=(
            f"{claim_model} weighs {shape.weight_bytes() / GIB:.2f} GiB: on any card of 8 GiB or"
            " more the memory split is almost all KV cache, so per-card presets differ in KV"
            " capacity (how many sequences of what length fit), which follows from arithmetic"
            f" and the engine's own report, not in other settings. Measured here only on"
            f" {platform}."
        ),
    )


def summary_markdown(
    sc,
    slo: dict,
    choice: dict,
    served_choice: dict | None,
    validation,
    files: dict,
    served: bool,
    not_for: list[str] = (),
) -> str:
    """05's summary in a few Markdown lines: what changed, why, what the validation showed, the
    files, and the traffic the deployment should not be used for."""
    lines = [f"**Scenario** {sc.name}: {sc.describe()}; SLO: {slo_text(slo)}."]
    if choice["changed"]:
        changed = ", ".join(f"`{k}={v}`" for k, v in choice["changed"].items())
        lines.append(f"**Changed from vLLM's defaults:** {changed}.")
    else:
        lines.append(
            "**Changed from vLLM's defaults:** nothing; no measured setting beat its default"
            " beyond the noise."
        )
    for d in choice["decisions"]:
        lines.append(
            f"- `{d['setting']}`: {d['status']} ({d['notebook']}/{d['sweep']}). {d['reason']}"
        )
    lines += [f"- {m}." for m in choice["missing"]]
    if served_choice is not None:
        lines.append(
            f"**Served deployment (04's capacity ranking):** {served_choice['status']}:"
            f" {served_choice['reason']}."
        )
    objective = objective_metric(sc.name, validation)
    deployed = served_choice if served else None
    lines.append(
        f"**Validation:** {chosen_text(choice, validation, objective, deployed)};"
        f" {article_text(validation, objective)}."
    )
    if not_for:
        lines.append("**Not for:** " + "; ".join(not_for) + ".")
    lines.append(
        f"**Files:** {', '.join(f'`{p}`' for p in files.values())}. Check it:"
        f" `python -m tunebook.serve {files['serve.yaml']} --check`."
    )
    return "\n".join(lines)
