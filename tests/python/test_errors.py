"""Errors: asynchronous kernel errors, mixed devices, bad arguments; none abort."""
import warnings

import pytest
import torch

import torch_vtpu


def test_async_index_error_raises_at_next_sync_with_op_name():
    x = torch.randn(4, 3, device="vtpu")
    idx = torch.tensor([0, 7], device="vtpu")
    y = x.index_select(0, idx)  # queued; the bad index is only seen by the kernel
    with pytest.raises(IndexError, match="index_select"):
        torch.vtpu.synchronize()
    # The process and the device stay usable.
    assert (torch.ones(3, device="vtpu") * 2).sum().item() == 6
    del y


def test_async_error_surfaces_at_host_read():
    x = torch.randn(4, device="vtpu")
    bad = x.index_select(0, torch.tensor([9], device="vtpu"))
    with pytest.raises(IndexError):
        bad.cpu()
    assert torch.vtpu.synchronize() is None


def test_debug_mode_raises_at_the_op():
    x = torch.randn(4, 3, device="vtpu")
    with torch_vtpu.mode("debug"):
        with pytest.raises(IndexError, match="index out of range"):
            x.index_select(0, torch.tensor([0, 7], device="vtpu"))
    assert x.sum().item() == pytest.approx(x.cpu().sum().item(), rel=1e-6)


def test_mixed_device_raises_like_cuda():
    x = torch.randn(4, 4, device="vtpu")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        x + torch.randn(4, 4)
    with pytest.raises(RuntimeError, match="same device"):
        torch.mm(x, torch.randn(4, 4))
    # A CPU scalar (0-dim) is allowed, as on CUDA.
    assert torch.allclose((x * torch.tensor(2.0)).cpu(), x.cpu() * 2)


def test_shape_errors_are_raised_eagerly():
    a = torch.randn(2, 3, device="vtpu")
    b = torch.randn(4, 5, device="vtpu")
    with pytest.raises(RuntimeError):
        a @ b
    with pytest.raises(RuntimeError):
        a + b


def test_unsupported_layout_is_a_clear_error():
    # Sparse COO and the compressed layouts are supported (test_sparse.py,
    # test_sparse_compressed.py); oneDNN's opaque layout is a CPU layout.
    with pytest.raises(NotImplementedError, match="mkldnn layout: vtpu"):
        torch.empty(2, 2, device="vtpu", layout=torch._mkldnn)
    with pytest.raises(NotImplementedError, match="layout Mkldnn is not supported on vtpu"):
        torch.eye(3, device="vtpu").to_mkldnn()
    assert torch.eye(3, device="vtpu").to_sparse_csr().layout == torch.sparse_csr


_OVERLAP = "some elements of the input tensor and the written-to tensor refer to a single memory location"


def _each_raises_the_cpus_overlap_error(calls, mode, message=_OVERLAP):
    """calls(device) yields the same calls over CPU and over vtpu tensors."""
    for cpu_call, vtpu_call in zip(calls("cpu"), calls("vtpu")):
        with pytest.raises(RuntimeError, match=message):
            cpu_call()
        with torch_vtpu.mode(mode):
            with pytest.raises(RuntimeError, match=message):
                vtpu_call()
                torch.vtpu.synchronize()


@pytest.mark.parametrize("mode", ["strict", "fused", "debug"])
def test_an_out_partly_over_an_input_raises_the_cpus_error_on_the_host_path(mode):
    # The host-kernel path hands ATen CPU aliases of device memory; aliases of
    # one device storage share one CPU storage, so ATen's overlap checks fire
    # as on the CPU (before 2026-12-05 each alias had its own storage, and
    # these calls computed silently).
    def calls(dev):
        buf = torch.arange(200.0, dtype=torch.float64).to(dev)
        m = buf[:16].view(4, 4)
        yield lambda: torch.addmm(m, m, m, out=buf[2:18].view(4, 4))
        flat = torch.arange(40.0).to(dev)
        yield lambda: torch.cat([flat[:4], flat[4:8]], out=flat[2:10])
        yield lambda: torch.cumsum(flat[:10], 0, out=flat[3:13])

    _each_raises_the_cpus_overlap_error(calls, mode)
    # Aliasing the CPU allows still works: the same memory in and out.
    x = torch.arange(12.0, dtype=torch.float64).view(3, 4)
    xd = x.to("vtpu")
    with torch_vtpu.mode(mode):
        torch.cumsum(xd, 1, out=xd)
        xd.addmm_(xd[:, :3], torch.eye(3, 4, dtype=torch.float64).to("vtpu"))
    torch.cumsum(x, 1, out=x)
    x.addmm_(x[:, :3], torch.eye(3, 4, dtype=torch.float64))
    torch.testing.assert_close(xd.cpu(), x)


