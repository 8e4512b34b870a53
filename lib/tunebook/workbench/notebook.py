"""The first and last cells every notebook shares.

    run_dir = tunebook.workbench.notebook.begin(globals(), "02_block_size_sweep")   # after the parameters
    tunebook.workbench.notebook.end(run_dir, "02_block_size_sweep")                 # last cell

``begin`` refuses parameters the notebook does not declare (papermill only warns about them),
checks every parameter's type and value as ``tunebook run`` does before it starts, returns the run
folder (an empty ``run_dir`` is runs/interactive in this repository, wherever the notebook runs
from) and sends vLLM's log to ``<run_dir>/<notebook>/logs/engine.log``. ``end`` summarises that
log and shows the notebook's GPU-seconds.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from tunebook.core import claims
from tunebook.core.claims import headline  # noqa: F401 (a notebook's checked verdict line)
from tunebook.core.results import first_missing
from tunebook.engine import isolation, launcher
from tunebook.engine.checkpoint import prepare_random_init
from tunebook.workbench import console, cost, profiles

# Set by the runner for each notebook call: the wall clock at the call's start (epoch seconds).
CALL_START_ENV = "TUNEBOOK_CALL_START"
_BEGUN: dict[str, float] = {}
# The model each notebook runs (its ``model`` parameter, as ``begin`` saw it): record_verdicts
# scopes the notebook's verdicts to it.
_MODEL: dict[str, str] = {}


def log_path(run_dir: str | Path, notebook: str) -> Path:
    return Path(run_dir) / notebook / "logs" / console.ENGINE_LOG


def begin(ns: dict, notebook: str, capture: bool = True) -> str:
    """Check the notebook's parameters, capture the engine log, return the run folder.

    Nothing is written to the run folder until every check has passed: the log is captured into
    a temporary file while the value checks import vLLM, then moved into the run folder.
    """
    profiles.check_injected(ns, notebook, engine=False)  # names and types: no vLLM needed
    run_dir = profiles.run_folder(ns.get("run_dir", ""))
    nb_dir = Path(run_dir) / notebook
    made = first_missing(nb_dir)
    pre = _PREPARED.pop(notebook, None)  # what ``prepare`` did before the notebook ran
    if pre is not None:
        made = made or pre["made"]
        if not capture:
            console.release_engine_log(delete=True)
    tmp = None
    if capture:
        # Before the checks below import vLLM, so that what it prints on import is kept too.
        tmp = pre["log"] if pre is not None else _temp_log(notebook)
        console.capture_engine_log(tmp)
    # Engine processes start from the environment as it is now, before this kernel imports vLLM
    # (the checks below) or runs an engine itself: as a `vllm serve` from a shell would.
    isolation.set_base_env(dict(os.environ))
    early: list[str] = []
    if launcher.wants_prestart():
        # The launchers' imports of vLLM (tunebook.engine.launcher) run while the checks import it
        # here; after the capture, which sets a variable every engine process inherits.
        env = ns.get("engine_env") if isinstance(ns.get("engine_env"), dict) else {}
        early = launcher.prestart_for(env, bool(ns.get("isolate", True)), nb_dir / "logs")
    try:
        profiles.check_values(
            notebook,
            {k: ns[k] for k in profiles.notebook_parameters(notebook) if k in ns},
            source="parameters",
        )
    except BaseException:
        if capture:
            console.release_engine_log(delete=True)
        if early:  # nothing of a notebook that did not start stays behind
            launcher.close_all()
            if made is not None:
                shutil.rmtree(made, ignore_errors=True)
        raise
    if capture:
        console.capture_engine_log(log_path(run_dir, notebook), carry_from=tmp)
    _BEGUN[notebook] = time.time()
    if isinstance(ns.get("model"), str | Path):
        _MODEL[notebook] = str(ns["model"])
    return run_dir


def _temp_log(notebook: str) -> str:
    fd, tmp = tempfile.mkstemp(prefix=f"tunebook-{notebook}-", suffix=".log")
    os.close(fd)
    return tmp


def _random_init_early(params: dict) -> None:
    if params.get("drift_random_init") and isinstance(params.get("model"), str):
        prepare_random_init(params["model"])


# Work a notebook starts before its parameter check, started by ``prepare`` instead.
EARLY_WORK = {"01_kv_cache_sizing": _random_init_early}
_PREPARED: dict[str, dict] = {}


def prepare(notebook: str, params: dict) -> None:
    """What ``begin`` waits for, done in the notebook's kernel before the notebook runs.

    The runner starts a notebook's kernel while the notebook before it runs (``tunebook.workbench.early``)
    and runs this in it: the engine log is captured, the launchers and the notebook's early work
    (``EARLY_WORK``) start, and the value checks import vLLM, as ``begin`` would do them. On a GPU
    node that was 14-17 s of every notebook before its first engine (runs/h100-20261206d).
    ``begin`` then finds them done; a bad parameter is left for it to report.
    """
    if not launcher.wants_prestart():
        return
    nb_dir = Path(profiles.run_folder(params.get("run_dir", ""))) / notebook
    made = first_missing(nb_dir)
    log = _temp_log(notebook)
    console.capture_engine_log(log)
    _PREPARED[notebook] = {"log": log, "made": made}
    isolation.set_base_env(dict(os.environ))  # as begin() would: before vLLM is imported here
    env = params.get("engine_env") if isinstance(params.get("engine_env"), dict) else {}
    launcher.prestart_for(env, bool(params.get("isolate", True)), nb_dir / "logs")
    if work := EARLY_WORK.get(notebook):
        work(params)
    declared = profiles.notebook_parameters(notebook)
    try:
        profiles.check_values(notebook, {k: params[k] for k in declared if k in params})
    except Exception:
        pass  # begin() checks them again and says what is wrong


def _call_seconds(notebook: str) -> float:
    """Wall time of this call so far: from the runner's start of the call, else from ``begin``."""
    start = os.environ.get(CALL_START_ENV)
    try:
        t0 = float(start) if start else _BEGUN.get(notebook, time.time())
    except ValueError:
        t0 = _BEGUN.get(notebook, time.time())
    return max(time.time() - t0, 0.0)


