"""The typed Point and Result: checked once at the edge, serialized in one place."""

from __future__ import annotations

import pytest

from tunebook.core.errors import ConfigError
from tunebook.core.points import Point, Result, failed_result

BASE = {"point_id": "a-r0", "model": "tiny-ernie", "workload": {"kind": "fixed"}}


def test_unknown_key_is_refused_with_the_closest_name():
    with pytest.raises(
        ConfigError, match=r"unknown point key 'max_concurency'; did you mean 'max_concurrency'\?"
    ):
        Point.from_dict({**BASE, "max_concurency": 8})
    with pytest.raises(ConfigError, match=r"unknown point key 'zzz'; valid keys: point_id, model"):
        Point.from_dict({**BASE, "zzz": 1})


@pytest.mark.parametrize(
    "extra,match",
    [
        ({"mode": "offlne"}, r"mode='offlne' must be one of offline, online, served"),
        ({"repeats": 0}, r"repeats=0 must be a whole number >= 1"),
        ({"repeats": True}, r"repeats=True must be a whole number"),
        ({"warmup_requests": -1}, r"warmup_requests=-1 must be a whole number >= 0"),
        ({"max_concurrency": 0}, r"max_concurrency=0 must be a whole number >= 1"),
        ({"settings": [1]}, r"settings=\[1\] must be a mapping"),
        ({"slo": 500}, r"slo=500 must be a mapping"),
        ({"rates": [10]}, r"rates=\[10\] needs mode 'served'"),
        ({"mode": "served", "rates": [10, -1]}, r"must be a list of positive request rates"),
        ({"serve": {"replicas": 2}}, r"serve=.* is for mode 'served'"),
    ],
)
def test_bad_values_are_config_errors(extra, match):
    with pytest.raises(ConfigError, match=match):
        Point.from_dict({**BASE, **extra})


def test_required_keys():
    for k in ("point_id", "model", "workload"):
        with pytest.raises(ConfigError, match=f"a point needs '{k}'"):
            Point.from_dict({**BASE, k: None})


def test_round_trip_and_defaults():
    p = Point.from_dict({**BASE, "settings": {"block_size": 32}, "max_concurrency": None})
    assert p.mode == "offline" and p.repeats == 1 and p.max_concurrency is None
    assert Point.from_dict(p.to_dict()) == p
    assert Point.from_dict(p) is p
    assert p.sampling_kwargs() == {"temperature": 0.0, "ignore_eos": True}
    kw = p.engine_kwargs()
    assert kw["block_size"] == 32 and kw["load_format"] == "dummy" and kw["seed"] == 0


def test_result_records_leave_out_what_did_not_happen():
    p = Point.from_dict({**BASE, "config": "a", "repeat": 0})
    r = Result.skeleton(p, {"num_requests": 4})
    d = r.to_dict()
    assert d["status"] == "failed" and d["error"] is None
    assert "metrics" not in d and "requests" not in d and "serve" not in d
    assert d["workload"] == {"kind": "fixed", "num_requests": 4}
    assert failed_result({**BASE, "bogus": 1}, "boom") == {
        "point_id": "a-r0",
        "config": None,
        "repeat": None,
        "status": "failed",
        "error": "boom",
    }


def test_points_of_a_shared_start_carry_its_seconds_once():
    """The first point of a start carries start and warm-up seconds; later ones name it and
    carry only their own measurement (never empty: cost estimates phases for empty ones)."""
    start = {"engine_start": 12.0, "warmup": 1.5}
    first = Result.in_group(Point.from_dict(BASE), {"num_requests": 4}, 0, "a-r0", start)
    later = Result.in_group(Point.from_dict({**BASE, "point_id": "b-r0"}), {}, 1, "a-r0", start)
    assert first.seconds == start and first.seconds is not start and first.shared_start is None
    assert later.seconds == {"measure": 0.0} and later.shared_start == "a-r0"
    assert first.workload == {"kind": "fixed", "num_requests": 4} and first.status == "failed"
