"""The files that start a chosen configuration: serve.sh, serve.yaml, llm_kwargs.py, choice.json
for one server; replica<i>.yaml and start.sh for N replicas behind vllm-router.

``render_files`` and ``write_config`` write one server's files; ``deployment_files`` and
``write_deployment`` an N-replica deployment's: one ``vllm serve --config`` file per replica (its
KV share and its share of ``gpu_memory_utilization``), and ``start.sh``, which starts every
replica and vllm-router in front of them and stops them all when it ends. Each file opens with
the choice's header: what was chosen, on which evidence. ``python -m tunebook.serve <folder>
--check`` runs them as written.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from tunebook.core.results import _jsonable, write_files
from tunebook.engine.flags import replica_engine_kwargs, serve_command, split_env, yaml_config


def fmt_setting(v) -> str:
    """A setting's value as the files and the decision table print it."""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def evidence_where(d: dict) -> str:
    """Where a decision's evidence lies: ``<notebook>/<sweep>[ [part]]``."""
    return f"{d['notebook']}/{d['sweep']}" + (f" [{d['part']}]" if d.get("part") else "")


# `vllm serve` binds every interface when --host is not given; --api-key guards /v1 only.
BIND_NOTE = {
    "sh": "listens on all interfaces: --host 127.0.0.1 keeps it on this machine; --api-key <key> guards /v1",
    "yaml": "listens on all interfaces: host: 127.0.0.1 keeps it on this machine; api-key: <key> guards /v1",
}


def _header(choice: dict, comment: str = "#") -> str:
    lines = [
        f"Assembled by tunebook 05_assemble_config for scenario {choice.get('scenario')}",
        f"objective: {choice.get('objective')}",
    ]
    if choice.get("slo"):
        lines.append("SLO: " + ", ".join(f"{k} <= {v:g}" for k, v in choice["slo"].items()))
    for d in choice.get("decisions", []):
        if d.get("changed"):
            lines.append(
                f"{d['setting']}={fmt_setting(d['value'])}: {evidence_where(d)} ({d['status']})"
            )
    if not choice.get("changed"):
        served = choice.get("served_choice") or {}
        lines.append(
            "no engine setting measured alone (00-03) beat vLLM's default beyond the noise:"
            " those defaults kept; the deployment has its own reason (its 'chosen:' line)"
            if served.get("status") == "changed"
            else "no measured setting beat vLLM's default beyond the noise: defaults kept"
        )
    for k in choice.get("base_settings", {}):
        lines.append(f"{k}: from the profile's engine settings (platform), not tuned here")
    lines.append("evidence: choice.json beside this file")
    return "\n".join(f"{comment} {x}" for x in lines) + "\n"


def _env_notes(measurement: dict[str, dict]) -> str:
    if not measurement:
        return ""
    names = " ".join(f"{k}={m['value']}" for k, m in measurement.items())
    return f"# left out: {names} (measurement only; why: choice.json measurement_env)\n"


def shell_script(choice: dict, env: dict | None, launch: str, notes: tuple[str, ...] = ()) -> str:
    """A bash script that starts a deployment: the choice's header, notes, strict mode, the
    deployment environment exported, then ``launch`` (the lines that start vLLM).

    serve.sh passes one ``exec vllm serve ...``; a start script for several replicas passes its
    own launch lines (``serve_argv`` plus a port each) and keeps the rest.
    """
    deploy, measurement = split_env(env)
    sh = "#!/usr/bin/env bash\n" + _header(choice)
    sh += _env_notes(measurement)
    sh += f"# {BIND_NOTE['sh']}\n"
    sh += "# runs the vllm command on PATH (tunebook's install: .venv/bin)\n"
    sh += "".join(f"# {n}\n" for n in notes)
    sh += "set -euo pipefail\n"
    sh += "".join(f"export {k}={shlex.quote(v)}\n" for k, v in deploy.items())
    return sh + launch.rstrip("\n") + "\n"


def render_files(
    choice: dict, kwargs: dict, env: dict | None = None, served_model_name: str | None = None
) -> dict[str, str]:
    """The text of serve.sh, serve.yaml, llm_kwargs.py and choice.json.

    serve.sh and serve.yaml carry the deployment's environment only; the measurement-only part of
    ``env`` (``MEASUREMENT_ENV``) is recorded in choice.json with the reason it was set.
    """
    import yaml

    deploy, measurement = split_env(env)
    # Arguments after serve.sh go to vllm serve, where a later flag wins over the written one.
    sh = shell_script(
        choice,
        env,
        "exec " + serve_command(kwargs, served_model_name) + ' "$@"',
        notes=("flags given to this script are added: bash serve.sh --port 8001",),
    )
    ycfg = yaml_config(kwargs, served_model_name)
    yml = (
        _header(choice)
        + _env_notes(measurement)
        + "# run: vllm serve --config serve.yaml   (or: python -m tunebook.serve serve.yaml --check)\n"
        + f"# {BIND_NOTE['yaml']}\n"
    )
    if deploy:
        yml += "# environment: " + " ".join(f"{k}={v}" for k, v in deploy.items()) + "\n"
    yml += yaml.safe_dump(ycfg, sort_keys=False, default_flow_style=False)
    py = '"""' + _header(choice, "").replace("\n ", "\n").strip() + '\n"""\n\n'
    if deploy:
        py += "import os\n\n"
        py += "".join(f"os.environ.setdefault({k!r}, {v!r})\n" for k, v in deploy.items())
        py += "\n"
    py += "kwargs = " + _pyrepr(kwargs) + "\n\n"
    py += 'if __name__ == "__main__":\n    from vllm import LLM\n\n    llm = LLM(**kwargs)\n'
    py += '    print(llm.generate(["Hello"])[0].outputs[0].text)\n'
    doc = {
        **choice,
        "env": deploy,
        "measurement_env": measurement,
        "llm_kwargs": kwargs,
        "serve_yaml": ycfg,
        "serve_command": serve_command(kwargs, served_model_name, multiline=False),
    }
    return {
        "serve.sh": sh,
        "serve.yaml": yml,
        "llm_kwargs.py": py,
        "choice.json": json.dumps(_jsonable(doc), indent=2, sort_keys=False) + "\n",
    }


