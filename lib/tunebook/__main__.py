"""Command line: `python -m tunebook run [--profile cpu] [--run-id ID] [--notebook 01] [--resume]`,
`python -m tunebook cost runs/<run-id>`, `python -m tunebook profiles`."""

from __future__ import annotations

import argparse
import sys

from tunebook.core.errors import ConfigError, TunebookError
from tunebook.workbench.cost import main as cost_main
from tunebook.workbench.profiles import available_profiles
from tunebook.workbench.runner import RUNS_DIR, run_workbook


def _process_start() -> float | None:
    """When this process began (its interpreter start and imports hold the device too)."""
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # psutil comes with vLLM; without it the runner counts from its own start
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tunebook", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the workbook headless (papermill) into runs/<run-id>/")
    r.add_argument(
        "--profile", help="params/<profile>.yaml or a path; default: detected (h200, gpu, cpu)"
    )
    r.add_argument("--run-id", help="run folder name under runs/ (default: <profile>-<timestamp>)")
    r.add_argument(
        "--notebook", action="append", help="run only this notebook (prefix ok, repeatable)"
    )
    r.add_argument("--resume", action="store_true", help="continue an existing run folder")
    r.add_argument("--runs-dir", default=None, help="where run folders go (default: runs/)")
    r.add_argument("--no-report", action="store_true", help="skip the HTML report")
    sub.add_parser("profiles", help="list the parameter profiles")
    c = sub.add_parser("cost", help="GPU-seconds of a run folder, per notebook and phase")
    c.add_argument("run_dir", help="a run folder, e.g. runs/<run-id>")
    c.add_argument("--json", action="store_true", help="rows as JSON instead of a table")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "cost":
            return cost_main([args.run_dir, *(["--json"] if args.json else [])])
        if args.cmd == "profiles":
            print("\n".join(available_profiles()))
            return 0

        run_dir = run_workbook(
            profile=args.profile,
            run_id=args.run_id,
            notebooks=args.notebook,
            resume=args.resume,
            runs_dir=args.runs_dir or RUNS_DIR,
            report=not args.no_report,
            started=_process_start(),
        )
        print(f"[tunebook] run folder: {run_dir}")
        return 0
    except ConfigError as e:
        print(f"tunebook: error: {e}", file=sys.stderr)
        return 2
    except TunebookError as e:  # a notebook stopped: the runner has said where and why
        print(f"tunebook: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            "tunebook: interrupted (finished points are kept; --resume continues)", file=sys.stderr
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
