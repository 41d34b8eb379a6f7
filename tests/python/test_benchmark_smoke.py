"""The fused-eager benchmark runs end to end at its quick sizes (so it does not
rot), and what it checks besides time holds there: fused results bitwise equal
to strict, fused peak memory not above strict. Times at these sizes mean
nothing and are not asserted (speed is measured by the benchmark itself)."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_fused_eager_benchmark_quick_run():
    env = dict(os.environ)
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "fused_eager.py"), "--quick", "--only", "mlp_gelu_ln", "qwen3",
         "dlrm", "cnn", "adamw_100"],
        env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    bitwise = [line for line in lines if line.strip().startswith("bitwise strict == fused")]
    memory = [line for line in lines if line.strip().startswith("peak memory fused > strict")]
    assert bitwise and bitwise[0].split()[-1] == "yes", out.stdout[-2000:]
    assert memory and memory[0].split("strict", 1)[1].split()[0] == "none", out.stdout[-2000:]
