"""Make saved outputs machine-neutral: absolute paths of the checkout become repo-relative.

    python scripts/scrub_paths.py runs/<run-id> [--prefix /abs/checkout/] [--home /root/]

Rewrites text files (.ipynb, .json, .csv, .log, .md ...) in place, gzipped ones too (a run's large
logs and request records are kept as .gz). Installed packages' paths, which name how a node was set
up (a virtualenv's, or the folder a bundle was installed into with pip's --target), become
``site-packages/``. The nbval goldens get the same treatment from
make_goldens.py (only in outputs nbval does not compare).
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Any absolute path down to a site-packages folder, and the GPU node's pip --target folder.
SITE_PACKAGES = re.compile(r"(?<![\w.+-])(?:(?:/[\w.+-]+)+/(?:site|dist)-packages/|/tmp/site/)")
SUFFIXES = {".ipynb", ".json", ".csv", ".log", ".md", ".jsonl", ".html", ".yaml", ".sh", ".py"}


def scrub_text(text: str, prefixes: list[str], home: str) -> str:
    for p in prefixes:
        text = text.replace(p, "")
    text = SITE_PACKAGES.sub("site-packages/", text)
    return text.replace(home, "~/") if home and home != "/" else text


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--prefix", action="append", default=[], help="checkout path(s) to strip")
    ap.add_argument("--home", default=os.path.expanduser("~").rstrip("/") + "/")
    args = ap.parse_args()
    prefixes = args.prefix or [str(ROOT) + "/"]
    n = 0
    for folder in args.folders:
        for p in Path(folder).rglob("*"):
            zipped = p.suffix == ".gz"
            if not p.is_file() or Path(p.stem if zipped else p.name).suffix not in SUFFIXES:
                continue
            raw = gzip.decompress(p.read_bytes()) if zipped else p.read_bytes()
            old = raw.decode(errors="replace")
            new = scrub_text(old, prefixes, args.home)
            if new != old:
                data = new.encode()
                p.write_bytes(gzip.compress(data, mtime=0) if zipped else data)
                n += 1
    print(f"scrubbed {n} files")


if __name__ == "__main__":
    main()
