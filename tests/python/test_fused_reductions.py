"""Fused eager mode: a reduction (sum, mean, prod, amax, amin) joins the
window and fuses with the elementwise work that computes its input, so the
input never goes through memory; results stay bitwise equal to strict mode.

Kernel counts are asserted on a steady run (test_fused._steady_metrics).
"""
import sys
from pathlib import Path

import pytest
import torch

import torch_vtpu

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The autouse fixture runs each test in fused mode (strict again after it).
from test_fused import _fused_then_strict, _in_strict, _steady_metrics  # noqa: E402,F401


def _mean_square(x):
    return x.pow(2).mean(-1, keepdim=True)


def test_mean_of_squares_is_one_kernel_storing_only_the_mean():
    x = torch.randn(64, 300, device="vtpu")
    out, m = _steady_metrics(_mean_square, x)
    assert m["kernels_launched"] == 1
    assert m["fused_kernels"] == 1
    assert m["ops_per_fused_kernel"] == {2: 1}
    assert m["dead_stores_skipped"] == 1  # the squares are never stored
    assert torch.equal(out.cpu(), _in_strict(_mean_square, x).cpu())


def _rms_norm(x, w):
    x32 = x.float()
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def test_rms_norm_forward_and_backward_match_strict_bitwise():
    torch.manual_seed(0)
    x_cpu, w_cpu = torch.randn(4, 33, 96), torch.randn(96)

    def run():
        x = x_cpu.to("vtpu").requires_grad_()
        w = w_cpu.to("vtpu").requires_grad_()
        y = _rms_norm(x, w)
        (y * y).sum().backward()
        return y.cpu(), x.grad.cpu(), w.grad.cpu()

    for _ in range(2):  # the first sighting runs unfused
        fused = run()
        torch_vtpu._C._wait_for_fusion_compiles()
    torch_vtpu.reset_metrics()
    fused = run()
    m = torch_vtpu.metrics()
    strict = _in_strict(run)
    for a, b in zip(fused, strict):
        assert torch.equal(a, b)
    # Every reduction of the step (the forward's mean, the backward's sums
    # for x and w, the loss) runs inside a fused kernel with its prologue.
    assert m["fused_kernels"] >= 4
    assert max(m["ops_per_fused_kernel"]) >= 3


def test_a_live_intermediate_is_stored_beside_the_reduction():
    x = torch.randn(40, 70, device="vtpu")

    def program(t):
        e = (t * 0.5).exp()
        return e, (e * t).sum(0)  # e stays referenced: the kernel stores it

    (e, s), m = _steady_metrics(program, x)
    assert m["kernels_launched"] == 1
    assert m["ops_per_fused_kernel"] == {4: 1}
    e_strict, s_strict = _in_strict(program, x)
    assert torch.equal(e.cpu(), e_strict.cpu())
    assert torch.equal(s.cpu(), s_strict.cpu())


def test_an_op_reading_the_reduction_runs_after_it():
    x = torch.randn(30, 50, device="vtpu")

    def program(t):
        centred = t - (t * 2.0).mean(-1, keepdim=True)  # reads the mean: cannot share its loop
        return centred * 3.0

    out, m = _steady_metrics(program, x)
    assert m["kernels_launched"] == 2
    assert torch.equal(out.cpu(), _in_strict(program, x).cpu())


@pytest.mark.parametrize("reduce", ["sum_cols", "amax_transposed", "prod", "amin_all", "bf16_sum"])
def test_reduction_kinds_and_layouts_match_strict(reduce):
    torch.manual_seed(1)
    programs = {
        "sum_cols": (lambda t: (t * t).sum((0, 1)), (6, 7, 45), torch.float32),
        "amax_transposed": (lambda t: t.t().abs().amax(-1), (50, 20), torch.float32),
        "prod": (lambda t: (t.sigmoid() + 0.5).prod(1), (12, 9), torch.float32),
        "amin_all": (lambda t: (t - 1.0).amin(), (17, 19), torch.float32),
        "bf16_sum": (lambda t: (t * 1.5 + t).sum(-1), (8, 40), torch.bfloat16),
    }
    program, shape, dtype = programs[reduce]
    x = torch.randn(*shape, device="vtpu").to(dtype)
    out, m = _steady_metrics(program, x)
    if reduce == "amax_transposed":
        # A row reduction reading its input across rows stays a kernel of its
        # own (its single-op kernel reads in blocks; test_fused.py -k
        # across_rows): the abs, then the amax.
        assert m["fused_kernels"] == 0 and m["kernels_launched"] == 2
    else:
        assert m["fused_kernels"] == 1
        assert m["kernels_launched"] == 1  # the reduction is inside the fused kernel
    assert m["host_fallback_ops"] == {}
    assert torch.equal(out.cpu(), _in_strict(program, x).cpu())


