"""Batch norm in training mode on vTPU ops (bridge/batch_norm_lowering.cpp).

Forward (with the running statistics) and backward are checked against the
CPU to float32 rounding (channels-last inputs take a path of their own: the
statistics as column sums over an (N, H, W, C) view), every mode against the others bitwise (they run the
same ops; strict and fused fuse them the same way), and the cases left to
ATen's kernel (evaluation mode, bfloat16) still match the CPU. Fused mode
puts the ReLU after a batch norm into the normalisation's kernel.
"""
import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_vtpu

MODES = ("debug", "strict", "fused")
RTOL, ATOL = 1e-5, 2e-6

# (input shape, layout, affine, track_running_stats)
CASES = [
    ((8, 6, 5, 7), "contiguous", True, True),
    ((8, 6, 5, 7), "channels_last", True, True),
    ((4, 3, 9, 9), "contiguous", False, True),
    ((4, 3, 9, 9), "contiguous", True, False),
    ((16, 10), "contiguous", True, True),  # BatchNorm1d over (N, C)
    ((6, 4, 11), "contiguous", True, True),  # BatchNorm1d over (N, C, L)
    ((2, 5, 3, 4, 6), "contiguous", True, True),  # BatchNorm3d
    ((2, 5, 3, 4, 6), "channels_last_3d", True, True),
    ((16, 24, 12, 12), "channels_last", True, True),  # statistics as column sums
    ((32, 16, 32, 32), "contiguous", True, True),  # rows beyond the vector lanes
]


def _module(shape, affine, track):
    cls = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d, 5: nn.BatchNorm3d}[len(shape)]
    torch.manual_seed(0)
    m = cls(shape[1], affine=affine, track_running_stats=track, momentum=0.3)
    if affine:
        with torch.no_grad():
            m.weight.uniform_(0.5, 1.5)
            m.bias.uniform_(-0.5, 0.5)
    return m


