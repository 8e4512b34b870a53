"""Parameter profiles (params/<name>.yaml): what papermill injects into each notebook.

A profile is a YAML mapping with a ``common`` section (merged into every notebook) and one section
per notebook stem (``00_baseline`` ...). Every key must be a parameter of the notebook it goes to,
with a matching type: papermill itself only warns about unknown ones.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import yaml

from .errors import ConfigError
from .model import REPO_ROOT

PARAMS_DIR = REPO_ROOT / "params"
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
NOTEBOOKS = (
    "00_baseline",
    "01_kv_cache_sizing",
    "02_block_size_sweep",
    "03_prefill_scaling",
    "04_engine_overhead",
    "05_assemble_config",
)
META_KEYS = {"description", "run_here"}  # profile-level documentation, not notebook parameters


def profile_path(name_or_path: str | Path) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml"):
        return p
    return PARAMS_DIR / f"{name_or_path}.yaml"


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PARAMS_DIR.glob("*.yaml"))


def load_profile(name_or_path: str | Path) -> dict:
    """Parse a profile as data (yaml.safe_load: no tags, no code) and check its shape."""
    path = profile_path(name_or_path)
    if not path.is_file():
        raise ConfigError(
            f"no params file {path}; profiles here: {', '.join(available_profiles())}",
            source=str(path),
        )
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"malformed YAML: {e}", source=str(path)) from e
    if not isinstance(data, dict):
        raise ConfigError("a profile must be a mapping of sections", source=str(path))
    unknown = set(data) - {"common", *NOTEBOOKS} - META_KEYS
    if unknown:
        raise ConfigError(
            f"unknown section(s) {sorted(unknown)}; valid: common, {', '.join(NOTEBOOKS)}",
            source=str(path),
        )
    for sec, body in data.items():
        if sec not in META_KEYS and body is not None and not isinstance(body, dict):
            raise ConfigError(f"section {sec!r} must be a mapping", key=sec, source=str(path))
    data["_path"] = str(path)
    return data


def engine_base(name_or_path: str | Path) -> dict:
    """The model and engine settings every engine of a profile runs with (its common section),
    for scripts outside the notebooks: ``{"model": ..., "settings": {...}}``."""
    common = load_profile(name_or_path).get("common") or {}
    return {"model": common["model"], "settings": dict(common.get("engine_settings") or {})}


def notebook_parameters(notebook: str | Path) -> dict[str, dict]:
    """Names, type hints and defaults of a notebook's ``parameters`` cell (read, not executed)."""
    nb_path = Path(notebook)
    if not nb_path.suffix:
        nb_path = NOTEBOOKS_DIR / f"{notebook}.ipynb"
    if not nb_path.is_file():
        raise ConfigError(f"no notebook {nb_path}", source=str(nb_path))
    try:
        nb = json.loads(nb_path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"not a notebook (invalid JSON: {e})", source=str(nb_path)) from e
    for cell in nb["cells"]:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            src = "".join(cell["source"])
            out = {}
            for node in ast.parse(src).body:
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    out[node.target.id] = {
                        "type": ast.unparse(node.annotation),
                        "default": ast.literal_eval(node.value) if node.value else None,
                    }
            return out
    raise ConfigError(f"{nb_path} has no cell tagged 'parameters'", source=str(nb_path))


_TYPE_CHECKS = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    "dict": lambda v: isinstance(v, dict),
    "list": lambda v: isinstance(v, list),
}


def _top_level_alternatives(type_str: str) -> list[str]:
    """Split "dict[str, int | None] | None" at the top-level "|" only."""
    parts, depth, cur = [], 0, ""
    for ch in type_str:
        depth += (ch == "[") - (ch == "]")
        if ch == "|" and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [*parts, cur]


def _matches_hint(type_str: str, value) -> bool:
    """Whether ``value`` fits a notebook parameter's type hint, given as text ("int | None")."""
    if value is None and ("None" in type_str or "Optional" in type_str):
        return True
    t = type_str.strip()
    if t.startswith("Optional[") and t.endswith("]"):
        t = t[len("Optional[") : -1]
    # "int | float | None": any alternative may match; an unknown one accepts anything.
    for alt in _top_level_alternatives(t):
        head = alt.split("[")[0].strip()
        if head == "None":
            continue
        check = _TYPE_CHECKS.get(head)
        if check is None or check(value):
            return True
    return False


def notebook_params(profile: dict, notebook: str) -> dict:
    """The parameters one notebook gets from a profile: common, then its own section, checked."""
    src = profile.get("_path", "<profile>")
    params = {**(profile.get("common") or {}), **(profile.get(notebook) or {})}
    declared = notebook_parameters(notebook)
    for key, value in params.items():
        if key not in declared:
            raise ConfigError(
                f"{key!r} is not a parameter of {notebook}; its parameters: {sorted(declared)}",
                key=key,
                source=src,
            )
        t = declared[key]["type"]
        if not _matches_hint(t, value):
            raise ConfigError(
                f"{notebook}.{key} = {value!r} ({type(value).__name__}) does not match {t}",
                key=key,
                source=src,
            )
    return params


def detect_profile() -> str:
    """h200 on an H200, gpu on another CUDA device, cpu otherwise."""
    try:
        import torch

        if torch.cuda.is_available():
            return "h200" if "H200" in torch.cuda.get_device_name(0) else "gpu"
    except Exception:
        pass
    return "cpu"
