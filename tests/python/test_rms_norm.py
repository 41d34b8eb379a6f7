"""F.rms_norm / nn.RMSNorm on the device (bridge/rms_norm_ops.cpp).

ATen's rms_norm calls _fused_rms_norm, which vtpu now implements (forward and
backward) as one fused program in every mode: values match the CPU's
composite to rounding, the three modes give the same bits, strict mode runs
a handful of kernels instead of the composite's ~20, and direct calls with bad
shapes raise like ATen's checks.
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_vtpu
from torch_vtpu import _C

MODES = ("debug", "strict", "fused")
TOLERANCE = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float64: dict(rtol=1e-7, atol=1e-7),
    torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
    torch.float16: dict(rtol=2e-3, atol=2e-3),
}


def _forward_backward(device, x, w, normalized_shape, eps, grad):
    x = x.to(device).detach().requires_grad_()
    w = None if w is None else w.to(device).detach().requires_grad_()
    y = F.rms_norm(x, normalized_shape, w, eps)
    y.backward(grad.to(device))
    return [y.detach().cpu(), x.grad.cpu()] + ([] if w is None else [w.grad.cpu()])


# (input shape, normalized shape, with weight, eps): rows beyond the vector
# lanes, two normalized dims, no weight, the dtype's default eps.
CASES = [
    ((6, 10, 64), (64,), True, 1e-6),
    ((4, 5, 6, 8), (6, 8), True, 1e-5),
    ((96, 1024), (1024,), True, None),
    ((3, 7, 33), (33,), False, 1e-6),
]


@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-w{int(c[2])}-eps{c[3]}")
def test_matches_cpu_and_modes_agree_bitwise(case, dtype):
    shape, normalized_shape, with_weight, eps = case
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g).to(dtype)
    w = torch.randn(normalized_shape, generator=g).to(dtype) if with_weight else None
    grad = torch.randn(shape, generator=g).to(dtype)
    want = _forward_backward("cpu", x, w, normalized_shape, eps, grad)
    got = {}
    for mode in MODES:
        with torch_vtpu.mode(mode):
            got[mode] = _forward_backward("vtpu", x, w, normalized_shape, eps, grad)
            torch.vtpu.synchronize()
    for a, b in zip(got["strict"], want):
        torch.testing.assert_close(a, b, **TOLERANCE[dtype])
    for mode in ("strict", "fused"):
        for a, b in zip(got[mode], got["debug"]):
            assert torch.equal(a, b), f"{mode} differs from debug"


def test_strict_mode_runs_it_as_a_few_fused_kernels():
    x = torch.randn(256, 1024, device="vtpu", requires_grad=True)
    w = torch.randn(1024, device="vtpu", requires_grad=True)
    grad = torch.randn(256, 1024, device="vtpu")

    def step():
        x.grad = w.grad = None
        F.rms_norm(x, (1024,), w, 1e-6).backward(grad)
        torch.vtpu.synchronize()

    with torch_vtpu.mode("strict"):
        for _ in range(2):  # first sightings run unfused while their kernels build
            step()
            _C._wait_for_fusion_compiles()
        torch_vtpu.reset_metrics()
        step()
    kernels = torch_vtpu.metrics()["kernels_launched"]
    # The composite ran 6 kernels forward and ~20 with the backward.
    assert kernels <= 8, kernels
    assert "aten::_fused_rms_norm" not in torch_vtpu.metrics()["host_fallback_ops"]


def test_module_trains_and_compiles_like_cpu():
    torch.manual_seed(0)
    cpu = nn.RMSNorm(48)
    with torch.no_grad():
        cpu.weight.normal_()
    dev = nn.RMSNorm(48).to("vtpu")
    dev.load_state_dict(cpu.state_dict())
    x = torch.randn(5, 9, 48)
    cpu(x).square().sum().backward()
    compiled = torch.compile(dev, backend="vtpu")
    compiled(x.to("vtpu")).square().sum().backward()
    torch.testing.assert_close(dev.weight.grad.cpu(), cpu.weight.grad, rtol=1e-5, atol=1e-5)


def test_double_backward_matches_cpu():
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(4, 8, 32, generator=g), torch.randn(32, generator=g)
    grads = {}
    for device in ("cpu", "vtpu"):
        xd = x.to(device).detach().requires_grad_()
        wd = w.to(device).detach().requires_grad_()
        (gx,) = torch.autograd.grad(F.rms_norm(xd, (32,), wd).square().sum(), xd, create_graph=True)
        gx.sum().backward()
        grads[device] = [gx.detach().cpu(), xd.grad.cpu(), wd.grad.cpu()]
    for a, b in zip(grads["vtpu"], grads["cpu"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_empty_rows_give_zero_gradients():
    x = torch.randn(0, 16, device="vtpu", requires_grad=True)
    w = torch.randn(16, device="vtpu", requires_grad=True)
    F.rms_norm(x, (16,), w).sum().backward()
    assert x.grad.shape == (0, 16)
    assert torch.equal(w.grad.cpu(), torch.zeros(16))


def test_direct_calls_with_bad_shapes_raise():
    x = torch.randn(4, 8, device="vtpu")
    with pytest.raises(RuntimeError, match="expected input with shape"):
        torch.ops.aten._fused_rms_norm(x, [7], None, None)
    with pytest.raises(RuntimeError, match="Expected weight to be of same shape"):
        torch.ops.aten._fused_rms_norm(x, [8], torch.randn(4, device="vtpu"), None)
    with pytest.raises(RuntimeError, match="one per row"):
        torch.ops.aten._fused_rms_norm_backward(x, x, [8], torch.randn(3, device="vtpu"), None, [True, False])
    with pytest.raises(RuntimeError, match="does not match input"):
        torch.ops.aten._fused_rms_norm_backward(x[:2], x, [8], torch.randn(4, device="vtpu"), None, [True, False])
    # The device stays usable.
    torch.testing.assert_close(F.rms_norm(x, (8,)).cpu(), F.rms_norm(x.cpu(), (8,)))
