"""The vtpu backend of torch.compile: ``torch.compile(model, backend="vtpu")``.

Dynamo captures FX graphs; AOTAutograd turns each into a forward and a backward
graph of core ATen ops (decompositions.py); each graph is scheduled
(schedule.py), generated as one program bound to the dispatcher (codegen.py:
a native list of calls run from C++, or a Python function where the graph needs
Python) and run in fused execution (program.py): its elementwise ops are
fused into few generated kernels, matrix work runs on the extern kernels, and
ops outside the compiled set on the host-kernel path. Kernels come from the
compile cache eager mode uses, so a warm process compiles nothing.

Options (``options={...}``): see options.CompileOptions."""
from __future__ import annotations

import functools
from typing import Any, Callable, List, Mapping, Optional, Sequence

import torch
import torch.fx as fx

from .decompositions import interpolation_kept_whole, vtpu_decompositions
from .options import CompileOptions
from .program import CompiledGraph, counters

__all__ = ["vtpu_backend", "CompileOptions", "counters"]

# torch.compile's modes tune Inductor; for this backend they are all the same
# program (CUDA graphs and autotuning have no vtpu meaning).
_TORCH_COMPILE_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _graph_compiler(kind: str, options: CompileOptions) -> Callable:
    def compile_graph(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> CompiledGraph:
        return CompiledGraph(gm, kind, options)

    return compile_graph


def vtpu_backend(gm: fx.GraphModule, example_inputs: List[Any], options: Optional[Mapping[str, Any]] = None,
                 mode: Optional[str] = None) -> Callable:
    """The Dynamo backend: compiles one captured graph (and its backward)."""
    if mode not in _TORCH_COMPILE_MODES:
        raise ValueError(f"unknown torch.compile mode {mode!r} for the vtpu backend: expected one of "
                         f"{', '.join(str(m) for m in _TORCH_COMPILE_MODES[1:])}")
    parsed = CompileOptions.parse(options)
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition

    aot = aot_autograd(
        fw_compiler=_graph_compiler("forward", parsed),
        bw_compiler=_graph_compiler("backward", parsed),
        inference_compiler=_graph_compiler("inference", parsed),
        decompositions=vtpu_decompositions(),
        # recompute (the default): the min-cut partitioner (networkx, a torch
        # dependency) recomputes cheap elementwise values in the backward;
        # otherwise the forward saves every value the backward reads.
        partition_fn=min_cut_rematerialization_partition if parsed.recompute else default_partition,
        keep_inference_input_mutations=True,
    )
    # Training graphs are traced here (forward and backward together);
    # inference graphs too.
    with interpolation_kept_whole():
        return aot(gm, example_inputs)


def register() -> None:
    """Make backend="vtpu" known to Dynamo (idempotent). torch.compile finds it
    through the ``torch_dynamo_backends`` entry point even when torch_vtpu was
    not imported; this covers a source tree without installed metadata."""
    from torch._dynamo.backends import registry

    from . import device_interface

    device_interface.register()
    if "vtpu" in registry._COMPILER_FNS:
        return
    pending = registry._BACKENDS.get("vtpu")
    if pending is not None:
        return  # the entry point is known and loading it registers this function
    registry.register_backend(compiler_fn=vtpu_backend, name="vtpu")


register()
