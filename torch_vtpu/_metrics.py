"""Counters of what the device did, for tests, benchmarks and users."""
from typing import Any, Dict

from . import _C


def metrics() -> Dict[str, Any]:
    """ops, kernels_launched, fused_kernels, compiles, cache_hits{memory,disk,shared},
    cache_misses, host_fallback_ops{name: count}, syncs{reason: count}."""
    return _C._metrics()


def reset_metrics() -> None:
    _C._reset_metrics()
