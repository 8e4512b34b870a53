"""The runner's background warm-up: vLLM's model inspection cached before the first engine."""

from __future__ import annotations

import json

import pytest

from tunebook.workbench import runner


def test_no_warm_up_where_launchers_are_not_started_early(monkeypatch):
    monkeypatch.setenv("TUNEBOOK_PRESTART", "0")  # a CPU machine's default
    assert runner.start_warm_up(["tiny-ernie"]) is None
    monkeypatch.setenv("TUNEBOOK_PRESTART", "1")
    assert runner.start_warm_up([]) is None


@pytest.mark.engine
@pytest.mark.vllm
def test_warm_up_caches_the_model_inspection_that_an_engine_start_then_finds(monkeypatch, tmp_path):
    """Real vLLM: the background process writes vLLM's modelinfos cache, and an engine
    configuration built afterwards resolves the architecture from it without inspecting again."""
    cache = tmp_path / "vllm-cache"
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(cache))
    monkeypatch.setenv("TUNEBOOK_PRESTART", "1")
    started = runner.time.time()
    warm = runner.start_warm_up(["tiny-ernie"])
    assert warm is not None
    assert warm["proc"].wait(timeout=300) == 0
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rec = runner.finish_warm_up(warm, run_dir, started)
    assert rec["resolved"] == ["tiny-ernie"] and rec["returncode"] == 0
    assert 0 < rec["seconds"] <= rec["ended_after_s"]
    infos = list((cache / "modelinfos").glob("*Ernie4_5ForCausalLM*.json"))
    assert len(infos) == 1, list(cache.rglob("*"))
    line = json.loads((run_dir / runner.WARM_UP_LOG).read_text().strip().splitlines()[-1])
    assert line["architectures"] == ["Ernie4_5ForCausalLM"]
    assert not warm["log"].exists()  # moved into the run folder
    # What the cache is for: the engine's own resolution now finds it (the file is not rewritten)
    before = infos[0].stat().st_mtime_ns
    proc = runner.subprocess.run(
        [runner.sys.executable, "-m", "tunebook.engine.adapter", "architecture", "tiny-ernie"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert infos[0].stat().st_mtime_ns == before


def test_a_warm_up_still_running_is_stopped_and_said_so(tmp_path):
    log = tmp_path / "warm.log"
    log.write_text("")
    proc = runner.subprocess.Popen(["sleep", "60"], start_new_session=True)
    warm = {"proc": proc, "log": log, "models": ["m"]}
    rec = runner.finish_warm_up(warm, tmp_path, runner.time.time())
    assert proc.returncode is not None and proc.returncode < 0  # killed, not waited for
    assert rec["resolved"] == [] and rec["ended_after_s"] is None
    assert (tmp_path / runner.WARM_UP_LOG).is_file() and not log.exists()


@pytest.mark.slow
def test_the_random_init_checkpoint_is_written_early_by_a_process_of_its_own(monkeypatch, tmp_path):
    """01 starts it before its parameter check on a GPU node; the derived-values cell then only
    waits for it. Real transformers init, tiny model."""
    from tunebook.topics import kvcache as kv

    monkeypatch.setenv("TUNEBOOK_PRESTART", "0")  # a CPU machine: the cell writes it itself
    assert kv.prepare_random_init("tiny-ernie", 3, str(tmp_path)) is None
    monkeypatch.setenv("TUNEBOOK_PRESTART", "1")
    assert kv.prepare_random_init("no-such-model", 3, str(tmp_path)) is None  # begin says why
    early = kv.prepare_random_init("tiny-ernie", 3, str(tmp_path))
    assert early is not None
    assert early.wait(timeout=300) == 0
    written = list((tmp_path / "tiny-ernie-seed3").glob("*.safetensors"))
    assert len(written) == 1  # by the process alone, before the notebook asks for it
    mtime = written[0].stat().st_mtime_ns
    dest = kv.random_init_checkpoint("tiny-ernie", 3, str(tmp_path), early=early)
    assert dest == tmp_path / "tiny-ernie-seed3" and written[0].stat().st_mtime_ns == mtime
    assert kv.prepare_random_init("tiny-ernie", 3, str(tmp_path)) is None  # written already
