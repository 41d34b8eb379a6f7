"""float32 and bfloat16 products of at most 8 rows by a transposed right-hand
matrix of at least 64 KB (nn.Linear's x @ W.t() while decoding) run on vTPU's
skinny GEMM
(engine/include/vtpu/runtime/skinny_gemm.h) instead of MKL: the CPU's values
to rounding (not its bits: MKL sums in another order), the same bits in
every mode and on every run, ATen's rules for bias, alpha and beta; other
shapes, layouts and dtypes keep their kernels."""
import pytest
import torch

import torch_vtpu


def _runs():
    torch.vtpu.synchronize()
    return torch_vtpu._C._skinny_gemm_runs()


def _product(a, w, bias, beta, alpha, device):
    a, w = a.to(device), w.to(device)
    if bias is None:
        return (a @ w.t()).cpu()
    return torch.addmm(bias.to(device), a, w.t(), beta=beta, alpha=alpha).cpu()


def _routed_in_every_mode(a, w, bias, beta, alpha, name):
    """The product in strict, fused and debug mode, each routed to the skinny
    GEMM, all the same bits; returns strict's."""
    got = {}
    for mode in ("strict", "fused", "debug"):
        with torch_vtpu.mode(mode):
            before = _runs()
            got[mode] = _product(a, w, bias, beta, alpha, "vtpu")
            assert _runs() == before + 1, (name, mode)
    for mode, result in got.items():
        assert torch.equal(result, got["strict"]), (name, mode)
    return got["strict"]


def _cases(rows, k, n, g):
    a = torch.randn(rows, k, generator=g)
    w = torch.randn(n, k, generator=g)
    yield "mm", a, w, None, 1, 1
    for bias in (torch.randn(n, generator=g), torch.randn(1, n, generator=g), torch.randn(rows, n, generator=g),
                 torch.randn(rows, 1, generator=g), torch.tensor(0.25)):
        for beta, alpha in ((1, 1), (0.5, -2.0), (0, 1), (1, 3)):
            yield f"addmm bias{tuple(bias.shape)} beta={beta} alpha={alpha}", a, w, bias, beta, alpha


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("k,n", [(256, 768), (1001, 37), (7, 4096)])
def test_skinny_products_match_the_cpu_and_give_every_mode_the_same_bits(rows, k, n):
    g = torch.Generator().manual_seed(rows * 100 + k + n)
    for name, a, w, bias, beta, alpha in _cases(rows, k, n, g):
        want = _product(a, w, bias, beta, alpha, "cpu")
        got = _routed_in_every_mode(a, w, bias, beta, alpha, name)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * k ** 0.5, msg=name)
        assert torch.equal(_product(a, w, bias, beta, alpha, "vtpu"), got), name


def test_decoding_linear_layers_run_on_the_skinny_gemm():
    g = torch.Generator().manual_seed(0)
    for bias in (True, False):
        layer = torch.nn.Linear(256, 768, bias=bias)
        dev = torch.nn.Linear(256, 768, bias=bias).to("vtpu")
        dev.load_state_dict(layer.state_dict())
        for shape in ((1, 1, 256), (2, 3, 256), (1, 256)):  # one token; 6 rows; a plain vector batch
            x = torch.randn(*shape, generator=g)
            before = _runs()
            with torch.no_grad():
                got = dev(x.to("vtpu")).cpu()
            assert _runs() == before + 1, (bias, shape)
            torch.testing.assert_close(got, layer(x).detach(), rtol=1e-5, atol=1e-4)


def test_beta_zero_ignores_a_nan_bias_and_non_finite_operands_propagate():
    g = torch.Generator().manual_seed(2)
    a, w = torch.randn(2, 400, generator=g), torch.randn(48, 400, generator=g)
    nan_bias = torch.full((48,), float("nan"))
    got = _product(a, w, nan_bias, 0, 1, "vtpu")
    assert not got.isnan().any()
    torch.testing.assert_close(got, _product(a, w, nan_bias, 0, 1, "cpu"), rtol=1e-5, atol=1e-4)
    a[0, 3] = float("inf")
    w[5, 3] = 0.0  # inf * 0: NaN in (0, 5)
    w[7, 9] = float("nan")
    before = _runs()
    got = _product(a, w, None, 1, 1, "vtpu")
    assert _runs() == before + 1
    torch.testing.assert_close(got, _product(a, w, None, 1, 1, "cpu"), rtol=1e-5, atol=1e-4, equal_nan=True)
    assert got[0, 5].isnan() and got[1, 7].isnan() and got[0, 0].isinf()


