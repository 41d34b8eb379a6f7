"""Alignment advisor: how well a model's matmul-like ops fill a target's matrix unit.

    report = torch_vtpu.advise(model, example_inputs, target="tpu-v5e")
    print(report)            # a table
    report.findings          # [{op, shapes, dim, utilization, location, suggestion, count}]

Every matmul-like op is a GEMM (M x K) @ (K x N). A systolic matrix unit holds a
K x N tile of the weights-stationary operand and streams the M rows through it,
so K and N are padded up to the tile and M is not: utilisation =
u(K) * u(N), u(d) = d / (ceil(d / tile) * tile). Conv is the GEMM
(N*Ho*Wo) x (Cin/groups*kh*kw) @ (.. x Cout/groups). Attention is two GEMMs:
Q K^T (K = head_dim, N = kv length) and P V (K = kv length, N = head_dim).
Assumptions per target are in docs/debugging.md.
"""
import math
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from . import _C

__all__ = ["advise", "AdvisorReport", "TargetProfile", "profile", "TARGETS"]


@dataclass(frozen=True)
class TargetProfile:
    name: str
    k_tile: int  # contraction dim granularity
    n_tile: int  # output-width granularity
    unit: str    # what the tile is, for the report


def _host_profile() -> TargetProfile:
    # float32 SIMD lanes of the ISA ATen dispatches to; its GEMM microkernels
    # (MKL/oneDNN) vectorise N over whole registers, and a ragged N runs a
    # masked tail. K is a scalar broadcast loop: any K is full speed.
    capability = torch.backends.cpu.get_cpu_capability()
    lanes = {"AVX512": 16, "AVX2": 8}.get(capability, 4)
    return TargetProfile("host", 1, lanes, f"{capability} GEMM microkernel, {lanes} float32 lanes")


_FIXED = {
    "tpu-v5e": TargetProfile("tpu-v5e", 128, 128, "128x128 MXU"),
    "tpu-v6e": TargetProfile("tpu-v6e", 256, 256, "256x256 MXU"),
    "tpu-v7": TargetProfile("tpu-v7", 256, 256, "256x256 MXU"),
    # Hopper tensor cores via cuBLAS/CUTLASS: 64-element (128-byte bf16) K and N
    # granules avoid tile quantisation (see docs/debugging.md for the source).
    "h200": TargetProfile("h200", 64, 64, "tensor-core tile (64-element K/N granule)"),
}
TARGETS = ("host",) + tuple(_FIXED)


def profile(target: str) -> TargetProfile:
    if not isinstance(target, str):
        raise TypeError(f"target must be a str, got {type(target).__name__}")
    if target == "host":
        return _host_profile()
    if target not in _FIXED:
        raise ValueError(f"unknown target {target!r}: expected one of {', '.join(TARGETS)}")
    return _FIXED[target]


def _util(d: int, tile: int) -> float:
    if d <= 0:
        return 1.0
    return d / (math.ceil(d / tile) * tile)


def _suggest(dim_name: str, d: int, tile: int, unit: str) -> str:
    if d < tile:
        text = f"{dim_name} {d} fills {d}/{tile} of the {unit}: use {dim_name} {tile} (or a multiple)"
        if tile % d == 0:
            text += f", or pack {tile // d} of them into one pass"
        return text
    return f"pad {dim_name} {d} to {math.ceil(d / tile) * tile} (a multiple of {tile})"


def _gemm(op: str, shapes: List[Tuple[int, ...]], k: Tuple[str, int], n: Tuple[str, int],
          prof: TargetProfile, location: str) -> Dict[str, Any]:
    uk, un = _util(k[1], prof.k_tile), _util(n[1], prof.n_tile)
    off = [(name, d, tile, u) for (name, d), tile, u in ((k, prof.k_tile, uk), (n, prof.n_tile, un)) if u < 1.0]
    dim = ", ".join(f"{name}={d}" for name, d, _, _ in off)
    suggestion = "; ".join(_suggest(name, d, tile, prof.unit) for name, d, tile, _ in off) or "aligned"
    return {"op": op, "shapes": shapes, "dim": dim, "utilization": uk * un, "location": location,
            "suggestion": suggestion}


def _location(site: Optional[Tuple[str, int, str]]) -> str:
    return "autograd backward / no Python frame" if site is None else f"{site[0]}:{site[1]} in {site[2]}"


def _matmul_dims(a: Sequence[int], b: Sequence[int]) -> Tuple[int, int]:
    k = a[-1]
    n = b[-1] if len(b) >= 2 else 1
    return k, n


def _sdpa(op, q, k, v, prof, where) -> List[Dict[str, Any]]:
    shapes = [tuple(q.shape), tuple(k.shape), tuple(v.shape)]
    head_dim, kv_len, v_dim = q.shape[-1], k.shape[-2], v.shape[-1]
    return [_gemm(f"{op} (Q@K^T)", shapes, ("head_dim", head_dim), ("kv_len", kv_len), prof, where),
            _gemm(f"{op} (P@V)", shapes, ("kv_len", kv_len), ("head_dim", v_dim), prof, where)]


def _conv(op, x, w, out, groups, prof, where) -> List[Dict[str, Any]]:
    # Implicit GEMM: (N*spatial_out) x (Cin/g * kernel) @ (.. x Cout/g).
    k = math.prod(w.shape[1:])
    n = w.shape[0] // max(groups, 1)
    return [_gemm(op, [tuple(x.shape), tuple(w.shape)], ("Cin*kernel", k), ("Cout", n), prof, where)]


