"""Ops users define or that ATen composes for every device: custom ops with Python
kernels, custom ops whose fake disagrees with their kernel, ops with no kernel at all,
and torch's PrivateUse1 gaps (fake convolution layout, RNG higher-order ops) outside
backend="vtpu"."""
import subprocess
import sys
import textwrap
import uuid

import pytest
import torch

import torch_vtpu

MODES = ["strict", "fused", "debug"]


def _unique(name: str) -> str:
    # torch.library names live for the process: one per test instance.
    return f"vtpu_test_{name}_{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("mode", MODES)
def test_a_python_kernel_runs_at_the_call_with_the_callers_state(mode):
    torch_vtpu.set_mode(mode)
    state = {"scale": 2.0, "calls": 0}
    ns = _unique("state")

    @torch.library.custom_op(f"{ns}::scaled", mutates_args=(), device_types="cpu")
    def scaled(x: torch.Tensor) -> torch.Tensor:
        state["calls"] += 1
        return x * state["scale"]

    @scaled.register_fake
    def _(x):
        return torch.empty_like(x)

    a = torch.randn(600, 600, device="vtpu")
    busy = a @ a  # work queued ahead of the op
    y = scaled(torch.ones(4, device="vtpu"))
    calls_at_return = state["calls"]
    state["scale"] = 3.0  # the caller moves on
    assert calls_at_return == 1  # the CPU's: the kernel ran inside the call
    assert y.cpu().tolist() == [2.0] * 4
    assert busy.shape == (600, 600)


@pytest.mark.parametrize("mode", MODES)
def test_a_python_kernel_that_uses_vtpu_tensors_sees_the_work_before_it(mode):
    torch_vtpu.set_mode(mode)
    ns = _unique("uses")
    w = torch.full((4,), 3.0, device="vtpu")

    @torch.library.custom_op(f"{ns}::times_sum", mutates_args=(), device_types="cpu")
    def times_sum(x: torch.Tensor) -> torch.Tensor:
        return x * w.sum().item()

    @times_sum.register_fake
    def _(x):
        return torch.empty_like(x)

    # Queued, the kernel's own ops ran ahead of it on a block its dropped input had.
    got = times_sum(torch.ones(4, device="vtpu") * 2).cpu()
    assert got.tolist() == [24.0] * 4


@pytest.mark.parametrize("mode", MODES)
def test_a_python_kernel_gives_its_own_dtype_and_shape_not_its_fakes(mode):
    torch_vtpu.set_mode(mode)
    ns = _unique("fake")

    @torch.library.custom_op(f"{ns}::to_long", mutates_args=(), device_types="cpu")
    def to_long(x: torch.Tensor) -> torch.Tensor:
        return x.long() * 16777217

    @to_long.register_fake
    def _(x):
        return torch.empty_like(x)  # wrong: float32

    @torch.library.custom_op(f"{ns}::doubled", mutates_args=(), device_types="cpu")
    def doubled(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x])

    @doubled.register_fake
    def _(x):
        return torch.empty_like(x)  # wrong: half the length

    x = torch.ones(3)
    want = to_long(x)
    got = to_long(x.to("vtpu"))
    assert got.dtype == want.dtype == torch.int64
    assert torch.equal(got.cpu(), want)  # float32 would have rounded 16777217
    assert doubled(x.to("vtpu")).cpu().shape == doubled(x).shape == (6,)


def test_a_queued_kernel_with_another_dtype_than_promised_raises_and_then_runs_synchronously():
    """A C++ CPU kernel is queued with the result its meta kernel promised. A CPU
    kernel of another dtype raised nothing: its values were cast into the promised
    buffer. A kernel registered from a file named like C++ source stands in for one."""
    torch_vtpu.set_mode("strict")
    ns = _unique("cpp")
    source = textwrap.dedent(f"""
        import torch
        lib = torch.library.Library("{ns}", "DEF")
        lib.define("to_long(Tensor x) -> Tensor")
        lib.impl("to_long", lambda x: x.long() * 16777217, "CPU")
        lib.impl("to_long", lambda x: torch.empty_like(x), "Meta")
    """)
    scope = {}
    exec(compile(source, "registered_kernels.cpp", "exec"), scope)
    op = getattr(getattr(torch.ops, ns), "to_long")
    x = torch.ones(3, device="vtpu")
    first = op(x)
    with pytest.raises(RuntimeError, match="dtype Long where its meta kernel promised shape .* dtype Float"):
        torch.vtpu.synchronize()
    del first
    again = op(x)  # remembered: synchronous, with the CPU's result
    assert again.dtype == torch.int64
    assert again.cpu().tolist() == [16777217] * 3


