"""A capacity model: each candidate deployment's sustained capacity, predicted from calibration.

Plain arithmetic on a few measured figures (a ``Calibration``), so that 04 can rank every
candidate (a ``Candidate``: vLLM's own knobs) before any engine starts, and measure only those
that could win. Pure Python, no vLLM.

Notation: a candidate runs R replicas on one GPU behind vllm-router, A API-server processes each,
``stream_interval`` k, ``max_num_seqs`` M and CUDA graphs up to batch G; a request (``Traffic``)
has P prompt and O output tokens; the SLO bounds TTFT, TPOT and, for chat, every chunk gap, for
q = 99% of requests.

**Step time.** One engine's decode step at batch b alone is h(b) (the 1-engine calibration,
linear between measured batches; a step above G runs without a CUDA graph: x ``eager_factor``,
host time). The GPU runs one engine's step at a time, so N engines sharing it step in
s_N(b) >= N g(b), g(b) the GPU's own work per step: g(b) = min over the calibrated N >= 2 of
s_N(b) / N (without that calibration the step's roofline floor, ``gpu_floor_ms``: a lower bound,
so many replicas are predicted optimistically). b / O requests join a step, each with a prefill of p(P) ms alone, p_g(P) of it on
the GPU (``prefill_gpu_ms``; else p(P) g(B) / h(B) at the largest calibrated batch B, the decode
step most like a prefill). With R replicas the host loop or the shared GPU, whichever is slower,
sets the pace:

    TPOT(b) = max(h(b) + b p(P) / O,  R (g(b) + b p_g(P) / O))
    TTFT(b) = a1 + max(h(b), R g(b)) + p(P)     a1: the API server's work on the request and its
                                                first chunk
    gap(b)  = k TPOT(b) + p(P)                  a chunk of k tokens, with one prefill landing in it

**The batch.** The requests in flight at one replica fluctuate like a Poisson count (their
variance is their mean: ``tunebook.core.sustained``), so the q-th percentile request sees
b_q = b + z_q sqrt(b) with a load-blind router (round_robin, random, the prefix-hashing ones) and
b_q = b + z_q sqrt(b / R) with a load-aware one (``LOAD_AWARE``: the aggregate's excess is shared
R ways). A replica runs at most the largest b, b*, with

    b_q <= M,   b_q (P + O/2) <= its KV tokens,   TPOT(b_q) <= tpot,   gap(b_q) <= chunk gap,
    TTFT(b_q) <= ttft

**Ceilings** (req/s). By Little's law a request holds a batch slot for O steps of TPOT:

    engine      R 1000 b* / (O TPOT(b*))   gpu where the GPU's term sets TPOT(b*), else
                                           engine_core_loop; kv where the KV cache set b*
    api_server  R A u 1000 / c             c = api_request_ms + n api_chunk_ms + O api_token_ms,
                                           n = 1 + ceil((O - 1) / k) chunks a request
    host_cores  (cores - other_cores - R) u 1000 / c
                                           each engine-core loop holds a core of its own; the
                                           API servers share the rest

u is the busiest a host process is run (``max_utilization``, 90%), lowered where the API
server's queue wait (M/D/1: rho / (2 (1 - rho)) c) would push TTFT(b*) past its bound. The
capacity is the smallest ceiling, and that resource binds. At the capacity the batch b solves
R 1000 b / (O TPOT(b)) = capacity; the predicted p99 latencies are those at b_q (TTFT plus the
API server's queue wait).

**Fits** (``fits``). Memory: R x (a replica's memory beyond its KV + its KV) within the card, and
each replica's KV holds one ``max_model_len`` sequence (vLLM refuses to start otherwise). Cores:
R engine-core loops + ``other_cores`` leave part of a core for the API servers.

Not modelled: prefix caching, preemption, the first token's prefill slowed by the other replicas,
and the CUDA graphs' own memory.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, fields
from statistics import NormalDist

from tunebook.core.errors import ConfigError

RESOURCES = ("gpu", "engine_core_loop", "api_server", "host_cores", "kv")
# vllm-router policies that send a request by the replicas' load; the others (round_robin,
# random, cache_aware, consistent_hash) are blind to it for requests without a shared prefix.
LOAD_AWARE = ("power_of_two", "kv_aware", "sticky_least_loaded")
# vLLM 0.26 captures CUDA graphs up to min(2 x max_num_seqs, 512, max_num_batched_tokens).
VLLM_CAPTURE_CAP = 512
GIB = 1 << 30


# --------------------------------------------------------------------------- inputs
@dataclass
class Calibration:
    """What 04 measures before the search: the host's and the GPU's figures (times in ms)."""

    step_ms: dict[int, dict[int, float]]  # engines sharing the GPU -> {batch each: decode step ms}
    prefill_ms: dict[int, float]  # prompt tokens -> one prompt's prefill alone, ms
    api_request_ms: float  # one API-server process's host time per request
    api_chunk_ms: float  # ... per streamed chunk
    host_cores: int
    kv_capacity_tokens: (
        int  # one engine's KV cache at gpu_memory_utilization (cap_kv_capacity_tokens)
    )
    kv_bytes_per_token: int
    card_memory_bytes: int
    max_model_len: int
    api_token_ms: float = 0.0  # ... per output token (detokenization); 0 where not told apart
    prefill_gpu_ms: dict[int, float] | None = None  # the GPU's part of prefill_ms; None: estimated
    gpu_memory_utilization: float = 0.9  # the share the one engine of kv_capacity_tokens took
    replica_memory_bytes: int | None = None  # a replica's memory beyond its KV; None: derived
    default_max_num_seqs: int = 256  # what vLLM resolved max_num_seqs to (cap_max_num_seqs)
    capture_size: int = VLLM_CAPTURE_CAP  # the largest CUDA-graph batch when step_ms was measured
    eager_factor: float = 1.0  # a step's host time without a CUDA graph / with one (1: unknown)
    other_cores: float = 0.0  # cores vllm-router and the load generator take while measuring
    max_utilization: float = 0.9  # the busiest a host process is run; the model's one fitted figure
    # KV bytes the replicas of a candidate of more than one share (04's kv_cache_bytes_total, as
    # replica_configs splits it); one replica keeps the engine's own (kv_capacity_tokens)
    kv_bytes_shared: int | None = None
    # batch -> the roofline floor of a decode step (ms): a lower bound on the GPU's own work in a
    # step, used for g(b) where no engines-sharing-the-GPU calibration was made
    gpu_floor_ms: dict[int, float] | None = None

    def __post_init__(self):
        # JSON (a result file) holds the keys as strings
        self.step_ms = {
            int(n): {int(b): float(t) for b, t in pts.items()} for n, pts in self.step_ms.items()
        }
        self.prefill_ms = {int(p): float(t) for p, t in self.prefill_ms.items()}
        if self.prefill_gpu_ms is not None:
            self.prefill_gpu_ms = {int(p): float(t) for p, t in self.prefill_gpu_ms.items()}
        if self.gpu_floor_ms is not None:
            self.gpu_floor_ms = {int(b): float(t) for b, t in self.gpu_floor_ms.items()}
        if not self.step_ms.get(1):
            raise ConfigError(
                "calibration: step_ms needs one engine's steps (key 1)", key="step_ms"
            )
        if not self.prefill_ms:
            raise ConfigError("calibration: prefill_ms is empty", key="prefill_ms")
        times = [t for pts in self.step_ms.values() for t in pts.values()]
        if min(times) <= 0 or min(self.prefill_ms.values()) < 0:
            raise ConfigError("calibration: step and prefill times must be positive", key="step_ms")

    def host_step_ms(self, batch: float, capture: int | None = None) -> float:
        """One engine's decode step alone at ``batch``, with CUDA graphs up to ``capture``
        (None: as calibrated)."""
        # a batch above the calibration's capture size was measured without a graph: what a
        # graph would take, before interpolating (two regimes mixed in one segment would bend it)
        graphed = {
            b: t / self.eager_factor if b > self.capture_size else t
            for b, t in self.step_ms[1].items()
        }
        t = _interp(graphed, batch)
        return t * self.eager_factor if batch > (capture or self.capture_size) else t

    def gpu_step_ms(self, batch: float) -> float:
        """The GPU's own work in one step at ``batch``: from the engines-sharing calibration, else
        the step's roofline floor (``gpu_floor_ms``), else 0 (nothing known)."""
        shared = [_interp(pts, batch) / n for n, pts in self.step_ms.items() if n >= 2]
        if shared:
            return min(shared)
        return _interp(self.gpu_floor_ms, batch) if self.gpu_floor_ms else 0.0

    def prefill(self, prompt_len: float) -> float:
        return _interp(self.prefill_ms, prompt_len)

    def prefill_gpu(self, prompt_len: float) -> float:
        """The GPU's own work in one prefill: measured, or the GPU's share of the largest
        calibrated decode step (many tokens at once, like a prefill)."""
        if self.prefill_gpu_ms:
            return _interp(self.prefill_gpu_ms, prompt_len)
        big = max(self.step_ms[1])
        return self.prefill(prompt_len) * self.gpu_step_ms(big) / self.step_ms[1][big]

    def overhead_bytes(self) -> int:
        """A replica's device memory beyond its KV cache (weights, CUDA context, graphs)."""
        if self.replica_memory_bytes is not None:
            return int(self.replica_memory_bytes)
        budget = self.card_memory_bytes * self.gpu_memory_utilization
        return max(0, int(budget - self.kv_capacity_tokens * self.kv_bytes_per_token))

    def kv_tokens(self, candidate: Candidate) -> int:
        """KV tokens one replica of ``candidate`` holds: its ``kv_cache_memory_bytes``, its share
        of ``kv_bytes_shared``, or its share of gpu_memory_utilization less its own overhead."""
        if candidate.kv_cache_memory_bytes is not None:
            kv_bytes = candidate.kv_cache_memory_bytes
        elif self.kv_bytes_shared and candidate.replicas > 1:
            kv_bytes = self.kv_bytes_shared // candidate.replicas
        else:
            budget = self.card_memory_bytes * self.gpu_memory_utilization
            kv_bytes = budget / candidate.replicas - self.overhead_bytes()
        return max(0, int(kv_bytes // self.kv_bytes_per_token))


@dataclass(frozen=True)
class Candidate:
    """One deployment, by vLLM's own knob names (None: vLLM's default)."""

    replicas: int = 1
    stream_interval: int = 1
    api_server_count: int = 1
    max_num_seqs: int | None = None
    max_cudagraph_capture_size: int | None = None
    router_policy: str = "round_robin"
    kv_cache_memory_bytes: int | None = None  # per replica; None: the replicas split the card

    def __post_init__(self):
        for f in ("replicas", "stream_interval", "api_server_count"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{f}={v!r} must be a whole number >= 1", key=f)
        if self.replicas == 1:  # no router in front of one server: one candidate, not one a policy
            object.__setattr__(self, "router_policy", "round_robin")

    @property
    def name(self) -> str:
        """The configuration's name in 04: "default", or its changed knobs ("replicas=4_stream_interval=16")."""
        base = Candidate()
        parts = [
            f"{f.name}={getattr(self, f.name)}"
            for f in fields(self)
            if getattr(self, f.name) != getattr(base, f.name)
        ]
        return "_".join(parts) or "default"

    def to_config(self) -> dict:
        """As a 04 configuration: ``{"settings": EngineArgs, "serve": server options}``."""
        settings: dict = {}
        serve: dict = {}
        if self.stream_interval != 1:
            settings["stream_interval"] = self.stream_interval
        if self.max_num_seqs is not None:
            settings["max_num_seqs"] = self.max_num_seqs
        if self.max_cudagraph_capture_size is not None:
            settings["compilation_config"] = {
                "max_cudagraph_capture_size": self.max_cudagraph_capture_size
            }
        if self.kv_cache_memory_bytes is not None:
            settings["kv_cache_memory_bytes"] = self.kv_cache_memory_bytes
        if self.replicas > 1:
            serve.update(replicas=self.replicas, router_policy=self.router_policy)
        if self.api_server_count != 1:
            serve["api_server_count"] = self.api_server_count
        return {k: v for k, v in (("settings", settings), ("serve", serve)) if v}

    @classmethod
    def from_config(cls, config: dict) -> Candidate:
        """A 04 configuration (a lever of params' 04 section) as a candidate; a knob the model
        does not model is a ConfigError, so no prediction silently ignores it."""
        settings = dict(config.get("settings") or {})
        serve = dict(config.get("serve") or {})
        comp = dict(settings.pop("compilation_config", None) or {})
        kw = {
            "stream_interval": settings.pop("stream_interval", 1),
            "max_num_seqs": settings.pop("max_num_seqs", None),
            "kv_cache_memory_bytes": settings.pop("kv_cache_memory_bytes", None),
            "max_cudagraph_capture_size": comp.pop("max_cudagraph_capture_size", None),
            "replicas": serve.pop("replicas", 1),
            "api_server_count": serve.pop("api_server_count", 1),
            "router_policy": serve.pop("router_policy", "round_robin"),
        }
        serve.pop("client_workers", None)  # the load generator's, not the deployment's
        left = [*settings, *(f"compilation_config.{k}" for k in comp), *serve]
        if left:
            raise ConfigError(
                f"the capacity model does not model {', '.join(sorted(left))}", key=sorted(left)[0]
            )
        return cls(**kw)


@dataclass(frozen=True)
class Traffic:
    """The requests a deployment is judged on, and the SLO they must meet."""

    prompt_len: int
    output_len: int
    ttft_ms: float
    tpot_ms: float
    chunk_gap_ms: float | None = None  # chat: every gap between streamed chunks
    attainment_pct: float = 99.0

    @classmethod
    def from_params(cls, workload: dict, slo: dict) -> Traffic:
        """From 04's ``workload`` and its SLO (``headroom.served_slo``: ``itl_ms`` is the chunk gap)."""
        return cls(
            prompt_len=int(workload["prompt_len"]),
            output_len=int(workload["output_len"]),
            ttft_ms=float(slo["ttft_ms"]),
            tpot_ms=float(slo["tpot_ms"]),
            chunk_gap_ms=float(slo["itl_ms"]) if slo.get("itl_ms") else None,
            attainment_pct=float(slo.get("attainment_pct", 99.0)),
        )


@dataclass
class Prediction:
    """What the model says of one candidate under one traffic (rates in req/s, times in ms)."""

    config: str
    capacity_rps: float
    binding: str  # one of RESOURCES
    ceilings: dict[str, float]  # resource -> the rate it alone would allow
    batch: float  # requests in flight per replica at the capacity (mean)
    batch_peak: float  # ... at the SLO's percentile (99%: what the p99 request sees)
    batch_limit: (
        str  # what stopped a replica's batch growing: max_num_seqs, kv, tpot, chunk_gap, ttft
    )
    step_ms: float
    ttft_p99_ms: float
    tpot_p99_ms: float
    chunk_gap_p99_ms: float
    kv_tokens_per_replica: int
    why: str = ""
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


# --------------------------------------------------------------------------- the model
def fits(candidate: Candidate, calibration: Calibration) -> str | None:
    """Why ``candidate`` cannot start on this card and host, or None where it fits."""
    cal, c = calibration, candidate
    r = c.replicas
    if c.max_num_seqs is not None and c.max_num_seqs < 1:
        return f"max_num_seqs={c.max_num_seqs} runs no sequence"
    kv_each = c.kv_cache_memory_bytes
    if kv_each is None and cal.kv_bytes_shared and r > 1:
        kv_each = cal.kv_bytes_shared // r
    if kv_each is not None:
        need = r * (cal.overhead_bytes() + kv_each)
        if need > cal.card_memory_bytes:
            return (
                f"{r} replicas x ({cal.overhead_bytes() / GIB:.1f} GiB + "
                f"{kv_each / GIB:.1f} GiB of KV) = {need / GIB:.1f} GiB, more than"
                f" the card's {cal.card_memory_bytes / GIB:.1f} GiB"
            )
    kv = cal.kv_tokens(c)
    if kv < cal.max_model_len:
        return (
            f"each of {r} replicas holds {kv:,} KV tokens, less than one max_model_len"
            f" ({cal.max_model_len:,}) sequence: vLLM refuses to start"
        )
    if r + cal.other_cores >= cal.host_cores:
        return (
            f"{r} engine-core loops + {cal.other_cores:g} cores for the router and client leave"
            f" no core for the API servers on {cal.host_cores} cores"
        )
    return None


# Long: the model's equations in the order the module docstring gives them, each bound named
# where it is computed; cut apart, the reader would chase one formula across helpers.
def predict(candidate: Candidate, calibration: Calibration, scenario: Traffic) -> Prediction:
    """Sustained capacity of ``candidate`` under ``scenario``'s SLO, the resource that binds, and
    the latencies at that rate (the module docstring has the equations). A candidate that does
    not ``fits`` is a ConfigError: it has no capacity to predict."""
    cal, c, t = calibration, candidate, scenario
    why_not = fits(c, cal)
    if why_not:
        raise ConfigError(f"{c.name} does not fit: {why_not}", key=c.name)
    r, big_o = c.replicas, max(1, t.output_len)
    max_seqs = c.max_num_seqs or cal.default_max_num_seqs
    capture = c.max_cudagraph_capture_size or min(2 * max_seqs, VLLM_CAPTURE_CAP)
    z = NormalDist().inv_cdf(t.attainment_pct / 100.0)
    prefill, prefill_gpu = cal.prefill(t.prompt_len), cal.prefill_gpu(t.prompt_len)
    kv_tokens = cal.kv_tokens(c)
    kv_batch = kv_tokens / (t.prompt_len + t.output_len / 2.0)
    chunks = 1 + math.ceil((big_o - 1) / c.stream_interval)
    api_cost = cal.api_request_ms + chunks * cal.api_chunk_ms + big_o * cal.api_token_ms
    api_first = cal.api_request_ms + cal.api_chunk_ms + cal.api_token_ms
    spread_over = r if c.router_policy in LOAD_AWARE else 1

    def at_percentile(b: float) -> float:
        return b + z * math.sqrt(b / spread_over)

    def step(b: float) -> float:
        return max(cal.host_step_ms(b, capture), r * cal.gpu_step_ms(b))

    def paces(b: float) -> tuple[float, float]:
        """(host loop, shared GPU): each one's time per decode step with its share of prefills."""
        host = cal.host_step_ms(b, capture) + b * prefill / big_o
        return host, r * (cal.gpu_step_ms(b) + b * prefill_gpu / big_o)

    def tpot(b: float) -> float:
        return max(paces(b))

    def ttft(b: float) -> float:
        return api_first + step(b) + prefill

    def gap(b: float) -> float:
        return c.stream_interval * tpot(b) + prefill

    def broken(b: float) -> str | None:
        bq = at_percentile(b)
        checks = (
            ("max_num_seqs", bq <= max_seqs),
            ("kv", bq <= kv_batch),
            ("tpot", tpot(bq) <= t.tpot_ms),
            ("chunk_gap", t.chunk_gap_ms is None or gap(bq) <= t.chunk_gap_ms),
            ("ttft", ttft(bq) <= t.ttft_ms),
        )
        return next((name for name, ok in checks if not ok), None)

    def engine_rate(b: float) -> float:
        return r * 1000.0 * b / (big_o * tpot(b))

    # b*: the largest whole batch every bound allows (a scan: interpolated steps need not be
    # monotone, and a few thousand evaluations cost nothing)
    best, limit = 0, None
    for b in range(1, max_seqs + 1):
        limit = broken(b)
        if limit:
            break
        best = b
    limit = limit or "max_num_seqs"
    if best:
        host, gpu = paces(best)
        engine_kind = "kv" if limit == "kv" else ("gpu" if gpu > host else "engine_core_loop")
        engine_ceiling = engine_rate(best)
        ttft_slack = t.ttft_ms - ttft(at_percentile(best))
    else:  # not even one request a replica meets the SLO
        engine_kind = "kv" if limit == "kv" else "engine_core_loop"
        engine_ceiling, ttft_slack = 0.0, 0.0
    util = cal.max_utilization
    if api_cost > 0 and ttft_slack > 0:  # the API server's queue wait must fit TTFT's slack
        util = min(util, 2 * ttft_slack / (api_cost + 2 * ttft_slack))
    per_process = 1000.0 / api_cost if api_cost > 0 else math.inf
    free_cores = cal.host_cores - cal.other_cores - r
    ceilings = {
        engine_kind: engine_ceiling,
        "api_server": r * c.api_server_count * util * per_process,
        "host_cores": max(0.0, free_cores) * util * per_process,
    }
    binding = min(ceilings, key=lambda k: (ceilings[k], RESOURCES.index(k)))
    capacity = ceilings[binding]

    # the batch at the capacity: where the engine's rate meets it (bisection: the rate grows with b)
    if binding == engine_kind or capacity <= 0:
        b = float(best)
    else:
        lo, hi = 0.0, float(best)
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if engine_rate(mid) < capacity else (lo, mid)
        b = hi
    bq = at_percentile(b) if b > 0 else 0.0
    rho = 0.0
    if api_cost > 0 and capacity > 0:
        rho = capacity * api_cost / 1000.0 / min(r * c.api_server_count, max(free_cores, 1e-9))
    wait = rho / (2 * (1 - rho)) * api_cost if rho < 1 else math.inf
    pred = Prediction(
        config=c.name,
        capacity_rps=capacity,
        binding=binding,
        ceilings=ceilings,
        batch=b,
        batch_peak=bq,
        batch_limit=limit,
        step_ms=step(max(bq, 1.0)),
        ttft_p99_ms=ttft(max(bq, 1.0)) + wait,
        tpot_p99_ms=tpot(max(bq, 1.0)),
        chunk_gap_p99_ms=gap(max(bq, 1.0)),
        kv_tokens_per_replica=kv_tokens,
        extra={"api_ms_per_request": api_cost, "chunks_per_request": chunks, "capture": capture},
    )
    pred.why = _why(pred, c)
    return pred


def _why(p: Prediction, c: Candidate) -> str:
    """The binding resource in words, with its figures."""
    cap = f"{p.capacity_rps:.4g} req/s"
    api = p.extra["api_ms_per_request"]
    if p.binding == "api_server":
        return (
            f"api_server binds at {cap}: {c.replicas * c.api_server_count} API-server process(es),"
            f" {api:.3g} ms of host time a request ({p.extra['chunks_per_request']} chunks)"
        )
    if p.binding == "host_cores":
        return f"host_cores bind at {cap}: the API servers share the cores the engine loops leave"
    return (
        f"{p.binding} binds at {cap}: {c.replicas} replica(s) at batch {p.batch:.0f} (limited by"
        f" {p.batch_limit}), a step of {p.step_ms:.3g} ms"
    )


def enumerate_candidates(space: dict) -> list[Candidate]:
    """Every candidate of a grid (``{knob: [values]}``, a knob left out keeps vLLM's default),
    vLLM's default first, each once (one replica has no router: its policies are one candidate)."""
    names = [f.name for f in fields(Candidate)]
    unknown = sorted(set(space) - set(names))
    if unknown:
        raise ConfigError(
            f"candidate space: {', '.join(unknown)} not a knob of the model ({', '.join(names)})",
            key=unknown[0],
        )
    axes = [
        [(k, v) for v in (space[k] if isinstance(space[k], list | tuple) else [space[k]])]
        for k in names
        if k in space
    ]
    out = [Candidate()]
    for combo in itertools.product(*axes):
        cand = Candidate(**dict(combo))
        if cand not in out:
            out.append(cand)
    return out


# --------------------------------------------------------------------------- helpers
def _interp(points: dict[int, float], x: float) -> float:
    """Linear between measured points; the smallest's value below it (a step's fixed cost does
    not shrink), the last segment's slope (never negative) beyond the largest."""
    xs = sorted(points)
    if len(xs) == 1 or x <= xs[0]:
        return points[xs[0]]
    for a, b in itertools.pairwise(xs):
        if x <= b:
            return points[a] + (points[b] - points[a]) * (x - a) / (b - a)
    a, b = xs[-2], xs[-1]
    slope = max(0.0, (points[b] - points[a]) / (b - a))
    return points[b] + slope * (x - b)