def function_gemms(func, args, kwargs, out, prof, site) -> List[Dict[str, Any]]:
    """Findings for a torch-function-level call (names users wrote)."""
    where = _location(site)

    def a(i: int, name: str) -> Any:
        return args[i] if len(args) > i else kwargs[name]

    if func is F.linear:
        x, w = a(0, "input"), a(1, "weight")
        return [_gemm("linear", [tuple(x.shape), tuple(w.shape)], ("in_features", w.shape[-1]),
                      ("out_features", w.shape[0] if w.dim() == 2 else 1), prof, where)]
    if func in _MATMULS:
        if func in (torch.addmm, torch.baddbmm, torch.Tensor.addmm, torch.Tensor.baddbmm):
            x, y = a(1, "mat1" if "addmm" in func.__name__ else "batch1"), a(2, "mat2" if "addmm" in func.__name__ else "batch2")
        else:
            x, y = a(0, "input"), a(1, "other")
        if func is torch.Tensor.__rmatmul__:
            x, y = y, x
        k, n = _matmul_dims(x.shape, y.shape)
        name = getattr(func, "__name__", "matmul").strip("_")
        return [_gemm(name, [tuple(x.shape), tuple(y.shape)], ("K", k), ("N", n), prof, where)]
    if func is F.scaled_dot_product_attention:
        return _sdpa("scaled_dot_product_attention", a(0, "query"), a(1, "key"), a(2, "value"), prof, where)
    if func in _CONVS:
        groups = args[6] if len(args) > 6 else kwargs.get("groups", 1)
        return _conv(func.__name__, a(0, "input"), a(1, "weight"), out, groups, prof, where)
    return []


_MATMULS = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__,
            torch.mm, torch.Tensor.mm, torch.bmm, torch.Tensor.bmm, torch.addmm, torch.Tensor.addmm,
            torch.baddbmm, torch.Tensor.baddbmm}
_CONVS = {F.conv1d, F.conv2d, F.conv3d}


def aten_gemms(func, args, out, prof, site) -> List[Dict[str, Any]]:
    """Findings for an ATen op seen by debug mode's dispatch-level checker."""
    where = _location(site)
    name = func._schema.name.split("::")[-1]
    if name in ("mm", "bmm"):
        k, n = _matmul_dims(args[0].shape, args[1].shape)
        return [_gemm(name, [tuple(args[0].shape), tuple(args[1].shape)], ("K", k), ("N", n), prof, where)]
    if name in ("addmm", "baddbmm"):
        k, n = _matmul_dims(args[1].shape, args[2].shape)
        return [_gemm(name, [tuple(args[1].shape), tuple(args[2].shape)], ("K", k), ("N", n), prof, where)]
    if name.startswith("_scaled_dot_product") and "backward" not in name:
        return _sdpa("scaled_dot_product_attention", args[0], args[1], args[2], prof, where)
    if name in ("convolution", "convolution_overrideable") and not args[6]:
        return _conv("convolution", args[0], args[1], out, args[8], prof, where)
    return []


class AdvisorReport:
    """What `advise` found: `findings` (list of dicts) and a readable table as str()."""

    def __init__(self, target: TargetProfile, findings: List[Dict[str, Any]]):
        self.target = target.name
        self.profile = target
        self.findings = findings

    def __repr__(self) -> str:
        return f"AdvisorReport(target={self.target!r}, findings={len(self.findings)})"

    def __str__(self) -> str:
        header = ("op", "shapes", "off-tile dims", "util", "calls", "location", "suggestion")
        rows = [(f["op"], " x ".join(str(list(s)) for s in f["shapes"]), f["dim"] or "-",
                 f"{f['utilization']:.0%}", str(f["count"]), f["location"], f["suggestion"])
                for f in self.findings]
        widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header) - 1)]
        lines = [f"alignment report for {self.target} ({self.profile.unit}; K tile {self.profile.k_tile}, "
                 f"N tile {self.profile.n_tile})"]
        for r in [header] + rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
        if not rows:
            lines.append("(no matmul-like ops ran)")
        return "\n".join(lines)


class _Recorder(TorchFunctionMode):
    def __init__(self, prof: TargetProfile):
        super().__init__()
        self.prof = prof
        self.findings: Dict[Tuple, Dict[str, Any]] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is F.linear or func in _MATMULS or func is F.scaled_dot_product_attention or func in _CONVS:
            for f in function_gemms(func, args, kwargs, out, self.prof, _C._call_site()):
                key = (f["op"], tuple(f["shapes"]), f["location"])
                if key in self.findings:
                    self.findings[key]["count"] += 1
                else:
                    self.findings[key] = dict(f, count=1)
        return out


def advise(model: Any, example_inputs: Any, target: str = "host") -> AdvisorReport:
    """Run `model` once on `example_inputs` (a tensor, a tuple/list of positional
    arguments or a dict of keyword arguments) and report, for every matmul-like op,
    how well its shapes fill `target`'s tile: "host", "tpu-v5e", "tpu-v6e",
    "tpu-v7" or "h200". Worst utilisation first."""
    prof = profile(target)
    if not callable(model):
        raise TypeError(f"model must be callable (an nn.Module or function), got {type(model).__name__}")
    if isinstance(example_inputs, torch.Tensor):
        args, kwargs = (example_inputs,), {}
    elif isinstance(example_inputs, (tuple, list)):
        args, kwargs = tuple(example_inputs), {}
    elif isinstance(example_inputs, dict):
        args, kwargs = (), dict(example_inputs)
    else:
        raise TypeError("example_inputs must be a tensor, a tuple/list of arguments or a dict of "
                        f"keyword arguments, got {type(example_inputs).__name__}")
    recorder = _Recorder(prof)
    with torch.no_grad(), recorder:
        model(*args, **kwargs)
    findings = sorted(recorder.findings.values(), key=lambda f: f["utilization"])
    return AdvisorReport(prof, findings)
