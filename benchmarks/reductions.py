"""Reductions of the shapes models and losses reduce: vTPU (strict mode)
against stock CPU eager, interleaved in one process, medians of the repeats.

    .venv/bin/python benchmarks/reductions.py [--repeats 21] [--only NAME ...]

The cases: a whole-tensor sum and mean (a loss's reduction; one output, so
its row is all the work), a few long rows (per-sample losses of 1M-element
images), rows of a 2048x2048 matrix (the norms' and softmax's shape: sums,
a max as an fp8 scale takes it, and softmax, whose first pass is a max), a
column sum of a wide and of a tall matrix (a bias gradient; DLRM's narrow
columns). Each in float32, bfloat16 and float16. A sample is --calls calls
of the op, then one synchronize (a step's reductions are queued behind other
work; a single call's wake-ups of the stream and pool threads are not what is
measured); times are per call. Ratios are vtpu / cpu: below 1 is faster than
the CPU.
"""
import argparse
import math
import statistics
import time

import torch

import torch_vtpu  # noqa: F401  (registers the device)

CASES = {
    "sum_all_4M": ((4 * 1024 * 1024,), lambda a: a.sum()),
    "mean_all_2048x2048": ((2048, 2048), lambda a: a.mean()),
    "sum_rows_4x1M": ((4, 1024 * 1024), lambda a: a.sum(-1)),
    "amax_all_4M": ((4 * 1024 * 1024,), lambda a: a.amax()),
    "sum_rows_2048x2048": ((2048, 2048), lambda a: a.sum(-1)),
    "amax_rows_2048x2048": ((2048, 2048), lambda a: a.amax(-1)),
    "softmax_rows_2048x2048": ((2048, 2048), lambda a: a.softmax(-1)),
    "sum_cols_4096x1024": ((4096, 1024), lambda a: a.sum(0)),
    "sum_cols_1Mx4": ((1024 * 1024, 4), lambda a: a.sum(0)),
}


def timed(fn, sync, calls) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t) / calls


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args(argv)
    ratios = []
    print(f"{'case':<22} {'dtype':<9} {'cpu ms':>8} {'vtpu ms':>8} {'vtpu/cpu':>8}")
    for name, (shape, op) in CASES.items():
        if args.only and name not in args.only:
            continue
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            a = torch.randn(shape).to(dtype)
            av = a.to("vtpu")
            sync = torch.vtpu.synchronize
            for _ in range(3):
                op(a)
                op(av)
            sync()
            cpu, dev = [], []
            for _ in range(args.repeats):  # interleaved: both see the same machine
                cpu.append(timed(lambda: op(a), lambda: None, args.calls))
                dev.append(timed(lambda: op(av), sync, args.calls))
            c, v = statistics.median(cpu) * 1e3, statistics.median(dev) * 1e3
            ratios.append(v / c)
            print(f"{name:<22} {str(dtype).split('.')[-1]:<9} {c:8.3f} {v:8.3f} {v / c:8.2f}")
    if ratios:
        print(f"geomean vtpu/cpu {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f} over {len(ratios)} cases")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
