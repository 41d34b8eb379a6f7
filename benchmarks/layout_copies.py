"""Copies and elementwise ops of permuted tensors: vTPU (strict mode) against
stock CPU eager, interleaved in one process, medians of the repeats.

    .venv/bin/python benchmarks/layout_copies.py [--repeats 21] [--only NAME ...]

The cases are what models do to activations: a transposed matrix made
contiguous (x.t().contiguous(), x.mT in attention), the head split and merge
of attention (transpose(1, 2).contiguous() of [batch, seq, heads, head_dim]),
K^T materialised ([b, h, s, d] -> [b, h, d, s]), an add with a transposed
operand, and torch.roll (Swin's shifted windows roll [batch, H, W, C] along H
and W). Each is run in float32, bfloat16 and float16. Ratios are vtpu / cpu:
below 1 is faster than the CPU.
"""
import argparse
import math
import statistics
import time

import torch

import torch_vtpu  # noqa: F401  (registers the device)

CASES = {
    "t_contiguous_4096x1024": ((4096, 1024), lambda a, b: a.t().contiguous()),
    "t_contiguous_2048x2048": ((2048, 2048), lambda a, b: a.t().contiguous()),
    "heads_split_16x512x12x64": ((16, 512, 12, 64), lambda a, b: a.transpose(1, 2).contiguous()),
    "key_t_8x12x512x64": ((8, 12, 512, 64), lambda a, b: a.transpose(2, 3).contiguous()),
    "t_add_2048x2048": ((2048, 2048), lambda a, b: a.t() + b),
    "roll_2048x2048": ((2048, 2048), lambda a, b: a.roll(5, 1)),
    "roll_swin_32x56x56x96": ((32, 56, 56, 96), lambda a, b: a.roll((3, 3), (1, 2))),
}


def timed(fn, sync) -> float:
    t = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args(argv)
    ratios = []
    print(f"{'case':<28} {'dtype':<9} {'cpu ms':>8} {'vtpu ms':>8} {'vtpu/cpu':>8}")
    for name, (shape, op) in CASES.items():
        if args.only and name not in args.only:
            continue
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            a = torch.randn(shape).to(dtype)
            b = torch.randn(shape).to(dtype)
            av, bv = a.to("vtpu"), b.to("vtpu")
            sync = torch.vtpu.synchronize
            for _ in range(3):
                op(a, b)
                op(av, bv)
            sync()
            cpu, dev = [], []
            for _ in range(args.repeats):  # interleaved: both see the same machine
                cpu.append(timed(lambda: op(a, b), lambda: None))
                dev.append(timed(lambda: op(av, bv), sync))
            c, v = statistics.median(cpu) * 1e3, statistics.median(dev) * 1e3
            ratios.append(v / c)
            print(f"{name:<28} {str(dtype).split('.')[-1]:<9} {c:8.3f} {v:8.3f} {v / c:8.2f}")
    if ratios:
        print(f"geomean vtpu/cpu {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f} over {len(ratios)} cases")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