@pytest.mark.parametrize("mode", ["strict", "fused", "debug"])
def test_an_output_partly_over_an_input_of_a_generated_kernel_raises_the_cpus_error(mode):
    # Generated kernels leave such calls to ATen's kernel (found by review:
    # they computed silently before 2026-12-05).
    def calls(dev):
        x = torch.arange(100.0).to(dev)
        yield lambda: torch.add(x[:90], 1, out=x[5:95])
        y = torch.arange(100.0).to(dev)
        yield lambda: y[1:].add_(y[:-1])
        z = torch.arange(40.0).to(dev)
        yield lambda: torch.index_select(z[:10], 0, torch.tensor([0, 1, 2]).to(dev), out=z[1:4])

    _each_raises_the_cpus_overlap_error(calls, mode)
    # What the CPU allows gives its values: in place on the very same
    # elements, and an expanded row of the output itself (not dense, so the
    # CPU computes it in its own order: later rows see row 0 updated).
    x = torch.arange(12.0).view(3, 4)
    xd = x.to("vtpu")
    with torch_vtpu.mode(mode):
        xd.add_(xd)
        torch.add(xd, 1, out=xd)
        xd.mul_(xd[0].expand(3, 4))
    x.add_(x)
    torch.add(x, 1, out=x)
    x.mul_(x[0].expand(3, 4))
    assert torch.equal(xd.cpu(), x)


_WRITTEN_TWICE = "more than one element of the written-to tensor refers to a single memory location"


@pytest.mark.parametrize("mode", ["strict", "fused", "debug"])
def test_an_expanded_output_of_a_generated_kernel_raises_the_cpus_error(mode):
    def calls(dev):
        x = torch.zeros(5).to(dev)
        ones = torch.ones(3, 5).to(dev)
        yield lambda: torch.add(ones, 1, out=x.expand(3, 5))
        yield lambda: torch.index_select(ones, 0, torch.tensor([0, 1, 2]).to(dev), out=x.expand(3, 5))

    _each_raises_the_cpus_overlap_error(calls, mode, _WRITTEN_TWICE)
    # Overlapping windows of an unfold are allowed on the CPU: its values.
    x = torch.zeros(5)
    xd = x.to("vtpu")
    with torch_vtpu.mode(mode):
        xd.unfold(0, 2, 1).add_(1)
    x.unfold(0, 2, 1).add_(1)
    assert torch.equal(xd.cpu(), x)


@pytest.mark.parametrize("mode", ["strict", "fused", "debug"])
def test_copy_between_overlapping_tensors_raises_the_cpus_error(mode):
    # Found by review: a shifted copy chained its values, a transposed one
    # gave a corrupted matrix, where the CPU raises.
    def calls(dev):
        t = torch.arange(10000.0).to(dev)
        yield lambda: t[100:5000].copy_(t[0:4900])
        s = torch.arange(16.0).to(dev).view(4, 4)
        yield lambda: s.copy_(s.t())

    _each_raises_the_cpus_overlap_error(calls, mode)

    def expanded(dev):
        e = torch.zeros(5).to(dev)
        yield lambda: e.expand(3, 5).copy_(torch.ones(3, 5).to(dev))

    _each_raises_the_cpus_overlap_error(expanded, mode, _WRITTEN_TWICE)


