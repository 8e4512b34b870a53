"""Synthetic sweep points for the topics' tests: the shape a point file has (no engine)."""

from __future__ import annotations


def point(config="a", repeat=0, status="ok", **parts) -> dict:
    return {
        "point_id": f"{config}-r{repeat}",
        "config": config,
        "repeat": repeat,
        "status": status,
        "settings": {},
        "workload": {"name": "w"},
        "metrics": {},
        "capacity": {},
        "error": None if status == "ok" else "EngineFailure: boom",
        **parts,
    }
