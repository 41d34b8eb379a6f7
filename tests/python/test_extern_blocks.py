"""Matrix products of the host-kernel path as row blocks on the work-sharing
pool (bridge/extern_blocks.h), or column blocks for a transposed right-hand
matrix: each block a single-threaded MKL call. Results
are the CPU's to rounding (not its bits: two-threaded MKL splits the summed
dimension of some shapes, K = 1024 for one, and its summation order can
depend on a block's row count), the same bits in every mode and on every
run, for every layout and bias form ATen's mm/addmm take; other dtypes and
batched products stay on ATen's kernel."""
import pytest
import torch

import torch_vtpu

needs_mkl = pytest.mark.skipif(not torch.backends.mkl.is_available(),
                               reason="row blocks need MKL's per-thread thread count")


def _runs():
    torch.vtpu.synchronize()
    return torch_vtpu._C._gemm_row_block_runs()


def _in_every_mode(fn, runs, calls, label=""):
    """fn() in strict, fused and debug mode, each routing `calls` calls (counted by runs())."""
    got = {}
    for mode in ("strict", "fused", "debug"):
        with torch_vtpu.mode(mode):
            before = runs()
            got[mode] = fn()
            assert runs() == before + calls, (label, mode)
    return got


def _layouts(m, k, n, g):
    a = torch.randn(m, k, generator=g)
    b = torch.randn(k, n, generator=g)
    # Row-major, and transposed storage of each operand (MKL's trans flags).
    yield "contiguous", a, b
    yield "a transposed", a.t().contiguous().t(), b
    yield "b transposed", a, b.t().contiguous().t()
    yield "row slice", torch.randn(m + 5, k, generator=g)[3:3 + m], b


def _products(m, k, n, g):
    """(name, fn) pairs over CPU-built operands, each fn taking a device."""
    for layout, a, b in _layouts(m, k, n, g):
        yield layout + " mm", a, b, None, 1, 1
        for bias in (torch.randn(n, generator=g), torch.randn(m, n, generator=g), torch.randn(1, n, generator=g)):
            for beta, alpha in ((1, 1), (0.5, -2.0)):
                yield f"{layout} addmm bias{tuple(bias.shape)} beta={beta} alpha={alpha}", a, b, bias, beta, alpha


def _run(a, b, bias, beta, alpha, device):
    a, b = a.to(device), b.to(device)
    if bias is None:
        return (a @ b).cpu()
    return torch.addmm(bias.to(device), a, b, beta=beta, alpha=alpha).cpu()


@needs_mkl
@pytest.mark.parametrize("shape", [(256, 256, 768), (512, 256, 300), (37, 129, 2050), (100, 256, 256), (16, 16, 16)])
def test_mm_and_addmm_in_row_blocks_match_the_cpu_and_every_mode_bitwise(shape):
    m, k, n = shape
    g = torch.Generator().manual_seed(m * 7 + n)
    for name, a, b, bias, beta, alpha in _products(m, k, n, g):
        want = _run(a, b, bias, beta, alpha, "cpu")
        got = _in_every_mode(lambda: _run(a, b, bias, beta, alpha, "vtpu"), _runs, 1, name)
        torch.testing.assert_close(got["strict"], want, rtol=1e-5, atol=1e-5 * k ** 0.5, msg=name)
        again = _run(a, b, bias, beta, alpha, "vtpu")
        for mode, result in got.items():
            assert torch.equal(result, got["strict"]), (name, mode)
        assert torch.equal(again, got["strict"]), name


@needs_mkl
def test_linear_layers_forward_and_backward_run_in_row_blocks():
    g = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(256, 512)
    x = torch.randn(300, 256, generator=g, requires_grad=True)
    dev = torch.nn.Linear(256, 512).to("vtpu")
    dev.load_state_dict(layer.state_dict())
    xd = x.detach().to("vtpu").requires_grad_(True)
    layer(x).square().sum().backward()
    before = _runs()
    dev(xd).square().sum().backward()
    # addmm forward; mm for the input's and the weight's gradients.
    assert _runs() - before >= 3
    # Against the tensor's largest value: these products run on oneDNN
    # (test_onednn_gemm.py), ~1e-6 of it from MKL's results.
    for got, want in ((xd.grad, x.grad), (dev.weight.grad, layer.weight.grad), (dev.bias.grad, layer.bias.grad)):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=5e-6 * want.abs().max().item())


