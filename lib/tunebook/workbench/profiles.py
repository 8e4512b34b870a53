"""Parameter profiles (params/<name>.yaml): what papermill injects into each notebook.

A profile is a YAML mapping with a ``common`` section (merged into every notebook) and one section
per notebook stem (``00_baseline`` ...). Every key must be a parameter of the notebook it goes to,
with a matching type and a valid value: papermill itself only warns about unknown ones. The same
checks run in the runner before anything starts (``check_params``) and in each notebook's first
cell after its parameters (``check_injected``), for parameters given to papermill directly.
"""

from __future__ import annotations

import ast
import difflib
import json
from pathlib import Path

import yaml

from tunebook.core.errors import ConfigError
from tunebook.core.model import REPO_ROOT, load_shape
from tunebook.core.points import MODES
from tunebook.core.scenarios import SCENARIOS
from tunebook.core.workloads import make_workload
from tunebook.engine import adapter
from tunebook.engine.knobs import check_settings, valid_block_sizes, validate_settings

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
# profile-level keys, not notebook parameters: documentation, where it runs, the profile it builds on
META_KEYS = {"description", "run_here", "extends"}


def profile_path(name_or_path: str | Path) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml"):
        return p
    return PARAMS_DIR / f"{name_or_path}.yaml"


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PARAMS_DIR.glob("*.yaml"))


def load_profile(name_or_path: str | Path, _seen: tuple = ()) -> dict:
    """Parse a profile as data (yaml.safe_load: no tags, no code) and check its shape; a profile
    with ``extends: <profile>`` is that profile with this one's keys over it."""
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
        first = sorted(unknown)[0]
        raise ConfigError(
            f"unknown section(s) {sorted(unknown)}"
            + did_you_mean(first, ["common", *NOTEBOOKS], f"valid: common, {', '.join(NOTEBOOKS)}"),
            key=first,
            source=str(path),
        )
    for sec, body in data.items():
        if sec not in META_KEYS and body is not None and not isinstance(body, dict):
            raise ConfigError(f"section {sec!r} must be a mapping", key=sec, source=str(path))
    if data.get("extends"):
        data = _overlay(data, path, seen=(*_seen, path.resolve()))
    data["_path"] = str(path)
    return data


def _overlay(data: dict, path: Path, seen: tuple) -> dict:
    """A profile that ``extends`` another: the other's sections, each overridden key by key by
    this one's (``common`` too); its description and run_here unless this one gives them."""
    base_name = data["extends"]
    base_path = profile_path(base_name)
    if base_path.resolve() in seen:
        raise ConfigError(
            f"extends {base_name!r} comes back to itself", key="extends", source=str(path)
        )
    base = load_profile(base_path, _seen=seen)
    out = {k: v for k, v in base.items() if k not in ("_path", "extends")}
    for sec, body in data.items():
        if sec in META_KEYS or body is None:
            if sec != "extends" and body is not None:
                out[sec] = body
            continue
        out[sec] = {**(out.get(sec) or {}), **body}
    out["extends"] = base_name
    return out


def engine_base(name_or_path: str | Path) -> dict:
    """The model and engine settings every engine of a profile runs with (its common section),
    for scripts outside the notebooks: ``{"model": ..., "settings": {...}}``."""
    common = load_profile(name_or_path).get("common") or {}
    return {"model": common["model"], "settings": dict(common.get("engine_settings") or {})}


def did_you_mean(name: str, valid, then: str) -> str:
    """'; did you mean 'x'? <Then>' for the closest valid name, or '; <then>' when none is close."""
    close = difflib.get_close_matches(str(name), [str(v) for v in valid], n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}? {then[:1].upper()}{then[1:]}"
    return f"; {then}"


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


def _top_level_alternatives(type_str: str, sep: str = "|") -> list[str]:
    """Split "dict[str, int | None] | None" at the top-level "|" (or another separator) only."""
    parts, depth, cur = [], 0, ""
    for ch in type_str:
        depth += (ch == "[") - (ch == "]")
        if ch == sep and depth == 0:
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
        if check is None:
            return True
        if check(value) and _items_match(alt.strip(), head, value):
            return True
    return False