def test_other_shapes_layouts_and_dtypes_keep_their_kernels():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(300, 256, generator=g)
    cases = {
        "9 rows": (torch.randn(9, 256, generator=g), lambda d, a: a.to(d) @ w.to(d).t()),
        "row-major right-hand matrix": (torch.randn(1, 256, generator=g),
                                        lambda d, a: a.to(d) @ w.t().contiguous().to(d)),
        "float64": (torch.randn(1, 256, generator=g, dtype=torch.float64),
                    lambda d, a: a.to(d) @ w.double().to(d).t()),
        "float16": (torch.randn(1, 256, generator=g).half(), lambda d, a: a.to(d) @ w.half().to(d).t()),
        "strided left-hand rows": (torch.randn(256, 2, generator=g), lambda d, a: a.to(d).t() @ w.to(d).t()),
        "empty summed dimension": (torch.randn(1, 0), lambda d, a: a.to(d) @ torch.randn(5, 0).to(d).t()),
        # Under 64 KB of right-hand matrix: in cache, MKL's (and the CPU's bits).
        "small right-hand matrix": (torch.randn(8, 5, generator=g), lambda d, a: a.to(d) @ a.to(d).t()),
    }
    for name, (a, fn) in cases.items():
        before = _runs()
        got = fn("vtpu", a)
        assert _runs() == before, name
        low = a.dtype in (torch.float16, torch.bfloat16)
        torch.testing.assert_close(got.cpu(), fn("cpu", a), rtol=1e-2 if low else 1e-5, atol=1e-2 if low else 1e-4,
                                   msg=name)


def test_an_out_argument_overlapping_an_operand_keeps_atens_result():
    g = torch.Generator().manual_seed(4)
    a, w = torch.randn(1, 256, generator=g), torch.randn(256, 256, generator=g)
    ad = a.to("vtpu")
    before = _runs()
    torch.mm(ad, w.to("vtpu").t(), out=ad)
    want = a.clone()
    torch.mm(want, w.t(), out=want)
    assert _runs() == before
    torch.testing.assert_close(ad.cpu(), want, rtol=1e-5, atol=1e-4)


def test_alpha_zero_and_signed_zeros_follow_mkl():
    # Found by review: alpha = 0 computed the product (0 * NaN = NaN where the
    # BLAS reads neither operand), and -1 * (+0) kept its -0.0 where MKL adds
    # a scaled product to a cleared result (+0.0).
    g = torch.Generator().manual_seed(6)
    a, w, bias = torch.randn(2, 256, generator=g), torch.randn(768, 256, generator=g), torch.randn(768, generator=g)
    a[1, 7] = float("nan")
    a[0, 3] = float("inf")
    for beta in (1, 0):
        before = _runs()
        got = _product(a, w, bias, beta, 0, "vtpu")
        assert _runs() == before  # MKL's
        assert torch.equal(got, _product(a, w, bias, beta, 0, "cpu")), beta
    zeros = torch.zeros(2, 256)
    for bias_term in (torch.zeros(768), bias):  # beta = 0: the bias is not read
        before = _runs()
        got = _product(zeros, w, bias_term, 0, -1, "vtpu")
        assert _runs() == before + 1
        assert not torch.signbit(got).any()


@pytest.mark.parametrize("rows", [1, 4])
def test_bfloat16_products_match_the_cpu_and_give_every_mode_the_same_bits(rows):
    # bfloat16 operands widened, float32 sums, one rounding: the CPU's bfloat16
    # GEMM to within one bfloat16 rounding.
    g = torch.Generator().manual_seed(rows)
    for name, a, w, bias, beta, alpha in _cases(rows, 512, 384, g):
        a, w = a.bfloat16(), w.bfloat16()
        bias = None if bias is None else bias.bfloat16()
        want = _product(a, w, bias, beta, alpha, "cpu")
        exact = _product(a.double(), w.double(), None if bias is None else bias.double(), beta, alpha, "cpu")
        got = _routed_in_every_mode(a, w, bias, beta, alpha, name)
        assert got.dtype == torch.bfloat16
        # Each within a bfloat16 rounding (plus float32 summation) of the exact result.
        scale = exact.abs() + 1e-2 * 512 ** 0.5
        assert ((got.double() - exact).abs() <= 2 ** -8 * scale).all(), name
        assert ((want.double() - exact).abs() <= 2 ** -8 * scale).all(), name


def test_a_bfloat16_decoding_layer_runs_on_the_skinny_gemm():
    layer = torch.nn.Linear(1024, 512).bfloat16()
    dev = torch.nn.Linear(1024, 512).bfloat16().to("vtpu")
    dev.load_state_dict(layer.state_dict())
    x = torch.randn(1, 1, 1024).bfloat16()
    before = _runs()
    with torch.no_grad():
        got = dev(x.to("vtpu")).cpu()
    assert _runs() == before + 1
    torch.testing.assert_close(got, layer(x).detach(), rtol=2e-2, atol=2e-2)
