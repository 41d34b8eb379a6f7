"""Counters of what the device did, for tests, benchmarks and users."""
import sys
from typing import Any, Dict

from . import _C


def metrics() -> Dict[str, Any]:
    """ops, kernels_launched, fused_kernels, compiles, cache_hits{memory,disk,shared},
    cache_misses, host_fallback_ops{name: count}, host_serial_ops{name: count} (host-path
    kernels run on one thread: small, and work no faster-growing than data), syncs{reason: count},
    device_time_s{kernel class: seconds}; while per-op timing is on
    (profile_ops(True) or VTPU_PROFILE_OPS=1), device_time_by_op{op: (seconds,
    tasks)}; and, once torch.compile has used the vtpu backend,
    compiled{graphs{forward, backward, inference}, graph_runs}."""
    values = _C._metrics()
    program = sys.modules.get("torch_vtpu.compiler.program")
    if program is not None:
        values["compiled"] = program.counters()
    return values


def profile_ops(on: bool = True) -> None:
    """Time every stream task by op name (``metrics()["device_time_by_op"]``):
    where device time goes, op by op. Off by default (a lock per task)."""
    if not isinstance(on, bool):
        raise TypeError(f"profile_ops expects a bool, got {type(on).__name__}")
    _C._set_per_op_timing(on)


def reset_metrics() -> None:
    _C._reset_metrics()
    program = sys.modules.get("torch_vtpu.compiler.program")
    if program is not None:
        program._reset()
