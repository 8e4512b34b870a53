"""Headless runner: execute the notebooks in order with papermill into runs/<run-id>/, then report."""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
import sys
import time
from pathlib import Path

from .errors import ConfigError
from .interrupt import stop_on_signal
from .model import REPO_ROOT
from .profiles import NOTEBOOKS, NOTEBOOKS_DIR, detect_profile, load_profile, notebook_params
from .results import atomic_write_text, safe_name

RUNS_DIR = REPO_ROOT / "runs"


def new_run_id(profile: str) -> str:
    """<profile>-<date>-<time>-<random>: two runs started in the same second still differ."""
    return f"{profile}-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def claim_run_dir(runs_dir: str | Path, run_id: str, resume: bool = False) -> Path:
    """The run's folder, created for this run alone unless resuming.

    The claim is an exclusive create of ``run.json``: of two runs given the same id at the same
    moment, one gets the folder and the other a ConfigError, never a shared folder.
    """
    run_dir = Path(runs_dir).resolve() / safe_name(run_id, "run id")
    if run_dir.exists() and not resume and any(run_dir.iterdir()):
        raise ConfigError(
            f"run folder {run_dir} exists; pass --resume to continue it or choose another --run-id"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        try:
            fd = os.open(run_dir / "run.json", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            raise ConfigError(
                f"run folder {run_dir} was just claimed by another run; choose another --run-id"
            ) from None
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({"run_id": run_id}))
    return run_dir


def select_notebooks(only: list[str] | None) -> list[str]:
    if not only:
        return list(NOTEBOOKS)
    chosen = []
    for o in only:
        hits = [n for n in NOTEBOOKS if n == o or n.startswith(o)]
        if len(hits) != 1:
            raise ConfigError(
                f"--notebook {o!r} matches {hits or 'nothing'}; notebooks: {NOTEBOOKS}"
            )
        chosen.append(hits[0])
    return chosen


def run_workbook(
    profile: str | None = None,
    run_id: str | None = None,
    notebooks: list[str] | None = None,
    resume: bool = False,
    runs_dir: str | Path = RUNS_DIR,
    report: bool = True,
    log=print,
) -> Path:
    """Run notebooks in order; return the run folder. A notebook already executed is skipped on resume."""
    profile = profile or detect_profile()
    prof = load_profile(profile)
    names = select_notebooks(notebooks)
    # Every notebook's parameters are checked before the first one runs.
    plan = {n: notebook_params(prof, n) for n in names}
    run_id = safe_name(run_id or new_run_id(Path(profile).stem), "run id")
    run_dir = claim_run_dir(runs_dir, run_id, resume)
    state_path = run_dir / "run.json"
    state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    state.update(run_id=run_id, profile=str(prof["_path"]), python=sys.version.split()[0])
    state.setdefault("notebooks", {})
    with stop_on_signal():  # SIGINT/SIGTERM stop the run, even where inherited ignored
        _run_notebooks(names, plan, run_dir, state, state_path, resume, log)
    if report:
        try:
            path = write_report(run_dir)
            log(f"[tunebook] report: {path}")
        except (
            ImportError
        ) as e:  # nbconvert is absent on some GPU nodes; the notebooks are the record
            log(f"[tunebook] no HTML report ({e}); executed notebooks are in {run_dir}")
    return run_dir


def _run_notebooks(names, plan, run_dir: Path, state: dict, state_path: Path, resume, log) -> None:
    import papermill as pm

    for name in names:
        done = state["notebooks"].get(name, {}).get("status") == "ok"
        if resume and done:
            log(f"[tunebook] {name}: done in an earlier run, skipped (resume)")
            continue
        params = {**plan[name], "run_dir": str(run_dir)}
        out_nb = run_dir / f"{name}.ipynb"
        log(f"[tunebook] {name}: running -> {out_nb}")
        t0 = time.perf_counter()
        try:
            pm.execute_notebook(
                str(NOTEBOOKS_DIR / f"{name}.ipynb"),
                str(out_nb),
                parameters=params,
                cwd=str(NOTEBOOKS_DIR),
                progress_bar=False,
                log_output=False,
                kernel_name="python3",
            )
            state["notebooks"][name] = {"status": "ok", "seconds": time.perf_counter() - t0}
        except KeyboardInterrupt:
            # Ctrl-C: papermill's client shuts the kernel down; its engines go with its process
            # group, and an isolated engine child kills its own group once its parent is gone.
            state["notebooks"][name] = {
                "status": "interrupted",
                "seconds": time.perf_counter() - t0,
            }
            log(f"[tunebook] {name}: interrupted; finished points are kept (--resume continues)")
            raise
        except Exception as e:
            state["notebooks"][name] = {
                "status": "failed",
                "seconds": time.perf_counter() - t0,
                "error": str(e).strip().splitlines()[-1][:500] if str(e).strip() else repr(e),
            }
            atomic_write_text(state_path, json.dumps(state, indent=2))
            log(f"[tunebook] {name}: FAILED ({state['notebooks'][name]['error']})")
            raise
        finally:
            atomic_write_text(state_path, json.dumps(state, indent=2))
        log(f"[tunebook] {name}: ok in {state['notebooks'][name]['seconds']:.0f} s")


def write_report(run_dir: str | Path) -> Path:
    """An HTML report of the run: each executed notebook without its input cells, and an index."""
    from nbconvert import HTMLExporter

    run_dir = Path(run_dir)
    exporter = HTMLExporter(
        exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True
    )
    links = []
    for nb in sorted(run_dir.glob("[0-9][0-9]_*.ipynb")):
        body, _ = exporter.from_filename(str(nb))
        out = run_dir / "report" / f"{nb.stem}.html"
        out.parent.mkdir(exist_ok=True)
        out.write_text(body)
        links.append(f'<li><a href="{out.name}">{nb.stem}</a></li>')
    state = {}
    if (run_dir / "run.json").is_file():
        state = json.loads((run_dir / "run.json").read_text())
    extra = ""
    for name in ("serve.yaml", "serve.sh", "llm_kwargs.py"):
        if (run_dir / "05_assemble_config" / name).is_file():
            extra += f'<li><a href="../05_assemble_config/{name}">{name}</a></li>'
    index = run_dir / "report" / "index.html"
    index.parent.mkdir(exist_ok=True)
    index.write_text(
        "<!doctype html><meta charset=utf-8><title>tunebook run {rid}</title>"
        "<h1>tunebook run {rid}</h1><p>profile: {prof}</p><ul>{links}</ul>"
        "<h2>Assembled configuration</h2><ul>{extra}</ul>".format(
            rid=run_dir.name,
            prof=state.get("profile", "?"),
            links="".join(links),
            extra=extra or "<li>(not assembled in this run)</li>",
        )
    )
    return index
