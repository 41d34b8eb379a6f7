"""The out= contract and reductions' edge cases as the CPU has them, in every
mode (each case was found by a review probing against the CPU, 2026-12-05,
and fails without its fix)."""
import warnings

import pytest
import torch

import torch_vtpu

MODES = ["strict", "fused", "debug"]


def _both(fn):
    """fn(device) on the CPU and on vtpu (the vtpu result brought back)."""
    want = fn("cpu")
    got = fn("vtpu")
    torch.vtpu.synchronize()
    return want, got


@pytest.mark.parametrize("mode", MODES)
def test_an_out_view_of_a_larger_tensor_keeps_its_geometry_and_its_base(mode):
    # A Python meta kernel returns a fresh contiguous result; its strides
    # used to be applied to the out= view, which then wrote over its base.
    def solve(dev):
        base = torch.full((5, 2), 7.0).to(dev)
        out = base[1:4]
        torch.linalg.solve((torch.eye(3) * 2).to(dev), torch.ones(3, 2).to(dev), out=out)
        return base.cpu(), out.stride(), out.storage_offset()

    def sort(dev):
        base = torch.zeros(6).to(dev)
        values = base[::2]
        torch.sort(torch.tensor([3.0, 1.0, 2.0]).to(dev), out=(values, torch.empty(3, dtype=torch.long).to(dev)))
        return base.cpu(), values.stride()

    with torch_vtpu.mode(mode):
        for fn in (solve, sort):
            want, got = _both(fn)
            assert torch.equal(got[0], want[0]), (fn.__name__, got, want)
            assert got[1:] == want[1:], fn.__name__


@pytest.mark.parametrize("mode", MODES)
def test_a_reduction_into_an_out_of_another_dtype_converts_the_input_first(mode):
    # ATen converts the input to the out's dtype before reducing.
    def reductions(dev):
        x = torch.tensor([[0.6, 0.6, 0.6]]).to(dev)
        s = torch.sum(x, 1, out=torch.empty(1, dtype=torch.long).to(dev))
        p = torch.prod(1.6 * torch.ones(1, 3).to(dev), 1, out=torch.empty(1, dtype=torch.long).to(dev))
        big = torch.tensor([[2**24, 1, 1]]).to(dev)
        f = torch.sum(big, 1, out=torch.empty(1).to(dev))
        return [t.cpu() for t in (s, p, f)]

    with torch_vtpu.mode(mode):
        want, got = _both(reductions)
        for w, g in zip(want, got):
            assert torch.equal(g, w), (got, want)
        with pytest.raises(RuntimeError, match="Expected out tensor to have dtype float"):
            torch.linalg.vector_norm(torch.ones(3).to("vtpu"), out=torch.empty((), dtype=torch.float64).to("vtpu"))
            torch.vtpu.synchronize()


@pytest.mark.parametrize("mode", MODES)
def test_max_and_min_of_no_elements_raise_the_cpus_error(mode):
    with torch_vtpu.mode(mode):
        for fn in (torch.max, torch.min):
            with pytest.raises(RuntimeError, match="Expected reduction dim to be specified"):
                fn(torch.empty(0))
            with pytest.raises(RuntimeError, match="Expected reduction dim to be specified"):
                fn(torch.empty(0, 3, dtype=torch.long).to("vtpu"))
                torch.vtpu.synchronize()
        # With elements, and along a dim of an empty tensor, as the CPU.
        assert torch.max(torch.arange(5.0).to("vtpu")).item() == 4.0
        assert torch.amax(torch.empty(0, 3).to("vtpu"), 1).shape == (0,)


@pytest.mark.parametrize("mode", MODES)
def test_argument_checks_of_atens_functions_raise_the_cpus_errors(mode):
    # Checks the generated kernels' IR does not make (found by review: these
    # computed): subtracting bool tensors, abs of bool, integers to a
    # negative power; the exception types are the CPU's.
    def calls(dev):
        b = torch.tensor([True, False, True]).to(dev)
        h = torch.ones(3, dtype=torch.half).to(dev)
        i = torch.tensor([1, 2, -1, 0]).to(dev)
        yield RuntimeError, lambda: torch.sub(b, h, out=torch.empty(3, dtype=torch.half).to(dev))
        yield RuntimeError, lambda: torch.pow(i, -1, out=torch.empty(4, dtype=torch.long).to(dev))
        yield NotImplementedError, lambda: torch.abs(b)

    with torch_vtpu.mode(mode):
        for (error, cpu_call), (_, vtpu_call) in zip(calls("cpu"), calls("vtpu")):
            with pytest.raises(error) as cpu_error:
                cpu_call()
            with pytest.raises(error) as vtpu_error:
                vtpu_call()
                torch.vtpu.synchronize()
            assert str(cpu_error.value).splitlines()[0][:40] in str(vtpu_error.value)
        # What the CPU computes still runs: an integer square, a half difference.
        i = torch.tensor([1, 2, -1, 0])
        assert torch.equal(torch.pow(i.to("vtpu"), 2).cpu(), torch.pow(i, 2))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("loss", ["mse_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy"])
