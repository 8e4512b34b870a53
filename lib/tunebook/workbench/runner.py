"""Headless runner: execute the notebooks in order with papermill into runs/<run-id>/, then report.

The terminal gets one progress line per notebook; ``<run>/run.log`` gets the same lines, the
kernels' stderr, and the counts of known-harmless warnings hidden from the terminal.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tunebook.core.errors import ConfigError, NotebookFailed
from tunebook.core.model import REPO_ROOT
from tunebook.core.results import atomic_write_text, first_missing, safe_name
from tunebook.engine import launcher
from tunebook.engine.interrupt import stop_on_signal
from tunebook.workbench import early, report
from tunebook.workbench.console import (
    PROGRESS_FILE,
    ProgressLine,
    StderrFilter,
    hidden_text,
    hide_stopped_cell_task,
    quiet_vllm_import,
)
from tunebook.workbench.notebook import CALL_START_ENV
from tunebook.workbench.profiles import (
    NOTEBOOKS,
    NOTEBOOKS_DIR,
    check_values,
    detect_profile,
    load_profile,
    notebook_params,
)

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


def preflight(prof: dict, names: list[str], engine: bool = True) -> dict[str, dict]:
    """Every notebook's parameters checked before anything runs: names, types, then values.

    Names and types first, for all notebooks (instant); then the values, which for engine settings
    and block sizes import the installed vLLM (seconds; ``engine_preflight``, unless ``engine`` is
    False). Returns each notebook's parameters.
    """
    plan = {n: notebook_params(prof, n) for n in names}
    src = str(prof.get("_path", "<profile>"))
    for n in names:
        check_values(n, plan[n], source=f"{src}: {n}", engine=False)
    if engine:
        engine_preflight(prof, plan)
    return plan


def engine_preflight(prof: dict, plan: dict[str, dict]) -> None:
    """The value checks that import vLLM (engine settings, block sizes), for every notebook."""
    src = str(prof.get("_path", "<profile>"))
    names = list(plan)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # vLLM's import-time deprecations are not the user's
        with quiet_vllm_import():
            for n in names:
                check_values(n, plan[n], source=f"{src}: {n}", engine=True)


WARM_UP_LOG = "warm-up.log"


def start_warm_up(models: list[str]) -> dict | None:
    """On a GPU node, resolve each model's architecture in a background process.

    An engine's first start on a node waits for vLLM to inspect the model class in a fresh
    Python process (20 s of the first server's 56 s on a fresh H100, runs/h100-20261206c); the
    answer is cached under ``VLLM_CACHE_ROOT``. Started before the runner's own parameter check,
    it runs while that check and the first notebook's kernel import vLLM, so the first engine
    finds it cached. Where notebooks start their launchers early (``launcher.wants_prestart``:
    GPU nodes), else None: on a few CPU cores it would only compete with the run.
    """

    if not models or not launcher.wants_prestart():
        return None
    fd, log = tempfile.mkstemp(prefix="tunebook-warm-up-", suffix=".log")
    with os.fdopen(fd, "w") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tunebook.engine.adapter", "architecture", *models],
            stdin=subprocess.DEVNULL,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: stopped with everything it started
        )
    return {"proc": proc, "log": Path(log), "models": list(models)}


def finish_warm_up(warm: dict | None, run_dir: Path | None, started: float) -> dict | None:
    """Stop the warm-up if it still runs, move its log into the run folder, and return what
    run.json keeps of it: the models resolved and when it ended (seconds after ``started``)."""
    if warm is None:
        return None
    proc = warm["proc"]
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
    log: Path = warm["log"]
    text = log.read_text(errors="replace") if log.is_file() else ""
    resolved = []
    for line in text.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if isinstance(msg, dict) and "architectures" in msg:
            resolved.append(msg)
    if run_dir is not None:
        with open(run_dir / WARM_UP_LOG, "a") as f:
            f.write(text)
    log.unlink(missing_ok=True)
    return {
        "models": warm["models"],
        "resolved": [m["model"] for m in resolved],
        "seconds": round(sum(float(m.get("seconds") or 0.0) for m in resolved), 3),
        "ended_after_s": round(float(resolved[-1]["ended"]) - started, 3) if resolved else None,
        "returncode": proc.returncode,
    }


def run_workbook(
    profile: str | None = None,
    run_id: str | None = None,
    notebooks: list[str] | None = None,
    resume: bool = False,
    runs_dir: str | Path = RUNS_DIR,
    report: bool = True,
    log=print,
    started: float | None = None,
) -> Path:
    """Run notebooks in order; return the run folder. A notebook already executed is skipped on resume.

    Every parameter of every notebook is checked before any notebook runs, and a bad input leaves
    nothing behind: the run folder is made after the checks, or, where the first notebook's kernel
    starts during them (``tunebook.workbench.early``: GPU nodes), removed again with that kernel. Each call
    of a notebook is recorded in ``run.json`` (its seconds and status), and calls accumulate over
    resumes. So is the runner itself (``runner``: its seconds from ``started``, the epoch time it
    began, default now, and how many of them the notebooks took): its imports, the profile check
    that imports vLLM, and the report hold the device too.
    """
    started = time.time() if started is None else started
    profile = profile or detect_profile()
    prof = load_profile(profile)
    names = select_notebooks(notebooks)
    warm = start_warm_up(_models(prof, names))
    try:
        run_dir, run_id, plan, ahead = _check_and_claim(
            prof, names, profile, run_id, runs_dir, resume, log
        )
    except BaseException:
        finish_warm_up(warm, None, started)
        raise
    state_path = run_dir / "run.json"
    state = _state(run_dir)
    state.update(run_id=run_id, profile=str(prof["_path"]), python=sys.version.split()[0])
    state.setdefault("notebooks", {})
    before = _calls_seconds(state)
    me = {"started": dt.datetime.fromtimestamp(started).isoformat(timespec="seconds")}
    state.setdefault("runner", []).append(me)

    def record() -> None:
        me["seconds"] = time.time() - started
        me["notebook_s"] = _calls_seconds(state) - before
        atomic_write_text(state_path, json.dumps(state, indent=2))

    def warm_up_done(log) -> None:
        if warm is None or "warm_up" in me:
            return
        me["warm_up"] = finish_warm_up(warm, run_dir, started)
        _log_warm_up(me["warm_up"], log)

    with open(run_dir / RUN_LOG, "a") as run_log:
        tee = _tee(log, run_log)
        try:
            with stop_on_signal():  # SIGINT/SIGTERM stop the run, even where inherited ignored
                _run_notebooks(names, plan, run_dir, state, state_path, resume, tee, run_log, ahead)
        except NotebookFailed:
            warm_up_done(tee)
            if report:  # what did run is worth reading: the report says which notebook stopped
                record()  # the report shows this call's runner seconds so far
                _report(run_dir, tee)
            raise
        else:
            warm_up_done(tee)
            if report:
                record()
                _report(run_dir, tee)
        finally:
            warm_up_done(tee)
            record()
    return run_dir


def _check_and_claim(
    prof: dict,
    names: list[str],
    profile: str,
    run_id: str | None,
    runs_dir: str | Path,
    resume: bool,
    log,
) -> tuple[Path, str, dict[str, dict], early.EarlyKernel | None]:
    """Check every notebook's parameters and claim the run folder: returns (run folder, run id,
    each notebook's parameters, the first notebook's kernel started early or None).

    A check that fails leaves nothing behind: the early kernel is stopped and the folder made
    for it removed.
    """
    ahead = run_dir = made = None
    try:
        plan = preflight(prof, names, engine=False)
        run_id = safe_name(run_id or new_run_id(Path(profile).stem), "run id")
        if early.wanted():
            # The first notebook's kernel prepares (tunebook.workbench.early) while vLLM is imported here
            # for the value checks; a check that fails removes the run folder again.
            new = first_missing(Path(runs_dir).resolve() / run_id)
            run_dir = claim_run_dir(runs_dir, run_id, resume)
            made = new
            todo = _todo(names, _state(run_dir), resume)
            ahead = _start_early(todo[0], plan, run_dir, None) if todo else None
        engine_preflight(prof, plan)
        log(f"[tunebook] {prof['_path']}: parameters of {len(names)} notebook(s) checked")
        if run_dir is None:
            run_dir = claim_run_dir(runs_dir, run_id, resume)
    except BaseException:
        if ahead is not None:
            ahead.discard()
        if made is not None:  # a run that never started leaves nothing
            shutil.rmtree(made, ignore_errors=True)
        raise
    return run_dir, run_id, plan, ahead


def _log_warm_up(w: dict, log) -> None:
    """One line on the model inspection warm-up: what it cached, or that it did not finish."""
    if w and w["resolved"]:
        log(
            f"[tunebook] vLLM's model inspection ({', '.join(w['resolved'])}) cached in the"
            f" background: {w['seconds']:.1f} s, done {w['ended_after_s']:.0f} s after the"
            " runner started"
        )
    else:  # stopped at the run's end, or failed: engines inspect the model themselves
        how = "was stopped" if w["returncode"] == -signal.SIGKILL else "failed"
        log(f"[tunebook] the model inspection warm-up {how}: see {WARM_UP_LOG}")


def _state(run_dir: Path) -> dict:
    path = run_dir / "run.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _todo(names: list[str], state: dict, resume: bool) -> list[str]:
    """The notebooks this call runs: all of them, or on resume those not done yet."""
    done = state.get("notebooks", {})
    return [n for n in names if not (resume and done.get(n, {}).get("status") == "ok")]


def _models(prof: dict, names: list[str]) -> list[str]:
    """The distinct models the notebooks run (none where a profile is broken: the check says)."""
    try:
        models = [notebook_params(prof, n).get("model") for n in names]
    except ConfigError:
        return []
    return list(dict.fromkeys(m for m in models if isinstance(m, str) and m))


def _calls_seconds(state: dict) -> float:
    # each entry's seconds are its calls' sum (_record_call), an older run.json's one call too
    return sum(float(e.get("seconds") or 0.0) for e in state.get("notebooks", {}).values())


def _report(run_dir: Path, log) -> None:
    try:
        log(f"[tunebook] report: {write_report(run_dir)}")
    except ImportError as e:
        # nbconvert is absent on some GPU nodes; the notebooks are the record
        log(f"[tunebook] no HTML report ({e}); executed notebooks are in {run_dir}")


RUN_LOG = "run.log"


def _tee(log, run_log):
    def out(msg: str) -> None:
        log(msg)
        run_log.write(msg + "\n")
        run_log.flush()

    return out


class _KnownParameters(logging.Filter):
    """papermill warns "Passed unknown parameter" when its own parser cannot read a declaration;
    the runner has checked every name against the notebook already."""

    def __init__(self, names):
        super().__init__()
        self.names = set(names)

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not (
            msg.startswith("Passed unknown parameter:")
            and msg.split(":", 1)[1].strip() in self.names
        )


def _record_call(state: dict, name: str, call: dict) -> dict:
    """Add one call to a notebook's entry; ``status`` and ``seconds`` are the latest and the sum."""
    entry = state["notebooks"].get(name) or {}
    calls = entry.get("calls")
    if calls is None:  # a run.json written before calls were kept: its one entry is a call
        calls = [{"seconds": entry["seconds"], "status": entry.get("status")}] if entry else []
    calls.append(call)
    entry = {
        **{k: v for k, v in entry.items() if k not in ("error",)},
        "status": call["status"],
        "seconds": sum(float(c.get("seconds") or 0.0) for c in calls),
        "calls": calls,
    }
    if call.get("error"):
        entry["error"] = call["error"]
    state["notebooks"][name] = entry
    return entry


