"""Origin of every error: an op's error names the op and the user's line that
issued it, in strict, fused and debug mode; the exception type is the one torch
raises for the same bad input on CPU."""
import os
import traceback

import pytest
import torch

import torch_vtpu

MODES = ("strict", "fused", "debug")
HERE = os.path.basename(__file__)


def line_of(marker: str) -> int:
    with open(__file__) as f:
        for number, text in enumerate(f, start=1):
            if text.rstrip().endswith(f"# <{marker}>"):
                return number
    raise AssertionError(f"marker {marker} not found")


def cpu_error(fn) -> BaseException:
    """The exception stock CPU eager raises for the same program."""
    with pytest.raises(Exception) as info:
        fn("cpu")
    return info.value


def last_line_here(error: BaseException) -> int:
    frames = [f for f in traceback.extract_tb(error.__traceback__) if os.path.basename(f.filename) == HERE]
    return frames[-1].lineno


def bad_index_select(device):
    x = torch.arange(12.0, device=device).view(4, 3)
    idx = torch.tensor([0, 5], device=device)
    return x.index_select(0, idx)  # <index_select>


def bad_advanced_index(device):
    x = torch.arange(12.0, device=device).view(4, 3)
    return x[torch.tensor([5], device=device)]  # <advanced_index>


def bad_gather(device):
    x = torch.arange(12.0, device=device).view(4, 3)
    return x.gather(0, torch.tensor([[9, 0, 0]], device=device))  # <gather>


def bad_matmul_shapes(device):
    return torch.ones(2, 3, device=device) @ torch.ones(4, 5, device=device)  # <matmul_shapes>


def bad_broadcast(device):
    return torch.ones(4, 3, device=device) + torch.ones(5, 3, device=device)  # <broadcast>


def bad_matmul_dtypes(device):
    return torch.mm(torch.ones(2, 3, device=device), torch.ones(3, 2, device=device, dtype=torch.float64))  # <mm_dtype>


def bad_index_dtype(device):
    return torch.ones(4, 3, device=device).index_select(0, torch.tensor([0.0], device=device))  # <index_dtype>


def bad_bitwise_dtype(device):
    return torch.ones(4, device=device).bitwise_and(torch.ones(4, device=device, dtype=torch.int64))  # <bitwise_dtype>


class Step(torch.nn.Module):
    def forward(self, x, idx):
        return torch.nn.functional.embedding(idx, x)  # <module_forward>


def bad_in_module(device):
    return Step()(torch.ones(4, 3, device=device), torch.tensor([7], device=device))


CASES = {
    # index errors: raised by the kernel, on the device stream in strict/fused
    "index_select": bad_index_select,
    "advanced_index": bad_advanced_index,
    "gather": bad_gather,
    "module_forward": bad_in_module,
    # shape errors: raised at dispatch by the op's meta
    "matmul_shapes": bad_matmul_shapes,
    "broadcast": bad_broadcast,
    # dtype errors
    "mm_dtype": bad_matmul_dtypes,
    "index_dtype": bad_index_dtype,
    "bitwise_dtype": bad_bitwise_dtype,
}


# Shape errors that ATen's meta functions raise while the op is dispatched.
RAISED_AT_DISPATCH = {"matmul_shapes", "broadcast"}


@pytest.fixture(params=MODES)
def mode(request):
    torch.vtpu.synchronize()
    with torch_vtpu.mode(request.param):
        yield request.param
    torch.vtpu.synchronize()


@pytest.mark.parametrize("case", sorted(CASES))
def test_error_carries_type_message_and_line(mode, case):
    program = CASES[case]
    expected = cpu_error(program)
    line = line_of(case)
    with pytest.raises(type(expected)) as info:
        program("vtpu")
        torch.vtpu.synchronize()  # asynchronous errors surface here in strict and fused
    error = info.value
    assert type(error) is type(expected)
    # torch's own message, unchanged inside ours.
    assert str(expected).split("\n")[0] in str(error)
    if case in RAISED_AT_DISPATCH:  # by ATen's meta: the Python traceback points at the line
        assert last_line_here(error) == line
    else:  # by the op's kernel: the message names the op and "(issued at file:line in fn)"
        assert str(error).startswith("[")
        assert f"{HERE}:{line} in " in str(error), str(error)
    if mode == "debug":
        # Debug runs ops synchronously: always raised at the op's own line.
        assert last_line_here(error) == line
    # The device stays usable.
    assert torch.ones(3, device="vtpu").sum().item() == 3


