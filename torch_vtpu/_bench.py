"""Dispatch-overhead benchmark: a chain of small ops, vtpu strict vs stock CPU eager.

Reports the median microseconds per op of several repeats, measured side by side
in one process (the machines are shared and noisy: compare ratios, not absolutes).
"""
import argparse
import statistics
import time
from typing import Callable, Dict, List

import torch
from torch_vtpu._arguments import non_negative_int, positive_int


def _chain(device: str, ops: int, numel: int) -> Callable[[], float]:
    x = torch.randn(numel, device=device)
    y = torch.randn(numel, device=device)

    def run() -> float:
        z = x
        start = time.perf_counter()
        for _ in range(ops):
            z = z + y
        if device != "cpu":
            torch.vtpu.synchronize()
        return (time.perf_counter() - start) / ops * 1e6

    return run


def measure(ops: int = 10_000, numel: int = 16, repeats: int = 7) -> Dict[str, List[float]]:
    import torch_vtpu

    runs = {"cpu": _chain("cpu", ops, numel)}
    for mode in ("strict", "debug"):
        runs[f"vtpu-{mode}"] = _chain("vtpu", ops, numel)
    results: Dict[str, List[float]] = {name: [] for name in runs}
    for _ in range(repeats):  # interleaved, so drift hits every variant alike
        for name, run in runs.items():
            mode = name.split("-")[1] if name.startswith("vtpu") else None
            if mode:
                with torch_vtpu.mode(mode):
                    results[name].append(run())
            else:
                results[name].append(run())
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_vtpu bench", description=__doc__)
    parser.add_argument("--ops", type=positive_int, default=10_000, help="adds per timed chain (default 10000)")
    parser.add_argument("--numel", type=non_negative_int, default=16, help="elements per tensor (default 16)")
    parser.add_argument("--repeats", type=positive_int, default=7, help="timed chains per mode (default 7)")
    args = parser.parse_args(argv)
    results = measure(args.ops, args.numel, args.repeats)
    cpu = statistics.median(results["cpu"])
    print(f"chain of {args.ops} adds on {args.numel}-element float32 tensors, "
          f"median of {args.repeats} interleaved repeats")
    print(f"{'variant':<14}{'us/op':>10}{'vs cpu':>10}")
    for name, values in results.items():
        med = statistics.median(values)
        print(f"{name:<14}{med:>10.2f}{med / cpu:>9.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