@pytest.mark.parametrize("mode", MODES)
def test_an_op_with_no_kernel_says_vtpu_first(mode):
    torch_vtpu.set_mode(mode)
    ns = _unique("nokernel")
    lib = torch.library.Library(ns, "DEF")
    lib.define("r(Tensor x) -> Tensor")
    lib.impl("r", lambda x: x + 1, "CUDA")
    op = getattr(torch.ops, ns).r
    with pytest.raises(NotImplementedError) as raised:
        op(torch.ones(2, device="vtpu"))
        torch.vtpu.synchronize()
    first_line = str(raised.value).splitlines()[0]
    assert f"Could not run '{ns}::r' with arguments from the 'vtpu' backend" in first_line
    torch.vtpu.synchronize()  # the process stays usable
    assert (torch.ones(2, device="vtpu") + 1).cpu().tolist() == [2.0, 2.0]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("args", [(8,), (8, False), (8, True, 5.0), (9, False, 0.5), (1,), (0,)])
def test_kaiser_window_is_the_cpus(mode, args):
    torch_vtpu.set_mode(mode)
    for dtype in (torch.float32, torch.float64):
        want = torch.kaiser_window(*args, dtype=dtype)
        got = torch.kaiser_window(*args, dtype=dtype, device="vtpu")
        assert got.device.type == "vtpu" and got.dtype == dtype
        assert torch.equal(got.cpu(), want)
    with pytest.raises(RuntimeError, match="non-negative"):
        torch.kaiser_window(-1, device="vtpu")


@pytest.mark.parametrize("mode", MODES)
def test_linalg_results_have_the_cpus_strides(mode):
    """lstsq's solution is a view of a column-major buffer on the CPU, eig's
    eigenvectors are column-major; their meta kernels say row-major."""
    torch_vtpu.set_mode(mode)
    torch.manual_seed(0)
    a, b, s = torch.randn(2, 6, 4), torch.randn(2, 6, 3), torch.randn(2, 4, 4)
    want, got = torch.linalg.lstsq(a, b), torch.linalg.lstsq(a.to("vtpu"), b.to("vtpu"))
    assert got.solution.stride() == want.solution.stride() == (18, 1, 6)
    assert got.solution.storage_offset() == want.solution.storage_offset()
    torch.testing.assert_close(got.solution.cpu(), want.solution)
    vectors = torch.linalg.eig(s.to("vtpu")).eigenvectors
    assert vectors.stride() == torch.linalg.eig(s).eigenvectors.stride() == (16, 1, 4)
    # The solution is a view that can be used as any result.
    doubled = got.solution * 2
    torch.testing.assert_close(doubled.cpu(), want.solution * 2)