def _items_match(alt: str, head: str, value) -> bool:
    """list[int]: every item an int; dict[str, float]: every value a float (else: anything)."""
    if "[" not in alt or not alt.endswith("]"):
        return True
    inner = alt[alt.index("[") + 1 : -1]
    if head == "list":
        return all(_matches_hint(inner, v) for v in value)
    if head == "dict":
        parts = _top_level_alternatives(inner, ",")
        if len(parts) == 2:
            return all(_matches_hint(parts[1], v) for v in value.values())
    return True


def notebook_params(profile: dict, notebook: str) -> dict:
    """The parameters one notebook gets from a profile: common, then its own section; names and
    types checked (values: ``check_values``)."""
    src = profile.get("_path", "<profile>")
    params = {**(profile.get("common") or {}), **(profile.get(notebook) or {})}
    check_types(notebook, params, source=src)
    return params


def check_types(notebook: str, params: dict, source: str | None = None) -> dict[str, dict]:
    """Every name declared by the notebook, every value of its declared type; returns the
    declarations."""
    declared = notebook_parameters(notebook)
    for key, value in params.items():
        if key not in declared:
            raise ConfigError(
                f"{key!r} is not a parameter of {notebook}"
                + did_you_mean(key, declared, f"its parameters: {sorted(declared)}"),
                key=key,
                source=source,
            )
        t = declared[key]["type"]
        if not _matches_hint(t, value):
            hint = ""
            if isinstance(value, str) and t.split("[")[0].strip() in ("list", "dict"):
                # papermill's -p passes text; lists and dicts go in as YAML
                hint = f'; give a {t.split("[")[0]} as YAML: papermill -y "{key}: ..."'
            raise ConfigError(
                f"{notebook}.{key} = {value!r} ({type(value).__name__}) does not match {t}"
                f" (default: {declared[key]['default']!r}){hint}",
                key=key,
                source=source,
            )
    return declared


def check_params(notebook: str, params: dict, source: str | None = None, engine: bool = True):
    """Names, types and values of a notebook's parameters, as the notebook would get them.

    ``engine=False`` leaves out the checks that need the installed vLLM (settings, block sizes).
    """
    check_types(notebook, params, source)
    check_values(notebook, params, source, engine=engine)


# --------------------------------------------------------------------------- values
# Value checks by parameter name: the notebooks share their parameters' names and meanings, so a
# check written once holds wherever the name appears. Each raises ConfigError naming the key.
def _positive_int(key: str, v, source, minimum: int = 1) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ConfigError(
            f"{key} = {v!r} must be a whole number >= {minimum}", key=key, source=source
        )


def _settings(key: str, settings: dict, params: dict, source) -> None:

    validate_settings(settings, source=f"{source}: {key}" if source else key)


def _workload(key: str, spec, params: dict, source) -> None:

    try:
        make_workload({**spec, "num_requests": 1} if isinstance(spec, dict) else spec)
        if isinstance(spec, dict) and "num_requests" in spec:
            _positive_int(f"{key}.num_requests", spec["num_requests"], source)
    except ConfigError as e:
        raise ConfigError(f"{key}: {e}", key=key, source=source) from None


def _block_sizes(key: str, sizes: list, params: dict, source) -> None:
    """Candidates may include sizes the backend rejects (the notebook shows why), but not only those."""

    for b in sizes:
        _positive_int(key, b, source)
    fields, platform = adapter.engine_fields(), adapter.platform_name()
    base = params.get("engine_settings") or {}
    ok = []
    for b in sizes:
        try:
            check_settings({**base, "block_size": b}, fields, platform)
            ok.append(b)
        except ConfigError:
            pass
    if not ok:
        raise ConfigError(
            f"{key} = {sizes!r}: none is a valid block_size on {platform}; valid here:"
            f" {valid_block_sizes(platform)}",
            key=key,
            source=source,
        )


def _choice(valid_of):
    def check(key: str, v, params: dict, source) -> None:
        valid = valid_of()
        if v not in valid:
            raise ConfigError(
                f"{key} = {v!r} is not valid"
                + did_you_mean(v, valid, f"choose one of {list(valid)}"),
                key=key,
                source=source,
            )

    return check


def _scenarios():

    return list(SCENARIOS)


def _modes():

    return list(MODES)


def _also_validate(key: str, v: dict, params: dict, source) -> None:
    valid = _scenarios()
    for name in v:
        if name not in valid:
            raise ConfigError(
                f"{key}: scenario {name!r} is unknown"
                + did_you_mean(name, valid, f"choose from {valid}"),
                key=key,
                source=source,
            )


