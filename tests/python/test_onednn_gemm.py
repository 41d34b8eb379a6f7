"""float32 mm/addmm of at least 16M multiply-adds run on oneDNN's matmul
(bridge/onednn_gemm.h) instead of MKL's GEMM: whole on oneDNN's OpenMP
threads, or in blocks of at least 128 rows (columns for a transposed
right-hand matrix) on the work-sharing pool, one single-threaded call each,
where that pays (no operands with gaps between rows; row blocks of a
transposed left-hand matrix, which oneDNN copies, only from 512 columns on).

Results are the CPU's to rounding, not its bits. The check is against a
float64 product: vtpu's error may be a small multiple of the CPU's own (MKL's
float32 error), never more; the modes and repeated runs give the same bits.
alpha or beta other than 1, other dtypes, small products and
`torch.backends.mkldnn.enabled = False` (or VTPU_ONEDNN_GEMM=0) keep MKL."""
import copy
import os
import subprocess
import sys

import pytest
import torch

import torch_vtpu

C = torch_vtpu._C
pytestmark = pytest.mark.skipif(
    not C._onednn_gemm_enabled(),
    reason="ATen's oneDNN matmul does not take float32 here (a build without oneDNN, or a CPU without AVX-512 "
           "BW/VL/DQ or AVX-NE-CONVERT)")


def _runs():
    torch.vtpu.synchronize()
    return C._onednn_gemm_runs()


def _product(a, b, bias, device, beta=1, alpha=1):
    a, b = a.to(device), b.to(device)
    if bias is None:
        return (a @ b).cpu()
    return torch.addmm(bias.to(device), a, b, beta=beta, alpha=alpha).cpu()


def _reference(a, b, bias, beta=1, alpha=1):
    exact = a.double() @ b.double()
    return exact * alpha + (bias.double() * beta if bias is not None else 0)


def _assert_as_accurate_as_the_cpu(got, a, b, bias, name, beta=1, alpha=1):
    """got's largest error against the float64 product is within 4x the CPU's
    own (plus one float32 rounding of the largest value): oneDNN sums in
    another order than MKL, ~1.5-2.7x MKL's error on these shapes."""
    exact = _reference(a, b, bias, beta, alpha)
    cpu_error = (_product(a, b, bias, "cpu", beta, alpha).double() - exact).abs().max().item()
    error = (got.double() - exact).abs().max().item()
    scale = exact.abs().max().item()
    assert error <= 4 * cpu_error + 1.2e-7 * scale, (name, error, cpu_error)


def _operands(m, k, n, g):
    a = torch.randn(m, k, generator=g)
    b = torch.randn(k, n, generator=g)
    yield "contiguous", a, b
    yield "a transposed", a.t().contiguous().t(), b
    yield "b transposed (nn.Linear)", a, b.t().contiguous().t()
    yield "both transposed", a.t().contiguous().t(), b.t().contiguous().t()
    yield "row slice", torch.randn(m + 3, k, generator=g)[2:2 + m], b


def _expected_runs(shape, layout):
    """oneDNN calls per product: none for row blocks of a transposed left-hand
    matrix (strided slices oneDNN copies first) under 512 columns, which
    products of at most 64M multiply-adds with a row-major right-hand matrix
    take."""
    m, k, n = shape
    return 0 if layout == "a transposed" and m * k * n <= 1 << 26 and n < 512 else 1


@pytest.mark.parametrize("shape", [(256, 1024, 1024), (256, 256, 768), (512, 256, 256), (300, 100, 700)])
def test_products_on_onednn_are_as_accurate_as_the_cpus_and_the_same_bits_in_every_mode(shape):
    m, k, n = shape
    g = torch.Generator().manual_seed(m + k + n)
    for layout, a, b in _operands(m, k, n, g):
        calls = _expected_runs(shape, layout)
        for bias in (None, torch.randn(n, generator=g), torch.randn(m, n, generator=g), torch.randn(1, n, generator=g)):
            name = f"{shape} {layout} bias {None if bias is None else tuple(bias.shape)}"
            got = {}
            for mode in ("strict", "fused", "debug"):
                with torch_vtpu.mode(mode):
                    before = _runs()
                    got[mode] = _product(a, b, bias, "vtpu")
                    assert _runs() == before + calls, (name, mode)
            _assert_as_accurate_as_the_cpu(got["strict"], a, b, bias, name)
            for mode, result in got.items():
                assert torch.equal(result, got["strict"]), (name, mode)
            assert torch.equal(_product(a, b, bias, "vtpu"), got["strict"]), name