def test_privateuse1_gaps_are_closed_without_the_vtpu_compile_backend(tmp_path):
    """Fake vtpu convolutions get the device's channels-last layout, and torch's RNG
    higher-order ops have vtpu kernels, as soon as torch_vtpu is imported: other
    torch.compile backends, FakeTensorMode and export use them too."""
    script = tmp_path / "gaps.py"
    script.write_text(textwrap.dedent("""
        import sys
        import torch
        import torch_vtpu
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.utils.checkpoint import checkpoint

        assert "torch_vtpu.compiler" not in sys.modules
        x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last).to("vtpu")
        w = torch.randn(4, 3, 3, 3).to("vtpu")
        real = torch.nn.functional.conv2d(x, w)
        with FakeTensorMode() as mode:
            fake = torch.nn.functional.conv2d(mode.from_tensor(x), mode.from_tensor(w))
        assert fake.stride() == real.stride(), (fake.stride(), real.stride())

        net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(144, 2)).to("vtpu")
        net = net.to(memory_format=torch.channels_last)
        out = torch.compile(net, backend="aot_eager")(x)
        assert out.shape == (2, 2)

        def block(t):
            return torch.nn.functional.dropout(t.sin(), 0.5, training=True).sum()

        def f(t):
            return checkpoint(block, t, use_reentrant=False)

        t = torch.randn(64, device="vtpu", requires_grad=True)
        torch.manual_seed(0)
        torch.compile(f, backend="aot_eager")(t).backward()
        assert t.grad is not None and torch.isfinite(t.grad.cpu()).all()
        print("ok")
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_recurrent_layers_run_under_inference_mode(mode, cell):
    """Under inference_mode the autograd keys are skipped and the fused cells reach the
    backend key, where ATen's CPU has no kernel for them (NotImplementedError before)."""
    torch_vtpu.set_mode(mode)
    torch.manual_seed(0)
    layer = (torch.nn.LSTM if cell == "lstm" else torch.nn.GRU)(8, 16, num_layers=2, batch_first=True).eval()
    x = torch.randn(3, 5, 8)
    with torch.inference_mode():
        want = layer(x)[0]
        layer.to("vtpu")
        got = layer(x.to("vtpu"))[0].cpu()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
def test_integer_arange_with_fractional_arguments_is_the_cpus(mode, dtype):
    """Start and step are truncated, the length comes from the unrounded values
    (arange(0, 1, 0.1, dtype=int32) is ten zeros on the CPU; vtpu raised "Trying to
    resize storage that is not resizable" for every integer type but int64)."""
    torch_vtpu.set_mode(mode)
    for args in [(0, 1, 0.1), (1, 2, 1 / 3), (0.5, 10, 2.5), (10, 0, -2.5), (-3.7, 5, 1.9), (-300, 300, 7.3)]:
        try:
            want = torch.arange(*args, dtype=dtype)
        except Exception as error:  # int64 refuses a step that truncates to 0
            with pytest.raises(type(error)):
                torch.arange(*args, dtype=dtype, device="vtpu").cpu()
            continue
        got = torch.arange(*args, dtype=dtype, device="vtpu").cpu()
        assert got.dtype == dtype and torch.equal(got, want), args


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.float64, torch.float32,
                                   torch.bfloat16, torch.float16])
def test_arange_beyond_two_to_the_53_has_the_cpus_length_and_values(mode, dtype):
    """The CPU kernel computes arange's length in doubles (int64: integers), the meta
    kernel in exact integers: they disagree beyond 2^53, and vtpu gave the meta's length
    with unwritten elements (arange(2**62, 2**62 + 10, 3, dtype=int32): 4 leftover values
    where the CPU has none) or raised "Trying to resize storage that is not resizable"
    (arange(2**53, 2**53 + 3, dtype=float64): the CPU has 4 elements)."""
    torch_vtpu.set_mode(mode)
    for args in [(2**62, 2**62 + 10, 3), (2**53, 2**53 + 3, 1), (2**62, 2**62 + 1, 1), (-(2**60), -(2**60) + 7, 2),
                 (0, 5, 0.5)]:
        try:
            want = torch.arange(*args, dtype=dtype)
        except Exception as error:  # a dtype that cannot hold the values
            with pytest.raises(type(error)):
                torch.arange(*args, dtype=dtype, device="vtpu").cpu()
            continue
        got = torch.arange(*args, dtype=dtype, device="vtpu").cpu()
        assert got.dtype == dtype and got.shape == want.shape and torch.equal(got, want), args


@pytest.mark.parametrize("mode", MODES)
def test_arange_into_an_out_of_another_size_warns_as_the_cpu(mode):
    torch_vtpu.set_mode(mode)
    for dtype in (torch.float32, torch.bfloat16):
        out = torch.zeros(7, dtype=dtype, device="vtpu")
        with pytest.warns(UserWarning, match=r"out tensor of shape \[7\] is 7 which does not match the computed "
                                             r"number of elements 3"):
            torch.arange(0, 3, out=out)
        assert torch.equal(out.cpu(), torch.arange(0, 3, dtype=dtype))


@pytest.mark.parametrize("mode", MODES)
def test_set_checks_the_storage_offset_and_strides_as_the_cpu(mode):
    torch_vtpu.set_mode(mode)
    for device in ["cpu", "vtpu"]:
        storage = (torch.arange(8.0, device=device) - 5).untyped_storage()
        for offset, size, stride, message in [(-1, (2,), (1,), "invalid storage offset -1"),
                                              (3, (3,), (-1,), "Storage size calculation overflowed"),
                                              (0, (3,), (-1,), "Storage size calculation overflowed"),
                                              (0, (2, 2), (1,), r"unequal size length \(2\) and stride length \(1\)")]:
            with pytest.raises(RuntimeError, match=message):
                torch.empty(0, device=device).set_(storage, offset, size, stride)
        view = torch.empty(0, device=device).set_(storage, 2, (2, 2), (1, 2))
        assert view.cpu().tolist() == [[-3.0, -1.0], [-2.0, 0.0]]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("function", [torch.softmax, torch.log_softmax])
