"""Shrink a run folder for committing: per-request records move into gzipped sidecars.

    python scripts/compact_run.py runs/<run-id> [...]

Every point file with a ``requests`` list keeps its summary (settings, metrics, env, timeline ...)
and gets ``<point>.requests.jsonl.gz`` beside it; tunebook reads both back as one point
(``tunebook.core.results.load_point``). Idempotent.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tunebook.core.results import compact_point


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("folders", nargs="+")
    args = ap.parse_args()
    saved = n = 0
    for folder in args.folders:
        for p in sorted(Path(folder).rglob("*.json")):
            try:
                saved += compact_point(p)
                n += 1
            except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
                continue
    print(f"compact_run: {n} files read, {saved / 1e6:.1f} MB saved")


if __name__ == "__main__":
    main()
