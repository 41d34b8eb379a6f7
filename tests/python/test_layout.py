"""Result layouts: an op on vtpu returns the strides the CPU returns.

PyTorch's elementwise ops follow their inputs' memory layout (TensorIterator):
a channels-last input gives a channels-last result, a transposed one a
transposed result. Code that views results (`.view`, `.data_ptr` arithmetic,
custom kernels) depends on it, and keeping channels-last activations
channels-last is what lets oneDNN's faster convolutions be used.
"""
import pytest
import torch
import torch.nn.functional as F

import torch_vtpu

UNARY = {
    "relu": torch.relu, "exp": torch.exp, "neg": torch.neg, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
    "silu": F.silu, "gelu": F.gelu, "abs": torch.abs, "sin": torch.sin, "sqrt_abs": lambda t: t.abs().sqrt(),
    "rsqrt_abs": lambda t: (t.abs() + 1).rsqrt(), "log_abs": lambda t: (t.abs() + 1).log(),
    "clamp": lambda t: t.clamp(-0.5, 0.5), "mul_scalar": lambda t: t * 3, "add_scalar": lambda t: t + 1,
    "pow": lambda t: t.pow(2), "leaky_relu": F.leaky_relu,
}
BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": lambda a, b: a / (b.abs() + 1),
    "maximum": torch.maximum, "where": lambda a, b: torch.where(a > 0, a, b),
}


def _inputs():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(2, 6, 5, 4, generator=g)
    return {
        "channels_last": base.contiguous(memory_format=torch.channels_last),
        "transposed": torch.randn(7, 9, generator=g).t(),
        "permuted": torch.randn(3, 4, 5, generator=g).permute(2, 0, 1),
    }


@pytest.mark.parametrize("mode", ["strict", "fused", "debug"])
@pytest.mark.parametrize("layout", sorted(_inputs()))
def test_elementwise_results_keep_the_cpus_strides(mode, layout):
    x = _inputs()[layout]
    y = x.clone() * 0.5  # the same layout (clone preserves it)
    mismatches = []
    with torch_vtpu.mode(mode):
        xv, yv = x.to("vtpu"), y.to("vtpu")
        assert xv.stride() == x.stride()
        for name, fn in UNARY.items():
            expected, got = fn(x), fn(xv)
            if got.stride() != expected.stride():
                mismatches.append((name, expected.stride(), got.stride()))
            torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-6)
        for name, fn in BINARY.items():
            expected, got = fn(x, y), fn(xv, yv)
            if got.stride() != expected.stride():
                mismatches.append((name, expected.stride(), got.stride()))
            torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-6)
        torch.vtpu.synchronize()
    assert not mismatches, mismatches


@pytest.mark.parametrize("input_cl, weight_cl", [(True, False), (False, True), (True, True), (False, False)])
def test_convolution_results_keep_the_cpus_memory_format(input_cl, weight_cl):
    """The CPU's convolution returns channels-last when its input or weight is (the meta
    kernel says so only for CPU and CUDA tensors; host_path_rules.cpp gives vtpu the CPU's)."""
    x = torch.randn(2, 8, 6, 6)
    w = torch.randn(4, 8, 3, 3)
    if input_cl:
        x = x.contiguous(memory_format=torch.channels_last)
    if weight_cl:
        w = w.contiguous(memory_format=torch.channels_last)
    results = []
    for device in ("cpu", "vtpu"):
        xd = x.to(device).detach().requires_grad_()
        wd = w.to(device).detach().requires_grad_()
        y = F.conv2d(xd, wd, padding=1)
        y.backward(torch.linspace(-1, 1, y.numel()).reshape(y.shape).to(device))
        results.append((y, xd.grad, wd.grad))
    for cpu, vtpu in zip(*results):
        assert vtpu.stride() == cpu.stride()
        torch.testing.assert_close(vtpu.detach().cpu(), cpu.detach(), rtol=1e-5, atol=1e-5)


