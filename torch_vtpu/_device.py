"""The device module registered as ``torch.vtpu`` (the CUDA-like API)."""
import contextlib
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from . import _C

_DeviceLike = Union[int, str, torch.device, None]


def _check_device(device: _DeviceLike) -> None:
    if device is None:
        return
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "vtpu":
            raise ValueError(f"expected a vtpu device, got {device}")
        index = device.index
    elif isinstance(device, int):
        index = device
    else:
        raise TypeError(f"expected a device, int or str, got {type(device).__name__}")
    if index not in (None, 0, -1):
        # RuntimeError as CUDA's "invalid device ordinal" (an AcceleratorError)
        raise RuntimeError(f"vtpu: invalid device index {index}; this process has 1 vtpu device (vtpu:0)")


def is_available() -> bool:
    return True


def device_count() -> int:
    return 1


def current_device() -> int:
    return 0


def set_device(device: _DeviceLike) -> None:
    _check_device(device)


class device:  # noqa: N801 - mirrors torch.cuda.device
    """Context manager selecting a vtpu device (there is one: vtpu:0)."""

    def __init__(self, device: _DeviceLike):
        _check_device(device)

    def __enter__(self) -> "device":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class device_of(device):  # noqa: N801 - mirrors torch.cuda.device_of
    """Context manager selecting the device of a tensor (a CPU tensor: no change)."""

    def __init__(self, obj: torch.Tensor):
        super().__init__(obj.device.index if obj.device.type == "vtpu" else None)


def synchronize(device: _DeviceLike = None) -> None:
    """Wait for all queued vtpu work; raise the first error it hit."""
    _check_device(device)
    _C._synchronize()


_SYNC_DEBUG_MODES = {"default": 0, "warn": 1, "error": 2}


def set_sync_debug_mode(debug_mode: Union[int, str]) -> None:
    """Warn about, or refuse, operations that make the host wait for the device.

    As ``torch.cuda.set_sync_debug_mode``: ``"default"`` or 0 allows them
    silently, ``"warn"`` or 1 warns (UserWarning) at each one, ``"error"`` or 2
    raises RuntimeError before it waits, leaving queued and fused work as it
    was. Reported: host reads (``.item()``, ``.cpu()``, ``.tolist()``,
    printing), blocking uploads too large to queue, ops whose output shape
    depends on the values (``nonzero``, ``masked_select``, ``unique``) and
    other ops that run at once on the host. Not reported: the waits asked for
    (``torch.vtpu.synchronize()``, stream and event synchronisation,
    ``empty_cache()``, switching modes, collectives). The setting is
    process-wide.
    """
    if isinstance(debug_mode, str):
        if debug_mode not in _SYNC_DEBUG_MODES:
            # RuntimeError, as torch.cuda.set_sync_debug_mode raises
            raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, `error`")
        debug_mode = _SYNC_DEBUG_MODES[debug_mode]
    elif isinstance(debug_mode, bool) or not isinstance(debug_mode, int):
        raise TypeError(f"debug_mode must be an int or a str, got {type(debug_mode).__name__}")
    if debug_mode not in (0, 1, 2):
        raise RuntimeError(f"invalid value of debug_mode {debug_mode}, expected 0, 1 or 2")
    _C._set_sync_debug_mode(debug_mode)


@contextlib.contextmanager
def _sync_debug_exempt():
    """This thread's host reads pass set_sync_debug_mode unreported: vtpu's own reads
    on the user's behalf (debug mode's CPU cross-check, pickling for another process)."""
    before = _C._set_sync_debug_exempt(True)
    try:
        yield
    finally:
        _C._set_sync_debug_exempt(before)


def get_sync_debug_mode() -> int:
    """The level torch.vtpu.set_sync_debug_mode set: 0 default, 1 warn, 2 error."""
    return _C._get_sync_debug_mode()


def is_initialized() -> bool:
    return True


# The device is ready at import. torch.utils.checkpoint saves and restores a
# device's RNG state only when its module says `_initialized` (as torch.cuda
# does after lazy init): without it dropout inside a checkpoint drew a new mask
# on recomputation and the gradients were wrong.
_initialized = True


def _lazy_init() -> None:
    return None


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def get_amp_supported_dtype() -> List[torch.dtype]:
    # float32 as CUDA allows it: autocast to float32 runs the lower-precision
    # ops of a bfloat16/float16 model in float32 (CPU autocast refuses it).
    return [torch.bfloat16, torch.float16, torch.float32]


def _is_in_bad_fork() -> bool:
    # The device stream is a thread, which a forked child does not have: the
    # child may not use the device (it raises, as CUDA does). DataLoader workers
    # that only touch CPU tensors fork safely.
    return _C._in_forked_child()


