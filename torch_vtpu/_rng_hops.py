"""vtpu implementations of torch's RNG higher-order ops.

Activation checkpointing under torch.compile wraps each random op of the
checkpointed region in ``run_and_save_rng_state`` (forward: save the device's
RNG state, run the op) and ``run_with_rng_state`` (recomputation: run the op
from that state), so the recomputed dropout mask is the forward's. torch
implements both for cuda, cpu, hpu and xpu only: a vtpu graph failed with
"Backend not supported for vtpu". Their BackendSelect kernels pick the
implementation from a table local to torch, so vtpu's is put in front of
them: vtpu tensors take these, every other device the original kernel.
Installed when torch_vtpu is imported, applied when torch imports the prims.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch._C import DispatchKey


def _run_and_save(op: Callable, *args: Any, **kwargs: Any) -> Any:
    return torch.vtpu.get_rng_state(), op(*args, **kwargs)


def _run_with(rng_state: torch.Tensor, op: Callable, *args: Any, **kwargs: Any) -> Any:
    current = torch.vtpu.get_rng_state()
    torch.vtpu.set_rng_state(rng_state.cpu())
    try:
        return op(*args, **kwargs)
    finally:
        torch.vtpu.set_rng_state(current)


def _on_vtpu(args: tuple, kwargs: dict) -> bool:
    from torch._prims.rng_prims import get_device

    return get_device(args, kwargs) == "vtpu"


def _patch(rng_prims: Any) -> None:
    """Idempotent; a torch without these ops (or with another layout) is left alone."""
    for name, vtpu_impl, state_first in (("run_and_save_rng_state", _run_and_save, False),
                                         ("run_with_rng_state", _run_with, True)):
        hop = getattr(rng_prims, name, None)
        kernels = getattr(hop, "py_kernels", None)
        original = kernels.get(DispatchKey.BackendSelect) if isinstance(kernels, dict) else None
        if original is None or getattr(original, "_vtpu", False):
            continue

        def backend_select(*args: Any, _original=original, _impl=vtpu_impl, _state_first=state_first,
                           **kwargs: Any) -> Any:
            op_args = args[2:] if _state_first else args[1:]  # (rng_state,) op, *args
            if _on_vtpu(op_args, kwargs):
                return _impl(*args, **kwargs)
            return _original(*args, **kwargs)

        backend_select._vtpu = True  # type: ignore[attr-defined]
        kernels[DispatchKey.BackendSelect] = backend_select
        hop._dispatch_cache.clear()


def install() -> None:
    """Applies the patch whenever torch's RNG prims are imported (at once if they
    are): checkpointing under any torch.compile backend, not only "vtpu"."""
    from . import _import_patches

    _import_patches.on_import("torch._prims.rng_prims", _patch)