def _failure(name: str, e: Exception, out_nb: Path) -> str:
    """One line: the cell, the error and where the executed notebook is (no traceback wall)."""
    ename, evalue = getattr(e, "ename", None), getattr(e, "evalue", None)
    if ename:
        cell = getattr(e, "exec_count", None)
        where = f"in cell [{cell}]" if cell is not None else "in a cell"
        return f"{name} stopped {where}: {ename}: {str(evalue).strip()[:800]} (see {out_nb})"
    text = str(e).strip()
    return f"{name} failed: {text.splitlines()[-1][:800] if text else repr(e)}"


def _run_notebooks(
    names, plan, run_dir: Path, state: dict, state_path: Path, resume, log, run_log, ahead=None
) -> None:
    import papermill as pm

    pm_log = logging.getLogger("papermill")
    known = _KnownParameters({k for p in plan.values() for k in p} | {"run_dir"})
    pm_log.addFilter(known)
    todo = _todo(names, state, resume)
    # ahead: the next notebook's kernel, started early (tunebook.workbench.early)
    try:
        with StderrFilter(run_log) as err:
            for name in names:
                if name not in todo:
                    log(f"[tunebook] {name}: done in an earlier run, skipped (resume)")
                    continue
                params = {**plan[name], "run_dir": str(run_dir)}
                out_nb = run_dir / f"{name}.ipynb"
                log(f"[tunebook] {name}: running -> {out_nb}")
                started = dt.datetime.now().isoformat(timespec="seconds")
                t0 = time.perf_counter()
                call_start = time.time()
                os.environ[CALL_START_ENV] = repr(call_start)  # a kernel started now inherits it
                call = {"started": started, "status": "running"}
                mine = ahead if ahead is not None and ahead.notebook == name else None
                if ahead is not None and mine is None:
                    ahead.discard()
                ahead = None
                nxt = todo.index(name) + 1
                try:
                    if mine is not None:
                        call["early_kernel"] = _hand_over(mine, call_start, run_log)
                    if nxt < len(todo):
                        ahead = _start_early(todo[nxt], plan, run_dir, run_log)
                    _execute_notebook(pm, name, out_nb, params, mine, run_dir, run_log)
                    call["status"] = "ok"
                except KeyboardInterrupt:
                    # Ctrl-C: papermill's client shuts the kernel down; its engines go with its
                    # process group, and an isolated engine child kills its own group once its
                    # parent is gone.
                    call["status"] = "interrupted"
                    hide_stopped_cell_task()
                    log(
                        f"[tunebook] {name}: interrupted; finished points are kept"
                        " (--resume continues)"
                    )
                    raise
                except Exception as e:
                    call["status"] = "failed"
                    call["error"] = _failure(name, e, out_nb)
                    log(f"[tunebook] {name}: FAILED: {call['error']}")
                    raise NotebookFailed(call["error"]) from None
                finally:
                    if mine is not None:  # papermill stops only kernels it started itself
                        mine.shut_down()
                    os.environ.pop(CALL_START_ENV, None)
                    call["seconds"] = time.perf_counter() - t0
                    entry = _record_call(state, name, call)
                    atomic_write_text(state_path, json.dumps(state, indent=2))
                    run_log.write(f"[tunebook] {name}: {hidden_text(err.take_counts())}\n")
                log(_done_line(name, call, entry))
    finally:
        if ahead is not None:  # the run stopped before that notebook's turn
            ahead.discard()
        pm_log.removeFilter(known)