def _model(key: str, v: str, params: dict, source) -> None:

    try:
        load_shape(v)
    except ConfigError as e:
        raise ConfigError(f"{key}: {e}", key=key, source=source) from None


def _env(key: str, v: dict, params: dict, source) -> None:
    for k, val in v.items():
        if not isinstance(k, str) or not isinstance(val, str | int | float | bool):
            raise ConfigError(
                f"{key}: {k!r} = {val!r}: environment values are text or numbers",
                key=key,
                source=source,
            )


def _positive_ints(key: str, v: list, params: dict, source) -> None:
    for x in v:
        _positive_int(key, x, source)


# (check, needs the installed vLLM)
VALUE_CHECKS = {
    "model": (_model, False),
    "claim_model": (_model, False),
    "engine_env": (_env, False),
    "workloads": (lambda k, v, p, s: [_workload(f"{k}.{n}", w, p, s) for n, w in v.items()], False),
    "concurrent_workload": (_workload, False),
    "drift_workload": (_workload, False),
    "pressure_workload": (_workload, False),
    "prefix_workload": (_workload, False),
    "mode": (_choice(_modes), False),
    "validation_mode": (_choice(_modes), False),
    "mixed_mode": (_choice(lambda: [m for m in _modes() if m != "offline"]), False),
    "compare_mode": (_choice(lambda: ["", *_modes()]), False),
    "validation_configs": (
        lambda k, v, p, s: [
            _choice(lambda: ["chosen", "default", "article"])(k, x, p, s) for x in v
        ],
        False,
    ),
    "server_env": (_env, False),
    "scenario": (_choice(_scenarios), False),
    "also_validate": (_also_validate, False),
    "max_num_batched_tokens_values": (_positive_ints, False),
    "engine_settings": (_settings, True),
    "pressure_settings": (
        lambda k, v, p, s: _settings(k, {**(p.get("engine_settings") or {}), **v}, p, s),
        True,
    ),
    "block_sizes": (_block_sizes, True),
}


def check_values(notebook: str, params: dict, source: str | None = None, engine: bool = True):
    """The values' own rules (engine settings against the installed vLLM, workloads, choices)."""
    for key, value in params.items():
        if value is None:
            continue
        if key == "repeats" or key.endswith("_repeats"):
            # 05's check_repeats 0: vLLM's client only, no held-out searches
            _positive_int(key, value, source, minimum=0 if key == "check_repeats" else 1)
        check = VALUE_CHECKS.get(key)
        if check is not None and (engine or not check[1]):
            check[0](key, value, params, source)


# --------------------------------------------------------------------------- in the notebook
INTERACTIVE_RUN_DIR = REPO_ROOT / "runs" / "interactive"


def run_folder(run_dir: str) -> str:
    """The run folder a notebook writes to: ``run_dir``, or runs/interactive in this repository
    when it is empty (wherever the notebook runs from)."""
    return str(run_dir) if run_dir else str(INTERACTIVE_RUN_DIR)


def injected_names(ns: dict) -> list[str]:
    """Names papermill injected into this kernel: its ``# Parameters`` cell in the input history."""
    for src in reversed(ns.get("In") or []):
        if isinstance(src, str) and src.lstrip().startswith("# Parameters"):
            try:
                tree = ast.parse(src)
            except SyntaxError:
                return []
            return [
                t.id
                for node in tree.body
                if isinstance(node, ast.Assign)
                for t in node.targets
                if isinstance(t, ast.Name)
            ]
    return []


def check_injected(ns: dict, notebook: str, engine: bool = True) -> dict:
    """The notebook's parameters as its kernel holds them, checked as the runner checks a profile.

    papermill only warns about a parameter the notebook does not declare and runs on; this refuses
    it (with the closest declared name), and checks every declared parameter's type and value (a
    ``-p`` list arrives as text). Returns the parameters.
    """
    declared = notebook_parameters(notebook)
    for name in injected_names(ns):
        if name not in declared:
            raise ConfigError(
                f"{name!r} is not a parameter of {notebook}"
                + did_you_mean(name, declared, f"its parameters: {sorted(declared)}"),
                key=name,
                source="papermill parameters",
            )
    params = {k: ns[k] for k in declared if k in ns}
    check_params(notebook, params, source="parameters", engine=engine)
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
