"""The one module that imports vllm (``tunebook.deploy.serve`` is the other, declared boundary: it runs
vLLM's own CLI). Everything vLLM-specific lives here:

- introspection of the installed vLLM (version, platform, EngineArgs fields, server defaults);
- ``Engine``: an in-process engine for one configuration (offline ``LLM`` or online ``AsyncLLM``):
  start, warm up, run a workload, collect per-request timings and metrics, shut down;
- facts only vLLM's log states (attention backend, KV tokens) and the root cause of a failure.

Other modules stay pure Python so that they can be imported and tested without an engine.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import re
import time

from tunebook.core.errors import ConfigError
from tunebook.core.metrics import GaugeSampler, summarize
from tunebook.core.model import load_shape, resolve_model_dir
from tunebook.core.points import Point
from tunebook.core.workloads import Workload, make_workload
from tunebook.engine.vllm_http import COUNTERS, GAUGES


# --------------------------------------------------------------------------- introspection
def vllm_version() -> str:
    import vllm

    return vllm.__version__


def platform_name() -> str:
    """'cuda', 'cpu', 'rocm', ... as vLLM's current platform reports it."""
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def engine_fields() -> dict[str, object]:
    """EngineArgs field name -> type annotation, read from the installed vLLM (never hard-coded)."""
    import dataclasses
    import typing

    from vllm.engine.arg_utils import EngineArgs

    try:
        hints = typing.get_type_hints(EngineArgs)
    except Exception:  # forward references that do not resolve: fall back to raw annotations
        hints = {}
    return {f.name: hints.get(f.name, f.type) for f in dataclasses.fields(EngineArgs)}


