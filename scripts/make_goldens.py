"""Execute every notebook on the cpu profile into tests/golden/ (the nbval reference outputs).

The run folder is relative (`_nbval_run`), so nbval, which executes each golden in its own
folder, writes there and 04 finds the results of 00-03.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import papermill as pm

from tunebook.profiles import NOTEBOOKS, NOTEBOOKS_DIR, load_profile, notebook_params

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "golden"


def main() -> None:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(GOLDEN / "_nbval_run", ignore_errors=True)
    prof = load_profile("cpu")
    for name in NOTEBOOKS:
        params = {**notebook_params(prof, name), "run_dir": "_nbval_run"}
        print(f"golden: {name}", flush=True)
        pm.execute_notebook(
            str(NOTEBOOKS_DIR / f"{name}.ipynb"),
            str(GOLDEN / f"{name}.ipynb"),
            parameters=params,
            cwd=str(GOLDEN),
            progress_bar=False,
            kernel_name="python3",
        )
        # The saved widget state (the explorer's plotly bundle, ~5 MB) is not compared by nbval.
        nb = nbformat.read(GOLDEN / f"{name}.ipynb", as_version=4)
        nb.metadata.pop("widgets", None)
        nbformat.write(nb, GOLDEN / f"{name}.ipynb")
    shutil.rmtree(GOLDEN / "_nbval_run", ignore_errors=True)


if __name__ == "__main__":
    main()
