"""What a notebook holds on to: its run folder, model and base engine settings, and its sweeps.

    wb = Workbook(run_dir, "02_block_size_sweep", model, engine_settings, engine_env)
    df = wb.sweep("block_size", grid("block_size", [32, 64]), workload={...}, repeats=3)

Each sweep lands in ``<run_dir>/<notebook>/<sweep>/`` (one JSON per point + summary.csv) and
resumes if the folder already holds finished points. Each sweep's start and each finished point
are appended to ``<run_dir>/<notebook>/progress.jsonl``: the runner's progress line reads it, and
the GPU-time accounting takes the points' end times from it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from tunebook.core.model import ModelShape, load_shape  # noqa: F401 (load_shape: notebooks' other shapes)
from tunebook.core.results import SweepDir, load_sweep, safe_name
from tunebook.engine.adapter import platform_name, vllm_version  # noqa: F401 (what notebooks print)
from tunebook.engine.launcher import wait_ready
from tunebook.measure.sweep import grid, make_points, run_sweep  # noqa: F401 (grid: notebooks' configs)
from tunebook.workbench.console import PROGRESS_FILE


@dataclass
class Workbook:
    run_dir: str
    notebook: str
    model: str
    engine_settings: dict = field(default_factory=dict)
    engine_env: dict = field(default_factory=dict)
    isolate: bool = True
    progress: bool = True
    executor: str = field(default_factory=lambda: os.environ.get("TUNEBOOK_EXECUTOR", "local"))

    def __post_init__(self):
        self.root = Path(self.run_dir) / safe_name(self.notebook, "notebook")
        self.root.mkdir(parents=True, exist_ok=True)

    @property
    def shape(self) -> ModelShape:
        return load_shape(self.model)

    def sweep_dir(self, name: str) -> Path:
        return self.root / safe_name(name, "sweep name")

    def points(
        self,
        configs: dict[str, dict],
        workload: dict,
        repeats: int = 1,
        workloads: dict[str, dict] | None = None,
        point_overrides: dict[str, dict] | None = None,
        workload_repeats: dict[str, int] | None = None,
        **extra,
    ) -> list[dict]:
        base = {
            "model": self.model,
            "settings": dict(self.engine_settings),
            "env": dict(self.engine_env),
            "workload": workload,
            **extra,
        }
        return make_points(base, configs, repeats, workloads, point_overrides, workload_repeats)

    def sweep(
        self,
        name: str,
        configs: dict[str, dict],
        workload: dict | None,
        repeats: int = 1,
        workloads: dict[str, dict] | None = None,
        point_overrides: dict[str, dict] | None = None,
        workload_repeats: dict[str, int] | None = None,
        **extra,
    ):
        """Run (or resume) a sweep and return its DataFrame; failed points are rows with an error.

        ``workloads`` (name -> spec, instead of one ``workload``): every configuration runs each
        of them in turn, on one engine start per configuration and repeat (served, or in-process
        when not isolated); ``workload_repeats`` (name -> n) runs a workload on n starts only."""
        pts = self.points(
            configs, workload or {}, repeats, workloads, point_overrides, workload_repeats, **extra
        )
        sd = SweepDir(self.sweep_dir(name))
        done = sum(1 for p in pts if p.get("point_id") and _done(sd, p["point_id"]))
        self._progress({"event": "start", "sweep": name, "points": len(pts), "done": done})

        def on_result(r: dict) -> None:
            self._progress(
                {
                    "event": "point",
                    "sweep": name,
                    "point_id": r.get("point_id"),
                    "status": r.get("status"),
                    "wall_s": r.get("wall_s"),
                }
            )

        wait_ready()  # a launcher started early (notebook.begin) is not importing beside a point
        return run_sweep(
            pts,
            self.sweep_dir(name),
            isolate=self.isolate,
            progress=self.progress,
            executor=self.executor,
            desc=f"{self.notebook}/{name}",
            on_result=on_result,
        )

    def _progress(self, event: dict) -> None:

        line = json.dumps({"t": time.time(), **event}) + "\n"
        with open(self.root / PROGRESS_FILE, "a") as f:  # one short append per event
            f.write(line)

    def results(self, name: str) -> list[dict]:
        """Full point results (with per-request records) of a finished sweep."""
        return SweepDir(self.sweep_dir(name)).points()

    def frame(self, name: str):
        return load_sweep(self.sweep_dir(name))

    def runner(self, name: str, workload: dict, **extra):
        """``(configs, repeats) -> points``: sweep ``name`` run (or resumed) for those
        configurations, then every point it holds (what ``headroom.race`` calls each round)."""

        def run(configs: dict[str, dict], repeats: int) -> list[dict]:
            self.sweep(name, configs, workload, repeats=repeats, **extra)
            return self.results(name)

        return run


def _done(sd: SweepDir, point_id: str) -> bool:
    try:
        return sd.done(point_id)
    except Exception:  # a bad id is reported by run_sweep's own checks, with its reason
        return False
