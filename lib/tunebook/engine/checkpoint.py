"""A config-only model with real-looking weights: transformers' standard random init, saved once.

Notebook 01's drift check needs a network whose logits are not flat (vLLM's dummy weights are);
writing it takes seconds to minutes, so on a GPU node it starts in a process of its own before
the notebook needs it (``prepare_random_init``).
"""

from __future__ import annotations

from tunebook.core.model import resolve_model_dir
from tunebook.engine.launcher import wants_prestart

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
)


def _random_init_dest(model: str, seed: int, root: str | None):
    import tempfile
    from pathlib import Path

    src = resolve_model_dir(model)
    root_p = Path(root) if root else Path(tempfile.gettempdir()) / "tunebook-random-init"
    return src, root_p, root_p / f"{src.name}-seed{seed}"


def prepare_random_init(model: str, seed: int = 0, root: str | None = None):
    """Start writing ``random_init_checkpoint`` in a process of its own; the handle goes to its
    ``early``. On a GPU node only (``launcher.wants_prestart``), where the kernel's and the
    launchers' imports of vLLM (~17 s) leave time for it: on an H100 host the checkpoint of
    ERNIE-4.5-0.3B took 16 s in 01's derived-values cell, holding up its first engine. None where
    nothing was started (CPU, already written, or a model that does not resolve: the checkpoint
    call then says why)."""
    import subprocess
    import sys

    key = (str(model), seed, str(root))
    started = _EARLY_INIT.get(key)
    if started is not None and started.poll() is None:
        return started  # started before the notebook ran (tunebook.workbench.notebook.prepare)
    try:
        _, _, dest = _random_init_dest(model, seed, root)
    except Exception:  # a bad parameter: begin() reports it
        return None
    if any(dest.glob("*.safetensors")) or not wants_prestart():
        return None
    argv = [
        sys.executable,
        "-m",
        "tunebook.engine.checkpoint",
        "random-init",
        str(model),
        str(seed),
    ]
    _EARLY_INIT[key] = subprocess.Popen(
        argv + ([str(root)] if root else []),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,  # a failure shows when the notebook makes it itself
    )
    return _EARLY_INIT[key]


_EARLY_INIT: dict[tuple, object] = {}


def random_init_checkpoint(model: str, seed: int = 0, root: str | None = None, early=None):
    """The model's shape with transformers' standard random init, saved as safetensors (cached).

    vLLM's dummy weights are uniform in +-1e-3: the logits come out flat (every logprob is
    -ln(vocab) to float precision) and greedy choices are ties, so nothing downstream of the KV
    cache can show a difference. A standard init (normal, std = initializer_range, unit norms)
    gives a random but non-degenerate network: outputs still mean nothing as text, but a change
    in the computation (an fp8 KV cache) shows in the logprobs and greedy tokens.
    Written once under ``root`` (default: the temp folder), keyed by model folder and seed.
    ``early``: the process ``prepare_random_init`` started, waited for first.
    """
    import os
    import shutil
    import tempfile
    from pathlib import Path

    if early is not None:
        early.wait(timeout=900)  # whatever it did, the folder below says whether it is written
    src, root_p, dest = _random_init_dest(model, seed, root)
    if any(dest.glob("*.safetensors")):
        return dest
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(src)
    torch.manual_seed(seed)
    net = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    tmp = Path(
        tempfile.mkdtemp(
            prefix=f".{dest.name}.", dir=root_p.mkdir(parents=True, exist_ok=True) or root_p
        )
    )
    net.save_pretrained(tmp, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, tmp / name)
    try:
        os.replace(tmp, dest)
    except OSError:  # another process got there first
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


if __name__ == "__main__":
    # ``python -m tunebook.engine.checkpoint random-init MODEL SEED [ROOT]``: prepare_random_init's process.
    import sys

    if len(sys.argv) not in (4, 5) or sys.argv[1] != "random-init":
        sys.exit("usage: python -m tunebook.engine.checkpoint random-init MODEL SEED [ROOT]")
    print(random_init_checkpoint(sys.argv[2], int(sys.argv[3]), *sys.argv[4:]))
