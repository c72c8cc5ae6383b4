"""The exception hierarchy of warp-providers.

Owns: WarpError and its subclasses, and `from_status`, the one mapping from an engine
status code to an exception (used by the binding's `_check`). Adapters translate these at
their edge; the core never swallows them. Cancellation is `Cancelled`, not an error.
"""

from __future__ import annotations

__all__ = [
    "Cancelled",
    "ContextOverflowError",
    "EngineIOError",
    "MemoryBudgetError",
    "ModelFormatError",
    "ModelNotFoundError",
    "StateMismatchError",
    "UnsupportedModelError",
    "WarpError",
    "from_status",
]

# Engine status codes (engine/include/wp.h).
WP_E_IO = -1
WP_E_FORMAT = -2
WP_E_BUDGET = -3
WP_E_OOM = -4
WP_E_ARG = -5
WP_E_UNSUPPORTED = -6
WP_E_CANCELLED = -7
WP_E_CONTEXT_FULL = -8
WP_E_STATE = -9


class WarpError(Exception):
    """An error reported by the engine or the core.

    Attributes:
        status: the engine status name (e.g. ``"WP_E_FORMAT"``), or ``None`` for errors
            raised in Python.
        detail: what exactly failed (the file, tensor, record or position).
    """

    def __init__(self, detail: str, status: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status


class ModelFormatError(WarpError, ValueError):
    """The container (or a state file) is malformed or of another format version."""


class ModelNotFoundError(WarpError, FileNotFoundError):
    """The model path does not exist or a file the container names is missing."""


class EngineIOError(WarpError, OSError):
    """A read failed or a record failed validation (the detail names layer and expert)."""


class MemoryBudgetError(WarpError, MemoryError):
    """The RAM budget is below the floor the model needs, or an allocation failed."""


class UnsupportedModelError(WarpError):
    """The model type, a data type or a feature is not supported."""


class ContextOverflowError(WarpError, ValueError):
    """The tokens do not fit in the context window."""


class StateMismatchError(WarpError, ValueError):
    """A saved state belongs to another model or shape."""


class ImageError(WarpError, ValueError):
    """An image cannot be used: unsupported format, corrupt data, too large, or refused."""


class Cancelled(Exception):  # noqa: N818 - not an error: the caller asked to stop
    """A generation was cancelled by its caller."""


_BY_STATUS: dict[int, type[WarpError]] = {
    WP_E_IO: EngineIOError,
    WP_E_FORMAT: ModelFormatError,
    WP_E_BUDGET: MemoryBudgetError,
    WP_E_OOM: MemoryBudgetError,
    WP_E_UNSUPPORTED: UnsupportedModelError,
    WP_E_CONTEXT_FULL: ContextOverflowError,
    WP_E_STATE: StateMismatchError,
}


def from_status(status: int, name: str, detail: str) -> BaseException:
    """Maps an engine status to the exception to raise.

    Args:
        status: the negative wp_status value.
        name: the status name from wp_strerror.
        detail: the engine's error detail.

    Returns:
        The exception instance (not raised).
    """
    text = detail or name
    if status == WP_E_ARG:
        return ValueError(text)
    if status == WP_E_CANCELLED:
        return Cancelled(text)
    return _BY_STATUS.get(status, WarpError)(text, name)