# ---- random ----------------------------------------------------------------

def _generator() -> torch.Generator:
    return _C._default_generator()


def __getattr__(name: str) -> Any:
    # torch.cuda.default_generators: one per device, made when asked for.
    if name == "default_generators":
        return (_generator(),)
    raise AttributeError(f"module 'torch.vtpu' has no attribute '{name}'")


def manual_seed(seed: int) -> None:
    _generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    manual_seed(seed)


def seed() -> None:
    _generator().seed()


def seed_all() -> None:
    seed()


def initial_seed() -> int:
    return _generator().initial_seed()


def get_rng_state(device: _DeviceLike = "vtpu") -> torch.Tensor:
    _check_device(device)
    return _generator().get_state()


def set_rng_state(new_state: torch.Tensor, device: _DeviceLike = "vtpu") -> None:
    _check_device(device)
    if not isinstance(new_state, torch.Tensor):
        raise TypeError(f"rng state must be a torch.ByteTensor, got {type(new_state).__name__}")
    _generator().set_state(new_state.cpu().contiguous())  # as torch.cuda's: any layout, any device


def get_rng_state_all() -> List[torch.Tensor]:
    return [get_rng_state()]


def set_rng_state_all(new_states: List[torch.Tensor]) -> None:
    set_rng_state(new_states[0])


# ---- memory ----------------------------------------------------------------

def memory_stats(device: _DeviceLike = None) -> Dict[str, int]:
    """The allocator's counters under CUDA's names ("allocated_bytes.all.current",
    "allocated_bytes.all.peak", "num_ooms", ...: code written for
    torch.cuda.memory_stats reads them unchanged), plus vtpu's own flat names
    (allocated_bytes, peak_allocated_bytes, reserved_bytes, capacity_bytes, ...)."""
    _check_device(device)
    stats = dict(torch.accelerator.memory_stats(torch.device("vtpu", 0)))
    stats.update(_C._memory_stats())
    return stats


def memory_allocated(device: _DeviceLike = None) -> int:
    _check_device(device)
    return _C._memory_stats()["allocated_bytes"]


def max_memory_allocated(device: _DeviceLike = None) -> int:
    _check_device(device)
    return _C._memory_stats()["peak_allocated_bytes"]


def memory_reserved(device: _DeviceLike = None) -> int:
    _check_device(device)
    return _C._memory_stats()["reserved_bytes"]


def max_memory_reserved(device: _DeviceLike = None) -> int:
    _check_device(device)
    return _C._memory_stats()["peak_reserved_bytes"]


def reset_peak_memory_stats(device: _DeviceLike = None) -> None:
    _check_device(device)
    _C._reset_peak_memory_stats()


def reset_max_memory_allocated(device: _DeviceLike = None) -> None:
    """CUDA's older name: resets every peak counter, as reset_peak_memory_stats."""
    reset_peak_memory_stats(device)


def empty_cache() -> None:
    _C._empty_cache()


def mem_get_info(device: _DeviceLike = None) -> Tuple[int, int]:
    """(free, total) bytes of device capacity (VTPU_MEMORY_LIMIT or a share of RAM)."""
    stats = memory_stats(device)
    total = stats["capacity_bytes"]
    return max(total - stats["reserved_bytes"], 0), total


def set_memory_limit(limit: Union[int, str]) -> None:
    """Change the device capacity at run time, e.g. ``"8GiB"``."""
    _C._set_memory_limit(str(limit))


def set_per_process_memory_fraction(fraction: float, device: _DeviceLike = None) -> None:
    """As ``torch.cuda.set_per_process_memory_fraction``: the device may hold at
    most ``fraction`` of its total memory, which for vtpu is the host's RAM."""
    _check_device(device)
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    set_memory_limit(int(_C._physical_memory() * fraction))


def reset_accumulated_memory_stats(device: _DeviceLike = None) -> None:
    _check_device(device)
    torch.accelerator.reset_accumulated_memory_stats(torch.device("vtpu", 0))


