"""Counters of what the device did, for tests, benchmarks and users."""
import sys
from typing import Any, Dict

from . import _C


def metrics() -> Dict[str, Any]:
    """ops, kernels_launched, fused_kernels, compiles, cache_hits{memory,disk,shared},
    cache_misses, host_fallback_ops{name: count}, syncs{reason: count}; and, once
    torch.compile has used the vtpu backend, compiled{graphs{forward, backward,
    inference}, graph_runs}."""
    values = _C._metrics()
    program = sys.modules.get("torch_vtpu.compiler.program")
    if program is not None:
        values["compiled"] = program.counters()
    return values


def reset_metrics() -> None:
    _C._reset_metrics()
    program = sys.modules.get("torch_vtpu.compiler.program")
    if program is not None:
        program._reset()