def _input(shape, layout, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 3 + 1.5
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "channels_last_3d":
        x = x.contiguous(memory_format=torch.channels_last_3d)
    return x


def _run(shape, layout, affine, track, device, steps=2, dtype=torch.float32):
    """Two training steps of relu(bn(x)) with a fixed upstream gradient:
    outputs, input and parameter gradients, running statistics."""
    m = _module(shape, affine, track).to(dtype).to(device)
    results = []
    for step in range(steps):
        x = _input(shape, layout, seed=step + 1).to(dtype).to(device).requires_grad_()
        y = torch.relu(m(x))
        g = torch.linspace(-1, 1, y.numel()).reshape(y.shape).to(dtype).to(device)
        y.backward(g)
        results += [y.detach(), x.grad]
    results += [p.grad for p in m.parameters()]
    results += [b for b in m.buffers() if b.dtype.is_floating_point]
    return [r.cpu() for r in results], y


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{'x'.join(map(str, c[0]))}-{c[1]}-affine{c[2]}-stats{c[3]}")
def test_training_matches_cpu_and_modes_agree(case):
    shape, layout, affine, track = case
    expected, y_cpu = _run(shape, layout, affine, track, "cpu")
    # Gradient sums over N*H*W values (32K in the large case) differ from the
    # CPU's by more than float32 rounding, and the CPU is the less accurate:
    # each result must be as close to the float64 computation as the CPU's
    # (within twice its error), or within RTOL/ATOL of the CPU's.
    reference, _ = _run(shape, layout, affine, track, "cpu", dtype=torch.float64)
    per_mode = {}
    for mode in MODES:
        with torch_vtpu.mode(mode):
            got, y_dev = _run(shape, layout, affine, track, "vtpu")
            torch.vtpu.synchronize()
        assert len(got) == len(expected)
        for i, (a, b, r) in enumerate(zip(got, expected, reference)):
            if torch.allclose(a, b, rtol=RTOL, atol=ATOL):
                continue
            error, cpu_error = (a.double() - r).abs().max().item(), (b.double() - r).abs().max().item()
            assert error <= 2 * cpu_error, f"{mode}: result {i} off by {error} from float64, the CPU's by {cpu_error}"
        # The result has the CPU kernel's layout (channels-last stays so).
        assert y_dev.stride() == y_cpu.stride()
        per_mode[mode] = got
    for mode in ("strict", "fused"):
        for a, b in zip(per_mode[mode], per_mode["debug"]):
            assert torch.equal(a, b), f"{mode} differs from debug"


def test_training_runs_on_generated_kernels_and_evaluation_on_aten():
    x = _input((4, 3, 6, 6), "contiguous").to("vtpu")
    m = _module((4, 3, 6, 6), True, True).to("vtpu")
    torch_vtpu.reset_metrics()
    m(x)
    torch.vtpu.synchronize()
    assert "aten::native_batch_norm" not in torch_vtpu.metrics()["host_fallback_ops"]
    m.eval()
    want = m.cpu()(x.cpu())
    m.to("vtpu")
    torch_vtpu.reset_metrics()
    got = m(x)
    torch.testing.assert_close(got.cpu(), want, rtol=RTOL, atol=ATOL)
    assert "aten::native_batch_norm" in torch_vtpu.metrics()["host_fallback_ops"]


def test_bfloat16_stays_on_aten_and_matches_cpu():
    m = _module((4, 3, 6, 6), True, True).to(torch.bfloat16)
    x = _input((4, 3, 6, 6), "contiguous").to(torch.bfloat16)
    want = m(x)
    dev = _module((4, 3, 6, 6), True, True).to(torch.bfloat16).to("vtpu")
    got = dev(x.to("vtpu"))
    assert torch.equal(got.cpu(), want)
    torch.testing.assert_close(dev.running_var.cpu(), m.running_var)


def test_one_value_per_channel_raises_like_cpu():
    for device in ("cpu", "vtpu"):
        with pytest.raises(ValueError, match="more than 1 value per channel"):
            F.batch_norm(torch.randn(1, 4, device=device), None, None, training=True)


def test_fused_batch_norm_relu_does_not_store_the_normalised_values():
    """In fused mode relu(bn(x)) writes only the ReLU's result: the
    normalisation is in the ReLU's kernel and its output is never stored."""
    x = _input((8, 16, 16, 16), "contiguous").to("vtpu")
    m = _module((8, 16, 16, 16), True, True).to("vtpu")
    with torch_vtpu.mode("fused"), torch.no_grad():
        for _ in range(2):  # first sighting runs unfused while compiling
            torch.relu(m(x))
            torch.vtpu.synchronize()
            torch_vtpu._C._wait_for_fusion_compiles()
        torch_vtpu.reset_metrics()
        y = torch.relu(m(x))
        torch.vtpu.synchronize()
    metrics = torch_vtpu.metrics()
    assert metrics["dead_stores_skipped"] >= 2  # the centred square and the normalised values
    with torch_vtpu.mode("strict"), torch.no_grad():
        m2 = _module((8, 16, 16, 16), True, True).to("vtpu")
        for _ in range(3):
            want = torch.relu(m2(x))
    assert torch.equal(y.cpu(), want.cpu())


def test_no_temporaries_beyond_the_result():
    """The lowering allocates like ATen's kernel: the result and per-channel
    vectors (the centred temporary's block is free again when the result is
    allocated)."""
    x = _input((16, 32, 32, 32), "contiguous").to("vtpu")
    m = _module((16, 32, 32, 32), True, True).to("vtpu")
    nbytes = x.numel() * 4
    for mode in ("strict", "fused"):
        with torch_vtpu.mode(mode), torch.no_grad():
            torch.vtpu.synchronize()
            torch.vtpu.reset_peak_memory_stats()
            base = torch.vtpu.memory_allocated()
            y = m(x)
            torch.vtpu.synchronize()
            peak = torch.vtpu.max_memory_allocated() - base
        assert peak <= nbytes + 64 * 1024, f"{mode}: peak {peak} for an input of {nbytes} bytes"
        del y


@pytest.mark.parametrize("mode", ["debug", "strict", "fused"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_precision_input_with_float32_parameters_matches_cpu(mode, dtype):
    """A bf16/half input with float32 weight, bias or running statistics (what
    autocast leaves a BatchNorm after a convolution): the CPU keeps the
    statistics in float32; the device made them reduced and the CPU kernel
    refused its outputs (layer, batch, instance and group norm raised)."""
    import copy

    import torch.nn.functional as F

    torch_vtpu.set_mode(mode)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 5, generator=g).to(dtype)
    w, b = torch.randn(5, generator=g), torch.randn(5, generator=g)
    results = {}
    for dev in ("cpu", "vtpu"):
        X = x.detach().clone().to(dev).requires_grad_()
        W, B = w.detach().clone().to(dev).requires_grad_(), b.detach().clone().to(dev).requires_grad_()
        rm, rv = torch.zeros(4, device=dev), torch.ones(4, device=dev)
        outs = [F.layer_norm(X, (5,), W, B), F.batch_norm(X, rm, rv, W[:4], B[:4], training=True),
                F.group_norm(X, 2, W[:4], B[:4]), F.instance_norm(X, weight=W[:4], bias=B[:4])]
        stats = [torch.ops.aten.native_layer_norm(X.detach(), (5,), W.detach(), B.detach(), 1e-5)[1],
                 torch.ops.aten.native_group_norm(X.detach(), W.detach()[:4], B.detach()[:4], 3, 4, 5, 2, 1e-5)[1]]
        sum(o.float().sum() for o in outs).backward()
        results[dev] = [t.detach().cpu() for t in outs + stats + [rm, rv, X.grad, W.grad, B.grad]]
    for got, want in zip(results["vtpu"], results["cpu"]):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    # autocast around Conv2d + BatchNorm2d trains as on the CPU
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    grads = []
    for dev in ("cpu", "vtpu"):
        model = copy.deepcopy(net).to(dev)
        with torch.autocast(dev, dtype=torch.bfloat16):
            y = model(torch.randn(4, 3, 5, 5, generator=torch.Generator().manual_seed(1)).to(dev))
        y.float().sum().backward()
        grads.append(model[0].weight.grad.cpu())
    torch.testing.assert_close(grads[1], grads[0], rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("train", [False, True])
def test_parameter_gradients_when_the_input_needs_none(mode, dtype, train):
    # BatchNorm as the first layer on raw data: the backward's output_mask
    # asks for no input gradient; the CPU kernel returns none, the meta kernel
    # an empty tensor, and vtpu's out= call raised "Expected out tensor to have
    # dtype nullptr" (found by review; float32 training takes vTPU's own kernels).
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.BatchNorm1d(4), nn.InstanceNorm1d(4, affine=True)).to(dtype).train(train)
    x = torch.randn(6, 4, 5, dtype=dtype)
    dev = copy.deepcopy(cpu).to("vtpu")
    cpu(x).square().sum().backward()
    with torch_vtpu.mode(mode), warnings.catch_warnings():
        warnings.simplefilter("error")  # also the "output ... was resized" warning it gave
        dev(x.to("vtpu")).square().sum().backward()
        torch.vtpu.synchronize()
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}
    for (name, want), got in zip(cpu.named_parameters(), dev.parameters()):
        torch.testing.assert_close(got.grad.cpu(), want.grad, msg=name, **tol)


def test_compiled_parameter_gradients_when_the_input_needs_none():
    torch.manual_seed(0)
    cpu = nn.BatchNorm1d(4).double().eval()
    x = torch.randn(6, 4, dtype=torch.float64)
    dev = copy.deepcopy(cpu).to("vtpu")
    cpu(x).sum().backward()
    torch.compile(dev, backend="vtpu")(x.to("vtpu")).sum().backward()
    torch.testing.assert_close(dev.weight.grad.cpu(), cpu.weight.grad)
    torch.testing.assert_close(dev.bias.grad.cpu(), cpu.bias.grad)
