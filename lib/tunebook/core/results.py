"""Run folders: one JSON per sweep point plus a summary CSV, written atomically, resumable.

Layout (like vLLM's own sweep output)::

    runs/<run-id>/
        <notebook>/<sweep>/<point-id>.json   # settings, workload, metrics, env, status, error
        <notebook>/<sweep>/summary.csv       # one row per point, flat metric columns
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import tempfile
from pathlib import Path

from tunebook.core.errors import ConfigError

_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=-]*$")  # "=" for grid() names: block_size=32


def first_missing(path: str | Path) -> Path | None:
    """The outermost folder of ``path`` (or ``path`` itself) that does not exist yet: what making
    ``path`` creates, and so what to remove to leave nothing behind. None if it exists."""
    path = Path(path)
    return next((d for d in (*reversed(path.parents), path) if not d.exists()), None)


def safe_name(name: str, what: str = "name") -> str:
    """Reject names that could escape the run folder or be awkward as file names."""
    if not isinstance(name, str) or not _SAFE.match(name) or ".." in name:
        raise ConfigError(
            f"{what} {name!r} must be letters, digits, '.', '_', '=' or '-', not starting with '.'",
            key=what,
        )
    return name


_FILE_MODE = 0o644  # mkstemp makes 0600; results are for everyone who may read the run


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temporary file in the same folder, then rename: a kill leaves old or new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, _FILE_MODE)
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_files(out_dir: str | Path, files: dict[str, str]) -> dict[str, Path]:
    """Write rendered files (name -> text) atomically into ``out_dir``, shell scripts executable;
    return their paths."""
    out = Path(out_dir)
    paths = {}
    for name, text in files.items():
        p = out / name
        atomic_write_text(p, text)
        if name.endswith(".sh"):
            os.chmod(p, 0o755)
        paths[name] = p
    return paths


def _jsonable(x):
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if hasattr(x, "tolist") and callable(x.tolist):  # numpy scalars and arrays
        return _jsonable(x.tolist())
    if isinstance(x, str | int | float | bool) or x is None:
        return x
    return str(x)


# Per-request records and gauge timelines are most of a point file: one compact line per item,
# floats to 4 decimals (0.1 us for values in ms, 0.1 ms for seconds: finer than the clocks' noise).
_BULKY = ("requests", "timeline")


def _rounded(x, ndigits: int = 4):
    if isinstance(x, float):
        return round(x, ndigits)
    if isinstance(x, dict):
        return {k: _rounded(v, ndigits) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v, ndigits) for v in x]
    return x


def dumps_point(result: dict) -> str:
    """A point as JSON: the summary fields indented and sorted, bulky lists one item per line."""
    data = _jsonable(result)
    bulky = {k: data.pop(k) for k in _BULKY if isinstance(data.get(k), list)}
    text = json.dumps(data, indent=2, sort_keys=True)
    if not bulky:
        return text + "\n"
    parts = []
    for k, items in bulky.items():
        lines = ",\n".join(
            "    " + json.dumps(_rounded(it), sort_keys=True, separators=(",", ":")) for it in items
        )
        parts.append(f"  {json.dumps(k)}: [\n{lines}\n  ]" if items else f"  {json.dumps(k)}: []")
    head = text[:-1].rstrip()  # drop the closing brace
    sep = ",\n" if data else "\n"
    return head + sep + ",\n".join(parts) + "\n}\n"


# Committed evidence keeps its per-request records beside the point file, gzipped: a GPU run's
# points are mostly these records, and the files of a repository travel (to a GPU node, in a clone).
SIDECAR = ".requests.jsonl.gz"


def load_point(path: Path) -> dict:
    """A point file, with its per-request records from a ``<point>.requests.jsonl.gz`` sidecar when
    ``compact_point`` moved them there. Raises json.JSONDecodeError for a broken file."""
    import gzip

    path = Path(path)
    point = json.loads(path.read_text())
    side = path.with_name(path.stem + SIDECAR)
    if isinstance(point, dict) and "requests" not in point and side.is_file():
        with gzip.open(side, "rt") as f:
            point["requests"] = [json.loads(line) for line in f if line.strip()]
    return point


def compact_point(path: Path) -> int:
    """Move a point file's per-request records into its gzipped sidecar; return bytes saved."""
    import gzip

    path = Path(path)
    point = json.loads(path.read_text())
    reqs = point.pop("requests", None) if isinstance(point, dict) else None
    if not reqs:
        return 0
    before = path.stat().st_size
    side = path.with_name(path.stem + SIDECAR)
    lines = "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in reqs)
    tmp = side.with_name(side.name + ".tmp")
    with gzip.GzipFile(tmp, "wb", compresslevel=9, mtime=0) as f:  # mtime 0: reproducible bytes
        f.write(lines.encode())
    os.replace(tmp, side)
    atomic_write_text(path, dumps_point(point))
    return before - path.stat().st_size - side.stat().st_size


