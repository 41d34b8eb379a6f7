"""Benchmark: the cost of call-site capture in strict mode.

A chain of 10,000 adds on 16-element float32 tensors (as benchmarks/small_ops.py),
issued with call-site capture on and off in one process, interleaved; reports the
median microseconds per op of each and their ratio. A second pair issues the same
chain through library frames (torch.nn.functional and an nn.Module, as model code
does), where capture walks several frames to reach the user's.

Usage: .venv/bin/python benchmarks/call_site_overhead.py [--ops N] [--repeats R]
"""
import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import torch_vtpu


def _timed(body, ops: int):
    """(wall us/op, dispatch-thread CPU us/op). Capture runs on the issuing
    thread, so its CPU time isolates the cost from a shared machine's preemption."""
    wall, cpu = time.perf_counter(), time.thread_time()
    body()
    torch.vtpu.synchronize()
    return ((time.perf_counter() - wall) / ops * 1e6, (time.thread_time() - cpu) / ops * 1e6)


def chain(x: torch.Tensor, y: torch.Tensor, ops: int):
    def body():
        z = x
        for _ in range(ops):
            z = z + y
    return _timed(body, ops)


class _Add(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.dropout(a, 0.0, training=False) + b  # F.dropout: a frame under torch/


def module_chain(x: torch.Tensor, y: torch.Tensor, ops: int) -> float:
    # The op is issued from _Add.forward (user code) called through nn.Module's
    # __call__ (two library frames); F.dropout with p=0 returns its input.
    add = _Add()

    def body():
        z = x
        for _ in range(ops):
            z = add(z, y)
    return _timed(body, ops)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ops", type=int, default=10_000)
    parser.add_argument("--numel", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    torch_vtpu.set_mode("strict")
    x = torch.randn(args.numel, device="vtpu")
    y = torch.randn(args.numel, device="vtpu")
    variants = {
        ("chain", True): lambda: chain(x, y, args.ops),
        ("chain", False): lambda: chain(x, y, args.ops),
        ("module", True): lambda: module_chain(x, y, args.ops),
        ("module", False): lambda: module_chain(x, y, args.ops),
    }
    results = {key: [] for key in variants}
    previous = torch_vtpu.debug.capture_call_sites()
    try:
        for key, run in variants.items():  # warm-up: caches, allocator
            torch_vtpu.debug.capture_call_sites(key[1])
            run()
        keys = list(variants)
        for repeat in range(args.repeats):
            # Interleaved, so drift hits every variant alike; the order flips
            # every repeat, so no variant always runs first after the others.
            for key in (keys if repeat % 2 == 0 else keys[::-1]):
                run = variants[key]
                torch_vtpu.debug.capture_call_sites(key[1])
                results[key].append(run())
    finally:
        torch_vtpu.debug.capture_call_sites(previous)
    print(f"strict mode, chains of {args.ops} ops on {args.numel}-element float32 tensors, "
          f"median of {args.repeats} interleaved repeats")
    print(f"{'variant':<8}{'metric':<22}{'capture on':>12}{'capture off':>13}{'ratio':>8}")
    for name in ("chain", "module"):
        for index, metric in ((0, "wall us/op"), (1, "issuing-thread CPU us/op")):
            on = statistics.median(r[index] for r in results[(name, True)])
            off = statistics.median(r[index] for r in results[(name, False)])
            print(f"{name:<8}{metric:<24}{on:>10.3f}{off:>13.3f}{on / off:>8.3f}")
    ns, _ = torch_vtpu._C._time_call_site_capture(200_000)
    print(f"capture alone (C++ loop, one user frame): {ns:.1f} ns per op")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
