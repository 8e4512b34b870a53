"""Which claims are about the article's model, and what the ledger records for a run of another."""

from __future__ import annotations

import json

import pytest

from tunebook.core import claims
from tunebook.core.claims import (
    ARTICLE,
    CLAIM_SCOPE,
    CLAIMS,
    GENERIC,
    NOT_ABOUT_THIS_MODEL,
    scope,
    scoped,
    verdict,
)
from tunebook.workbench import notebook


def _c2():
    return verdict("C2", "refuted", "18,432 B per token", "capacity", spread="0%", note="n")


def _c4():
    return verdict("C4", "refuted", "16 not valid", "block_sizes", note="m")


def test_every_claim_has_a_scope_and_the_article_models_are_c1_c2_c6_c13():
    assert set(CLAIM_SCOPE) == set(CLAIMS)
    assert {c for c, s in CLAIM_SCOPE.items() if s == ARTICLE} == {"C1", "C2", "C6", "C13"}
    assert {c for c, s in CLAIM_SCOPE.items() if s == GENERIC} == {
        "C3",
        "C4",
        "C5",
        "C7",
        "C8",
        "C9",
        "C10",
        "C11",
        "C12",
        "C14",
    }


def test_not_about_this_model_is_a_verdict_word():
    assert NOT_ABOUT_THIS_MODEL in claims.VERDICTS
    assert verdict("C6", NOT_ABOUT_THIS_MODEL, "x", "y")["verdict"] == "not about this model"


@pytest.mark.parametrize("model", ["qwen3-0.6b", "tiny-qwen3", "llama-3.2-1b", "tiny-llama"])
def test_an_article_model_claim_on_another_model_is_not_about_it(model):
    v = scoped(_c2(), model)
    assert v["verdict"] == NOT_ABOUT_THIS_MODEL and v["model"] == model
    assert v["measured_verdict"] == "refuted"  # what the run measured is kept
    assert v["figure"] == "18,432 B per token" and v["evidence"] == "capacity"
    assert v["note"].startswith(f"Not about {model}: C2 concerns the article's model")
    assert "ernie-4.5-0.3b-pt" in v["note"] and v["note"].endswith(" n")
    assert "NOT ABOUT THIS MODEL" in claims.describe(v)
    assert scoped(v, model) == v  # scoping twice changes nothing


@pytest.mark.parametrize("model", ["qwen3-0.6b", "tiny-llama", "ernie-4.5-0.3b-pt"])
def test_a_generic_claim_keeps_its_verdict_on_any_model(model):
    v = scoped(_c4(), model)
    assert v == {**_c4(), "model": model}


@pytest.mark.parametrize("model", ["ernie-4.5-0.3b-pt", "tiny-ernie", "models/tiny-ernie"])
def test_the_article_models_family_keeps_every_verdict(model):
    """The full shape and the cpu profile's tiny stand-in: the ledger as it always was."""
    assert scoped(_c2(), model) == {**_c2(), "model": model}


def test_an_unknown_model_keeps_the_verdicts_unchanged():
    assert scoped(_c2(), None) == _c2()
    assert scope([_c2(), _c4()], None) == [_c2(), _c4()]


def test_a_model_whose_config_cannot_be_read_is_not_the_articles():
    assert scoped(_c2(), "no-such-model")["verdict"] == NOT_ABOUT_THIS_MODEL
    assert claims.is_article_model("tiny-ernie") and not claims.is_article_model("tiny-qwen3")


def test_the_table_shows_the_model_only_where_a_verdict_is_not_about_it():
    assert "model" not in claims.table([_c2(), _c4()]).columns  # the goldens' tables unchanged
    t = claims.table(scope([_c2(), _c4()], "tiny-qwen3"))
    assert list(t["model"]) == ["tiny-qwen3", "tiny-qwen3"]
    assert list(t["verdict"]) == [NOT_ABOUT_THIS_MODEL, "refuted"]


def test_record_verdicts_scopes_to_the_model_given(tmp_path):
    t = notebook.record_verdicts(tmp_path, "01_kv_cache_sizing", [_c2(), _c4()], model="tiny-qwen3")
    assert list(t["verdict"]) == [NOT_ABOUT_THIS_MODEL, "refuted"]
    saved = json.loads((tmp_path / "claims" / "01_kv_cache_sizing.json").read_text())
    assert [v["verdict"] for v in saved] == [NOT_ABOUT_THIS_MODEL, "refuted"]
    assert {v["model"] for v in saved} == {"tiny-qwen3"}
    ledger = notebook.record_verdicts(tmp_path, "02_block_size_sweep", [], ledger=True)
    assert list(ledger["claim"]) == ["C2", "C4"]


def test_record_verdicts_reads_the_model_begin_saw(tmp_path, monkeypatch):
    """The notebooks' calls pass no model: begin() kept the notebook's ``model`` parameter."""
    monkeypatch.setitem(notebook._MODEL, "00_baseline", "llama-3.2-1b")
    notebook.record_verdicts(tmp_path, "00_baseline", [_c2()])
    (saved,) = json.loads((tmp_path / "claims" / "00_baseline.json").read_text())
    assert saved["verdict"] == NOT_ABOUT_THIS_MODEL and saved["model"] == "llama-3.2-1b"
    monkeypatch.setitem(notebook._MODEL, "00_baseline", "tiny-ernie")
    notebook.record_verdicts(tmp_path, "00_baseline", [_c2()])
    (saved,) = json.loads((tmp_path / "claims" / "00_baseline.json").read_text())
    assert saved["verdict"] == "refuted" and saved["model"] == "tiny-ernie"


def test_record_verdicts_without_a_model_records_them_as_given(tmp_path):
    assert "05_assemble_config" not in notebook._MODEL
    notebook.record_verdicts(tmp_path, "05_assemble_config", [_c2()])
    saved = json.loads((tmp_path / "claims" / "05_assemble_config.json").read_text())
    assert saved == [_c2()]
