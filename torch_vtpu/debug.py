"""Debugging tools: call sites of ops, NaN/Inf origin and CPU cross-check.

Every mode records the user's call site of each op (file, line, function of the
innermost frame outside torch and torch_vtpu), so that an error surfacing at a
later sync names the op and the line that issued it. In ``debug`` mode ops run
synchronously, so errors raise at that line; there, opt-in per-op checks:

    torch_vtpu.debug.check_nans(True)    # or VTPU_DEBUG_NANS=1
    torch_vtpu.debug.crosscheck(True)    # or VTPU_DEBUG_CROSSCHECK=1
    torch_vtpu.debug.advise_target("tpu-v5e")  # or VTPU_ADVISE_TARGET: alignment warnings

The checks run in a Python dispatch mode that exists only while debug mode and
a check are on: strict and fused mode pay nothing for them.
"""
import math
import os
import warnings
from typing import Any, Optional, Set, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map

from . import _C
from ._device import _sync_debug_exempt

__all__ = [
    "CrossCheckError",
    "AlignmentWarning",
    "capture_call_sites",
    "check_nans",
    "crosscheck",
    "advise_target",
    "call_site",
]


class CrossCheckError(RuntimeError):
    """A vtpu op's result differs from the CPU reference beyond the op's tolerance."""


class AlignmentWarning(UserWarning):
    """A matmul-like op whose shapes fill the target's matrix unit only partly."""


def _env_flag(name: str) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value not in ("", "0", "false", "no", "off"):
        warnings.warn(f"{name}={os.environ[name]!r} is not one of 1/true/yes/on or 0/false/no/off; "
                      "the check stays off", RuntimeWarning, stacklevel=2)
    return False


def _env_advise_target() -> Optional[str]:
    """VTPU_ADVISE_TARGET, checked now: a bad name made every debug-mode op raise
    "unknown target" from inside the checker, never naming the variable."""
    target = os.environ.get("VTPU_ADVISE_TARGET") or None
    if target is None:
        return None
    from .advisor import profile

    try:
        profile(target)
    except ValueError as error:
        warnings.warn(f"VTPU_ADVISE_TARGET: {error}; the alignment advisor stays off", RuntimeWarning,
                      stacklevel=2)
        return None
    return target


_state = {
    "nans": _env_flag("VTPU_DEBUG_NANS"),
    "crosscheck": _env_flag("VTPU_DEBUG_CROSSCHECK"),
    "advise_target": _env_advise_target(),
}


# Ops each check has looked at (tests use it to see that a check ran).
_counts = {"nans": 0, "crosscheck": 0}


def _check_bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{what} expects a bool, got {type(value).__name__}")
    return value


def capture_call_sites(enabled: Optional[bool] = None) -> bool:
    """Turn call-site capture on or off (default on; VTPU_CALL_SITES=0 turns it
    off). Returns the setting in force; with no argument only reports it."""
    if enabled is not None:
        _C._set_call_site_capture(_check_bool(enabled, "capture_call_sites"))
    return _C._call_site_capture()


def check_nans(enabled: bool = True) -> None:
    """In debug mode, raise FloatingPointError at the first op that produces a
    NaN or Inf from finite inputs."""
    _state["nans"] = _check_bool(enabled, "check_nans")
    _sync_checker()


def crosscheck(enabled: bool = True) -> None:
    """In debug mode, recompute every vtpu op on CPU from the same inputs and
    raise CrossCheckError at the first result outside the op's tolerance."""
    _state["crosscheck"] = _check_bool(enabled, "crosscheck")
    _sync_checker()


def advise_target(target: Optional[str]) -> None:
    """In debug mode, warn once per call site about matmul-like ops whose shapes
    fill `target`'s matrix unit only partly (see torch_vtpu.advise); None: off."""
    if target is not None:
        from .advisor import profile

        profile(target)  # validates the name
    _state["advise_target"] = target
    _sync_checker()


def call_site() -> Optional[Tuple[str, int, str]]:
    """(file, line, function) that an op issued here would record, or None."""
    return _C._call_site()


def _describe_site() -> str:
    site = _C._call_site()
    if site is None:
        return "issued from autograd backward or a thread without Python code"
    return f"issued at {site[0]}:{site[1]} in {site[2]}"


def _testing_corrupt_next(op: str) -> None:
    """Test-only: the next host-kernel-path kernel of `op` (e.g. "aten::mm")
    returns a wrong result, so tests can prove the cross-check catches it."""
    _C._debug_corrupt_next(op)


# Ops whose outputs are uninitialised memory or random by design: neither
# checked for NaN nor recomputed.
_UNCHECKED = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
              "resize_", "resize_as_", "set_", "_local_scalar_dense",
              # forward AD's zero tangents: no memory (comparing them segfaulted)
              "_efficientzerotensor")

# (rtol, atol) per dtype: torch.testing.assert_close's defaults.
_TOLERANCE = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}


