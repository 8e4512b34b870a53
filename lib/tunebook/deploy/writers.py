"""The files that start a chosen configuration: serve.sh, serve.yaml, llm_kwargs.py, choice.json
for one server; replica<i>.yaml and start.sh for N replicas behind vllm-router.

``render_files`` and ``write_config`` write one server's files; ``deployment_files`` and
``write_deployment`` an N-replica deployment's: one ``vllm serve --config`` file per replica (its
KV share and its share of ``gpu_memory_utilization``), and ``start.sh``, which starts every
replica and vllm-router in front of them and stops them all when it ends. Each file opens with
the choice's header: what was chosen, on which evidence. ``python -m tunebook.serve <folder>
--check`` runs them as written.

Both scripts find the model as a kept run folder needs (``model_block``): ``$MODEL``, else the
folder measured, looked for from the script's folder upwards. start.sh sheds an overload instead
of turning it into an outage (``overload_settings``, docs/reliability.md "Overload: shed, then
recover"): each replica admits a bounded number of requests where the installed vLLM can bound
them, and vllm-router neither opens circuit breakers nor retries under load.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from tunebook.core.model import REPO_ROOT
from tunebook.core.results import _jsonable, write_files
from tunebook.engine import adapter
from tunebook.engine.flags import (
    replica_engine_kwargs,
    serve_argv,
    serve_command,
    shell_join,
    split_env,
    yaml_config,
)


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


# --------------------------------------------------------------------------- the model folder
def model_candidates(model: str) -> list[str]:
    """The folders a script looks for, in order: the model as measured, and, where that is an
    absolute path inside this checkout, the same folder relative to it (``models/<name>``), which
    a kept run folder, or a checkout moved elsewhere, finds from its own folder upwards."""
    out = [model]
    p = Path(model)
    if p.is_absolute():
        try:
            out.append(p.resolve().relative_to(REPO_ROOT.resolve()).as_posix())
        except ValueError:
            pass
    return out


def model_notes(model: str, script: str) -> tuple[str, ...]:
    """The header's lines on how ``script`` finds the model."""
    rel = [c for c in model_candidates(model) if not Path(c).is_absolute()]
    if not rel:
        where = model
    elif rel[0] == model:
        where = f"{model}, looked for from this folder upwards"
    else:
        where = f"{model}, or {rel[0]} looked for from this folder upwards"
    return (
        f"the model: $MODEL if set, else {where} (MODEL=<checkpoint folder> bash {script})",
        "the model is vllm serve's positional argument, which wins over a config file's model:",
    )


def model_block(model: str) -> str:
    """Bash that sets MODEL: ``$MODEL`` if set, else the first of ``model_candidates`` that holds
    a config.json (an absolute one as it is, a relative one looked for in ``$HERE`` and each folder
    above it), else one line on stderr (which folder, from where, and the fix) and exit 2.

    Needs ``HERE``, the script's folder. Written for ``set -euo pipefail``: plain ``if``s, so no
    test that fails ends the script."""
    cands = model_candidates(model)
    looked = " or ".join(
        c if Path(c).is_absolute() else f"{c} (in $HERE or a folder above it)" for c in cands
    )
    words = " ".join(shlex.quote(c) for c in cands)
    return (
        "# The model: $MODEL if set, else the folder measured; a relative one is looked for in this\n"
        "# script's folder and each folder above it (a run folder kept inside a checkout finds its models/).\n"
        'if [ -z "${MODEL:-}" ]; then\n'
        f"  for want in {words}; do\n"
        '    case "$want" in\n'
        '      /*) if [ -f "$want/config.json" ]; then MODEL=$want; fi ;;\n'
        "      *) d=$HERE\n"
        '         while [ -z "${MODEL:-}" ]; do\n'
        '           if [ -f "$d/$want/config.json" ]; then MODEL=$d/$want; fi\n'
        '           if [ "$d" = / ]; then break; fi\n'
        '           d=$(dirname "$d")\n'
        "         done ;;\n"
        "    esac\n"
        '    if [ -n "${MODEL:-}" ]; then break; fi\n'
        "  done\n"
        "fi\n"
        'if [ -z "${MODEL:-}" ]; then\n'
        f'  echo "$(basename "$0"): no model folder {looked} holds a config.json;'
        ' set MODEL=<checkpoint folder>" >&2\n'
        "  exit 2\n"
        "fi\n"
    )


