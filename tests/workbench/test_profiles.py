"""Profiles that build on another (``extends``): the CI profile, a model overlay."""

from __future__ import annotations

import pytest

from tunebook.core.errors import ConfigError
from tunebook.workbench.profiles import load_profile, notebook_params


def test_an_overlay_takes_its_bases_sections_and_overrides_key_by_key(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text(
        "description: base\ncommon: {model: tiny-ernie, repeats: 2}\n"
        "04_engine_overhead: {repeats: 1, search_start: {default: 64.0}}\n"
    )
    over = tmp_path / "over.yaml"
    over.write_text(
        f"extends: {base}\ncommon: {{repeats: 3}}\n04_engine_overhead: {{diagnose: false}}\n"
    )
    p = load_profile(over)
    assert p["description"] == "base" and p["extends"] == str(base)
    params = notebook_params(p, "04_engine_overhead")
    assert params["model"] == "tiny-ernie" and params["repeats"] == 1  # its section over common
    assert params["diagnose"] is False and params["search_start"] == {"default": 64.0}
    assert notebook_params(p, "02_block_size_sweep")["repeats"] == 3


def test_an_overlay_that_comes_back_to_itself_is_refused(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(f"extends: {b}\ncommon: {{}}\n")
    b.write_text(f"extends: {a}\ncommon: {{}}\n")
    with pytest.raises(ConfigError, match="comes back to itself"):
        load_profile(a)


def test_the_ci_profile_is_the_cpu_one_made_smaller():
    ci, cpu = load_profile("ci"), load_profile("cpu")
    assert ci["extends"] == "cpu"
    assert (
        notebook_params(ci, "00_baseline")["repeats"]
        == 1
        < notebook_params(cpu, "00_baseline")["repeats"]
    )
    assert (
        notebook_params(ci, "01_kv_cache_sizing")["model"]
        == notebook_params(cpu, "01_kv_cache_sizing")["model"]
    )
