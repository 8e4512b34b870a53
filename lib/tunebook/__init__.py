"""tunebook: a Jupyter tuning workbook for vLLM. Measure, don't guess.

Only `tunebook.engine.adapter` imports vllm in the sweep's process (`tunebook.engine.launcher` imports its CLI
in a process of its own); everything else is pure Python so that it can be tested and imported on
machines without an engine.
"""

from tunebook.core.errors import ConfigError, EngineFailure, TunebookError

__version__ = "0.1.0"
__all__ = ["ConfigError", "EngineFailure", "TunebookError", "__version__"]
