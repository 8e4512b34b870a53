"""Every bad input of a profile, a papermill parameter or a point fails fast: the key, the value and
what would be valid ("did you mean" for names), before any engine starts, without a traceback
wall, and without leaving a run folder behind.

The checks are the same in the runner (``profiles.check_params`` before the run folder is made)
and in each notebook (``tunebook.workbench.notebook.begin`` in its first cell after the parameters, for
parameters given to papermill directly). The engine-dependent checks import the installed vLLM
(no engine starts).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tunebook.core.errors import ConfigError, NotebookFailed
from tunebook.core.points import Point
from tunebook.workbench import profiles
from tunebook.workbench.runner import run_workbook

REPO = Path(__file__).resolve().parents[2]
PAPERMILL = Path(sys.executable).with_name("papermill")
# The assembly notebook by its topic: notebooks are numbered by their place in the workbook.
ASSEMBLY = next(n for n in profiles.NOTEBOOKS if n.endswith("_assemble_config"))


def _profile(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "prof.yaml"
    p.write_text(text)
    return p


# --------------------------------------------------------------------------- profiles
@pytest.mark.vllm
@pytest.mark.parametrize(
    "text,match",
    [
        # names: the closest valid one is suggested
        ("02_blok_size_sweep: {}\n", r"did you mean '02_block_size_sweep'\?"),
        (
            "common:\n  repeat: 2\n",
            r"'repeat' is not a parameter of 00_baseline; did you mean 'repeats'\?",
        ),
        (
            "common:\n  engine_settings: {enforce_eagre: true}\n",
            r"unknown engine setting 'enforce_eagre' .*did you mean 'enforce_eager'\?",
        ),
        (
            f"{ASSEMBLY}:\n  scenario: low_latncy\n",
            r"scenario = 'low_latncy' .*did you mean 'low_latency'\?",
        ),
        (
            f"{ASSEMBLY}:\n  also_validate: {{long_docs: {{}}}}\n",
            r"also_validate: scenario 'long_docs' is unknown; did you mean 'long_documents'\?",
        ),
        # values: what would be valid
        (
            "02_block_size_sweep:\n  block_sizes: [7]\n",
            r"block_sizes = \[7\]: none is a valid block_size on cpu; valid here: \[32, 64, 128, 256\]",
        ),
        (
            "02_block_size_sweep:\n  block_sizes: [0, 32]\n",
            r"block_sizes = 0 must be a whole number >= 1",
        ),
        ("common:\n  repeats: 0\n", r"repeats = 0 must be a whole number >= 1"),
        # 05's check_repeats may be 0 (vLLM's client only), not less
        (f"{ASSEMBLY}:\n  check_repeats: -1\n", r"check_repeats = -1 must be a whole number >= 0"),
        (
            "00_baseline:\n  concurrent_repeats: -1\n",
            r"concurrent_repeats = -1 must be a whole number >= 1",
        ),
        ("common:\n  model: no-such-model\n", r"model: model 'no-such-model' is neither a folder"),
        (
            "00_baseline:\n  mode: ofline\n",
            r"mode = 'ofline' is not valid; did you mean 'offline'\?",
        ),
        (
            "00_baseline:\n  concurrent_workload: {kind: fixed, num_requests: 4, prompt_lenn: 8}\n",
            r"concurrent_workload: .*unknown key\(s\) \['prompt_lenn'\]",
        ),
        (
            "common:\n  engine_settings: {gpu_memory_utilization: 1.5}\n",
            r"gpu_memory_utilization=1.5 must be in \(0, 1\]",
        ),
        (
            "common:\n  engine_env: {A: [1]}\n",
            r"engine_env: 'A' = \[1\]: environment values are text",
        ),
        # types: the value, the type, the default
        (
            "02_block_size_sweep:\n  block_sizes: '[7]'\n",
            r"block_sizes = '\[7\]' \(str\) does not match list\[int\] \(default: \[8, 16, 32, 128, 256\]\); give a list as YAML",
        ),
        ("02_block_size_sweep:\n  block_sizes: ['32']\n", r"does not match list\[int\]"),
    ],
)
def test_a_bad_profile_fails_before_the_run_folder_exists(tmp_path, text, match):
    p = _profile(tmp_path, text)
    runs = tmp_path / "runs"
    with pytest.raises(ConfigError, match=match) as err:
        run_workbook(str(p), "bad", runs_dir=runs, report=False, log=lambda _: None)
    assert str(p) in str(err.value)  # names the file
    assert not runs.exists()  # a run that never started leaves nothing


@pytest.mark.vllm
def test_shipped_profiles_pass_every_value_check():
    for name in ("cpu", "h200", "gpu", "rtx4090"):
        prof = profiles.load_profile(name)
        for nb in profiles.NOTEBOOKS:
            # Engine-dependent checks use this machine's platform: block sizes of a CUDA
            # profile may all be valid there and not here, so only the others run for them.
            engine = name == "cpu"
            profiles.check_params(nb, profiles.notebook_params(prof, nb), engine=engine)


@pytest.mark.vllm
def test_the_command_line_says_it_in_one_line(tmp_path):
    """`tunebook run` with a typo: exit 2, one error line naming the setting, no traceback."""
    p = _profile(tmp_path, "common:\n  engine_settings: {enforce_eagre: true}\n")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tunebook",
            "run",
            "--profile",
            str(p),
            "--runs-dir",
            str(tmp_path / "runs"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert "enforce_eagre" in lines[0] and "did you mean 'enforce_eager'?" in lines[0]
    assert not (tmp_path / "runs").exists()


# --------------------------------------------------------------------------- in the notebook
def _ns(params: dict, injected: dict | None = None) -> dict:
    """A kernel's namespace: the notebook's defaults, then what papermill injected (as its cell)."""
    declared = profiles.notebook_parameters("02_block_size_sweep")
    ns = {k: v["default"] for k, v in declared.items()}
    ns.update(params)
    history = ["import os", "# fmt: off\nrun_dir: str = ''"]
    if injected is not None:
        history.append("# Parameters\n" + "".join(f"{k} = {v!r}\n" for k, v in injected.items()))
        ns.update(injected)
    ns["In"] = history
    return ns


def test_check_injected_refuses_an_undeclared_papermill_parameter():
    with pytest.raises(
        ConfigError,
        match=r"'repeatz' is not a parameter of 02_block_size_sweep; did you mean 'repeats'\?",
    ):
        profiles.check_injected(_ns({}, {"repeatz": 3}), "02_block_size_sweep", engine=False)
    # declared ones pass, and a notebook run without papermill has nothing injected
    profiles.check_injected(_ns({}, {"repeats": 3}), "02_block_size_sweep", engine=False)
    profiles.check_injected(_ns({}), "02_block_size_sweep", engine=False)


def test_check_injected_catches_a_list_given_with_p():
    """`-p block_sizes "[7]"` arrives as text; the notebook says to use -y."""
    with pytest.raises(
        ConfigError, match=r"block_sizes = '\[7\]' \(str\) does not match list\[int\].*papermill -y"
    ):
        profiles.check_injected(
            _ns({}, {"block_sizes": "[7]"}), "02_block_size_sweep", engine=False
        )


@pytest.mark.vllm
def test_check_injected_checks_values_too():
    with pytest.raises(ConfigError, match=r"none is a valid block_size on cpu"):
        profiles.check_injected(_ns({}, {"block_sizes": [7]}), "02_block_size_sweep")


@pytest.mark.vllm
@pytest.mark.parametrize("prestart", ["0", "1"])
def test_begin_leaves_no_run_folder_for_bad_values(tmp_path, monkeypatch, prestart):
    """A value error after the engine log started leaves neither the run folder nor the log, nor
    the launchers started early (on a GPU node) with their logs."""
    import tunebook.workbench.notebook as tbn
    from tunebook.engine import launcher
    from tunebook.workbench import console

    monkeypatch.setenv("TUNEBOOK_PRESTART", prestart)
    monkeypatch.setattr(launcher, "_LAUNCHERS", {})
    run_dir = tmp_path / "run" / "sub"
    ns = _ns({"run_dir": str(run_dir)}, {"block_sizes": [7]})
    try:
        with pytest.raises(ConfigError, match="none is a valid block_size"):
            tbn.begin(ns, "02_block_size_sweep")
    finally:
        console.release_engine_log()
    assert not (tmp_path / "run").exists() and not launcher._LAUNCHERS


def test_empty_run_dir_is_inside_the_repository():
    for nb in profiles.NOTEBOOKS:
        assert profiles.notebook_parameters(nb)["run_dir"]["default"] == ""
    assert Path(profiles.run_folder("")).is_relative_to(REPO)
    assert profiles.run_folder("/x/y") == "/x/y"


# --------------------------------------------------------------------------- points
def test_a_bad_point_key_is_named_with_its_closest_valid_key(base_point):
    with pytest.raises(
        ConfigError, match=r"unknown point key 'warmup_request'; did you mean 'warmup_requests'\?"
    ):
        Point.from_dict({**base_point, "warmup_request": 1})


@pytest.mark.vllm
def test_a_bad_point_in_a_workbook_sweep_starts_no_engine_and_writes_no_point(tmp_path, base_point):
    from tunebook.workbench.workbook import Workbook

    wb = Workbook(
        str(tmp_path), "02_block_size_sweep", base_point["model"], {"enforce_eagre": True}
    )
    with pytest.raises(ConfigError, match=r"did you mean 'enforce_eager'\?"):
        wb.sweep("s", {"a": {}}, base_point["workload"])
    assert not list((tmp_path / "02_block_size_sweep" / "s").glob("*.json"))


def test_a_sweep_of_no_points_is_an_empty_frame_with_a_status_column(tmp_path):
    """02 with every candidate ruled out used to die on df["status"] (KeyError)."""
    from tunebook.measure.sweep import run_sweep

    df = run_sweep([], tmp_path / "none", progress=False)
    assert len(df) == 0
    assert len(df[df["status"] != "ok"]) == 0


# --------------------------------------------------------------------------- papermill as the README shows it
@pytest.mark.slow
@pytest.mark.parametrize("nb", profiles.NOTEBOOKS)
def test_papermill_help_notebook_lists_every_parameter(nb):
    r = subprocess.run(
        [str(PAPERMILL), "--help-notebook", str(REPO / "notebooks" / f"{nb}.ipynb")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    listed = set(re.findall(r"^  (\w+):", r.stdout, re.M))
    declared = set(profiles.notebook_parameters(nb))
    assert declared <= listed, f"not listed by papermill: {sorted(declared - listed)}"
    assert "Unable to parse" not in r.stderr + r.stdout


@pytest.mark.slow
def test_papermill_with_an_unknown_parameter_stops_in_the_check_cell(tmp_path):
    """papermill only warns about `-p repeatz 3`; the notebook stops before any engine, says what
    was meant, and writes no results (the run folder it would use stays absent)."""
    out = tmp_path / "out.ipynb"
    run_dir = tmp_path / "run"
    r = subprocess.run(
        [
            str(PAPERMILL),
            str(REPO / "notebooks" / "02_block_size_sweep.ipynb"),
            str(out),
            "-p",
            "run_dir",
            str(run_dir),
            "-p",
            "repeatz",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert r.returncode != 0
    text = r.stderr + r.stdout
    assert "'repeatz' is not a parameter of 02_block_size_sweep; did you mean 'repeats'?" in text
    nb = json.loads(out.read_text())
    failed = [
        c
        for c in nb["cells"]
        if c.get("outputs") and any(o.get("output_type") == "error" for o in c["outputs"])
    ]
    assert len(failed) == 1 and "tunebook.workbench.notebook.begin" in "".join(failed[0]["source"])
    tb = [o for o in failed[0]["outputs"] if o["output_type"] == "error"][0]["traceback"]
    assert len(tb) == 1, tb  # the message, not a traceback
    assert not run_dir.exists()


# --------------------------------------------------------------------------- a notebook that stops
def _notebook(path: Path, cells: list[str]) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "py"}
    nb.cells = [nbformat.v4.new_markdown_cell("# question")]
    params = nbformat.v4.new_code_cell("run_dir: str = ''  # where results go")
    params.metadata["tags"] = ["parameters"]
    nb.cells.append(params)
    nb.cells += [nbformat.v4.new_code_cell(c) for c in cells]
    nbformat.write(nb, path)


@pytest.mark.vllm
def test_a_failing_notebook_is_one_line_and_its_calls_accumulate(tmp_path, monkeypatch):
    """The runner names the cell and the error (no traceback); each call is kept in run.json."""
    nb_dir = tmp_path / "notebooks"
    nb_dir.mkdir()
    flag = tmp_path / "fail-once"
    flag.write_text("")
    _notebook(
        nb_dir / "00_baseline.ipynb",
        [
            f"import os\nif os.path.exists({str(flag)!r}):\n    os.remove({str(flag)!r})\n    raise ValueError('first call fails')"
        ],
    )
    monkeypatch.setattr(profiles, "NOTEBOOKS_DIR", nb_dir)
    monkeypatch.setattr("tunebook.workbench.runner.NOTEBOOKS_DIR", nb_dir)
    prof = _profile(tmp_path, "common: {}\n")
    runs = tmp_path / "runs"
    lines: list[str] = []
    with pytest.raises(
        NotebookFailed,
        match=r"00_baseline stopped in cell \[\d+\]: ValueError: first call fails \(see .*00_baseline\.ipynb\)",
    ):
        run_workbook(str(prof), "r", ["00"], runs_dir=runs, log=lines.append)
    assert any("FAILED" in ln for ln in lines) and not any("Traceback" in ln for ln in lines)
    # the report of what did run is written all the same, and says which notebook stopped
    page = (runs / "r" / "report" / "index.html").read_text()
    assert "failed" in page and "first call fails" in page
    run_workbook(str(prof), "r", ["00"], runs_dir=runs, resume=True, report=False, log=lines.append)
    entry = json.loads((runs / "r" / "run.json").read_text())["notebooks"]["00_baseline"]
    assert [c["status"] for c in entry["calls"]] == ["failed", "ok"]
    assert entry["status"] == "ok"
    assert entry["seconds"] == pytest.approx(sum(c["seconds"] for c in entry["calls"]))
    assert "first call fails" in entry["calls"][0]["error"]
    log = (runs / "r" / "run.log").read_text()
    assert "00_baseline: running" in log and "FAILED" in log