CL_REDUCTIONS = {
    "sum_nhw": lambda t: t.sum((0, 2, 3)),
    "mean_nhw_keepdim": lambda t: t.mean((0, 2, 3), keepdim=True),
    "amax_c": lambda t: t.amax(1),
    "amin_hw_keepdim": lambda t: t.amin((2, 3), keepdim=True),
    "prod_w": lambda t: (t * 0.1 + 1).prod(3),
    "sum_all": lambda t: t.sum(),
    "sum_n_negative_dims": lambda t: t.sum((-4, -1)),
}


@pytest.mark.parametrize("name", list(CL_REDUCTIONS))
def test_channels_last_reductions_run_in_memory_order_and_match_cpu(name):
    """Reductions of channels-last tensors run over the (N, H, W, C) view (a batch
    norm's statistics as column sums, not walks at stride C): values as the CPU's to
    rounding, shapes and strides as the CPU's, every mode the same bits."""
    fn = CL_REDUCTIONS[name]
    x = (torch.randn(4, 6, 5, 7) * 2).contiguous(memory_format=torch.channels_last)
    y5 = torch.randn(2, 3, 4, 5, 6).contiguous(memory_format=torch.channels_last_3d)
    expected = fn(x)
    results = {}
    xv = x.to("vtpu")
    for mode in ("debug", "strict", "fused"):
        torch_vtpu.reset_metrics()
        with torch_vtpu.mode(mode):
            got = fn(xv)
            torch.vtpu.synchronize()
        assert torch_vtpu.metrics()["host_fallback_ops"] == {}, mode  # on generated kernels
        assert got.shape == expected.shape and got.stride() == expected.stride(), (mode, got.stride())
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5)
        results[mode] = got.cpu()
    assert torch.equal(results["strict"], results["debug"]) and torch.equal(results["fused"], results["debug"])
    torch.testing.assert_close(y5.to("vtpu").sum((0, 2, 3, 4)).cpu(), y5.sum((0, 2, 3, 4)), rtol=1e-5, atol=1e-5)


def _mixed_layouts(device):
    """Operands broadcasting to (7, 3) or (2, 7, 3), in layouts TensorIterator orders
    differently, made by the same views on `device` (a copy to another device does not
    keep an expanded or sliced layout)."""
    g = torch.Generator().manual_seed(1)
    r = lambda *s: torch.randn(*s, generator=g).to(device)  # noqa: E731
    return {
        "contiguous": r(7, 3),
        "transposed": r(3, 7).t(),
        "expanded_row": r(1, 3).expand(7, 3),
        "column": r(7, 1),
        "row": r(3),
        "strided_slice": r(7, 6)[:, ::2],
        "transposed_slice": r(6, 7).t()[:, ::2],
        "batched_permuted": r(3, 2, 7).permute(1, 2, 0),
        "size_one_dims": r(7, 1, 3)[:, 0, :],
        "scalar": torch.tensor(0.5).to(device),
    }


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_mixed_layouts_give_the_cpus_strides(mode):
    """Found by fuzzing compiled mode: where(cond[7,1], expanded[7,3], transposed[7,3]) came
    back row-major where TensorIterator gives the transposed layout (the first operand of the
    result's shape, expanded, decided), and AOTAutograd's as_strided replays on such a result
    read the wrong elements. Every pair and triple of these layouts gives the CPU's strides."""
    mismatches = []
    with torch_vtpu.mode(mode):
        cpu, dev = _mixed_layouts("cpu"), _mixed_layouts("vtpu")
        names = sorted(cpu)
        for a in names:
            assert dev[a].stride() == cpu[a].stride()
            got, expected = torch.relu(dev[a]), torch.relu(cpu[a])
            if got.stride() != expected.stride():
                mismatches.append(("relu", a, expected.stride(), got.stride()))
            for b in names:
                for c in ("column", "transposed", "expanded_row", "scalar"):
                    expected = torch.where(cpu[c] > 0, cpu[a], cpu[b])
                    got = torch.where(dev[c] > 0, dev[a], dev[b])
                    if got.stride() != expected.stride():
                        mismatches.append(("where", c, a, b, expected.stride(), got.stride()))
                    assert torch.equal(got.cpu(), expected)
                expected, got = cpu[a] + cpu[b], dev[a] + dev[b]
                if got.stride() != expected.stride():
                    mismatches.append(("add", a, b, expected.stride(), got.stride()))
        torch.vtpu.synchronize()
    assert not mismatches, mismatches[:10]


