"""2-d max pooling on vTPU's generated kernels (host_codegen_pooling.cpp).

Values, indices and the input gradient are compared bitwise with the CPU: the
maximum is one of the inputs, the index follows ATen's rule (the first maximum
of a window, NaN wins, the last NaN), and the backward adds gradients in ATen's
order. Every mode runs the same kernels.
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_vtpu

MODES = ("debug", "strict", "fused")

# (input shape, kernel_size, stride, padding, dilation, ceil_mode)
GEOMETRIES = [
    ((2, 3, 8, 10), 2, None, 0, 1, False),
    ((2, 3, 9, 7), 2, 2, 0, 1, True),
    ((2, 4, 11, 12), 3, 2, 1, 1, False),
    ((1, 3, 6, 6), 3, 1, 1, 1, False),  # overlapping windows: gradients add
    ((1, 2, 13, 11), (3, 2), (2, 1), (1, 1), (2, 3), True),
    ((5, 10, 9), (2, 3), (2, 3), (0, 1), 1, True),  # 3-dim (C, H, W)
    ((4, 16, 32, 32), 2, 2, 0, 1, False),
]


def _data(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    # Half-integers: ties are common. Then a few NaN and -inf.
    x = (torch.randint(-4, 5, shape, generator=g) * 0.5).to(dtype)
    flat = x.view(-1)
    pick = torch.randperm(flat.numel(), generator=g)
    flat[pick[: max(1, flat.numel() // 40)]] = float("nan")
    flat[pick[-max(1, flat.numel() // 40):]] = float("-inf")
    return x


def _pool_both(x, geometry, layout=None):
    _, k, s, p, d, ceil = geometry
    xc = x.clone()
    if layout == "channels_last":
        xc = xc.contiguous(memory_format=torch.channels_last)
    elif layout == "transposed":
        xc = xc.transpose(-1, -2).contiguous().transpose(-1, -2)
    xc.requires_grad_()
    xv = xc.detach().to("vtpu").requires_grad_()
    assert xv.stride() == xc.stride()
    outs = []
    for t in (xc, xv):
        y, idx = F.max_pool2d(t, k, s, p, d, ceil, return_indices=True)
        g = torch.linspace(-1, 1, y.numel(), dtype=torch.float64).reshape(y.shape).to(y.dtype).to(y.device)
        y.backward(g)
        outs.append((y.detach().cpu(), idx.cpu(), t.grad.cpu()))
    return outs


def _bitwise(a, b):
    """Same dtype, shape and bytes (NaN payloads included)."""
    as_bytes = lambda t: t.contiguous().view(-1).view(torch.uint8)
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(as_bytes(a), as_bytes(b))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_values_indices_and_gradients_are_cpus_bits(mode, dtype):
    torch_vtpu.reset_metrics()
    with torch_vtpu.mode(mode):
        for i, geometry in enumerate(GEOMETRIES):
            x = _data(geometry[0], dtype, seed=i)
            (yc, ic, gc), (yv, iv, gv) = _pool_both(x, geometry)
            assert _bitwise(yv, yc), (geometry, dtype)
            assert torch.equal(iv, ic), (geometry, dtype)
            assert _bitwise(gv, gc), (geometry, dtype)
        torch.vtpu.synchronize()
    fallbacks = torch_vtpu.metrics()["host_fallback_ops"]
    assert not any("max_pool" in op for op in fallbacks), fallbacks


@pytest.mark.parametrize("layout", ["channels_last", "transposed"])
def test_strided_inputs_give_cpus_bits_and_layout(layout):
    torch_vtpu.reset_metrics()
    for i, geometry in enumerate(GEOMETRIES[:5]):
        (yc, ic, gc), (yv, iv, gv) = _pool_both(_data(geometry[0], torch.float32, seed=10 + i), geometry, layout)
        assert _bitwise(yv, yc) and torch.equal(iv, ic) and _bitwise(gv, gc), (geometry, layout)
        assert gv.stride() == gc.stride(), (geometry, layout)
    # Channels-last 4-d inputs run ATen's kernel, which vectorises across the
    # channels (5x faster there than the generated kernel, which vectorises
    # along W at stride C); other layouts run the generated one.
    pooled_on_aten = any("max_pool" in op for op in torch_vtpu.metrics()["host_fallback_ops"])
    assert pooled_on_aten == (layout == "channels_last")


def test_module_in_a_training_step_runs_the_generated_kernels():
    torch_vtpu.profile_ops(True)
    try:
        torch_vtpu.reset_metrics()
        pool = nn.MaxPool2d(2)
        x = torch.randn(8, 16, 32, 32, device="vtpu", requires_grad=True)
        pool(x).square().sum().backward()
        torch.vtpu.synchronize()
        by_op = torch_vtpu.metrics()["device_time_by_op"]
    finally:
        torch_vtpu.profile_ops(False)
    assert by_op["max_pool2d"][1] == 1 and by_op["max_pool2d_backward"][1] == 1, by_op
    assert not any("max_pool" in op for op in torch_vtpu.metrics()["host_fallback_ops"])


@pytest.mark.parametrize("args", [
    dict(kernel_size=0),
    dict(kernel_size=2, padding=2),  # more than half the kernel
    dict(kernel_size=9),  # output too small
    dict(kernel_size=2, stride=0),
    dict(kernel_size=(2, 2, 2)),
])
def test_invalid_geometries_raise_what_the_cpu_raises(args):
    x = torch.randn(1, 2, 6, 6)
    with pytest.raises(Exception) as cpu_error:
        F.max_pool2d(x, **args)
    with pytest.raises(type(cpu_error.value)):
        F.max_pool2d(x.to("vtpu"), **args).cpu()


def test_integer_input_takes_atens_kernel_and_matches_the_cpu():
    """The generated kernel is floating only; integer pooling stays on ATen's CPU kernel."""
    x = torch.randint(-50, 50, (2, 3, 6, 6))
    yc, ic = F.max_pool2d(x, 2, return_indices=True)
    yv, iv = F.max_pool2d(x.to("vtpu"), 2, return_indices=True)
    assert torch.equal(yv.cpu(), yc) and torch.equal(iv.cpu(), ic)