def test_softmax_over_a_strided_dim_runs_atens_kernel_with_the_cpus_bits(mode, function):
    """The generated row kernels walk the dim element by element: over dim 0 of a
    matrix or a transposed view ATen's kernel was 2-11x faster (benchmarks/review_cases.py)."""
    torch_vtpu.set_mode(mode)
    torch.manual_seed(0)
    x = torch.randn(64, 48, requires_grad=True)
    device_x = x.detach().to("vtpu").requires_grad_()
    for dim, view in [(0, lambda t: t), (-1, lambda t: t.t()), (1, lambda t: t.unsqueeze(1).expand(64, 3, 48))]:
        torch_vtpu.reset_metrics()
        got = function(view(device_x), dim=dim)
        want = function(view(x), dim=dim)
        grad = torch.randn(want.shape)
        got.backward(grad.to("vtpu"))
        want.backward(grad)
        assert torch.equal(got.detach().cpu(), want.detach())
        if dim == 0:
            assert torch.equal(device_x.grad.cpu(), x.grad)
        else:  # backward over contiguous rows (the transpose) or a generated sum (the expand)
            torch.testing.assert_close(device_x.grad.cpu(), x.grad)
        fallbacks = torch_vtpu.metrics()["host_fallback_ops"]
        assert any("softmax" in op for op in fallbacks), fallbacks
        x.grad, device_x.grad = None, None


@pytest.mark.parametrize("mode", MODES)
def test_a_python_kernel_registered_from_a_file_without_a_suffix_runs_at_the_call(mode):
    """A script run by its #! line ("train") or source given to compile() under any
    name: the registration names that file; only C/C++ source files mean C++ kernels."""
    torch_vtpu.set_mode(mode)
    ns = _unique("noext")
    state = {"scale": 2.0}
    source = textwrap.dedent(f"""
        import torch
        lib = torch.library.Library("{ns}", "DEF")
        lib.define("scaled(Tensor x) -> Tensor")
        lib.impl("scaled", lambda x: x * state["scale"], "CPU")
        lib.impl("scaled", lambda x: torch.empty_like(x), "Meta")
    """)
    scope = {"state": state}
    exec(compile(source, "/opt/jobs/bin/train", "exec"), scope)
    op = getattr(getattr(torch.ops, ns), "scaled")
    a = torch.randn(600, 600, device="vtpu")
    busy = a @ a
    y = op(torch.ones(4, device="vtpu"))
    state["scale"] = 3.0
    assert y.cpu().tolist() == [2.0] * 4
    assert busy.shape == (600, 600)


@pytest.mark.parametrize("mode", MODES)
def test_a_small_view_of_a_big_buffer_comes_back_compact(mode):
    """A synchronous result that views a small part of a big buffer is copied, not
    mirrored with the whole buffer (as a view covering most of its buffer is)."""
    torch_vtpu.set_mode(mode)
    ns = _unique("view")
    table = torch.randn(1 << 16, 64)

    @torch.library.custom_op(f"{ns}::columns", mutates_args=(), device_types="cpu")
    def columns(x: torch.Tensor) -> torch.Tensor:
        return table[:, :2]

    @columns.register_fake
    def _(x):
        return x.new_empty(table.shape[0], 2)

    got = columns(torch.ones(1, device="vtpu"))
    assert torch.equal(got.cpu(), table[:, :2])
    assert got.untyped_storage().nbytes() == table[:, :2].numel() * 4  # not the 16 MiB table


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_weight_norm_of_reduced_precision_weights_is_the_cpus(mode, dtype):
    """The CPU keeps the norms of a float16/bfloat16 weight in float32, where the meta
    kernel says the weight's type (float16 raised on every call)."""
    torch_vtpu.set_mode(mode)
    torch.manual_seed(0)
    v, g = torch.randn(4, 3, dtype=dtype), torch.rand(4, 1, dtype=dtype) + 0.5
    want_w, want_norms = torch._weight_norm_interface(v, g, 0)
    got_w, got_norms = torch._weight_norm_interface(v.to("vtpu"), g.to("vtpu"), 0)
    assert got_norms.dtype == want_norms.dtype == torch.float32
    assert torch.equal(got_w.cpu(), want_w) and torch.equal(got_norms.cpu(), want_norms)
    assert torch.equal(torch._weight_norm(v.to("vtpu"), g.to("vtpu"), 0).cpu(), torch._weight_norm(v, g, 0))