def test_losses_with_a_reduction_compute_without_the_resize_warning(mode, loss, capfd):
    # mse/smooth L1/Huber reached the CPU's out= kernel with the reduced result
    # as out= (through their default-backend composite), binary cross-entropy
    # on its first call: each warned "output ... was resized" (on stderr from
    # the stream's thread in strict and fused mode). The CPU warns nothing.
    torch_vtpu.set_mode(mode)
    fn = getattr(torch.nn.functional, loss)
    gen = torch.Generator().manual_seed(3)
    a = torch.rand(6, 7, generator=gen, dtype=torch.float64).float()
    b = torch.rand(6, 7, generator=gen, dtype=torch.float64).float()
    for reduction in ["mean", "sum", "none", "mean"]:
        x_cpu = a.clone().requires_grad_()
        x = a.to("vtpu").requires_grad_()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = fn(x, b.to("vtpu"), reduction=reduction)
            result.sum().backward()
            torch.vtpu.synchronize()
        expected = fn(x_cpu, b, reduction=reduction)
        expected.sum().backward()
        assert [str(w.message) for w in caught] == []
        assert result.shape == expected.shape
        torch.testing.assert_close(result.cpu(), expected, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(x.grad.cpu(), x_cpu.grad, rtol=1e-6, atol=1e-7)
    assert "resized" not in capfd.readouterr().err


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128], ids=str)
def test_complex_solves_from_the_right_give_the_cpus_values(mode, dtype):
    # ATen's lu_solve/solve with left=False set the conjugate bit on their
    # out= instead of conjugating: the device result was the conjugate of
    # the answer (found by a dtype review); its memory now holds the values.
    torch_vtpu.set_mode(mode)
    gen = torch.Generator().manual_seed(0)
    A = torch.randn(3, 3, dtype=dtype, generator=gen)
    B = torch.randn(2, 3, dtype=dtype, generator=gen)
    LU, piv = torch.linalg.lu_factor(A)
    want = torch.linalg.lu_solve(LU, piv, B, left=False)
    LUv, pivv, Bv = LU.to("vtpu"), piv.to("vtpu"), B.to("vtpu")
    torch.testing.assert_close(torch.linalg.lu_solve(LUv, pivv, Bv, left=False).cpu(), want)
    torch.testing.assert_close(torch.linalg.solve(A.to("vtpu"), Bv, left=False).cpu(),
                               torch.linalg.solve(A, B, left=False))
    for out in (torch.empty(2, 3, dtype=dtype, device="vtpu"), torch.empty(3, 2, dtype=dtype, device="vtpu").t()):
        torch.linalg.lu_solve(LUv, pivv, Bv, left=False, out=out)
        torch.testing.assert_close(out.cpu(), want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", ["logical_and_", "ldexp_", "floor_divide_", "logaddexp_out", "logical_or_empty"])
def test_an_output_that_is_an_input_is_not_grown_to_the_broadcast_shape(mode, case):
    # The CPU raises; vtpu resized the tensor and computed the new elements
    # from fresh memory (found by a dtype review). View-like in-place ops
    # (unsqueeze_) still restride self: test_in_place_views_still_restride.
    torch_vtpu.set_mode(mode)
    calls = {
        "logical_and_": lambda d: torch.ones(5, 1, device=d).logical_and_(torch.ones(5, 5, device=d)),
        "ldexp_": lambda d: torch.ones(5, 1, device=d, dtype=torch.float64).ldexp_(
            torch.ones(5, 5, device=d, dtype=torch.int64)),
        "floor_divide_": lambda d: torch.ones(5, 1, device=d, dtype=torch.int32).floor_divide_(
            torch.ones(5, 5, device=d, dtype=torch.int32)),
        "logaddexp_out": lambda d: (lambda x: torch.logaddexp(x, torch.ones(5, 5, device=d), out=x))(
            torch.ones(5, 1, device=d)),
        # No elements before or after (an element-count test let it through).
        "logical_or_empty": lambda d: torch.ones(0, 1, 3, device=d).logical_or_(torch.ones(0, 10, 3, device=d)),
    }
    for device in ("cpu", "vtpu"):
        with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
            calls[case](device)
            torch.vtpu.synchronize()


@pytest.mark.parametrize("mode", MODES)
def test_in_place_physical_conjugation(mode):
    # Hit an internal assert: ATen's in-place kernel calls a CPU kernel stub
    # that has no vtpu entry (found by a dtype review).
    torch_vtpu.set_mode(mode)
    x = torch.tensor([1 + 2j, -3j, 4.0], dtype=torch.complex64)
    on_device = x.to("vtpu")
    on_device.conj_physical_()
    assert torch.equal(on_device.cpu(), x.clone().conj_physical_())
    assert not on_device.is_conj()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(5,), (1,), (2, 1), (1, 5), ()], ids=str)