class SweepDir:
    """One sweep's folder inside a run: point files, resume, and the summary CSV."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, point_id: str) -> Path:
        return self.root / f"{safe_name(point_id, 'point id')}.json"

    def write(self, point_id: str, result: dict) -> Path:
        p = self.path(point_id)
        atomic_write_text(p, dumps_point(result))
        return p

    def read(self, point_id: str) -> dict | None:
        p = self.path(point_id)
        if not p.is_file():
            return None
        try:
            return load_point(p)
        except json.JSONDecodeError:
            return None  # cannot happen with atomic writes, but a hand-edited file may be broken

    def done(self, point_id: str) -> bool:
        r = self.read(point_id)
        return bool(r) and r.get("status") == "ok"

    def points(self) -> list[dict]:
        out = []
        for p in sorted(self.root.glob("*.json")):
            try:
                out.append(load_point(p))
            except json.JSONDecodeError:
                continue
        return out

    def write_summary(self) -> Path:
        rows = [point_row(p) for p in self.points()]
        cols: list[str] = []
        for r in rows:
            cols += [k for k in r if k not in cols]
        path = self.root / "summary.csv"
        buf = io.StringIO(newline="")
        w = csv.DictWriter(buf, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
        atomic_write_text(path, buf.getvalue())  # no half-written summary, no stray temp file
        return path


def point_row(point: dict) -> dict:
    """One point as one flat row: the layout every table of the workbook starts from (summary.csv,
    the notebooks' frames, assembly's sweeps).

    Columns, in this order: ``point_id``, ``config``, ``repeat``, ``status``; the point's settings
    by vLLM's own names (as ``vllm serve`` flags); ``workload`` (its name); the scalar metrics;
    ``cap_<key>`` for what the engine resolved and sized at start (its capacity record: vLLM's
    values where the point left a setting out); device memory; ``engine_start_s``; ``error``.
    """
    row = {k: point.get(k) for k in IDENT}
    for k, v in (point.get("settings") or {}).items():
        row[k] = json.dumps(v) if isinstance(v, dict | list) else v
    row["workload"] = (point.get("workload") or {}).get("name")
    for k, v in (point.get("metrics") or {}).items():
        if not isinstance(v, dict | list):
            row[k] = v
    for k, v in (point.get("capacity") or {}).items():
        if not isinstance(v, dict | list):
            row[f"cap_{k}"] = v
    for k, v in (point.get("memory") or {}).items():
        if not isinstance(v, dict | list):
            row[k] = v
    row["engine_start_s"] = point.get("engine_start_s")
    row["error"] = point.get("error")
    return row


IDENT = ("point_id", "config", "repeat", "status")
FRAME_COLUMNS = (*IDENT, "workload", "error")


def points_frame(points: list[dict]):
    """Points as a pandas DataFrame of ``point_row`` rows. No points: an empty frame that still
    has the identity and status columns, so ``df[df["status"] != "ok"]`` holds."""
    import pandas as pd

    rows = [point_row(p) for p in points]
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=list(FRAME_COLUMNS))


def load_sweep(root: str | Path):
    """The sweep's points as a pandas DataFrame (one row per point, as in summary.csv)."""
    return points_frame(SweepDir(root).points())
