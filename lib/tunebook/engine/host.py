"""What this machine has: its device, the device's memory and its datasheet figures.

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


def gpu_name() -> str | None:
    """The name of GPU 0 as nvidia-smi gives it ('NVIDIA H100 80GB HBM3'); None without one."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        return (
            subprocess.run(
                [smi, "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            .stdout.strip()
            .splitlines()[0]
        )
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return None


# Datasheet figures of the cards tunebook has run on or is asked about: dense bf16 TFLOP/s
# (no sparsity) and memory bandwidth in TB/s. Matched by the first key that appears in
# nvidia-smi's name (more specific names first).
CARD_SPECS: dict[str, tuple[float, float]] = {
    "H200": (989.0, 4.8),
    "H100 PCIe": (756.0, 2.0),
    "H100 NVL": (835.0, 3.9),
    "H100": (989.0, 3.35),  # SXM, HBM3: "NVIDIA H100 80GB HBM3"
    "A100-SXM4-80GB": (312.0, 2.039),
    "A100": (312.0, 1.555),
    "L40S": (362.0, 0.864),
    "RTX 4090": (165.0, 1.008),
}


def card_specs(name: str | None) -> dict | None:
    """``{"card", "peak_tflops", "hbm_tb_s"}`` for a GPU name, None for an unknown card or none."""
    for key, (tflops, tbs) in CARD_SPECS.items():
        if name and key in name:
            return {"card": name, "peak_tflops": tflops, "hbm_tb_s": tbs}
    return None
