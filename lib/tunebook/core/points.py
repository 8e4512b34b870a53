"""The unit of work and its record: a ``Point`` goes in, a ``Result`` comes out.

In the manner of vLLM's benchmarks (their config and result dataclasses): one typed record each,
built and checked once at the edge (``Point.from_dict``: unknown keys are refused with the closest
valid name), serialized in one place (``to_dict``). A point carries everything it needs (model,
engine settings, workload, mode ...), so any executor can run it anywhere; a result is written as
``<point_id>.json`` whatever happened, a failure with its error.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from pathlib import Path

from tunebook.core.errors import ConfigError
from tunebook.core.model import resolve_model_dir

MODES = ("offline", "online", "served")
CLIENTS = ("tunebook", "vllm-bench")  # served mode's load generators


@dataclass
class Point:
    """One engine configuration and one workload, measured ``repeats`` times on one engine start.

    ``settings`` are vLLM EngineArgs (vLLM's own names); ``serve`` holds what exists only on the
    server path (``vllm serve`` options such as ``api_server_count``, and ``replicas`` /
    ``router_policy`` for a deployment of several servers behind vllm-router); ``rates`` (served
    mode) makes one engine start serve the workload at each request rate in turn.
    """

    point_id: str
    model: str
    workload: dict
    settings: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)  # environment of the engine process(es)
    mode: str = "offline"  # offline: LLM.generate; online: in-process AsyncLLM; served: vllm serve
    sampling: dict = field(default_factory=dict)  # SamplingParams (greedy unless set)
    repeats: int = 1  # measured runs of the workload on this one engine start
    warmup_requests: int = 4
    max_concurrency: int | None = None  # online/served: requests in flight at most
    slo: dict | None = None  # {"ttft_ms": ..., "tpot_ms": ...}: a request is good within all
    seed: int = 0
    trust_remote_code: bool = False
    collect_outputs: bool = False  # keep generated token ids and logprobs (output drift)
    config: str | None = None  # the configuration's name within its sweep
    repeat: int | None = None  # which engine start of the configuration this is
    serve: dict = field(default_factory=dict)  # served mode: server-only options, replicas, router
    rates: list | None = None  # served mode: request rates (req/s) measured in turn, one start
    search: dict | None = (
        None  # served mode: capacity search under the SLO (served.SEARCH_DEFAULTS)
    )
    # served mode: who sends the requests: "tunebook" (tunebook.measure.loadgen) or "vllm-bench"
    # (vLLM's own `vllm bench serve`, the independent check); a client-side choice, so points
    # with either share a deployment start
    client: str = "tunebook"

    @classmethod
    def from_dict(cls, d: dict | Point, source: str | None = None) -> Point:
        """A Point from a plain dict: unknown keys and wrong shapes are a ConfigError."""
        if isinstance(d, Point):
            return d
        if not isinstance(d, dict):
            raise ConfigError(f"a point must be a mapping, got {type(d).__name__}", source=source)
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = [k for k in d if k not in names]
        if unknown:
            k = unknown[0]
            close = difflib.get_close_matches(k, names, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(names)}"
            raise ConfigError(f"unknown point key {k!r}{hint}", key=k, source=source)
        for k in ("point_id", "model", "workload"):
            if d.get(k) in (None, ""):
                raise ConfigError(f"a point needs {k!r}", key=k, source=source)
        p = cls(**{k: v for k, v in d.items() if v is not None or k in ("slo", "rates", "search")})
        p._check(source)
        return p

    def _check(self, source: str | None) -> None:
        def bad(key: str, why: str):
            raise ConfigError(f"{key}={getattr(self, key)!r} {why}", key=key, source=source)

        for key in ("settings", "env", "sampling", "workload", "serve"):
            if not isinstance(getattr(self, key), dict):
                bad(key, "must be a mapping")
        if self.mode not in MODES:
            bad("mode", f"must be one of {', '.join(MODES)}")
        for key in ("repeats", "warmup_requests"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < (1 if key == "repeats" else 0):
                bad(key, "must be a whole number" + (" >= 1" if key == "repeats" else " >= 0"))
        mc = self.max_concurrency
        if mc is not None and (isinstance(mc, bool) or not isinstance(mc, int) or mc < 1):
            bad("max_concurrency", "must be a whole number >= 1 (or None: no cap)")
        if self.slo is not None and not isinstance(self.slo, dict):
            bad("slo", "must be a mapping such as {'ttft_ms': 500, 'tpot_ms': 50}")
        if self.rates is not None:
            if self.mode != "served":
                bad("rates", "needs mode 'served' (a rate search drives a server)")
            if not self.rates or not all(
                isinstance(r, int | float) and not isinstance(r, bool) and r > 0 for r in self.rates
            ):
                bad("rates", "must be a list of positive request rates (req/s)")
        if self.search is not None:
            if self.mode != "served":
                bad("search", "needs mode 'served' (a capacity search drives a server)")
            if not isinstance(self.search, dict):
                bad("search", "must be a mapping (served.SEARCH_DEFAULTS lists its keys)")
            if not self.slo:
                bad("search", "needs an SLO: the capacity is the highest rate at which it holds")
        if self.client not in CLIENTS:
            bad("client", f"must be one of {', '.join(CLIENTS)}")
        if self.client != "tunebook" and self.mode != "served":
            bad("client", "is for mode 'served' (a client of vllm serve)")
        if self.serve and self.mode != "served":
            bad("serve", "is for mode 'served' (options of vllm serve and the router)")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def sampling_kwargs(self) -> dict:
        """SamplingParams for every request: greedy unless set, fixed output lengths."""
        return sampling_kwargs(self.sampling)

    def engine_kwargs(self) -> dict:
        """The exact keyword arguments for ``LLM(...)`` / ``AsyncEngineArgs(...)`` of this point."""
        model_dir = resolve_model_dir(self.model)
        kw: dict = {"model": str(model_dir)}
        if not has_weights(model_dir):
            kw["load_format"] = "dummy"  # config-only folder: random weights of the right shape
        if not has_tokenizer(model_dir):
            kw["skip_tokenizer_init"] = True
        kw["seed"] = self.seed
        kw["trust_remote_code"] = bool(self.trust_remote_code)
        kw.update(self.settings)
        # Per-request timings and get_metrics() need stats on; the harness benchmark turns them off.
        kw.setdefault("disable_log_stats", False)
        return kw


def sampling_kwargs(sampling: dict | None) -> dict:
    s = {"temperature": 0.0, **(sampling or {})}
    s.setdefault("ignore_eos", True)  # fixed output lengths make configurations comparable
    return s


def has_weights(model_dir: Path) -> bool:
    return any(model_dir.glob("*.safetensors")) or any(model_dir.glob("*.bin"))


def has_tokenizer(model_dir: Path) -> bool:
    return (model_dir / "tokenizer.json").is_file() or (model_dir / "tokenizer.model").is_file()


@dataclass
class Result:
    """What a point produced. ``status`` is 'ok' or 'failed' (then ``error`` says why)."""

    point_id: str | None
    config: str | None = None
    repeat: int | None = None
    mode: str = "offline"
    model: str = ""
    settings: dict = field(default_factory=dict)
    sampling: dict = field(default_factory=dict)
    workload: dict = field(default_factory=dict)
    serve: dict | None = None
    search: dict | None = None  # served: the capacity search as run (its start_rps included)
    slo: dict | None = None  # the SLO the point was judged by, as limits ({"ttft_ms": ...})
    status: str = "failed"
    error: str | None = None
    traceback: str | None = None
    engine_start_s: float | None = None
    shared_start: str | None = None  # served: the point whose deployment start this one reused
    seconds: dict | None = (
        None  # where the point's wall time went: start, warmup, measure, teardown
    )
    capacity: dict | None = None
    env: dict | None = None  # the environment fingerprint
    memory: dict | None = None
    metrics: dict | None = None  # the last repeat's headline figures
    repeat_metrics: list | None = None
    per_rate: list | None = None  # served: metrics at each offered rate (rates or capacity search)
    # served: who sent the requests and what it kept (its schedule check; vllm bench serve's
    # own summary and result files)
    client: dict | None = None
    requests: list | None = None
    timeline: list | None = None
    wall_s: float | None = None
    log_file: str | None = None

    @classmethod
    def skeleton(cls, point: Point, workload_summary: dict | None = None) -> Result:
        """A failed result naming the point: filled in as the point runs."""
        return cls(
            point_id=point.point_id,
            config=point.config,
            repeat=point.repeat,
            mode=point.mode,
            model=str(point.model),
            settings=dict(point.settings),
            sampling=sampling_kwargs(point.sampling),
            workload={**point.workload, **(workload_summary or {})},
            serve=dict(point.serve) or None,
            search=dict(point.search) if point.search is not None else None,
            slo=dict(point.slo) if point.slo else None,
        )

    @classmethod
    def in_group(
        cls,
        point: Point,
        workload_summary: dict,
        index: int,
        first_id: str,
        start_seconds: dict[str, float],
    ) -> Result:
        """The skeleton of the ``index``-th point on a shared engine start: the first carries
        the start's seconds, the others name that point in ``shared_start``."""
        result = cls.skeleton(point, workload_summary)
        # Never empty: tunebook.workbench.cost estimates phases only for points without seconds.
        result.seconds = dict(start_seconds) if index == 0 else {"measure": 0.0}
        if index:
            result.shared_start = first_id
        return result

    def to_dict(self) -> dict:
        """The JSON record: unset optional fields are left out; status and error always present."""
        d = dataclasses.asdict(self)
        keep = {"point_id", "config", "repeat", "status", "error"}
        return {k: v for k, v in d.items() if v is not None or k in keep}


def failed_result(point: dict | Point, error: str) -> dict:
    """A failed result for a point that could not even start (as a dict, ready to write)."""
    try:
        p = Point.from_dict(point)
    except ConfigError:
        p = None
    if p is None:
        d = point if isinstance(point, dict) else {}
        return {
            "point_id": d.get("point_id"),
            "config": d.get("config"),
            "repeat": d.get("repeat"),
            "status": "failed",
            "error": error,
        }
    r = Result.skeleton(p)
    r.error = error
    return r.to_dict()
