"""Execute every notebook on the ci profile (params/ci.yaml: the cpu one, smaller) into
tests/golden/, nbval's reference outputs.

The run folder is relative (`_nbval_run`), so nbval, which executes each golden in its own
folder, writes there and 04 finds the results of 00-03.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import nbformat
import papermill as pm

from tunebook.workbench.profiles import NOTEBOOKS, NOTEBOOKS_DIR, load_profile, notebook_params

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "golden"


def neutral_paths(nb) -> None:
    """Checkout, virtualenv and home paths out of the outputs nbval does not compare (marked
    cells are sanitised by tests/nbval_sanitize.cfg instead). The virtualenv may live outside
    the checkout (a git worktree sharing another checkout's .venv): it is written as .venv/."""
    root, home = str(GOLDEN.parents[1]) + "/", os.path.expanduser("~").rstrip("/") + "/"
    venv = str(Path(sys.prefix).resolve()) + "/"
    for cell in nb.cells:
        if cell.cell_type != "code" or cell.source.lstrip().startswith("# NBVAL_CHECK_OUTPUT"):
            continue
        text = json.dumps(cell.outputs).replace(venv, ".venv/").replace(root, "")
        text = text.replace(home, "~/")
        cell.outputs = nbformat.from_dict(json.loads(text))


# (profile, notebooks, folder under tests/golden): the whole workbook on the tiny ERNIE, and the
# whole workbook again on a second family, the tiny Qwen3 (its KV capacity exact against the
# engine's, its claims about the article's model "not about this model", its deployment written).
GOLDEN_SETS = [
    ("ci", list(NOTEBOOKS), GOLDEN),
    ("ci-qwen3", list(NOTEBOOKS), GOLDEN / "qwen3"),
]


def execute(profile: str, names: list[str], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(folder / "_nbval_run", ignore_errors=True)
    prof = load_profile(profile)
    for name in names:
        params = {**notebook_params(prof, name), "run_dir": "_nbval_run"}
        print(f"golden: {folder.relative_to(GOLDEN.parent)}/{name} ({profile})", flush=True)
        pm.execute_notebook(
            str(NOTEBOOKS_DIR / f"{name}.ipynb"),
            str(folder / f"{name}.ipynb"),
            parameters=params,
            cwd=str(folder),
            progress_bar=False,
            kernel_name="python3",
        )
        # The saved widget state (the explorer's plotly bundle, ~5 MB) is not compared by nbval.
        nb = nbformat.read(folder / f"{name}.ipynb", as_version=4)
        nb.metadata.pop("widgets", None)
        nb.metadata.get("papermill", {}).update(
            input_path=f"notebooks/{name}.ipynb", output_path=None
        )
        neutral_paths(nb)
        nbformat.write(nb, folder / f"{name}.ipynb")
    shutil.rmtree(folder / "_nbval_run", ignore_errors=True)


def main() -> None:
    only = sys.argv[1:]  # profile names to remake (default: all)
    for profile, names, folder in GOLDEN_SETS:
        if not only or profile in only:
            execute(profile, names, folder)


if __name__ == "__main__":
    main()