def engine_default(name: str):
    """The default of one EngineArgs field in the installed vLLM (None when it has none)."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    for f in dataclasses.fields(EngineArgs):
        if f.name == name:
            return None if f.default is dataclasses.MISSING else f.default
    return None


def vllm_reaction(name: str, value) -> str:
    """What vLLM's own EngineArgs says to one setting alone (bypassing tunebook's checks)."""
    from vllm.engine.arg_utils import EngineArgs

    try:
        EngineArgs(model="unused", **{name: value})
    except TypeError as e:
        return f"TypeError: {e}".replace("EngineArgs.__init__() ", "")
    except Exception as e:  # noqa: BLE001 - any rejection is the answer
        return f"{type(e).__name__}: {e}"[:300]
    return "accepted by EngineArgs (checked later, at engine start)"


def serve_default_batched_tokens() -> int | None:
    """max_num_batched_tokens that `vllm serve` picks on this machine, from the installed vLLM.

    In-process engines made with AsyncLLM.from_engine_args use the ENGINE_CONTEXT and get 2048
    whatever the card, and LLM(...) gets the offline default: a sweep must set the value
    explicitly to speak for a server. None if the installed vLLM does not say.
    """
    try:
        from vllm.engine.arg_utils import EngineArgs
        from vllm.usage.usage_lib import UsageContext

        mnbt, _ = EngineArgs.get_batch_defaults(world_size=1)
        return int(mnbt[UsageContext.OPENAI_API_SERVER])
    except Exception:
        return None


def serve_default_max_num_seqs() -> int | None:
    """max_num_seqs that `vllm serve` picks on this machine (it depends on the device's memory),
    from the installed vLLM; None if it does not say."""
    try:
        from vllm.engine.arg_utils import EngineArgs
        from vllm.usage.usage_lib import UsageContext

        _, seqs = EngineArgs.get_batch_defaults(world_size=1)
        return int(seqs[UsageContext.OPENAI_API_SERVER])
    except Exception:
        return None


def sampler_name(sampling: dict) -> str:
    greedy = not sampling.get("temperature")
    topx = sampling.get("top_p", 1.0) < 1.0 or sampling.get("top_k", 0) > 0
    if greedy:
        impl = "greedy"
    elif topx:
        impl = (
            "flashinfer"
            if os.environ.get("VLLM_USE_FLASHINFER_SAMPLER", "1") != "0"
            and platform_name() == "cuda"
            else "pytorch"
        )
        impl = f"top-p/top-k ({impl})"
    else:
        impl = "random"
    return impl


# --------------------------------------------------------------------------- metrics sampling
# The sample names the snapshot reads: Prometheus exposes a counter as ``<name>_total``.
_SAMPLES = {**{f"{k}_total": k for k in COUNTERS}, **{g: g for g in GAUGES}}


def cpu_model() -> str | None:
    """The host processor's model name: a small model is host-bound, and two nodes with the same
    GPU measured 2x apart on host-bound workloads (runs/h100-20261206b and -c)."""
    import platform as pyplatform

    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return pyplatform.processor() or None


def resolve_architecture(model: str) -> list[str]:
    """The model's architectures, resolved as an engine start resolves them.

    The first time on a node (per ``VLLM_CACHE_ROOT``) vLLM inspects the model class in a fresh
    Python process and caches the answer under ``modelinfos/``: 9 s on two CPU cores, and the
    20 s between the first server's first log line and "Resolved architecture" on a fresh H100
    (runs/h100-20261206c). Done once beforehand, every engine start finds it cached.
    """
    from vllm.engine.arg_utils import EngineArgs

    cfg = EngineArgs(model=str(resolve_model_dir(model)), load_format="dummy").create_model_config()
    return list(cfg.architectures or [])


def metrics_snapshot() -> dict[str, float]:
    """Counters and gauges of the in-process engine, summed over label sets.

    Collects only the series tunebook reads (a restricted view of the registry): vLLM's
    ``get_metrics_snapshot`` digests every histogram too, milliseconds per call that the
    gauge sampler would take from the engine's own loop on a small host.
    """
    from prometheus_client import REGISTRY

    out: dict[str, float] = {}
    for family in REGISTRY.restricted_registry(_SAMPLES).collect():
        for s in family.samples:
            if s.name in _SAMPLES:
                name = _SAMPLES[s.name]
                out[name] = out.get(name, 0.0) + float(s.value)
    return out


def counter_delta(before: dict, after: dict) -> dict:
    return {ours: after.get(k, 0.0) - before.get(k, 0.0) for k, ours in COUNTERS.items()}


# --------------------------------------------------------------------------- per-request timings
def chosen_logprobs(token_ids, logprobs) -> list[float | None] | None:
    """The logprob of each generated token (sampling ``logprobs >= 0``), else None."""
    if not logprobs:
        return None
    out = []
    for t, d in zip(token_ids, logprobs, strict=False):
        lp = d.get(t) if d else None
        out.append(float(lp.logprob) if lp is not None else None)
    return out


def request_record(out, tag: str = "", collect: bool = False) -> dict:
    """Timings of one finished request from its RequestOutput.metrics.

    ``first_token_latency`` is measured by the frontend from the wall-clock arrival; the *_ts
    fields are engine-monotonic. Differences are taken only within one clock. ``collect`` (the
    point's ``collect_outputs``) adds the generated token ids and their logprobs (output drift).
    """
    m = out.metrics
    n_out = len(out.outputs[0].token_ids)
    rec = {
        "request_id": out.request_id,
        "tag": tag,
        "prompt_tokens": len(out.prompt_token_ids or []),
        "output_tokens": n_out,
        "cached_tokens": out.num_cached_tokens or 0,
    }
    if collect:
        o = out.outputs[0]
        rec["token_ids"] = list(o.token_ids)
        rec["logprobs"] = chosen_logprobs(o.token_ids, o.logprobs)
        rec["cumulative_logprob"] = o.cumulative_logprob
    if m is None:
        return rec
    decode_s = max(m.last_token_ts - m.first_token_ts, 0.0)
    rec.update(
        ttft_ms=1e3 * m.first_token_latency,
        queue_ms=1e3 * max(m.scheduled_ts - m.queued_ts, 0.0),
        prefill_ms=1e3 * max(m.first_token_ts - m.scheduled_ts, 0.0),
        decode_ms=1e3 * decode_s,
        e2e_ms=1e3 * (m.first_token_latency + decode_s),
        tpot_ms=1e3 * decode_s / (n_out - 1) if n_out > 1 else None,
        num_preemptions=getattr(m, "num_preemptions", None),  # absent in vLLM 0.26
    )
    return rec


# --------------------------------------------------------------------------- the engine
class Engine:
    """An in-process vLLM engine for one configuration (use ``run_point`` for isolation).

    >>> with Engine(point) as eng:          # doctest: +SKIP
    ...     result = eng.run(workload)
    """

    def __init__(self, point: Point, on_sample=None):
        self.point = point = Point.from_dict(point)
        self.kwargs = point.engine_kwargs()
        self.mode = point.mode
        if self.mode not in ("offline", "online"):
            raise ConfigError(f"mode must be 'offline' or 'online', got {self.mode!r}", key="mode")
        self.on_sample = on_sample
        self.llm = None
        self.async_llm = None
        self._loop = None
        self._driver = None  # a worker thread that drives _loop when this thread runs one (Jupyter)
        self.start_s = None

    # -- lifecycle
    def start(self) -> Engine:
        t0 = time.perf_counter()
        if self.mode == "offline":
            from vllm import LLM

            self.llm = LLM(**self.kwargs)
            self.vllm_config = self.llm.llm_engine.vllm_config
        else:
            import asyncio

            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM

            # The engine's output handler lives on the loop it was created in: create and use
            # the AsyncLLM on one private loop for its whole life.
            self._loop = asyncio.new_event_loop()

            from vllm.usage.usage_lib import UsageContext

            async def make():
                # Online mode stands for `vllm serve`: take the server's defaults (on a large GPU
                # max_num_batched_tokens 8192 and max_num_seqs 1024), not the bare engine's 2048/128.
                return AsyncLLM.from_engine_args(
                    AsyncEngineArgs(**self.kwargs), usage_context=UsageContext.OPENAI_API_SERVER
                )

            self.async_llm = self._drive(make())
            self.vllm_config = self.async_llm.vllm_config
        self.start_s = time.perf_counter() - t0
        return self

    def _drive(self, coro):
        """Run ``coro`` on the engine's private loop until done.

        Where this thread already runs an event loop (a Jupyter kernel), a loop cannot be run
        from it: the private loop is then driven from one worker thread, the same for the
        engine's whole life.
        """
        import asyncio

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._loop.run_until_complete(coro)
        if self._driver is None:
            from concurrent.futures import ThreadPoolExecutor

            self._driver = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tunebook-loop")
        return self._driver.submit(self._loop.run_until_complete, coro).result()

    def shutdown(self) -> None:
        import gc

        if self.async_llm is not None:
            self.async_llm.shutdown()
            self.async_llm = None
        if self.llm is not None:
            eng = getattr(self.llm, "llm_engine", None)
            shut = getattr(getattr(eng, "engine_core", None), "shutdown", None)
            if shut:
                shut()
            self.llm = None
        if self._loop is not None:
            import asyncio

            pending = [t for t in asyncio.all_tasks(self._loop) if not t.done()]
            for t in pending:
                t.cancel()
            if pending:
                self._drive(asyncio.gather(*pending, return_exceptions=True))
            self._loop.close()
            self._loop = None
        if self._driver is not None:
            self._driver.shutdown(wait=True)
            self._driver = None
        try:
            import torch

            on_device = torch.cuda.is_available()
        except Exception:
            on_device = False
        # Free an in-process engine's device memory now, before the next start measures what is
        # free. On the CPU it is host memory, and the next start's own full collection (vLLM's
        # before it freezes its heap) frees it soon enough: a collection here costs ~0.45 s
        # per point, vLLM having unfrozen its ~800,000 objects and collected twice already.
        if on_device:
            gc.collect()
            torch.cuda.empty_cache()

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # -- facts about the running engine
    def capacity(self) -> dict:
        cc = self.vllm_config.cache_config
        blocks = int(cc.num_gpu_blocks or 0)
        return {
            "num_gpu_blocks": blocks,
            "block_size": int(cc.block_size),
            "kv_capacity_tokens": blocks * int(cc.block_size),
            "kv_cache_dtype": str(cc.cache_dtype),
            "max_model_len": int(self.vllm_config.model_config.max_model_len),
            # What the engine resolved its defaults to (None in the settings means "vLLM chose").
            "max_num_seqs": getattr(self.vllm_config.scheduler_config, "max_num_seqs", None),
            "max_num_batched_tokens": getattr(
                self.vllm_config.scheduler_config, "max_num_batched_tokens", None
            ),
            "enable_prefix_caching": getattr(cc, "enable_prefix_caching", None),
            "gpu_memory_utilization": getattr(cc, "gpu_memory_utilization", None),
        }

    def fingerprint(self) -> dict:
        import platform as pyplatform

        import torch

        dev = platform_name()
        fp = {
            "vllm_version": vllm_version(),
            "torch_version": torch.__version__,
            "python": pyplatform.python_version(),
            "platform": dev,
            "host": pyplatform.node(),
            "cpu_count": os.cpu_count(),
            "cpu_model": cpu_model(),
            "seed": self.kwargs.get("seed"),
            "sampler": sampler_name(self.point.sampling_kwargs()),
            "load_format": self.kwargs.get("load_format", "auto"),
            "trust_remote_code": bool(self.vllm_config.model_config.trust_remote_code),
            "engine_multiprocessing": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0",
            "settings": self.point.settings,
            "vllm_env": self._vllm_env(),
        }
        comp = self.vllm_config.compilation_config
        fp["cudagraph_capture_sizes"] = list(getattr(comp, "cudagraph_capture_sizes", []) or [])
        fp["enforce_eager"] = bool(self.vllm_config.model_config.enforce_eager)
        if dev == "cuda":
            fp["device"] = torch.cuda.get_device_name(0)
            fp["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
            fp["attention_backend"] = None  # filled from the engine log by run_point
        else:
            fp["device"] = pyplatform.processor() or pyplatform.machine()
            fp["attention_backend"] = "CPU_ATTN"
        return fp

    def _vllm_env(self) -> dict:
        """The point's vLLM variables as vLLM itself reads them now (after any env cache)."""
        import vllm.envs as venvs

        known = getattr(venvs, "environment_variables", {})
        return {k: getattr(venvs, k) for k in self.point.env if k in known}

    def device_memory(self) -> dict:
        try:
            import torch

            if torch.cuda.is_available():
                free, total = torch.cuda.mem_get_info()
                return {
                    "device_memory_used_gib": (total - free) / 2**30,
                    "device_memory_total_gib": total / 2**30,
                }
        except Exception:
            pass
        return {}

    # -- running work
    def _prompts(self, workload: Workload):
        from vllm.inputs import TokensPrompt

        return [
            TokensPrompt(prompt_token_ids=r.prompt_token_ids)
            if r.prompt_token_ids is not None
            else r.prompt
            for r in workload.requests
        ]

    def _params(self, workload: Workload, **extra):
        from vllm import SamplingParams

        base = self.point.sampling_kwargs()
        return [
            SamplingParams(**{**base, "max_tokens": r.max_tokens, **extra})
            for r in workload.requests
        ]

    def warmup(self, n: int = 4) -> None:
        """A few short requests so that compilation, graph capture and allocators are off the clock."""
        if n <= 0:
            return
        vocab = load_shape(self.kwargs["model"]).vocab_size
        wl = make_workload(
            {"kind": "fixed", "num_requests": n, "prompt_len": 16, "output_len": 4, "seed": 999},
            vocab_size=vocab,
        )
        self.run(wl, record=False)

    def run(self, workload: Workload, record: bool = True) -> dict:
        """Run a workload once; return per-request records, summary metrics and counter deltas."""
        before = metrics_snapshot()
        sampler = GaugeSampler(metrics_snapshot, on_sample=self.on_sample)
        sampler.start()
        t0 = time.perf_counter()
        try:
            if self.mode == "offline":
                outs = self.llm.generate(
                    self._prompts(workload), self._params(workload), use_tqdm=False
                )
                collect = self.point.collect_outputs
                recs = [
                    request_record(o, r.tag, collect)
                    for o, r in zip(outs, workload.requests, strict=True)
                ]
            else:
                recs = self._drive(self._run_online(workload))
        finally:
            dur = time.perf_counter() - t0
            peaks = sampler.stop()
        if not record:
            return {}
        after = sampler.final or metrics_snapshot()
        metrics = summarize(recs, dur, self.point.slo)
        metrics.update(peaks)
        metrics.update(counter_delta(before, after))
        q = metrics.get("prefix_cache_queries") or 0
        metrics["prefix_cache_hit_rate_pct"] = (
            100.0 * metrics["prefix_cache_hits"] / q if q else 0.0
        )
        return {"metrics": metrics, "requests": recs, "timeline": sampler.samples}

    async def _run_online(self, workload: Workload) -> list[dict]:
        """Requests arrive at their offsets (Poisson) and/or under a concurrency cap; stream deltas."""
        import asyncio

        from vllm.sampling_params import RequestOutputKind

        prompts = self._prompts(workload)
        params = self._params(workload, output_kind=RequestOutputKind.DELTA)
        cap = self.point.max_concurrency
        sem = asyncio.Semaphore(cap) if cap else None
        t_start = time.perf_counter()
        tag = f"{os.getpid()}-{time.monotonic_ns()}"

        async def one(i: int) -> dict:
            r = workload.requests[i]
            await asyncio.sleep(max(0.0, t_start + r.arrival_s - time.perf_counter()))
            if sem:
                await sem.acquire()
            try:
                sent = time.perf_counter()
                stamps, final, n_tok, ids, lps = [], None, 0, [], []
                async for out in self.async_llm.generate(prompts[i], params[i], f"{tag}-{i}"):
                    now = time.perf_counter()
                    k = len(out.outputs[0].token_ids)
                    if k:
                        stamps.append(now)
                        n_tok += k
                        ids += out.outputs[0].token_ids
                        lps += (
                            chosen_logprobs(out.outputs[0].token_ids, out.outputs[0].logprobs) or []
                        )
                    final = out
            finally:
                if sem:
                    sem.release()
            rec = request_record(final, r.tag)
            if self.point.collect_outputs:  # DELTA outputs: the final one holds the last piece only
                rec.update(
                    token_ids=ids,
                    logprobs=lps or None,
                    cumulative_logprob=final.outputs[0].cumulative_logprob,
                )
            # Client-side view, as a user of `vllm serve` sees it (benchmark_serving does the same).
            rec["output_tokens"] = n_tok
            rec["prompt_tokens"] = r.prompt_len if r.prompt_len >= 0 else rec["prompt_tokens"]
            if stamps:
                rec["ttft_ms"] = 1e3 * (stamps[0] - sent)
                rec["e2e_ms"] = 1e3 * (stamps[-1] - sent)
                rec["itl_ms"] = [1e3 * (b - a) for a, b in zip(stamps, stamps[1:], strict=False)]
                rec["tpot_ms"] = 1e3 * (stamps[-1] - stamps[0]) / (n_tok - 1) if n_tok > 1 else None
            return rec

        return list(await asyncio.gather(*(one(i) for i in range(len(prompts)))))


# --------------------------------------------------------------------------- model support
def check_architecture(shape, point: Point) -> None:
    """Raise ConfigError if the installed vLLM cannot run any of the model's architectures.

    Mirrors vLLM's own resolution, conservatively: a native architecture (ModelRegistry), a
    Transformers-backend fallback (the class exists in transformers, or the config maps remote
    code), or an explicit ``model_impl``. Without this, vLLM fails inside the engine with a
    pydantic error that lists ~400 architectures.
    """
    archs = list(shape.architectures)
    settings = point.settings
    if not archs or settings.get("model_impl", "auto") != "auto":
        return
    from vllm.model_executor.models import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    for arch in archs:
        base = arch.split("For")[0]
        if arch in supported or (base and f"{base}ForCausalLM" in supported):
            return
    try:
        import transformers

        if any(getattr(transformers, a, None) is not None for a in archs):
            return
    except Exception:
        pass
    model_dir = resolve_model_dir(point.model)
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        cfg = {}
    if (cfg.get("text_config") or cfg).get("auto_map") or cfg.get("auto_map"):
        return  # remote code: vLLM's Transformers backend may load it (needs trust_remote_code)
    near = difflib.get_close_matches(archs[0], sorted(supported), n=3, cutoff=0.8)
    hint = f"; closest supported: {', '.join(near)}" if near else ""
    raise ConfigError(
        f"model {point.model!r} (model_type {shape.model_type!r}) declares architectures"
        f" {archs}, none of which vLLM {vllm_version()} supports{hint}",
        key="model",
    )


# --------------------------------------------------------------------------- the log and the environment
_LOG_PATTERNS = {
    # 0.32: "Using FLASH_ATTN backend."; 0.26: "Using FLASH_ATTN attention backend out of ..."
    "attention_backend": re.compile(
        r"Using (?:AttentionBackendEnum\.)?([A-Z][A-Z0-9_]+) (?:attention )?backend"
    ),
    "engine_kv_tokens": re.compile(r"KV cache size: ([\d,]+) tokens"),
    "available_kv_gib": re.compile(r"Available KV cache memory: ([\d.]+) GiB"),
    "model_load_gib": re.compile(r"Model loading took ([\d.]+) GiB"),
}
_REASON = re.compile(
    r"(\w*(?:Error|Exception)\b: .+|.*out of memory.*|.*No available memory.*|.*larger than the available KV.*)",
    re.I,
)


def parse_log(text: str) -> dict:
    """Facts vLLM only logs: attention backend, KV tokens, memory figures."""
    found: dict = {}
    for key, pat in _LOG_PATTERNS.items():
        m = pat.search(text)
        if m:
            v = m.group(1).replace(",", "")
            found[key] = v if key == "attention_backend" else float(v)
    if "engine_kv_tokens" in found:
        found["engine_kv_tokens"] = int(found["engine_kv_tokens"])
    return found


# A log record below ERROR: vLLM's ulimit warning, for one, quotes an OSError nobody raised.
_QUIET = re.compile(r"^(\(\S+ pid=\d+\)\s*)?(WARNING|INFO|DEBUG)\b")


# vLLM's re-raises that point back at the root cause instead of naming it.
_WRAPPERS = ("Engine core initialization failed", "See stack trace for root cause")


def failure_reason(log_text: str) -> str | None:
    """The root cause from the engine log (the exception itself often says only 'initialization failed')."""
    lines = log_text.splitlines()
    hits = []
    for i, line in enumerate(lines):
        m = _REASON.search(line)
        if not m or _QUIET.match(line) or any(w in line for w in _WRAPPERS):
            continue
        hit = m.group(1).strip()
        if "validation error" in hit and i + 2 < len(lines):
            # pydantic: the field on the next line, the reason on the one after
            hit += " " + " ".join(x.strip() for x in lines[i + 1 : i + 3])
        hits.append(hit)
    return hits[-1][:2000] if hits else None


@contextlib.contextmanager
def point_env(env: dict | None):
    """A point's environment variables, for the duration of an in-process point only.

    vLLM reads its variables lazily, but its engine core freezes them (``enable_envs_cache``)
    once started: without a reset, every later in-process point would silently run with the
    first point's values. The previous environment is restored afterwards, so one point's
    variables never leak into the next.
    """
    env = {k: str(v) for k, v in (env or {}).items()}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    _reset_vllm_env_cache()
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _reset_vllm_env_cache()


def _reset_vllm_env_cache() -> None:
    try:
        import vllm.envs as venvs
    except ImportError:
        return
    reset = getattr(venvs, "disable_envs_cache", None)
    if reset is not None:
        reset()


def parse_serve_args(argv: list[str]) -> dict:
    """Parse ``vllm serve <argv>`` with the installed vLLM's own parser; return the namespace as a dict.

    Checks that a written serve.sh / serve.yaml means what it says (flag spellings, booleans).
    """
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    sub = parser.add_subparsers(dest="subparser")
    ServeSubcommand().subparser_init(sub)
    ns = vars(parser.parse_args(["serve", *argv]))
    if ns.get("model_tag"):
        ns["model"] = ns["model_tag"]
    return ns


if __name__ == "__main__":
    # ``python -m tunebook.engine.adapter architecture MODEL...``: the runner's background warm-up
    # (tunebook.workbench.runner.start_warm_up); one JSON line per model.
    import sys

    if len(sys.argv) < 3 or sys.argv[1] != "architecture":
        sys.exit("usage: python -m tunebook.engine.adapter architecture MODEL...")
    for name in sys.argv[2:]:
        t0 = time.time()
        archs = resolve_architecture(name)
        t1 = time.time()
        print(json.dumps({"model": name, "architectures": archs, "seconds": t1 - t0, "ended": t1}))