def _column_runs():
    torch.vtpu.synchronize()
    return torch_vtpu._C._gemm_column_block_runs()


@needs_mkl
@pytest.mark.parametrize("shape", [(256, 256, 768), (100, 256, 256), (37, 129, 2050), (512, 16, 256)])
def test_a_transposed_right_hand_matrix_runs_in_column_blocks(shape):
    # nn.Linear's x @ W.t(): the right-hand matrix is column-major, and the
    # product is split by columns (each block packs only its own columns).
    m, k, n = shape
    g = torch.Generator().manual_seed(n + k)
    a = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g)
    biases = (None, torch.randn(n, generator=g), torch.randn(1, n, generator=g), torch.randn(m, n, generator=g),
              torch.randn(m, 1, generator=g), torch.tensor(0.25))
    for bias in biases:
        for beta, alpha in ((1, 1), (0.5, -2.0), (0, 1)):
            if bias is None and (beta, alpha) != (1, 1):
                continue
            name = f"bias {None if bias is None else tuple(bias.shape)} beta={beta} alpha={alpha}"

            def run(device):
                ad, wd = a.to(device), w.to(device)
                if bias is None:
                    return (ad @ wd.t()).cpu()
                return torch.addmm(bias.to(device), ad, wd.t(), beta=beta, alpha=alpha).cpu()

            want = run("cpu")
            got = _in_every_mode(lambda: run("vtpu"), _column_runs, 1, name)
            torch.testing.assert_close(got["strict"], want, rtol=1e-5, atol=1e-5 * k ** 0.5, msg=name)
            for mode, result in got.items():
                assert torch.equal(result, got["strict"]), (name, mode)
            assert torch.equal(run("vtpu"), got["strict"]), name


@needs_mkl
def test_row_major_operands_and_narrow_products_keep_row_blocks():
    g = torch.Generator().manual_seed(3)
    a = torch.randn(256, 256, generator=g)
    w = torch.randn(768, 256, generator=g)
    cases = {
        "row-major right-hand matrix": lambda d: a.to(d) @ w.t().contiguous().to(d),
        "transposed left-hand matrix": lambda d: a.t().contiguous().to(d).t() @ w.t().contiguous().to(d),
        # Fewer than two blocks of 32 columns: rows.
        "narrow product": lambda d: a.to(d) @ w[:48].to(d).t(),
    }
    for name, fn in cases.items():
        rows, columns = _runs(), _column_runs()
        got = fn("vtpu").cpu()
        assert _runs() == rows + 1 and _column_runs() == columns, name
        torch.testing.assert_close(got, fn("cpu"), rtol=1e-5, atol=1e-4, msg=name)