@pytest.mark.parametrize("reduce", ["sum_all", "mean_rows", "amax_all", "narrow_columns", "narrow_columns_3d"])
def test_long_rows_and_narrow_columns_fused_equal_strict_and_the_cpu(reduce):
    # Rows beyond 32768 elements are reduced in segments, split over the
    # threads when the outputs are few (a whole-tensor sum has one), and
    # columns under 16 wide take the same lanes order down each column:
    # fused kernels and strict's single-op kernels follow the same order.
    # float64, values over 40 binary orders of magnitude: another order
    # shows in the bits.
    torch.manual_seed(2)
    programs = {
        "sum_all": (lambda t: (t * t).sum(), (3, 70001)),
        "mean_rows": (lambda t: (t - 0.5).mean(-1), (2, 100000)),
        "amax_all": (lambda t: t.abs().amax(), (400, 300)),
        "narrow_columns": (lambda t: (t * t).sum(0), (100003, 4)),
        "narrow_columns_3d": (lambda t: (t + 1.0).mean((0, 1), keepdim=True), (50, 2001, 3)),
    }
    program, shape = programs[reduce]
    x_cpu = torch.randn(*shape, dtype=torch.float64) * torch.pow(2.0, torch.randint(-20, 20, shape).double())
    x = x_cpu.to("vtpu")
    out, m = _steady_metrics(program, x)
    assert m["fused_kernels"] == 1 and m["kernels_launched"] == 1
    strict = _in_strict(program, x).cpu()
    assert torch.equal(out.cpu(), strict)
    torch.testing.assert_close(strict, program(x_cpu), rtol=1e-12, atol=0)


@pytest.mark.parametrize("stores", [False, True], ids=["reduction_only", "storing_an_intermediate"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_max_and_min_rows_with_nans_and_signed_zeros_equal_strict(dtype, stores):
    # A float max or min row runs its lane groups in vectors and, when a
    # group held a NaN, evaluates the row again in vtpu_max's steps
    # (vtpu_extremum_groups); a fused kernel that stores an elementwise
    # result keeps vtpu_max's steps throughout (engine
    # HostCodegenExtremumRows launches one in place). Which NaN (payload,
    # sign) and which zero (+0/-0) the result is depends on that order.
    torch.manual_seed(3)
    x_cpu = torch.randn(8, 1000).to(dtype)
    x_cpu[1, 17] = float("nan")
    x_cpu[2, 5] = -float("nan")
    x_cpu[2, 700] = float("nan")
    x_cpu[3, 998] = float("nan")  # in the last, partial group
    x_cpu[4] = torch.where(torch.rand(1000) < 0.5, 0.0, -0.0).to(dtype)  # zeros: the order picks the sign
    x_cpu[5, ::3] = float("inf")
    x_cpu[6] = -float("inf")

    def amax_of_double(t):
        u = t * 2.0
        return (u, u.amax(-1)) if stores else (u.amax(-1),)

    def amin_of_triple(t):
        u = t * 3.0
        return (u, u.amin(-1)) if stores else (u.amin(-1),)

    x = x_cpu.to("vtpu")
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
    for program, cpu_op in ((amax_of_double, lambda t: (t * 2.0).amax(-1)),
                            (amin_of_triple, lambda t: (t * 3.0).amin(-1))):
        out, m = _steady_metrics(program, x)
        assert m["fused_kernels"] == 1 and m["kernels_launched"] == 1
        assert m["ops_per_fused_kernel"] == {2: 1}
        strict = _in_strict(program, x)
        for a, b in zip(out, strict):
            assert torch.equal(a.cpu().view(bits), b.cpu().view(bits))
        assert out[-1][1:4].isnan().all()
        assert torch.equal(out[-1][4:].cpu(), cpu_op(x_cpu[4:]))


def test_a_reduction_does_not_flush_and_shares_its_loop_with_later_readers_of_its_input():
    x = torch.randn(20, 30, device="vtpu")

    def program(t):
        a = t.sum(-1)
        return a, (t * 2.0 + 1.0).exp()  # reads t too: same kernel, one pass over t

    (a, b), m = _steady_metrics(program, x)
    assert m["syncs"].get("unfused_op", 0) == 0
    assert m["kernels_launched"] == 1
    assert m["ops_per_fused_kernel"] == {4: 1}
    a_strict, b_strict = _in_strict(program, x)
    assert torch.equal(a.cpu(), a_strict.cpu()) and torch.equal(b.cpu(), b_strict.cpu())


def test_reduction_outside_the_window_keeps_strict_behaviour():
    # A 0-dim input and a dtype-converting sum are not recorded: they launch
    # as in strict mode (flushing the window first) with the same results.
    x = torch.randn((), device="vtpu")
    y = torch.randn(10, 10, device="vtpu")
    assert torch.equal((x * 2.0).sum().cpu(), _in_strict(lambda t: (t * 2.0).sum(), x).cpu())
    assert torch.equal(y.sum(0, dtype=torch.float64).cpu(), _in_strict(lambda t: t.sum(0, dtype=torch.float64), y).cpu())


# OpInfo samples of the reductions the window records (all dims, some dims,
# negative dims, keepdim, 0-dim and empty inputs, dtype arguments: the ones
# the window does not take keep strict's single-op kernel), each with an
# elementwise prologue and epilogue so that the reduction is fused: fused
# (once the pattern's kernel is built) must give strict's bits. The prologue
# is one op whose result stays alive through the reduction: with a longer
# one the dropped temporary's block may be handed to the reduction's output
# (these tensors are tiny, all of one size class), and a cluster may not touch
# the block its reduction writes, so the reduction would start a cluster of
# its own.
_REDUCTION_OPINFO_NAMES = {"sum", "mean", "prod", "amax", "amin"}


def _reduction_opinfo_cases():
    from torch.testing._internal.common_methods_invocations import op_db

    return [op for op in op_db if op.name in _REDUCTION_OPINFO_NAMES and op.variant_test_name == ""]


@pytest.mark.parametrize("op", _reduction_opinfo_cases(), ids=lambda op: op.name)
def test_opinfo_reduction_samples_fused_equal_strict_bitwise(op):
    samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=False))
    checked = fused_with_prologue = 0
    for sample in samples:
        x = sample.input.detach().to("vtpu")
        args = [a.detach().to("vtpu") if isinstance(a, torch.Tensor) else a for a in sample.args]

        def program():
            return op(x * 1.5, *args, **sample.kwargs) - 0.25

        try:
            strict = _in_strict(program)
        except Exception:
            continue  # a sample ATen refuses (same in both modes): nothing to compare
        fused, m = _steady_metrics(program)
        torch.testing.assert_close(fused.cpu(), strict.cpu(), rtol=0, atol=0, equal_nan=True)
        checked += 1
        fused_with_prologue += m["ops_per_fused_kernel"].get(2, 0)  # x * 1.5 and the reduction
    assert checked > 0, f"{op.name}: no sample could be compared"
    # Most samples reduce a non-empty tensor without a dtype argument: the
    # reduction then runs in one kernel with its prologue (amax/amin/mean/sum
    # 16 of 20, prod 26 of 39).
    assert 2 * fused_with_prologue >= checked, f"{op.name}: {fused_with_prologue} of {checked} samples fused"