def test_routes_whole_products_and_blocks_of_at_least_128():
    g = torch.Generator().manual_seed(1)
    rows, columns = C._gemm_row_block_runs, C._gemm_column_block_runs
    # More than 64M multiply-adds: one call on oneDNN's own threads.
    a, b = torch.randn(256, 1024, generator=g), torch.randn(1024, 1024, generator=g)
    r0, c0, o0 = rows(), columns(), _runs()
    _product(a, b, None, "vtpu")
    assert (_runs() - o0, rows() - r0, columns() - c0) == (1, 0, 0)
    # nn.Linear's transposed weight: column blocks.
    w = torch.randn(768, 256, generator=g)
    x = torch.randn(256, 256, generator=g)
    r0, c0, o0 = rows(), columns(), _runs()
    _product(x, w.t(), None, "vtpu")
    assert (_runs() - o0, rows() - r0, columns() - c0) == (1, 1, 1)
    # A row-major right-hand matrix: row blocks.
    r0, c0, o0 = rows(), columns(), _runs()
    _product(x, w.t().contiguous(), None, "vtpu")
    assert (_runs() - o0, rows() - r0, columns() - c0) == (1, 1, 0)
    # Row blocks of a transposed left-hand matrix (a weight gradient) are
    # strided slices oneDNN copies: MKL's row blocks under 512 columns,
    # oneDNN's from there on.
    grad = torch.randn(256, 768, generator=g)
    r0, c0, o0 = rows(), columns(), _runs()
    _product(grad.to("vtpu").t(), x, None, "vtpu")
    assert (_runs() - o0, rows() - r0, columns() - c0) == (0, 1, 0)
    left = grad[:, :256].contiguous().to("vtpu").t()
    assert left.stride() == (1, 256)
    r0, c0, o0 = rows(), columns(), _runs()
    _product(left, torch.randn(256, 512, generator=g), None, "vtpu")
    assert (_runs() - o0, rows() - r0, columns() - c0) == (1, 1, 0)
    # Operands with gaps between rows (a column slice): MKL.
    wide = torch.randn(256, 1024, generator=g)
    r0, o0 = rows(), _runs()
    _product(wide.to("vtpu")[:, :256], w.t().contiguous(), None, "vtpu")
    assert (_runs() - o0, rows() - r0) == (0, 1)


def test_small_products_scaled_products_and_other_dtypes_keep_mkl():
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(128, 128, generator=g), torch.randn(128, 128, generator=g)  # 2M multiply-adds
    big_a, big_b = torch.randn(256, 256, generator=g), torch.randn(256, 768, generator=g)
    bias = torch.randn(768, generator=g)
    before = _runs()
    _product(a, b, None, "vtpu")
    for beta, alpha in ((0.5, 1), (1, -2.0), (0, 1)):
        got = _product(big_a, big_b, bias, "vtpu", beta, alpha)
        torch.testing.assert_close(got, _product(big_a, big_b, bias, "cpu", beta, alpha), rtol=1e-5, atol=2e-4)
    _product(big_a.double(), big_b.double(), None, "vtpu")
    _product(big_a.bfloat16(), big_b.bfloat16(), None, "vtpu")
    assert _runs() == before


# torch.backends.mkldnn.flags() sets the TF32 flag too, which warns on a
# build without Intel GPU support.
@pytest.mark.filterwarnings("ignore:TF32 acceleration")
def test_torch_backends_mkldnn_flag_turns_it_off_at_run_time():
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(256, 1024, generator=g), torch.randn(1024, 1024, generator=g)
    before = _runs()
    with torch.backends.mkldnn.flags(enabled=False):
        got = _product(a, b, None, "vtpu")
    assert _runs() == before
    # Whole products on MKL are ATen's own call: the CPU's bits.
    assert torch.equal(got, a @ b)
    _product(a, b, None, "vtpu")
    assert _runs() == before + 1