@needs_mkl
def test_an_out_argument_overlapping_an_operand_gets_atens_result():
    # Blocks read operands other blocks may be writing: such calls run ATen's
    # kernel (found by review: a bias that is a row of out gave 87% wrong
    # values in row blocks). The in-place addmm_ keeps its row blocks.
    g = torch.Generator().manual_seed(5)
    a, w = torch.randn(256, 256, generator=g), torch.randn(256, 256, generator=g)
    o, c = torch.randn(256, 256, generator=g), torch.randn(256, 256, generator=g)
    for mode in ("strict", "fused"):
        with torch_vtpu.mode(mode):
            runs = _runs()
            ad, wd = a.to("vtpu"), w.to("vtpu")
            torch.mm(ad, wd.t(), out=ad)  # out = mat1
            # The CPU's own answer to the aliased call: the product on some
            # hosts, zeros on others (MKL on an AMD EPYC clears out first).
            want = a.clone()
            torch.mm(want, w.t(), out=want)
            torch.testing.assert_close(ad.cpu(), want, rtol=1e-5, atol=1e-4)
            od = o.to("vtpu")
            torch.addmm(od[0], a.to("vtpu"), wd.t(), out=od)  # the bias is out's first row
            want = o.clone()
            torch.addmm(want[0], a, w.t(), out=want)
            torch.testing.assert_close(od.cpu(), want, rtol=1e-5, atol=1e-4)
            assert _runs() == runs, mode
            cd = c.to("vtpu")
            cd.addmm_(a.to("vtpu"), wd.t())  # addmm.out with out = the (M, N) bias
            torch.testing.assert_close(cd.cpu(), torch.addmm(c, a, w.t()), rtol=1e-5, atol=1e-4)
            assert _runs() == runs + 1, mode


def test_a_bias_of_the_wrong_shape_raises_atens_error():
    a, w, bias = torch.randn(64, 256), torch.randn(512, 256), torch.randn(3)
    with pytest.raises(RuntimeError) as cpu_error:
        torch.addmm(bias, a, w.t())
    with pytest.raises(RuntimeError) as vtpu_error:
        torch.addmm(bias.to("vtpu"), a.to("vtpu"), w.to("vtpu").t()).cpu()
    # ATen's message, with the op's name and where it was issued around it.
    assert str(cpu_error.value).splitlines()[0] in str(vtpu_error.value)
    # beta = 0 skips the shape check at dispatch; the whole product's sizes
    # are named, not a block's, for row-major and transposed right-hand
    # matrices (row and column blocks).
    for right in (w.t(), w.t().contiguous()):
        with pytest.raises(RuntimeError) as cpu_error:
            torch.addmm(bias, a, right, beta=0)
        with pytest.raises(RuntimeError) as vtpu_error:
            torch.addmm(bias.to("vtpu"), a.to("vtpu"), right.to("vtpu"), beta=0).cpu()
        assert str(cpu_error.value).splitlines()[0] in str(vtpu_error.value)
    # The process stays usable.
    torch.testing.assert_close((a.to("vtpu") @ w.to("vtpu").t()).cpu(), a @ w.t(), rtol=1e-5, atol=1e-4)


# torch.backends.mkldnn.flags() sets the TF32 flag too, which warns on a
# build without Intel GPU support.
@pytest.mark.filterwarnings("ignore:TF32 acceleration")
def test_other_dtypes_and_shapes_stay_on_atens_kernel():
    g = torch.Generator().manual_seed(1)
    before = _runs()
    a64, b64 = torch.randn(64, 32, generator=g, dtype=torch.float64), torch.randn(32, 48, generator=g, dtype=torch.float64)
    assert torch.equal((a64.to("vtpu") @ b64.to("vtpu")).cpu(), a64 @ b64)
    abf, bbf = a64.bfloat16(), b64.bfloat16()
    assert torch.equal((abf.to("vtpu") @ bbf.to("vtpu")).cpu(), abf @ bbf)
    # Batched products (bmm) are not split here.
    a3, b3 = torch.randn(4, 64, 32, generator=g), torch.randn(4, 32, 48, generator=g)
    assert torch.equal(torch.bmm(a3.to("vtpu"), b3.to("vtpu")).cpu(), torch.bmm(a3, b3))
    # Large products keep MKL's threads (its join is a small share there, and
    # blocks would pack the right-hand matrix again each): the CPU's bits.
    # (With oneDNN on, they run whole on oneDNN: test_onednn_gemm.py.)
    with torch.backends.mkldnn.flags(enabled=False):
        a, b = torch.randn(256, 1024, generator=g), torch.randn(1024, 1024, generator=g)
        assert torch.equal((a.to("vtpu") @ b.to("vtpu")).cpu(), a @ b)
        a, b = torch.randn(4, 64, generator=g), torch.randn(64, 1 << 16, generator=g)  # a right-hand matrix beyond L2
        assert torch.equal((a.to("vtpu") @ b.to("vtpu")).cpu(), a @ b)
    assert _runs() == before


