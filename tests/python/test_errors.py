"""Errors: asynchronous kernel errors, mixed devices, bad arguments; none abort."""
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
    with pytest.raises(NotImplementedError):
        torch.empty(2, 2, device="vtpu", layout=torch.sparse_coo)
