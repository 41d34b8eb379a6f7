"""Resolve MKL VML's kernel dispatch before anything can race on it.

ATen runs contiguous float and double unary ops (exp, log, sqrt, sin, tanh,
...) through MKL's vector math library, each OpenMP thread on its chunk. The
oneMKL bundled with torch's wheels picks each VML function's kernel on that
function's first call; when that first call runs on several threads at once,
one thread can compute its whole chunk with a low-accuracy kernel
(pytorch/pytorch#188792, fixed upstream by the same warm-up in #188791 and in
oneMKL >= 2025.0). Here: a fresh process's first ``x.exp()`` of 64x33 floats
gave the second half (the OpenMP helper's chunk) up to 1.5e-4 relative off,
in a few of 100 processes on a loaded 2-core host (`tools/vml_first_call_race.py`).

vTPU's host-kernel path runs these ATen kernels on the stream's thread, and
its tests compare against the CPU's results, so the import resolves every
VML function once, one element each (one thread, no race), for float32 and
float64. Values are unchanged; it only moves MKL's one-time dispatch ahead.
"""
import warnings

import torch

# ATen's unary ops that may reach MKL VML (a superset: calling an op that does
# not is harmless). Inputs of 0.5 are inside every op's domain.
_OPS = ("acos", "asin", "atan", "cos", "cosh", "erf", "erfc", "erfinv", "exp", "expm1", "log", "log10",
        "log1p", "log2", "sin", "sinh", "sqrt", "tan", "tanh", "trunc", "abs", "lgamma")

warmed = []


def warm_up() -> None:
    """Call each op once on a one-element CPU tensor of each floating dtype
    (one element: below ATen's grain, so no OpenMP thread starts at import).
    Records (op, dtype, device of the result) in ``warmed``; never raises,
    since it runs inside ``import torch`` when torch autoloads this backend."""
    try:
        for dtype in (torch.float32, torch.float64):
            x = torch.full((1,), 0.5, dtype=dtype, device="cpu")
            for name in _OPS:
                warmed.append((name, dtype, getattr(torch, name)(x).device.type))
    except Exception as error:  # a torch without one of the ops: the rest is still warm
        warnings.warn(f"torch_vtpu: MKL VML warm-up stopped early ({error}); see torch_vtpu/_mkl_vml.py")