def test_shape_errors_are_atens():
    a, b = torch.randn(8, 5), torch.randn(6, 4)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        a @ b
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        (a.to("vtpu") @ b.to("vtpu")).cpu()
    # The process stays usable.
    assert torch.equal((a.to("vtpu") @ a.t().to("vtpu")).cpu(), a @ a.t())


def _attention_runs():
    torch.vtpu.synchronize()
    return torch_vtpu._C._attention_batch_block_runs()


@needs_mkl
@pytest.mark.parametrize("mode", ["strict", "fused", "debug"])
@pytest.mark.parametrize("causal,scale", [(False, None), (True, None), (True, 0.3)])
def test_flash_attention_in_batch_blocks_gives_the_cpus_bits_forward_and_backward(mode, causal, scale):
    # One batch element's attention reads nothing of another's, so each
    # block computes exactly what the whole call computes for its rows.
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(3, 4, 96, 32, generator=g, requires_grad=True) for _ in range(3))
    grad = torch.randn(3, 4, 96, 32, generator=g)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    out.backward(grad)
    with torch_vtpu.mode(mode):
        qd, kd, vd = (t.detach().to("vtpu").requires_grad_(True) for t in (q, k, v))
        before = _attention_runs()
        outd = F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal, scale=scale)
        outd.backward(grad.to("vtpu"))
        assert _attention_runs() == before + 2  # forward and backward
    assert torch.equal(outd.cpu(), out)
    for got, want in ((qd.grad, q.grad), (kd.grad, k.grad), (vd.grad, v.grad)):
        assert torch.equal(got.cpu(), want)


def test_attention_with_a_mask_dropout_or_one_batch_element_stays_on_atens_kernel():
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 2, 64, 16, generator=g) for _ in range(3))
    mask = torch.randn(64, 64, generator=g) > 0
    before = _attention_runs()
    got = F.scaled_dot_product_attention(q.to("vtpu"), k.to("vtpu"), v.to("vtpu"), attn_mask=mask.to("vtpu")).cpu()
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), rtol=1e-5, atol=1e-5)
    single = F.scaled_dot_product_attention(q[:1].to("vtpu"), k[:1].to("vtpu"), v[:1].to("vtpu")).cpu()
    torch.testing.assert_close(single, F.scaled_dot_product_attention(q[:1], k[:1], v[:1]), rtol=1e-5, atol=1e-5)
    dropped = F.scaled_dot_product_attention(q.to("vtpu"), k.to("vtpu"), v.to("vtpu"), dropout_p=0.5)
    assert dropped.shape == q.shape and torch.isfinite(dropped.cpu()).all()
    assert _attention_runs() == before


def _convolution_runs():
    torch.vtpu.synchronize()
    return torch_vtpu._C._convolution_batch_block_runs()


CONV_CASES = {
    # name: (batch, in, out, size, kwargs, channels_last)
    "cnn first layer": (32, 3, 32, 32, dict(padding=1), False),
    "cnn middle layer": (32, 32, 64, 32, dict(padding=1), False),
    "channels-last": (16, 32, 64, 16, dict(padding=1), True),
    "strided, dilated, grouped": (12, 8, 16, 15, dict(stride=2, padding=2, dilation=2, groups=2), False),
    "odd batch": (5, 8, 16, 9, dict(padding=1), False),
}