def _is_vtpu(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "vtpu"


def _finite(x: Any) -> bool:
    if isinstance(x, torch.Tensor):
        if not (x.is_floating_point() or x.is_complex()) or x.numel() == 0:
            return True
        return bool(torch.isfinite(x).all().item())
    if isinstance(x, (float, complex)):
        return math.isfinite(abs(x))
    return True


def _to_cpu(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", copy=True)
    if isinstance(x, torch.device) and x.type == "vtpu":
        return torch.device("cpu")
    return x


def _shapes(flat) -> str:
    return ", ".join(str(tuple(t.shape)) for t in flat if isinstance(t, torch.Tensor)) or "none"


def _max_error(got: torch.Tensor, want: torch.Tensor) -> Tuple[bool, float]:
    if got.shape != want.shape or got.dtype != want.dtype:
        return False, math.inf
    if got.numel() == 0:
        return True, 0.0
    if got.is_floating_point() or got.is_complex():
        rtol, atol = _TOLERANCE.get(got.dtype, (1.3e-6, 1e-5))
        close = torch.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
        diff = (got.to(torch.complex128 if got.is_complex() else torch.float64)
                - want.to(torch.complex128 if got.is_complex() else torch.float64)).abs()
        diff = torch.where(torch.isnan(diff), torch.zeros_like(diff), diff)
        return bool(close.all().item()), float(diff.max().item())
    equal = torch.equal(got, want)
    err = 0.0 if equal else float((got.to(torch.float64) - want.to(torch.float64)).abs().max().item())
    return equal, err


class _Checker(TorchDispatchMode):
    """Per-op checks of debug mode: NaN/Inf origin, CPU cross-check, alignment."""

    def __init__(self):
        super().__init__()
        self.warned_sites: Set[Tuple] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _C._get_mode() != "debug":
            return func(*args, **kwargs)
        name = func._schema.name.split("::")[-1]
        flat_in, _ = tree_flatten((args, kwargs))
        touches_device = any(_is_vtpu(x) or (isinstance(x, torch.device) and x.type == "vtpu")
                             for x in flat_in)
        checked = touches_device and name not in _UNCHECKED
        nans = _state["nans"] and checked
        cross = (_state["crosscheck"] and checked
                 and torch.Tag.nondeterministic_seeded not in func.tags)
        # The checks' own ops run with every dispatch mode off: under a tracer
        # (make_fx, torch.func.linearize) they would be traced, and their
        # .item() raised "trying to get value out of a tracing tensor".
        with _disable_current_modes(), _sync_debug_exempt():
            inputs_finite = nans and all(_finite(x) for x in flat_in)
            cpu_args = tree_map(_to_cpu, (args, kwargs)) if cross else None

        out = func(*args, **kwargs)
        flat_out, _ = tree_flatten(out)

        if nans:
            _counts["nans"] += 1
        with _disable_current_modes(), _sync_debug_exempt():
            if inputs_finite:
                for o in flat_out:
                    if _is_vtpu(o) and not _finite(o):
                        raise FloatingPointError(
                            f"[{name}] produced NaN or Inf from finite inputs "
                            f"(input shapes: {_shapes(flat_in)}) ({_describe_site()})")
            if cross:
                self._crosscheck(func, name, cpu_args, flat_out)
        target = _state["advise_target"]
        if target is not None and touches_device:
            self._advise(func, args, out, target)
        return out

    def _crosscheck(self, func, name, cpu_args, flat_out) -> None:
        try:
            reference = func(*cpu_args[0], **cpu_args[1])
        except Exception:  # no CPU kernel for this form: nothing to compare with
            return
        _counts["crosscheck"] += 1
        flat_ref, _ = tree_flatten(reference)
        for got, want in zip(flat_out, flat_ref):
            if not (isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)):
                continue
            if got.device.type == "meta":  # x.to("meta"): no values to compare
                continue
            if got._is_zerotensor() or want._is_zerotensor():
                continue
            # A lazily conjugated or negated view (the CPU's `_conj` returns
            # one) compares by its stored values inside this dispatch mode:
            # materialise both sides first.
            ok, err = _max_error(got.detach().cpu().resolve_conj().resolve_neg(),
                                 want.detach().resolve_conj().resolve_neg())
            if not ok:
                raise CrossCheckError(
                    f"[{name}] vtpu result differs from the CPU reference: max abs error {err:.6g} "
                    f"(dtype {got.dtype}, shape {tuple(got.shape)}) ({_describe_site()})")

    def _advise(self, func, args, out, target) -> None:
        from .advisor import aten_gemms, profile

        site = _C._call_site()
        for finding in aten_gemms(func, args, out, profile(target), site):
            key = (site, finding["op"])
            if finding["utilization"] >= 1.0 or key in self.warned_sites:
                continue
            self.warned_sites.add(key)
            warnings.warn(AlignmentWarning(
                f"[{finding['op']}] {finding['dim']}: {finding['utilization']:.0%} of the {target} tile "
                f"({finding['location']}): {finding['suggestion']}"), stacklevel=2)


_checker: Optional[_Checker] = None


def _uninstall_checker() -> None:
    """At exit: remove the checker whatever the mode (see torch_vtpu._shutdown)."""
    global _checker
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    if _checker is not None and _get_current_dispatch_mode() is _checker:
        _checker.__exit__(None, None, None)
        _checker = None


def _sync_checker() -> None:
    """Install the checker while debug mode and a check are on; remove it otherwise."""
    global _checker
    wanted = _C._get_mode() == "debug" and (
        _state["nans"] or _state["crosscheck"] or _state["advise_target"] is not None)
    if wanted and _checker is None:
        _checker = _Checker()
        _checker.__enter__()
    elif not wanted and _checker is not None:
        from torch.utils._python_dispatch import _get_current_dispatch_mode

        if _get_current_dispatch_mode() is _checker:
            _checker.__exit__(None, None, None)
            _checker = None
        # Another mode was pushed above ours: ours stays, passing every op through
        # (it checks the mode first), and is removed at a later change.