def test_addbmm_in_place_grows_a_broadcastable_self_as_the_cpu_does(mode, shape):
    # The CPU's addbmm_ resizes a self that only broadcasts to the product's
    # shape (no warning; (2, 1) even reads its own overwritten elements).
    # vtpu raised "Trying to resize storage that is not resizable" (the
    # OpInfo in-place sweep's one failure).
    torch_vtpu.set_mode(mode)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g)
    b1, b2 = torch.randn(3, 2, 4, generator=g), torch.randn(3, 4, 5, generator=g)
    want = x.clone().addbmm_(b1, b2, alpha=0.5)
    on_device = x.to("vtpu")
    result = on_device.addbmm_(b1.to("vtpu"), b2.to("vtpu"), alpha=0.5)
    assert result is on_device
    assert on_device.shape == want.shape
    assert torch.equal(on_device.cpu(), want)


@pytest.mark.parametrize("mode", MODES)
def test_addbmm_in_place_that_cannot_broadcast_raises_and_keeps_self(mode):
    torch_vtpu.set_mode(mode)
    x = torch.arange(3.0)
    on_device = x.to("vtpu")
    b1, b2 = torch.ones(3, 2, 4), torch.ones(3, 4, 5)
    with pytest.raises(RuntimeError):
        x.clone().addbmm_(b1, b2)
    with pytest.raises(RuntimeError):
        on_device.addbmm_(b1.to("vtpu"), b2.to("vtpu"))
        torch.vtpu.synchronize()
    assert on_device.shape == (3,)
    assert torch.equal(on_device.cpu(), x)


@pytest.mark.parametrize("mode", MODES)
def test_in_place_views_still_restride(mode):
    torch_vtpu.set_mode(mode)
    for device in ("cpu", "vtpu"):
        empty = torch.ones(0, 3, device=device).unsqueeze_(0)
        assert empty.shape == (1, 0, 3)
        x = torch.arange(6.0, device=device).reshape(2, 3)
        x.t_().unsqueeze_(1).squeeze_(1).transpose_(0, 1)
        assert x.shape == (2, 3) and x.cpu().tolist() == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.parametrize("mode", ["strict", "fused", "debug"])
def test_an_out_larger_than_the_broadcast_is_resized_after_a_memoised_launch(mode):
    # The launch memo's key holds ranks and unit dims, not sizes: after a
    # functional add had memoised the kernel, an out= of 4 rows for a 1-row
    # broadcast took the memo and kept its 4 rows (the broadcast written into
    # each); ATen resizes it to 1 row, with a warning. Found by review.
    torch_vtpu.set_mode(mode)
    try:
        a = torch.arange(6.).reshape(1, 6)[:, ::2]
        b = torch.tensor([[10., 20., 30.]])
        av, bv = torch.arange(6.).reshape(1, 6).to("vtpu")[:, ::2], b.to("vtpu")  # a strided view
        av + bv
        want = torch.empty(4, 3)
        got = torch.empty(4, 3, device="vtpu")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.add(a, b, out=want)
            torch.add(av, bv, out=got)
        assert got.shape == want.shape == (1, 3)
        assert torch.equal(got.cpu(), want)
    finally:
        torch_vtpu.set_mode("strict")


@pytest.mark.parametrize("mode", ["strict", "fused", "debug"])
def test_a_bool_alpha_is_refused_for_a_float_result_as_on_the_cpu(mode):
    torch_vtpu.set_mode(mode)
    try:
        x = torch.randn(5, 3)
        for fn in (lambda a, b: torch.add(a, b, alpha=True), lambda a, b: torch.sub(a, b, alpha=True),
                   lambda a, b: a.clone().add_(b, alpha=True)):
            with pytest.raises(RuntimeError, match="Boolean alpha only supported"):
                fn(x, x)
            with pytest.raises(RuntimeError, match="Boolean alpha only supported"):
                fn(x.to("vtpu"), x.to("vtpu"))
                torch.vtpu.synchronize()
        flags = torch.tensor([True, False, True])
        assert torch.equal(torch.add(flags.to("vtpu"), flags.to("vtpu"), alpha=True).cpu(),
                           torch.add(flags, flags, alpha=True))
    finally:
        torch_vtpu.set_mode("strict")