@needs_mkl
@pytest.mark.parametrize("case", list(CONV_CASES))
def test_convolution_in_batch_blocks_matches_the_cpu_and_every_mode_bitwise(case):
    # A convolution's output for one batch element reads only that element's
    # input: each block computes the same values. oneDNN may pick another
    # algorithm for a smaller batch, so the CPU's bits are not promised (the
    # CNN's layers give them), but every mode and run gives the same bits.
    import torch.nn.functional as F
    n, cin, cout, size, kwargs, channels_last = CONV_CASES[case]
    g = torch.Generator().manual_seed(n + cin)
    x = torch.randn(n, cin, size, size, generator=g)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(cout, cin // kwargs.get("groups", 1), 3, 3, generator=g)
    b = torch.randn(cout, generator=g)
    want = F.conv2d(x, w, b, **kwargs)
    got = _in_every_mode(lambda: F.conv2d(x.to("vtpu"), w.to("vtpu"), b.to("vtpu"), **kwargs), _convolution_runs, 1)
    assert got["strict"].stride() == want.stride()  # the CPU's layout (channels-last stays so)
    torch.testing.assert_close(got["strict"].cpu(), want, rtol=1e-5, atol=1e-4)
    for mode, result in got.items():
        assert torch.equal(result.cpu(), got["strict"].cpu()), mode
    if case.startswith("cnn"):
        assert torch.equal(got["strict"].cpu(), want)


@needs_mkl
@pytest.mark.parametrize("batch, cin, cout, size, blocks", [
    (32, 3, 32, 32, 8),      # 128 KiB of output per image: 8 blocks of 4
    (32, 32, 64, 32, 16),    # 256 KiB per image: blocks of 2, each block's output 512 KiB
    (4, 8, 48, 64, 4),       # 768 KiB per image: one image per block
    (5, 8, 16, 9, 5),        # a small batch: one image per block, as before
])
def test_convolution_blocks_keep_each_blocks_output_within_half_a_mebibyte(batch, cin, cout, size, blocks):
    # oneDNN reorders a plain convolution's output from its blocked layout;
    # the reorder slows sharply once a block's output outgrows the L2, so
    # blocks are cut smaller there (convolution_forward_block_size).
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(batch * cout)
    x = torch.randn(batch, cin, size, size, generator=g)
    w = torch.randn(cout, cin, 3, 3, generator=g)
    torch.vtpu.synchronize()
    before = torch_vtpu._C._convolution_batch_blocks()
    got = F.conv2d(x.to("vtpu"), w.to("vtpu"), padding=1).cpu()
    assert torch_vtpu._C._convolution_batch_blocks() - before == blocks
    torch.testing.assert_close(got, F.conv2d(x, w, padding=1), rtol=1e-5, atol=1e-4)


def test_convolution_of_one_batch_element_float64_float16_or_mixed_dtypes_stays_on_atens_kernel():
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(7)
    before = _convolution_runs()
    x, w = torch.randn(1, 3, 8, 8, generator=g), torch.randn(4, 3, 3, 3, generator=g)
    assert torch.equal(F.conv2d(x.to("vtpu"), w.to("vtpu")).cpu(), F.conv2d(x, w))
    x64, w64 = x.double().repeat(2, 1, 1, 1), w.double()
    assert torch.equal(F.conv2d(x64.to("vtpu"), w64.to("vtpu")).cpu(), F.conv2d(x64, w64))
    x16, w16 = x64.half(), w64.half()
    assert torch.equal(F.conv2d(x16.to("vtpu"), w16.to("vtpu")).cpu(), F.conv2d(x16, w16))
    # mixed dtypes: ATen's kernel raises its own error
    with pytest.raises(RuntimeError):
        F.conv2d(x64.float().bfloat16().to("vtpu"), w64.float().to("vtpu")).cpu()
    assert _convolution_runs() == before


def _layer_norm_runs():
    torch.vtpu.synchronize()
    return torch_vtpu._C._layer_norm_row_block_runs()


LAYER_NORM_CASES = {
    # name: (input shape, normalized_shape)
    "mlp rows": ((256, 1024), (1024,)),
    "batch x sequence x hidden": ((4, 64, 256), (256,)),
    "two normalised dims": ((64, 8, 128), (8, 128)),
    "rows not a multiple of the block": ((1001, 48), (48,)),
}


def _layer_norm_step(x, weight, bias, grad, normalized_shape, device):
    import torch.nn.functional as F
    x = x.detach().to(device).requires_grad_()
    w = weight.detach().to(device).requires_grad_()
    b = bias.detach().to(device).requires_grad_()
    y = F.layer_norm(x, normalized_shape, w, b, eps=1e-5)
    y.backward(grad.to(device))
    return [t.detach().cpu() for t in (y, x.grad, w.grad, b.grad)]


@pytest.mark.parametrize("case", list(LAYER_NORM_CASES))
def test_layer_norm_in_row_blocks_gives_the_cpus_rows_and_every_mode_the_same_bits(case):
    # Each row is normalised on its own, so the forward and the input gradient
    # are the CPU's bits; the weight and bias gradients sum the blocks' partial
    # sums in block order (the CPU's own sums follow its thread count).
    shape, normalized_shape = LAYER_NORM_CASES[case]
    g = torch.Generator().manual_seed(len(shape) * 100 + shape[-1])
    x = torch.randn(*shape, generator=g) * 3 + 1
    weight = torch.randn(*normalized_shape, generator=g)
    bias = torch.randn(*normalized_shape, generator=g)
    grad = torch.randn(*shape, generator=g)
    want = _layer_norm_step(x, weight, bias, grad, normalized_shape, "cpu")
    got = _in_every_mode(lambda: _layer_norm_step(x, weight, bias, grad, normalized_shape, "vtpu"),
                         _layer_norm_runs, 2)  # forward and backward
    y, dx, dw, db = got["strict"]
    assert torch.equal(y, want[0]) and torch.equal(dx, want[1])
    torch.testing.assert_close(dw, want[2], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(db, want[3], rtol=1e-5, atol=1e-4)
    for mode, results in got.items():
        for name, a, b in zip(("y", "dx", "dw", "db"), results, got["strict"]):
            assert torch.equal(a, b), (mode, name)
    with torch_vtpu.mode("strict"):
        again = _layer_norm_step(x, weight, bias, grad, normalized_shape, "vtpu")
    assert all(torch.equal(a, b) for a, b in zip(again, got["strict"]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("affine", [True, False])
def test_16bit_layer_norm_forward_in_row_blocks_gives_the_cpus_bits(dtype, affine):
    # The forward's blocks call ATen's functional kernel on their rows (its
    # .out form took 2.5x as long on 16-bit tensors): each row, its mean and
    # its rstd are the CPU's bits, in every mode. The 16-bit backward stays
    # on ATen's kernel (its weight and bias sums would round per block).
    g = torch.Generator().manual_seed(11)
    for shape, normalized_shape in (((1001, 48), (48,)), ((4, 64, 256), (256,)), ((64, 8, 128), (8, 128))):
        x = (torch.randn(*shape, generator=g) * 3 + 1).to(dtype)
        w = torch.randn(*normalized_shape, generator=g).to(dtype) if affine else None
        b = torch.randn(*normalized_shape, generator=g).to(dtype) if affine else None
        want = torch.ops.aten.native_layer_norm(x, list(normalized_shape), w, b, 1e-5)
        dev = (lambda t: None if t is None else t.to("vtpu"))
        got = _in_every_mode(
            lambda: [t.cpu() for t in torch.ops.aten.native_layer_norm(
                x.to("vtpu"), list(normalized_shape), dev(w), dev(b), 1e-5)], _layer_norm_runs, 1, str(shape))
        for mode, results in got.items():
            for name, a, e in zip(("y", "mean", "rstd"), results, want):
                assert a.dtype == e.dtype and torch.equal(a, e), (mode, name, shape)
    # The backward: the forward in blocks, the gradients on ATen's kernel.
    x = torch.randn(256, 1024, generator=g).to(dtype)
    xv = x.to("vtpu").requires_grad_()
    xc = x.clone().requires_grad_()
    before = _layer_norm_runs()
    torch.nn.functional.layer_norm(xv, (1024,)).float().sum().backward()
    torch.nn.functional.layer_norm(xc, (1024,)).float().sum().backward()
    assert torch.equal(xv.grad.cpu(), xc.grad)
    assert _layer_norm_runs() == before + 1


def test_small_or_mixed_dtype_or_weightless_layer_norm_stays_on_atens_kernel():
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(3)
    before = _layer_norm_runs()
    small = torch.randn(8, 64, generator=g)  # one block's worth
    assert torch.equal(F.layer_norm(small.to("vtpu"), (64,)).cpu(), F.layer_norm(small, (64,)))
    half = torch.randn(256, 1024, generator=g).bfloat16()
    w = torch.randn(1024, generator=g)  # float32 weight, bfloat16 input: ATen's mixed-type kernel
    assert torch.equal(F.layer_norm(half.to("vtpu"), (1024,), w.to("vtpu")).cpu(), F.layer_norm(half, (1024,), w))
    # Without a weight and bias the backward asks for the input gradient only.
    x = torch.randn(256, 1024, generator=g)
    xv = x.to("vtpu").requires_grad_()
    F.layer_norm(xv, (1024,)).sum().backward()
    xc = x.clone().requires_grad_()
    F.layer_norm(xc, (1024,)).sum().backward()
    torch.testing.assert_close(xv.grad.cpu(), xc.grad, rtol=1e-5, atol=1e-5)
    assert _layer_norm_runs() == before + 1  # that forward only


def test_layer_norm_row_blocks_raise_atens_errors():
    import torch.nn.functional as F
    x = torch.randn(64, 1024).to("vtpu")
    with pytest.raises(RuntimeError, match="normalized_shape"):
        F.layer_norm(x, (512,))
    with pytest.raises(RuntimeError, match="weight"):
        F.layer_norm(x, (1024,), torch.ones(512).to("vtpu"))


def _convolution_backward_runs():
    torch.vtpu.synchronize()
    return torch_vtpu._C._convolution_backward_batch_block_runs()


def _convolution_grads(x, w, b, go, kwargs, device):
    import torch.nn.functional as F
    xx = x.detach().to(device).requires_grad_()
    ww = w.detach().to(device).requires_grad_()
    bb = None if b is None else b.detach().to(device).requires_grad_()
    F.conv2d(xx, ww, bb, **kwargs).backward(go.to(device))
    return [t.grad.cpu() for t in (xx, ww, bb) if t is not None]


@needs_mkl
@pytest.mark.parametrize("case", list(CONV_CASES) + ["no bias"])
def test_convolution_backward_in_batch_blocks_matches_the_cpu_and_every_mode_bitwise(case):
    # Input gradients per batch block; weight and bias gradients are the
    # blocks' partial sums added in block order: the CPU's values to rounding,
    # the same bits in every mode and run.
    n, cin, cout, size, kwargs, channels_last = CONV_CASES["cnn middle layer" if case == "no bias" else case]
    g = torch.Generator().manual_seed(n * 3 + cout)
    x = torch.randn(n, cin, size, size, generator=g)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(cout, cin // kwargs.get("groups", 1), 3, 3, generator=g)
    b = None if case == "no bias" else torch.randn(cout, generator=g)
    import torch.nn.functional as F
    go = torch.randn_like(F.conv2d(x, w, b, **kwargs))
    want = _convolution_grads(x, w, b, go, kwargs, "cpu")
    got = _in_every_mode(lambda: _convolution_grads(x, w, b, go, kwargs, "vtpu"), _convolution_backward_runs, 1)
    for name, a, c in zip(("input", "weight", "bias"), got["strict"], want):
        scale = c.abs().max().item()
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5 * scale, msg=name)
    for mode, grads in got.items():
        assert all(torch.equal(a, c) for a, c in zip(grads, got["strict"])), mode
    again = _convolution_grads(x, w, b, go, kwargs, "vtpu")
    assert all(torch.equal(a, c) for a, c in zip(again, got["strict"]))


def test_convolution_backward_without_an_input_gradient_runs_in_blocks_and_transposed_stays_on_aten():
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(11)
    x, w = torch.randn(8, 3, 16, 16, generator=g), torch.randn(16, 3, 3, 3, generator=g)
    results = []
    for device in ("cpu", "vtpu"):  # a first layer: the input needs no gradient
        before = _convolution_backward_runs()
        ww = w.detach().to(device).requires_grad_()
        F.conv2d(x.to(device), ww, padding=1).square().sum().backward()
        results.append(ww.grad.cpu())
    assert _convolution_backward_runs() == before + 1
    torch.testing.assert_close(results[1], results[0], rtol=1e-5, atol=1e-5 * results[0].abs().max().item())
    wt = torch.randn(3, 8, 3, 3, generator=g)
    transposed = []
    before = _convolution_backward_runs()
    for device in ("cpu", "vtpu"):
        xx = x.detach().to(device).requires_grad_()
        ww = wt.detach().to(device).requires_grad_()
        F.conv_transpose2d(xx, ww).sum().backward()
        transposed.append((xx.grad.cpu(), ww.grad.cpu()))
    torch.testing.assert_close(transposed[1], transposed[0], rtol=1e-5, atol=1e-3)
    assert _convolution_backward_runs() == before


def _bmm_runs():
    torch.vtpu.synchronize()
    return torch_vtpu._C._bmm_batch_block_runs()


@needs_mkl
@pytest.mark.parametrize("shape", [(512, 9, 64, 9), (512, 64, 9, 9), (3, 128, 64, 128), (13, 40, 50, 60)])
@pytest.mark.parametrize("left_transposed", [False, True])
def test_bmm_in_batch_blocks_matches_the_cpu_and_every_mode_bitwise(shape, left_transposed):
    # Each product of a batch reads only its own pair of matrices; DLRM's
    # pairwise interactions (the first two shapes) give the CPU's bits.
    b, m, k, n = shape
    g = torch.Generator().manual_seed(b + m + k + n)
    left = torch.randn(b, m, k, generator=g)
    if left_transposed:
        left = left.transpose(1, 2).contiguous().transpose(1, 2)
    right = torch.randn(b, k, n, generator=g)
    want = torch.bmm(left, right)
    got = _in_every_mode(lambda: torch.bmm(left.to("vtpu"), right.to("vtpu")).cpu(), _bmm_runs, 1, str(shape))
    torch.testing.assert_close(got["strict"], want, rtol=1e-5, atol=1e-5 * k ** 0.5)
    for mode, result in got.items():
        assert torch.equal(result, got["strict"]), mode
    if b == 512:
        assert torch.equal(got["strict"], want)
    # Autograd's two products of the backward run in blocks as well.
    lv = left.to("vtpu").requires_grad_()
    before = _bmm_runs()
    torch.bmm(lv, right.to("vtpu")).sum().backward()
    assert _bmm_runs() >= before + 1
    lc = left.clone().requires_grad_()
    torch.bmm(lc, right).sum().backward()
    torch.testing.assert_close(lv.grad.cpu(), lc.grad, rtol=1e-5, atol=1e-5 * n ** 0.5)


def test_small_or_float64_bmm_stays_on_atens_kernel():
    g = torch.Generator().manual_seed(5)
    before = _bmm_runs()
    small = torch.randn(4, 8, 8, generator=g), torch.randn(4, 8, 8, generator=g)
    assert torch.equal(torch.bmm(*(t.to("vtpu") for t in small)).cpu(), torch.bmm(*small))
    wide = torch.randn(512, 9, 64, generator=g).double(), torch.randn(512, 64, 9, generator=g).double()
    assert torch.equal(torch.bmm(*(t.to("vtpu") for t in wide)).cpu(), torch.bmm(*wide))
    assert _bmm_runs() == before
    with pytest.raises(RuntimeError):
        torch.bmm(torch.randn(4, 8, 8).to("vtpu"), torch.randn(5, 8, 8).to("vtpu"))