@pytest.mark.filterwarnings("ignore:TF32 acceleration")
def test_the_flag_counts_as_the_product_is_issued_not_as_it_runs():
    # In fused mode a blocked product with elementwise ops over its result
    # waits in the window (matrix-product epilogues) and runs at the flush,
    # after the block that turned oneDNN off has ended.
    g = torch.Generator().manual_seed(8)
    x, w = torch.randn(256, 256, generator=g).to("vtpu"), torch.randn(768, 256, generator=g).to("vtpu")
    with torch.backends.mkldnn.flags(enabled=False):
        want_mkl = (x @ w.t() * 0.5).cpu()
    want_onednn = (x @ w.t() * 0.5).cpu()
    with torch_vtpu.mode("fused"):
        torch.vtpu.synchronize()
        before = _runs()
        with torch.backends.mkldnn.flags(enabled=False):
            off = x @ w.t() * 0.5
        on = x @ w.t() * 0.5
        torch.vtpu.synchronize()
        assert _runs() == before + 1
        assert torch.equal(off.cpu(), want_mkl)
        assert torch.equal(on.cpu(), want_onednn)


def test_vtpu_onednn_gemm_0_keeps_mkl():
    program = (
        "import torch, torch_vtpu\n"
        "a, b = torch.randn(256, 1024), torch.randn(1024, 1024)\n"
        "got = (a.to('vtpu') @ b.to('vtpu')).cpu()\n"
        "print(torch_vtpu._C._onednn_gemm_runs(), torch.equal(got, a @ b))\n")
    # (oneDNN's bits differ from MKL's here on this host, but need not on every one.)
    for value, expected in (("0", ("0", "True")), ("1", ("1",))):
        env = dict(os.environ, VTPU_ONEDNN_GEMM=value)
        out = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        got = tuple(out.stdout.split("\n")[-2].split())
        assert got[:len(expected)] == expected, (value, out.stdout, out.stderr)


def test_hosts_where_atens_onednn_refuses_float32_keep_mkl():
    # ONEDNN_MAX_CPU_ISA=AVX2 caps oneDNN as on an AVX2-only processor, where
    # ATen's mkldnn_matmul raises for float32: products must run on MKL.
    program = (
        "import torch, torch_vtpu\n"
        "a, b = torch.randn(256, 1024), torch.randn(1024, 1024)\n"
        "x, w = torch.randn(256, 256), torch.randn(256, 768)\n"
        "q, k = torch.randn(96, 128, 64), torch.randn(96, 64, 128)\n"
        "whole = (a.to('vtpu') @ b.to('vtpu')).cpu()\n"
        "blocks = (x.to('vtpu') @ w.to('vtpu')).cpu()\n"
        "batched = torch.bmm(q.to('vtpu'), k.to('vtpu')).cpu()\n"
        "torch.testing.assert_close(blocks, x @ w, rtol=1e-5, atol=2e-4)\n"
        "torch.testing.assert_close(batched, torch.bmm(q, k), rtol=1e-5, atol=2e-4)\n"
        "print(torch_vtpu._C._onednn_gemm_enabled(), torch_vtpu._C._onednn_gemm_runs(), torch.equal(whole, a @ b))\n")
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2")
    out = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "False 0 True", out.stdout


def test_batched_products_into_an_operand_give_the_cpus_result():
    g = torch.Generator().manual_seed(9)
    a, b = torch.randn(96, 128, 128, generator=g), torch.randn(96, 128, 128, generator=g)
    for which in ("left", "right"):
        cpu_a, cpu_b = a.clone(), b.clone()
        dev_a, dev_b = a.to("vtpu"), b.to("vtpu")
        want = torch.bmm(cpu_a, cpu_b, out=cpu_a if which == "left" else cpu_b)
        got = torch.bmm(dev_a, dev_b, out=dev_a if which == "left" else dev_b)
        assert torch.equal(got.cpu(), want), which


def test_mm_ignores_what_the_out_buffer_held_and_non_finite_operands_propagate():
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(256, 256, generator=g), torch.randn(256, 768, generator=g)
    out = torch.full((256, 768), float("nan"), device="vtpu")
    before = _runs()
    torch.mm(a.to("vtpu"), b.to("vtpu"), out=out)
    assert _runs() == before + 1
    assert torch.isfinite(out.cpu()).all()
    a[3, 5], a[7, 0], b[9, 100] = float("nan"), float("inf"), float("-inf")
    bias = torch.randn(768, generator=g)
    bias[11] = float("nan")
    want = torch.addmm(bias, a, b)
    got = _product(a, b, bias, "vtpu")
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    finite = torch.isfinite(want)
    torch.testing.assert_close(got[finite], want[finite], rtol=1e-5, atol=2e-4)