LAYOUT_KEEPING_OPS = {
    "reflect_pad2d": (4, lambda t: F.pad(t, (2, 1, 2, 3), mode="reflect")),
    "replicate_pad2d": (4, lambda t: F.pad(t, (2, 1, 2, 3), mode="replicate")),
    "reflect_pad3d": (5, lambda t: F.pad(t, (1, 2, 1, 1, 2, 1), mode="reflect")),
    "replicate_pad3d": (5, lambda t: F.pad(t, (1, 2, 1, 1, 2, 1), mode="replicate")),
    "pixel_shuffle": (4, lambda t: F.pixel_shuffle(t, 2)),
    "pixel_unshuffle": (4, lambda t: F.pixel_unshuffle(t, 2)),
    "max_unpool2d": (4, lambda t: F.max_unpool2d(*F.max_pool2d(t, 2, return_indices=True), 2)),
}


@pytest.mark.parametrize("mode", ["strict", "fused", "debug"])
@pytest.mark.parametrize("name", sorted(LAYOUT_KEEPING_OPS))
def test_pads_and_pixel_shuffles_of_channels_last_inputs_match_the_cpu(mode, name):
    # The CPU kernels of these ops lay the result out in the input's memory
    # format; the meta kernels say contiguous. replication_pad2d's out= kernel
    # even restrides its out argument before writing it, so on vtpu every
    # element of a channels-last F.pad(mode="replicate") came back scrambled
    # (found by a review); the others were right but contiguous.
    torch_vtpu.set_mode(mode)
    dim, op = LAYOUT_KEEPING_OPS[name]
    g = torch.Generator().manual_seed(0)
    shape = (2, 8, 6, 4) if dim == 4 else (2, 8, 4, 6, 4)
    fmt = torch.channels_last if dim == 4 else torch.channels_last_3d
    for layout in (fmt, torch.contiguous_format):
        x = torch.randn(*shape, generator=g).contiguous(memory_format=layout)
        xc, xv = x.clone().requires_grad_(True), x.to("vtpu").requires_grad_(True)
        want, got = op(xc), op(xv)
        assert got.stride() == want.stride(), f"{layout}: strides {got.stride()}, CPU {want.stride()}"
        assert torch.equal(got.detach().cpu(), want.detach())
        grad = torch.randn(want.shape, generator=g)
        want.backward(grad)
        got.backward(grad.to("vtpu"))
        assert xv.grad.stride() == xc.grad.stride()
        torch.testing.assert_close(xv.grad.cpu(), xc.grad, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", ["strict", "fused", "debug"])
def test_3d_convolutions_keep_channels_last_3d_as_the_cpu(mode):
    # The CPU's 3-d convolutions and their transposes return channels-last-3d
    # when the input or the weight is; vtpu returned them contiguous (found by
    # a review of vision workloads; 2-d convolutions were right).
    torch_vtpu.set_mode(mode)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 5, 6, 7, generator=g)
    convs = {"conv3d": (torch.randn(3, 4, 3, 3, 3, generator=g), lambda t, w: F.conv3d(t, w, padding=1)),
             "conv_transpose3d": (torch.randn(4, 3, 3, 3, 3, generator=g),
                                  lambda t, w: F.conv_transpose3d(t, w, stride=2))}
    cl = torch.channels_last_3d
    for name, (weight, conv) in convs.items():
        for x_format, w_format in ((cl, torch.contiguous_format), (torch.contiguous_format, cl), (cl, cl),
                                   (torch.contiguous_format, torch.contiguous_format)):
            xc = x.clone(memory_format=x_format).requires_grad_(True)
            wc = weight.clone(memory_format=w_format).requires_grad_(True)
            xv = xc.detach().to("vtpu").requires_grad_(True)
            wv = wc.detach().to("vtpu").requires_grad_(True)
            want, got = conv(xc, wc), conv(xv, wv)
            case = (name, x_format, w_format)
            assert got.stride() == want.stride(), (case, got.stride(), want.stride())
            torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=1e-5, atol=1e-5)
            grad = torch.randn(want.shape, generator=g)
            want.backward(grad)
            got.backward(grad.to("vtpu"))
            torch.testing.assert_close(xv.grad.cpu(), xc.grad, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(wv.grad.cpu(), wc.grad, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_an_out_kernel_that_restrides_its_output_still_fills_it_with_the_cpus_values(mode):
    # replication_pad2d.out's CPU kernel resizes its out to the input's memory
    # format before writing. A vtpu out= keeps the geometry it had at the call
    # (it cannot change after dispatch), so the values are moved into it.
    torch_vtpu.set_mode(mode)
    x = torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    want = torch.ops.aten.replication_pad2d(x, [1, 2, 3, 1])
    out = torch.empty(2, 3, 8, 8, device="vtpu")
    got = torch.ops.aten.replication_pad2d.out(x.to("vtpu"), [1, 2, 3, 1], out=out)
    assert got is out and out.is_contiguous()
    assert torch.equal(out.cpu(), want)


@pytest.mark.parametrize("name", ["replication_pad2d", "reflection_pad2d", "replication_pad3d", "reflection_pad3d"])
def test_a_pad_into_an_out_view_with_gaps_writes_only_the_view(name):
    # The CPU's out= kernel restrides the view to dense and writes numel
    # elements from its offset, over the gaps between the view's elements (a
    # review found vtpu did the same after the restride repair above). vtpu
    # writes a dense stand-in and copies it into the view: the view gets the
    # CPU's values, every other element of its base keeps its own.
    op = getattr(torch.ops.aten, name)
    dims = 4 if name.endswith("2d") else 5
    shape = (1, 2, 3, 4) if dims == 4 else (1, 2, 3, 4, 5)
    x = torch.arange(float(torch.Size(shape).numel())).reshape(shape)
    pads = [1, 2, 1, 1] if dims == 4 else [1, 1, 1, 1, 1, 1]
    want = op(x, pads)
    big = torch.full(want.shape[:-1] + (2 * want.shape[-1],), 9.0, device="vtpu")
    out = big[..., ::2]
    got = op.out(x.to("vtpu"), pads, out=out)
    assert got is out
    assert torch.equal(out.cpu(), want)
    assert (big[..., 1::2].cpu() == 9.0).all()


HOST_PATH_ELEMENTWISE_LAYOUTS = {
    "logical_xor": lambda a, b: torch.logical_xor(a, a),
    "floor_divide": lambda a, b: a // b,
    "floor_divide_swapped": lambda a, b: b // a,
    "neg_out_resized": lambda a, b: torch.neg(a, out=torch.empty(3, device=a.device)),
    "logical_xor_out_resized": lambda a, b: torch.logical_xor(a, b, out=torch.empty(0, dtype=torch.bool, device=a.device)),
}


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("case", sorted(HOST_PATH_ELEMENTWISE_LAYOUTS))
def test_host_path_elementwise_results_take_the_cpus_layout(mode, case):
    # Found by a fused-mode fuzzer: these run ATen's CPU kernel on the host-kernel
    # path, whose result geometry came from Python reference metas that lay the
    # result out row-major (or after the second operand), where the CPU's
    # TensorIterator follows the first operand's layout.
    fn = HOST_PATH_ELEMENTWISE_LAYOUTS[case]
    a = torch.randn(5, 7, generator=torch.Generator().manual_seed(0)).t()
    b = torch.randn(7, 5, generator=torch.Generator().manual_seed(1)) + 3
    expected = fn(a, b)
    with torch_vtpu.mode(mode):
        actual = fn(a.to("vtpu"), b.to("vtpu"))
        assert actual.stride() == expected.stride(), (actual.stride(), expected.stride())
        assert torch.equal(actual.cpu(), expected)