def gpu_time_text(run_dir: str | Path, notebook: str, running_s: float | None = None) -> str:
    """This notebook's device-seconds (GPU-seconds on a GPU; earlier calls and this one) and their
    split, in one line."""
    running = _call_seconds(notebook) if running_s is None else running_s
    r = cost.notebook_cost(run_dir, notebook, running_s=running)
    parts = ", ".join(
        f"{cost.LABELS[c]} {r[c]:.0f} s ({100 * r[c] / r['gpu_s']:.0f}%)" if r["gpu_s"] else ""
        for c in cost.CATEGORIES
    )
    calls = f" over {r['calls']} calls" if r["calls"] > 1 else ""
    platform = cost.run_platform(run_dir)  # a CPU run's time is not called GPU time
    return (
        f"{cost.device_name(platform)} time of {notebook}{calls}: {r['gpu_s']:.0f}"
        f" {cost.seconds_label(platform)} ({parts});"
        f" {r['points']} points, {r['failed_points']} failed"
    )


def end(run_dir: str | Path, notebook: str) -> None:
    """The last cell: the engine log in a few lines, and the notebook's GPU-seconds."""
    print(console.summarize_log(log_path(run_dir, notebook)))
    print(gpu_time_text(run_dir, notebook))
    print(cost.starts_table(cost.starts(run_dir, notebook)))
    if text := cost.compiles_text(cost.compiles(run_dir, notebook)):
        print(text)


def record_verdicts(
    run_dir: str | Path,
    notebook: str,
    verdicts: list[dict],
    ledger: bool = False,
    model: str | Path | None = None,
):
    """Write the notebook's verdicts into the run's claims ledger; return their table to display
    (``ledger``: the whole run's ledger, every notebook's verdicts).

    Each verdict is scoped to the run's model (``claims.scoped``): a claim about the article's
    model, on a run of another model, is recorded as "not about this model". ``model`` defaults
    to the notebook's ``model`` parameter, which ``begin`` read from the notebook's globals, so
    the notebooks' calls need not pass it; with neither, verdicts are recorded as given.
    """
    model = model if model is not None else _MODEL.get(notebook)
    verdicts = claims.scope(verdicts, model)
    claims.write(run_dir, notebook, verdicts)
    return claims.table(claims.read_all(run_dir) if ledger else verdicts)


def verdicts_text(verdicts: list[dict]) -> str:
    """Each verdict in words: claim, verdict, figure with its spread, evidence, note."""
    return "\n".join(claims.describe(v) for v in verdicts)