@pytest.mark.parametrize("mode_name", ["strict", "fused"])
def test_async_error_names_op_and_site_at_a_later_sync(mode_name):
    with torch_vtpu.mode(mode_name):
        y = bad_index_select("vtpu")
        with pytest.raises(IndexError) as info:
            y.cpu()  # the host read is where it surfaces...
    message = str(info.value)
    # ...and the message names the op and where it was issued.
    assert message.startswith("[index_select] index out of range in self")
    assert f"(issued at {os.path.relpath(__file__)}:{line_of('index_select')} in bad_index_select)" in message \
        or f"{HERE}:{line_of('index_select')} in bad_index_select)" in message
    assert last_line_here(info.value) != line_of("index_select")  # it did surface elsewhere


def test_debug_raises_at_the_issuing_line_with_full_traceback():
    with torch_vtpu.mode("debug"):
        with pytest.raises(IndexError) as info:
            bad_index_select("vtpu")
    names = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert names[:2] == ["test_debug_raises_at_the_issuing_line_with_full_traceback", "bad_index_select"]
    assert last_line_here(info.value) == line_of("index_select")


def test_capture_off_keeps_the_op_name_and_drops_the_site():
    assert torch_vtpu.debug.capture_call_sites() is True  # on by default
    try:
        assert torch_vtpu.debug.capture_call_sites(False) is False
        bad_index_select("vtpu")
        with pytest.raises(IndexError) as info:
            torch.vtpu.synchronize()
    finally:
        torch_vtpu.debug.capture_call_sites(True)
    assert str(info.value) == "[index_select] index out of range in self"


def test_capture_setting_is_type_checked():
    with pytest.raises(TypeError):
        torch_vtpu.debug.capture_call_sites("yes")


def test_call_site_skips_library_frames():
    # Called from here, through torch_vtpu/debug.py:
    site = torch_vtpu.debug.call_site()  # <call_site>
    assert site is not None
    assert os.path.basename(site[0]) == HERE and site[2] == "test_call_site_skips_library_frames"
    assert site[1] == line_of("call_site")


def backward_with_a_bad_saved_index(device):
    x = torch.arange(12.0, device=device).view(4, 3).requires_grad_()
    idx = torch.tensor([0, 1], device=device)
    y = x.index_select(0, idx)
    idx.data.fill_(9)  # .data bypasses the version check: the backward kernel sees index 9
    y.sum().backward()


@pytest.mark.parametrize("mode_name", ["strict", "debug"])
def test_error_issued_by_autograd_backward_is_labelled(mode_name):
    # Autograd runs device backward ops on its own thread, which has no user frame.
    expected = cpu_error(backward_with_a_bad_saved_index)
    with torch_vtpu.mode(mode_name):
        with pytest.raises(type(expected)) as info:
            backward_with_a_bad_saved_index("vtpu")
            torch.vtpu.synchronize()
    assert str(info.value).startswith("[index_add] ")
    assert str(expected) in str(info.value)
    assert str(info.value).endswith("(issued from autograd backward or a thread without Python code)")


def test_environment_turns_capture_off():
    import subprocess
    import sys

    script = ("import torch, torch_vtpu\n"
              "x = torch.ones(4, device='vtpu').index_select(0, torch.tensor([9], device='vtpu'))\n"
              "try:\n    torch.vtpu.synchronize()\nexcept IndexError as e:\n    print(e)\n"
              "print(torch_vtpu.debug.capture_call_sites())\n")
    out = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, VTPU_CALL_SITES="0"),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[index_select] index out of range in self", "False"]