def memory_summary(device: _DeviceLike = None, abbreviated: bool = False) -> str:
    """A readable table of the allocator's counters (``torch.cuda.memory_summary``'s
    role; vtpu's allocator has one pool, so one row per counter)."""
    stats = memory_stats(device)

    def size(n: int) -> str:
        for unit in ("B", "KiB", "MiB", "GiB"):
            if abs(n) < 1024 or unit == "GiB":
                return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
            n /= 1024
        return str(n)

    rows = [("Allocated memory", size(stats["allocated_bytes"]), size(stats["peak_allocated_bytes"])),
            ("Reserved memory", size(stats["reserved_bytes"]), size(stats["peak_reserved_bytes"])),
            ("Device capacity", size(stats["capacity_bytes"]), ""),
            ("Out-of-memory errors", str(stats.get("num_ooms", 0)), "")]
    lines = ["vtpu memory summary (device vtpu:0)", f"{'':24}{'current':>14}{'peak':>14}"]
    lines += [f"{name:24}{current:>14}{peak:>14}" for name, current, peak in rows]
    return "\n".join(lines) + "\n"


OutOfMemoryError = torch.OutOfMemoryError


# ---- device properties ---------------------------------------------------------

class VtpuDeviceProperties:
    """What ``torch.vtpu.get_device_properties`` answers (the fields of
    ``torch.cuda``'s that mean something here): the device runs on the host CPU,
    its memory is the host's RAM up to the device capacity."""

    def __init__(self) -> None:
        self.name = get_device_name()
        self.type = "vtpu"
        self.total_memory = memory_stats()["capacity_bytes"]
        self.multi_processor_count = torch.get_num_threads()

    def __repr__(self) -> str:
        return (f"VtpuDeviceProperties(name='{self.name}', total_memory={self.total_memory // 2**20}MB, "
                f"multi_processor_count={self.multi_processor_count})")


def _host_cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


def get_device_name(device: _DeviceLike = None) -> str:
    _check_device(device)
    return f"vTPU (host CPU: {_host_cpu_name()})"


def get_device_properties(device: _DeviceLike = None) -> VtpuDeviceProperties:
    _check_device(device)
    return VtpuDeviceProperties()


# ---- streams and events ------------------------------------------------------

def current_stream(device: _DeviceLike = None) -> "Stream":
    _check_device(device)
    return Stream()


def default_stream(device: _DeviceLike = None) -> torch.Stream:
    return current_stream(device)


def set_stream(stream: torch.Stream) -> None:
    """As ``torch.cuda.set_stream``; vtpu's one stream is always current."""
    if torch.device(stream.device).type != "vtpu":
        raise ValueError(f"expected a vtpu stream, got a stream of {stream.device}")
    _check_device(stream.device_index)


class Stream(torch.Stream):
    """As ``torch.cuda.Stream``: a stream of a vtpu device. vTPU has one
    in-order stream, so every stream object is that stream; ``priority`` is
    accepted and changes nothing (there is no other stream to run before).
    Another device type raises ValueError, a missing index RuntimeError, as
    CUDA's do (``torch.Stream`` itself takes any device: it gave a CPU
    stream for ``device="cpu"``)."""

    def __new__(cls, device: _DeviceLike = None, priority: int = 0, **kwargs: Any) -> "Stream":
        if kwargs:  # torch.Stream's (stream_id, device_index, device_type) form
            stream = super().__new__(cls, priority=priority, **kwargs)
            if stream.device.type != "vtpu":
                raise ValueError(f"expected a vtpu stream, got a stream of {stream.device}")
            _check_device(stream.device_index)
            return stream
        _check_device(device)
        return super().__new__(cls, device="vtpu", priority=priority)


class _VtpuEventType(type):
    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, torch.Event) and obj.device.type == "vtpu"


class Event(metaclass=_VtpuEventType):
    """As ``torch.cuda.Event``: an event of a vtpu device (``device``, when
    given, must name one; ``torch.Event`` accepted any index). It makes a
    plain ``torch.Event``, not a subclass instance: torch's event methods
    accept only that exact type as their other event (``elapsed_time``)."""

    def __new__(cls, device: _DeviceLike = None, **kwargs: Any) -> torch.Event:  # type: ignore[misc]
        _check_device(device)
        return torch.Event(device="vtpu", **kwargs)


class StreamContext:
    """``with torch.vtpu.stream(s):`` as ``torch.cuda.stream``: makes ``s``
    the current stream inside the block (``None``: no change). vtpu has one
    in-order stream, so every stream object is that stream; a stream of
    another device raises as CUDA's does."""

    def __init__(self, stream: Optional[torch.Stream]):
        if stream is not None and torch.device(stream.device).type != "vtpu":
            raise ValueError(f"expected a vtpu stream, got a stream of {stream.device}")
        self.stream = stream

    def __enter__(self) -> Optional[torch.Stream]:
        if self.stream is not None:
            self.stream.__enter__()
        return self.stream

    def __exit__(self, *exc) -> None:
        if self.stream is not None:
            self.stream.__exit__(*exc)


def stream(stream: Optional[torch.Stream]) -> StreamContext:
    return StreamContext(stream)
