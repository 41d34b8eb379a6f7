"""Execution modes: debug (synchronous, op by op), strict (default: asynchronous,
one kernel per op) and fused (elementwise ops recorded into a window and fused
into few kernels at flush points, bitwise equal to strict; see
docs/architecture.md, "Fused eager")."""
import contextlib
import os
import warnings
from typing import Iterator

from . import _C

MODES = ("debug", "strict", "fused")


def set_mode(name: str) -> None:
    """Switch the execution mode for the whole process."""
    if not isinstance(name, str):
        raise TypeError(f"vtpu mode must be a str, got {type(name).__name__}")
    if name not in MODES:
        raise ValueError(f"unknown vtpu mode {name!r}: expected one of {', '.join(MODES)}")
    _C._set_mode(name)
    from . import debug

    debug._sync_checker()  # debug mode's per-op checks come and go with it


def get_mode() -> str:
    return _C._get_mode()


@contextlib.contextmanager
def mode(name: str) -> Iterator[None]:
    """Run a block in another mode; the previous mode is restored on exit, also on error."""
    previous = get_mode()
    set_mode(name)
    try:
        yield
    finally:
        set_mode(previous)


def fused_min_elements() -> int:
    """Fused mode records an op into its window only if its result has at least this many
    elements, or the window already holds work; otherwise it launches as in strict mode
    (same kernel, same bits). Default 4096, or ``VTPU_FUSED_MIN_ELEMENTS``; 0 records every
    op. On the host target recording costs the issuing thread more than the launch it
    saves, which only pays when there is device work to save (docs/architecture.md)."""
    return _C._fused_min_elements()


def set_fused_min_elements(elements: int) -> None:
    """Set the bound of ``fused_min_elements()`` for the process."""
    if isinstance(elements, bool) or not isinstance(elements, int):
        raise TypeError(f"fused_min_elements must be an int, got {type(elements).__name__}")
    if elements < 0:
        raise ValueError(f"fused_min_elements must be >= 0, got {elements}")
    _C._set_fused_min_elements(elements)


def flush() -> None:
    """An explicit flush point: launch fused mode's pending window, wait for all
    queued device work and raise its first error."""
    _C._synchronize()


def _apply_env_mode() -> None:
    requested = os.environ.get("VTPU_MODE", "")
    if requested and requested not in MODES:
        warnings.warn(
            f"VTPU_MODE={requested!r} is not one of {', '.join(MODES)}; using 'strict'",
            RuntimeWarning,
            stacklevel=3,
        )