def test_a_zero_dim_operand_keeps_out_of_the_reduction_kernel(capfd):
    """A 0-dim tensor is declared with rank 0 in the kernel, which the fused
    reduction kernels do not take: sharing a cluster made the build fail and
    every op of the cluster ran unfused (with a line on stderr)."""
    torch.manual_seed(3)
    h = torch.randn(300, 512, device="vtpu")
    o = torch.randn((), device="vtpu")

    def centred(h, o):
        v = o * h
        return v - v.mean(0, keepdim=True)

    def scaled_mean(h, o):  # the reduction first, the 0-dim operand after
        m = (h * 2.0).sum(-1, keepdim=True)
        return (h - m) * o

    for program in (centred, scaled_mean):
        out, m = _steady_metrics(program, h, o)
        assert m["pattern_cache_misses"] == 0, (program.__name__, m)  # no cluster left unbuilt
        assert torch.equal(out.cpu(), _in_strict(program, h, o).cpu()), program.__name__
    assert "fused kernel unavailable" not in capfd.readouterr().err


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("op", ["gelu", "sin", "tanh", "exp", "gelu_backward"])
def test_16bit_tables_equal_the_fused_reductions_computed_values(dtype, op):
    # A strict-mode (or purely elementwise) kernel reads a 16-bit
    # transcendental op's results from a table it filled from the op's own
    # expression (host_codegen.cpp, "Lookup tables"); a fused reduction that
    # stores the op's result computes it per element. Over every 16-bit
    # pattern (NaNs, infinities, subnormals, both zeros) the stored bits
    # must be the same in both modes. GELU's backward, grad * G(x), reads
    # G(x) from a table of floats.
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype).reshape(256, 256).to("vtpu")
    grad_cpu = torch.randn(256, 256, generator=torch.Generator().manual_seed(5)).to(dtype)
    grad = grad_cpu.to("vtpu")
    fn = {"gelu": torch.nn.functional.gelu, "sin": torch.sin, "tanh": torch.tanh, "exp": torch.exp,
          "gelu_backward": lambda t: torch.ops.aten.gelu_backward(grad if t.device.type == "vtpu" else grad_cpu.float(), t)}[op]

    def program(t):
        y = fn(t)
        return y, y.amax(-1)

    out, m = _steady_metrics(program, x)
    assert m["fused_kernels"] == 1 and m["kernels_launched"] == 1  # the op inside the fused reduction
    strict = _in_strict(program, x)
    assert torch.equal(out[0].cpu().view(torch.int16), strict[0].cpu().view(torch.int16))
    assert torch.equal(out[1].cpu().view(torch.int16), strict[1].cpu().view(torch.int16))
    # Not vacuous: the values are the CPU's to within the op's tolerance.
    ref = fn(x.cpu().float()).to(dtype)
    finite = ref.isfinite() & out[0].cpu().isfinite()
    torch.testing.assert_close(out[0].cpu()[finite].float(), ref[finite].float(), rtol=2e-2, atol=1e-3)
