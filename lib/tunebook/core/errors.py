"""tunebook's errors: each says what was wrong, where, and what would be valid."""

from __future__ import annotations


class TunebookError(Exception):
    """Base class for errors raised before or around an engine."""


class ConfigError(TunebookError, ValueError):
    """Bad input: a setting, parameter file, model or workload. Raised before any engine starts."""

    def __init__(self, message: str, *, key: str | None = None, source: str | None = None):
        self.key, self.source = key, source
        prefix = f"{source}: " if source else ""
        super().__init__(prefix + message)

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of the traceback: the message is the whole story (what was
        # wrong and what would be valid), and papermill repeats it as the reason a notebook failed.
        return [f"\x1b[0;31mConfigError\x1b[0m: {self}"]


class EngineFailure(TunebookError, RuntimeError):
    """An engine could not start or died during a point; carries vLLM's reason."""


class NotebookFailed(TunebookError, RuntimeError):
    """A notebook of a headless run stopped at a cell; says which, why, and where its output is."""
