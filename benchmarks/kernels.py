"""Single-op kernels: vTPU's generated kernels against ATen's CPU kernels (which
the host-kernel path runs), for elementwise ops and reductions at 1e3, 1e5 and
1e7 elements, plus the memcpy bandwidth of this machine, all in one run. Ops
outside the elementwise/reduction goal (2-d max pooling) are reported below the
table and left out of its geometric mean.

    .venv/bin/python benchmarks/kernels.py [--repeats 7]

Each configuration runs in its own process (VTPU_GENERATED_KERNELS is read at
start-up); kernels are timed on the device stream between synchronisations,
after warm-up (so compiles are excluded), as the median of the repeats.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

SIZES = [1_000, 100_000, 10_000_000]

WORKER = r"""
import json, statistics, sys, time, torch, torch_vtpu
ops = {ops}
sizes, repeats = {sizes}, {repeats}
result = {{}}
for n in sizes:
    x = torch.randn(n, device="vtpu"); y = torch.randn(n, device="vtpu")
    inner = max(1, int(2e7 // n))  # enough launches per timing to dwarf the sync
    for name, src in ops.items():
        fn = eval(src)
        for _ in range(3): fn(x, y)
        torch.vtpu.synchronize()
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            for _ in range(inner): fn(x, y)
            torch.vtpu.synchronize()
            times.append((time.perf_counter() - t) / inner)
        result[f"{{name}}@{{n}}"] = statistics.median(times)
if {memcpy}:
    src = torch.randn(10_000_000); dst = torch.empty_like(src)
    times = []
    for _ in range(repeats):
        t = time.perf_counter(); dst.copy_(src); times.append(time.perf_counter() - t)
    result["memcpy_GBps"] = 2 * src.numel() * 4 / statistics.median(times) / 1e9
print(json.dumps(result))
"""

SOURCES = {
    "add": "lambda x, y: x + y", "mul": "lambda x, y: x * y", "exp": "lambda x, y: x.exp()",
    "tanh": "lambda x, y: x.tanh()", "sigmoid": "lambda x, y: x.sigmoid()",
    "gelu": "lambda x, y: torch.nn.functional.gelu(x)",
    "sum_rows": "lambda x, y: x.view(-1, 100).sum(1)", "amax_rows": "lambda x, y: x.view(-1, 100).amax(1)",
    "softmax_rows": "lambda x, y: x.view(-1, 100).softmax(1)",
}
# Not elementwise or a reduction: timed in the same run, reported apart.
EXTRA_SOURCES = {
    # (batch, 4 channels, 10 x 25) planes, 2x2 windows: values and indices, as nn.MaxPool2d's backward needs.
    "max_pool2d_2x2": "lambda x, y: torch.nn.functional.max_pool2d(x.view(-1, 4, 10, 25), 2, return_indices=True)",
}


def run(generated: bool, repeats: int, cache_dir: str) -> dict:
    env = dict(os.environ, VTPU_GENERATED_KERNELS="1" if generated else "0", VTPU_CACHE_DIR=cache_dir)
    code = WORKER.format(ops=repr({**SOURCES, **EXTRA_SOURCES}), sizes=SIZES, repeats=repeats, memcpy=not generated)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as cache_dir:
        aten = run(False, args.repeats, cache_dir)
        generated = run(True, args.repeats, cache_dir)
    ratios = []
    print(f"{'op@elements':<22}{'ATen (us)':>12}{'generated (us)':>16}{'ratio':>8}")
    extra = [key for key in generated if key.split("@")[0] in EXTRA_SOURCES]
    for key in generated:
        if key in extra:
            continue
        ratio = generated[key] / aten[key]
        ratios.append(ratio)
        print(f"{key:<22}{aten[key] * 1e6:>12.1f}{generated[key] * 1e6:>16.1f}{ratio:>8.2f}")
    geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    print(f"geometric mean generated/ATen: {geomean:.2f} (goal <= 1.0)")
    for key in extra:
        print(f"{key:<22}{aten[key] * 1e6:>12.1f}{generated[key] * 1e6:>16.1f}{generated[key] / aten[key]:>8.2f}")
    add_big = generated[f"add@{SIZES[-1]}"]
    bandwidth = 3 * SIZES[-1] * 4 / add_big / 1e9
    print(f"add@1e7: {bandwidth:.1f} GB/s = {bandwidth / aten['memcpy_GBps']:.0%} of memcpy "
          f"({aten['memcpy_GBps']:.1f} GB/s; goal >= 80%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
