"""Share of kernel launches that are vTPU-generated kernels in a strict-mode training
step, for the training-parity models (20 AdamW steps each), and the loss error
against stock CPU. Generated kernels are the default:

    .venv/bin/python benchmarks/generated_share.py

The remaining launches are extern matrix work (mm/bmm/addmm/conv, ATen's CPU
GEMM) and ops the code generator does not cover yet (the host-kernel path).
"""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))

import torch  # noqa: E402

import torch_vtpu  # noqa: E402
import test_training_parity as parity  # noqa: E402


def main() -> int:
    if os.environ.get("VTPU_GENERATED_KERNELS") == "0":
        print("VTPU_GENERATED_KERNELS=0 turns generated kernels off: nothing to measure", file=sys.stderr)
        return 2
    print(f"{'model':<14}{'generated':>11}{'launches':>10}{'share':>8}{'max rel loss err':>18}  top host-kernel-path ops")
    for name in parity.CASES:
        expected, _ = parity._cpu_reference(name)
        torch_vtpu.reset_metrics()
        actual, _ = parity._train(name, "vtpu")
        m = torch_vtpu.metrics()
        rel = ((actual - expected).abs() / expected.abs()).max().item()
        top = sorted(m["host_fallback_ops"].items(), key=lambda kv: -kv[1])[:3]
        share = m["generated_kernels"] / max(1, m["kernels_launched"])
        print(f"{name:<14}{m['generated_kernels']:>11}{m['kernels_launched']:>10}{share:>8.0%}{rel:>18.1e}  {top}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