def render_files(
    choice: dict, kwargs: dict, env: dict | None = None, served_model_name: str | None = None
) -> dict[str, str]:
    """The text of serve.sh, serve.yaml, llm_kwargs.py and choice.json.

    serve.sh and serve.yaml carry the deployment's environment only; the measurement-only part of
    ``env`` (``MEASUREMENT_ENV``) is recorded in choice.json with the reason it was set.
    """
    import yaml

    deploy, measurement = split_env(env)
    model = str(kwargs["model"])
    # Arguments after serve.sh go to vllm serve, where a later flag wins over the written one.
    # The model is resolved first (model_block); the last line names the model as measured,
    # which is what tunebook's checks read (flags.serve_sh_args), and runs when that is the one.
    argv = serve_argv(kwargs, served_model_name)
    resolved = shell_join(["vllm", "serve", "MODEL_RESOLVED", *argv[3:]], multiline=False)
    resolved = resolved.replace("MODEL_RESOLVED", '"$MODEL"', 1)
    sh = shell_script(
        choice,
        env,
        'HERE=$(cd "$(dirname "$0")" && pwd)  # the folder of this script\n'
        + model_block(model)
        + f'[ "$MODEL" = {shlex.quote(model)} ] || exec {resolved} "$@"\n'
        + "exec "
        + serve_command(kwargs, served_model_name)
        + ' "$@"',
        notes=(
            "flags given to this script are added: bash serve.sh --port 8001",
            *model_notes(model, "serve.sh"),
        ),
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


# --------------------------------------------------------------------------- overload
# Open files a deployment needs beyond its requests' sockets: listening sockets, logs, health
# checks, the router's pool of idle upstream connections.
OPEN_FILES_BESIDE = 1024
# Where nothing bounds the requests in flight, no limit is enough; vLLM raises its own soft limit
# to this (vllm.utils.system_utils.set_ulimit), and start.sh asks for as much.
OPEN_FILES_UNBOUNDED = 65535

# vllm-router's options against an overload, each with why (vllm-router 0.1.17; measured on CPU
# in docs/reliability.md "Overload: shed, then recover").
ROUTER_OVERLOAD = (
    (
        "--disable-circuit-breaker",
        "10 failures in a row (a replica's 503, a dropped connection) open a replica's breaker"
        " for 60 s: every request then gets 503 though the replica serves",
    ),
    (
        "--disable-retries",
        "5 attempts by default: each refused request sent up to 4 more times, after 0.4 s of"
        " backoff, adding load to an overload",
    ),
    (
        "--health-check-interval-secs 10",
        "with no breaker, a replica that died leaves the rotation after 3 failed checks,"
        " 30 s (60 s apart by default)",
    ),
)
# With a bound on each replica: the router's token bucket (its only admission control).
ROUTER_BOUNDED = (
    (
        "--max-concurrent-requests $((REPLICAS * MAX_QUEUED))",
        "no more requests waiting for a replica's first answer than the replicas admit in all;"
        " beyond, 429 with Retry-After at once (a stream gives its token back at its headers,"
        " so this caps the not-yet-answered, not the streams)",
    ),
    (
        "--queue-size 0",
        "refuse at once: the default queue holds a request up to 60 s, then answers 408",
    ),
)


def written_for() -> dict:
    """The installed vLLM and vllm-router the files are written for, and whether this vLLM can
    bound a replica's queue (``--max-num-queued-reqs``: vLLM 0.32 has it, 0.26 has not)."""
    import importlib.metadata as md

    try:
        router = md.version("vllm-router")
    except md.PackageNotFoundError:
        router = None
    return {
        "vllm": adapter.vllm_version(),
        "vllm_router": router,
        "max_num_queued_reqs": "max_num_queued_reqs" in adapter.engine_fields(),
    }


def admission_bound(kwargs: dict) -> tuple[int | None, str]:
    """(requests one replica admits, where the number comes from): its ``max_num_seqs``, the
    batch it runs at once. A request beyond it would only wait in the replica's queue, its TTFT
    growing with the queue and its two sockets held in the router; refused, it can go elsewhere
    at once. None where max_num_seqs is vLLM's default and the installed tunebook cannot read
    that default (it depends on the serving machine's memory)."""
    n = kwargs.get("max_num_seqs")
    if n:
        return int(n), "max_num_seqs"
    # vLLM's serve default for this machine, where the adapter reads it (EngineArgs.get_batch_defaults).
    n = adapter.serve_default_max_num_seqs()
    if n:
        return int(n), "max_num_seqs (vLLM's serve default on this machine)"
    return None, "max_num_seqs is vLLM's default on the serving machine, not read here"


def overload_settings(kwargs: dict, replicas: int, versions: dict | None = None) -> dict:
    """What start.sh writes against an overload, with why (deployment.json keeps it)."""
    versions = versions if versions is not None else written_for()
    if versions.get("max_num_queued_reqs"):
        bound, source = admission_bound(kwargs)
    else:
        bound, source = None, f"vLLM {versions.get('vllm')} has no --max-num-queued-reqs (0.32 has)"
    router = [{"flag": f, "why": w} for f, w in ROUTER_OVERLOAD]
    if bound:
        router += [
            {"flag": f.replace("$((REPLICAS * MAX_QUEUED))", str(replicas * bound)), "why": w}
            for f, w in ROUTER_BOUNDED
        ]
    return {
        "written_for": versions,
        "max_num_queued_reqs": bound,
        "bound_from": source,
        "router": router,
        "open_files_needed": (
            4 * replicas * bound + OPEN_FILES_BESIDE if bound else OPEN_FILES_UNBOUNDED
        ),
    }


def _overload_block(replicas: int, overload: dict) -> tuple[str, str, str]:
    """start.sh's lines against an overload: (before the replicas start, each replica's extra
    flag, the router's flags)."""
    can_bound = overload["written_for"].get("max_num_queued_reqs")
    bound = overload.get("max_num_queued_reqs")
    pre = (
        '# Overload: refuse the excess at once, then serve as before (docs/reliability.md, "Overload:\n'
        '# shed, then recover"). Each line says why.\n'
        f"REPLICAS={replicas}\n"
    )
    replica_flag = ""
    if can_bound:
        pre += f"MAX_QUEUED=${{MAX_QUEUED:-{bound or ''}}}" + (
            f"  # requests a replica admits (waiting + running); beyond, vLLM answers 503 at once."
            f" {bound} = {overload['bound_from']}: the batch it runs at once; a request beyond it"
            " would only wait in the queue, its TTFT growing, its sockets held in the router;"
            " lower it where --check --overload still refuses after the burst\n"
            if bound
            else f"  # unset: no bound ({overload['bound_from']}): set it to the replicas'"
            " max_num_seqs (vllm serve --help=max-num-seqs) to refuse the excess with 503\n"
        )
        replica_flag = ' ${MAX_QUEUED:+--max-num-queued-reqs "$MAX_QUEUED"}'
        pre += (
            "# Every streamed request holds a client socket and a replica socket in the router: up to\n"
            "# REPLICAS x MAX_QUEUED admitted and as many waiting for an answer, 2 sockets each, and\n"
            f"# {OPEN_FILES_BESIDE} beside (listening sockets, logs, idle connections).\n"
            'if [ -n "${MAX_QUEUED:-}" ]; then\n'
            f"  NEED_FILES=$((4 * REPLICAS * MAX_QUEUED + {OPEN_FILES_BESIDE}))\n"
            "else\n"
            f"  NEED_FILES={OPEN_FILES_UNBOUNDED}  # nothing bounds the requests in flight: as much as vLLM asks for itself\n"
            "fi\n"
        )
    else:
        pre += (
            f"# no bound on the requests a replica admits: {overload['bound_from']}; the excess\n"
            "# waits in each replica's queue, and nothing bounds the requests in flight.\n"
            f"NEED_FILES={OPEN_FILES_UNBOUNDED}  # as much as vLLM asks for itself\n"
        )
    pre += (
        "# The soft open-file limit up to the hard one: vLLM raises its own, the router never does.\n"
        "hard=$(ulimit -Hn)\n"
        'if [ "$hard" != unlimited ] && [ "$hard" -lt "$NEED_FILES" ]; then\n'
        '  echo "start.sh: open-file hard limit $hard is below the $NEED_FILES this deployment may'
        " need: every streamed request holds a client socket and a replica socket in the router;"
        " raise it (ulimit -Hn, systemd LimitNOFILE=, docker --ulimit nofile=) or a burst fails with"
        " 'error sending request'\" >&2\n"
        "fi\n"
        'ulimit -n "$hard" 2>/dev/null || true\n'
    )
    width = max(len(f) for f, _ in ROUTER_OVERLOAD + ROUTER_BOUNDED)
    router = (
        "router_flags=(\n"
        + "".join(f"  {f.ljust(width)}  # {w}\n" for f, w in ROUTER_OVERLOAD)
        + ")\n"
    )
    if can_bound:
        router += (
            'if [ -n "${MAX_QUEUED:-}" ]; then\n  router_flags+=(\n'
            + "".join(f"    {f.ljust(width)}  # {w}\n" for f, w in ROUTER_BOUNDED)
            + "  )\nfi\n"
        )
    return pre, replica_flag, router


def start_script(
    choice: dict,
    replicas: int,
    router_policy: str,
    env: dict | None,
    base_port: int = 8001,
    port: int = 8000,
    *,
    model: str,
    overload: dict,
) -> str:
    """start.sh: every replica in the background, vllm-router in front; all stop together.

    ``model``: the model as measured (``model_block`` resolves it); ``overload``:
    ``overload_settings``, what the script writes against an overload."""
    workers = " ".join(f"http://127.0.0.1:$((BASE_PORT + {i}))" for i in range(replicas))
    pre, replica_flag, router = _overload_block(replicas, overload)
    launch = (
        'cd "$(dirname "$0")"\n'
        "HERE=$(pwd)\n"
        + model_block(model)
        + f"PORT=${{PORT:-{port}}}              # the router: clients use http://<host>:$PORT/v1\n"
        f"BASE_PORT=${{BASE_PORT:-{base_port}}}    # replica i listens on 127.0.0.1:$((BASE_PORT + i))\n"
        + pre
        + "pids=()\n"
        "# Stop every replica when the router ends (Ctrl-C, kill, or a failure).\n"
        "trap 'kill \"${pids[@]}\" 2>/dev/null || true; wait' EXIT\n"
        + "".join(
            f'vllm serve "$MODEL" --config replica{i}.yaml --host 127.0.0.1 --port $((BASE_PORT + {i}))'
            f"{replica_flag} &\n"
            "pids+=($!)\n"
            for i in range(replicas)
        )
        + router
        + "# The router waits for the replicas' /health before it serves (--worker-startup-timeout-secs).\n"
        + 'vllm-router --host ${HOST:-127.0.0.1} --port "$PORT"'
        + f" --policy {shlex.quote(router_policy)}"
        + " --prometheus-port $((PORT + 1000)) --worker-startup-timeout-secs 1800"
        + f' --worker-urls {workers} "${{router_flags[@]}}"\n'
    )
    versions = overload["written_for"]
    return shell_script(
        choice,
        env,
        launch,
        notes=(
            f"{replicas} vllm serve replicas on this machine behind vllm-router ({router_policy});"
            " each replica's file holds its KV share",
            "ports: PORT=8000 BASE_PORT=8001 bash start.sh (replicas bind 127.0.0.1 only; HOST sets the router's)",
            *model_notes(model, "start.sh"),
            f"written for vLLM {versions.get('vllm')} and vllm-router {versions.get('vllm_router')}:"
            + (
                " --max-num-queued-reqs bounds each replica (MAX_QUEUED=<n> bash start.sh)"
                if versions.get("max_num_queued_reqs")
                else " this vLLM cannot bound a replica's queue (0.32's --max-num-queued-reqs)"
            ),
        ),
    )


def deployment_files(
    choice: dict,
    kwargs: dict,
    replicas: int,
    router_policy: str = "round_robin",
    env: dict | None = None,
    served_model_name: str | None = None,
    overload: dict | None = None,
) -> dict[str, str]:
    """The text of replica<i>.yaml (one per replica), start.sh and deployment.json.

    deployment.json keeps what ``python -m tunebook.serve <folder> --check --overload`` needs:
    the sustained capacity and the SLO the choice was made with (``choice["served_choice"]``'s
    ``capacity_rps``, ``choice["slo"]``), and ``overload`` (``overload_settings``, read from the
    installed vLLM unless given)."""
    import yaml

    rkw = replica_engine_kwargs(kwargs, replicas)
    model = str(kwargs["model"])
    overload = overload_settings(kwargs, replicas) if overload is None else overload
    files = {}
    for i in range(replicas):
        y = (
            _header(choice)
            + f"# replica {i} of {replicas}: started by start.sh (vllm serve <model> --config replica{i}.yaml --port ...)\n"
            + "# model: start.sh passes the folder it finds ($MODEL, else this one looked for from its\n"
            + "# folder upwards) as vllm serve's positional argument, which wins over the key below\n"
            + f"# {BIND_NOTE['yaml']}\n"
            + yaml.safe_dump(yaml_config(rkw, served_model_name), sort_keys=False)
        )
        files[f"replica{i}.yaml"] = y
    files["start.sh"] = start_script(
        choice, replicas, router_policy, env, model=model, overload=overload
    )
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
                "model": model,
                "files": sorted(files),
                "start": "bash start.sh   (or: python -m tunebook.serve <this folder> --check)",
                # --check --overload: a burst at several times this, then this rate
                "capacity_rps": served.get("capacity_rps"),
                "slo": choice.get("slo") or None,
                "slo_text": served.get("slo") if isinstance(served.get("slo"), str) else None,
                "workload": served.get("workload_spec") or served.get("workload"),
                "overload": overload,
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
