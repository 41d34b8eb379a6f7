"""Debug mode's per-op checks: NaN/Inf origin and the CPU cross-check."""
import os
import subprocess
import sys
import textwrap
import traceback

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

import torch_vtpu
from torch_vtpu.debug import CrossCheckError

HERE = os.path.basename(__file__)


def line_of(marker: str) -> int:
    with open(__file__) as f:
        for number, text in enumerate(f, start=1):
            if text.rstrip().endswith(f"# <{marker}>"):
                return number
    raise AssertionError(f"marker {marker} not found")


def last_line_here(error: BaseException) -> int:
    frames = [f for f in traceback.extract_tb(error.__traceback__) if os.path.basename(f.filename) == HERE]
    return frames[-1].lineno


@pytest.fixture
def debug_checks():
    """Debug mode; every check off again afterwards."""
    torch.vtpu.synchronize()
    try:
        with torch_vtpu.mode("debug"):
            yield
    finally:
        torch_vtpu.debug.check_nans(False)
        torch_vtpu.debug.crosscheck(False)
        torch_vtpu.debug._testing_corrupt_next("")


def log_of_negative(x):
    shifted = x - 3.0  # finite, some entries negative
    return torch.log(shifted)  # <log>


def test_nan_from_log_of_negative_raises_at_its_line(debug_checks):
    torch_vtpu.debug.check_nans(True)
    x = torch.tensor([1.0, 4.0, 2.0, 5.0], device="vtpu")
    with pytest.raises(FloatingPointError) as info:
        log_of_negative(x)
    message = str(info.value)
    assert message.startswith("[log] produced NaN or Inf from finite inputs")
    assert "input shapes: (4,)" in message
    assert f"{HERE}:{line_of('log')} in log_of_negative" in message
    assert last_line_here(info.value) == line_of("log")


def test_only_the_first_op_is_blamed(debug_checks):
    # An op fed a NaN propagates it: not its fault, so it does not raise.
    with_nan = torch.log(torch.tensor([-1.0, 2.0], device="vtpu"))  # check off: a NaN, silently
    torch_vtpu.debug.check_nans(True)
    doubled = with_nan * 2
    assert torch.isnan(doubled.cpu()[0])
    # -inf from a non-finite scalar argument is the program's intent.
    masked = torch.zeros(3, device="vtpu").masked_fill(torch.tensor([True, False, True], device="vtpu"),
                                                     float("-inf"))
    assert masked.cpu().tolist() == [float("-inf"), 0.0, float("-inf")]
    # Integer inputs are finite: 1/0 on them is an Inf from finite inputs.
    with pytest.raises(FloatingPointError, match=r"^\[div\]"):
        torch.tensor([1, 2], device="vtpu") / torch.tensor([0, 1], device="vtpu")


def test_checks_are_off_outside_debug_mode():
    torch_vtpu.debug.check_nans(True)
    torch_vtpu.debug.crosscheck(True)
    try:
        with torch_vtpu.mode("strict"):
            # No dispatch mode is installed: strict mode pays nothing for the checks.
            assert not any(type(m).__name__ == "_Checker" for m in _get_current_dispatch_mode_stack())
            y = torch.log(torch.tensor([-1.0], device="vtpu"))
            assert torch.isnan(y.cpu()[0])
        with torch_vtpu.mode("debug"):
            assert any(type(m).__name__ == "_Checker" for m in _get_current_dispatch_mode_stack())
    finally:
        torch_vtpu.debug.check_nans(False)
        torch_vtpu.debug.crosscheck(False)
    with torch_vtpu.mode("debug"):  # no check on: no checker either
        assert not any(type(m).__name__ == "_Checker" for m in _get_current_dispatch_mode_stack())


def test_check_switches_are_type_checked():
    with pytest.raises(TypeError):
        torch_vtpu.debug.check_nans("on")
    with pytest.raises(TypeError):
        torch_vtpu.debug.crosscheck(1)


def wrong_matmul(a, b):
    return a @ b  # <matmul>


def test_corruption_hook_makes_a_wrong_kernel():
    # The test-only hook really changes the kernel's result (without it the
    # cross-check test below could pass vacuously).
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    torch_vtpu.debug._testing_corrupt_next("aten::mm")
    got = wrong_matmul(a.to("vtpu"), b.to("vtpu")).cpu()
    assert (got - a @ b).abs().max().item() == pytest.approx(1.0, abs=1e-4)
    # It fires once.
    assert torch.allclose(wrong_matmul(a.to("vtpu"), b.to("vtpu")).cpu(), a @ b)