def test_in_place_addmm_reads_its_own_rows_before_writing_them():
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(512, 256, generator=g), torch.randn(256, 256, generator=g)
    c = torch.randn(512, 256, generator=g)
    before = _runs()
    dev = c.to("vtpu")
    dev.addmm_(a.to("vtpu"), b.to("vtpu"))
    assert _runs() == before + 1
    _assert_as_accurate_as_the_cpu(dev.cpu(), a, b, c, "addmm_")


def test_linear_training_compiled_matches_strict_bitwise():
    torch.manual_seed(6)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
    x = torch.randn(256, 512)

    def step(m):
        m.zero_grad()
        loss = m(x.to("vtpu")).square().mean()
        loss.backward()
        return loss.detach().cpu(), [p.grad.cpu() for p in m.parameters()]

    eager = copy.deepcopy(model).to("vtpu")
    before = _runs()
    want_loss, want_grads = step(eager)
    assert _runs() - before >= 4  # two forward products, their input and weight gradients
    compiled = torch.compile(eager, backend="vtpu")
    got_loss, got_grads = step(compiled)
    assert torch.equal(got_loss, want_loss)
    for got, want in zip(got_grads, want_grads):
        assert torch.equal(got, want)
    cpu = model
    cpu.zero_grad()
    cpu(x).square().mean().backward()
    for got, want in zip(want_grads, [p.grad for p in cpu.parameters()]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def _batched(a, b, device):
    return torch.bmm(a.to(device), b.to(device)).cpu()


@pytest.mark.parametrize("shape", [(96, 128, 64, 128), (48, 256, 256, 64), (16, 100, 300, 200)])
def test_batched_products_run_in_onednn_blocks_as_accurate_as_the_cpus(shape):
    batch, m, k, n = shape
    g = torch.Generator().manual_seed(batch + m + k + n)
    a = torch.randn(batch, m, k, generator=g)
    b = torch.randn(batch, k, n, generator=g)
    # Attention's q @ k.transpose(-2, -1): a right-hand batch of column-major matrices.
    b_transposed = torch.randn(batch, n, k, generator=g).to("vtpu").transpose(1, 2)
    for name, right in (("row-major", b), ("transposed", b_transposed)):
        got = {}
        for mode in ("strict", "fused", "debug"):
            with torch_vtpu.mode(mode):
                before, blocks = _runs(), C._bmm_batch_block_runs()
                got[mode] = _batched(a, right, "vtpu")
                assert (_runs() - before, C._bmm_batch_block_runs() - blocks) == (1, 1), (name, mode)
        cpu_right = right.cpu()
        exact = a.double() @ cpu_right.double()
        cpu_error = (torch.bmm(a, cpu_right).double() - exact).abs().max().item()
        error = (got["strict"].double() - exact).abs().max().item()
        assert error <= 4 * cpu_error + 1.2e-7 * exact.abs().max().item(), (name, error, cpu_error)
        for mode, result in got.items():
            assert torch.equal(result, got["strict"]), (name, mode)
        assert torch.equal(_batched(a, right, "vtpu"), got["strict"]), name


def test_small_or_gapped_batched_products_keep_mkl():
    g = torch.Generator().manual_seed(7)
    small_a, small_b = torch.randn(512, 9, 64, generator=g), torch.randn(512, 64, 9, generator=g)  # DLRM's
    wide = torch.randn(96, 128, 200, generator=g).to("vtpu")
    b = torch.randn(96, 128, 128, generator=g)
    before, blocks = _runs(), C._bmm_batch_block_runs()
    torch.testing.assert_close(_batched(small_a, small_b, "vtpu"), torch.bmm(small_a, small_b))
    gapped = wide[:, :, :128]  # rows with gaps: oneDNN would copy it first
    torch.testing.assert_close(_batched(gapped, b, "vtpu"), torch.bmm(gapped.cpu(), b), rtol=1e-5, atol=2e-4)
    assert _runs() == before
    assert C._bmm_batch_block_runs() - blocks == 2
