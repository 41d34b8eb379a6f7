"""Fused eager's recording cost against the number of ops in one window.

    .venv/bin/python benchmarks/window_bookkeeping.py [--repeats N]

Each op recorded into a pending window is placed into a cluster (the kernel it
will join): that looks at the earlier clusters touching the op's buffers. Two
programs are issued without a flush in between, R times (R = 4 ... 100):

    chain      y = y * 1.0001 + 0.5 on 64K floats (10 ops per repetition:
               each op touches only the previous result)
    shared-in  a layer-norm-like expression of one 64 x 256 input x, with
               weight and bias (10 ops per repetition, 2 of them row sums):
               every op reads x, so every cluster of the window touches it

Reported: issue time per op (the Python loop until the last op is recorded,
no synchronize), and total time per op including the flush and the kernels,
medians of --repeats runs. Flat issue times mean recording stays linear in
the window's size. (Before 2026-12-04 21:15 the shared-in program took
~1.1 ms per op at 64 repetitions against ~13 us at 4.)
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import torch_vtpu


def _chain(y: torch.Tensor) -> torch.Tensor:
    for _ in range(5):
        y = y * 1.0001 + 0.5
    return y


def _shared_input(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    mean = x.sum(-1, keepdim=True) / x.shape[-1]
    centred = x - mean
    rstd = torch.rsqrt((centred * centred).sum(-1, keepdim=True) / x.shape[-1] + 1e-5)
    return (x * rstd - rstd * mean) * w + b


def _time(program, repetitions: int) -> tuple:
    torch.vtpu.synchronize()
    start = time.perf_counter()
    kept = [program() for _ in range(repetitions)]
    issued = time.perf_counter() - start
    torch.vtpu.synchronize()
    total = time.perf_counter() - start
    del kept
    ops = 10 * repetitions
    return issued / ops * 1e6, total / ops * 1e6


def main(argv) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    torch_vtpu.set_mode("fused")
    torch.manual_seed(0)
    y = torch.randn(65536, device="vtpu")
    x = torch.randn(64, 256, device="vtpu")
    w = torch.randn(256, device="vtpu")
    b = torch.randn(256, device="vtpu")
    programs = {"chain": lambda: _chain(y), "shared-in": lambda: _shared_input(x, w, b)}
    print(f"{'program':<10}{'reps':>6}{'ops':>6}{'issue us/op':>13}{'total us/op':>13}")
    for name, program in programs.items():
        for repetitions in (4, 16, 64, 100):
            for _ in range(2):  # patterns seen and their fused kernels compiled
                _time(program, repetitions)
                torch_vtpu._C._wait_for_fusion_compiles()
            runs = [_time(program, repetitions) for _ in range(args.repeats)]
            issue = statistics.median(r[0] for r in runs)
            total = statistics.median(r[1] for r in runs)
            print(f"{name:<10}{repetitions:>6}{10 * repetitions:>6}{issue:>13.1f}{total:>13.1f}", flush=True)
    syncs = torch_vtpu.metrics()["syncs"]
    if syncs.get("window_limit"):
        print(f"note: {syncs['window_limit']} window-limit flushes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