@pytest.mark.parametrize("mode", ["strict", "fused", "debug"])
def test_a_copy_onto_the_same_elements_is_a_no_op_as_on_the_cpu(mode):
    # Found by a fused-mode fuzzer: ATen's copy_ returns before its overlap
    # checks when source and destination are the same elements; vtpu raised
    # the written-twice error for a tensor that overlaps itself.
    def programs(dev):
        x = torch.arange(130.0).to(dev).reshape(1, 130).expand(33, 130)
        x.permute(0, 1)[...] = x
        z = torch.as_strided(torch.arange(8.0).to(dev), (4, 3), (0, 1))
        z[...].copy_(z)
        y = torch.arange(12.0).to(dev).view(3, 4)
        y.copy_(y)
        return x, z, y

    with torch_vtpu.mode(mode):
        actual = [t.cpu() for t in programs("vtpu")]
    for a, e in zip(actual, programs("cpu")):
        assert torch.equal(a, e)
    # different elements of the same memory still raise the CPU's error
    with torch_vtpu.mode(mode), pytest.raises(RuntimeError, match="more than one element"):
        x = torch.zeros(1, 130, device="vtpu").expand(33, 130)
        x.copy_(torch.ones(33, 130, device="vtpu"))
        torch.vtpu.synchronize()


@pytest.mark.parametrize("mode", ["strict", "fused", "debug"])
def test_in_place_ops_over_overlapping_views_give_the_cpus_values(mode):
    # Views the CPU's overlap check cannot classify (not dense): it computes
    # them in its element order; generated kernels leave them to ATen's
    # (found by review: other values). Large ones (an unfold's windows
    # updated in place) race on ATen's threads on the CPU too: not compared.
    def diff(dev):
        t = torch.arange(64 * 64.0).to(dev).view(64, 64)
        t[:, 1:].t().sub_(t[:, :-1].t())
        return t.cpu()

    with torch_vtpu.mode(mode):
        want = diff("cpu")
        for _ in range(3):
            assert torch.equal(diff("vtpu"), want)


@pytest.mark.parametrize("mode", ["strict", "fused", "debug"])
def test_warnings_of_queued_kernels_are_python_warnings_at_the_next_sync(mode, capfd):
    # ATen's var warns through c10 when the degrees of freedom are <= 0. On
    # the stream's worker thread that used to print a C++ warning to stderr,
    # which Python's warnings filters cannot see; it is now issued again, as
    # the CPU's UserWarning with the CPU's message, at the next synchronisation.
    torch_vtpu.set_mode(mode)
    with warnings.catch_warnings(record=True) as on_cpu:
        warnings.simplefilter("always")
        torch.ones(1, 5).var(dim=0)
    x = torch.ones(1, 5, device="vtpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = x.var(dim=0)
        torch.vtpu.synchronize()
    assert [(w.category, str(w.message)) for w in caught] == [(w.category, str(w.message)) for w in on_cpu]
    assert len(caught) == 1
    # Filters apply to it like to any Python warning (raised at the op in
    # debug mode, at the host read otherwise), and it is issued once.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="degrees of freedom"):
            x.var(dim=0).cpu()
        torch.vtpu.synchronize()
        if mode == "debug":  # kernels run at the call: the warning is the call's
            with pytest.raises(UserWarning, match="degrees of freedom"):
                x.var(dim=0)
    assert "degrees of freedom" not in capfd.readouterr().err


def test_quantized_tensors_are_refused_at_the_call():
    """vtpu has no quantized tensor type. quantize_per_tensor used to return a tensor whose
    queued CPU kernel failed later ("Expected out tensor to have dtype c10::qint8"), at the
    next host read; now the call raises NotImplementedError, as backends without quantized
    kernels do. Fake quantization (float results) runs as on the CPU."""
    x = torch.randn(4, device="vtpu")
    with pytest.raises(NotImplementedError, match="quantized tensors are not supported"):
        torch.quantize_per_tensor(x, 0.1, 0, torch.qint8)
    with pytest.raises(NotImplementedError, match="quantized tensors are not supported"):
        torch.quantize_per_channel(x.reshape(2, 2), torch.ones(2, device="vtpu"),
                                   torch.zeros(2, dtype=torch.long, device="vtpu"), 0, torch.qint8)
    torch.testing.assert_close(torch.fake_quantize_per_tensor_affine(x, 0.1, 0, -128, 127).cpu(),
                               torch.fake_quantize_per_tensor_affine(x.cpu(), 0.1, 0, -128, 127))
    torch.vtpu.synchronize()  # nothing left pending