def _pyrepr(d: dict) -> str:
    if not d:
        return "{}"
    return "{\n" + "".join(f"    {k!r}: {v!r},\n" for k, v in d.items()) + "}"


def write_config(
    out_dir: str | Path,
    choice: dict,
    kwargs: dict,
    env: dict | None = None,
    served_model_name: str | None = None,
) -> dict[str, Path]:
    """Write the four files atomically into ``out_dir``; return their paths."""
    return write_files(out_dir, render_files(choice, kwargs, env, served_model_name))


def start_script(
    choice: dict,
    replicas: int,
    router_policy: str,
    env: dict | None,
    base_port: int = 8001,
    port: int = 8000,
) -> str:
    """start.sh: every replica in the background, vllm-router in front; all stop together."""
    workers = " ".join(f"http://127.0.0.1:$((BASE_PORT + {i}))" for i in range(replicas))
    launch = (
        'cd "$(dirname "$0")"\n'
        f"PORT=${{PORT:-{port}}}              # the router: clients use http://<host>:$PORT/v1\n"
        f"BASE_PORT=${{BASE_PORT:-{base_port}}}    # replica i listens on 127.0.0.1:$((BASE_PORT + i))\n"
        "pids=()\n"
        "# Stop every replica when the router ends (Ctrl-C, kill, or a failure).\n"
        "trap 'kill \"${pids[@]}\" 2>/dev/null; wait' EXIT\n"
        + "".join(
            f"vllm serve --config replica{i}.yaml --host 127.0.0.1 --port $((BASE_PORT + {i})) &\n"
            "pids+=($!)\n"
            for i in range(replicas)
        )
        + "# The router waits for the replicas' /health before it serves (--worker-startup-timeout-secs).\n"
        + 'vllm-router --host ${HOST:-127.0.0.1} --port "$PORT"'
        + f" --policy {shlex.quote(router_policy)}"
        + " --prometheus-port $((PORT + 1000)) --worker-startup-timeout-secs 1800"
        + f" --worker-urls {workers}\n"
    )
    return shell_script(
        choice,
        env,
        launch,
        notes=(
            f"{replicas} vllm serve replicas on this machine behind vllm-router ({router_policy});"
            " each replica's file holds its KV share",
            "ports: PORT=8000 BASE_PORT=8001 bash start.sh (replicas bind 127.0.0.1 only; HOST sets the router's)",
        ),
    )


def deployment_files(
    choice: dict,
    kwargs: dict,
    replicas: int,
    router_policy: str = "round_robin",
    env: dict | None = None,
    served_model_name: str | None = None,
) -> dict[str, str]:
    """The text of replica<i>.yaml (one per replica), start.sh and deployment.json."""
    import yaml

    rkw = replica_engine_kwargs(kwargs, replicas)
    files = {}
    for i in range(replicas):
        y = (
            _header(choice)
            + f"# replica {i} of {replicas}: started by start.sh (vllm serve --config replica{i}.yaml --port ...)\n"
            + f"# {BIND_NOTE['yaml']}\n"
            + yaml.safe_dump(yaml_config(rkw, served_model_name), sort_keys=False)
        )
        files[f"replica{i}.yaml"] = y
    files["start.sh"] = start_script(choice, replicas, router_policy, env)
    served = choice.get("served_choice") or {}
    # The header speaks of the setting-by-setting choice; this deployment has its own reason,
    # what checked it (05: vllm bench serve, held-out workloads) and the traffic it loses on.
    lines = [f"# chosen: {served['reason']}"] if served.get("reason") else []
    lines += [f"# checked: {c}" for c in served.get("checked") or []]
    lines += [f"# not for: {x}" for x in served.get("not_for") or []]
    if lines:
        block = "\n".join(lines) + "\n"
        for name in files:
            files[name] = (
                files[name].replace("set -euo pipefail\n", block + "set -euo pipefail\n", 1)
                if name.endswith(".sh")
                else block + files[name]
            )
    files["deployment.json"] = (
        json.dumps(
            {
                "replicas": replicas,
                "router_policy": router_policy,
                "replica_kwargs": rkw,
                "files": sorted(files),
                "start": "bash start.sh   (or: python -m tunebook.serve <this folder> --check)",
            },
            indent=2,
            default=str,
        )
        + "\n"
    )
    return files


def write_deployment(out_dir: str | Path, *args, **kwargs) -> dict[str, Path]:
    """Write ``deployment_files`` atomically into ``out_dir`` (start.sh executable)."""
    return write_files(out_dir, deployment_files(*args, **kwargs))
