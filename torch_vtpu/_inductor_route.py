"""``torch.compile(model)`` with its default backend, Inductor, on vtpu tensors.

Inductor generates code for the devices it has a scheduler for (CPU, CUDA, XPU,
MPS, ...). Given a graph over vtpu tensors it failed deep in its lowering with
``InductorError: KeyError: 'vtpu'``, so ordinary model code that calls
``torch.compile(model)`` (or a library doing so for the user, such as
transformers' flex attention or ``generate`` with a compile config) could not
run on vtpu. The design's answer to full-graph compilation is vtpu's own
compiler, so a graph over vtpu tensors (inputs, or tensors the graph makes)
is handed to the vtpu backend instead, as if ``backend="vtpu"`` had been
given; every other graph is Inductor's, untouched.

Only torch.compile's own entry points are routed: they call Inductor's
``compile_fx(graph, inputs)`` with at most the settings of ``mode``/``options``
and a region name. Inductor's ahead-of-time paths (AOTInductor, standalone
compile) pass an inner compiler or other arguments and expect Inductor's
artifacts back: over vtpu tensors they raise NotImplementedError naming what
works, where Inductor failed with a KeyError.
"""
from __future__ import annotations

import functools
import logging
import warnings
from typing import Any, Callable

import torch

_ROUTABLE_KEYWORDS = frozenset({"config_patches", "compile_region_name"})
_log = logging.getLogger(__name__)
_warned_settings = False


def _is_vtpu(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.device.type == "vtpu"
    if isinstance(value, torch.device):
        return value.type == "vtpu"
    if isinstance(value, str):
        return value == "vtpu" or value.startswith("vtpu:")
    if isinstance(value, (tuple, list)):
        return any(_is_vtpu(v) for v in value)
    if isinstance(value, dict):
        return any(_is_vtpu(v) for v in value.values())
    return False


def _touches_vtpu(model_: Any, example_inputs: Any) -> bool:
    """A vtpu tensor among the inputs, or made or produced inside the graph
    (``create_block_mask(..., device="vtpu")`` compiled takes no tensor at all):
    Dynamo records every node's fake value in its meta."""
    try:
        if any(_is_vtpu(t) for t in example_inputs):
            return True
    except TypeError:
        return False
    graph = getattr(model_, "graph", None)
    for node in getattr(graph, "nodes", ()):
        if _is_vtpu(node.meta.get("example_value", node.meta.get("val"))) or _is_vtpu(node.kwargs.get("device")):
            return True
    return False


def _warn_unused_settings(config_patches: Any) -> None:
    """Inductor's settings (what ``mode`` and ``options`` become) mean nothing to
    the vtpu compiler: said once, so a tuned call does not silently do less."""
    global _warned_settings
    if not config_patches or _warned_settings:
        return
    _warned_settings = True
    warnings.warn(
        "torch.compile: graphs over vtpu tensors compile with the vtpu backend (Inductor has no vtpu "
        f"code generator); the Inductor settings {sorted(config_patches)} do not apply to them. "
        "Pass backend=\"vtpu\" to choose it explicitly, with its own options.",
        UserWarning, stacklevel=3)


def _routed(original: Callable) -> Callable:
    @functools.wraps(original)
    def compile_fx(model_: Any, example_inputs_: Any, *args: Any, **kwargs: Any) -> Any:
        if not _touches_vtpu(model_, example_inputs_):
            return original(model_, example_inputs_, *args, **kwargs)
        if args or not _ROUTABLE_KEYWORDS.issuperset(kwargs):
            # Inductor would fail in its lowering with KeyError: 'vtpu'
            raise NotImplementedError(
                "Inductor has no code generator for vtpu: ahead-of-time compilation (AOTInductor, "
                "standalone compile) of a graph over vtpu tensors is not supported. Compile for vtpu with "
                "torch.compile(model) or torch.compile(model, backend=\"vtpu\"), or export the model on the CPU.")
        _warn_unused_settings(kwargs.get("config_patches"))
        _log.info("torch.compile: a graph over vtpu tensors goes to the vtpu backend, not Inductor")
        from .compiler import vtpu_backend

        return vtpu_backend(model_, example_inputs_)

    compile_fx._vtpu_routed = True  # type: ignore[attr-defined]
    return compile_fx


def _patch(module: Any) -> None:
    original = getattr(module, "compile_fx", None)
    if original is None or getattr(original, "_vtpu_routed", False):
        return
    module.compile_fx = _routed(original)


def install() -> None:
    """Routes once ``torch._inductor.compile_fx`` is imported (at once if it is):
    torch.compile's Inductor entry points look ``compile_fx`` up there per call."""
    from . import _import_patches

    _import_patches.on_import("torch._inductor.compile_fx", _patch)
