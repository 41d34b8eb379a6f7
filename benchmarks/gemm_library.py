"""oneDNN against MKL for vTPU's float32 matrix products, side by side in one
process: `torch.backends.mkldnn.enabled` (read by the bridge at each product,
bridge/onednn_gemm.h) switches between the two libraries, so every pair of
measurements runs on the same tensors, the same warm kernel cache and the same
host load, alternating.

    .venv/bin/python benchmarks/gemm_library.py [--repeats 8] [--only NAME ...] [--quick]

Two sections:
  products  one nn.Linear's three products (forward x @ W.t(), input gradient
            g @ W, weight gradient g.t() @ x) at the suite's shapes, on vtpu in
            strict mode: median ms per product with oneDNN and with MKL.
  steps     training steps of benchmarks/fused_eager.py's models (strict and
            fused mode): median wall ms per step and the step's matrix-product
            device time (`profile_ops`), with oneDNN and with MKL.
Ratios are oneDNN / MKL: below 1 is oneDNN faster.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import torch

import torch_vtpu

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fused_eager  # noqa: E402  (the suite's models)

PRODUCT_SHAPES = {  # (rows, in features, out features)
    "mlp_256x1024x1024": (256, 1024, 1024),
    "qwen3_mlp_256x256x768": (256, 256, 768),
    "qwen3_down_256x768x256": (256, 768, 256),
    "qwen3_attn_256x256x256": (256, 256, 256),
    "dlrm_512x512x256": (512, 512, 256),
}
STEP_WORKLOADS = ("mlp_gelu_ln", "qwen3", "dlrm")
PRODUCT_OPS = ("aten::mm.out", "aten::addmm.out")


def _timed(fn: Callable[[], object], calls: int) -> float:
    torch.vtpu.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.vtpu.synchronize()
    return (time.perf_counter() - t) / calls * 1e3


def _alternating(run: Callable[[], Tuple[float, ...]], repeats: int) -> Dict[bool, List[Tuple[float, ...]]]:
    """run() under oneDNN (True) and MKL (False), the order flipped each repeat."""
    samples: Dict[bool, List[Tuple[float, ...]]] = {True: [], False: []}
    for rep in range(repeats):
        for onednn in ((True, False) if rep % 2 == 0 else (False, True)):
            with torch.backends.mkldnn.flags(enabled=onednn):
                samples[onednn].append(run())
    return samples


def _median(samples: List[Tuple[float, ...]], i: int) -> float:
    return statistics.median(s[i] for s in samples)


def products(names: List[str], repeats: int, calls: int, scale: int) -> List[float]:
    print(f"{'product':<26} {'kind':<8} {'onednn ms':>9} {'mkl ms':>8} {'ratio':>6}")
    ratios = []
    g = torch.Generator().manual_seed(0)
    for name in names:
        m, k, n = (max(1, d // scale) for d in PRODUCT_SHAPES[name])
        x = torch.randn(m, k, generator=g).to("vtpu")
        w = torch.randn(n, k, generator=g).to("vtpu")
        grad = torch.randn(m, n, generator=g).to("vtpu")
        kinds = {"forward": lambda: x @ w.t(), "input": lambda: grad @ w, "weight": lambda: grad.t() @ x}
        for kind, fn in kinds.items():
            for onednn in (True, False):
                with torch.backends.mkldnn.flags(enabled=onednn):
                    _timed(fn, 2)
            samples = _alternating(lambda: (_timed(fn, calls),), repeats)
            on, off = _median(samples[True], 0), _median(samples[False], 0)
            ratios.append(on / off)
            print(f"{name:<26} {kind:<8} {on:9.3f} {off:8.3f} {on / off:6.2f}")
    return ratios


def steps(names: List[str], modes: List[str], repeats: int, sizes: fused_eager.Sizes) -> List[float]:
    print(f"\n{'workload':<14} {'mode':<7} {'onednn ms':>9} {'mkl ms':>8} {'ratio':>6}   "
          f"{'gemm dev ms onednn':>18} {'mkl':>6} {'ratio':>6}")
    ratios = []
    for name in names:
        step = fused_eager.make_step(name, sizes, "vtpu", {})
        for mode in modes:
            for onednn in (True, False):
                with torch.backends.mkldnn.flags(enabled=onednn):
                    fused_eager._warm_up(step, mode, 3)

            def run() -> Tuple[float, float]:
                torch_vtpu.profile_ops(True)
                torch_vtpu.reset_metrics()
                wall = _timed(step, 3)
                by_op = torch_vtpu.metrics()["device_time_by_op"]
                torch_vtpu.profile_ops(False)
                return wall, sum(by_op[op][0] for op in PRODUCT_OPS if op in by_op) / 3 * 1e3

            samples = _alternating(run, repeats)
            on, off = _median(samples[True], 0), _median(samples[False], 0)
            gon, goff = _median(samples[True], 1), _median(samples[False], 1)
            ratios.append(on / off)
            print(f"{name:<14} {mode:<7} {on:9.2f} {off:8.2f} {on / off:6.3f}   {gon:18.2f} {goff:6.2f} "
                  f"{gon / goff if goff else float('nan'):6.3f}")
    return ratios


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=8, help="alternating repeats per library (default 8)")
    parser.add_argument("--only", nargs="*", help="product shapes or workloads to run")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 2 repeats: a smoke test")
    args = parser.parse_args(argv)
    known = list(PRODUCT_SHAPES) + list(STEP_WORKLOADS)
    unknown = [n for n in (args.only or []) if n not in known]
    if unknown:
        parser.error(f"unknown name(s) {' '.join(unknown)}; known: {' '.join(known)}")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if not torch.backends.mkldnn.is_available():
        print("this torch build has no oneDNN: nothing to compare")
        return 0
    repeats = 2 if args.quick else args.repeats
    wanted = lambda names: [n for n in names if not args.only or n in args.only]  # noqa: E731
    print(f"gemm library benchmark: oneDNN / MKL, median of {repeats} alternating repeats, torch "
          f"{torch.__version__}, {torch.get_num_threads()} CPU threads\n")
    product_names = wanted(PRODUCT_SHAPES)
    ratios = products(product_names, repeats, 1 if args.quick else 10, 16 if args.quick else 1) \
        if product_names else []
    step_names = wanted(STEP_WORKLOADS)
    sizes = fused_eager.Sizes.quick() if args.quick else fused_eager.Sizes()
    step_ratios = steps(step_names, ["strict", "fused"], repeats, sizes) if step_names else []
    geo = lambda r: statistics.geometric_mean(r) if r else float("nan")  # noqa: E731
    print(f"\ngeomean oneDNN/MKL: products {geo(ratios):.3f}, training steps {geo(step_ratios):.3f}")
    return 0


if __name__ == "__main__":
    # torch.backends.mkldnn.flags() also sets the TF32 flag, which warns on
    # builds without Intel GPU support; the benchmark changes nothing there.
    import warnings

    warnings.filterwarnings("ignore", message="TF32 acceleration")
    sys.exit(main())