def _execute_notebook(pm, name: str, out_nb: Path, params: dict, mine, run_dir: Path, run_log):
    """Execute one notebook with papermill into ``out_nb`` (in the kernel started early for it,
    ``mine``, where there is one), its progress on one terminal line."""
    with ProgressLine(name, run_dir / name / PROGRESS_FILE, run_log):
        pm.execute_notebook(
            str(NOTEBOOKS_DIR / f"{name}.ipynb"),
            str(out_nb),
            parameters=params,
            cwd=str(NOTEBOOKS_DIR),
            progress_bar=False,
            log_output=False,
            kernel_name="python3",
            **({"km": mine.km} if mine and mine.km else {}),
        )


def _done_line(name: str, call: dict, entry: dict) -> str:
    """The progress line of a notebook that ran: this call's seconds, and all calls' if several."""
    return f"[tunebook] {name}: ok in {call['seconds']:.0f} s" + (
        f" ({entry['seconds']:.0f} s over {len(entry['calls'])} calls)"
        if len(entry["calls"]) > 1
        else ""
    )


def _start_early(name: str, plan: dict, run_dir: Path, run_log):
    """The kernel of ``name``, started now to prepare while the current notebook runs (None where
    not wanted, or if it does not start: the notebook then gets a kernel of its own)."""
    if not early.wanted():
        return None
    try:
        return early.EarlyKernel.start(
            name, {**plan[name], "run_dir": str(run_dir)}, NOTEBOOKS_DIR, run_dir
        )
    except Exception as e:
        if run_log is not None:
            run_log.write(f"[tunebook] {name}: its kernel did not start early ({e})\n")
        return None


def _hand_over(mine, call_start: float, run_log) -> dict:
    """Take over the kernel started early for this notebook; if its preparation failed, stop it
    (the notebook then runs in a kernel of its own, and says what is wrong)."""
    try:
        info = mine.hand_over(call_start)
    except Exception as e:
        info = {"prepare": f"{type(e).__name__}: {e}"}
    if info["prepare"] != "ok":
        mine.discard()
    run_log.write(
        f"[tunebook] {mine.notebook}: kernel started {info.get('started_before_s', '?')} s"
        f" early; waited {info.get('waited_s', '?')} s for it; preparation {info['prepare']}\n"
    )
    run_log.flush()
    return info


def write_report(run_dir: str | Path) -> Path:
    """The run's HTML report (``tunebook.workbench.report``): a summary page and one page per notebook."""

    return report.write_report(run_dir)
