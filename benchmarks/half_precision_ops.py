"""Elementwise and norm ops in bfloat16 and float16 (float32 beside them for
reference): vTPU (strict mode) against stock CPU eager, interleaved in one
process, medians of the repeats.

    .venv/bin/python benchmarks/half_precision_ops.py [--repeats 11] [--only NAME ...] [--size 2048]

The ops are the activations and transcendental functions of models run in
16 bits (GELU both ways, SiLU, sin/cos of rotary embeddings, exp, tanh,
sigmoid, erf, log), GELU's backward, layer norm and RMS norm (with a weight), on
a size x size matrix.
16-bit transcendental ops read lookup tables their kernels fill on first
use (docs/architecture.md, "Lookup tables"); layer norm runs ATen's kernel in
row blocks; RMS norm is one fused program (bridge/rms_norm_ops.cpp), whose
kernels build in the background: the warm-up waits for them. A sample is --calls calls of the op, then one synchronize; times
are per call. Ratios are vtpu / cpu: below 1 is faster than the CPU.
"""
import argparse
import math
import statistics
import sys

import torch
import torch.nn.functional as F

import torch_vtpu  # noqa: F401  (registers the device)
from torch_vtpu import _C
from reductions import timed  # this directory: a sample is `calls` calls, then one sync

CASES = {
    "gelu": lambda a, b: F.gelu(a),
    "gelu_tanh": lambda a, b: F.gelu(a, approximate="tanh"),
    "silu": lambda a, b: F.silu(a),
    "sin": lambda a, b: a.sin(),
    "cos": lambda a, b: a.cos(),
    "exp": lambda a, b: a.exp(),
    "tanh": lambda a, b: a.tanh(),
    "sigmoid": lambda a, b: a.sigmoid(),
    "erf": lambda a, b: a.erf(),
    "log": lambda a, b: a.abs().log(),
    "gelu_backward": lambda a, b: torch.ops.aten.gelu_backward(b, a),
    "layer_norm": lambda a, b: F.layer_norm(a, (a.shape[-1],)),
    "rms_norm": lambda a, b: F.rms_norm(a, (a.shape[-1],), b[0], 1e-6),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.only or []) - set(CASES))
    if unknown:
        print(f"unknown case(s) {', '.join(unknown)}; cases: {', '.join(CASES)}", file=sys.stderr)
        return 2
    if args.repeats < 1 or args.calls < 1 or args.size < 1:
        print("--repeats, --calls and --size must be positive", file=sys.stderr)
        return 2
    ratios = {}
    print(f"{'case':<15} {'dtype':<9} {'cpu ms':>8} {'vtpu ms':>8} {'vtpu/cpu':>8}")
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(args.size, args.size, generator=generator)
    y = torch.randn(args.size, args.size, generator=generator)
    for name, op in CASES.items():
        if args.only and name not in args.only:
            continue
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            a, b = x.to(dtype), y.to(dtype)
            av, bv = a.to("vtpu"), b.to("vtpu")
            sync = torch.vtpu.synchronize
            for _ in range(3):  # compiles, lookup tables, the allocator's blocks
                op(a, b)
                op(av, bv)
                sync()
                _C._wait_for_fusion_compiles()
            cpu, dev = [], []
            for _ in range(args.repeats):  # interleaved: both see the same machine
                cpu.append(timed(lambda: op(a, b), lambda: None, args.calls))
                dev.append(timed(lambda: op(av, bv), sync, args.calls))
            c, v = statistics.median(cpu) * 1e3, statistics.median(dev) * 1e3
            ratios.setdefault(dtype, []).append(v / c)
            print(f"{name:<15} {str(dtype).split('.')[-1]:<9} {c:8.3f} {v:8.3f} {v / c:8.2f}", flush=True)
    for dtype, values in ratios.items():
        geomean = math.exp(sum(map(math.log, values)) / len(values))
        print(f"geomean vtpu/cpu {str(dtype).split('.')[-1]:<9} {geomean:.2f} over {len(values)} cases")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
