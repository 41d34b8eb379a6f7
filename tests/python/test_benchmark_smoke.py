"""The fused-eager and compiled benchmarks run end to end at their quick sizes
(so they do not rot), and what they check besides time holds there: fused
results bitwise equal to strict, fused peak memory not above strict, compiled
losses close to CPU eager. Times at these sizes mean
nothing and are not asserted (speed is measured by the benchmark itself)."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


WORKLOADS = ("mlp_gelu_ln", "qwen3", "dlrm", "cnn", "adamw_100")
PEAK_NOISE_MB = 0.0625  # 64 KiB


def test_fused_eager_benchmark_quick_run():
    env = dict(os.environ)
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "fused_eager.py"), "--quick", "--only", *WORKLOADS],
        env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    bitwise = [line for line in lines if line.strip().startswith("bitwise strict == fused")]
    memory = [line for line in lines if line.strip().startswith("peak memory fused > strict")]
    assert bitwise and bitwise[0].split()[-1] == "yes", out.stdout[-2000:]
    assert memory, out.stdout[-2000:]
    # Peak memory, fused <= strict. At these sizes a step's peak moved by a few
    # tens of KB from run to run in either mode (strict 0.22 or 0.26 MB for the
    # quick Qwen3 step) while queued fallback copies held their storages; that is
    # fixed (docs/status.md), but any timing-dependent free would show here first,
    # so a difference within that size still passes. The benchmark's own verdict
    # compares exactly (at its default sizes the peaks are equal).
    rows = {line.split()[0]: line for line in lines if line.split() and line.split()[0] in WORKLOADS}
    assert set(rows) == set(WORKLOADS), out.stdout[-2000:]
    for name, line in rows.items():
        strict_mb, fused_mb = (float(v) for v in line.split()[9].rstrip("!").split("|"))
        assert fused_mb <= strict_mb + PEAK_NOISE_MB, (name, line)
        # The floor column: extern (GEMM/conv/attention) time over strict's
        # step; every model has matrix products, AdamW alone has none.
        floor = float(line.split()[5])
        assert (floor > 0) == (name != "adamw_100"), (name, line)
    assert any(line.strip().startswith("floor:") for line in lines), out.stdout[-2000:]


def test_compiled_benchmark_quick_run():
    """benchmarks/compiled.py at quick sizes on one model: it runs (Inductor,
    compiled vtpu and fused side by side), compiled losses track CPU eager, and
    the timed compiled steps compile nothing."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "compiled.py"), "--quick", "--only", "mlp_gelu_ln"],
        env=dict(os.environ), capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith("mlp_gelu_ln")]
    assert rows, out.stdout[-2000:]
    row = rows[0]
    # values: workload, 4 times, 3 ratios, kern/step, peak MB, cmp, parity, shares
    assert row[10] == "0", out.stdout[-2000:]
    assert float(row[11]) < 1e-5, out.stdout[-2000:]


def test_an_unknown_only_name_is_a_usage_error_not_an_empty_run():
    # `--only mlp` once printed an empty table and exited 0.
    for script, extra in (("fused_eager.py", "decode"), ("compiled.py", "first_step")):
        out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--only", "mlp", extra],
                             env=dict(os.environ), capture_output=True, text=True, timeout=120)
        assert out.returncode == 2, (script, out.stdout[-1000:])
        assert "unknown workload(s) mlp" in out.stderr and "mlp_gelu_ln" in out.stderr, out.stderr[-1000:]


def test_decode_benchmark_quick_run():
    """benchmarks/decode.py at quick sizes: every configuration (stock CPU, strict and
    fused with the skinny GEMM and with MKL, compiled with native and with Python
    programs) decodes the CPU's tokens, and the skinny GEMM is used where it is on
    (the benchmark exits non-zero otherwise)."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "decode.py"), "--quick"],
                         env=dict(os.environ), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "same tokens as cpu everywhere: True; skinny GEMM used where on: True" in out.stdout, out.stdout[-2000:]


def test_half_precision_ops_benchmark_quick_run():
    script = str(ROOT / "benchmarks" / "half_precision_ops.py")
    out = subprocess.run([sys.executable, script, "--size", "64", "--repeats", "1", "--calls", "1",
                          "--only", "gelu", "layer_norm", "rms_norm"], env=dict(os.environ), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    names = ("gelu", "layer_norm", "rms_norm")
    rows = [line.split() for line in out.stdout.splitlines() if line.split()[:1] in [[n] for n in names]]
    assert sorted((r[0], r[1]) for r in rows) == sorted(
        (name, dtype) for name in names for dtype in ("float32", "bfloat16", "float16"))
    assert all(float(r[3]) > 0 and float(r[4]) > 0 for r in rows), out.stdout
    assert out.stdout.count("geomean vtpu/cpu") == 3, out.stdout
    bad = subprocess.run([sys.executable, script, "--only", "gelu", "nonsense"], env=dict(os.environ),
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unknown case(s) nonsense" in bad.stderr, bad.stderr[-1000:]


def test_bf16_training_benchmark_quick_run():
    script = str(ROOT / "benchmarks" / "bf16_training.py")
    for precision in ("pure", "autocast"):
        out = subprocess.run([sys.executable, script, "--quick", "--precision", precision, "--only", "mlp_gelu_ln",
                              "dlrm"], env=dict(os.environ), capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        rows = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines()
                if line.split()[:1] in (["mlp_gelu_ln"], ["dlrm"])}
        assert sorted(rows) == ["dlrm", "mlp_gelu_ln"], out.stdout
        assert all(len(r) == 6 and all(float(v) > 0 for v in r) for r in rows.values()), out.stdout
    bad = subprocess.run([sys.executable, script, "--only", "nonsense"], env=dict(os.environ), capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "unknown workload(s) nonsense" in bad.stderr, bad.stderr[-1000:]


def test_gemm_library_benchmark_quick_run():
    script = str(ROOT / "benchmarks" / "gemm_library.py")
    out = subprocess.run([sys.executable, script, "--quick", "--only", "qwen3_attn_256x256x256", "dlrm"],
                         env=dict(os.environ), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line.split() for line in out.stdout.splitlines()]
    products = [r for r in lines if r[:1] == ["qwen3_attn_256x256x256"]]
    assert sorted(r[1] for r in products) == ["forward", "input", "weight"], out.stdout
    assert all(float(v) > 0 for r in products for v in r[2:]), out.stdout
    steps = [r for r in lines if r[:1] == ["dlrm"]]
    assert sorted(r[1] for r in steps) == ["fused", "strict"], out.stdout
    assert all(float(v) > 0 for r in steps for v in r[2:5]), out.stdout
    assert "geomean oneDNN/MKL" in out.stdout, out.stdout
    bad = subprocess.run([sys.executable, script, "--only", "nonsense"], env=dict(os.environ), capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "unknown name(s) nonsense" in bad.stderr, bad.stderr[-1000:]
