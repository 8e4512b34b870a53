"""What this machine has: its device and the device's memory.

Pure Python (nvidia-smi and os.sysconf): the launcher asks it before any vLLM import.
"""

from __future__ import annotations

import os
import shutil
import subprocess


def device_memory_bytes() -> tuple[str, int | None]:
    """('cuda', total bytes of GPU 0) via nvidia-smi, else ('cpu', physical memory)."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=20,
            ).stdout.split()
            if out:
                return "cuda", int(float(out[0]) * 2**20)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            pass
    try:
        return "cpu", os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return "cpu", None