# (input shape, kernel_size, stride, padding, dilation, ceil_mode) of max_pool1d
GEOMETRIES_1D = [
    ((4, 6, 40), 3, None, 0, 1, False),
    ((4, 6, 41), 2, 2, 1, 1, True),
    ((2, 5, 33), 4, 3, 2, 2, True),
    ((7, 30), 3, 1, 1, 1, False),  # unbatched (C, L)
]


@pytest.mark.parametrize("mode", MODES)
def test_max_pool1d_without_gradients_runs_atens_1d_kernel_with_the_cpus_bits(mode):
    # ATen runs an index-free 1-d kernel for CPU tensors needing no gradient and
    # max_pool1d_with_indices for every other device; ours (the 2-d generated
    # kernel, writing unused int64 indices) took 3-8x the CPU's time (a review).
    torch_vtpu.profile_ops(True)
    try:
        torch_vtpu.reset_metrics()
        with torch_vtpu.mode(mode):
            for i, (shape, k, s, p, d, ceil) in enumerate(GEOMETRIES_1D):
                x = _data(shape, torch.float32, seed=20 + i)
                expected = F.max_pool1d(x, k, s, p, d, ceil)
                with torch.no_grad():
                    got = F.max_pool1d(x.to("vtpu").requires_grad_(), k, s, p, d, ceil)
                assert _bitwise(got.cpu(), expected), (shape, k)
                with torch.inference_mode():
                    assert _bitwise(nn.MaxPool1d(k, s, p, d, ceil_mode=ceil)(x.to("vtpu")).cpu(), expected)
            torch.vtpu.synchronize()
        by_op = torch_vtpu.metrics()["device_time_by_op"]
    finally:
        torch_vtpu.profile_ops(False)
    assert by_op["aten::max_pool1d"][1] == 2 * len(GEOMETRIES_1D), by_op
    assert not any("max_pool2d" in op for op in by_op), by_op


def test_max_pool1d_with_gradients_keeps_the_indexed_kernel_and_the_cpus_gradients():
    for i, (shape, k, s, p, d, ceil) in enumerate(GEOMETRIES_1D):
        x = _data(shape, torch.float32, seed=30 + i)
        outs = []
        for device in ("cpu", "vtpu"):
            t = x.clone().to(device).requires_grad_()
            y = F.max_pool1d(t, k, s, p, d, ceil)
            assert y.requires_grad and y.grad_fn is not None
            y.backward(torch.linspace(-1, 1, y.numel()).reshape(y.shape).to(device))
            outs.append((y.detach().cpu(), t.grad.cpu()))
        assert _bitwise(outs[1][0], outs[0][0]) and _bitwise(outs[1][1], outs[0][1]), (shape, k)
    # Forward-mode AD also needs the indexed kernel.
    import torch.autograd.forward_ad as fwAD
    x, tangent = torch.randn(2, 3, 16), torch.randn(2, 3, 16)
    results = []
    for device in ("cpu", "vtpu"):
        with fwAD.dual_level():
            dual = fwAD.make_dual(x.to(device), tangent.to(device))
            results.append(fwAD.unpack_dual(F.max_pool1d(dual, 3)).tangent.cpu())
    assert torch.equal(results[0], results[1])


@pytest.mark.parametrize("args", [dict(kernel_size=0), dict(kernel_size=2, padding=2), dict(kernel_size=50)])
def test_max_pool1d_invalid_geometries_raise_what_the_cpu_raises(args):
    x = torch.randn(1, 2, 30)
    with pytest.raises(Exception) as cpu_error:
        F.max_pool1d(x, **args)
    with torch.no_grad(), pytest.raises(type(cpu_error.value)):
        F.max_pool1d(x.to("vtpu"), **args).cpu()
    with pytest.raises(type(cpu_error.value)):
        F.max_pool1d(x.to("vtpu").requires_grad_(), **args).cpu()


def test_max_pool1d_traced_by_fake_tensors_make_fx_and_compile_sees_the_decomposition():
    # The index-free host kernel is for plain device tensors only: fake and
    # functional tensors failed ("Cannot access data pointer"), make_fx baked the
    # traced input's result in as a constant (found by review).
    from torch.fx.experimental.proxy_tensor import make_fx
    x, y = torch.randn(2, 3, 10), torch.randn(2, 3, 10)
    traced = make_fx(lambda t: F.max_pool1d(t, 3))(x.to("vtpu"))
    assert torch.equal(traced(y.to("vtpu")).cpu(), F.max_pool1d(y, 3))
    with torch.no_grad():
        compiled = torch.compile(nn.MaxPool1d(3), backend="vtpu")
        assert torch.equal(compiled(y.to("vtpu")).cpu(), F.max_pool1d(y, 3))
    torch._dynamo.reset()


def test_max_pool1d_of_integers_raises_the_cpus_error_at_the_call():
    xi = torch.randint(0, 9, (2, 3, 10))
    with pytest.raises(NotImplementedError) as cpu_error:
        F.max_pool1d(xi, 3)
    with pytest.raises(NotImplementedError) as vtpu_error:
        F.max_pool1d(xi.to("vtpu"), 3)  # no synchronisation: raised at the call
    assert str(cpu_error.value) in str(vtpu_error.value)
    torch.vtpu.synchronize()  # nothing left pending
