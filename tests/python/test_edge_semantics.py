"""Edge cases where vTPU's generated kernels differed from ATen's CPU kernels, or fused
mode from strict mode (found by a review probing integer, special-value and dtype
semantics, 2026-12-05). Each test fails without its fix."""
import pytest
import torch

import torch_vtpu
from torch_vtpu import _C

MODES = ["strict", "fused", "debug"]
INF, NAN = float("inf"), float("nan")


def _fused_steady(program, *args):
    """`program` in fused mode once its fused kernel exists (the first runs are
    unfused while it compiles)."""
    with torch_vtpu.mode("fused"):
        for _ in range(2):
            kept = program(*args)  # a result nobody holds is never computed
            torch.vtpu.synchronize()
            _C._wait_for_fusion_compiles()
            del kept
        before = torch_vtpu.metrics()["fused_kernels"]
        out = program(*args).cpu()
        assert torch_vtpu.metrics()["fused_kernels"] > before, "the program did not fuse"
    return out


CAST_VALUES = [-1.5, 300.0, NAN, INF, -INF, 3e9, -3e9, 1e19, -1e19, 2.0**31, -(2.0**31), 255.9, -0.7, 70000.0]


@pytest.mark.parametrize("source", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("target", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("read_back", [torch.float32, torch.float64], ids=str)
def test_float_to_integer_casts_read_back_as_floats_wrap_like_the_cpu(source, target, read_back):
    # Fused mode gave uint8(-1.5) as -1.0 and int32(3e9) as 3e9: a plain
    # static_cast is undefined out of range and GCC folded float -> int ->
    # float into a trunc inside the fused kernel (strict, storing the integer,
    # was right).
    x = torch.tensor(CAST_VALUES, dtype=torch.float64).to(source)

    def program(t):
        return t.mul(1).to(target).to(read_back)

    want = program(x)
    with torch_vtpu.mode("strict"):
        strict = program(x.to("vtpu")).cpu()
    fused = _fused_steady(program, x.to("vtpu"))
    assert torch.equal(strict, want)
    assert torch.equal(fused, want)


def test_signed_integer_overflow_in_a_fused_kernel_wraps():
    # Kernels are built with -fwrapv: GCC took -a == a as false for INT_MIN
    # inside one fused kernel.
    a = torch.tensor([-2**31, 5], dtype=torch.int32)

    def program(t):
        return (-t) == t

    want = program(a)
    assert want.tolist() == [True, False]
    assert torch.equal(_fused_steady(program, a.to("vtpu")), want)


@pytest.mark.parametrize("mode", MODES)
def test_relu_keeps_negative_zero_and_nan(mode):
    torch_vtpu.set_mode(mode)
    x = torch.tensor([-0.0, 0.0, -1.0, 2.0, NAN])
    got = torch.relu(x.to("vtpu")).cpu()
    want = torch.relu(x)
    assert torch.equal(got.isnan(), want.isnan())
    keep = ~want.isnan()
    assert torch.equal(got[keep], want[keep])
    assert torch.equal(torch.signbit(got[keep]), torch.signbit(want[keep]))  # relu(-0.0) is -0.0


@pytest.mark.parametrize("mode", MODES)
def test_pow_with_a_tensor_exponent_is_pow_not_its_scalar_shortcuts(mode):
    torch_vtpu.set_mode(mode)
    base = torch.tensor([-INF, -INF, -0.0, -0.0, 4.0])
    exponent = torch.tensor([0.5, -0.5, 0.5, -0.5, 0.5])
    got = torch.pow(base.to("vtpu"), exponent.to("vtpu")).cpu()
    want = torch.pow(base, exponent)
    assert want.tolist() == [INF, 0.0, 0.0, INF, 2.0]
    assert torch.equal(got, want) and torch.equal(torch.signbit(got), torch.signbit(want))


@pytest.mark.parametrize("mode", MODES)
def test_float16_pow_by_a_half_is_pow(mode):
    torch_vtpu.set_mode(mode)
    x = torch.tensor([-INF, -0.0, 4.0], dtype=torch.float16)
    for e in (0.5, -0.5):
        got = (x.to("vtpu") ** e).cpu()
        want = x**e
        assert torch.equal(got, want) and torch.equal(torch.signbit(got), torch.signbit(want)), e


@pytest.mark.parametrize("mode", MODES)
def test_bool_to_the_power_of_bool_raises_without_a_kernel_build_failure(mode, recwarn):
    # The generated kernel did not compile (make_unsigned<bool>, a warning);
    # ATen then raised, as the CPU does.
    torch_vtpu.set_mode(mode)
    a = torch.tensor([True, True, False, False])
    for device in ("cpu", "vtpu"):
        with pytest.raises(NotImplementedError, match="not implemented for 'Bool'"):
            torch.pow(a.to(device), a.to(device))
            torch.vtpu.synchronize()
    assert not [w for w in recwarn if "make_unsigned" in str(w.message)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_where_with_a_number_beyond_the_16_bit_range_saturates(mode, dtype):
    # The attention-masking idiom raised "value cannot be converted to type
    # c10::Half without overflow"; the CPU's scalar tensor stores -inf.
    torch_vtpu.set_mode(mode)
    mask = torch.tensor([True, False, True])
    x = torch.tensor([1.0, 2.0, 3.0], dtype=dtype)
    big = -1e9 if dtype == torch.float16 else -1e39
    want = torch.where(mask, x, big)
    got = torch.where(mask.to("vtpu"), x.to("vtpu"), big).cpu()
    assert torch.equal(got, want) and want[1].item() == -INF
    assert torch.equal(torch.scalar_tensor(big, dtype=dtype, device="vtpu").cpu(), torch.scalar_tensor(big, dtype=dtype))
    # Integers stay checked, as on the CPU.
    for device in ("cpu", "vtpu"):
        with pytest.raises(RuntimeError, match="without overflow"):
            torch.scalar_tensor(300, dtype=torch.int8, device=device)


@pytest.mark.parametrize("mode", MODES)
def test_integer_scalars_beyond_2_to_the_53_keep_their_low_bits(mode):
    # Launch scalars are doubles: such ops now run ATen's kernel.
    torch_vtpu.set_mode(mode)
    big = 6364136223846793005
    cases = [
        lambda d: torch.tensor([1, 2, 3], device=d) * big,
        lambda d: torch.tensor([1, 2], device=d) * (2**63 - 1),
        lambda d: torch.tensor([1, 2], dtype=torch.int32, device=d) * (2**53 + 7),
        lambda d: torch.add(torch.tensor([1, 2], device=d), torch.tensor([3, 4], device=d), alpha=2**53 + 1),
        lambda d: torch.tensor([1, 2], device=d).mul(torch.tensor(2**53 + 1)),
        lambda d: torch.full((2,), 2**53 + 1, device=d),
        lambda d: torch.zeros(2, dtype=torch.long, device=d).fill_(-(2**53) - 1),
        lambda d: torch.where(torch.tensor([False, True], device=d), torch.tensor([0, 1], device=d), 2**53 + 1),
        lambda d: torch.addcmul(torch.zeros(2, dtype=torch.long, device=d), torch.ones(2, dtype=torch.long, device=d),
                                torch.ones(2, dtype=torch.long, device=d), value=2**53 + 1),
    ]
    for i, case in enumerate(cases):
        assert torch.equal(case("vtpu").cpu(), case("cpu")), i


@pytest.mark.parametrize("mode", MODES)
def test_ops_without_a_bool_kernel_raise_on_bool_tensors(mode):
    torch_vtpu.set_mode(mode)
    calls = [torch.relu, torch.floor, torch.ceil, torch.trunc, lambda t: torch.addcmul(t, t, t)]
    for call in calls:
        with pytest.raises(Exception) as on_cpu:
            call(torch.tensor([True, False]))
        with pytest.raises(type(on_cpu.value)):
            call(torch.tensor([True, False], device="vtpu"))
            torch.vtpu.synchronize()


def test_a_fused_pattern_first_seen_on_empty_tensors_serves_non_empty_ones():
    # An operand expanded from a 0-dim tensor (autograd's gradient of a sum)
    # over an empty tensor counted as contiguous in the IR but as a broadcast
    # in the pattern key: the kernel compiled for the empty case read it as a
    # dense buffer when later launches of the pattern had elements (garbage
    # gradients in fused mode after one empty loss term; found by review).
    def program(x):
        return torch.ones((), device=x.device).expand(x.shape) * (x * 2.0)

    with torch_vtpu.mode("fused"):
        for _ in range(3):
            kept = program(torch.zeros(0, 4, device="vtpu"))
            torch.vtpu.synchronize()
            _C._wait_for_fusion_compiles()
            del kept
    a = torch.arange(1.0, 13.0).reshape(3, 4)
    assert torch.equal(_fused_steady(program, a.to("vtpu")), program(a))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_add_and_sub_with_alpha_round_once_as_atens_fmadd(mode, dtype):
    # ATen computes a + alpha * b as one fused multiply-add (vector body and
    # scalar remainder alike); two roundings left ~26% of float32 elements an
    # ulp off, so SGD steps drifted from the CPU's bits.
    torch_vtpu.set_mode(mode)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(1003, dtype=dtype, generator=g), torch.randn(1003, dtype=dtype, generator=g)
    for alpha in (0.7, -1e-3, 3):
        assert torch.equal(torch.add(a.to("vtpu"), b.to("vtpu"), alpha=alpha).cpu(), torch.add(a, b, alpha=alpha))
        assert torch.equal(torch.sub(a.to("vtpu"), b.to("vtpu"), alpha=alpha).cpu(), torch.sub(a, b, alpha=alpha))
    params = {}
    for device in ("cpu", "vtpu"):
        ps = [torch.randn(64, 33, dtype=dtype, generator=torch.Generator().manual_seed(i)).to(device) for i in range(4)]
        for i, p in enumerate(ps):
            p.requires_grad_(True)
            p.grad = torch.randn(64, 33, dtype=dtype, generator=torch.Generator().manual_seed(10 + i)).to(device)
        opt = torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-2, nesterov=True)
        for _ in range(3):
            opt.step()
        params[device] = [p.detach().cpu() for p in ps]
    for want, got in zip(params["cpu"], params["vtpu"]):
        assert torch.equal(got, want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_addcmul_lerp_and_tanh_backward_round_once_as_atens_fused_multiply_adds(mode, dtype):
    # ATen's CPU kernels compute addcmul as fma(value * t1, t2, self), lerp as
    # fma(w, end - start, start) (fma(w - 1, end - start, end) for |w| >= 0.5)
    # and tanh_backward as g * fma(-y, y, 1), in their vector bodies and scalar
    # remainders alike (1,003 elements and a strided view take both). Two
    # roundings left 15-30% of float32 elements an ulp off the CPU's, so Adam's
    # moments (foreach lerp and addcmul) and recurrent backwards drifted.
    torch_vtpu.set_mode(mode)
    g = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(1003, generator=g).to(dtype) for _ in range(3))
    w = torch.rand(1003, generator=g).to(dtype) * 1.5 - 0.25
    y = torch.tanh(torch.randn(1003, generator=g)).to(dtype)
    strided = torch.randn(1003, 2, generator=g).to(dtype)[:, 0]
    cases = [
        lambda d: torch.addcmul(d(a), d(b), d(c), value=0.3),
        lambda d: torch.addcmul(d(a), d(b), d(c)),
        lambda d: torch.addcmul(d(strided), d(b), d(c), value=-1.7),
        lambda d: torch.lerp(d(a), d(b), 0.3),
        lambda d: torch.lerp(d(a), d(b), 0.7),
        lambda d: torch.lerp(d(a), d(b), d(w)),
        lambda d: torch.lerp(d(strided), d(b), 0.3),
        lambda d: torch.ops.aten.tanh_backward(d(a), d(y)),
        lambda d: torch._foreach_addcmul([d(a)], [d(b)], [d(c)], 0.001)[0],
        lambda d: torch._foreach_lerp([d(a)], [d(b)], 0.1)[0],
        lambda d: d(a).clone().addcmul_(d(b), d(c), value=0.5),
        lambda d: d(a).clone().lerp_(d(b), 0.9),
    ]
    for i, case in enumerate(cases):
        want = case(lambda t: t)
        got = case(lambda t: t.to("vtpu")).cpu()
        assert torch.equal(got, want), f"case {i}: {(got != want).sum().item()} of {want.numel()} elements differ"
    # Adam's moment updates (foreach lerp_, mul_, addcmul_) keep the CPU's bits.
    moments = {}
    for device in ("cpu", "vtpu"):
        m = [torch.randn(64, 33, generator=torch.Generator().manual_seed(i)).to(dtype).to(device) for i in range(3)]
        v = [t.abs() for t in m]
        grads = [torch.randn(64, 33, generator=torch.Generator().manual_seed(10 + i)).to(dtype).to(device)
                 for i in range(3)]
        for _ in range(3):
            torch._foreach_lerp_(m, grads, 0.1)
            torch._foreach_mul_(v, 0.999)
            torch._foreach_addcmul_(v, grads, grads, 0.001)
        moments[device] = [t.cpu() for t in m + v]
    for want, got in zip(moments["cpu"], moments["vtpu"]):
        assert torch.equal(got, want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_sigmoid_backward_rounds_as_atens_kernel(mode, dtype):
    # ATen's float16 sigmoid_backward computes in float16 arithmetic (1 - y
    # and g * (1 - y) each rounded to float16); bfloat16 and float32 compute
    # in float, rounding once. One rounding in float16 left ~30% of elements
    # an ulp off the CPU's. Also fused with the muls producing its operands.
    torch_vtpu.set_mode(mode)
    gen = torch.Generator().manual_seed(0)
    g = torch.randn(1003, generator=gen).to(dtype)
    y = torch.rand(1003, generator=gen).to(dtype)
    cases = [
        lambda d: torch.ops.aten.sigmoid_backward(d(g), d(y)),
        lambda d: torch.ops.aten.sigmoid_backward(d(g)[::2], d(y)[::2]),
        lambda d: torch.ops.aten.sigmoid_backward(d(g) * 2, d(y) * 0.5),
    ]
    for i, case in enumerate(cases):
        want = case(lambda t: t)
        got = case(lambda t: t.to("vtpu")).cpu()
        assert torch.equal(got, want), f"case {i}: {(got != want).sum().item()} of {want.numel()} elements differ"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_lerp_rounds_a_zero_dim_cpu_tensor_weight_as_atens_kernel(mode, dtype):
    # A 0-dim CPU tensor weight is a tensor operand of ATen's lerp, converted
    # to a 16-bit self's type first; a Python number weight is not. The
    # device read both as a number: 25-55% of 16-bit elements differed.
    torch_vtpu.set_mode(mode)
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(1003, generator=gen).to(dtype) for _ in range(2))
    for w in (torch.tensor(0.3), torch.tensor(0.7), torch.tensor(0.3, dtype=torch.float64), 0.3, 0.7):
        want = torch.lerp(a, b, w)
        assert torch.equal(torch.lerp(a.to("vtpu"), b.to("vtpu"), w).cpu(), want), w
        assert torch.equal(a.to("vtpu").lerp_(b.to("vtpu"), w).cpu(), want), w


@pytest.mark.parametrize("mode", ["debug", "strict", "fused"])
def test_an_integer_tensor_with_a_python_float_computes_in_float32_as_the_cpu(mode):
    # A Python number stays a wrapped number when the host-kernel path takes
    # its snapshot: as a plain 0-dim float64 tensor it made the CPU kernel
    # compute in double (fmod(3, 0.3) gave 1e-16 for the CPU's 0.29999989;
    # 3 // 0.3 gave 10 for 9). Found by a differential fuzzer.
    torch_vtpu.set_mode(mode)
    ints = torch.arange(1, 40)
    flags = torch.tensor([False, True])
    cases = [
        (ints, lambda x: torch.fmod(x, 0.3)),
        (ints, lambda x: torch.remainder(x, 0.3)),
        (ints, lambda x: x // 0.3),
        (ints, lambda x: torch.div(x, 0.001, rounding_mode="trunc")),
        (ints.int(), lambda x: torch.fmod(x, 0.7)),
        (flags, lambda x: x // -1e-300),
    ]
    for x, fn in cases:
        expected = fn(x)
        got = fn(x.to("vtpu")).cpu()
        assert got.dtype == expected.dtype == torch.float32
        assert torch.equal(got.view(torch.int32), expected.view(torch.int32)), (got, expected)


@pytest.mark.parametrize("nan_bits", [0x7FC00000, -0x00400000])  # +NaN, -NaN (0xffc00000)
def test_sigmoid_and_silu_of_nan_keep_its_sign_fused_or_not(nan_bits):
    # sigmoid computed 1 / (1 + exp(-x)): -x flips a NaN's sign, and the
    # compiler may commute x * sigmoid(x), so a fused kernel's silu(NaN) had
    # the other sign than strict's (found by a differential fuzzer).
    nan = torch.tensor([nan_bits], dtype=torch.int32).view(torch.float32)
    x = torch.cat([torch.tensor([-6.64, 0.5]), nan, torch.tensor([3.0])])

    def program(t):
        s = torch.nn.functional.silu(t)
        u = torch.div(2147483647, s - 3.75)
        return s, u, torch.nn.functional.silu(u), torch.sigmoid(t * 2.0)

    with torch_vtpu.mode("strict"):
        strict = [r.cpu() for r in program(x.to("vtpu"))]
    torch_vtpu.set_mode("fused")
    torch_vtpu.set_fused_min_elements(0)
    try:
        for _ in range(3):  # the last run launches the compiled fused kernel
            fused = [r.cpu() for r in program(x.to("vtpu"))]
            torch_vtpu._C._wait_for_fusion_compiles()
        assert torch_vtpu.metrics()["fused_kernels"] > 0
    finally:
        torch_vtpu.set_mode("strict")
    for s, f in zip(strict, fused):
        assert torch.equal(s.view(torch.int32), f.view(torch.int32)), (s, f)
    assert strict[0].view(torch.int32)[2].item() == nan_bits  # silu(NaN) is that NaN


@pytest.mark.parametrize("size", [4, 37])  # the scalar loop alone; vector body and remainder
def test_a_float_to_integer_round_trip_in_a_fused_kernel_gives_positive_zero(size):
    # GCC folded float -> int -> float inside one kernel into a truncation in
    # its scalar loop, which keeps the sign of zero (-0.75 gave -0.0; an
    # integer has no -0). Found by fuzzing fused mode.
    x = (torch.arange(size, dtype=torch.float32) - size / 2) * 0.35
    x[:3] = torch.tensor([-0.75, -0.3, 0.4])

    def program(t):
        return [t.to(torch.int64).float(), t.to(torch.int32).half(), t.to(torch.int64) / 1.0,
                t.to(torch.int32).to(torch.bfloat16) * 2, t.to(torch.int64).double()]

    expected = program(x)
    with torch_vtpu.mode("strict"):
        strict = [r.cpu() for r in program(x.to("vtpu"))]
    torch_vtpu.set_mode("fused")
    torch_vtpu.set_fused_min_elements(0)
    try:
        for _ in range(3):  # the last run launches the compiled fused kernel
            fused = [r.cpu() for r in program(x.to("vtpu"))]
            torch_vtpu._C._wait_for_fusion_compiles()
        assert torch_vtpu.metrics()["fused_kernels"] > 0
    finally:
        torch_vtpu.set_mode("strict")
    for e, s, f in zip(expected, strict, fused):
        assert torch.equal(torch.signbit(s), torch.signbit(e)) and torch.equal(s, e)
        assert torch.equal(torch.signbit(f), torch.signbit(s)) and torch.equal(f, s)


@pytest.mark.parametrize("mode", MODES)
def test_a_failing_out_call_leaves_its_out_tensor_untouched(mode):
    # The generated lowering sized an empty out= before the op went on to
    # ATen's kernel, which raised the dtype error: the CPU raises before it
    # sizes the out (found by fuzzing). A valid call through the same path
    # still sizes it.
    torch_vtpu.set_mode(mode)
    for device in ("cpu", "vtpu"):
        a = torch.tensor([True, False, True], device=device)
        zero = torch.tensor(-0.0, dtype=torch.float64, device=device)
        out = torch.empty(0, dtype=torch.bool, device=device)
        with pytest.raises(RuntimeError, match="can't be cast to the desired output type Bool"):
            torch.maximum(a, zero, out=out)
            torch.vtpu.synchronize()
        assert out.shape == (0,), device
        good = torch.empty(0, dtype=torch.float64, device=device)
        torch.maximum(a, zero, out=good)
        assert good.shape == (3,) and good.cpu().tolist() == [1.0, 0.0, 1.0]


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_silu_backward_dtypes_follow_the_cpu(mode):
    """Found by review: on vtpu silu_backward ran ATen's composite formula (the CPU has a
    kernel of its own), which returned float32 for a float16 gradient with an int32 input,
    rounded bfloat16 step by step (0.02 off) and computed integers where the CPU raises."""
    A = torch.ops.aten
    g16 = torch.tensor([1.0, 2.0, -3.0], dtype=torch.float16)
    cases = [
        (g16, torch.tensor([1, -2, 3], dtype=torch.int32)),
        (g16, torch.tensor([0.5, -1.5, 2.0], dtype=torch.bfloat16)),
        (torch.randn(257, dtype=torch.bfloat16), torch.randn(257, dtype=torch.bfloat16) * 4),
    ]
    with torch_vtpu.mode(mode):
        for grad, x in cases:
            expected = A.silu_backward(grad, x)
            got = A.silu_backward(grad.to("vtpu"), x.to("vtpu")).cpu()
            assert got.dtype == expected.dtype and torch.equal(got, expected), (grad.dtype, x.dtype)
        i = torch.tensor([1, 0, 3])
        with pytest.raises(NotImplementedError, match="silu_backward"):
            A.silu_backward(i.to("vtpu"), i.to("vtpu")).cpu()


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_composites_reading_raw_memory_wait_for_queued_work(mode):
    """Found by review: _saturate_weight_to_fp16 and choose_qparams_optimized are composites
    that read tensor memory through raw pointers; on vtpu (device memory is host memory)
    they read it before the queued op producing their input had run (values unclamped, or
    another op's stale buffer)."""
    A = torch.ops.aten
    torch.manual_seed(0)
    w = torch.randn(64, 64)
    x = torch.randn(4096) * 3
    with torch_vtpu.mode(mode):
        saturated = A._saturate_weight_to_fp16(w.to("vtpu") * 1e6).cpu()
        chosen = [t.cpu() for t in A.choose_qparams_optimized(x.to("vtpu") * 2, x.numel(), 200, 0.16, 8)]
    assert torch.equal(saturated, A._saturate_weight_to_fp16(w * 1e6))
    expected = A.choose_qparams_optimized(x * 2, x.numel(), 200, 0.16, 8)
    assert all(torch.equal(g, e) for g, e in zip(chosen, expected))


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
def test_histc_of_integers_counts_as_cuda(mode, dtype):
    """ATen's CPU histc takes floating types only; CUDA's (and now vtpu's) takes
    integers, with int64 bin arithmetic and counts of the input's dtype. For
    small integers its bins equal the float histogram of the same values."""
    x = torch.randint(0, 40, (300,), dtype=dtype, generator=torch.Generator().manual_seed(5))
    with torch_vtpu.mode(mode):
        device = x.to("vtpu")
        for bins, low, high in [(10, 0, 0), (7, 3, 31), (4, 39, 39), (5, 0, 39), (6, 10, 12), (3, 50, 60)]:
            got = torch.histc(device, bins, low, high)
            assert got.dtype == dtype
            assert torch.equal(got.cpu(), torch.histc(x.float(), bins, low, high).to(dtype)), (bins, low, high)
        # Constant data widens the range by one on each side; the top edge is the last bin.
        assert torch.histc(torch.full((5,), 7, dtype=dtype, device="vtpu"), 3).tolist() == [0, 5, 0]
        assert torch.histc(torch.tensor([0, 4], dtype=dtype, device="vtpu"), 4, 0, 4).tolist() == [1, 0, 0, 1]
        assert torch.histc(torch.empty(0, dtype=dtype, device="vtpu"), 3).tolist() == [0, 0, 0]
        out = torch.empty(1, dtype=dtype, device="vtpu")
        torch.histc(device, 5, 0, 39, out=out)
        assert out.shape == (5,) and torch.equal(out.cpu(), torch.histc(x.float(), 5, 0, 39).to(dtype))
        with pytest.raises(RuntimeError, match="bins must be > 0"):
            torch.histc(device, 0)
        with pytest.raises(RuntimeError, match="max must be larger than min"):
            torch.histc(device, 3, 9, 2)
    # Floating inputs keep ATen's CPU kernel (the CPU's bits); bool is refused as on CUDA.
    f = torch.randn(100, generator=torch.Generator().manual_seed(6))
    assert torch.equal(torch.histc(f.to("vtpu"), 7).cpu(), torch.histc(f, 7))
    with pytest.raises(NotImplementedError, match="not implemented for 'Bool'"):
        torch.histc(torch.ones(3, dtype=torch.bool, device="vtpu"))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_multihead_attention_fast_path_without_weights_returns_none_as_the_cpu(mode, dtype):
    # In eval under no_grad nn.MultiheadAttention takes the fused
    # _native_multi_head_attention; without weights the CPU kernel returns an
    # undefined second result, the meta kernel an empty tensor, and vtpu ran
    # the out= variant, which raised "Expected out tensor to have dtype
    # nullptr" (found by review; it broke nn.TransformerDecoderLayer inference).
    torch.manual_seed(0)
    attention = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval().to(dtype)
    layer = torch.nn.TransformerDecoderLayer(16, 4, dim_feedforward=32, batch_first=True).eval().to(dtype)
    x, memory = torch.randn(2, 5, 16, dtype=dtype), torch.randn(2, 7, 16, dtype=dtype)
    with torch.no_grad():
        want, want_weights = attention(x, x, x, need_weights=False)
        want_layer = layer(x, memory)
        with torch_vtpu.mode(mode):
            attention.to("vtpu")
            layer.to("vtpu")
            got, got_weights = attention(x.to("vtpu"), x.to("vtpu"), x.to("vtpu"), need_weights=False)
            got_layer = layer(x.to("vtpu"), memory.to("vtpu"))
            _, weights = attention(x.to("vtpu"), x.to("vtpu"), x.to("vtpu"), need_weights=True)
            torch.vtpu.synchronize()
    assert want_weights is None and got_weights is None
    assert weights.shape == (2, 5, 5)
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(got.cpu(), want, **tol)
    torch.testing.assert_close(got_layer.cpu(), want_layer, **tol)


class _NoGradientBack(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return None


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("batch", [1, 3])
def test_attention_backward_without_an_incoming_gradient_gives_no_garbage(mode, batch):
    # With no gradient flowing back through it, the CPU flash-attention
    # backward returns no gradients; the host-kernel path handed out the
    # fresh buffers it had promised, uninitialised (found by review: q.grad
    # held leftovers of freed memory). An absent gradient is zero.
    torch.manual_seed(0)
    q = torch.randn(batch, 2, 3, 4)
    with torch_vtpu.mode(mode):
        leaf = q.to("vtpu").requires_grad_()
        for _ in range(3):  # freed blocks full of large values, for the gradients to land on
            junk = torch.full((4096,), 1e3, device="vtpu")
            del junk
        out = torch.nn.functional.scaled_dot_product_attention(leaf, leaf, leaf)
        (_NoGradientBack.apply(out).sum() + leaf.sum()).backward()
        got = leaf.grad.cpu()
    assert torch.equal(got, torch.ones_like(q))


WRAPPED_NUMBER_CASES = {
    "int_times_complex": lambda t: t * (0.3 + 0.7j),
    "int_over_complex": lambda t: t / (1 + 2j),
    "complex_minus_int": lambda t: (0.25 - 1.5j) - t,
    "int_plus_complex_alpha": lambda t: torch.add(t, 0.1 + 0.2j, alpha=3),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(WRAPPED_NUMBER_CASES))
def test_a_python_complex_promotes_as_a_number(mode, case):
    # The fast path's queued kernel cloned the wrapped number and lost its
    # wrapped bit: the clone, a 0-dim complex128 tensor, made the op compute in
    # complex128 (up to 1.5e-5 off here), not the CPU's complex64.
    a = torch.arange(1, 2000, dtype=torch.int64)
    expected = WRAPPED_NUMBER_CASES[case](a)
    with torch_vtpu.mode(mode):
        actual = WRAPPED_NUMBER_CASES[case](a.to("vtpu")).cpu()
    assert actual.dtype == expected.dtype == torch.complex64
    assert torch.equal(actual, expected)


def test_python_numbers_promote_as_numbers_on_atens_kernels():
    # With generated kernels off every such op takes the queued ATen kernel, and
    # `int_tensor * 0.3` computed in double before the fix.
    import os
    import subprocess
    import sys

    program = """
import torch, torch_vtpu
a = torch.arange(1, 2000, dtype=torch.int64)
cases = [lambda t: t * 0.3, lambda t: t / 0.3, lambda t: t.sub(0.3, alpha=3), lambda t: t * (0.3 + 0.7j)]
for mode in ("strict", "fused", "debug"):
    with torch_vtpu.mode(mode):
        for i, f in enumerate(cases):
            expected, actual = f(a), f(a.to("vtpu")).cpu()
            assert actual.dtype == expected.dtype and torch.equal(actual, expected), (mode, i)
print("equal")
"""
    env = dict(os.environ, VTPU_GENERATED_KERNELS="0")
    out = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "equal" in out.stdout, out.stderr[-2000:]


SCALAR_CONVERSION_CASES = {
    # ATen converts these scalars to the type it computes in, with an overflow check
    "add_half_alpha_beyond_half": (torch.float16, lambda t: torch.add(t, t, alpha=1e10)),
    "addcmul_int_value_beyond_int32": (torch.int32, lambda t: torch.addcmul(t, t, t, value=2**40)),
    "addcmul_int_float_value_beyond_int32": (torch.int32, lambda t: torch.addcmul(t, t, t, value=1e10)),
    "pow_half_exponent_beyond_half": (torch.float16, lambda t: torch.pow(t, 1e10)),
    "pow_int_exponent_beyond_int32": (torch.int32, lambda t: torch.pow(t, 2**40)),
    # ... and these compute (in float, for 16-bit addcmul) where a kernel taking them as doubles raised
    "addcmul_half_value_beyond_half": (torch.float16, lambda t: torch.addcmul(t, t, t, value=1e10)),
    "addcmul_complex_value": (torch.complex64, lambda t: torch.addcmul(t, t, t, value=0.3 + 0.7j)),
    "addcdiv_complex_value": (torch.complex64, lambda t: torch.addcdiv(t, t, t + 1, value=0.5 - 2j)),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(SCALAR_CONVERSION_CASES))
def test_scalar_arguments_convert_as_atens_do(mode, case):
    dtype, op = SCALAR_CONVERSION_CASES[case]
    base = torch.linspace(-3, 3, 5000)
    t = (base * 7).to(dtype) if not dtype.is_complex else torch.complex(base, base.flip(0))
    try:
        expected, error = op(t), None
    except RuntimeError as e:
        expected, error = None, str(e)
    with torch_vtpu.mode(mode):
        if error is not None:
            assert "without overflow" in error
            with pytest.raises(RuntimeError, match="without overflow"):
                op(t.to("vtpu")).cpu()
            return
        actual = op(t.to("vtpu")).cpu()
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, equal_nan=True)


NORM_CASES = [([1e20, 1e20], 2), ([1e20, 1e20], 3), ([3e38, 3e38], 1), ([1e19] * 5000, 2), ([1e-40, 1.0], -2),
              ([1.0, 2.0, 3.0], 2), ([1.8e19, 0.0], 2),
              # sums just past FLT_MAX that round back to it in float: finite on the CPU
              ([3.4028234663852886e38, 1e30], 1), ([1.8446743e19, 5.0281617e15], 2)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_vector_norm_overflows_where_the_cpus_float_sum_does(mode, dtype):
    """float32 and 16-bit norms sum |x|^p in float on the CPU (and CUDA): past FLT_MAX
    the norm is inf, or 0 for a negative p. vtpu summed in double and gave 1.41e20 for
    [1e20, 1e20] (found by review); float64 keeps its finite results."""
    torch_vtpu.set_mode(mode)
    for values, p in NORM_CASES:
        x = torch.tensor(values, dtype=dtype)
        want = torch.linalg.vector_norm(x, p)
        got = torch.linalg.vector_norm(x.to("vtpu"), p).cpu()
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0, msg=f"{values[:2]} p={p}")
    grads = torch.tensor([1e20, 1e20], dtype=dtype)
    param = torch.nn.Parameter(torch.zeros(2, dtype=dtype, device="vtpu"))
    param.grad = grads.to("vtpu")
    if dtype != torch.float64:
        with pytest.raises(RuntimeError, match="non-finite"):
            torch.nn.utils.clip_grad_norm_([param], 1.0, error_if_nonfinite=True)