def test_crosscheck_catches_a_wrong_kernel(debug_checks):
    torch_vtpu.debug.crosscheck(True)
    a, b = torch.randn(8, 8, device="vtpu"), torch.randn(8, 8, device="vtpu")
    torch_vtpu.debug._testing_corrupt_next("aten::mm")
    with pytest.raises(CrossCheckError) as info:
        wrong_matmul(a, b)
    message = str(info.value)
    assert message.startswith("[mm] vtpu result differs from the CPU reference: max abs error 1")
    assert f"{HERE}:{line_of('matmul')} in wrong_matmul" in message
    assert last_line_here(info.value) == line_of("matmul")


def test_crosscheck_passes_correct_kernels(debug_checks):
    torch_vtpu.debug.crosscheck(True)
    torch.manual_seed(0)
    cpu = {"x": torch.randn(4, 6), "w": torch.randn(5, 6), "idx": torch.tensor([3, 0, 1])}
    dev = {k: v.to("vtpu") for k, v in cpu.items()}

    def program(t):
        y = torch.nn.functional.linear(t["x"], t["w"]).softmax(-1)
        y = y.index_select(0, t["idx"]) + 1
        y.mul_(2)
        return torch.cat([y, y.cumsum(0)]).sum(0)

    before = torch_vtpu.debug._counts["crosscheck"]
    result = program(dev)
    assert torch_vtpu.debug._counts["crosscheck"] - before >= 7  # each op was recomputed on CPU
    assert torch.allclose(result.cpu(), program(cpu), rtol=1.3e-6, atol=1e-5)


def test_crosscheck_compares_conjugated_and_negated_views_by_value(debug_checks):
    # The CPU reference of `_conj` is a lazily conjugated view; compared by
    # its stored values it differed from the device's (materialised) result
    # (CrossCheckError "max abs error 0"), and every complex backward raised.
    torch_vtpu.debug.crosscheck(True)
    torch.manual_seed(0)
    x = torch.randn(4, dtype=torch.complex64)
    xv = x.to("vtpu").requires_grad_()
    before = torch_vtpu.debug._counts["crosscheck"]
    (xv * xv.conj()).real.sum().backward()
    assert torch_vtpu.debug._counts["crosscheck"] > before
    torch.testing.assert_close(xv.grad.cpu(), 2 * x)
    torch.testing.assert_close((xv.detach().conj() * 2).cpu(), x.conj() * 2)
    torch.testing.assert_close(torch.neg(xv.detach()).conj().cpu(), -x.conj())


def test_environment_variables_turn_the_checks_on():
    script = textwrap.dedent("""
        import torch, torch_vtpu
        x = torch.tensor([-1.0], device="vtpu")
        try:
            torch.log(x)
        except FloatingPointError as e:
            print("nan-check:", str(e).split(" (")[0])
        a = torch.randn(4, 4, device="vtpu")
        torch_vtpu.debug._testing_corrupt_next("aten::mm")
        try:
            a @ a
        except torch_vtpu.debug.CrossCheckError as e:
            print("crosscheck:", str(e).split(":")[0])
    """)
    env = dict(os.environ, VTPU_MODE="debug", VTPU_DEBUG_NANS="1", VTPU_DEBUG_CROSSCHECK="1")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "nan-check: [log] produced NaN or Inf from finite inputs" in out.stdout
    assert "crosscheck: [mm] vtpu result differs from the CPU reference" in out.stdout


@pytest.mark.parametrize("check", ["nans", "crosscheck"])
def test_checks_leave_tracing_and_forward_ad_transforms_working(check):
    # Found by review: under a check, make_fx and torch.func.linearize raised
    # "trying to get value out of a tracing tensor" (the check's .item() was
    # traced), x.to("meta") raised "Cannot copy out of meta tensor", and
    # jacfwd(randomness="same") compared forward AD's zero tensors, which
    # segfaulted. A subprocess, so that a crash fails only this test.
    program = f"""
import torch, torch_vtpu, torch.func as tf
from torch.fx.experimental.proxy_tensor import make_fx
torch_vtpu.set_mode("debug")
torch_vtpu.debug.{"check_nans" if check == "nans" else "crosscheck"}(True)
x = torch.randn(5).to("vtpu")
jac = tf.jacfwd(lambda x: x * 2, randomness="same")(x)
assert torch.equal(jac.cpu(), 2 * torch.eye(5))
_, jvp_fn = tf.linearize(lambda x: x.sin(), x)
assert torch.allclose(jvp_fn(torch.ones_like(x)).cpu(), x.cpu().cos())
assert len(make_fx(lambda x: x.sin() * 2)(x).graph.nodes) == 4
assert x.to("meta").shape == (5,)
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]
