"""Training steps in bfloat16: the fused-eager suite's models (benchmarks/
fused_eager.py, same sizes and AdamW) on stock CPU eager and on vTPU in strict
and fused mode, interleaved in one process, medians of the repeats.

    .venv/bin/python benchmarks/bf16_training.py [--precision pure|autocast] [--repeats 5]
                                                 [--steps 3] [--only mlp_gelu_ln qwen3 ...] [--quick]

pure:     parameters, inputs and optimizer states in bfloat16 (the loss in
          float32 from the logits), as a model loaded with torch_dtype=bfloat16
          trains.
autocast: float32 parameters, the forward under torch.autocast(bfloat16) on
          each device (vTPU follows CUDA's cast policy, the CPU its own).

Fused mode compiles its kernels in the background: the warm-up waits for them,
so the timed steps are the steady state. Ratios below 1 are faster than the
CPU (or, for fused/strict, than strict).
"""
import argparse
import copy
import statistics
import sys
import time
from typing import Callable, Dict, List

import torch

import torch_vtpu
from torch_vtpu import _C

import fused_eager  # this directory: the workloads and their sizes

MODES = ("cpu", "strict", "fused")


def make_step(name: str, sizes: fused_eager.Sizes, mode: str, precision: str) -> Callable[[], torch.Tensor]:
    case = fused_eager._build_case(name, sizes)
    device = "cpu" if mode == "cpu" else "vtpu"
    model = copy.deepcopy(case.model)
    inputs = list(case.batch)
    if precision == "pure":
        model = model.to(torch.bfloat16)
        inputs = [t.to(torch.bfloat16) if t.is_floating_point() else t for t in inputs]
    model = model.to(device).train()
    *inputs, target = (t.to(device) for t in inputs)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=precision == "autocast"):
            out = model(*inputs)
        loss = case.loss_fn(out.float(), target.float() if target.is_floating_point() else target)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def _settle(mode: str) -> None:
    if mode != "cpu":
        torch_vtpu.flush()
        torch.vtpu.synchronize()


def run(name: str, sizes: fused_eager.Sizes, precision: str, repeats: int, steps: int, warmup: int) -> Dict[str, float]:
    step_of = {}
    for mode in MODES:
        if mode != "cpu":
            torch_vtpu.set_mode(mode)
        step_of[mode] = make_step(name, sizes, mode, precision)
        for _ in range(warmup):
            step_of[mode]()
            _settle(mode)
            if mode != "cpu":
                _C._wait_for_fusion_compiles()
    times: Dict[str, List[float]] = {mode: [] for mode in MODES}
    for _ in range(repeats):  # interleaved: every mode sees the same machine
        for mode in MODES:
            if mode != "cpu":
                torch_vtpu.set_mode(mode)
            start = time.perf_counter()
            for _ in range(steps):
                loss = step_of[mode]()
            _settle(mode)
            loss.cpu()
            times[mode].append((time.perf_counter() - start) / steps * 1e3)
    torch_vtpu.set_mode("strict")
    return {mode: statistics.median(v) for mode, v in times.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precision", choices=("pure", "autocast"), default="pure")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats (default 5)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per mode and repeat (default 3)")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up steps per mode (default 3)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 1 repeat of 1 step: a smoke test")
    parser.add_argument("--only", nargs="*", help="run only these workloads")
    args = parser.parse_args(argv)
    names = list(fused_eager.MODEL_WORKLOADS)
    unknown = sorted(set(args.only or []) - set(names))
    if unknown:
        parser.error(f"--only: unknown workload(s) {', '.join(unknown)}; choose from {', '.join(names)}")
    if min(args.repeats, args.steps, args.warmup) < 1:
        parser.error("--repeats, --steps and --warmup must be at least 1")
    sizes = fused_eager.Sizes.quick() if args.quick else fused_eager.Sizes()
    repeats, steps = (1, 1) if args.quick else (args.repeats, args.steps)
    print(f"bfloat16 training ({args.precision}), {'quick sizes (times mean nothing)' if args.quick else 'default sizes'}"
          f", median of {repeats} interleaved repeats x {steps} steps, {torch.get_num_threads()} CPU threads\n")
    print(f"{'workload':<12} {'cpu ms':>8} {'strict ms':>9} {'fused ms':>9} {'strict/cpu':>10} {'fused/cpu':>9} "
          f"{'fused/strict':>12}")
    for name in names:
        if args.only and name not in args.only:
            continue
        m = run(name, sizes, args.precision, repeats, steps, args.warmup)
        print(f"{name:<12} {m['cpu']:8.1f} {m['strict']:9.1f} {m['fused']:9.1f} {m['strict'] / m['cpu']:10.2f} "
              f"{m['fused'] / m['cpu']:9.2f} {m['fused'] / m['strict']:12.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
