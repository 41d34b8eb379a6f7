#!/bin/bash
# The cuda target's device check: differential tests and a bandwidth benchmark.
export PATH=$PATH:/usr/local/cuda/bin
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "nvcc: $(command -v nvcc) $(nvcc --version | tail -1)"; echo "c++: $(command -v c++) $(c++ --version | head -1)"
timeout 300 ./build/engine/vtpu_engine_tests --gtest_filter='TargetTest.*' 2>&1 | tee $OUT/target_test.log | grep -v "^\[ RUN\|^\[----" | tail -40
timeout 120 ./build/engine/vtpu_target_bench cuda 67108864 2>&1 | tee $OUT/bench.log
timeout 120 python3 - <<'PY' 2>&1 | tee $OUT/torch_bench.log
import time, torch
n = 1 << 26
x, s, r = [torch.randn(n, device="cuda") for _ in range(3)]
def timed(f):
    for _ in range(3): f()
    torch.cuda.synchronize(); res = []
    for _ in range(7):
        a = time.perf_counter()
        for _ in range(20): f()
        torch.cuda.synchronize(); res.append((time.perf_counter() - a) / 20)
    return sorted(res)[3]
g = timed(lambda: torch.nn.functional.gelu(x) * s + r)
a = timed(lambda: x + s)
print(f"torch {torch.__version__} eager gelu(x)*s+r (3 kernels) n={n} median {g*1e3:.3f} ms {16*n/g/1e9:.1f} GB/s (useful bytes)")
print(f"torch eager x+y n={n} median {a*1e3:.3f} ms {12*n/a/1e9:.1f} GB/s")
PY
